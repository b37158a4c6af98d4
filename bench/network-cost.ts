/**
 * The cost of a network policy on a machine's cycle: network `none` vs
 * `egress` (own namespace, veth, nftables table, probe from inside before
 * every ready), per runtime, on a real deployment (`berth serve` + `berth
 * agent` + a keeper pool of 2), with a target server in a test namespace
 * (test/helpers/netns-target.ts; nothing leaves this machine).
 *
 *   borrow → first byte : POST borrow, SSH, first output byte of `echo ok`
 *   return → ready      : POST return until the machine is ready again
 *                         (fence + scrub, and for egress: rules reloaded + probe)
 *   provision → ready   : ensure of a fresh pool of 1 until its machine is ready
 *                         (for egress: namespace, veth, table, probe)
 *
 * Usage: node dist/bench/network-cost.js [--runs 30] [--runtimes process,gvisor]
 * Needs root, `ip` and `nft` (skipped with the reason otherwise).
 */
import { arg, dist, printTable, writeResult, type Dist } from "./lib.js";
import { ensureHostsPool, firstByte, networkBenchRuntimes, sshTo, startCluster, waitMachineReady, waitReadyCount, type Borrowed, type Runtime } from "./cluster.js";
import { Api } from "../src/cli/api.js";
import { startNetnsTarget } from "../test/helpers/netns-target.js";

const runs = Number(arg("runs", "30"));
const { runtimes, skipped } = networkBenchRuntimes();

interface Row {
  runtime: Runtime;
  network: "none" | "egress";
  provisionToReady: Dist;
  borrowToFirstByte: Dist;
  returnToReady: Dist;
  probeMs: Dist;
}

const target = await startNetnsTarget();
const rows: Row[] = [];
try {
  for (const runtime of runtimes) {
    const c = await startCluster({
      engine: "sqlite", runtime, slots: 4,
      agentArgs: ["--network-resolver", target.ip, "--network-probe-deny", `${target.ip}:${target.deniedPort}`, "--network-probe-refused-resolver", target.ip],
    });
    try {
      for (const network of ["none", "egress"] as const) {
        const policy = network === "none" ? { mode: "none" } : { mode: "egress", allow: [`${target.ip}:${target.allowedPort}`, `target.test:${target.allowedPort}`], dns: [] };
        const provision: number[] = [];
        for (let i = 0; i < 3; i++) {
          const pool = `p${network}${i}`;
          const t0 = performance.now();
          await ensureHostsPool(c, pool, "keeper", 1, { network: policy });
          provision.push(performance.now() - t0);
          await c.admin.call("POST", `/v1/pools/${pool}/drain`, { force: true });
        }
        const pool = `cycle${network}`;
        await ensureHostsPool(c, pool, "keeper", 2, { network: policy });
        const api = new Api(c.coord.url, await c.coord.token("member"), { connections: 1 });
        const first: number[] = [];
        const ready: number[] = [];
        for (let i = 0; i < runs; i++) {
          await waitReadyCount(c, pool, 1, 60_000);
          const t0 = performance.now();
          const b = await api.call<Borrowed>("POST", `/v1/pools/${pool}/borrow`, {});
          const client = await sshTo(b, c.keeper.privateKey);
          first.push((await firstByte(client, "echo ok")) - t0);
          client.end();
          const t1 = performance.now();
          await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
          const state = await waitMachineReady(c, b.machine.id, 60_000);
          if (state !== "ready") throw new Error(`machine ${b.machine.id} ended ${state}`);
          ready.push(performance.now() - t1);
        }
        const shown = await api.call<{ networks: Array<{ evidence: { durationMs: number } | null }> }>("GET", `/v1/pools/${pool}`);
        const probe = shown.networks.map((m) => m.evidence?.durationMs).filter((x): x is number => typeof x === "number");
        await api.close();
        await c.admin.call("POST", `/v1/pools/${pool}/drain`, { force: true });
        rows.push({ runtime, network, provisionToReady: dist(provision), borrowToFirstByte: dist(first), returnToReady: dist(ready), probeMs: dist(probe) });
        process.stderr.write(`${runtime}/${network}: done\n`);
      }
    } finally {
      await c.close();
    }
  }
} finally {
  await target.close();
}

printTable(
  `network none vs egress (ms; ${runs} borrow/return cycles, 3 provisions; p99 column is the max for provisions and probes)`,
  rows.flatMap((r) => [
    { runtime: r.runtime, network: r.network, step: "provision → ready (ensure of 1)", p50: r.provisionToReady.p50, p99: r.provisionToReady.max, n: r.provisionToReady.n },
    { runtime: r.runtime, network: r.network, step: "borrow → first byte", p50: r.borrowToFirstByte.p50, p99: r.borrowToFirstByte.p99, n: r.borrowToFirstByte.n },
    { runtime: r.runtime, network: r.network, step: "return → ready", p50: r.returnToReady.p50, p99: r.returnToReady.p99, n: r.returnToReady.n },
    ...(r.network === "egress" ? [{ runtime: r.runtime, network: r.network, step: "probe (from evidence)", p50: r.probeMs.p50, p99: r.probeMs.max, n: r.probeMs.n }] : []),
  ]),
);
const path = writeResult("network-cost", { runs, skipped, rows });
process.stdout.write(`\nwrote ${path}\n`);
