/**
 * Ready instances are checked: a real coordinator (SQLite, reconciler,
 * executor, ready check) whose aws provider talks to the EC2/SSM emulator.
 * Behind berth's back one instance is terminated (its machine lent), one
 * stopped and one fails its status checks; each machine is retired with the
 * observed cause (audit `machine_lost`, metric), its instance ended, a new
 * one launched, and the borrower of the lost one told why. The emulator
 * answers DescribeInstanceStatus one instance per page, so a check that read
 * only the first page would miss the impaired one. A borrow that reaches a
 * gone instance before any check saw it ends with a clear error too.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator } from "../helpers/env.js";
import { ackBody, borrowPortable, tokens } from "../helpers/portable.js";
import { awsWorld } from "../helpers/aws.js";
import { ApiError } from "../../src/cli/api.js";
import { until as waitUntil } from "../helpers/portable-e2e.js";

type PoolShown = { counts: { ready: number } };
type Shown = { state: string; reason: string | null; machine: { id: string; state: string } };

const until = <T>(what: string, fn: () => Promise<T | null | undefined | false>, timeoutMs = 90_000) => waitUntil(what, fn, timeoutMs);

const ENSURE = { compatibilityKey: "aws-linux", access: "portable", provider: "aws", heartbeatMs: 30_000 };

test("instances terminated, stopped or impaired behind berth's back are retired with their cause and replaced", { timeout: 180_000 }, async () => {
  const w = await awsWorld({ stepBudgetMs: 8_000, pollMs: 50 });
  const t = await startTestCoordinator({ providers: [w.provider], config: { portable: true, readyCheckMs: 200 } });
  try {
    const admin = await t.api("admin");
    const alice = await t.api("member");
    await admin.call("POST", "/v1/pools/ci/ensure", { minReady: 3, maxReady: 3, ...ENSURE });
    await until("three ready machines", async () => (await admin.call<PoolShown>("GET", "/v1/pools/ci")).counts.ready >= 3);
    const b = await borrowPortable(alice, "ci");
    const acked = await alice.call<Shown>("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
    assert.equal(acked.state, "active");

    const instanceOf = (machineId: string) => [...w.emu.instances.values()].find((i) => i.tags["berth:machine"] === machineId)!;
    const ready = await t.store.transaction((tx) => tx.all<{ id: string }>("SELECT id FROM machines WHERE state = 'ready' ORDER BY id"));
    assert.equal(ready.length, 2);
    const lent = acked.machine.id;
    const [stopped, impaired] = [ready[0]!.id, ready[1]!.id];
    const original = new Set([lent, stopped, impaired].map((m) => instanceOf(m).id));
    w.emu.faults.pageSize = 1;
    await w.emu.terminate(instanceOf(lent));
    await w.emu.stopBehind(instanceOf(stopped));
    instanceOf(impaired).impaired = "system";

    await until("the three machines destroyed", async () => {
      const rows = await t.store.transaction((tx) => tx.all<{ state: string }>("SELECT state FROM machines WHERE id IN (?, ?, ?)", [lent, stopped, impaired]));
      return rows.every((r) => r.state === "destroyed");
    });
    await until("three new ready machines", async () => (await admin.call<PoolShown>("GET", "/v1/pools/ci")).counts.ready >= 3);

    const lost = await t.store.transaction((tx) => tx.all<{ machine_id: string; from_state: string; detail: string }>("SELECT machine_id, from_state, detail FROM audit WHERE event = 'machine_lost' ORDER BY at"));
    const cause = (m: string) => lost.filter((l) => l.machine_id === m).map((l) => `${l.from_state}: ${l.detail}`);
    assert.equal(lost.length, 3, JSON.stringify(lost));
    assert.match(cause(lent).join(), new RegExp(`^busy: machine lost \\(gone\\): instance ${instanceOf(lent).id} in eu-west-1 is terminated.*berth did not end it`));
    assert.match(cause(stopped).join(), new RegExp(`^ready: machine lost \\(gone\\): instance ${instanceOf(stopped).id} in eu-west-1 is stopp(ed|ing).*berth did not stop it`));
    assert.match(cause(impaired).join(), new RegExp(`^ready: machine lost \\(impaired\\): instance ${instanceOf(impaired).id} .*fails its status checks \\(system impaired`));
    const reason = await t.store.transaction((tx) => tx.get<{ reason: string }>("SELECT reason FROM machines WHERE id = ?", [stopped]));
    assert.match(reason?.reason ?? "", /berth did not stop it/, "the retired machine's reason names the cause");

    // The stopped and impaired instances are terminated (a stopped one still bills its disk); three new ones run.
    await until("only the replacements left", async () => w.emu.live().every((i) => !original.has(i.id)) && w.emu.live().length === 3);
    const metrics = await (await fetch(`${t.coord.url}/metrics`)).text();
    assert.match(metrics, /berth_machines_lost_total\{pool="ci",verdict="gone"\} 2/);
    assert.match(metrics, /berth_machines_lost_total\{pool="ci",verdict="impaired"\} 1/);

    // The borrower of the lost machine is told why.
    const shown = await alice.call<Shown>("GET", `/v1/borrows/${b.borrowId}`);
    assert.equal(shown.state, "closed", "its machine is destroyed");
    assert.equal(shown.reason, "machine_lost");
    const hb = await alice.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, tokens(b)).then(() => null, (e: unknown) => e);
    assert.ok(hb instanceof ApiError, "the heartbeat is refused");
    assert.match(hb.message, /borrow_not_active: .*closed \(machine_lost\)/);
  } finally {
    await t.close();
    await w.close();
  }
});

test("a borrow that reaches an instance terminated behind berth's back ends with machine_lost, and the pool refills", { timeout: 120_000 }, async () => {
  const w = await awsWorld({ stepBudgetMs: 8_000, pollMs: 50 });
  const t = await startTestCoordinator({ providers: [w.provider], config: { portable: true, readyCheckMs: 0 } });
  try {
    const admin = await t.api("admin");
    const alice = await t.api("member");
    await admin.call("POST", "/v1/pools/ci/ensure", { minReady: 1, maxReady: 1, ...ENSURE });
    await until("a ready machine", async () => (await admin.call<PoolShown>("GET", "/v1/pools/ci")).counts.ready >= 1);
    const first = w.emu.live()[0]!;
    await w.emu.terminate(first);
    const b = await borrowPortable(alice, "ci");
    await alice.call<Shown>("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b)).catch(() => undefined);
    const ended = await until("the borrow ended", async () => {
      const s = await alice.call<Shown>("GET", `/v1/borrows/${b.borrowId}`);
      return s.state !== "installing" && s.state !== "pending" ? s : null;
    });
    assert.equal(ended.state, "invalidated");
    assert.equal(ended.reason, "machine_lost");
    const op = await t.store.transaction((tx) => tx.get<{ state: string; error: string }>("SELECT state, error FROM operations WHERE machine_id = ? AND kind = 'install_key'", [ended.machine.id]));
    assert.equal(op?.state, "failed");
    assert.match(op?.error ?? "", new RegExp(`machine_lost: no live instance is bound to machine ${ended.machine.id}: instance ${first.id} is terminated, not ended by berth`));
    await until("a replacement ready", async () => (await admin.call<PoolShown>("GET", "/v1/pools/ci")).counts.ready >= 1 && w.emu.live().length === 1);
  } finally {
    await t.close();
    await w.close();
  }
});
