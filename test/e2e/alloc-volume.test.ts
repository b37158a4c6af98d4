/**
 * A kept volume re-attached to a new allocation of the same owner (`berth
 * alloc create --volume VOL`), through the binary against a real `berth
 * serve` and a real `berth agent` (process runtime): a file written over
 * SSH, `release --keep-volume`, a new allocation on that volume reads it
 * back over the system ssh. Two clients racing for one volume: exactly one
 * wins. A retried create answers the same allocation. Each refusal (unknown
 * volume, another owner's, one still attached, a damaged one, one on a
 * withdrawn host) has a stable code and changes nothing: no allocation, the
 * same budget, the volume's record untouched on its agent, nothing audited.
 * The agent itself refuses a launch naming a volume it has no record of.
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { AllocRig } from "../helpers/alloc-rig.js";
import { berth } from "../helpers/cluster.js";
import type { ServeProcess } from "../helpers/serve.js";
import { createToken } from "../../src/store/api-tokens.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";

describe("alloc create --volume: a kept volume re-attached (process runtime, real coordinator and agent)", { timeout: 600_000 }, () => {
  const rig = new AllocRig("sqlite", true, ["--alloc-actor-lease", "2s"], "process");
  let c: ServeProcess;
  let env: Record<string, string>;
  let other: Record<string, string>;
  before(async () => {
    await rig.start();
    c = rig.coordinators[0]!;
    env = rig.cliEnv();
    // A second owner, admitted with its own budget.
    const m = await createToken(rig.store, { org: "acme", role: "member", expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n));
    writeFileSync(join(rig.tmp.path, "member.token"), m.token, { mode: 0o600 });
    await rig.api(c).call("POST", `/v1/owners/${m.id}/admit`, { vcpu: 8, memoryMib: 16384, count: 4 });
    other = { ...env, BERTH_TOKEN_FILE: join(rig.tmp.path, "member.token"), BERTH_KEY_DIR: join(rig.tmp.path, "member-keys") };
  });
  after(() => rig.close());
  const cli = (args: string[], e = env) => berth(args, { env: e });
  /** `berth ssh --print` run by the system ssh (BatchMode: never a prompt). */
  const sshPrint = async (id: string, command: string): Promise<{ status: number | null; out: string; err: string }> => {
    const p = await cli(["ssh", "--print", id, "--", "sh", "-c", command]);
    assert.equal(p.status, 0, p.stderr);
    const line = p.stdout.trim().replace(/^ssh /, "ssh -o BatchMode=yes ");
    const r = spawnSync("sh", ["-c", line], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 60_000 });
    return { status: r.status, out: r.stdout, err: r.stderr };
  };
  const volumeRecord = async (id: string) => ((await rig.agentGet(`/v1/agent/volumes/${id}`)).body as { state?: string; path?: string }).state;
  const attachedAudit = () => rig.store.transaction((tx) => tx.all<{ machine_id: string; detail: string }>("SELECT machine_id, detail FROM audit WHERE event = 'volume_attached' ORDER BY seq"));
  const exists = async (id: string) => (await rig.store.transaction((tx) => tx.get("SELECT id FROM allocations WHERE id = ?", [id]))) !== undefined;

  /** A refused create: exit 1 (69 for no_capacity: try later), the code in its message, and nothing changed. */
  const refused = async (args: string[], code: RegExp, e = env, exit = 1) => {
    const use = await rig.ownerUse();
    const audited = (await attachedAudit()).length;
    const id = args[args.indexOf("--id") + 1]!;
    const r = await cli(["alloc", "create", "--size", "small", ...args], e);
    assert.equal(r.status, exit, `${r.stdout}${r.stderr}`);
    assert.match(r.stderr, code);
    assert.equal(await exists(id), false, `no allocation ${id}`);
    assert.deepEqual(await rig.ownerUse(), use, "budget unchanged");
    assert.equal((await attachedAudit()).length, audited, "nothing audited");
    return r;
  };

  test("write, release --keep-volume, create --volume: the file is read back over ssh; racing creates: one wins; refusals change nothing", async () => {
    assert.equal((await cli(["alloc", "create", "--size", "small", "--id", "v1", "--wait"])).status, 0);
    const w = await sshPrint("v1", "echo precious > keep.txt");
    assert.equal(w.status, 0, w.err);
    assert.equal((await cli(["alloc", "release", "v1", "--keep-volume"])).status, 0);
    await rig.waitState("v1", "released");
    assert.equal(await volumeRecord("v1"), "ready", "kept");

    // Refusals: each with its code, nothing created or charged, the kept volume untouched.
    await refused(["--id", "r1", "--volume", "nosuch"], /not_found: no volume nosuch of owner/);
    await refused(["--id", "r2", "--volume", "v1"], /not_found: no volume v1 of owner/, other);
    assert.equal((await cli(["alloc", "create", "--size", "small", "--id", "v2", "--wait"])).status, 0);
    await refused(["--id", "r3", "--volume", "v2"], /conflict: volume v2 is attached to allocation v2, which is ready; release it first/);
    const noKey = await cli(["alloc", "create", "--size", "small", "--id", "r4", "--volume", "v1", "--no-key"]);
    assert.equal(noKey.status, 1);
    assert.match(noKey.stderr, /invalid_request: a volume is attached only to an allocation that launches/);
    // A damaged kept volume (its marker overwritten) is refused by its agent's verification.
    assert.equal((await cli(["alloc", "release", "v2", "--keep-volume"])).status, 0);
    await rig.waitState("v2", "released");
    writeFileSync(join(rig.agentDir, "volumes", "v2", "marker"), "junk\n");
    await refused(["--id", "r5", "--volume", "v2"], /conflict: volume v2 failed verification on its host \(marker does not match the record\); it is not attached/);
    assert.equal(await volumeRecord("v2"), "ready");
    // The volume's host decides: withdrawn, it takes nothing, and the refusal says why.
    assert.equal((await cli(["alloc", "standing", rig.hostId, "withdrawn"])).status, 0);
    await refused(["--id", "r6", "--volume", "v1"], new RegExp(`no_capacity: volume v1 is on host h1 \\(${rig.hostId}\\), which cannot take a small now: host is withdrawn`), env, 69);
    assert.equal((await cli(["alloc", "standing", rig.hostId, "ready"])).status, 0);
    assert.equal(await volumeRecord("v1"), "ready", "every refusal left the kept volume as it was");
    assert.deepEqual(await attachedAudit(), []);

    // Two clients race for v1: exactly one wins, the other is refused as attached.
    const use = await rig.ownerUse();
    const [a, b] = await Promise.all(["w1", "w2"].map((id) => cli(["alloc", "create", "--size", "small", "--id", id, "--volume", "v1"])));
    assert.deepEqual([a!.status, b!.status].sort(), [0, 1], `${a!.stderr}\n${b!.stderr}`);
    const [win, lose] = a!.status === 0 ? ["w1", "w2"] : ["w2", "w1"];
    assert.match((a!.status === 0 ? b! : a!).stderr, new RegExp(`conflict: volume v1 is attached to allocation ${win}`));
    assert.equal(await exists(lose), false);
    assert.equal((await rig.ownerUse()).count, use.count + 1, "charged once");
    await rig.waitState(win, "ready");
    const back = await sshPrint(win, "cat keep.txt; pwd -P");
    assert.equal(back.status, 0, back.err);
    assert.match(back.out, /^precious\n/);
    assert.match(back.out, /\/volumes\/v1\/data\n$/, "the same directory");
    assert.match((await cli(["alloc", "show", win])).stdout, /volume {5}attached: the kept volume of v1/);
    assert.equal(await volumeRecord(win), "ready");
    assert.equal(await volumeRecord("v1"), "moved");
    assert.deepEqual((await attachedAudit()).map((x) => [x.machine_id, x.detail]), [["a-v1", `to allocation ${win} on host ${rig.hostId}`]]);
    assert.equal((await cli(["volume", "verify", win])).status, 0);

    // The same create again (same id, same request, the key already on disk): the same allocation, nothing charged.
    const again = await cli(["alloc", "create", "--size", "small", "--id", win, "--volume", "v1"]);
    assert.equal(again.status, 0, again.stderr);
    assert.match(again.stdout, new RegExp(`allocation ${win} \\(already created with this id\\)`));
    assert.equal((await rig.ownerUse()).count, use.count + 1);
    // Another request under that id is a conflict.
    assert.match((await cli(["alloc", "create", "--size", "small", "--id", win])).stderr, /conflict: allocation id .* already taken by a different request/);

    // Kept again, it is named by its allocation now: attached under that name; the old name is refused.
    assert.equal((await cli(["alloc", "release", win, "--keep-volume"])).status, 0);
    await rig.waitState(win, "released");
    await refused(["--id", "r7", "--volume", "v1"], new RegExp(`conflict: volume v1 was attached to allocation ${win}, which kept it: it is named ${win} now`));
    assert.equal((await cli(["alloc", "create", "--size", "small", "--id", "w3", "--volume", win, "--wait"])).status, 0);
    assert.equal((await sshPrint("w3", "cat keep.txt")).out, "precious\n");
    // Released without keeping it: the volume is wiped with it, and gone for good.
    assert.equal((await cli(["alloc", "release", "w3"])).status, 0);
    await rig.waitState("w3", "released");
    await refused(["--id", "r8", "--volume", win], new RegExp(`not_found: volume ${win} was attached to allocation w3 and wiped`));
    assert.equal(await volumeRecord("w3"), "clean");
  });

  test("the agent refuses a launch naming a volume it has no record of, or one still held: nothing made", async () => {
    const key = generateSshKeyPair("volume-test");
    // The host's standing epoch now (the standing changed above): a launch decided under an older one is refused first.
    const row = await rig.store.transaction((tx) => tx.get<{ standing_epoch: number }>("SELECT standing_epoch FROM host_accounts WHERE host_id = ?", [rig.hostId]));
    const standingEpoch = Number(row!.standing_epoch);
    for (const [alloc, volume, status] of [["x1", "nosuch", 404], ["x2", "v2held", 409]] as const) {
      if (volume === "v2held") {
        assert.equal((await cli(["alloc", "create", "--size", "small", "--id", "v2held", "--wait"])).status, 0);
      }
      const hold = await rig.agentOp({ opId: `t-${alloc}-h1`, kind: "alloc_hold", machineId: `a-${alloc}`, generation: 1, args: { allocationId: alloc, vcpu: 2, memoryMib: 4096 } });
      assert.equal(hold.status, 200, JSON.stringify(hold.body));
      const launch = await rig.agentOp({ opId: `t-${alloc}-l1`, kind: "alloc_launch", machineId: `a-${alloc}`, generation: 1, args: { allocationId: alloc, publicKey: key.publicKey, expiresAt: Date.now() + 3_600_000, standingEpoch, volume } });
      assert.equal(launch.status, status, JSON.stringify(launch.body));
      assert.equal((await rig.agentGet(`/v1/agent/volumes/${alloc}`)).status, 404, "no volume made for it");
      const rel = await rig.agentOp({ opId: `t-${alloc}-r`, kind: "alloc_release", machineId: `a-${alloc}`, generation: 0, args: { allocationId: alloc, keepVolume: false } });
      assert.equal(rel.status, 200, JSON.stringify(rel.body));
    }
    assert.equal(await volumeRecord("v2held"), "ready", "a held allocation's volume stays its own");
    assert.ok(readFileSync(join(rig.agentDir, "volumes", "v2held", "marker"), "utf8").startsWith("v2held "));
  });
});
