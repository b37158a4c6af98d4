/**
 * scripts/aws-live-proof.sh against the EC2/SSM emulator, as a user runs it
 * (bash, the real `berth` CLI and coordinator, credentials from the
 * environment): `--dry-run` and a run without `--yes` or a terminal launch
 * nothing; runs stopped at a point inside each step in turn (the script's
 * test hook BERTH_PROOF_PAUSE_AT holds it there): SIGTERM at every step,
 * Ctrl-C at two, the coordinator killed -9 at two. Each must end with zero
 * instances, the trap's report printed, the coordinator stopped and no
 * process of the run left: the exit trap drains through the coordinator
 * when it answers, then terminates by launch record and by tag with the
 * coordinator stopped.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
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

function proof(args: string[], emu: AwsEmulator, dir: string, extra: Record<string, string> = {}): Run {
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
    BERTH_PROOF_HEARTBEAT: "6",
    BERTH_PROOF_SESSION_SETTLE: "1",
    TMPDIR: dir,
    ...extra,
  };
  // Its own process group, as a script run from a terminal is: Ctrl-C is SIGINT to that group.
  const child = spawn("bash", [SCRIPT, ...args, config], { env, stdio: ["ignore", "pipe", "pipe"], detached: true });
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

/**
 * One run stopped at a point of a step (BERTH_PROOF_PAUSE_AT) and ended
 * there: SIGTERM to the script; Ctrl-C (SIGINT to its process group, as a
 * terminal sends it, the coordinator included); or the coordinator killed
 * -9 and the script let go on (it fails on its next wait).
 */
type How = "TERM" | "INT" | "coordinator-KILL";

async function stopAt(point: string, how: How): Promise<string> {
  const started = Date.now();
  const dir = tempDir("berth-proof-");
  const emu = await new AwsEmulator(dir.path).start();
  const what = `${how} at ${point}`;
  try {
    const run = proof(["--yes"], emu, dir.path, { BERTH_PROOF_PAUSE_AT: point });
    // Step 5 proves an install that outlasts one call of the coordinator's short budget: the emulator's guest is made slow for it.
    await until(`${what}: paused`, () => {
      if (/^== 5\./m.test(run.out())) emu.faults.ssmSlowSteps.install_key = 3_000;
      return new RegExp(`^paused at ${point}$`, "m").test(run.out());
    }, run);
    const work = run.work()!;
    const coord = Number(readFileSync(join(work, "coord.pid"), "utf8"));
    const launched = launches(emu);
    if (how === "TERM") process.kill(run.pid, "SIGTERM");
    else if (how === "INT") process.kill(-run.pid, "SIGINT");
    else {
      process.kill(coord, "SIGKILL");
      writeFileSync(join(work, "continue"), "");
    }
    const r = await run.done;
    // Every check before the stop passed (at 6: each of steps 1–5, the whole proof but its final count).
    const before = r.out.slice(0, r.out.indexOf(`paused at ${point}`));
    assert.doesNotMatch(before, /^FAIL/m, what);
    const passes = { preflight: 1, "1": 1, "2": 2, "3": 3, "4": 5, "5": 6, "6": 7 }[point];
    assert.equal(before.match(/^PASS /gm)?.length, passes, `${what}: the checks before it\n${before}`);
    assert.equal(r.code, how === "TERM" ? 143 : how === "INT" ? 130 : 1, `${what}: exit status\n${r.out}`);
    // With the coordinator up and the pool made, the trap drains through it first.
    if (how === "TERM" && point !== "preflight") assert.match(r.out, /cleanup: draining pool proof through the coordinator/, what);
    if (how === "coordinator-KILL") assert.match(r.out, /FAIL the coordinator \(pid \d+\) is gone while waiting for/, what);
    assert.match(r.out, /cleanup: 0 instances of deployment proof-emu remain/, `${what}\n${r.out}`);
    assert.deepEqual(emu.live().map((i) => `${i.id}:${i.state}`), [], `${what}: instances left\n${r.out}`);
    // Stopped before the confirmation, nothing was launched; from step 1 on, instances were, and none is left.
    if (point === "preflight") assert.equal(launches(emu), 0, what);
    else assert.ok(launched >= 1, `${what}: launched before the stop`);
    assert.equal(alive(coord), false, `${what}: the coordinator is stopped`);
    // Nothing the script started lives on: no process names its directory (coordinator, heartbeat loops, the open session of step 3).
    const left = await settle(() => processesUnder(dir.path));
    assert.deepEqual(left, [], `${what}: processes left`);
    return `${what}: ${((Date.now() - started) / 1000).toFixed(1)} s`;
  } finally {
    await emu.stop();
    dir.cleanup();
  }
}

/** Command lines of the processes (other than this one) that mention `path`. */
function processesUnder(path: string): string[] {
  const out: string[] = [];
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    if (Number(pid) === process.pid) continue;
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0/g, " ");
      if (cmd.includes(path)) out.push(`${pid}: ${cmd}`);
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

async function settle(probe: () => string[], ms = 10_000): Promise<string[]> {
  const end = Date.now() + ms;
  for (;;) {
    const v = probe();
    if (v.length === 0 || Date.now() > end) return v;
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * Every step with SIGTERM; Ctrl-C at steps 1 (instances launching: the
 * likeliest moment to cancel) and 3 (a session open); the
 * coordinator killed -9 at steps 4 (a machine being destroyed) and 6
 * (draining). The runs go four at a time, each with its own emulator.
 */
const STOPS: Array<[string, How]> = [
  ["6", "TERM"],
  ["6", "coordinator-KILL"],
  ["5", "TERM"],
  ["4", "TERM"],
  ["4", "coordinator-KILL"],
  ["3", "TERM"],
  ["3", "INT"],
  ["2", "TERM"],
  ["1", "TERM"],
  ["1", "INT"],
  ["preflight", "TERM"],
];

test("the live proof's trap leaves zero instances and nothing running, stopped at every step", { timeout: 600_000 }, async (t) => {
  const queue = [...STOPS];
  const failures: unknown[] = [];
  await Promise.all(
    Array.from({ length: 4 }, async () => {
      for (let next = queue.shift(); next; next = queue.shift()) await stopAt(...next).then((took) => t.diagnostic(took), (e: unknown) => failures.push(e));
    }),
  );
  assert.deepEqual(failures.map((e) => (e instanceof Error ? e.message : String(e))), []);
});
