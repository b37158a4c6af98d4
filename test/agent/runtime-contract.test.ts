/**
 * One contract suite, run against both runtimes with real processes and a real
 * runsc sandbox. The gvisor half is skipped — with the reason printed — where
 * runsc is missing or the tests do not run as root.
 */
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Readable } from "node:stream";
import { GvisorRuntime, findRunsc } from "../../src/agent/runtime/gvisor.js";
import { ProcessRuntime } from "../../src/agent/runtime/process.js";
import { createRuntime, gvisorAvailability, resolveRuntimeKind } from "../../src/agent/runtime/index.js";
import { readStat, signalExact } from "../../src/agent/runtime/procfs.js";
import type { ExecHandle, Runtime } from "../../src/agent/runtime/types.js";

const ALLOWED_ENV = new Set(["PATH", "HOME", "USER", "LANG", "TERM", "SHELL", "BERTH_MACHINE", "BERTH_INCARNATION", "PWD", "SHLVL", "_"]);

function collect(s: Readable): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = "";
    s.on("data", (d: Buffer) => (out += d.toString("utf8")));
    s.on("end", () => resolve(out));
    s.on("error", reject);
  });
}

async function run(rt: Runtime, id: string, argv: string[], stdin = "", env: Record<string, string> = {}) {
  const h = await rt.exec(id, { argv, env });
  h.stdin.end(stdin);
  const [stdout, stderr, status] = await Promise.all([collect(h.stdout), collect(h.stderr), h.exited]);
  return { stdout, stderr, status, handle: h };
}

/** Keeps every byte of a handle's output in `buf.text` (one listener for the handle's whole life, so nothing is dropped). */
function capture(h: ExecHandle): { text: string } {
  const buf = { text: "" };
  h.stdout.on("data", (d: Buffer) => (buf.text += d.toString("utf8")));
  return buf;
}

/** Resolves once `re` matches the captured output; rejects after a generous bound (a hang, not a timing check). */
async function readUntil(buf: { text: string }, re: RegExp, boundMs = 20_000): Promise<string> {
  const end = Date.now() + boundMs;
  while (!re.test(buf.text)) {
    if (Date.now() > end) throw new Error(`did not see ${re} in output: ${JSON.stringify(buf.text.slice(-500))}`);
    await new Promise((r) => setTimeout(r, 10));
  }
  return buf.text;
}

/** Host processes whose environment carries BERTH_MACHINE=<id> with this incarnation (independent of the runtime's own scan). */
function hostProcessesWithMarker(machineId: string, incarnation?: string): number[] {
  const out: number[] = [];
  for (const name of readdirSync("/proc")) {
    const pid = Number(name);
    if (!Number.isInteger(pid)) continue;
    let env: string[];
    try {
      env = readFileSync(`/proc/${pid}/environ`, "latin1").split("\0");
    } catch {
      continue;
    }
    const st = readStat(pid);
    if (!st || st.state === "Z") continue;
    if (!env.includes(`BERTH_MACHINE=${machineId}`)) continue;
    if (incarnation && !env.includes(`BERTH_INCARNATION=${incarnation}`)) continue;
    out.push(pid);
  }
  return out;
}

function hostProcessesMentioning(text: string): number[] {
  const out: number[] = [];
  for (const name of readdirSync("/proc")) {
    const pid = Number(name);
    if (!Number.isInteger(pid) || pid === process.pid) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(text)) {
        const st = readStat(pid);
        if (st && st.state !== "Z") out.push(pid);
      }
    } catch {
      /* gone */
    }
  }
  return out;
}

interface Target {
  name: "process" | "gvisor";
  skip: string | null;
  make(stateDir: string): Runtime;
}

const gv = gvisorAvailability();
const targets: Target[] = [
  { name: "process", skip: null, make: (d) => new ProcessRuntime({ stateDir: d }) },
  { name: "gvisor", skip: gv.ok ? null : gv.why, make: (d) => new GvisorRuntime({ stateDir: d }) },
];

let seq = 0;
const newMachineId = (): string => `rt-${process.pid}-${Date.now().toString(36)}-${seq++}`;

for (const target of targets) {
  describe(`runtime contract: ${target.name}`, () => {
    let stateDir = "";
    let rt: Runtime;
    const created: string[] = [];
    const skip = target.skip;
    if (skip) console.log(`# skipping runtime contract for ${target.name}: ${skip}`);

    const machine = async (): Promise<{ id: string; incarnation: string; workspace: string }> => {
      const id = newMachineId();
      created.push(id);
      const m = await rt.create(id);
      return { id, incarnation: m.incarnation, workspace: m.workspace };
    };

    before(() => {
      if (skip) return;
      stateDir = mkdtempSync(join(tmpdir(), `berth-rt-${target.name}-`));
      rt = target.make(stateDir);
    });

    after(async () => {
      if (skip) return;
      for (const id of created) await rt.destroy(id);
      if (target.name === "gvisor") {
        const left = execFileSync(findRunsc() as string, ["--root", join(stateDir, "runsc"), "list", "--format", "json"]).toString().trim();
        assert.deepEqual(JSON.parse(left || "[]") ?? [], [], "runsc list must be empty after the suite");
      }
      rmSync(stateDir, { recursive: true, force: true });
    });

    it("create is idempotent on the machine id", async (t) => {
      if (skip) return t.skip(skip);
      const m = await machine();
      const again = await rt.create(m.id);
      assert.equal(again.incarnation, m.incarnation);
      assert.equal(again.workspace, m.workspace);
      assert.ok(existsSync(m.workspace));
      assert.ok((await rt.list()).includes(m.id));
      const seen = await rt.inspect(m.id);
      assert.equal(seen.exists, true);
      assert.equal(seen.incarnation, m.incarnation);
      assert.equal(await rt.incarnation(m.id), m.incarnation, "incarnation() agrees with inspect()");
    });

    it("exec: output, exit codes and stdin", async (t) => {
      if (skip) return t.skip(skip);
      const m = await machine();
      const a = await run(rt, m.id, ["echo", "hello"]);
      assert.equal(a.stdout, "hello\n");
      assert.equal(a.stderr, "");
      assert.deepEqual(a.status, { code: 0, signal: null });
      const b = await run(rt, m.id, ["sh", "-c", "echo oops >&2; exit 7"]);
      assert.equal(b.stderr, "oops\n");
      assert.equal(b.status.code, 7);
      const c = await run(rt, m.id, ["sh", "-c", "tr a-z A-Z; exit 3"], "some input\nmore\n");
      assert.equal(c.stdout, "SOME INPUT\nMORE\n");
      assert.equal(c.status.code, 3);
      const d = await run(rt, m.id, ["no-such-command-berth"]);
      assert.equal(d.status.code, 127);
      const e = await run(rt, m.id, ["sh", "-c", 'pwd; echo "$HOME"']);
      const [pwd, home] = e.stdout.trim().split("\n");
      assert.equal(pwd, home, "cwd is HOME");
      assert.equal(home, target.name === "gvisor" ? "/workspace" : m.workspace);
    });

    it("exec: environment is cleaned and carries the machine marker", async (t) => {
      if (skip) return t.skip(skip);
      const m = await machine();
      process.env.BERTH_TEST_LEAK = "must-not-leak";
      try {
        const r = await run(rt, m.id, ["env"], "", { FOO: "bar", BERTH_MACHINE: "forged", BERTH_INCARNATION: "forged", PATH: "/evil" });
        const vars = new Map(
          r.stdout
            .trim()
            .split("\n")
            .map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)] as [string, string]),
        );
        assert.equal(vars.get("FOO"), "bar");
        assert.equal(vars.get("BERTH_MACHINE"), m.id);
        assert.equal(vars.get("BERTH_INCARNATION"), m.incarnation);
        assert.notEqual(vars.get("PATH"), "/evil");
        assert.equal(vars.has("BERTH_TEST_LEAK"), false);
        for (const k of vars.keys()) assert.ok(ALLOWED_ENV.has(k) || k === "FOO", `unexpected variable ${k}`);
      } finally {
        delete process.env.BERTH_TEST_LEAK;
      }
    });

    it("PTY exec: resize reaches the terminal, SIGINT to the group stops a sleep, the shell survives", async (t) => {
      if (skip) return t.skip(skip);
      const m = await machine();
      const h = await rt.exec(m.id, {
        argv: ["sh", "-c", 'stty size; read x; stty size; trap "echo interrupted" INT; echo armed; sleep 1000; echo after-sleep; read y; exit 5'],
        env: {},
        pty: { cols: 80, rows: 24, term: "xterm" },
      });
      assert.equal(h.leader.pid, h.leader.pgid, "the command leads its own process group");
      const buf = capture(h);
      await readUntil(buf, /24 80/);
      h.resize(100, 40);
      h.stdin.write("\n");
      await readUntil(buf, /40 100/);
      assert.throws(() => h.resize(0, 10), /invalid_request/);
      await readUntil(buf, /armed/);
      // Wait until the sleep is running (shell + sleep) before interrupting.
      for (let i = 0; i < 200 && (await rt.inspect(m.id)).liveProcesses < 2; i++) await new Promise((r) => setTimeout(r, 25));
      assert.equal(await h.signalGroup("SIGINT"), true);
      await readUntil(buf, /after-sleep/);
      assert.match(buf.text, /interrupted/);
      h.stdin.write("bye\n");
      const status = await h.exited;
      assert.equal(status.code, 5);
      assert.ok(!buf.text.includes("berth-leader"), "no identity line leaks into the output");
      // After the leader is gone, its group is never signalled again.
      assert.equal(await h.signalGroup("SIGINT"), false);
    });

    it("a mismatched leader identity is never signalled", async (t) => {
      if (skip) return t.skip(skip);
      const m = await machine();
      const h = await rt.exec(m.id, { argv: ["sleep", "1000"], env: {} });
      h.stdin.end();
      const real = h.leader.startTime;
      h.leader.startTime = real + 1; // what a recycled pid would look like
      assert.equal(await h.signalGroup("SIGKILL"), false);
      assert.ok((await rt.inspect(m.id)).liveProcesses >= 1, "the process was not signalled");
      h.leader.startTime = real;
      assert.equal(await h.signalGroup("SIGKILL"), true);
      const st = await h.exited;
      assert.ok(st.signal === "SIGKILL" || st.code === 137 || st.code === 128 + 9, `killed: ${JSON.stringify(st)}`);
      // And at the host level: a pid with the wrong start time is refused.
      const child = spawn("sleep", ["1000"], { stdio: "ignore" });
      const cs = readStat(child.pid as number);
      assert.ok(cs);
      assert.equal(signalExact({ pid: cs.pid, startTime: cs.startTime + 1 }, "SIGKILL"), false);
      assert.equal(readStat(cs.pid)?.state !== "Z", true, "still alive");
      assert.equal(signalExact({ pid: cs.pid, startTime: cs.startTime }, "SIGKILL"), true);
      await new Promise((r) => child.on("exit", r));
    });

    it("scrub removes everything the borrower wrote", async (t) => {
      if (skip) return t.skip(skip);
      const m = await machine();
      // find, not ls: runsc 20221219 rejects the statx flags of newer coreutils' ls (docs/runtimes.md).
      const w = await run(rt, m.id, ["sh", "-c", 'mkdir -p "$HOME/d/e" && echo secret > "$HOME/d/e/f" && echo x > "$HOME/.hidden" && cd "$HOME" && find . -mindepth 1 | sort']);
      assert.equal(w.stdout, "./.hidden\n./d\n./d/e\n./d/e/f\n");
      if (target.name === "gvisor") {
        const r = await run(rt, m.id, ["sh", "-c", "echo layer > /usr/local/berth-scrub-test && echo tmp > /tmp/berth-scrub-test && cat /usr/local/berth-scrub-test"]);
        assert.equal(r.stdout, "layer\n", "the root filesystem has a writable layer");
      }
      await rt.scrub(m.id);
      const after = await run(rt, m.id, ["sh", "-c", 'find "$HOME" -mindepth 1; cat /usr/local/berth-scrub-test /tmp/berth-scrub-test 2>/dev/null; true']);
      assert.equal(after.stdout, "");
      assert.deepEqual(readdirSync(m.workspace), []);
      if (target.name === "gvisor") assert.ok(!existsSync("/usr/local/berth-scrub-test"), "the sandbox never wrote to the host root");
      // fenceAndScrub does both in one step.
      await run(rt, m.id, ["sh", "-c", 'echo again > "$HOME/g"; sleep 1000 >/dev/null 2>&1 &']);
      const proof = await rt.fenceAndScrub(m.id);
      assert.deepEqual(readdirSync(m.workspace), []);
      assert.equal((await rt.inspect(m.id)).liveProcesses, 0);
      assert.ok(proof.evidence.length > 0);
    });

    it("a quick command's output and status always arrive, even when its client exits before its identity line is read", async (t) => {
      if (skip) return t.skip(skip);
      const m = await machine();
      const results = await Promise.all(Array.from({ length: 12 }, (_, i) => run(rt, m.id, ["sh", "-c", `echo out-${i}; echo err-${i} >&2; exit ${i % 4}`])));
      results.forEach((r, i) => {
        assert.equal(r.stdout, `out-${i}\n`);
        assert.equal(r.stderr, `err-${i}\n`);
        assert.equal(r.status.code, i % 4);
      });
    });

    it("a command with no output that exited before its streams were read still ends them (a late reader sees the end)", async (t) => {
      if (skip) return t.skip(skip);
      const m = await machine();
      const h = await rt.exec(m.id, { argv: ["true"], env: {} });
      h.stdin.end();
      assert.deepEqual(await h.exited, { code: 0, signal: null });
      // The pipes reached EOF while nobody read them; a reader now must still see the end.
      await new Promise((r) => setTimeout(r, 300));
      const hang = new Promise<string>((r) => setTimeout(() => r("no end"), 10_000));
      assert.equal(await Promise.race([collect(h.stdout), hang]), "");
      assert.equal(await Promise.race([collect(h.stderr), hang]), "");
    });

    it("[I5] the return path, fence then scrub, leaves nothing the borrower wrote; a command between them forces a full scrub", async (t) => {
      if (skip) return t.skip(skip);
      const m = await machine();
      const layer = target.name === "gvisor" ? " && echo layer > /usr/local/berth-return-test" : "";
      await run(rt, m.id, ["sh", "-c", `echo secret > "$HOME/borrowed.txt"${layer}`]);
      const fenced = await rt.fence(m.id);
      await rt.scrub(m.id);
      const after = await run(rt, m.id, ["sh", "-c", 'find "$HOME" -mindepth 1; cat /usr/local/berth-return-test 2>/dev/null; echo "$BERTH_INCARNATION"']);
      assert.equal(after.stdout, `${fenced.incarnation}\n`, "workspace and writable layer are empty, in the fenced incarnation");
      // Something ran after the fence (the command above): this scrub must throw the writable layer away again.
      if (target.name === "gvisor") await run(rt, m.id, ["sh", "-c", "echo again > /usr/local/berth-return-test"]);
      await rt.scrub(m.id);
      const again = await run(rt, m.id, ["sh", "-c", 'find "$HOME" -mindepth 1; cat /usr/local/berth-return-test 2>/dev/null; true']);
      assert.equal(again.stdout, "");
    });

    it("[I5] fence kills background, setsid and nohup processes and starts a new incarnation", async (t) => {
      if (skip) return t.skip(skip);
      const m = await machine();
      const r = await run(rt, m.id, [
        "sh",
        "-c",
        "sleep 1000 >/dev/null 2>&1 & setsid sleep 1000 >/dev/null 2>&1 & nohup sleep 1000 >/dev/null 2>&1 & (setsid sh -c 'sleep 1000' >/dev/null 2>&1 &); echo started",
      ]);
      assert.equal(r.stdout, "started\n");
      const before = await rt.inspect(m.id);
      assert.ok(before.liveProcesses >= 4, `expected at least 4 live processes, saw ${before.liveProcesses}`);
      if (target.name === "process") assert.ok(hostProcessesWithMarker(m.id, m.incarnation).length >= 4);
      const proof = await rt.fence(m.id);
      assert.notEqual(proof.incarnation, m.incarnation);
      assert.ok(proof.evidence.length > 0);
      const seen = await rt.inspect(m.id);
      assert.equal(seen.liveProcesses, 0);
      assert.equal(seen.incarnation, proof.incarnation);
      assert.equal(await rt.incarnation(m.id), proof.incarnation, "incarnation() follows the fence");
      if (target.name === "process") assert.deepEqual(hostProcessesWithMarker(m.id), []);
      else assert.deepEqual(hostProcessesMentioning(`bundle-${m.incarnation.slice(0, 12)}`), [], "no sandbox or gofer of the old incarnation");
      // The machine works after the fence, in the new incarnation.
      const e = await run(rt, m.id, ["sh", "-c", "echo $BERTH_INCARNATION"]);
      assert.equal(e.stdout.trim(), proof.incarnation);
    });

    it("destroy leaves nothing behind and is idempotent", async (t) => {
      if (skip) return t.skip(skip);
      const m = await machine();
      await run(rt, m.id, ["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & nohup sleep 1000 >/dev/null 2>&1 & echo x > $HOME/f"]);
      await rt.destroy(m.id);
      await rt.destroy(m.id);
      assert.deepEqual(await rt.inspect(m.id), { exists: false, incarnation: null, liveProcesses: 0 });
      assert.equal(await rt.incarnation(m.id), null);
      assert.ok(!(await rt.list()).includes(m.id));
      assert.ok(!existsSync(m.workspace));
      assert.deepEqual(hostProcessesWithMarker(m.id), []);
      if (target.name === "gvisor") {
        const ids = await (rt as GvisorRuntime).containers();
        assert.deepEqual(ids.filter((c) => c.startsWith(m.id + ".")), []);
        assert.deepEqual(hostProcessesMentioning(join(stateDir, "machines", m.id)), []);
      }
      await assert.rejects(rt.exec(m.id, { argv: ["true"], env: {} }), /not_found/);
    });
  });
}

describe("createRuntime", () => {
  it("auto picks gvisor exactly when runsc is installed and we are root", (t) => {
    const expected = gvisorAvailability().ok ? "gvisor" : "process";
    assert.equal(resolveRuntimeKind("auto"), expected);
    const dir = mkdtempSync(join(tmpdir(), "berth-rt-auto-"));
    try {
      assert.equal(createRuntime("auto", dir).kind, expected);
      assert.equal(createRuntime("process", dir).kind, "process");
      if (!gvisorAvailability().ok) t.diagnostic("gvisor unavailable here; createRuntime('gvisor') must refuse");
      else assert.equal(createRuntime("gvisor", dir).kind, "gvisor");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
