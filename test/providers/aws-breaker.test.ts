/**
 * Failing capacity stops itself: a pool whose instances never register with
 * SSM (a private subnet without NAT or SSM endpoints, emulated) launches
 * N instances, gives each up, then its provisioning breaker opens: no
 * further launch, the cause in `GET /v1/pools/:name` (what `berth pool show`
 * prints) and a metric; every launched instance is terminated. `berth pool
 * resume` (POST /v1/pools/:name/resume) ends the pause, and a pool whose
 * cause was fixed fills again. Real coordinator (SQLite, reconciler,
 * executor) against the EC2/SSM emulator. Capacity and limit errors on
 * RunInstances move the launch to the next configured subnet and instance
 * type; once every one is refused the provision fails (not ambiguous), so it
 * reaches the breaker at once instead of after six attempts. Throttling is neither: a
 * throttled call is retried with a jittered backoff and never counts as a
 * failed attempt, so a healthy instance is not quarantined and replaced.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator } from "../helpers/env.js";
import { awsWorld, machine, op, untilSettled } from "../helpers/aws.js";
import { ackBody, borrowPortable, tokens } from "../helpers/portable.js";
import { until as waitUntil } from "../helpers/portable-e2e.js";

type Breaker = { failures: number; trips: number; openUntil: number | null; cause: string | null };
type PoolShown = { counts: { ready: number }; provisionBreaker: Breaker | null; placementBreakers?: Array<Breaker & { placement: string }> };

const until = <T>(what: string, fn: () => Promise<T | null | undefined | false>, timeoutMs = 120_000) => waitUntil(what, fn, timeoutMs);

test("a pool whose instances never register stops launching after N failed provisions and says why", { timeout: 240_000 }, async () => {
  const w = await awsWorld({ stepBudgetMs: 400, pollMs: 50 });
  // The fill claim keeps its default TTL (5 min): a given-up provision expires its claim, so each failed machine is
  // replaced once it is given up, never while it is still being retried. Retries back off in 10 ms units (100 by default).
  const t = await startTestCoordinator({ providers: [w.provider], config: { portable: true, opRetryUnitMs: 10, provisionBreakerThreshold: 2, provisionBreakerBackoffMs: 3_600_000 } });
  try {
    w.emu.faults.ssmNeverRegisters = true;
    const admin = await t.api("admin");
    const launches = () => w.emu.calls.filter((c) => c === "RunInstances").length;
    await admin.call("POST", "/v1/pools/ci/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "aws-linux", access: "portable", provider: "aws", heartbeatMs: 5_000 });
    const shown = () => admin.call<PoolShown>("GET", "/v1/pools/ci");
    // Either the breaker opens, or a third instance is launched (today's loop with no brake).
    const seen = await until("the breaker open or a third launch", async () => {
      const p = await shown();
      return (p.provisionBreaker?.openUntil ?? 0) > Date.now() || launches() >= 3 ? p : null;
    });
    assert.equal(launches(), 2, "exactly N instances launched before the pool stopped");
    const br = seen.provisionBreaker!;
    assert.ok(br.openUntil! > Date.now() + 30 * 60_000, "paused for the configured backoff");
    assert.match(br.cause ?? "", /SSM agent is not online/, "the cause is shown");

    // The given-up machines are destroyed and their instances terminated; while paused, nothing new is launched.
    await until("every machine destroyed", async () => {
      const left = await t.store.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE state <> 'destroyed'"));
      return Number(left?.n) === 0;
    });
    await until("both instances terminated", async () => w.emu.live().length === 0);
    for (let i = 0; i < 5; i++) await t.coord.reconciler.tick();
    assert.equal(launches(), 2, "no launch while the breaker is open");
    const metrics = await (await fetch(`${t.coord.url}/metrics`)).text();
    assert.match(metrics, /berth_provision_breaker_trips_total\{pool="ci"\} 1/);

    // The operator fixes the cause and resumes: the pool fills again, and the success closes the breaker.
    w.emu.faults.ssmNeverRegisters = false;
    const r = await admin.call<{ resumed: boolean }>("POST", "/v1/pools/ci/resume");
    assert.equal(r.resumed, true);
    const filled = await until("one ready machine", async () => {
      const p = await shown();
      return p.counts.ready >= 1 ? p : null;
    });
    assert.equal(filled.provisionBreaker, null, "a proven provision closes the breaker");
    assert.equal(launches(), 3);
  } finally {
    await t.close();
    await w.close();
  }
});

test("after N given-up provisions on one (region, type, subnet) the pool backs it off and launches on the next placement; the cause in pool show, a metric and the dashboard", { timeout: 240_000 }, async () => {
  const w = await awsWorld({ stepBudgetMs: 400, pollMs: 50, pool: { fallbackSubnetIds: ["subnet-0b"] } });
  const t = await startTestCoordinator({ providers: [w.provider], config: { portable: true, opRetryUnitMs: 10, provisionBreakerThreshold: 2, provisionBreakerBackoffMs: 3_600_000 } });
  try {
    // The first subnet's zone has no route to SSM: its instances boot and never register; the second subnet's do.
    w.emu.faults.ssmNeverRegistersIn.push("subnet-0abc");
    const admin = await t.api("admin");
    await admin.call("POST", "/v1/pools/ci/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "aws-linux", access: "portable", provider: "aws", heartbeatMs: 5_000 });
    const shown = () => admin.call<PoolShown>("GET", "/v1/pools/ci");
    // Either a machine is ready (the launch moved on), or the pool stopped, or a third launch went to the failing subnet again.
    const subnets = () => [...w.emu.instances.values()].map((i) => i.subnetId);
    const p = await until("a ready machine, the pool's breaker open, or a third launch in the failing subnet", async () => {
      const p = await shown();
      return p.counts.ready >= 1 || (p.provisionBreaker?.openUntil ?? 0) > Date.now() || subnets().filter((s) => s === "subnet-0abc").length >= 3 ? p : null;
    });
    assert.deepEqual(subnets(), ["subnet-0abc", "subnet-0abc", "subnet-0b"], `N launches on the failing placement, then the next one (pool breaker: ${JSON.stringify(p.provisionBreaker)})`);
    assert.equal(p.counts.ready, 1);
    assert.equal(p.provisionBreaker, null, "the pool itself is not paused: another placement works");
    const key = "eu-west-1/t3.micro/subnet-0abc";
    assert.deepEqual(p.placementBreakers?.map((b) => b.placement), [key], "only the failing placement has a breaker");
    const pb = p.placementBreakers![0]!;
    assert.ok(pb.openUntil! > Date.now() + 30 * 60_000, "backed off for the configured backoff");
    assert.equal(pb.trips, 1);
    assert.match(pb.cause ?? "", /SSM agent is not online/, "the cause is shown");
    const metrics = await (await fetch(`${t.coord.url}/metrics`)).text();
    assert.match(metrics, /berth_provision_placement_breaker_trips_total\{pool="ci",placement="eu-west-1\/t3.micro\/subnet-0abc"\} 1/);
    assert.doesNotMatch(metrics, /berth_provision_breaker_trips_total\{pool="ci"\}/);
    // The dashboard's pool view shows it.
    const signIn = await fetch(`${t.coord.url}/ui/sign-in`, { method: "POST", body: new URLSearchParams({ token: (await t.token("operator")).token }), redirect: "manual" });
    const page = await (await fetch(`${t.coord.url}/ui/pools/ci`, { headers: { cookie: signIn.headers.get("set-cookie")!.split(";")[0]! } })).text();
    assert.match(page, new RegExp(`<tr data-breaker="${key}" data-open="yes"><td>${key}</td><td>backed off until [^<]+ \\(trip 1\\)</td><td>[^<]*SSM agent is not online`));

    // The operator fixes the zone and resumes: the placement's breaker closes.
    const r = await admin.call<{ resumed: boolean }>("POST", "/v1/pools/ci/resume");
    assert.equal(r.resumed, true);
    assert.deepEqual((await shown()).placementBreakers, []);
  } finally {
    await t.close();
    await w.close();
  }
});

test("capacity and limit refusals move to the next subnet, then the next instance type; when every one is refused the provision fails at once, nothing launched", { timeout: 60_000 }, async () => {
  const w = await awsWorld({ stepBudgetMs: 8_000, pollMs: 50, pool: { fallbackSubnetIds: ["subnet-0b"], fallbackInstanceTypes: ["m7i-flex.large"] } });
  try {
    // No t3.micro capacity in either zone: the third candidate (m7i-flex.large in the first subnet) launches.
    w.emu.faults.noCapacity.push("t3.micro");
    const req = op("provision", machine("m_fallback"), 0);
    const r = await untilSettled(w.provider, req);
    assert.equal(r.outcome.kind, "done", JSON.stringify(r.outcome));
    const launched = w.emu.live();
    assert.deepEqual(
      launched.map((i) => `${i.instanceType}@${i.subnetId}`),
      ["m7i-flex.large@subnet-0abc"],
    );
    const rec = async (t: string) => {
      const x = await w.provider.records.byToken(t);
      return x ? { instanceId: x.instanceId, endReason: x.endReason } : null;
    };
    assert.deepEqual(await rec(req.opId), { instanceId: null, endReason: "refused: InsufficientInstanceCapacity" });
    assert.deepEqual(await rec(`${req.opId}.f1`), { instanceId: null, endReason: "refused: InsufficientInstanceCapacity" });
    assert.deepEqual(await rec(`${req.opId}.f2`), { instanceId: launched[0]!.id, endReason: null });
    // A retry of the same operation goes straight to the launched candidate: no further RunInstances.
    const runs = () => w.emu.calls.filter((c) => c === "RunInstances").length;
    const before = runs();
    assert.equal((await w.provider.run(req)).kind, "done");
    assert.equal(runs(), before);

    // Every candidate refused, each with another capacity or limit code: failed (not ambiguous), every record closed.
    w.emu.faults.noCapacity.length = 0;
    const codes = ["InsufficientInstanceCapacity", "InstanceLimitExceeded", "VcpuLimitExceeded", "Unsupported"];
    w.emu.faults.runRefusals.push(...codes);
    const req2 = op("provision", machine("m_norefill"), 0);
    const o = await w.provider.run(req2);
    assert.equal(o.kind, "failed", JSON.stringify(o));
    assert.equal(o.kind === "failed" && o.retryable, false, "not retried as if the outcome were unknown");
    for (const code of codes) assert.match(o.kind === "failed" ? o.error : "", new RegExp(code));
    assert.equal(w.emu.instances.size, 1, "nothing more launched");
    assert.deepEqual(
      await Promise.all([req2.opId, `${req2.opId}.f1`, `${req2.opId}.f2`, `${req2.opId}.f3`].map(async (t) => (await w.provider.records.byToken(t))?.endReason)),
      codes.map((c) => `refused: ${c}`),
    );
  } finally {
    await w.close();
  }
});

test("throttling is not a failed attempt: a machine returned under throttled SSM calls comes back ready, nothing replaced", { timeout: 120_000 }, async () => {
  const w = await awsWorld({ stepBudgetMs: 8_000, pollMs: 50 });
  const t = await startTestCoordinator({ providers: [w.provider], config: { portable: true, opRetryUnitMs: 10, readyCheckMs: 0 } });
  try {
    const admin = await t.api("admin");
    const alice = await t.api("member");
    await admin.call("POST", "/v1/pools/ci/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "aws-linux", access: "portable", provider: "aws", heartbeatMs: 30_000 });
    await until("a ready machine", async () => (await admin.call<PoolShown>("GET", "/v1/pools/ci")).counts.ready >= 1);
    const b = await borrowPortable(alice, "ci");
    const acked = await alice.call<{ state: string; machine: { id: string } }>("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
    assert.equal(acked.state, "active");
    // More throttled calls than an operation has attempts (6): each remove_key attempt starts with ListCommands.
    w.emu.faults.throttle.set("ListCommands", 8);
    await alice.call("POST", `/v1/borrows/${b.borrowId}/return`, tokens(b));
    const m = await until("the machine ready again or given up", async () => {
      const r = await t.store.transaction((tx) => tx.get<{ state: string; reason: string | null }>("SELECT state, reason FROM machines WHERE id = ?", [acked.machine.id]));
      return r && ["ready", "quarantined", "draining", "destroying", "destroyed"].includes(r.state) ? r : null;
    });
    assert.equal(m.state, "ready", `a healthy machine is not quarantined under throttling: ${JSON.stringify(m)}`);
    assert.equal(w.emu.faults.throttle.get("ListCommands"), 0, "every throttle was met");
    const ops = await t.store.transaction((tx) => tx.all<{ kind: string; state: string; attempts: number }>("SELECT kind, state, attempts FROM operations WHERE machine_id = ? AND kind = 'remove_key'", [acked.machine.id]));
    assert.deepEqual(ops.map((o) => `${o.kind}:${o.state}`), ["remove_key:done"]);
    assert.ok(ops[0]!.attempts < 6, `throttled attempts are not counted (${ops[0]!.attempts})`);
    assert.equal(w.emu.calls.filter((c) => c === "RunInstances").length, 1, "no replacement launched");
  } finally {
    await t.close();
    await w.close();
  }
});
