/**
 * The seed's provider proof list, end to end through a real coordinator
 * (SQLite, HTTP API, reconciler, executor) whose `aws` provider talks to the
 * EC2/SSM emulator with the real SDK clients. Two independently
 * authenticated clients borrow from an AWS portable pool:
 *   usable access without a shared key; return and reborrow; an already-open
 *   session fenced on return; an ambiguous SSM completion on install; a
 *   killed borrower cleaned up (quarantined, instance terminated, pool
 *   refilled); and, after draining, zero instances left.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect, execStreaming } from "../../src/cli/ssh-client.js";
import type { Api } from "../../src/cli/api.js";
import { startTestCoordinator } from "../helpers/env.js";
import { ackBody, borrowPortable, tokens, type Borrowed } from "../helpers/portable.js";
import { awsWorld } from "../helpers/aws.js";
import { ssh } from "./contract.js";
import { sweepOrphans } from "../../src/providers/aws/sweep.js";
import { Writable } from "node:stream";
import { until as waitUntil } from "../helpers/portable-e2e.js";

type Shown = { state: string; reason: string | null; machine: { id: string; state: string; ssh: { host: string; port: number; user: string; hostKey: string } } };

const until = <T>(what: string, fn: () => Promise<T | null | undefined | false>, timeoutMs = 60_000) => waitUntil(what, fn, timeoutMs);

const quiet = () =>
  new Writable({
    write(_c, _e, cb) {
      cb();
    },
  });

test("aws portable pool through the coordinator: the seed's proof list against the emulator", { timeout: 240_000 }, async () => {
  const w = await awsWorld({ stepBudgetMs: 10_000, pollMs: 50 });
  const t = await startTestCoordinator({ providers: [w.provider], config: { portable: true } });
  const beats = new Map<string, { api: Api; b: Borrowed }>();
  const hb = setInterval(() => {
    for (const { api, b } of beats.values()) void api.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, tokens(b)).catch(() => undefined);
  }, 300);
  try {
    const admin = await t.api("admin");
    const alice = await t.api("member");
    const bob = await t.api("member");
    await admin.call("POST", "/v1/pools/ci/ensure", { minReady: 2, maxReady: 2, compatibilityKey: "aws-linux", access: "portable", provider: "aws", heartbeatMs: 5_000 });
    const readyCount = async () => (await admin.call<{ counts: { ready: number } }>("GET", "/v1/pools/ci")).counts.ready;
    await until("two ready instances", async () => (await readyCount()) >= 2);
    assert.equal(w.emu.live().length, 2);

    const borrowAndAck = async (api: Api) => {
      const b = await borrowPortable(api, "ci");
      beats.set(b.borrowId, { api, b });
      const acked = await api.call<Shown>("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
      return { b, acked };
    };

    // Usable access for two clients, each with its own key only.
    const a1 = await borrowAndAck(alice);
    const b1 = await borrowAndAck(bob);
    assert.equal(a1.acked.state, "active");
    assert.equal(b1.acked.state, "active");
    const ma = a1.acked.machine;
    const mb = b1.acked.machine;
    assert.notEqual(ma.id, mb.id);
    const ua = await ssh(ma.ssh, a1.b.privateKey, "echo alice > ~/note; echo usable");
    assert.equal(ua.out, "usable\n", JSON.stringify(ua));
    assert.equal((await ssh(mb.ssh, b1.b.privateKey, "echo usable")).out, "usable\n");
    assert.equal((await ssh(mb.ssh, a1.b.privateKey, "true")).ok, false, "alice's key opens nothing of bob's");
    assert.equal((await ssh(ma.ssh, b1.b.privateKey, "true")).ok, false, "bob's key opens nothing of alice's");

    // An already-open session is fenced on return; the machine is ready again only after key removal, reboot and scrub.
    const bootBefore = [...w.emu.instances.values()].find((i) => i.tags["berth:machine"] === ma.id)!.bootId();
    const c = await connect({ ...ma.ssh, privateKey: a1.b.privateKey }, 5_000);
    const open = execStreaming(c, "sleep 300", { stdout: quiet(), stderr: quiet() });
    beats.delete(a1.b.borrowId);
    await alice.call("POST", `/v1/borrows/${a1.b.borrowId}/return`, tokens(a1.b));
    const ended = await Promise.race([open.then(() => "ended", () => "ended"), new Promise((r) => setTimeout(() => r("still open"), 30_000))]);
    c.end();
    assert.equal(ended, "ended", "the open session was ended by the fence");
    await until("alice's machine ready again", async () => (await readyCount()) >= 1 && (await t.store.transaction((tx) => tx.get<{ state: string }>("SELECT state FROM machines WHERE id = ?", [ma.id])))?.state === "ready");
    const instA = [...w.emu.instances.values()].find((i) => i.tags["berth:machine"] === ma.id)!;
    assert.notEqual(instA.bootId(), bootBefore, "fenced by an observed reboot");
    const ops = await t.store.transaction((tx) => tx.all<{ kind: string; state: string }>("SELECT kind, state FROM operations WHERE machine_id = ? ORDER BY created_at", [ma.id]));
    assert.deepEqual(ops.map((o) => `${o.kind}:${o.state}`), ["provision:done", "install_key:done", "remove_key:done", "fence:done", "scrub:done"]);

    // Reborrow, with an ambiguous SSM completion on the install: the ack answers before the guest does,
    // the executor retries the same op id, and the grant becomes active only once the install is proven.
    w.emu.faults.ssmDelays.push(12_000); // the install's delivery outlasts one operation budget
    const a2b = await borrowPortable(alice, "ci");
    beats.set(a2b.borrowId, { api: alice, b: a2b });
    const a2 = await alice.call<Shown>("POST", `/v1/borrows/${a2b.borrowId}/ack`, ackBody(a2b));
    assert.equal(a2.state, "installing", "ambiguous install: not active yet");
    const active = await until("the retried install proven", async () => {
      const s = await alice.call<Shown>("GET", `/v1/borrows/${a2b.borrowId}`).catch(() => null);
      return s && s.state === "active" ? s : null;
    });
    assert.equal((await ssh(active.machine.ssh, a2b.privateKey, "ls ~ | grep -c note; true")).out, "0\n", "nothing of the previous borrow is left");
    assert.equal((await ssh(active.machine.ssh, a1.b.privateKey, "true")).ok, false, "the returned key stays refused");

    // A killed borrower: bob stops heartbeating. His grant is invalidated, his instance quarantined and
    // terminated, and the pool provisions a replacement.
    const bobInstance = [...w.emu.instances.values()].find((i) => i.tags["berth:machine"] === mb.id)!;
    beats.delete(b1.b.borrowId);
    await until("bob's instance terminated", async () => bobInstance.state === "terminated", 90_000);
    const bg = await t.store.transaction((tx) => tx.get<{ state: string; reason: string }>("SELECT state, reason FROM grants WHERE id = ?", [b1.b.borrowId]));
    assert.equal(bg?.reason, "heartbeat_missed");
    assert.equal((await ssh(mb.ssh, b1.b.privateKey, "true")).ok, false);
    await until("a replacement instance ready", async () => (await readyCount()) >= 1 && w.emu.live().length >= 2);

    // Drain: everything is destroyed and no instance is left running, and the sweep finds nothing.
    beats.delete(a2b.borrowId);
    await alice.call("POST", `/v1/borrows/${a2b.borrowId}/return`, tokens(a2b));
    await admin.call("POST", "/v1/pools/ci/ensure", { minReady: 0, maxReady: 2, compatibilityKey: "aws-linux", access: "portable", provider: "aws", heartbeatMs: 5_000 });
    await until("every machine destroyed", async () => {
      await admin.call("POST", "/v1/pools/ci/drain", { force: true }).catch(() => undefined);
      const left = await t.store.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE state <> 'destroyed'"));
      return Number(left?.n) === 0;
    }, 90_000);
    assert.deepEqual(w.emu.live().map((i) => `${i.id}:${i.state}`), [], "zero instances left");
    assert.deepEqual((await sweepOrphans(w.provider, async () => new Set())).terminated, []);
  } finally {
    clearInterval(hb);
    await t.close();
    await w.close();
  }
});
