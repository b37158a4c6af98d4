/**
 * Agent operations against a real agent (startAgent in this process): real
 * SQLite store in a temp dir, real process runtime, real key authority, real
 * SSH gateway. The clock is a variable the test moves, so expiry at equality
 * is exact.
 */
import { strict as assert } from "node:assert";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { after, describe, it } from "node:test";
import { isBerthError } from "../../src/core/errors.js";
import type { RunningAgent } from "../../src/agent/agent.js";
import { AgentHarness, sshKey } from "../helpers/agent.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";

const harness = new AgentHarness("berth-ops-");
after(() => harness.close());

function id(prefix: string): string {
  return `${prefix}_${randomBytes(6).toString("hex")}`;
}

interface Clock {
  t: number;
}

async function agentAt(stateDir: string, clock?: Clock): Promise<RunningAgent> {
  return harness.agent({ stateDir, ...(clock ? { now: () => clock.t } : {}) });
}

async function refusal(p: Promise<unknown>): Promise<{ code: string; message: string }> {
  try {
    await p;
  } catch (e) {
    assert.ok(isBerthError(e), `expected a BerthError, got ${String(e)}`);
    return { code: e.code, message: e.message };
  }
  assert.fail("expected a refusal");
}

describe("agent operations", () => {
  it("[I4] answers a retried opId with the first result and never acts twice; other uses of the opId are refused", async () => {
    const a = await agentAt(harness.dir());
    const m = id("m");
    const first = await a.ops.run({ opId: "op-provision-1", kind: "provision", machineId: m, generation: 1 });
    const again = await a.ops.run({ opId: "op-provision-1", kind: "provision", machineId: m, generation: 1 });
    assert.deepEqual(again, first);
    assert.equal(first.status, "done");

    // A fence acts (new incarnation); its retry returns the same proof and does not fence again.
    const fence = await a.ops.run({ opId: "op-fence-1", kind: "fence", machineId: m, generation: 1 });
    const seen = await a.runtime.inspect(m);
    const fenceAgain = await a.ops.run({ opId: "op-fence-1", kind: "fence", machineId: m, generation: 1 });
    assert.deepEqual(fenceAgain, fence);
    assert.equal((await a.runtime.inspect(m)).incarnation, seen.incarnation, "a retried fence must not restart the machine");
    assert.notEqual((fence.result as { incarnationAfter: string }).incarnationAfter, (first.result as { incarnation: string }).incarnation);

    // Same opId, different kind / machine / generation / arguments: conflict, nothing done.
    assert.equal((await refusal(a.ops.run({ opId: "op-fence-1", kind: "scrub", machineId: m, generation: 1 }))).code, "conflict");
    assert.equal((await refusal(a.ops.run({ opId: "op-fence-1", kind: "fence", machineId: id("m"), generation: 1 }))).code, "conflict");
    assert.equal((await refusal(a.ops.run({ opId: "op-fence-1", kind: "fence", machineId: m, generation: 2 }))).code, "conflict");
    const k1 = sshKey();
    const k2 = sshKey();
    const install = (opId: string, line: string) =>
      a.ops.run({ opId, kind: "install_key", machineId: m, generation: 1, args: { publicKey: line, mode: "grant", grantId: "g_1", expiresAt: Date.now() + 600_000 } });
    await install("op-install-1", k1.line);
    assert.equal((await refusal(install("op-install-1", k2.line))).code, "conflict");
    assert.deepEqual(a.keys.list(m).map((k) => k.fingerprint), [k1.fingerprint]);
    assert.equal((await a.runtime.inspect(m)).incarnation, seen.incarnation);
  });

  it("[I4][I9] returns the first result for a retried opId after the agent restarts, and re-attaches the machine", async () => {
    const dir = harness.dir();
    const m = id("m");
    const k = sshKey();
    let a = await agentAt(dir);
    const created = await a.ops.run({ opId: "c1", kind: "provision", machineId: m, generation: 3 });
    const installed = await a.ops.run({
      opId: "i1", kind: "install_key", machineId: m, generation: 3,
      args: { publicKey: k.line, mode: "grant", grantId: "grant_1", expiresAt: Date.now() + 600_000 },
    });
    await a.stop();

    a = await agentAt(dir);
    assert.deepEqual(a.recovery.reattached, [m]);
    assert.deepEqual(await a.ops.run({ opId: "c1", kind: "provision", machineId: m, generation: 3 }), created);
    assert.deepEqual(
      await a.ops.run({
        opId: "i1", kind: "install_key", machineId: m, generation: 3,
        args: { publicKey: k.line, mode: "grant", grantId: "grant_1", expiresAt: (installed.result as { expiresAt: number }).expiresAt },
      }),
      installed,
    );
    assert.ok(a.keys.authorize(m, k.fingerprint, Date.now()), "the reloaded key authenticates");
    assert.deepEqual(await a.runtime.list(), [m]);
  });

  it("[I4] refuses a stale generation and changes nothing", async () => {
    const a = await agentAt(harness.dir());
    const m = id("m");
    const k = sshKey();
    await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 1 });
    await a.ops.run({
      opId: id("op"), kind: "install_key", machineId: m, generation: 2,
      args: { publicKey: k.line, mode: "grant", grantId: "grant_2", expiresAt: Date.now() + 600_000 },
    });
    const before = { keys: a.keys.list(m), machine: a.store.machines.get(m), seen: await a.runtime.inspect(m) };

    const stale = sshKey();
    for (const [kind, args] of [
      ["install_key", { publicKey: stale.line, mode: "grant", grantId: "grant_1", expiresAt: Date.now() + 600_000 }],
      ["remove_key", { grantId: "grant_2" }],
      ["fence", undefined],
      ["scrub", undefined],
      ["destroy", undefined],
      ["provision", undefined],
    ] as const) {
      const r = await refusal(a.ops.run({ opId: id("op"), kind, machineId: m, generation: 1, args }));
      assert.equal(r.code, "generation_mismatch", `${kind} at a stale generation`);
      assert.match(r.message, /nothing was changed/);
    }
    assert.deepEqual(a.keys.list(m), before.keys);
    assert.deepEqual(a.store.machines.get(m), before.machine);
    assert.deepEqual(await a.runtime.inspect(m), before.seen);
    assert.ok(a.keys.authorize(m, k.fingerprint, Date.now()));
    assert.equal(a.keys.authorize(m, stale.fingerprint, Date.now()), null);
  });

  it("[I4] an install for generation g+1 supersedes every grant key of generation g (revocation notified); a keeper key stays", async () => {
    const a = await agentAt(harness.dir());
    const m = id("m");
    const old = sshKey();
    const next = sshKey();
    const keeper = sshKey();
    const revoked: string[] = [];
    a.keys.onRevoked((machineId, fingerprint) => {
      if (machineId === m) revoked.push(fingerprint);
    });
    await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 1 });
    await a.ops.run({
      opId: id("op"), kind: "install_key", machineId: m, generation: 1,
      args: { publicKey: old.line, mode: "grant", grantId: "grant_a", expiresAt: Date.now() + 600_000 },
    });
    await a.ops.run({
      opId: id("op"), kind: "install_key", machineId: m, generation: 1,
      args: { publicKey: keeper.line, mode: "keeper", grantId: "keeper_pool", expiresAt: null },
    });
    assert.ok(a.keys.authorize(m, old.fingerprint, Date.now()));
    const r = await a.ops.run({
      opId: id("op"), kind: "install_key", machineId: m, generation: 2,
      args: { publicKey: next.line, mode: "grant", grantId: "grant_b", expiresAt: Date.now() + 600_000 },
    });
    assert.deepEqual((r.result as { superseded: string[] }).superseded, [old.fingerprint]);
    assert.deepEqual(revoked, [old.fingerprint]);
    assert.equal(a.keys.authorize(m, old.fingerprint, Date.now()), null);
    assert.ok(a.keys.authorize(m, next.fingerprint, Date.now()));
    assert.deepEqual(a.store.keys.list(m).map((k) => k.fingerprint).sort(), [keeper.fingerprint, next.fingerprint].sort());
    assert.equal(a.store.machines.get(m)?.generation, 2);
    // Keeper borrows advance the generation without any key operation; the
    // pool's keeper key keeps working across them (a fence at g+1 here).
    await a.ops.run({ opId: id("op"), kind: "fence", machineId: m, generation: 3 });
    assert.ok(a.keys.authorize(m, keeper.fingerprint, Date.now()), "the keeper key outlives generation advances");
    assert.equal(a.keys.authorize(m, next.fingerprint, Date.now()), null, "the grant key of generation 2 does not");
  });

  it("[I3] a key is expired at now == expiresAt, and an install already expired is refused", async () => {
    const clock: Clock = { t: 1_900_000_000_000 };
    const a = await agentAt(harness.dir(), clock);
    const m = id("m");
    const k = sshKey();
    await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 1 });
    const expiresAt = clock.t + 60_000;
    await a.ops.run({
      opId: id("op"), kind: "install_key", machineId: m, generation: 1,
      args: { publicKey: k.line, mode: "grant", grantId: "grant_e", expiresAt },
    });
    assert.ok(a.keys.authorize(m, k.fingerprint, expiresAt - 1));
    assert.equal(a.keys.authorize(m, k.fingerprint, expiresAt), null);

    const late = sshKey();
    clock.t = expiresAt;
    const r = await refusal(
      a.ops.run({
        opId: id("op"), kind: "install_key", machineId: m, generation: 1,
        args: { publicKey: late.line, mode: "grant", grantId: "grant_f", expiresAt },
      }),
    );
    assert.equal(r.code, "grant_expired");
    assert.equal(a.store.keys.list(m).some((x) => x.fingerprint === late.fingerprint), false);
  });

  it("[I3] the expiry timer revokes the key with no coordinator at all", async () => {
    const a = await agentAt(harness.dir());
    const m = id("m");
    const k = sshKey();
    await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 1 });
    const revoked = new Promise<string>((resolve) => {
      a.keys.onRevoked((machineId, fingerprint, grantId) => {
        if (machineId === m && fingerprint === k.fingerprint) resolve(grantId);
      });
    });
    const expiresAt = Date.now() + 300;
    await a.ops.run({
      opId: id("op"), kind: "install_key", machineId: m, generation: 1,
      args: { publicKey: k.line, mode: "grant", grantId: "grant_t", expiresAt },
    });
    assert.equal(await revoked, "grant_t");
    assert.ok(Date.now() >= expiresAt, "revoked no earlier than expiresAt");
    assert.equal(a.keys.authorize(m, k.fingerprint, Date.now()), null);
    assert.deepEqual(a.store.keys.list(m), [], "the expired key is gone from the store too");
  });

  it("[I4] remove_key removes the exact key, and a delayed install of it at that generation is refused", async () => {
    const a = await agentAt(harness.dir());
    const m = id("m");
    const keep = sshKey();
    const gone = sshKey();
    await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 1 });
    const installGone = { publicKey: gone.line, mode: "grant", grantId: "grant_gone", expiresAt: Date.now() + 600_000 };
    await a.ops.run({ opId: id("op"), kind: "install_key", machineId: m, generation: 1, args: { publicKey: keep.line, mode: "keeper", grantId: "keeper_1", expiresAt: null } });
    await a.ops.run({ opId: id("op"), kind: "install_key", machineId: m, generation: 1, args: installGone });
    const r = await a.ops.run({ opId: id("op"), kind: "remove_key", machineId: m, generation: 1, args: { grantId: "grant_gone", fingerprint: gone.fingerprint } });
    assert.deepEqual((r.result as { removed: unknown[] }).removed, [{ fingerprint: gone.fingerprint, grantId: "grant_gone" }]);
    assert.equal(a.keys.authorize(m, gone.fingerprint, Date.now()), null);
    assert.ok(a.keys.authorize(m, keep.fingerprint, Date.now()), "the other key stays");
    // The install's first delivery arrives late, under its own new opId: refused.
    const late = await refusal(a.ops.run({ opId: id("op"), kind: "install_key", machineId: m, generation: 1, args: installGone }));
    assert.equal(late.code, "conflict");
    assert.equal(a.keys.authorize(m, gone.fingerprint, Date.now()), null);
    // Removing an absent key is not an error: the key is absent either way.
    const again = await a.ops.run({ opId: id("op"), kind: "remove_key", machineId: m, generation: 1, args: { fingerprint: gone.fingerprint } });
    assert.deepEqual((again.result as { removed: unknown[] }).removed, []);
  });

  it("[I5] fence kills every process of the machine (a background one too) and proves none remain", async () => {
    const a = await agentAt(harness.dir());
    const m = id("m");
    const created = await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 1 });
    const h = await a.runtime.exec(m, { argv: ["/bin/sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!"], env: {} });
    let out = "";
    h.stdout.on("data", (b: Buffer) => (out += b.toString()));
    await h.exited;
    const pid = Number(out.trim());
    assert.ok(pid > 0 && alive(pid), "the background process runs before the fence");
    const r = await a.ops.run({ opId: id("op"), kind: "fence", machineId: m, generation: 1 });
    const result = r.result as { incarnationBefore: string; incarnationAfter: string; processesRemaining: number };
    assert.equal(result.incarnationBefore, (created.result as { incarnation: string }).incarnation);
    assert.notEqual(result.incarnationAfter, result.incarnationBefore);
    assert.equal(result.processesRemaining, 0);
    assert.equal(alive(pid), false, "the background process is gone after the fence");
    assert.equal(a.store.machines.get(m)?.incarnation, result.incarnationAfter);
  });

  it("destroy removes the machine and its keys; a late provision of the same id is refused", async () => {
    const a = await agentAt(harness.dir());
    const m = id("m");
    const k = sshKey();
    await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 1 });
    await a.ops.run({ opId: id("op"), kind: "install_key", machineId: m, generation: 1, args: { publicKey: k.line, mode: "grant", grantId: "grant_d", expiresAt: Date.now() + 600_000 } });
    const d = await a.ops.run({ opId: "destroy-1", kind: "destroy", machineId: m, generation: 1 });
    assert.deepEqual(d.result, { existed: true, incarnationBefore: a.store.machines.get(m)?.incarnation, sessionsClosed: 0, keysRemoved: 1, processesRemaining: 0 });
    assert.deepEqual(await a.ops.run({ opId: "destroy-1", kind: "destroy", machineId: m, generation: 1 }), d);
    assert.equal((await a.runtime.inspect(m)).exists, false);
    assert.equal(a.keys.authorize(m, k.fingerprint, Date.now()), null);
    assert.equal((await refusal(a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 1 }))).code, "conflict");
    // Destroying a machine this host never had is recorded, and blocks its late provision.
    const never = id("m");
    const d2 = await a.ops.run({ opId: id("op"), kind: "destroy", machineId: never, generation: 0 });
    assert.equal((d2.result as { existed: boolean }).existed, false);
    assert.equal((await refusal(a.ops.run({ opId: id("op"), kind: "provision", machineId: never, generation: 0 }))).code, "conflict");
    assert.deepEqual(await a.runtime.list(), []);
  });
});

const gvisor = gvisorAvailability();
describe("agent operations on the gvisor runtime", () => {
  it(
    "provision, fence (new incarnation, 0 processes), scrub, restart re-attaches the scrubbed sandbox, destroy leaves nothing",
    { skip: gvisor.ok ? false : `gvisor unavailable here: ${gvisor.why}` },
    async () => {
      const dir = harness.dir();
      const m = id("m");
      let a = await harness.agent({ stateDir: dir, runtime: "gvisor" });
      const created = await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 1 });
      const fence = await a.ops.run({ opId: id("op"), kind: "fence", machineId: m, generation: 1 });
      const f = fence.result as { incarnationBefore: string; incarnationAfter: string; processesRemaining: number };
      assert.equal(f.incarnationBefore, (created.result as { incarnation: string }).incarnation);
      assert.notEqual(f.incarnationAfter, f.incarnationBefore);
      assert.equal(f.processesRemaining, 0);
      await a.ops.run({ opId: id("op"), kind: "scrub", machineId: m, generation: 1 });
      // gVisor's scrub restarts the sandbox; the agent records the new incarnation...
      assert.equal(a.store.machines.get(m)?.incarnation, (await a.runtime.inspect(m)).incarnation);
      await a.stop();
      // ...so that the next start recognises the machine as its own.
      a = await harness.agent({ stateDir: dir, runtime: "gvisor" });
      assert.deepEqual(a.recovery.reattached, [m]);
      assert.deepEqual(a.recovery.mismatched, []);
      const d = await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 1 });
      assert.equal((d.result as { processesRemaining: number }).processesRemaining, 0);
      assert.deepEqual(await a.runtime.list(), []);
    },
  );
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  // A zombie is not alive.
  try {
    return !/^\d+ \(.*\) [ZX]/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}
