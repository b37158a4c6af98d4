/**
 * One machine's cycle per runtime, on a real deployment: `berth serve`
 * (SQLite) + a real `berth agent` + a hosts-provider keeper pool of 2.
 *
 * Per run, in this process (the same steps `berth run` takes: borrow over
 * HTTP, SSH with the keeper key and the pinned host key, exec, return):
 *   borrow → SSH ready   : POST borrow until the SSH handshake is done
 *   borrow → first byte  : until the first output byte of `echo ok`
 *   return → ready       : POST return until the machine is `ready` again in
 *                          the store (polled every 2 ms; fence + scrub done)
 * and, for a smaller number of runs, the real binary: `berth run --pool rt
 * -- echo ok` spawned, timed to its first stdout byte and to its exit
 * (includes Node start-up of the CLI).
 *
 * Usage: node dist/bench/runtime-cycle.js [--runs 200] [--cli-runs 20] [--runtimes process,gvisor]
 * gvisor is skipped with the reason unless runsc is installed and we are root.
 *
 * Two builds of the same gvisor machine, alternating, in one run
 * (`--compare`; bench/runtime-compare.ts):
 *   --compare runsc [--old-runsc PATH] [--new-runsc PATH]: the agent on an
 *     old runsc (default /opt/runsc-20221219/runsc, ptrace) and on a new one
 *     (default runsc on PATH, its fastest platform);
 *   --compare image: pools of the host's root and of an OCI image (busybox +
 *     perl, written by the bench), both on the runsc on PATH; plus the first
 *     boot of an image the agent has not seen (pull + unpack + boot).
 * Each of `--rounds` rounds (default 3, the order flipping each round)
 * starts a fresh `berth serve` + `berth agent` per variant and measures
 * create (ensure a pool of 1 → the machine ready, then drained; `--creates`
 * times), and `--runs` cycles of borrow → first byte and return → ready.
 * Printed: per variant the median over rounds of each round's p50, and the
 * ratio of the second variant to the first.
 */
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { arg, dist, printTable, writeResult, type Dist } from "./lib.js";
import { ensureHostsPool, firstByte, gvisorSkipReason, sshTo, startCluster, waitMachineReady, waitReadyCount, type BenchCluster, type Borrowed, type Runtime } from "./cluster.js";
import { Api } from "../src/cli/api.js";

const compare = arg("compare", "");
if (compare !== "") {
  const { runCompare } = await import("./runtime-compare.js");
  await runCompare(compare);
  process.exit(0);
}
const runs = Number(arg("runs", "200"));
const cliRuns = Number(arg("cli-runs", "20"));
let runtimes = arg("runtimes", "process,gvisor").split(",") as Runtime[];
const skipped: string[] = [];
const gv = gvisorSkipReason();
if (gv && runtimes.includes("gvisor")) {
  process.stdout.write(`${gv}\n`);
  skipped.push(gv);
  runtimes = runtimes.filter((r) => r !== "gvisor");
}

interface Result {
  runtime: Runtime;
  runs: number;
  borrowToSsh: Dist;
  borrowToFirstByte: Dist;
  returnToReady: Dist;
  notReady: Record<string, number>;
  cli: { runs: number; spawnToFirstByte: Dist; spawnToExit: Dist };
}

async function cliRun(c: BenchCluster, config: string): Promise<{ first: number; exit: number }> {
  const t0 = performance.now();
  const child = spawn(process.execPath, [join("bin", "berth"), "run", "--config", config, "--pool", "rt", "-q", "--", "echo", "ok"], { stdio: ["ignore", "pipe", "inherit"] });
  let first = NaN;
  child.stdout.once("data", () => (first = performance.now() - t0));
  const code = await new Promise<number | null>((r) => child.once("exit", r));
  if (code !== 0) throw new Error(`berth run exited ${code}`);
  void c;
  return { first, exit: performance.now() - t0 };
}

const results: Result[] = [];
for (const runtime of runtimes) {
  const c = await startCluster({ engine: "sqlite", runtime, slots: 4 });
  try {
    await ensureHostsPool(c, "rt", "keeper", 2);
    const api = new Api(c.coord.url, await c.coord.token("member"), { connections: 1 });
    const ssh: number[] = [];
    const first: number[] = [];
    const ready: number[] = [];
    const notReady: Record<string, number> = {};
    for (let i = 0; i < runs; i++) {
      await waitReadyCount(c, "rt", 1, 30_000);
      const t0 = performance.now();
      const b = await api.call<Borrowed>("POST", "/v1/pools/rt/borrow", {});
      const client = await sshTo(b, c.keeper.privateKey);
      ssh.push(performance.now() - t0);
      first.push((await firstByte(client, "echo ok")) - t0);
      client.end();
      const t1 = performance.now();
      await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
      const state = await waitMachineReady(c, b.machine.id, 30_000);
      if (state === "ready") ready.push(performance.now() - t1);
      else notReady[state] = (notReady[state] ?? 0) + 1;
      if (state !== "ready") await waitReadyCount(c, "rt", 2, 60_000);
    }
    await api.close();
    const config = join(c.coord.dir, "client.json");
    const tokenFile = join(c.coord.dir, "member.token");
    const keyFile = join(c.coord.dir, "keeper_ed25519");
    writeFileSync(tokenFile, (await c.coord.token("member")) + "\n", { mode: 0o600 });
    writeFileSync(keyFile, c.keeper.privateKey, { mode: 0o600 });
    writeFileSync(config, JSON.stringify({ url: c.coord.url, tokenFile, keeperKeyFile: keyFile }), { mode: 0o600 });
    const cliFirst: number[] = [];
    const cliExit: number[] = [];
    for (let i = 0; i < cliRuns; i++) {
      await waitReadyCount(c, "rt", 2, 30_000);
      const r = await cliRun(c, config);
      cliFirst.push(r.first);
      cliExit.push(r.exit);
    }
    results.push({
      runtime,
      runs,
      borrowToSsh: dist(ssh),
      borrowToFirstByte: dist(first),
      returnToReady: dist(ready),
      notReady,
      cli: { runs: cliRuns, spawnToFirstByte: dist(cliFirst), spawnToExit: dist(cliExit) },
    });
    process.stderr.write(`${runtime}: done\n`);
  } finally {
    await c.close();
  }
}

printTable(
  `machine cycle per runtime (ms; ${runs} runs in-process, ${cliRuns} runs of the real \`berth run\`)`,
  results.flatMap((r) => [
    { runtime: r.runtime, step: "borrow → SSH ready", p50: r.borrowToSsh.p50, p99: r.borrowToSsh.p99, max: r.borrowToSsh.max, n: r.borrowToSsh.n },
    { runtime: r.runtime, step: "borrow → first byte (in-process)", p50: r.borrowToFirstByte.p50, p99: r.borrowToFirstByte.p99, max: r.borrowToFirstByte.max, n: r.borrowToFirstByte.n },
    { runtime: r.runtime, step: "return → ready", p50: r.returnToReady.p50, p99: r.returnToReady.p99, max: r.returnToReady.max, n: r.returnToReady.n },
    { runtime: r.runtime, step: "`berth run` spawn → first byte", p50: r.cli.spawnToFirstByte.p50, p99: r.cli.spawnToFirstByte.p99, max: r.cli.spawnToFirstByte.max, n: r.cli.spawnToFirstByte.n },
    { runtime: r.runtime, step: "`berth run` spawn → exit", p50: r.cli.spawnToExit.p50, p99: r.cli.spawnToExit.p99, max: r.cli.spawnToExit.max, n: r.cli.spawnToExit.n },
  ]),
);
for (const r of results) if (Object.keys(r.notReady).length) process.stdout.write(`${r.runtime}: returns that did not end ready: ${JSON.stringify(r.notReady)}\n`);
const path = writeResult("runtime-cycle", { runs, cliRuns, skipped, results });
process.stdout.write(`\nwrote ${path}\n`);
