/**
 * scripts/aws-live-proof.sh against the EC2/SSM emulator, as a user runs it
 * (bash, the real `berth` CLI and coordinator, credentials from the
 * environment): `--dry-run` and a run without `--yes` or a terminal launch
 * nothing; a run stopped by SIGTERM while its first instances launch, and a
 * run whose coordinator is killed -9 once two instances are ready (the
 * script then fails on its next call), each end with zero instances left:
 * the exit trap drains through the coordinator when it answers, then
 * terminates by launch record and by tag with the coordinator stopped.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { AwsEmulator } from "../helpers/aws-emulator/emulator.js";
import { FAKE_CREDENTIALS } from "../helpers/aws.js";
import { BERTH_BIN } from "../helpers/serve.js";
import { tempDir } from "../helpers/env.js";

const SCRIPT = resolve(dirname(BERTH_BIN), "../scripts/aws-live-proof.sh");

interface Run {
  done: Promise<{ code: number | null; signal: string | null; out: string }>;
  pid: number;
  out: () => string;
  /** The script's work directory (printed first). */
  work: () => string | null;
}

function proof(args: string[], emu: AwsEmulator, dir: string): Run {
  const config = join(dir, "aws.json");
  writeFileSync(
    config,
    JSON.stringify({
      deployment: "proof-emu",
      endpoint: emu.url,
      pools: { proof: { region: "eu-west-1", subnetId: "subnet-0abc", securityGroupIds: ["sg-0abc"], instanceType: "t3.micro", imageId: "ami-0abc1234", instanceProfile: "berth-ssm", sshPort: emu.sshPort } },
    }),
  );
  const env = {
    ...process.env,
    AWS_ACCESS_KEY_ID: FAKE_CREDENTIALS.accessKeyId,
    AWS_SECRET_ACCESS_KEY: FAKE_CREDENTIALS.secretAccessKey,
    AWS_PROFILE: "",
    AWS_CONFIG_FILE: "/dev/null",
    AWS_SHARED_CREDENTIALS_FILE: "/dev/null",
    BERTH_PG_URL: "",
    BERTH_PROOF_POLL: "0.2",
    BERTH_PROOF_DRAIN_TIMEOUT: "60",
    TMPDIR: dir,
  };
  const child = spawn("bash", [SCRIPT, ...args, config], { env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (out += d.toString()));
  const done = new Promise<{ code: number | null; signal: string | null; out: string }>((r) => child.on("close", (code, signal) => r({ code, signal, out })));
  return { done, pid: child.pid!, out: () => out, work: () => /^work directory[^:]*: (\S+)$/m.exec(out)?.[1] ?? null };
}

async function until(what: string, fn: () => boolean, run: Run, timeoutMs = 120_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}; script output:\n${run.out()}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

const launches = (emu: AwsEmulator) => emu.calls.filter((c) => c === "RunInstances").length;

test("the live proof's --dry-run and unconfirmed runs launch nothing", { timeout: 60_000 }, async () => {
  const dir = tempDir("berth-proof-");
  const emu = await new AwsEmulator(dir.path).start();
  try {
    const dry = await proof(["--dry-run", "--price-per-hour", "0.0104"], emu, dir.path).done;
    assert.equal(dry.code, 0, dry.out);
    assert.match(dry.out, /dry run: nothing is launched/);
    assert.match(dry.out, /pool proof: t3\.micro .*from ami-0abc1234 in subnet-0abc/);
    assert.match(dry.out, /cost bound at 0\.0104 USD per instance-hour: 0\.04 USD/);
    const unconfirmed = await proof([], emu, dir.path).done;
    assert.equal(unconfirmed.code, 2, unconfirmed.out);
    assert.match(unconfirmed.out, /needs confirmation: run on a terminal or pass --yes/);
    assert.equal(launches(emu), 0);
  } finally {
    await emu.stop();
    dir.cleanup();
  }
});

test("the live proof's trap leaves zero instances: SIGTERM while launching, and a coordinator killed -9 with two instances ready", { timeout: 240_000 }, async () => {
  const dir = tempDir("berth-proof-");
  const emu = await new AwsEmulator(dir.path).start();
  try {
    // 1. SIGTERM as soon as the first RunInstances is seen (step 1, the coordinator filling the pool).
    const a = proof(["--yes"], emu, dir.path);
    await until("a launch", () => launches(emu) >= 1, a);
    process.kill(a.pid, "SIGTERM");
    const ra = await a.done;
    assert.equal(ra.code, 143, ra.out);
    assert.match(ra.out, /cleanup: draining pool proof through the coordinator/);
    assert.match(ra.out, /cleanup: 0 instances of deployment proof-emu remain/);
    assert.deepEqual(emu.live().map((i) => `${i.id}:${i.state}`), [], ra.out);
    const coordA = Number(readFileSync(join(a.work()!, "coord.pid"), "utf8"));
    assert.equal(alive(coordA), false, "the coordinator is stopped");

    // 2. The coordinator killed -9 once two instances are ready: no drain possible, the script fails on its next call.
    const before = launches(emu);
    const b = proof(["--yes"], emu, dir.path);
    await until("two ready instances", () => /PASS 2 instances provisioned/.test(b.out()), b);
    const coordB = Number(readFileSync(join(b.work()!, "coord.pid"), "utf8"));
    process.kill(coordB, "SIGKILL");
    const rb = await b.done;
    assert.notEqual(rb.code, 0, rb.out);
    const ended = [...rb.out.matchAll(/cleanup: terminated (i-\S+)/g)].map((m) => m[1]);
    assert.equal(ended.length, 2, rb.out);
    assert.ok(launches(emu) - before >= 2);
    assert.match(rb.out, /cleanup: 0 instances of deployment proof-emu remain/);
    assert.deepEqual(emu.live().map((i) => `${i.id}:${i.state}`), [], rb.out);
  } finally {
    await emu.stop();
    dir.cleanup();
  }
});
