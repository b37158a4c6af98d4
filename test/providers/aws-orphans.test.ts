/**
 * `berth aws orphans [--terminate]` as a user runs it (the real CLI process,
 * the SDK's default credential chain from the environment) against the
 * EC2/SSM emulator and a real SQLite store: an instance of a live machine is
 * accounted for; one whose machine has no live record, one with berth's tags
 * and no launch record, and a launch record whose instance was terminated
 * behind berth's back are listed; --terminate without --yes and without a
 * terminal is refused and ends nothing; with --yes they are ended.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { awsWorld, done, FAKE_CREDENTIALS, machine, op, untilSettled } from "../helpers/aws.js";
import { BERTH_BIN } from "../helpers/serve.js";
import { insertMachine } from "../../src/store/machines.js";
import { TAG } from "../../src/providers/aws/ec2.js";
import { endOrphans, findOrphans } from "../../src/providers/aws/orphans.js";
import { liveMachinesIn } from "../../src/providers/aws/sweep.js";

function berth(args: string[], env: Record<string, string>): Promise<{ code: number; out: string; err: string }> {
  return new Promise((resolve) => {
    const child = execFile(process.execPath, [BERTH_BIN, ...args], { env: { ...process.env, ...env, BERTH_PG_URL: "" }, timeout: 60_000 }, (e, out, err) =>
      resolve({ code: e ? (typeof e.code === "number" ? e.code : 1) : 0, out, err }),
    );
    child.stdin?.end();
  });
}

test("berth aws orphans lists what nothing accounts for and ends it only with --terminate --yes", { timeout: 120_000 }, async () => {
  const w = await awsWorld({ stepBudgetMs: 8_000, pollMs: 50 });
  try {
    const env = { AWS_ACCESS_KEY_ID: FAKE_CREDENTIALS.accessKeyId, AWS_SECRET_ACCESS_KEY: FAKE_CREDENTIALS.secretAccessKey, AWS_PROFILE: "", AWS_CONFIG_FILE: "/dev/null", AWS_SHARED_CREDENTIALS_FILE: "/dev/null" };
    const configFile = join(w.dir, "aws.json");
    writeFileSync(configFile, JSON.stringify({ deployment: "test", endpoint: w.emu.url, pools: { ci: { region: "eu-west-1", subnetId: "subnet-0abc", securityGroupIds: ["sg-0abc"], instanceType: "t3.micro", imageId: "ami-0abc1234", instanceProfile: "berth-ssm", sshPort: w.emu.sshPort } } }));
    const launched = async (id: string) => String(done((await untilSettled(w.provider, op("provision", machine(id), 0))).outcome).instanceId);
    const kept = await launched("m_live");
    const orphan = await launched("m_forgotten");
    const goneRec = await launched("m_gone");
    await w.store.transaction((tx) =>
      insertMachine(tx, { id: "m_live", org: "default", pool: "ci", access: "portable", provider: "aws", resourceId: "m_live", hostId: null, state: "ready", ssh: { host: null, port: null, user: null, hostKey: null }, claimId: "c_x", now: Date.now(), hardExpiresAt: Date.now() + 3_600_000 }),
    );
    await w.emu.terminate(w.emu.instances.get(goneRec)!);
    const unrecorded = w.emu.newInstance({ [TAG.managed]: "test", [TAG.org]: "default", [TAG.pool]: "ci", [TAG.machine]: "m_elsewhere" }, "token-of-another-database", "eu-west-1").id;
    const base = ["aws", "orphans", "--aws-config", configFile, "--db", join(w.dir, "berth.db")];

    const listed = await berth([...base, "--json"], env);
    assert.equal(listed.code, 1, `found and left: ${listed.err}`);
    const r = JSON.parse(listed.out) as { instances: Array<{ instanceId: string; why: string[]; terminate: boolean }>; records: Array<{ instanceId: string; machineId: string; close: boolean }> };
    const why = Object.fromEntries(r.instances.map((i) => [i.instanceId, i.why.join(", ")]));
    assert.deepEqual(why, { [orphan]: "no live machine", [unrecorded]: "no live machine, unrecorded" }, "the live machine's instance is accounted for");
    assert.deepEqual(r.records.map((x) => [x.instanceId, x.machineId, x.close]), [[goneRec, "m_gone", true]]);

    const refused = await berth([...base, "--terminate"], env);
    assert.equal(refused.code, 2, refused.err);
    assert.match(refused.err, /confirm with --yes/);
    assert.equal(w.emu.instances.get(orphan)!.state, "running", "nothing ended without confirmation");

    const ended = await berth([...base, "--terminate", "--yes"], env);
    assert.equal(ended.code, 0, ended.err);
    assert.match(ended.out, new RegExp(`${orphan} +eu-west-1 +test +m_forgotten +\\S+ +no live machine +terminated`));
    assert.match(ended.out, new RegExp(`${unrecorded} .*no live machine, unrecorded +terminated`));
    assert.match(ended.out, new RegExp(`\\S+ +${goneRec} +eu-west-1 +m_gone +terminated +closed`));
    for (const id of [orphan, unrecorded]) assert.match(w.emu.instances.get(id)!.state, /shutting-down|terminated/);
    assert.equal(w.emu.instances.get(kept)!.state, "running", "the live machine's instance is untouched");
    const closed = (await w.provider.records.open()).map((x) => x.machineId).sort();
    assert.deepEqual(closed, ["m_forgotten", "m_live"], "the gone instance's record is closed; the others stay open until observed terminated");

    // The terminated orphan's record is closed once its instance is observed terminated: by the next look.
    const live = liveMachinesIn(w.store);
    const next = await findOrphans(w.provider, live);
    assert.deepEqual([next.instances, next.records.map((x) => x.machineId)], [[], ["m_forgotten"]]);
    await endOrphans(w.provider, next);
    const again = await findOrphans(w.provider, live);
    assert.deepEqual([again.instances, again.records], [[], []]);
    assert.deepEqual((await w.provider.records.open()).map((x) => x.machineId), ["m_live"]);
  } finally {
    await w.close();
  }
});
