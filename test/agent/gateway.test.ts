/**
 * The SSH gateway over real SSH connections (ssh2 client and /usr/bin/ssh)
 * into machines of the real process runtime: host key persistence, who gets
 * in (unknown key, old generation, expiry at equality, bad username), exec
 * with exit codes, stderr and signals, env allowlist, revocation and expiry
 * cutting open sessions.
 */
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { statSync, writeFileSync, existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { spawn } from "node:child_process";
import { startGateway, type Gateway } from "../../src/agent/ssh/gateway.js";
import type { Runtime } from "../../src/agent/runtime/types.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { MemoryKeys, connect, run, Term } from "../helpers/ssh-testkit.js";
import { AgentHarness, quietLog as quiet, until } from "../helpers/agent.js";
import { hostGroupPresence } from "../../src/agent/sessions/probe.js";

const harness = new AgentHarness("berth-gw-");
const M = "m_gateway";
let dir: string;
let runtime: Runtime;
let keys: MemoryKeys;
let gw: Gateway;
let clock = Date.now();
let useClock = false;
const now = () => (useClock ? clock : Date.now());

before(async () => {
  const rig = await harness.gateway("process", M, { now, borrowKey: false });
  ({ dir, runtime, keys, gw } = rig);
});

after(() => harness.close());

function borrowKey(expiresAt: number | null = null, machineId = M) {
  const pair = generateSshKeyPair("borrower");
  keys.install({ machineId, fingerprint: pair.fingerprint, grantId: `g_${Math.random().toString(36).slice(2, 10)}`, expiresAt });
  return pair;
}

async function refused(p: Promise<unknown>): Promise<void> {
  await assert.rejects(p, /authentication methods failed/);
}

test("host key: persisted 0600, reused on restart, and the advertised line is what clients see", async () => {
  const path = join(dir, "host_key");
  assert.equal(statSync(path).mode & 0o777, 0o600);
  const again = await startGateway({ hostKeyPath: path, listen: { host: "127.0.0.1", port: 0 }, keys, runtime, log: quiet });
  try {
    assert.equal(again.fingerprint, gw.fingerprint);
    assert.equal(again.hostKey, gw.hostKey);
  } finally {
    await again.close();
  }
  const k = borrowKey();
  const c = await connect({ port: gw.port, username: M, privateKey: k.privateKey, hostKey: gw.hostKey });
  c.end();
  // A different pinned key is refused by the client.
  const other = generateSshKeyPair("other").publicKey;
  await assert.rejects(connect({ port: gw.port, username: M, privateKey: k.privateKey, hostKey: other }));
  // An unreadable host key file is an error, never silently replaced.
  const bad = join(dir, "bad_host_key");
  writeFileSync(bad, "garbage", { mode: 0o600 });
  await assert.rejects(startGateway({ hostKeyPath: bad, listen: { host: "127.0.0.1", port: 0 }, keys, runtime, log: quiet }), /host key/);
  assert.equal(readFileSync(bad, "utf8"), "garbage");
});

test("auth: unknown key, key of another machine, invalid username and an old generation's key are refused", async () => {
  const unknown = generateSshKeyPair("nobody");
  await refused(connect({ port: gw.port, username: M, privateKey: unknown.privateKey }));

  const forOther = borrowKey(null, "m_other");
  await refused(connect({ port: gw.port, username: M, privateKey: forOther.privateKey }));
  await refused(connect({ port: gw.port, username: "../etc", privateKey: forOther.privateKey }));

  const m2 = "m_generation";
  await runtime.create(m2);
  try {
    const old = borrowKey(null, m2);
    const c = await connect({ port: gw.port, username: m2, privateKey: old.privateKey });
    c.end();
    keys.advance(m2); // the machine moved on; the key is still "installed" but for generation g
    await refused(connect({ port: gw.port, username: m2, privateKey: old.privateKey }));
  } finally {
    await runtime.destroy(m2);
  }
});

test("[I3] auth: a key is refused at now == expiresAt and accepted one millisecond before", async () => {
  useClock = true;
  try {
    clock = 1_900_000_000_000;
    const k = borrowKey(clock + 1000);
    clock += 999;
    const c = await connect({ port: gw.port, username: M, privateKey: k.privateKey });
    c.end();
    clock += 1; // now == expiresAt
    await refused(connect({ port: gw.port, username: M, privateKey: k.privateKey }));
  } finally {
    useClock = false;
  }
});

test("exec: stdout, stderr, exit codes and exit signals", async () => {
  const k = borrowKey();
  const c = await connect({ port: gw.port, username: M, privateKey: k.privateKey });
  try {
    const r = await run(c, "echo out; echo err >&2; exit 7");
    assert.equal(r.stdout.toString(), "out\n");
    assert.equal(r.stderr.toString(), "err\n");
    assert.equal(r.code, 7);
    const ok = await run(c, "pwd; test \"$HOME\" = \"$(pwd)\" && echo home-is-workspace");
    assert.equal(ok.code, 0);
    assert.match(ok.stdout.toString(), /home-is-workspace/);
    const killed = await run(c, "kill -TERM $$");
    assert.equal(killed.code, null);
    assert.equal(killed.signal, "SIGTERM"); // the ssh2 client prefixes the RFC 4254 name "TERM"
    const stdin = await run(c, "tr a-z A-Z", { stdin: "hello\n" });
    assert.equal(stdin.stdout.toString(), "HELLO\n");
    assert.equal(stdin.code, 0);
  } finally {
    c.end();
  }
});

test("env: only LANG, LC_*, TERM, TZ and BERTH_* pass the allowlist", async () => {
  const k = borrowKey();
  const c = await connect({ port: gw.port, username: M, privateKey: k.privateKey });
  try {
    const r = await run(c, 'echo "tz=$TZ lc=$LC_TEST evil=$EVIL ld=$LD_PRELOAD"', {
      env: { TZ: "UTC", LC_TEST: "x", EVIL: "1", LD_PRELOAD: "/tmp/x.so" },
    });
    assert.equal(r.stdout.toString(), "tz=UTC lc=x evil= ld=\n");
  } finally {
    c.end();
  }
});

test("[I1] revocation cuts an open session at once and releases its processes", async () => {
  const k = borrowKey();
  const c = await connect({ port: gw.port, username: M, privateKey: k.privateKey });
  let connClosed = false;
  c.on("close", () => (connClosed = true));
  const t = await Term.open(c, false, "echo leader=$$; sleep 1000; echo never");
  const leader = Number((await t.waitFor(/leader=(\d+)/))[1]);
  assert.equal(gw.sessions.count(M), 1);
  keys.remove(M, k.fingerprint);
  await t.closedP();
  await until(() => connClosed, "connection closed");
  await until(() => gw.sessions.count(M) === 0, "session released");
  assert.equal(hostGroupPresence(leader), "absent", "the session's process group is gone");
  assert.ok(!t.text.includes("never"));
  await refused(connect({ port: gw.port, username: M, privateKey: k.privateKey }));
});

test("[I3][I6] a session is cut when its key expires, by the gateway's own timer (the authority never notifies)", async () => {
  const k = borrowKey(Date.now() + 1500);
  const c = await connect({ port: gw.port, username: M, privateKey: k.privateKey });
  c.on("error", () => {});
  const t = await Term.open(c, { rows: 24, cols: 80, term: "xterm" } as never, "echo leader=$$; sleep 1000");
  const leader = Number((await t.waitFor(/leader=(\d+)/))[1]);
  await t.closedP();
  await until(() => gw.sessions.count(M) === 0, "session released");
  assert.equal(hostGroupPresence(leader), "absent");
});

test("closeMachine cuts every session of the machine and counts them", async () => {
  const k = borrowKey();
  const c = await connect({ port: gw.port, username: M, privateKey: k.privateKey });
  c.on("error", () => {});
  const a = await Term.open(c, false, "echo a=$$; sleep 1000");
  const b = await Term.open(c, false, "echo b=$$; sleep 1000");
  const pa = Number((await a.waitFor(/a=(\d+)/))[1]);
  const pb = Number((await b.waitFor(/b=(\d+)/))[1]);
  assert.equal(gw.sessions.count(M), 2);
  assert.equal(await gw.sessions.closeMachine(M, "fence"), 2);
  assert.equal(gw.sessions.count(M), 0);
  assert.equal(hostGroupPresence(pa), "absent");
  assert.equal(hostGroupPresence(pb), "absent");
});

test("the system ssh client works with a pinned host key line", async (t) => {
  if (!existsSync("/usr/bin/ssh")) return t.skip("/usr/bin/ssh is not installed");
  const k = borrowKey();
  const keyFile = join(dir, "id_borrow");
  writeFileSync(keyFile, k.privateKey, { mode: 0o600 });
  const kh = join(dir, "known_hosts");
  writeFileSync(kh, `[127.0.0.1]:${gw.port} ${gw.hostKey}\n`);
  // Asynchronous on purpose: the gateway runs in this process, so a blocking spawnSync would deadlock it.
  const ssh = (khFile: string, ...cmd: string[]) =>
    new Promise<{ stdout: string; stderr: string; status: number | null }>((resolve) => {
      const p = spawn(
        "/usr/bin/ssh",
        ["-i", keyFile, "-p", String(gw.port), "-o", `UserKnownHostsFile=${khFile}`, "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-F", "/dev/null", `${M}@127.0.0.1`, ...cmd],
        { stdio: ["ignore", "pipe", "pipe"] },
      );
      let stdout = "";
      let stderr = "";
      p.stdout.on("data", (b: Buffer) => (stdout += b.toString()));
      p.stderr.on("data", (b: Buffer) => (stderr += b.toString()));
      p.on("close", (status) => resolve({ stdout, stderr, status }));
    });
  const hi = await ssh(kh, "echo", "hi");
  assert.equal(hi.stdout, "hi\n", hi.stderr);
  assert.equal(hi.status, 0);
  const seven = await ssh(kh, "exit 7");
  assert.equal(seven.status, 7);
  // A host key that does not match the pinned line: the client refuses to talk.
  const wrong = join(dir, "known_hosts_wrong");
  writeFileSync(wrong, `[127.0.0.1]:${gw.port} ${generateSshKeyPair("x").publicKey}\n`);
  const refusedRun = await ssh(wrong, "echo", "hi");
  assert.equal(refusedRun.status, 255);
  assert.equal(refusedRun.stdout, "");
});
