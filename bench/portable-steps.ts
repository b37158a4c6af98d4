/**
 * Where a portable borrow → active spends its time, step by step, on a real
 * deployment: `berth serve --portable` (SQLite) + one real `berth agent`
 * (process runtime), each loaded with bench/step-trace (HTTP requests in and
 * out, each COMMIT, the agent's transactions), and this process stamping
 * when it sends each request and reads each reply.
 *
 * One client, one cycle at a time: borrow → ack (→ active) → return, then
 * the machine's way back to ready (remove key, fence, scrub) is waited out
 * and a pause follows, so nothing of the previous cycle runs beside the
 * measured one. Each step is the time between two consecutive events of the
 * three processes; the table gives the median and the 10th/90th percentile
 * over the cycles whose events came in the most common order (the count
 * says how many). The load average at the start and end is printed with
 * it: on a shared machine the hops (one process waking another) move with it.
 *
 * Usage: node dist/bench/portable-steps.js [--cycles 40] [--pause-ms 100] [--machines 4]
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { arg, percentile, printTable, round, writeResult } from "./lib.js";
import { ensureHostsPool, sleep, startCluster, waitReadyCount, type Borrowed } from "./cluster.js";
import { generateSshKeyPair } from "../src/core/ssh-keys.js";

const cycles = Number(arg("cycles", "40"));
const pauseMs = Number(arg("pause-ms", "100"));
const machines = Number(arg("machines", "4"));

interface Ev {
  t: number;
  who: string;
  ev: string;
  what: string;
}

const at = () => performance.timeOrigin + performance.now();
const dir = mkdtempSync(join(tmpdir(), "berth-steps-"));
const preload = `--import=${new URL("./step-trace.js", import.meta.url).href}`;
process.env.BENCH_SERVE_NODE_ARGS = preload;
process.env.BENCH_AGENT_NODE_ARGS = preload;
process.env.BERTH_STEP_TRACE = dir;

const load0 = loadavg();
const cluster = await startCluster({ engine: "sqlite", runtime: "process", slots: machines + 2, portable: true });
const client: Ev[] = [];
const mark = (ev: string, what = "") => client.push({ t: at(), who: "client", ev, what });
const windows: Array<[number, number]> = [];
try {
  await ensureHostsPool(cluster, "p", "portable", machines);
  const api = cluster.admin;
  for (let i = 0; i < cycles + 2; i++) {
    const pair = generateSshKeyPair("bench-steps");
    const from = at();
    mark("send", "borrow");
    const b = await api.call<Borrowed>("POST", "/v1/pools/p/borrow", { access: "portable", publicKey: pair.publicKey });
    mark("reply", "borrow");
    mark("send", "ack");
    const r = await api.call<{ state: string }>("POST", `/v1/borrows/${b.borrowId}/ack`, { token: b.borrowToken, grantToken: b.grantToken, publicKey: pair.publicKey });
    mark("reply", "ack");
    if (r.state !== "active") throw new Error(`grant ${b.borrowId} is ${r.state} after its ack`);
    // The first two cycles warm both processes (statements prepared, connections made).
    if (i >= 2) windows.push([from, at()]);
    await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken, grantToken: b.grantToken });
    await waitReadyCount(cluster, "p", machines, 60_000);
    await sleep(pauseMs);
  }
} finally {
  await cluster.close();
}
const load1 = loadavg();

const all: Ev[] = [...client];
for (const f of readdirSync(dir)) {
  if (!f.endsWith(".jsonl")) continue;
  for (const line of readFileSync(join(dir, f), "utf8").split("\n")) if (line) all.push(JSON.parse(line) as Ev);
}
rmSync(dir, { recursive: true, force: true });
all.sort((a, b) => a.t - b.t);

/** A short name of an event: who, what, and the request it belongs to. */
function label(e: Ev): string {
  const path = e.what.replace(/\/v1\/borrows\/[^/]+\//, "/v1/borrows/ID/").replace(/\/machines\/[^/]+\//, "/machines/ID/");
  return `${e.who} ${e.ev}${path ? ` ${path}` : ""}`;
}

const sequences = new Map<string, number[][]>();
for (const [from, to] of windows) {
  const inside = all.filter((e) => e.t >= from && e.t <= to && !(e.who === "agent" && e.ev.startsWith("call")));
  const key = inside.map(label).join("\n");
  const gaps = inside.slice(1).map((e, i) => e.t - inside[i]!.t);
  if (!sequences.has(key)) sequences.set(key, []);
  sequences.get(key)!.push(gaps);
}
const [common, runs] = [...sequences.entries()].sort((a, b) => b[1].length - a[1].length)[0] ?? ["", []];
const names = common.split("\n");
const rows = names.slice(1).map((to, i) => {
  const s = runs.map((g) => g[i]!).sort((a, b) => a - b);
  return { from: names[i]!, to, "p50 ms": round(percentile(s, 50), 2), "p10 ms": round(percentile(s, 10), 2), "p90 ms": round(percentile(s, 90), 2) };
});
const totals = runs.map((g) => g.reduce((a, b) => a + b, 0)).sort((a, b) => a - b);
rows.push({ from: names[0]!, to: names[names.length - 1]!, "p50 ms": round(percentile(totals, 50), 2), "p10 ms": round(percentile(totals, 10), 2), "p90 ms": round(percentile(totals, 90), 2) });
const loads = `load average ${load0.map((x) => x.toFixed(1)).join(" ")} at start, ${load1.map((x) => x.toFixed(1)).join(" ")} at end`;
printTable(`portable borrow → active, step by step (${runs.length} of ${windows.length} cycles in this order; ${loads})`, rows);
for (const [key, r] of sequences) if (key !== common) process.stdout.write(`\nanother order (${r.length} cycles):\n  ${key.split("\n").join("\n  ")}\n`);
const path = writeResult("portable-steps", { cycles, pauseMs, machines, load: { start: load0, end: load1 }, inOrder: runs.length, rows });
process.stdout.write(`\n${path}\n`);
