/**
 * The cost of the lend-time network check on a keeper borrow: borrow → active
 * (POST /v1/pools/{pool}/borrow until its answer: the borrow is committed,
 * the key installed and, for a pool with a policy, the machine's live ruleset
 * and namespace compared with the recorded ones — docs/network.md "The
 * lend-time check") for a pool with network `egress` (checked) and one with
 * `none` (no check; otherwise the same path), per runtime, on a real
 * deployment (`berth serve` + `berth agent`), two machines per pool, with a
 * target server in a test namespace (nothing leaves this machine).
 *
 * The two pools are borrowed alternately in one run (order flipped every
 * round), so the shared host's noise falls on both; the figure is the median
 * of the per-round differences (egress − none) next to both medians.
 *
 * Usage: node dist/bench/lend-check.js [--runs 40] [--runtimes process,gvisor]
 * Needs root, `ip` and `nft` (skipped with the reason otherwise).
 */
import { arg, dist, printTable, round, writeResult, type Dist } from "./lib.js";
import { ensureHostsPool, networkBenchRuntimes, startCluster, waitReadyCount, type Borrowed, type Runtime } from "./cluster.js";
import { Api } from "../src/cli/api.js";
import { startNetnsTarget } from "../test/helpers/netns-target.js";

const runs = Number(arg("runs", "40"));
const { runtimes, skipped } = networkBenchRuntimes();

interface Row {
  runtime: Runtime;
  none: Dist;
  egress: Dist;
  /** Per round: egress − none (ms). */
  added: Dist;
}

const target = await startNetnsTarget();
const rows: Row[] = [];
try {
  for (const runtime of runtimes) {
    const c = await startCluster({
      engine: "sqlite", runtime, slots: 6,
      agentArgs: ["--network-resolver", target.ip, "--network-probe-deny", `${target.ip}:${target.deniedPort}`, "--network-probe-refused-resolver", target.ip],
    });
    try {
      const pools = { none: "lcnone", egress: "lcegress" } as const;
      await ensureHostsPool(c, pools.none, "keeper", 2, { network: { mode: "none" } });
      await ensureHostsPool(c, pools.egress, "keeper", 2, { network: { mode: "egress", allow: [`${target.ip}:${target.allowedPort}`], dns: [] } });
      const api = new Api(c.coord.url, await c.coord.token("member"), { connections: 1 });
      const t: Record<"none" | "egress", number[]> = { none: [], egress: [] };
      const borrow = async (network: "none" | "egress"): Promise<void> => {
        await waitReadyCount(c, pools[network], 1, 120_000);
        const t0 = performance.now();
        const b = await api.call<Borrowed>("POST", `/v1/pools/${pools[network]}/borrow`, {});
        t[network].push(performance.now() - t0);
        await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
      };
      for (let i = 0; i < 2; i++) for (const n of ["none", "egress"] as const) await borrow(n); // warm-up
      t.none.length = 0;
      t.egress.length = 0;
      for (let i = 0; i < runs; i++) {
        for (const n of i % 2 === 0 ? (["none", "egress"] as const) : (["egress", "none"] as const)) await borrow(n);
      }
      await api.close();
      const added = t.egress.map((e, i) => e - (t.none[i] ?? e));
      rows.push({ runtime, none: dist(t.none), egress: dist(t.egress), added: dist(added) });
      process.stderr.write(`${runtime}: done\n`);
    } finally {
      await c.close();
    }
  }
} finally {
  await target.close();
}

printTable(
  `lend-time check: keeper borrow → active (ms; ${runs} alternating rounds per runtime; added = median of per-round egress − none)`,
  rows.map((r) => ({
    runtime: r.runtime,
    "none p50": round(r.none.p50, 2),
    "egress p50": round(r.egress.p50, 2),
    "added p50": round(r.added.p50, 2),
    "none p99": round(r.none.p99, 2),
    "egress p99": round(r.egress.p99, 2),
    n: r.added.n,
  })),
);
const path = writeResult("lend-check", { runs, skipped, rows });
process.stdout.write(`\nwrote ${path}\n`);
