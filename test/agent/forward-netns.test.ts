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
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, statSync, writeFileSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { join } from "node:path";
import { AgentHarness, until } from "../helpers/agent.js";
import { run } from "../helpers/ssh-testkit.js";
import { gatewaySshOpts, revokedKeyCutsOpenForward, runClient } from "../helpers/openssh.js";

const harness = new AgentHarness("berth-fwdns-");
const netns = `berth-fwdns-${randomBytes(3).toString("hex")}`;
after(async () => {
  await harness.close();
  spawnSync("ip", ["netns", "del", netns]);
});

const skip = process.getuid?.() !== 0 ? "needs root (ip netns)" : spawnSync("ip", ["-V"]).status !== 0 ? "iproute2 is not installed" : false;

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
    await revokedKeyCutsOpenForward(rig, o, inner);
    const proof = await rig.runtime.fence(rig.machine);
    assert.equal(proof.remaining, 0);
  } finally {
    hostServer.close();
    await rig.close();
  }
});
