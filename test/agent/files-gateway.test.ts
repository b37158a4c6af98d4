/**
 * Files and forwards through the gateway with the real OpenSSH clients
 * (`sftp`, `scp` over SFTP and with `-O`, `rsync -e ssh`, `ssh -W`, `ssh -L`)
 * into machines of both runtimes (gvisor where runsc and root are present):
 * 100 MB each way byte-exact (sha256), directory trees with their modes; a
 * revoked key (what a return does) cuts an open transfer and an open forward,
 * the machine's fence proves the SFTP server gone; forwards reach a server
 * started inside the machine and nothing else; -R and -D are refused.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, mkdirSync, readFileSync, statSync, writeFileSync, existsSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { join } from "node:path";
import { AgentHarness, until, type GatewayRig } from "../helpers/agent.js";
import { run } from "../helpers/ssh-testkit.js";
import { gatewaySshOpts, revokedKeyCutsOpenForward, runClient, randomFile, sha256Of } from "../helpers/openssh.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { forwardDecision, sftpArgv } from "../../src/agent/ssh/channels.js";

const harness = new AgentHarness("berth-files-");
after(() => harness.close());

const MB = 1024 * 1024;
const BIG = 100 * MB;


const sshOpts = gatewaySshOpts;
const tool = runClient;

/** Where the machine's workspace is on the host, and how a path inside it is spelled inside the machine. */
function workspaceOf(rig: GatewayRig, kind: "process" | "gvisor"): { host: string; inside: string } {
  // Both runtimes keep the workspace at <state>/machines/<id>/workspace; gvisor binds it at /workspace.
  const host = join(rig.dir, "rt", "machines", rig.machine, "workspace");
  return { host, inside: kind === "gvisor" ? "/workspace" : host };
}

test("the sftp argv looks for the machine's own sftp-server and says clearly when there is none", () => {
  const r = spawnSync(sftpArgv()[0]!, [...sftpArgv().slice(1)], { encoding: "utf8", env: { PATH: "/nonexistent" }, cwd: "/" });
  // This host has Debian's sftp-server, so the loop execs it; fed EOF it exits at once.
  assert.ok(existsSync("/usr/lib/openssh/sftp-server"), "openssh-sftp-server must be installed for these tests (.ci/run installs it)");
  assert.notEqual(r.stderr.includes("sftp_unavailable"), true);
  const none = spawnSync("/bin/sh", ["-c", sftpArgv()[2]!.replaceAll("/usr/lib", "/nonexistent/lib").replaceAll("/usr/libexec", "/nonexistent/libexec")], { encoding: "utf8" });
  assert.equal(none.status, 127);
  assert.match(none.stderr, /^berth: sftp_unavailable: this machine has no sftp-server/);
});

test("forward decisions: the machine's own loopback only", () => {
  assert.deepEqual(forwardDecision("localhost", 8080), { kind: "connect", host: "127.0.0.1", port: 8080 });
  assert.deepEqual(forwardDecision("127.0.0.1", 1), { kind: "connect", host: "127.0.0.1", port: 1 });
  assert.deepEqual(forwardDecision("::1", 65535), { kind: "connect", host: "::1", port: 65535 });
  for (const [h, p] of [["10.0.0.1", 80], ["127.0.0.2", 80], ["example.com", 443], ["0.0.0.0", 80], ["localhost", 0], ["localhost", 70000], [5, 80]] as const) {
    const d = forwardDecision(h, p);
    assert.equal(d.kind, "refuse", `${h}:${p}`);
    assert.equal((d as { code: string }).code, "forward_refused");
  }
});

for (const kind of ["process", "gvisor"] as const) {
  const gv = gvisorAvailability();
  const skip = kind === "gvisor" && !gv.ok ? `gvisor runtime unavailable: ${(gv as { why: string }).why}` : null;

  test(`${kind}: sftp, scp (SFTP and -O) and rsync move 100 MB each way byte-exact, and trees with their modes`, async (t) => {
    if (skip) return t.skip(skip);
    const rig = await harness.gateway(kind, `m_files_${kind}`);
    const dir = harness.dir();
    const o = sshOpts(rig, dir);
    const port = String(rig.gw.port);
    const target = `${rig.machine}@127.0.0.1`;
    const ws = workspaceOf(rig, kind);
    const src = join(dir, "big.bin");
    const sum = randomFile(src, BIG);

    // sftp: put, then get back under another name.
    let r = await tool("sftp", [...o, "-P", port, "-b", "-", target], `put ${src} up-sftp.bin\nget up-sftp.bin ${join(dir, "down-sftp.bin")}\n`);
    assert.equal(r.status, 0, `sftp: ${r.stderr}`);
    assert.equal(await sha256Of(join(ws.host, "up-sftp.bin")), sum);
    assert.equal(await sha256Of(join(dir, "down-sftp.bin")), sum);

    // scp -O and rsync move the 100 MB on the process runtime; on gvisor, whose `runsc exec` pipes
    // are slower (docs/files.md), 16 MB keeps this test's time bounded (sftp and scp carry the 100 MB there).
    const other = kind === "gvisor" ? join(dir, "mid.bin") : src;
    const otherSum = kind === "gvisor" ? randomFile(other, 16 * MB) : sum;
    // scp: OpenSSH 9 speaks SFTP by default; -O is the legacy protocol (scp -t/-f inside the machine).
    for (const [name, extra] of [["scp", []], ["scp-O", ["-O"]]] as const) {
      const file = name === "scp" ? src : other;
      const want = name === "scp" ? sum : otherSum;
      r = await tool("scp", [...o, ...extra, "-P", port, file, `${target}:up-${name}.bin`]);
      assert.equal(r.status, 0, `${name} up: ${r.stderr}`);
      assert.equal(await sha256Of(join(ws.host, `up-${name}.bin`)), want, `${name} up`);
      r = await tool("scp", [...o, ...extra, "-P", port, `${target}:up-${name}.bin`, join(dir, `down-${name}.bin`)]);
      assert.equal(r.status, 0, `${name} down: ${r.stderr}`);
      assert.equal(await sha256Of(join(dir, `down-${name}.bin`)), want, `${name} down`);
    }

    // rsync over ssh (rsync --server inside the machine).
    const rsh = ["ssh", ...o, "-p", port].join(" ");
    r = await tool("rsync", ["-e", rsh, other, `${target}:up-rsync.bin`]);
    assert.equal(r.status, 0, `rsync up: ${r.stderr}`);
    assert.equal(await sha256Of(join(ws.host, "up-rsync.bin")), otherSum);
    r = await tool("rsync", ["-e", rsh, `${target}:up-rsync.bin`, join(dir, "down-rsync.bin")]);
    assert.equal(r.status, 0, `rsync down: ${r.stderr}`);
    assert.equal(await sha256Of(join(dir, "down-rsync.bin")), otherSum);

    // Trees with modes: scp -rp (SFTP and -O), rsync -a, sftp put -rp; each back again.
    const tree = join(dir, "tree");
    mkdirSync(join(tree, "sub", "deeper"), { recursive: true });
    writeFileSync(join(tree, "run.sh"), "#!/bin/sh\necho hi\n");
    chmodSync(join(tree, "run.sh"), 0o750);
    writeFileSync(join(tree, "sub", "secret"), "s");
    chmodSync(join(tree, "sub", "secret"), 0o600);
    writeFileSync(join(tree, "sub", "deeper", "plain"), randomBytes(70_000));
    chmodSync(join(tree, "sub", "deeper", "plain"), 0o644);
    chmodSync(join(tree, "sub"), 0o711);
    const modes = (root: string) =>
      ["run.sh", "sub", "sub/secret", "sub/deeper/plain"].map((p) => `${p} ${(statSync(join(root, p)).mode & 0o777).toString(8)}`);
    const want = modes(tree);
    const copies: Array<[string, string[]]> = [
      ["scp", ["scp", ...o, "-r", "-p", "-P", port]],
      ["scp-O", ["scp", ...o, "-O", "-r", "-p", "-P", port]],
      ["rsync", ["rsync", "-a", "-e", rsh]],
    ];
    for (const [name, cmd] of copies) {
      // rsync copies a directory's contents with a trailing slash (scp copies the directory itself to a new name).
      const slash = name === "rsync" ? "/" : "";
      r = await tool(cmd[0]!, [...cmd.slice(1), tree + slash, `${target}:tree-${name}`]);
      assert.equal(r.status, 0, `${name} -r up: ${r.stderr}`);
      assert.deepEqual(modes(join(ws.host, `tree-${name}`)), want, `${name} tree up`);
      assert.equal(readFileSync(join(ws.host, `tree-${name}`, "sub", "deeper", "plain")).equals(readFileSync(join(tree, "sub", "deeper", "plain"))), true);
      const back = join(dir, `back-${name}`);
      r = await tool(cmd[0]!, [...cmd.slice(1), `${target}:tree-${name}${slash}`, back]);
      assert.equal(r.status, 0, `${name} -r down: ${r.stderr}`);
      assert.deepEqual(modes(back), want, `${name} tree down`);
    }
    r = await tool("sftp", [...o, "-P", port, "-b", "-", target], `put -rp ${tree} tree-sftp\n`);
    assert.equal(r.status, 0, `sftp put -r: ${r.stderr}`);
    assert.deepEqual(modes(join(ws.host, "tree-sftp")), want, "sftp tree up");

    // Relative paths are the workspace: `pwd` in sftp names it.
    r = await tool("sftp", [...o, "-P", port, "-b", "-", target], "pwd\n");
    assert.match(r.stdout, new RegExp(`Remote working directory: ${ws.inside}\\b`));
    await until(() => rig.gw.sessions.count(rig.machine) === 0, "every transfer's session ended");
    await rig.close();
  });

  test(`${kind}: a revoked key (return) cuts an open SFTP transfer; the fence proves the SFTP server gone`, async (t) => {
    if (skip) return t.skip(skip);
    const rig = await harness.gateway(kind, `m_cut_${kind}`);
    const dir = harness.dir();
    const o = sshOpts(rig, dir);
    const src = join(dir, "big.bin");
    randomFile(src, 64 * MB);
    // -l: a slow transfer (8 Mbit/s), so it is still running when the key goes.
    const child = spawn("scp", [...o, "-l", "8192", "-P", String(rig.gw.port), src, `${rig.machine}@127.0.0.1:slow.bin`], { stdio: ["ignore", "ignore", "pipe"] });
    const exit = new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
    const ws = workspaceOf(rig, kind);
    await until(() => existsSync(join(ws.host, "slow.bin")) && statSync(join(ws.host, "slow.bin")).size > 0, "the transfer started");
    assert.equal(rig.gw.sessions.count(rig.machine), 1, "the SFTP server is a counted session");
    rig.keys.remove(rig.machine, rig.pair.fingerprint);
    assert.notEqual(await exit, 0, "scp failed when access was cut");
    assert.ok(statSync(join(ws.host, "slow.bin")).size < 64 * MB, "cut before the end");
    await until(() => rig.gw.sessions.count(rig.machine) === 0, "the SFTP session released");
    const proof = await rig.runtime.fence(rig.machine);
    assert.equal(proof.remaining, 0);
    assert.deepEqual(rig.store.unfinished(), [], "every session record clean");
    if (kind === "process") {
      const left = spawnSync("pgrep", ["-f", "sftp-server"], { encoding: "utf8" }).stdout.trim().split("\n").filter(Boolean);
      for (const pid of left) {
        const env = (() => {
          try {
            return readFileSync(`/proc/${pid}/environ`, "utf8");
          } catch {
            return "";
          }
        })();
        assert.ok(!env.includes(`BERTH_MACHINE=${rig.machine}`), `sftp-server ${pid} of the machine survived`);
      }
    }
    await rig.close();
  });

  test(`${kind}: forwards reach only the machine's own ports; -R and -D refused; a revoked key cuts an open forward`, async (t) => {
    if (skip) return t.skip(skip);
    const rig = await harness.gateway(kind, `m_fwd_${kind}`);
    const dir = harness.dir();
    const o = sshOpts(rig, dir);
    const port = String(rig.gw.port);
    const target = `${rig.machine}@127.0.0.1`;
    // A server on the host's loopback: never reachable through a forward.
    const hostServer = createServer((s) => s.end("HOST-SERVER\n"));
    await new Promise<void>((r) => hostServer.listen(0, "127.0.0.1", r));
    const hostPort = (hostServer.address() as AddressInfo).port;
    try {
      if (kind === "process") {
        // No network namespace: the machine's localhost is the host's, so every forward is refused.
        const r = await tool("ssh", [...o, "-p", port, "-W", `localhost:${hostPort}`, target], "");
        assert.notEqual(r.status, 0);
        assert.doesNotMatch(r.stdout, /HOST-SERVER/);
        return;
      }
      // A server inside the machine, started over the gateway, echoing what it gets with a prefix.
      const c = await rig.client();
      const inner = 20000 + (randomBytes(2).readUInt16BE() % 20000);
      const srv = `const s=require("net").createServer(c=>{c.write("INNER\\n");c.on("data",d=>c.write("echo:"+d));c.on("end",()=>c.end())});s.listen(${inner},"127.0.0.1",()=>console.log("listening"))`;
      // setsid: out of the starting session's group, so that session's release leaves it running.
      void run(c, `setsid -f ${process.execPath} -e '${srv}' > /tmp/srv.log 2>&1 < /dev/null`);
      await until(async () => (await run(c, "cat /tmp/srv.log")).stdout.includes("listening"), "the server inside the machine");

      // -W localhost:PORT answers from inside.
      let r = await tool("ssh", [...o, "-p", port, "-W", `localhost:${inner}`, target], "ping\n");
      assert.match(r.stdout, /^INNER\necho:ping\n/);
      r = await tool("ssh", [...o, "-p", port, "-W", `127.0.0.1:${inner}`, target], "x\n");
      assert.match(r.stdout, /^INNER\n/);
      // The host's port is not the machine's: nothing answers (the sandbox's loopback has no such server).
      r = await tool("ssh", [...o, "-p", port, "-W", `127.0.0.1:${hostPort}`, target], "");
      assert.doesNotMatch(r.stdout, /HOST-SERVER/);
      // Other destinations: refused by the gateway.
      r = await tool("ssh", [...o, "-p", port, "-W", `10.0.0.1:${hostPort}`, target], "");
      assert.notEqual(r.status, 0);
      // -R and -D: refused (ExitOnForwardFailure makes ssh say so).
      r = await tool("ssh", [...o, "-p", port, "-o", "ExitOnForwardFailure=yes", "-N", "-R", "0:127.0.0.1:22", target]);
      assert.notEqual(r.status, 0, "-R refused");
      assert.match(r.stderr, /forward/i);

      // -L: a local port that reaches the machine's server; a revoked key cuts the open connection.
      await revokedKeyCutsOpenForward(rig, o, inner);
      const proof = await rig.runtime.fence(rig.machine);
      assert.equal(proof.remaining, 0);
    } finally {
      hostServer.close();
      await rig.close();
    }
  });

  test(`${kind}: a machine of a pool with --forwarding off refuses every forward, and says why`, async (t) => {
    if (skip) return t.skip(skip);
    const refused: string[] = [];
    const log = {
      info(obj: object, msg: string) {
        if (msg === "forward refused") refused.push(String((obj as { why?: unknown }).why));
      },
      warn() {},
      error() {},
    };
    const rig = await harness.gateway(kind, `m_fwdoff_${kind}`, { create: { forwarding: "off" }, log });
    const dir = harness.dir();
    const o = sshOpts(rig, dir);
    const port = String(rig.gw.port);
    const target = `${rig.machine}@127.0.0.1`;
    try {
      assert.match((await rig.runtime.forwardRefusal(rig.machine)) ?? "", /belongs to a pool with forwarding off/);
      // A server inside the machine (gvisor; the process runtime without a namespace has none of its own).
      const inner = 20000 + (randomBytes(2).readUInt16BE() % 20000);
      if (kind === "gvisor") {
        const c = await rig.client();
        const srv = `const s=require("net").createServer(c=>{c.end("INNER\\n")});s.listen(${inner},"127.0.0.1",()=>console.log("listening"))`;
        void run(c, `setsid -f ${process.execPath} -e '${srv}' > /tmp/srv.log 2>&1 < /dev/null`);
        await until(async () => (await run(c, "cat /tmp/srv.log")).stdout.includes("listening"), "the server inside the machine");
      }
      for (const dest of [`localhost:${inner}`, `127.0.0.1:${inner}`, `[::1]:${inner}`]) {
        const r = await tool("ssh", [...o, "-p", port, "-W", dest, target], "");
        assert.notEqual(r.status, 0, `-W ${dest} refused`);
        assert.doesNotMatch(r.stdout, /INNER/);
        assert.match(r.stderr, /stdio forwarding failed|open failed/);
      }
      assert.equal(refused.length, 3, "each -W refused by the gateway");
      for (const why of refused) assert.match(why, /^forward_refused: machine m_fwdoff_\w+ belongs to a pool with forwarding off/);
      if (kind === "gvisor") {
        // The same machine provisioned again without the switch (the pool turned it on): the forward answers.
        await rig.runtime.create(rig.machine);
        assert.equal(await rig.runtime.forwardRefusal(rig.machine), null);
        const r = await tool("ssh", [...o, "-p", port, "-W", `localhost:${inner}`, target], "");
        assert.match(r.stdout, /^INNER\n/);
      }
    } finally {
      await rig.close();
    }
  });
}
