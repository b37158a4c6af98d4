/**
 * Crash recovery of machine networks: a real `berth agent` child process is
 * SIGKILLed while three provisions are in flight with their namespaces, veth
 * pairs and nftables tables up (each probe waits on a target whose packets
 * the test namespace drops). The restarted agent removes every stale one,
 * counts them, and leaves nothing of its own in the kernel.
 */
import { strict as assert } from "node:assert";
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { createHash } from "node:crypto";
import { after, describe, it } from "node:test";
import { networkAvailability, listLinks, listNetns, listTables } from "../../src/agent/network/host.js";
import { makePolicy } from "../../src/core/network-policy.js";
import { AgentHarness, BERTH_BIN, until } from "../helpers/agent.js";
import { startNetnsTarget, type NetnsTarget } from "../helpers/netns-target.js";

const avail = networkAvailability();
const harness = new AgentHarness("berth-netrec-");

interface Child {
  child: ChildProcess;
  stderr: () => string;
  url: Promise<string>;
}

function agentChild(stateDir: string, coordinator: string, tokenFile: string, target: NetnsTarget): Child {
  const child = spawn(
    process.execPath,
    [BERTH_BIN, "agent", "--state-dir", stateDir, "--coordinator", coordinator, "--enroll-token-file", tokenFile, "--runtime", "process", "--log-level", "warn", "--network-resolver", target.ip],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let err = "";
  let out = "";
  child.stderr!.on("data", (b: Buffer) => (err += b.toString()));
  const url = new Promise<string>((res, rej) => {
    child.stdout!.on("data", (b: Buffer) => {
      out += b.toString();
      const m = /api=(\S+)/.exec(out);
      if (m) res(m[1]!);
    });
    child.once("exit", (c) => rej(new Error(`agent exited ${c}: ${err}`)));
  });
  url.catch(() => undefined);
  return { child, stderr: () => err, url };
}

/** The kernel objects of the agent whose state directory is `stateDir` (named by its tag), so other agents on the host are not counted. */
async function ours(stateDir: string) {
  const tag = createHash("sha256").update(resolve(stateDir)).digest("hex").slice(0, 4);
  return {
    netns: listNetns().filter((n) => n.startsWith(`berth-${tag}-`)),
    links: listLinks().filter((l) => l.startsWith(`bm${tag}`)),
    tables: [...(await listTables()).keys()].filter((t) => t.startsWith(`berth_${tag}_`)),
  };
}

describe("machine network recovery", { skip: avail.ok ? false : `network policies unavailable here: ${avail.why}` }, () => {
  let target: NetnsTarget | null = null;
  const children: ChildProcess[] = [];
  after(async () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
    await harness.close();
    await target?.close();
  });

  it("SIGKILL with namespaces up: the restarted agent removes every stale one and counts them", async () => {
    target = await startNetnsTarget();
    // Packets to port 7777 vanish in the target namespace: each probe waits on it (bounded, 2 s).
    execFileSync("ip", ["netns", "exec", target.netns, "nft", "-f", "-"], { input: "table inet t {\n chain i {\n type filter hook input priority 0;\n tcp dport 7777 drop\n }\n}\n" });
    const enroller = await harness.enroller();
    const stateDir = harness.dir();
    const tokenFile = join(harness.dir(), "enroll.token");
    writeFileSync(tokenFile, enroller.token, { mode: 0o600 });

    const first = agentChild(stateDir, enroller.url, tokenFile, target);
    children.push(first.child);
    const url = await first.url;
    await until(() => enroller.issued.length > 0, "enrollment");
    const token = enroller.issued.at(-1)!.hostCallToken;
    const policy = makePolicy("egress", [`${target.ip}:7777`]);
    const inflight = [1, 2, 3].map((i) =>
      fetch(`${url}/v1/agent/ops`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
        body: JSON.stringify({ opId: `op-p${i}`, kind: "provision", machineId: `m_rec${i}`, generation: 0, args: { network: policy } }),
      }).catch(() => null),
    );
    await until(async () => {
      const o = await ours(stateDir);
      return o.netns.length === 3 && o.links.length === 3 && o.tables.length === 3;
    }, "three machine networks up");
    first.child.kill("SIGKILL");
    await new Promise((r) => first.child.once("exit", r));
    await Promise.all(inflight);
    const stale = await ours(stateDir);
    assert.deepEqual([stale.netns.length, stale.links.length, stale.tables.length], [3, 3, 3], "the dead agent left three of each");

    const second = agentChild(stateDir, enroller.url, tokenFile, target);
    children.push(second.child);
    await second.url;
    const line = second.stderr().split("\n").find((l) => l.includes("removed machine networks a previous agent process left"));
    assert.ok(line, `the restart reports what it removed; stderr: ${second.stderr()}`);
    const report = JSON.parse(line) as { records: number; netns: number; links: number; tables: number; leases: number };
    assert.deepEqual({ records: report.records, netns: report.netns, links: report.links, tables: report.tables }, { records: 3, netns: 3, links: 3, tables: 3 });
    assert.deepEqual(await ours(stateDir), { netns: [], links: [], tables: [] }, "nothing of the dead agent is left in the kernel");
    second.child.kill("SIGTERM");
    await new Promise((r) => second.child.once("exit", r));
  });
});
