/**
 * Forwards on the process runtime with a network namespace (a machine under a
 * network policy): `ssh -W` and `-L` to the machine's localhost reach a server
 * listening inside its namespace; the host's own loopback server is not
 * reached (the namespace has its own loopback); other destinations and `-R`
 * are refused; a revoked key cuts an open forward and the fence proves the
 * relay gone. Real OpenSSH client, real gateway, a namespace made by the test.
 * Root only (ip netns).
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, statSync, writeFileSync } from "node:fs";
import { createServer, connect as netConnect, type AddressInfo, type Socket } from "node:net";
import { join } from "node:path";
import { AgentHarness, until } from "../helpers/agent.js";
import { run } from "../helpers/ssh-testkit.js";
import { gatewaySshOpts, runClient } from "../helpers/openssh.js";

const harness = new AgentHarness("berth-fwdns-");
const netns = `berth-fwdns-${randomBytes(3).toString("hex")}`;
after(async () => {
  await harness.close();
  spawnSync("ip", ["netns", "del", netns]);
});

const skip = process.getuid?.() !== 0 ? "needs root (ip netns)" : spawnSync("ip", ["-V"]).status !== 0 ? "iproute2 is not installed" : false;

async function connectFirst(port: number, deadlineMs = 30_000): Promise<Socket> {
  const deadline = Date.now() + deadlineMs;
  for (;;) {
    const s = netConnect(port, "127.0.0.1");
    const first = await new Promise<string | null>((res) => {
      s.once("data", (d) => res(d.toString()));
      s.once("error", () => res(null));
      s.once("close", () => res(null));
    });
    if (first === "INNER\n") return s;
    s.destroy();
    if (Date.now() > deadline) throw new Error("timed out waiting for the -L forward");
    await new Promise((r) => setTimeout(r, 100));
  }
}

test("process runtime with a network namespace: forwards reach the machine's own ports only; a revoked key cuts an open forward", { skip }, async () => {
  assert.equal(spawnSync("ip", ["netns", "add", netns]).status, 0);
  assert.equal(spawnSync("ip", ["-n", netns, "link", "set", "lo", "up"]).status, 0);
  const dir = harness.dir();
  const etc = join(dir, "etc");
  mkdirSync(etc);
  writeFileSync(join(etc, "hosts"), "127.0.0.1 localhost\n");
  writeFileSync(join(etc, "resolv.conf"), "");
  const inode = String(statSync(`/run/netns/${netns}`).ino);
  const uid = 1_000_000_000 + 4_000 + (randomBytes(2).readUInt16BE() % 1_000);
  const rig = await harness.gateway("process", "m_fwdns", {
    create: { network: { netns, inode, uid, hosts: join(etc, "hosts"), resolvConf: join(etc, "resolv.conf") } },
  });
  assert.equal(await rig.runtime.forwardRefusal(rig.machine), null, "a machine with its own namespace takes forwards");
  const o = gatewaySshOpts(rig, harness.dir());
  const port = String(rig.gw.port);
  const target = `${rig.machine}@127.0.0.1`;
  // A server on the host's loopback, on the same port number as the one inside: never reached.
  const hostServer = createServer((s) => s.end("HOST-SERVER\n"));
  await new Promise<void>((r) => hostServer.listen(0, "127.0.0.1", r));
  const inner = (hostServer.address() as AddressInfo).port;
  try {
    const c = await rig.client();
    const srv = `const s=require("net").createServer(c=>{c.write("INNER\\n");c.on("data",d=>c.write("echo:"+d));c.on("end",()=>c.end())});s.listen(${inner},"127.0.0.1",()=>console.log("listening"))`;
    void run(c, `setsid -f ${process.execPath} -e '${srv}' > srv.log 2>&1 < /dev/null`);
    await until(async () => (await run(c, "cat srv.log")).stdout.includes("listening"), "the server inside the machine's namespace");

    // -W localhost:PORT and 127.0.0.1:PORT answer from inside the namespace, not from the host's server on that port.
    let r = await runClient("ssh", [...o, "-p", port, "-W", `localhost:${inner}`, target], "ping\n");
    assert.match(r.stdout, /^INNER\necho:ping\n/);
    assert.doesNotMatch(r.stdout, /HOST-SERVER/);
    r = await runClient("ssh", [...o, "-p", port, "-W", `127.0.0.1:${inner}`, target], "x\n");
    assert.match(r.stdout, /^INNER\n/);
    // Another destination: refused by the gateway; -R refused.
    r = await runClient("ssh", [...o, "-p", port, "-W", `10.0.0.1:${inner}`, target], "");
    assert.notEqual(r.status, 0);
    r = await runClient("ssh", [...o, "-p", port, "-o", "ExitOnForwardFailure=yes", "-N", "-R", "0:127.0.0.1:22", target]);
    assert.notEqual(r.status, 0, "-R refused");

    // -L: an open forward is a counted session; a revoked key cuts it; the fence proves nothing left.
    const local = await new Promise<number>((res) => {
      const s = createServer();
      s.listen(0, "127.0.0.1", () => {
        const p = (s.address() as AddressInfo).port;
        s.close(() => res(p));
      });
    });
    const l: ChildProcess = spawn("ssh", [...o, "-p", port, "-N", "-o", "ExitOnForwardFailure=yes", "-L", `${local}:localhost:${inner}`, target], { stdio: "ignore" });
    try {
      const sock = await connectFirst(local);
      const closed = new Promise<void>((res) => sock.once("close", () => res()));
      sock.on("error", () => {});
      await until(() => rig.gw.sessions.count(rig.machine) >= 1, "the forward is a counted session");
      rig.keys.remove(rig.machine, rig.pair.fingerprint);
      await closed;
      await until(() => rig.gw.sessions.count(rig.machine) === 0, "the forward released");
    } finally {
      l.kill("SIGKILL");
    }
    const proof = await rig.runtime.fence(rig.machine);
    assert.equal(proof.remaining, 0);
  } finally {
    hostServer.close();
    await rig.close();
  }
});
