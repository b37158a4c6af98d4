/**
 * A sandbox that died under its allocation, then an agent restart: the
 * agent marks the machine as not matching its record (the runtime has the
 * container but nothing running), so the release the owner asks for is
 * refused by the agent and the allocation is quarantined with its budget
 * charged. `berth alloc resolve ID --keep-volume|--destroy` is the operator
 * command that ends that quarantine: the agent destroys what is left of the
 * sandbox (proving nothing runs), keeps or wipes the volume, and only then
 * are slot and budget returned. Real `berth serve`, real `berth agent` on
 * gvisor (runsc), the sandbox SIGKILLed from outside (the way its memory
 * cgroup kills it on an overrun), the binary's own commands. Before the
 * agent restart the coordinator's watch shows the allocation `failed` with
 * the cause, and `berth alloc restart` starts it again on its volume; a
 * restart is refused, nothing changed, once the agent restarted and lost the
 * machine, and on a withdrawn host.
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { AllocRig } from "../helpers/alloc-rig.js";
import { berth } from "../helpers/cluster.js";
import type { ServeProcess } from "../helpers/serve.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { allPids, readCmdline } from "../../src/agent/runtime/procfs.js";

const gv = gvisorAvailability();

/** The runsc processes (sandbox, gofer) of one machine under this rig's runsc root. */
function sandboxPids(rig: AllocRig, machine: string): number[] {
  return allPids().filter((pid) => {
    const cmd = readCmdline(pid).join(" ");
    return cmd.includes("runsc") && cmd.includes(join(rig.agentDir, "runsc")) && cmd.includes(machine);
  });
}

describe("a dead sandbox's quarantine ends by an operator command (gvisor, real coordinator and agent)", { skip: gv.ok ? false : `gvisor runtime unavailable: ${(gv as { why: string }).why}`, timeout: 240_000 }, () => {
  const rig = new AllocRig("sqlite", true, ["--alloc-actor-lease", "5s", "--alloc-watch", "1s"], "gvisor");
  let c: ServeProcess;
  let env: Record<string, string>;
  before(async () => {
    await rig.start();
    c = rig.coordinators[0]!;
    env = rig.cliEnv();
  });
  after(() => rig.close());
  const cli = (args: string[]) => berth(args, { env });
  const record = (id: string) => rig.store.transaction((tx) => tx.get("SELECT state, reason, state_since FROM allocations WHERE id = ?", [id]));
  /** A refused restart changed nothing: the same record (state, reason, since), no restart armed, the same budget. */
  const assertUnchanged = async (id: string, before: unknown, use: Awaited<ReturnType<AllocRig["ownerUse"]>>) => {
    assert.deepEqual(await record(id), before);
    const due = await rig.store.transaction((tx) => tx.all("SELECT kind FROM due WHERE kind = 'alloc_restart' AND ref = ?", [id]));
    assert.deepEqual(due, []);
    assert.deepEqual(await rig.ownerUse(), use);
  };

  test("sandbox SIGKILLed + agent restart → release --keep-volume quarantined, budget charged → alloc resolve --keep-volume → released, budget back, volume kept", async () => {
    const idle = await rig.ownerUse();
    const created = await cli(["alloc", "create", "--size", "small", "--id", "q1", "--wait"]);
    assert.equal(created.status, 0, created.stderr);
    const w = await cli(["ssh", "q1", "--", "sh", "-c", "echo precious > /workspace/keep.txt"]);
    assert.equal(w.status, 0, w.stderr);
    const charged = await rig.ownerUse();
    assert.equal(charged.count, idle.count + 1);

    // Resolving is for quarantines only: a ready allocation is refused, nothing changed.
    const early = await cli(["alloc", "resolve", "q1", "--destroy"]);
    assert.equal(early.status, 1, early.stdout);
    assert.match(early.stderr, /conflict: allocation q1 is ready/);
    assert.equal((await rig.allocation("q1")).state, "ready");

    // The sandbox dies from outside (as its memory cgroup kills it on an overrun): the watch shows it failed, with the cause.
    const first = sandboxPids(rig, "a-q1");
    assert.ok(first.length > 0, "the sandbox's runsc processes are found");
    for (const pid of first) process.kill(pid, "SIGKILL");
    await rig.waitState("q1", "failed", 30_000);
    assert.match((await cli(["alloc", "show", "q1"])).stdout, /state {6}failed \(sandbox died: the sandbox is not running/);
    assert.deepEqual(await rig.ownerUse(), charged, "a failed allocation stays charged");
    assert.match(await (await fetch(`${c.url}/metrics`)).text(), /berth_allocation_sandbox_deaths_total 1/);
    // Restarted on its host with its volume and key; the budget is unchanged.
    const restarted = await cli(["alloc", "restart", "q1"]);
    assert.equal(restarted.status, 0, restarted.stderr);
    assert.match(restarted.stdout, /q1: restart under way/);
    await rig.waitState("q1", "ready", 60_000);
    const back = await cli(["ssh", "q1", "--", "cat", "/workspace/keep.txt"]);
    assert.equal(back.stdout, "precious\n", back.stderr);
    assert.deepEqual(await rig.ownerUse(), charged);
    const twice = await cli(["alloc", "restart", "q1"]);
    assert.equal(twice.status, 1);
    assert.match(twice.stderr, /conflict: allocation q1 is ready; only a failed allocation is restarted/);

    // It dies again, then the agent restarts and finds it not running.
    const pids = sandboxPids(rig, "a-q1");
    assert.ok(pids.length > 0, "the sandbox's runsc processes are found");
    for (const pid of pids) process.kill(pid, "SIGKILL");
    await rig.killAgent();
    await rig.startAgent(c.url);
    const machine = (await rig.agentGet("/v1/agent/machines")).body as { machines: Array<{ machineId: string; state: string; mismatch: string | null }> };
    const m = machine.machines.find((x) => x.machineId === "a-q1");
    assert.equal(m?.state, "mismatch", JSON.stringify(machine));

    // The agent no longer has the machine as recorded and does not start it again: the restart is refused at
    // once with a stable code, and nothing changed (still failed, same reason, no restart armed, budget as it was).
    await rig.waitState("q1", "failed", 30_000);
    const failedRec = await record("q1");
    const lost = await cli(["alloc", "restart", "q1"]);
    assert.equal(lost.status, 1, lost.stdout);
    assert.match(lost.stderr, new RegExp(`conflict: allocation q1 is not restarted: the agent of host ${rig.hostId} no longer has its sandbox as recorded`));
    assert.match(lost.stderr, /release it \(berth alloc release q1\)/);
    await assertUnchanged("q1", failedRec, charged);

    // The owner's release is refused by the agent: quarantined, budget still charged.
    assert.equal((await cli(["alloc", "release", "q1", "--keep-volume"])).status, 0);
    await rig.waitState("q1", "quarantined", 60_000);
    assert.deepEqual(await rig.ownerUse(), charged, "nothing returned while the cleanup is in doubt");

    // Only an operator ends it; the choice of volume is the operator's.
    const resolved = await cli(["alloc", "resolve", "q1", "--keep-volume"]);
    assert.equal(resolved.status, 0, resolved.stderr);
    assert.match(resolved.stdout, /q1/);
    await rig.waitState("q1", "released", 60_000);
    assert.deepEqual(await rig.ownerUse(), idle, "slot and budget back, once");
    assert.deepEqual(sandboxPids(rig, "a-q1"), [], "nothing of the sandbox runs");
    const after = (await rig.agentGet("/v1/agent/machines")).body as { machines: Array<{ machineId: string; state: string }> };
    assert.notEqual(after.machines.find((x) => x.machineId === "a-q1")?.state, "mismatch");
    assert.equal(readFileSync(join(rig.agentDir, "volumes", "q1", "data", "keep.txt"), "utf8"), "precious\n", "the kept volume still holds its data");
    assert.equal((await cli(["volume", "verify", "q1"])).status, 0);
    const show = await cli(["alloc", "show", "q1"]);
    assert.match(show.stdout, /released \(quarantine resolved by an operator/);
    assert.ok(existsSync(join(rig.agentDir, "volumes", "q1")));
  });

  test("a failed allocation is released like a ready one: sandbox gone, budget back", async () => {
    const idle = await rig.ownerUse();
    assert.equal((await cli(["alloc", "create", "--size", "small", "--id", "f1", "--wait"])).status, 0);
    for (const pid of sandboxPids(rig, "a-f1")) process.kill(pid, "SIGKILL");
    await rig.waitState("f1", "failed", 30_000);
    const charged = await rig.ownerUse();

    // A host withdrawn meanwhile: the restart is refused with a stable code, nothing changed.
    assert.equal((await cli(["alloc", "standing", rig.hostId, "withdrawn"])).status, 0);
    const failedRec = await record("f1");
    const refused = await cli(["alloc", "restart", "f1"]);
    assert.equal(refused.status, 1, refused.stdout);
    assert.match(refused.stderr, /conflict: allocation f1 is not restarted: host is withdrawn; release it \(berth alloc release f1\)/);
    await assertUnchanged("f1", failedRec, charged);
    assert.deepEqual(sandboxPids(rig, "a-f1"), [], "nothing was started");

    assert.equal((await cli(["alloc", "release", "f1"])).status, 0);
    await rig.waitState("f1", "released", 60_000);
    assert.deepEqual(await rig.ownerUse(), idle);
    assert.deepEqual(sandboxPids(rig, "a-f1"), []);
  });
});

describe("volume commands, and a quarantine on a host that is gone for good ends by the operator's attestation (process runtime, real coordinator and agent)", { timeout: 180_000 }, () => {
  const rig = new AllocRig("sqlite", true, ["--alloc-actor-lease", "1s"], "process");
  let env: Record<string, string>;
  before(async () => {
    await rig.start();
    env = rig.cliEnv();
  });
  after(() => rig.close());
  const cli = (args: string[]) => berth(args, { env });

  // Runs before the agent is killed for good below. Every volume state has its ending command.
  test("volume verify --all, volume reset --all|ID…, volume rm of a kept volume, volume quarantine ls and rm", async () => {
    // An unrecorded directory waits at k2's volume path: it is moved aside at k2's launch, never adopted.
    mkdirSync(join(rig.agentDir, "volumes", "k2", "data"), { recursive: true });
    writeFileSync(join(rig.agentDir, "volumes", "k2", "data", "stale.txt"), "stale\n");
    for (const id of ["k1", "k2"]) assert.equal((await cli(["alloc", "create", "--size", "small", "--id", id, "--wait"])).status, 0);
    writeFileSync(join(rig.agentDir, "volumes", "k1", "data", "keep.txt"), "precious\n");

    const all = await cli(["volume", "verify", "--all"]);
    assert.equal(all.status, 0, all.stderr);
    assert.match(all.stdout, /volume of k1: ok\nvolume of k2: ok\n2 volume\(s\) checked, 0 damaged/);
    writeFileSync(join(rig.agentDir, "volumes", "k2", "marker"), "junk\n");
    const bad = await cli(["volume", "verify", "--all"]);
    assert.equal(bad.status, 1);
    assert.match(bad.stdout, /volume of k2: DAMAGED\n {2}- marker/);
    assert.equal((await cli(["volume", "verify"])).status, 1, "one allocation or --all");

    // Reset every volume: each on its own, the damaged one refused (and left as it is), audited.
    writeFileSync(join(rig.agentDir, "volumes", "k2", "data", "k2.txt"), "k2\n");
    const reset = await cli(["volume", "reset", "--all"]);
    assert.equal(reset.status, 1, reset.stderr);
    assert.match(reset.stdout, /volume of k1: reset \(1 entries removed\)\n/);
    assert.match(reset.stdout, /volume of k2: REFUSED: conflict: the workspace volume of allocation k2 failed verification \(marker/);
    assert.match(reset.stdout, /1 volume\(s\) reset, 1 refused\n$/);
    assert.equal(existsSync(join(rig.agentDir, "volumes", "k1", "data", "keep.txt")), false);
    assert.ok(existsSync(join(rig.agentDir, "volumes", "k2", "data", "k2.txt")), "a refused reset removes nothing");
    assert.equal((await cli(["volume", "reset"])).status, 1, "allocations or --all");
    const named = await cli(["volume", "reset", "k1", "nosuch"]);
    assert.equal(named.status, 1);
    assert.match(named.stdout, /volume of k1: reset \(0 entries removed\)\nvolume of nosuch: REFUSED: not_found/);
    writeFileSync(join(rig.agentDir, "volumes", "k1", "data", "keep.txt"), "precious\n");

    // A kept volume: refused while its allocation lives, removed once released.
    const early = await cli(["volume", "rm", "k1"]);
    assert.equal(early.status, 1);
    assert.match(early.stderr, /conflict: allocation k1 is ready; only a released allocation's kept volume is removed/);
    assert.equal((await cli(["alloc", "release", "k1", "--keep-volume"])).status, 0);
    await rig.waitState("k1", "released");
    assert.ok(existsSync(join(rig.agentDir, "volumes", "k1", "data", "keep.txt")), "kept after release");
    const rm = await cli(["volume", "rm", "k1"]);
    assert.equal(rm.status, 0, rm.stderr);
    assert.equal(rm.stdout, "volume of k1: removed\n");
    assert.equal(existsSync(join(rig.agentDir, "volumes", "k1")), false);
    assert.doesNotMatch((await cli(["volume", "ls"])).stdout, /k1/);
    const trail = await rig.store.transaction((tx) => tx.all<{ event: string }>("SELECT event FROM audit WHERE machine_id = 'a-k1' ORDER BY seq"));
    assert.deepEqual(trail.map((t) => t.event), ["volume_reset", "volume_reset", "volume_removed"]);

    // The moved-aside directory: listed, then removed by name.
    const moved = readdirSync(join(rig.agentDir, "volumes-quarantine"));
    assert.equal(moved.length, 1);
    assert.match(moved[0]!, /^k2-\d+$/);
    const ls = await cli(["volume", "quarantine", "ls"]);
    assert.equal(ls.status, 0, ls.stderr);
    assert.match(ls.stdout, new RegExp(`h1 +${rig.hostId} +${moved[0]}`));
    assert.equal((await cli(["volume", "quarantine", "rm", rig.hostId, "nosuch"])).status, 1);
    const qrm = await cli(["volume", "quarantine", "rm", rig.hostId, moved[0]!]);
    assert.equal(qrm.status, 0, qrm.stderr);
    assert.deepEqual(readdirSync(join(rig.agentDir, "volumes-quarantine")), []);
    assert.doesNotMatch((await cli(["volume", "quarantine", "ls"])).stdout, /k2-/);
    assert.equal((await cli(["alloc", "release", "k2"])).status, 0);
    await rig.waitState("k2", "released");
  });

  test("agent SIGKILLed for good → withdrawing, release quarantined → standing withdrawn --host-gone → resolve --host-gone → released, budget back", async () => {
    const idle = await rig.ownerUse();
    assert.equal((await cli(["alloc", "create", "--size", "small", "--id", "g1", "--wait"])).status, 0);
    const charged = await rig.ownerUse();
    await rig.killAgent();

    const withdrawing = await cli(["alloc", "standing", rig.hostId, "withdrawn"]);
    assert.equal(withdrawing.status, 0, withdrawing.stderr);
    assert.match(withdrawing.stdout, /withdrawing/);
    assert.equal((await cli(["alloc", "release", "g1"])).status, 0);
    await rig.waitState("g1", "quarantined", 60_000);
    assert.deepEqual(await rig.ownerUse(), charged);

    // Unproven ends need the operator's word that the host is gone; the agent's silence is not enough.
    const early = await cli(["alloc", "resolve", "g1", "--host-gone"]);
    assert.equal(early.status, 1);
    assert.match(early.stderr, /conflict: host h1 is withdrawn but its withdrawal is not acknowledged/);
    const wrong = await cli(["alloc", "standing", rig.hostId, "ready", "--host-gone"]);
    assert.equal(wrong.status, 1);
    assert.match(wrong.stderr, /invalid_request: only a withdrawn host can be attested gone/);
    assert.equal((await rig.allocation("g1")).state, "quarantined");

    const gone = await cli(["alloc", "standing", rig.hostId, "withdrawn", "--host-gone"]);
    assert.equal(gone.status, 0, gone.stderr);
    assert.match(gone.stdout, new RegExp(`host ${rig.hostId}: withdrawn`));
    const hosts = await cli(["alloc", "hosts", "--json"]);
    assert.match(hosts.stdout, /"reported": "withdrawn"/);

    const resolved = await cli(["alloc", "resolve", "g1", "--host-gone"]);
    assert.equal(resolved.status, 0, resolved.stderr);
    assert.match(resolved.stdout, /g1: released; slot and budget returned/);
    assert.equal((await rig.allocation("g1")).state, "released");
    assert.match((await rig.allocation("g1")).reason ?? "", /host gone \(attested by operator/);
    assert.deepEqual(await rig.ownerUse(), idle, "slot and budget back, once");
    const ledger = await rig.store.transaction((tx) => tx.all<{ event: string; detail: string }>("SELECT event, detail FROM allocation_ledger WHERE allocation_id = 'g1' ORDER BY seq"));
    assert.deepEqual(ledger.map((l) => l.event), ["reserve", "refund"]);
    assert.match(ledger[1]!.detail, /attested by operator/);
  });
});
