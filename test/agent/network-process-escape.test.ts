/**
 * A root borrower on the process runtime under a network policy tries to
 * leave it: enter the host's network namespace (nsenter -t <agent pid> -n), delete the
 * machine's nftables table, signal the agent, rewrite a root-owned file the
 * agent runs. Real agent (startAgent in this process), real namespaces, veth,
 * nftables and a target server in a test namespace. Needs root, `ip`, `nft`.
 */
import { strict as assert } from "node:assert";
import { randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { RunningAgent } from "../../src/agent/agent.js";
import { MachineNetworks } from "../../src/agent/network/manager.js";
import { networkAvailability } from "../../src/agent/network/host.js";
import { makePolicy } from "../../src/core/network-policy.js";
import { AgentHarness } from "../helpers/agent.js";
import { startNetnsTarget, type NetnsTarget } from "../helpers/netns-target.js";

const avail = networkAvailability();
const skip = avail.ok ? false : `network policies unavailable here: ${avail.why}`;
const harness = new AgentHarness("berth-netesc-");
let target: NetnsTarget;
let agent: RunningAgent & { network: MachineNetworks };
let hostFile: string;
const hostDir = mkdtempSync(join(tmpdir(), "berth-netesc-host-"));

function id(prefix: string): string {
  return `${prefix}_${randomBytes(6).toString("hex")}`;
}

async function run(machineId: string, script: string): Promise<{ code: number | null; out: string }> {
  const h = await agent.runtime.exec(machineId, { argv: ["/bin/sh", "-c", script], env: {} });
  let out = "";
  h.stdout.on("data", (b: Buffer) => (out += b.toString()));
  h.stderr.on("data", (b: Buffer) => (out += b.toString()));
  h.stdin.end();
  const r = await h.exited;
  return { code: r.code, out };
}

/** A TCP connect from node, printing open / refused / error code. */
function connect(host: string, port: number): string {
  const js = `const s=require("net").connect(${port},"${host}");s.setTimeout(2000,()=>{console.log("timeout");process.exit(0)});s.on("connect",()=>{console.log("open");process.exit(0)});s.on("error",(e)=>{console.log(e.code);process.exit(0)})`;
  return `${process.execPath} -e '${js}'`;
}

describe("process runtime under a policy: a root borrower cannot leave it", { skip }, () => {
  before(async () => {
    target = await startNetnsTarget();
    const a = await harness.agent({
      runtime: "process",
      network: {
        resolve: (n) => target.resolve(n),
        probe: { deny: [{ host: target.ip, port: target.deniedPort, why: "test server outside the policy" }], refusedResolvers: [target.ip] },
      },
    });
    assert.ok(a.network instanceof MachineNetworks);
    agent = a as RunningAgent & { network: MachineNetworks };
    // A root-owned file of the host, writable by its owner only (as /usr/sbin/nft or /etc/cron.d are).
    chmodSync(hostDir, 0o755);
    hostFile = join(hostDir, "host-owned");
    writeFileSync(hostFile, "host\n", { mode: 0o644 });
  });
  after(async () => {
    for (const m of agent?.store.machines.list() ?? []) await agent.ops.run({ opId: id("op"), kind: "destroy", machineId: m.id, generation: m.generation }).catch(() => undefined);
    await agent?.network.sweep(() => false).catch(() => undefined);
    await harness.close();
    await target?.close();
    rmSync(hostDir, { recursive: true, force: true });
  });

  it("nsenter, nft, signals to host processes and root-owned files are all refused; the rules stay as recorded", async () => {
    const m = id("m");
    const prov = await agent.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 0, args: { network: makePolicy("egress", [`${target.ip}:${target.allowedPort}`]) } });
    assert.equal((prov.result as { network: { result: string } }).network.result, "pass");
    const rec = agent.network.get(m)!;

    // The policy holds from inside: the denied port is refused.
    const inside = await run(m, connect(target.ip, target.deniedPort));
    assert.notEqual(inside.out.trim(), "open", "the denied port is not reached from inside");
    // And the allowed one is reached (the machine still works as a machine).
    assert.equal((await run(m, connect(target.ip, target.allowedPort))).out.trim(), "open");

    // 1. Leave the namespace through the agent's own network namespace (nsenter -t <agent pid> -n).
    const esc = await run(m, `nsenter -t ${process.pid} -n ${connect(target.ip, target.deniedPort)}; echo "rc=$?"`);
    assert.doesNotMatch(esc.out, /^open$/m, `nsenter reached the denied port: ${esc.out}`);
    // 2. Delete the machine's rules.
    const nft = await run(m, `nsenter -t ${process.pid} -n nft delete table inet ${rec.table}; echo "rc=$?"`);
    assert.match(nft.out, /rc=[1-9]/, `nft delete succeeded: ${nft.out}`);
    // 3. Signal (or even see) a host process: the agent's own.
    const sig = await run(m, `kill -0 ${process.pid} 2>/dev/null && echo signalled; test -e /proc/${process.pid}/ns/net && echo visible; echo done`);
    assert.doesNotMatch(sig.out, /signalled|visible/, `the agent process is reachable: ${sig.out}`);
    // 4. Rewrite a root-owned file (the way to a root job outside: a binary the agent runs, a cron entry).
    const wr = await run(m, `echo owned > ${hostFile}; echo "rc=$?"`);
    assert.equal(readFileSync(hostFile, "utf8"), "host\n", `a root-owned host file was rewritten: ${wr.out}`);
    // 5. Capabilities: none in any set, no_new_privs on.
    const st = await run(m, "grep -E '^(Uid|CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status");
    assert.match(st.out, /^CapEff:\s+0+$/m, st.out);
    assert.match(st.out, /^CapBnd:\s+0+$/m, st.out);
    assert.match(st.out, /^NoNewPrivs:\s+1$/m, st.out);
    assert.doesNotMatch(st.out, /^Uid:\s+0\b/m, `commands run as root: ${st.out}`);

    // The rules are exactly as recorded: none of the attempts changed them.
    const v = await agent.network.verify(m, { namespace: true });
    assert.equal(v.ok, true, JSON.stringify(v));
    // The workspace is the machine's own: it can write there.
    const ws = await run(m, 'echo hi > "$HOME/f" && cat "$HOME/f" && ls "$HOME/.." && pwd');
    assert.match(ws.out, /^hi$/m, ws.out);
    // ... and sees nothing else of the agent's state directory (no other machine, no record).
    assert.doesNotMatch(ws.out, /machine\.json/, ws.out);
    assert.equal(readFileSync(join(agent.store.machines.get(m)!.workspace!, "f"), "utf8"), "hi\n");
    await agent.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 0 });
  });
});
