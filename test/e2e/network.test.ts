/**
 * Network policy end to end: real `berth serve` and `berth agent` processes
 * (process runtime), machines in their own network namespaces, a target
 * server in a test namespace (nothing leaves this machine). A borrower's SSH
 * command reaches the allowed target and is refused elsewhere; readiness
 * evidence is on the machine (API and `berth pool show`), bound to the
 * generation; a policy change gives the next borrow new evidence; a probe
 * that fails after a return quarantines the machine.
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { join, resolve } from "node:path";
import { createHash } from "node:crypto";
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { Cluster, berthSync, startProcess, stopProcess } from "../helpers/cluster.js";
import { connect, execStreaming } from "../../src/cli/ssh-client.js";
import { networkAvailability } from "../../src/agent/network/host.js";
import { makePolicy, policyFingerprint } from "../../src/core/network-policy.js";
import { sink } from "../helpers/sink.js";
import { startNetnsTarget, type NetnsTarget } from "../helpers/netns-target.js";

interface Borrow {
  borrowId: string;
  borrowToken: string;
  machine: { id: string; generation: number; ssh: { host: string; port: number; user: string; hostKey: string } };
}
interface PoolShow {
  network: { mode: string; fingerprint: string };
  counts: { ready: number };
  networks: Array<{ id: string; state: string; generation: number; policyFingerprint: string; evidence: { result: string; policyFingerprint: string; generation: number; checks: Array<{ kind: string; target: string; got: string; ok: boolean }> } | null }>;
}

const avail = networkAvailability();
let target: NetnsTarget;

/** A cluster whose agent knows the test target: names resolve through its DNS responder, its closed port must be refused. */
class NetCluster extends Cluster {
  override async startAgent(): Promise<void> {
    this.agent = await startProcess(
      [
        "agent", "--state-dir", this.agentDir, "--coordinator", this.coordinator!.url, "--enroll-token-file", join(this.dir.path, "agent.token"),
        "--runtime", "process", "--slots", "4", "--name", "e2e", "--log-level", "warn",
        "--network-resolver", target.ip, "--network-probe-deny", `${target.ip}:${target.deniedPort}`, "--network-probe-refused-resolver", target.ip,
      ],
      {},
      /berth agent ready/,
    );
  }
}

async function sshRun(c: Cluster, b: Borrow, command: string): Promise<{ code: number | null; out: string }> {
  const client = await connect({ ...b.machine.ssh, privateKey: c.keeper.privateKey });
  try {
    const out = sink();
    const err = sink();
    const r = await execStreaming(client, command, { stdout: out.stream, stderr: err.stream });
    return { code: r.code, out: out.text() + err.text() };
  } finally {
    client.end();
  }
}

async function ensure(c: Cluster, name: string, allow: string[], dns: string[] = []): Promise<void> {
  await c.api.call("POST", `/v1/pools/${name}/ensure`, {
    minReady: 1, maxReady: 2, compatibilityKey: "e2e", access: "keeper", provider: "hosts", keeperKey: c.keeper.publicKey,
    network: { mode: "egress", allow, dns },
  });
}

describe("network policy end to end", { skip: avail.ok ? false : `network policies unavailable here: ${avail.why}` }, () => {
  const c = new NetCluster({ runtime: "process" });
  let extra: ChildProcess | null = null;
  before(async () => {
    target = await startNetnsTarget();
    await c.start();
  });
  after(async () => {
    extra?.kill("SIGKILL");
    const agentDirs = [c.agentDir, join(c.dir.path, "agent-hostaddr")];
    const tags = agentDirs.map((d) => createHash("sha256").update(resolve(d)).digest("hex").slice(0, 4));
    await c.close();
    await target.close();
    // Whatever a machine still being made when the agent stopped left: every object named with this agent's tag.
    const quiet = (args: string[]): void => {
      try {
        execFileSync(args[0]!, args.slice(1), { stdio: "ignore" });
      } catch {
        /* gone */
      }
    };
    for (const l of readdirSync("/sys/class/net")) if (tags.some((tag) => l.startsWith(`bm${tag}`))) quiet(["ip", "link", "del", l]);
    for (const line of execFileSync("nft", ["list", "tables"], { encoding: "utf8" }).split("\n")) {
      const t = /^table inet (berth_(\w+)_\w+)$/.exec(line.trim());
      if (t && tags.includes(t[2]!)) quiet(["nft", "delete", "table", "inet", t[1]!]);
    }
    for (const ns of existsSync("/run/netns") ? readdirSync("/run/netns") : []) if (tags.some((tag) => ns.startsWith(`berth-${tag}-`))) quiet(["ip", "netns", "del", ns]);
    const leases = "/run/berth/net-leases";
    for (const f of existsSync(leases) ? readdirSync(leases) : []) {
      if (agentDirs.some((d) => readFileSync(join(leases, f), "utf8").includes(JSON.stringify(resolve(d))))) rmSync(join(leases, f), { force: true });
    }
  });

  test("borrower reaches the allowed target only; evidence per generation; a policy change rotates machines; pool show and metrics", async () => {
    const allow = [`${target.ip}:${target.allowedPort}`, `target.test:${target.allowedPort}`];
    await ensure(c, "net", allow);
    const f1 = policyFingerprint(makePolicy("egress", allow));
    await c.waitFor("a ready machine", async () => (await c.readyCount("net")) >= 1);
    const p1 = await c.api.call<PoolShow>("GET", "/v1/pools/net");
    assert.equal(p1.network.fingerprint, f1);
    const ready = p1.networks.find((m) => m.state === "ready")!;
    assert.equal(ready.evidence?.result, "pass");
    assert.equal(ready.evidence?.policyFingerprint, f1);
    assert.equal(ready.evidence?.generation, 0);

    const b = await c.api.call<Borrow>("POST", "/v1/pools/net/borrow", {});
    const ok = await sshRun(c, b, `bash -c 'exec 3<>/dev/tcp/target.test/${target.allowedPort} && cat <&3'`);
    assert.equal(ok.out.trim(), "hello", "the borrower reaches the allowed target by its pinned name");
    const denied = await sshRun(c, b, `bash -c 'exec 3<>/dev/tcp/${target.ip}/${target.deniedPort}'`);
    assert.notEqual(denied.code, 0);
    assert.match(denied.out, /Connection refused/, "a server outside the policy is refused, not reached");
    const meta = await sshRun(c, b, "timeout 5 bash -c 'exec 3<>/dev/tcp/169.254.169.254/80'");
    assert.match(meta.out, /Connection refused|No route/, "the metadata address is refused at once (not a time-out)");
    await c.api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
    const back = await c.waitFor("the machine ready again with evidence of its borrow's generation", async () => {
      const p = await c.api.call<PoolShow>("GET", "/v1/pools/net");
      const m = p.networks.find((x) => x.id === b.machine.id && x.state === "ready");
      return m && m.evidence?.generation === b.machine.generation ? m : null;
    });
    assert.equal(back.evidence?.result, "pass");

    // Policy change: the ready machine of the old policy is rotated out; the next borrow has new evidence.
    const allow2 = [`${target.ip}:${target.allowedPort}`];
    await ensure(c, "net", allow2, [target.ip]);
    const f2 = policyFingerprint(makePolicy("egress", allow2, [target.ip]));
    assert.notEqual(f1, f2);
    let last: PoolShow | null = null;
    const fresh = await c
      .waitFor("a ready machine of the new policy", async () => {
        last = await c.api.call<PoolShow>("GET", "/v1/pools/net");
        return last.networks.find((m) => m.state === "ready" && m.policyFingerprint === f2) ?? null;
      }, 60_000)
      .catch((e: Error) => {
        throw new Error(`${e.message}; pool: ${JSON.stringify(last)}; agent output: ${c.agent?.output().slice(-2000)}`);
      });
    const b2 = await c.api.call<Borrow>("POST", "/v1/pools/net/borrow", {});
    assert.equal(b2.machine.id, fresh.id, "the next borrow gets a machine of the new policy");
    const p2 = await c.api.call<PoolShow>("GET", "/v1/pools/net");
    const e2 = p2.networks.find((m) => m.id === b2.machine.id)!.evidence!;
    assert.equal(e2.policyFingerprint, f2);
    assert.equal(e2.result, "pass");
    assert.ok(e2.checks.some((x) => x.kind === "dns-answer" && x.got === "answered"), "the new policy's resolver answers from inside");
    assert.ok(!p2.networks.some((m) => m.id === ready.id && m.state === "ready"), "the old policy's machine is not ready any more");
    await c.api.call("POST", `/v1/borrows/${b2.borrowId}/return`, { token: b2.borrowToken });

    // What a person sees.
    const show = berthSync(["pool", "show", "net", "--config", c.clientConfig]);
    assert.equal(show.status, 0, show.stderr);
    assert.match(show.stdout, new RegExp(`network +egress to ${target.ip.replaceAll(".", "\\.")}:8080; dns ${target.ip.replaceAll(".", "\\.")} \\(${f2}\\)`));
    assert.match(show.stdout, /readiness evidence/);
    const metrics = await fetch(`${c.coordinator!.url}/metrics`, { headers: { authorization: `Bearer ${(await import("node:fs")).readFileSync(c.adminTokenFile, "utf8").trim()}` } }).then((r) => r.text());
    assert.match(metrics, /berth_network_probes_total\{pool="net",outcome="pass"\} \d+/);
    // Both borrows above were checked at lend time: the request and the agent's own part are counted.
    assert.match(metrics, /berth_lend_check_seconds_count\{part="total"\} [2-9]/);
    assert.match(metrics, /berth_lend_check_seconds_count\{part="agent"\} [2-9]/);
  });

  test("a machine whose probe fails after a return is quarantined, never ready", async () => {
    // A permit target this test controls: up while the machine is provisioned, gone when it comes back.
    extra = spawn("ip", ["netns", "exec", target.netns, process.execPath, "-e", "require('net').createServer((s)=>{s.on('error',()=>{});s.end('x')}).listen(8181,'0.0.0.0',()=>console.log('up'))"], { stdio: ["ignore", "pipe", "inherit"] });
    await new Promise((r) => extra!.stdout!.once("data", r));
    await ensure(c, "flaky", [`${target.ip}:8181`]);
    await c.waitFor("a ready machine", async () => (await c.readyCount("flaky")) >= 1);
    const b = await c.api.call<Borrow>("POST", "/v1/pools/flaky/borrow", {});
    extra.kill("SIGKILL");
    await new Promise((r) => extra!.once("exit", r));
    await c.api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
    const gone = await c.waitFor("the machine quarantined", async () => {
      const m = (await c.machines()).find((x) => x.id === b.machine.id)!;
      return ["quarantined", "destroying", "destroyed"].includes(m.state) ? m : null;
    });
    assert.ok(gone);
    const p = await c.api.call<PoolShow>("GET", "/v1/pools/flaky");
    const rec = p.networks.find((m) => m.id === b.machine.id);
    if (rec) assert.equal(rec.evidence?.result, "fail");
  });
  test("rules deleted while a machine waits: it is never lent; quarantined with what changed in its timeline", async () => {
    // The agent's slots go to this pool (the pools of the tests before are drained).
    for (const p of ["net", "flaky"]) await c.api.call("POST", `/v1/pools/${p}/drain`, { force: true }).catch(() => undefined);
    await ensure(c, "tamper", [`${target.ip}:${target.allowedPort}`]);
    const ready = await c.waitFor("a ready machine", async () => {
      const p = await c.api.call<PoolShow>("GET", "/v1/pools/tamper");
      return p.networks.find((m) => m.state === "ready" && m.evidence?.result === "pass") ?? null;
    }, 90_000);
    // The machine's table, named as the agent names it (src/agent/network/manager.ts).
    const stateDir = resolve(c.agentDir);
    const hex = (s: string, n: number): string => createHash("sha256").update(s).digest("hex").slice(0, n);
    const table = `berth_${hex(stateDir, 4)}_${hex(`${stateDir}\0${ready.id}`, 8)}`;
    execFileSync("nft", ["delete", "table", "inet", table]);
    let lent: Borrow | null = null;
    try {
      lent = await c.api.call<Borrow>("POST", "/v1/pools/tamper/borrow", {});
    } catch (e) {
      assert.match(String(e), /pool_exhausted/, "no other machine: the borrow is refused, not answered with the tampered one");
    }
    assert.notEqual(lent?.machine.id, ready.id, "the machine whose rules were deleted is never lent");
    const gone = await c.waitFor("the tampered machine quarantined", async () => {
      const m = (await c.machines()).find((x) => x.id === ready.id)!;
      return ["quarantined", "destroying", "destroyed"].includes(m.state) ? m : null;
    }, 60_000);
    assert.ok(gone);
    const { SqliteStore } = await import("../../src/store/sqlite/sqlite-store.js");
    const s = new SqliteStore({ path: join(c.coordDir, "berth.db") });
    try {
      const trail = await s.transaction((tx) => tx.all<{ event: string; to_state: string; detail: string | null }>("SELECT event, to_state, detail FROM audit WHERE machine_id = ? ORDER BY seq", [ready.id]));
      const q = trail.find((t) => t.event === "quarantine");
      assert.ok(q, JSON.stringify(trail));
      assert.match(q.detail ?? "", /lend-time check: network rules not as recorded: .*table .* is gone/);
      const borrows = await s.transaction((tx) => tx.all<{ state: string; reason: string }>("SELECT state, reason FROM borrows WHERE machine_id = ?", [ready.id]));
      assert.deepEqual(borrows.map((b) => b.state), ["withdrawn"], "the borrow that took it was withdrawn before any answer");
    } finally {
      await s.close();
    }
    if (lent) await c.api.call("POST", `/v1/borrows/${lent.borrowId}/return`, { token: lent.borrowToken });
  });

  test("allow lists are validated where they are written: entries the deny list always wins over are refused, 0.0.0.0/0 is accepted", async () => {
    const refused = async (allow: string[], why: RegExp): Promise<void> => {
      await assert.rejects(ensure(c, "allowcheck", allow), (e: Error) => {
        assert.match(String(e.message), /invalid_request/);
        assert.match(String(e.message), why);
        return true;
      });
    };
    await refused([`${target.ip}:25`], /opens only SMTP/);
    await refused(["203.0.113.7:587"], /opens only SMTP/);
    await refused(["10.213.0.5:80"], /lies in the machine range 10\.213\.0\.0\/16/);
    await refused(["169.254.169.254:80"], /platform deny list/);
    await refused(["127.0.0.1:80"], /platform deny list/);
    // All public addresses (private ranges stay refused): the agent provisions it and the probe passes.
    await c.api.call("POST", "/v1/pools/tamper/drain", { force: true }).catch(() => undefined);
    await ensure(c, "allowcheck", ["0.0.0.0/0"]);
    await c.waitFor("a ready machine of 0.0.0.0/0", async () => (await c.readyCount("allowcheck")) >= 1, 90_000);
  });

  test("an allow entry naming an enrolled host's own (non-loopback) address is refused at ensure, and nothing changes", async () => {
    // A second agent on an address of a veth made here (TEST-NET-2: no private range, so only the host rule can refuse it).
    const link = `bh${process.pid.toString(36).slice(-6)}`;
    const addr = `198.51.100.${10 + (process.pid % 200)}`;
    const other = `198.51.100.${addr.endsWith(".9") ? 8 : 9}`;
    const hostPolicy = async (pool: string, allow: string): Promise<void> => {
      await c.api.call("POST", `/v1/pools/${pool}/ensure`, {
        minReady: 0, maxReady: 1, compatibilityKey: "e2e", access: "keeper", provider: "hosts", keeperKey: c.keeper.publicKey,
        network: { mode: "egress", allow: [allow], dns: [] },
      });
    };
    execFileSync("ip", ["link", "add", link, "type", "veth", "peer", "name", `${link}p`]);
    let second: Awaited<ReturnType<typeof startProcess>> | null = null;
    try {
      execFileSync("ip", ["addr", "add", `${addr}/32`, "dev", link]);
      execFileSync("ip", ["link", "set", `${link}p`, "up"]);
      execFileSync("ip", ["link", "set", link, "up"]);
      // A pool that exists before the refused change (no machine asked for).
      await hostPolicy("hostaddr", `${other}:443`);
      const tokenFile = join(c.dir.path, "agent-hostaddr.token");
      const made = berthSync(["token", "create", "--state-dir", c.coordDir, "--org", "e2e", "--role", "agent", "--out", tokenFile]);
      assert.equal(made.status, 0, made.stderr);
      second = await startProcess(
        [
          "agent", "--state-dir", join(c.dir.path, "agent-hostaddr"), "--coordinator", c.coordinator!.url, "--enroll-token-file", tokenFile,
          "--runtime", "process", "--slots", "1", "--name", "e2e-hostaddr", "--log-level", "warn", "--listen", `${addr}:0`, "--ssh-listen", `${addr}:0`,
        ],
        {},
        /berth agent ready/,
      );
      extra = second.child;
      const hosts = await c.api.call<{ hosts: Array<{ name: string; url: string }> }>("GET", "/v1/hosts");
      assert.ok(hosts.hosts.some((h) => h.name === "e2e-hostaddr" && new URL(h.url).hostname === addr), `the second agent is enrolled by ${addr}: ${JSON.stringify(hosts)}`);
      const before = await c.api.call<PoolShow>("GET", "/v1/pools/hostaddr");
      const named = new RegExp(`names the address of an enrolled host \\(${addr.replaceAll(".", "\\.")}\\)`);
      // Through the command a person types: the stable code, the rule named; the pool keeps its policy.
      const r = berthSync(["pool", "ensure", "hostaddr", "--min-ready", "1", "--max-ready", "2", "--compatibility-key", "e2e", "--network", "egress", "--allow", `${addr}:22`, "--config", c.clientConfig]);
      assert.notEqual(r.status, 0, r.stdout);
      assert.match(r.stderr, /invalid_request/);
      assert.match(r.stderr, named);
      // A first ensure of a new pool: refused the same way, and no pool is made.
      await assert.rejects(hostPolicy("hostaddrnew", `${addr}:22`), (e: Error) => /invalid_request/.test(e.message) && named.test(e.message));
      await assert.rejects(c.api.call("GET", "/v1/pools/hostaddrnew"), /not_found/);
      const after = await c.api.call<PoolShow>("GET", "/v1/pools/hostaddr");
      assert.equal(after.network.fingerprint, before.network.fingerprint, "the existing pool keeps its policy");
      // A neighbouring address of the same range is no host's: accepted.
      await hostPolicy("hostaddr", `${other}:22`);
      assert.notEqual((await c.api.call<PoolShow>("GET", "/v1/pools/hostaddr")).network.fingerprint, before.network.fingerprint);
    } finally {
      if (second) await stopProcess(second);
      extra = null;
      execFileSync("ip", ["link", "del", link], { stdio: "ignore" });
    }
  });
});
