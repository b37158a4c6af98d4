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
 * Where the added time goes: the coordinator's berth_lend_check_seconds
 * (scraped before and after the measured rounds; means): `total` is its
 * request to the agent, answer read; `agent` the agent's own time (lock,
 * kernel identities, table read, compare); the rest of `total` is the
 * request's transport and the agent's event loop.
 *
 * `--settle all`: before each borrow every machine of the pool is ready (the
 * agent is idle: no scrub or probe of the returned sibling in flight);
 * `--settle one` (default): one ready machine is enough, so the returned
 * machine's scrub and, for `egress`, its re-probe run on the same agent
 * while the next borrow is checked.
 *
 * Usage: node dist/bench/lend-check.js [--runs 40] [--runtimes process,gvisor] [--settle one|all]
 * Needs root, `ip` and `nft` (skipped with the reason otherwise).
 */
import { arg, dist, printTable, round, writeResult, type Dist } from "./lib.js";
import { ensureHostsPool, networkBenchRuntimes, startCluster, waitReadyCount, type Borrowed, type Runtime } from "./cluster.js";
import { Api } from "../src/cli/api.js";
import { startNetnsTarget } from "../test/helpers/netns-target.js";

const runs = Number(arg("runs", "40"));
const settle = arg("settle", "one") === "all" ? 2 : 1;

/** The sums and counts of berth_lend_check_seconds by part, from the coordinator's /metrics. */
async function lendCheckSums(url: string): Promise<Record<"total" | "agent", { sum: number; count: number }>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const get = (part: string, what: "sum" | "count"): number => Number(new RegExp(`^berth_lend_check_seconds_${what}\\{part="${part}"\\} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
  return { total: { sum: get("total", "sum"), count: get("total", "count") }, agent: { sum: get("agent", "sum"), count: get("agent", "count") } };
}
const { runtimes, skipped } = networkBenchRuntimes();

interface Row {
  runtime: Runtime;
  none: Dist;
  egress: Dist;
  /** Per round: egress − none (ms). */
  added: Dist;
  /** Means over the measured rounds (ms) of the coordinator's request to the agent and of the agent's own part. */
  checkMean: number;
  agentMean: number;
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
        await waitReadyCount(c, pools[network], settle, 120_000);
        const t0 = performance.now();
        const b = await api.call<Borrowed>("POST", `/v1/pools/${pools[network]}/borrow`, {});
        t[network].push(performance.now() - t0);
        await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
      };
      for (let i = 0; i < 2; i++) for (const n of ["none", "egress"] as const) await borrow(n); // warm-up
      t.none.length = 0;
      t.egress.length = 0;
      const before = await lendCheckSums(c.coord.url);
      for (let i = 0; i < runs; i++) {
        for (const n of i % 2 === 0 ? (["none", "egress"] as const) : (["egress", "none"] as const)) await borrow(n);
      }
      await api.close();
      const after = await lendCheckSums(c.coord.url);
      const mean = (p: "total" | "agent"): number => (1000 * (after[p].sum - before[p].sum)) / Math.max(1, after[p].count - before[p].count);
      const added = t.egress.map((e, i) => e - (t.none[i] ?? e));
      rows.push({ runtime, none: dist(t.none), egress: dist(t.egress), added: dist(added), checkMean: mean("total"), agentMean: mean("agent") });
      process.stderr.write(`${runtime}: done\n`);
    } finally {
      await c.close();
    }
  }
} finally {
  await target.close();
}

printTable(
  `lend-time check: keeper borrow → active (ms; ${runs} alternating rounds per runtime, settle ${settle === 2 ? "all" : "one"}; added = median of per-round egress − none; check/agent = means of berth_lend_check_seconds)`,
  rows.map((r) => ({
    runtime: r.runtime,
    "none p50": round(r.none.p50, 2),
    "egress p50": round(r.egress.p50, 2),
    "added p50": round(r.added.p50, 2),
    "check mean": round(r.checkMean, 2),
    "agent mean": round(r.agentMean, 2),
    "none p99": round(r.none.p99, 2),
    "egress p99": round(r.egress.p99, 2),
    n: r.added.n,
  })),
);
const path = writeResult("lend-check", { runs, settle: settle === 2 ? "all" : "one", skipped, rows });
process.stdout.write(`\nwrote ${path}\n`);
