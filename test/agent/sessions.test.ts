/**
 * Interactive sessions end to end: a real gateway, real SSH connections, real
 * runtime processes (process runtime always; gvisor where runsc and root are
 * present). Proves the PTY contract (stty size after each resize), the signal
 * mapping, exit status after the last byte, release on disconnect, bounded
 * memory under a 50 MB flood to a slow reader, and hard-loss recovery.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { writeFileSync, createReadStream, existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { createRequire } from "node:module";
import { spawn } from "node:child_process";
import type ssh2 from "ssh2";
import { startGateway } from "../../src/agent/ssh/gateway.js";
import { createRuntime, gvisorAvailability } from "../../src/agent/runtime/index.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { MemoryKeys, connect, run, Term } from "../helpers/ssh-testkit.js";
import { AgentHarness, quietLog as quiet, until, type GatewayRig } from "../helpers/agent.js";
import { hostGroupPresence, readHostProcess } from "../../src/agent/sessions/probe.js";
import type { SessionRecord } from "../../src/agent/sessions/store.js";
import { AgentStore } from "../../src/agent/store/store.js";
import { recoveryDecision } from "../../src/agent/sessions/recovery.js";

// RFC 4254 lists no TSTP, so the ssh2 client refuses to send it; berth's protocol does
// (seed 3.3: Suspend -> SIGTSTP). Teach this process's client the name.
(createRequire(import.meta.url)("ssh2/lib/protocol/constants.js") as { SIGNALS: Record<string, number> }).SIGNALS.TSTP = 1;

const harness = new AgentHarness("berth-sess-");
after(() => harness.close());

const PTY = { rows: 24, cols: 80, term: "xterm", width: 0, height: 0, modes: {} } as const;

/** `stty size` inside the PTY, answered after the last marker. */
async function sttySize(t: Term): Promise<string> {
  const from = t.text.length;
  const tag = Math.random().toString(36).slice(2, 8);
  t.write(`echo "sz-${tag} $(stty size)"\n`);
  return (await t.waitFor(new RegExp(`sz-${tag} (\\d+ \\d+)`), from))[1]!;
}

/** Bytes of `seq 1 n` on a terminal (each line ends "\r\n"). */
function expectedBytes(n: number): number {
  let total = 0;
  for (let i = 1; i <= n; i++) total += String(i).length + 2;
  return total;
}

/** Run a command and read its output slowly (one chunk per timer tick): the agent sees backpressure. */
function slowRun(c: ssh2.Client, command: string, pty: ssh2.PseudoTtyOptions): Promise<{ code: number | null; bytes: number; bytesAtExit: number; sha256: string }> {
  return new Promise((res, rej) => {
    c.exec(command, { pty }, (err, ch) => {
      if (err) return rej(err);
      const h = createHash("sha256");
      let bytes = 0;
      let bytesAtExit = -1;
      let code: number | null = null;
      ch.on("data", (b: Buffer) => {
        h.update(b);
        bytes += b.length;
        ch.pause();
        setTimeout(() => ch.resume(), 1);
      });
      ch.on("exit", (c2: number | null) => {
        // The client reports the status as soon as it arrives; data it has received but not
        // yet handed to us sits in the channel's buffer. Both count as "arrived before".
        bytesAtExit = bytes + ch.readableLength;
        code = c2;
      });
      ch.on("close", () => res({ code, bytes, bytesAtExit, sha256: h.digest("hex") }));
    });
  });
}

for (const kind of ["process", "gvisor"] as const) {
  const skip = kind === "gvisor" && !gvisorAvailability().ok ? (gvisorAvailability() as { why: string }).why : null;
  const name = (s: string) => `${kind}: ${s}`;
  const maybe = (title: string, fn: (r: GatewayRig) => Promise<void>) =>
    test(name(title), async (t) => {
      if (skip) return t.skip(`gvisor runtime unavailable: ${skip}`);
      const r = await harness.gateway(kind, `m_${title.replace(/[^a-z0-9]+/gi, "_").slice(0, 40)}`);
      try {
        await fn(r);
      } finally {
        await r.close();
      }
    });

  maybe("shell with a PTY: stty size shows each resize; an invalid size is refused", async (r) => {
    const c = await r.client();
    const t = await Term.open(c, { ...PTY });
    assert.equal(await sttySize(t), "24 80");
    t.ch.setWindow(40, 100, 0, 0);
    assert.equal(await sttySize(t), "40 100");
    t.ch.setWindow(50, 132, 0, 0);
    assert.equal(await sttySize(t), "50 132");
    t.ch.setWindow(0, 0, 0, 0); // rows/cols must be non-zero: refused, size unchanged
    assert.equal(await sttySize(t), "50 132");
    t.write("exit 3\n");
    await t.closedP();
    assert.deepEqual(t.exit, { code: 3, signal: null });
  });

  /** Wait until the machine runs at least `n` processes (the shell and its foreground job). */
  const running = (r: GatewayRig, n: number) => until(async () => (await r.runtime.inspect(r.machine)).liveProcesses >= n, `${n} processes in the machine`);

  for (const jobControl of [false, true]) {
    maybe(`signal INT stops a foreground sleep and the shell survives (job control ${jobControl ? "on" : "off"})`, async (r) => {
      const c = await r.client();
      const t = await Term.open(c, { ...PTY });
      // Job control on (an interactive bash's default): the foreground job has its own
      // process group, so the signal must go to the terminal's foreground group, not the shell's.
      t.write(`set ${jobControl ? "-m" : "+m"}; echo go; sleep 1000\n`);
      await t.waitFor(/(^|[\r\n])go\r?\n/);
      await running(r, 2);
      t.ch.signal("INT");
      let from = t.text.length;
      t.write("echo rc=$?\n"); // read by the shell only once sleep is gone
      await t.waitFor(/rc=130/, from);
      if (jobControl) {
        // Suspend reaches the foreground job too: the shell reports it stopped and gets its prompt back.
        t.write("sleep 1001\n");
        await running(r, 2);
        t.ch.signal("TSTP");
        await t.waitFor(/Stopped/, from);
        from = t.text.length;
        t.write("echo rc=$?; kill -KILL %1; wait; echo reaped\n");
        await t.waitFor(/rc=148/, from);
        await t.waitFor(/(^|[\r\n])reaped\r?\n/, from);
        // bash may print "reaped" before the killed job is gone; counting it as the next
        // foreground job would send QUIT to the shell (which ignores it).
        await until(async () => (await r.runtime.inspect(r.machine)).liveProcesses <= 1, "only the shell left");
        t.write("sleep 1002\n");
        await running(r, 2);
        t.ch.signal("QUIT");
        from = t.text.length;
        t.write("echo rc=$?\n");
        await t.waitFor(/rc=131/, from);
      }
      t.write("echo alive\n");
      await t.waitFor(/(^|[\r\n])alive\r?\n/);
      t.write("exit\n");
      await t.closedP();
    });
  }

  maybe("SSH signals INT, QUIT, TSTP, TERM, HUP reach the group as SIGINT, SIGQUIT, SIGTSTP, SIGTERM, SIGHUP; other names are refused", async (r) => {
    const c = await r.client();
    const script = [
      "for s in INT QUIT TSTP TERM HUP USR1; do trap \"echo got-$s\" $s; done",
      "echo ready",
      "while :; do sleep 0.05 & wait $!; done",
    ].join("; ");
    const t = await Term.open(c, false, script);
    await t.waitFor(/ready/);
    for (const sig of ["KILL", "USR1", "INT"]) t.ch.signal(sig);
    await t.waitFor(/got-INT/);
    t.ch.signal("QUIT");
    await t.waitFor(/got-QUIT/);
    t.ch.signal("TSTP");
    await t.waitFor(/got-TSTP/);
    t.ch.signal("TERM");
    await t.waitFor(/got-TERM/);
    t.ch.signal("HUP");
    await t.waitFor(/got-HUP/);
    assert.ok(!/got-USR1/.test(t.text), `refused signals must not arrive: ${t.text}`);
    assert.ok(!t.closed, "KILL was refused, the command still runs");
  });

  maybe("env: client-sent BERTH_* variables reach the command; reserved names keep the agent's values", async (r) => {
    const c = await r.client();
    const inc = (await r.runtime.inspect(r.machine)).incarnation;
    const env = { BERTH_JOB: "job-7", BERTH_TRACE_ID: "t 1", LC_TEST: "x", BERTH_MACHINE: "forged", BERTH_INCARNATION: "forged", BERTH_SESSION: "forged" };
    const out = await run(c, 'printf "%s|%s|%s|%s|%s|%s" "$BERTH_JOB" "$BERTH_TRACE_ID" "$LC_TEST" "$BERTH_MACHINE" "$BERTH_INCARNATION" "${BERTH_SESSION-unset}"', { env });
    assert.equal(out.stdout.toString(), `job-7|t 1|x|${r.machine}|${inc}|unset`);
    const tty = await run(c, 'printf "%s" "$BERTH_JOB"', { env, pty: { ...PTY } });
    assert.equal(tty.stdout.toString(), "job-7", "with a PTY too");
  });

  maybe("exit status arrives after the last output byte (pipes and PTY)", async (r) => {
    const c = await r.client();
    const piped = await run(c, "head -c 3000000 /dev/zero | tr '\\0' x; printf END; exit 5");
    assert.equal(piped.code, 5);
    assert.equal(piped.stdout.length, 3_000_003);
    assert.equal(piped.stdoutAtExit, piped.stdout.length, "every byte was received before the exit status");
    // Over a PTY, with a client that reads slowly (so the PTY master is paused by backpressure
    // when the command exits): every byte, in order, then the status. `seq` makes loss or
    // reordering visible; the terminal turns each "\n" into "\r\n".
    const lines = kind === "gvisor" ? 100_000 : 250_000;
    const expected = createHash("sha256");
    for (let i = 1; i <= lines; i++) expected.update(`${i}\r\n`);
    expected.update("END");
    const expectedHash = expected.digest("hex");
    for (let round = 0; round < (kind === "gvisor" ? 2 : 3); round++) {
      const tty = await slowRun(c, `seq 1 ${lines}; printf END; exit 6`, { ...PTY });
      assert.equal(tty.code, 6);
      assert.equal(tty.bytesAtExit, tty.bytes, "every byte was received before the exit status");
      assert.equal(tty.bytes, expectedBytes(lines) + 3, `round ${round}: all ${expectedBytes(lines) + 3} bytes arrived (got ${tty.bytes})`);
      assert.equal(tty.sha256, expectedHash, `round ${round}: sha256 of the PTY output`);
    }
  });

  maybe("a client that stops reading for a while after the command has exited still gets every byte, then the exit status", async (r) => {
    // A little more than the client's SSH window (2 MiB): the command writes it all and exits
    // while the last bytes wait in the agent for this client, which reads nothing for 3 s from its
    // first chunk (longer than the agent's idle wait for a writer that holds the output open) — a
    // slow disk or a busy client.
    const c = await r.client();
    const total = 2 * 1024 * 1024 + 192 * 1024;
    const got = await new Promise<{ code: number | null; bytes: number }>((res, rej) => {
      c.exec(`head -c ${total} /dev/zero; exit 7`, (err, ch) => {
        if (err) return rej(err);
        let bytes = 0;
        let code: number | null = null;
        let stalled = false;
        ch.on("data", (b: Buffer) => {
          bytes += b.length;
          if (!stalled) {
            // The client's process stops reading its connection (as one busy writing to a slow disk does).
            stalled = true;
            const sock = (c as unknown as { _sock: import("node:net").Socket })._sock;
            sock.pause();
            setTimeout(() => sock.resume(), 3_000);
          }
        });
        ch.on("exit", (x: number | null) => (code = x));
        ch.on("close", () => res({ code, bytes }));
      });
    });
    assert.equal(got.bytes, total, "every byte arrived");
    assert.equal(got.code, 7, "and then the exit status");
  });

  maybe("disconnect leaves no process of the session; a setsid child does not block release and the fence removes it", async (r) => {
    const c = await r.client();
    const t = await Term.open(c, { ...PTY });
    t.write("echo leader=$$; sleep 1001 & echo bg=$!; setsid sh -c 'echo escaped=$$; exec sleep 1002' & sleep 1003\n");
    const leader = Number((await t.waitFor(/leader=(\d+)/))[1]);
    await t.waitFor(/escaped=\d+/);
    await until(() => r.gw.sessions.count(r.machine) === 1, "session counted");
    c.end(); // client loss
    await until(() => r.gw.sessions.count(r.machine) === 0, "session released");
    assert.deepEqual(r.store.unfinished().map((x) => x.note), [], "the record is clean (release was not blocked by the setsid child)");
    if (kind === "process") {
      assert.equal(hostGroupPresence(leader), "absent", "the leader's group is gone");
      const bg = Number(t.text.match(/bg=(\d+)/)![1]);
      assert.equal(readHostProcess(bg), null, "the shell's background job is gone");
      const escaped = Number(t.text.match(/escaped=(\d+)/)![1]);
      const still = readHostProcess(escaped);
      assert.ok(still, "the setsid child left the group and survived the session release");
      await r.runtime.fence(r.machine);
      assert.equal(readHostProcess(escaped), null, "the machine's fence removed it");
    } else {
      const seen = await r.runtime.inspect(r.machine);
      assert.ok(seen.exists);
      const proof = await r.runtime.fence(r.machine);
      assert.notEqual(proof.incarnation, seen.incarnation);
    }
  });

  maybe("50 MB to a slowly reading client arrives complete and in order while a second session's resize is answered", async (r) => {
    const ws = (await r.runtime.create(r.machine)).workspace;
    const c = await r.client();
    const made = await run(c, "head -c 52428800 /dev/urandom > flood.bin && echo made");
    assert.equal(made.stdout.toString(), "made\n");
    const expected = await new Promise<string>((res, rej) => {
      const h = createHash("sha256");
      createReadStream(join(ws, "flood.bin")).on("data", (b) => h.update(b)).on("end", () => res(h.digest("hex"))).on("error", rej);
    });
    const second = await Term.open(await r.client(), { ...PTY });
    assert.equal(await sttySize(second), "24 80");

    global.gc?.();
    const base = process.memoryUsage();
    let peakRss = base.rss;
    let peakExternal = base.external + base.arrayBuffers;
    const sampler = setInterval(() => {
      const m = process.memoryUsage();
      peakRss = Math.max(peakRss, m.rss);
      peakExternal = Math.max(peakExternal, m.external + m.arrayBuffers);
    }, 50);

    const flood = await Term.open(c, false, "cat flood.bin");
    const hash = createHash("sha256");
    let received = 0;
    // Drop the Term's text accumulation for this channel: read raw, slowly.
    flood.ch.removeAllListeners("data");
    const done = new Promise<void>((res) => flood.ch.on("close", () => res()));
    flood.ch.on("data", (b: Buffer) => {
      hash.update(b);
      received += b.length;
      flood.ch.pause();
      setTimeout(() => flood.ch.resume(), 1); // a slow reader: one chunk per timer tick
    });
    let resizes = 0;
    let floodStillRunning = 0;
    for (const [rows, cols] of [[30, 90], [31, 91], [32, 92], [33, 93], [34, 94]] as const) {
      await until(() => received > resizes * 4_000_000, "flood progress");
      second.ch.setWindow(rows, cols, 0, 0);
      assert.equal(await sttySize(second), `${rows} ${cols}`);
      resizes++;
      if (received < 52428800) floodStillRunning++;
    }
    await done;
    clearInterval(sampler);
    assert.equal(received, 52428800);
    assert.equal(hash.digest("hex"), expected, "sha256 of what arrived equals the file");
    assert.deepEqual(flood.exit, { code: 0, signal: null });
    const mb = (n: number) => (n / 1048576).toFixed(1);
    console.log(
      `# ${kind} flood: 50 MB delivered; resizes answered during the flood: ${floodStillRunning}/5; ` +
        `agent+client process RSS growth peak ${mb(peakRss - base.rss)} MB, buffer (external+arrayBuffers) growth peak ${mb(peakExternal - base.external - base.arrayBuffers)} MB`,
    );
  });

  // A client whose process stops reading its connection (starved of CPU, or busy writing to a slow
  // disk) holds back what the agent writes past the channel's window. When it reads again, every
  // held-back write must go out, stdout's and stderr's, each byte once, and then the exit status.
  maybe("a client that stops reading: stdout and the stderr line written after it, both held back by the window, arrive whole, then the exit status", async (r) => {
    const ws = (await r.runtime.create(r.machine)).workspace;
    const s = await HeldSession.start(await r.client(), `head -c ${HELD_BACK} /dev/zero; echo done >&2; : > ended`);
    // The command ended while its stdout waits for the window, and its stderr line after it.
    await until(() => existsSync(join(ws, "ended")), "the command's end");
    await new Promise((res) => setTimeout(res, 500)); // the agent takes and forwards the stderr line meanwhile
    s.release();
    await s.ended();
    assert.equal(s.stdout, HELD_BACK, "every stdout byte, once");
    assert.equal(Buffer.concat(s.stderr).toString(), "done\n");
    assert.deepEqual(s.exit, { code: 0, signal: null });
  });

  maybe("a client that stops reading twice: stdout held back, then a stderr flood held back: every byte exactly once, then the exit status", async (r) => {
    const ws = (await r.runtime.create(r.machine)).workspace;
    const s = await HeldSession.start(await r.client(), `head -c ${HELD_BACK} /dev/zero; : > written; while [ ! -e go ]; do sleep 0.05; done; head -c ${HELD_BACK} /dev/zero >&2; : > ended`);
    await until(() => existsSync(join(ws, "written")), "stdout written");
    await new Promise((res) => setTimeout(res, 500)); // the agent's stdout write waits for the window meanwhile
    s.release();
    await until(() => s.stdout === HELD_BACK, "all of stdout");
    s.hold();
    writeFileSync(join(ws, "go"), "");
    await until(() => existsSync(join(ws, "ended")), "the command's end");
    await new Promise((res) => setTimeout(res, 500));
    s.release();
    await s.ended();
    assert.equal(s.stdout, HELD_BACK, "every stdout byte, once");
    assert.equal(Buffer.concat(s.stderr).length, HELD_BACK, "every stderr byte, once");
    assert.deepEqual(s.exit, { code: 0, signal: null });
  });
}

/** More than an SSH window (2 MiB) and less than the agent holds for a channel without pausing the command. */
const HELD_BACK = 3_670_016;

/** One command on a client whose process reads nothing from its connection between hold() and release(). */
class HeldSession {
  stdout = 0;
  readonly stderr: Buffer[] = [];
  exit: { code: number | null; signal: string | null } | null = null;
  private closed = false;
  private readonly sock: import("node:net").Socket;

  private constructor(c: ssh2.Client, ch: ssh2.ClientChannel) {
    this.sock = (c as unknown as { _sock: import("node:net").Socket })._sock;
    ch.on("data", (b: Buffer) => (this.stdout += b.length));
    ch.stderr.on("data", (b: Buffer) => this.stderr.push(b));
    ch.on("exit", (code: number | null, signal?: string) => (this.exit = { code: typeof code === "number" ? code : null, signal: signal ?? null }));
    ch.on("close", () => (this.closed = true));
  }

  /** Runs `command`, holding from the moment its channel is open (before its first byte is read). */
  static start(c: ssh2.Client, command: string): Promise<HeldSession> {
    return new Promise((res, rej) => {
      c.exec(command, (err, ch) => {
        if (err) return rej(err);
        const s = new HeldSession(c, ch);
        s.hold();
        res(s);
      });
    });
  }

  hold(): void {
    this.sock.pause();
  }

  release(): void {
    this.sock.resume();
  }

  /** The channel closed; a session that never ends fails with what had arrived. */
  async ended(): Promise<void> {
    try {
      await until(() => this.closed, "the session's end");
    } catch (e) {
      throw new Error(`${(e as Error).message}: ${this.stdout} stdout and ${Buffer.concat(this.stderr).length} stderr bytes arrived, exit ${JSON.stringify(this.exit)}`);
    }
  }
}

test("recovery decisions: clean only on verified absence; exact leftovers stopped; mismatches retained", () => {
  const rec: SessionRecord = {
    sessionId: "s_1",
    machineId: "m_1",
    grantId: "g_1",
    fingerprint: "SHA256:x",
    pty: true,
    incarnation: "inc-a",
    state: "running",
    client: { pid: 10, startTime: 5, pgid: 10 },
    leader: { pid: 10, startTime: 5, pgid: 10 },
    note: null,
    createdAt: 0,
    updatedAt: 0,
  };
  const m = { exists: true, incarnation: "inc-a", liveProcesses: 3 };
  assert.equal(recoveryDecision(rec, { machine: m, client: "match", leader: "match", group: "present" }).kind, "stop_exact");
  assert.equal(recoveryDecision(rec, { machine: m, client: "absent", leader: "absent", group: "absent" }).kind, "clean");
  assert.equal(recoveryDecision(rec, { machine: m, client: "other", leader: "other", group: "present" }).kind, "retain");
  assert.equal(recoveryDecision(rec, { machine: m, client: "absent", leader: null, group: "unknown" }).kind, "retain");
  assert.equal(recoveryDecision(rec, { machine: { ...m, incarnation: "inc-b" }, client: "absent", leader: null, group: null }).kind, "clean");
  assert.equal(recoveryDecision(rec, { machine: { exists: false, incarnation: null, liveProcesses: 0 }, client: "absent", leader: null, group: null }).kind, "clean");
  const intent = { ...rec, state: "intent" as const, client: null, leader: null };
  assert.equal(recoveryDecision(intent, { machine: m, client: null, leader: null, group: null }).kind, "retain");
  assert.equal(recoveryDecision(intent, { machine: { ...m, liveProcesses: 0 }, client: null, leader: null, group: null }).kind, "clean");
});

test("[I9] hard loss: SIGKILL of the agent mid-session, restart: nothing reattached, records cleaned only after absence, a mismatch retained and never signalled", async () => {
  const dir = harness.dir();
  const pair = generateSshKeyPair();
  const machine = "m_hardloss";
  // A child process plays the agent, so that it can be SIGKILLed.
  const script = join(dir, "agent.mjs");
  const dist = resolve("dist/src/agent");
  const helpers = resolve("dist/test/helpers");
  writeFileSync(
    script,
    `import { startGateway } from "${dist}/ssh/gateway.js";
import { createRuntime } from "${dist}/runtime/index.js";
import { AgentStore } from "${dist}/store/store.js";
import { MemoryKeys } from "${helpers}/ssh-testkit.js";
const runtime = createRuntime("process", ${JSON.stringify(join(dir, "rt"))});
await runtime.create(${JSON.stringify(machine)});
const keys = new MemoryKeys();
keys.install({ machineId: ${JSON.stringify(machine)}, fingerprint: ${JSON.stringify(pair.fingerprint)}, grantId: "g_hl", expiresAt: null });
const store = AgentStore.open(${JSON.stringify(dir)});
const gw = await startGateway({ hostKeyPath: ${JSON.stringify(join(dir, "host_key"))}, listen: { host: "127.0.0.1", port: 0 }, keys, runtime,
  log: { info() {}, warn() {}, error() {} }, sessionStore: store.sessions });
console.log("port=" + gw.port);
`,
  );
  const agent = spawn(process.execPath, [script], { cwd: resolve("."), stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  agent.stdout.on("data", (b: Buffer) => (out += b.toString()));
  await until(() => /port=\d+/.test(out), "child agent listening");
  const port = Number(out.match(/port=(\d+)/)![1]);
  const c = await connect({ port, username: machine, privateKey: pair.privateKey });
  c.on("error", () => {});
  const t = await Term.open(c, false, "echo leader=$$; sleep 1000");
  const leader = Number((await t.waitFor(/leader=(\d+)/))[1]);
  const leaderId = readHostProcess(leader)!;
  assert.ok(leaderId);

  // An unrelated process whose pid we plant in a fake record with a wrong start time: a mismatch.
  const bystander = spawn("sleep", ["1000"], { detached: true, stdio: "ignore" });
  const by = readHostProcess(bystander.pid!)!;
  agent.kill("SIGKILL");
  await new Promise((r) => agent.once("exit", r));
  await until(() => t.closed, "client sees the connection die");

  const agentStore = AgentStore.open(dir);
  const store = agentStore.sessions;
  const running = store.unfinished();
  assert.equal(running.length, 1);
  assert.equal(running[0]!.state, "running");
  assert.deepEqual(running[0]!.leader, leaderId, "exact identities were recorded before events were admitted");
  const fake = { ...running[0]!, sessionId: "s_mismatch", client: { ...by, startTime: by.startTime + 1 }, leader: { ...by, startTime: by.startTime + 1 } };
  store.create({ ...fake, state: "intent", client: null, leader: null });
  store.transition("s_mismatch", ["intent"], { state: "running", client: fake.client, leader: fake.leader });
  assert.ok(readHostProcess(leader), "the session's command outlived the agent (detached pipes)");

  const runtime = createRuntime("process", join(dir, "rt"));
  const keys = new MemoryKeys();
  const gw = await startGateway({ hostKeyPath: join(dir, "host_key"), listen: { host: "127.0.0.1", port: 0 }, keys, runtime, log: quiet, sessionStore: store });
  try {
    assert.deepEqual(gw.recovered.cleaned.map((x) => x.sessionId), [running[0]!.sessionId]);
    assert.deepEqual(gw.recovered.retained.map((x) => x.sessionId), ["s_mismatch"]);
    assert.equal(gw.sessions.count(machine), 0, "nothing was reattached");
    assert.equal(hostGroupPresence(leader), "absent", "the exact leftover was stopped");
    assert.ok(readHostProcess(bystander.pid!), "the mismatched process was never signalled");
    assert.deepEqual(store.unfinished().map((x) => x.sessionId), ["s_mismatch"]);
    assert.match(store.unfinished()[0]!.note ?? "", /retained/);
  } finally {
    bystander.kill("SIGKILL");
    await gw.close();
    await runtime.destroy(machine);
    agentStore.close();
  }
});
