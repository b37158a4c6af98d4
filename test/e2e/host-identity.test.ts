/**
 * Host identity end to end (docs/host-identity.md): real `berth serve` and
 * real `berth agent` processes. Agents started `legacy` enroll the way
 * agents built before host identity did; the switch is driven by the
 * operator's `berth host activate`, and crashes are real SIGKILLs at the
 * switch's crash points (BERTH_TEST_HOOKS=1, record.ts) or of the
 * coordinator.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { request } from "undici";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { Fleet } from "../helpers/identity-fleet.js";
import { connect } from "../helpers/ssh-testkit.js";
import { PG_SKIP } from "../helpers/env.js";

const ENROLL_BODY = (name: string) => ({
  name,
  url: "http://127.0.0.1:9",
  runtime: "process",
  capacity: { vcpu: 1, memoryMb: 512, slots: 1 },
  ssh: { host: "127.0.0.1", port: 9, hostKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAttacker", fingerprint: "SHA256:attacker" },
});

async function post(url: string, path: string, bearer: string | null, body: unknown): Promise<{ status: number; body: any }> { // eslint-disable-line @typescript-eslint/no-explicit-any -- asserted field by field
  const r = await request(`${url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(bearer ? { authorization: `Bearer ${bearer}` } : {}) },
    body: JSON.stringify(body),
  });
  return { status: r.statusCode, body: await r.body.json() };
}

async function ensurePool(f: Fleet, n: number, keeperKey: string | null = null): Promise<void> {
  await f.api.call("POST", "/v1/pools/p/ensure", { minReady: n, maxReady: n, compatibilityKey: "idt", provider: "hosts", keeperKey });
}

async function ready(f: Fleet, n: number): Promise<void> {
  await f.waitFor(`${n} ready`, async () => (await f.api.call<{ counts: { ready: number } }>("GET", "/v1/pools/p")).counts.ready === n);
}

describe("host identity: the switch while serving (SQLite)", () => {
  const f = new Fleet();
  after(() => f.close());

  it("a lent machine blocks; --force cuts the session, ends the borrow, retires and replaces every machine; the token is then refused for the host", async () => {
    await f.start();
    const keeper = generateSshKeyPair("idt-keeper");
    await f.startAgent("old", { legacy: true, slots: 2 });
    assert.equal((await f.host("old")).identity.state, "legacy");
    await ensurePool(f, 2, keeper.publicKey);
    await ready(f, 2);

    const b = await f.api.call<{ borrowId: string; machine: { id: string; ssh: { host: string; port: number; user: string; hostKey: string } } }>("POST", "/v1/pools/p/borrow", {});
    const ssh = await connect({ port: b.machine.ssh.port, username: b.machine.ssh.user, privateKey: keeper.privateKey, hostKey: b.machine.ssh.hostKey });
    ssh.on("error", () => {});
    const sessionClosed = new Promise<void>((resolve) => ssh.once("close", () => resolve()));
    await new Promise<void>((resolve, reject) => ssh.exec("sleep 60", (err) => (err ? reject(err) : resolve())));

    const busy = await f.cli(["host", "activate", "old"]);
    assert.equal(busy.status, 1, busy.stderr);
    assert.match(busy.stderr, /host_busy: host old lends .*busy/);
    assert.equal((await f.host("old")).identity.state, "legacy", "a refusal changes nothing");

    const before = await f.machines();
    const forced = await f.cli(["host", "activate", "old", "--force", "--wait", "--timeout", "60s", "--json"]);
    assert.equal(forced.status, 0, forced.stderr);
    const out = JSON.parse(forced.stdout) as { activated: Array<{ state: string; machines: number; endedBorrows: number }>; hosts: Array<{ identity: { state: string } }> };
    assert.equal(out.activated[0]!.machines, 2);
    assert.equal(out.activated[0]!.endedBorrows, 1);
    assert.equal(out.hosts[0]!.identity.state, "active");

    await sessionClosed; // the borrower's session was cut
    ssh.end();
    const borrow = await f.api.call<{ state: string; reason: string }>("GET", `/v1/borrows/${b.borrowId}`);
    assert.notEqual(borrow.state, "active");
    assert.match(borrow.reason, /host_activated/);

    // Every machine retired was destroyed once, at its generation, by its stopped report; new ones replaced them.
    const retired = await f.audit("host_retired");
    assert.deepEqual(retired.map((r) => r.machine_id).sort(), before.map((m) => m.id).sort());
    await ready(f, 2);
    const rec = f.record("old")!;
    assert.equal(rec.step, "active");
    assert.deepEqual(rec.stopped, [], "none owed once all are taken");
    assert.equal(existsSync(f.agents.get("old")!.tokenFile), false, "the token file is purged");
    assert.match(f.agents.get("old")!.output(), /switch step local.*\n(.*\n)*.*switch step cloud.*\n(.*\n)*.*switch step active/);
    const metrics = await (await request(`${f.coord!.url}/metrics`)).body.text();
    assert.match(metrics, /berth_host_identity_steps_total\{step="committed"\} 1/);
    assert.match(metrics, /berth_host_identity_refusals_total\{code="host_busy"\} 1/);

    // The enroll token under the host's name: refused, nothing changes (every table).
    const dump = await f.dump();
    const raw = await post(f.coord!.url, "/v1/hosts/enroll", f.agentToken, ENROLL_BODY("old"));
    assert.equal(raw.status, 409);
    assert.equal(raw.body.error.code, "host_exists");
    assert.equal(raw.body.hostCallToken, undefined);
    const { challenge } = (await post(f.coord!.url, "/v1/hosts/challenge", null, {})).body as { challenge: string };
    const { generateKeyPairSync, sign } = await import("node:crypto");
    const other = generateKeyPairSync("ed25519");
    const { proofMessage } = await import("../../src/core/host-identity.js");
    const withOtherKey = await post(f.coord!.url, "/v1/hosts/enroll", f.agentToken, {
      ...ENROLL_BODY("old"),
      identity: { publicKey: other.publicKey.export({ format: "der", type: "spki" }).toString("base64"), challenge, signature: sign(null, proofMessage("enroll", "old", challenge), other.privateKey).toString("base64") },
    });
    assert.equal(withOtherKey.status, 409, "another key is no better than none");
    assert.equal(withOtherKey.body.error.code, "host_exists");
    assert.deepEqual(await f.dump(), dump, "a refused enrollment changes no table");
    // A new name still enrolls with the token.
    assert.equal((await post(f.coord!.url, "/v1/hosts/enroll", f.agentToken, ENROLL_BODY("newbie"))).status, 200);

    // A stopped report for an older generation is ignored (moot): the machine stays.
    const h = await f.host("old");
    const nb = await f.api.call<{ borrowId: string; borrowToken: string; machine: { id: string } }>("POST", "/v1/pools/p/borrow", {});
    await f.api.call("POST", `/v1/borrows/${nb.borrowId}/return`, { token: nb.borrowToken });
    await ready(f, 2);
    const m = (await f.machines()).find((x) => x.id === nb.machine.id)!;
    assert.ok(m.generation >= 1);
    const c2 = (await post(f.coord!.url, "/v1/hosts/challenge", null, {})).body.challenge as string;
    const session = await post(f.coord!.url, "/v1/hosts/session", null, { hostId: h.id, challenge: c2, signature: f.prove("old", "session", h.id, c2) });
    assert.equal(session.status, 200);
    const replay = await post(f.coord!.url, "/v1/hosts/session", null, { hostId: h.id, challenge: c2, signature: f.prove("old", "session", h.id, c2) });
    assert.equal(replay.status, 401, "a proof is taken once");
    const stale = await post(f.coord!.url, "/v1/hosts/self/stopped", session.body.credential, { reports: [{ machineId: m.resource_id, generation: m.generation - 1 }] });
    assert.equal(stale.status, 200);
    assert.equal(stale.body.moot.length, 1);
    assert.equal((await f.machines()).find((x) => x.id === m.id)!.state, "ready");
    assert.equal((await f.audit("host_retired")).length, 2);
  });
});

describe("host identity: crashes at every step", () => {
  it("SIGKILL of the agent at each boundary (between rename and directory sync too) and of the coordinator: it resumes forward, never enrolls with the token again, loses no report, each taken once", async () => {
    const f = new Fleet();
    try {
      await f.start();
      await f.startAgent("crashy", { legacy: true, crash: "renamed:local", slots: 2 });
      await ensurePool(f, 2);
      await ready(f, 2);
      const machines = (await f.machines()).map((m) => m.id).sort();
      const act = await f.cli(["host", "activate", "crashy"]);
      assert.equal(act.status, 0, act.stderr);
      await f.exited("crashy");
      assert.equal(f.record("crashy")?.step, "local");
      for (const crash of ["retired", "committed", "renamed:cloud", "purged", "renamed:active", ""]) {
        const a = await f.startAgent("crashy", { crash, waitReady: crash === "" });
        if (crash === "committed") {
          // The coordinator was SIGKILLed too: the agent cannot commit or have its reports written meanwhile.
          await new Promise((r) => setTimeout(r, 1000));
          assert.equal(f.record("crashy")!.step, "local");
          assert.equal(f.record("crashy")!.stopped.length, 2, "reports the coordinator did not write stay owed");
          await f.startCoordinator();
        }
        if (crash !== "") await f.exited("crashy");
        assert.doesNotMatch(a.output(), /enrolled with the coordinator/, `after the crash before ${crash || "the end"}: the enroll token is never used again`);
        assert.notEqual(f.record("crashy"), null);
        if (crash === "retired") {
          assert.equal(f.record("crashy")!.stopped.length, 2, "the retirement's reports are owed durably");
          await f.killCoordinator();
        }
      }
      await f.waitFor("active, nothing owed", async () => (await f.host("crashy")).identity.state === "active" && f.record("crashy")?.stopped.length === 0);
      const retired = await f.audit("host_retired");
      assert.deepEqual(retired.map((r) => r.machine_id).sort(), machines, "every retired machine's report was taken, once");
      await ready(f, 2);
    } finally {
      await f.close();
    }
  });

  it("a record whose directory sync fails keeps the switch pending (nothing retired) until it syncs; a garbage record counts as local", async () => {
    const f = new Fleet();
    try {
      await f.start();
      await f.startAgent("d", { legacy: true, fault: "dirsync", slots: 1 });
      await ensurePool(f, 1);
      await ready(f, 1);
      assert.equal((await f.cli(["host", "activate", "d"])).status, 0);
      await new Promise((r) => setTimeout(r, 1000));
      assert.equal(f.record("d")?.step, "local", "renamed into place: it is the record");
      assert.match(f.agents.get("d")!.output(), /not known to be on disk yet/);
      assert.equal((await f.host("d")).identity.state, "prepared", "no commit on an undurable record");
      assert.equal((await f.machines()).filter((m) => m.state === "ready").length, 1, "nothing retired on an undurable record");
      await f.stopAgent("d", "SIGKILL");
      await f.startAgent("d");
      await f.waitFor("active", async () => (await f.host("d")).identity.state === "active");

      // Damage the record of an active host: it counts as local, and the host comes back active without the token.
      await f.stopAgent("d", "SIGKILL");
      writeFileSync(join(f.agents.get("d")!.stateDir, "identity-switch.json"), '{"schemaVersion":1,"step":"act');
      const again = await f.startAgent("d");
      await f.waitFor("record rewritten active", async () => f.record("d")?.step === "active");
      assert.match(again.output(), /cannot be read; treating it as the local commit/);
      assert.doesNotMatch(again.output(), /enrolled with the coordinator/);
      assert.equal(JSON.parse(readFileSync(join(again.stateDir, "identity-switch.json"), "utf8")).schemaVersion, 1);
    } finally {
      await f.close();
    }
  });
});

describe("host identity on PostgreSQL", { skip: PG_SKIP }, () => {
  it("a new host enrolls straight into identity mode; a legacy host switches; the token is refused for both and a refused enrollment changes no table", async () => {
    const f = new Fleet("postgres");
    try {
      await f.start();
      const fresh = await f.startAgent("fresh", { slots: 1 });
      await f.waitFor("fresh active", async () => (await f.host("fresh")).identity.state === "active");
      assert.equal(existsSync(fresh.tokenFile), false);
      await f.startAgent("legacy", { legacy: true, slots: 1 });
      await ensurePool(f, 2);
      await ready(f, 2);
      const act = await f.cli(["host", "activate", "--all", "--wait", "--timeout", "60s"]);
      assert.equal(act.status, 0, act.stderr);
      await ready(f, 2);
      const dump = await f.dump();
      for (const name of ["fresh", "legacy"]) {
        const r = await post(f.coord!.url, "/v1/hosts/enroll", f.agentToken, ENROLL_BODY(name));
        assert.equal(r.status, 409);
        assert.equal(r.body.error.code, "host_exists");
      }
      assert.deepEqual(await f.dump(), dump);
      // Restarted, an identity host re-describes itself with its key (new ports), never the token.
      await f.stopAgent("fresh");
      const back = await f.startAgent("fresh", { slots: 1 });
      assert.doesNotMatch(back.output(), /enrolled with the coordinator/);
      await f.waitFor("new address recorded", async () => {
        const hosts = await f.api.call<{ hosts: Array<{ name: string; url: string }> }>("GET", "/v1/hosts");
        return hosts.hosts.find((h) => h.name === "fresh")!.url === /api=(\S+)/.exec(back.output())![1];
      });
    } finally {
      await f.close();
    }
  });
});
