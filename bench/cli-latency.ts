/**
 * What a person waits for at the prompt: in one run, alternating round by
 * round so load drifts hit every row alike,
 *   node -e 0                                        the floor: starting Node at all
 *   berth --version                                  the CLI's own start-up
 *   berth run -q --pool default -- true  (process)   borrow, SSH, exec, return
 *   berth run -q --pool default -- true  (gvisor)    the same on runsc sandboxes
 * each against a real `berth up` of that runtime, then the client library's
 * borrow -> exec(true) -> return in-process (process runtime).
 * Then where the library's SSH connect + exec goes, phase by phase (ssh2's
 * protocol trace, timestamped): TCP connect, version lines, key exchange,
 * authentication (the unsigned key probe, then the signed request), channel
 * open, exec request answered, command to exit status, channel closed.
 * Prints medians and ratios to `node -e 0`, writes bench/results/cli-latency-*.json.
 *
 *   node dist/bench/cli-latency.js [--rounds 9] [--lib-runs 31] [--phase-runs 31] [--runtimes process,gvisor]
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { readFileSync } from "node:fs";
import { BerthClient } from "../src/client/index.js";
import { loadConfig } from "../src/client/config.js";
import { connect } from "../src/client/ssh.js";
import { arg, BIN, dist, printTable, round, writeResult } from "./lib.js";
import { gvisorSkipReason } from "./cluster.js";

interface Up {
  runtime: string;
  dir: string;
  config: string;
  child: ChildProcess;
}

function startUp(runtime: "process" | "gvisor"): Promise<Up> {
  const dir = mkdtempSync(join(tmpdir(), `berth-cli-latency-${runtime}-`));
  const state = join(dir, ".berth");
  const child = spawn(process.execPath, [BIN, "up", "--state-dir", state, "--listen", "127.0.0.1:0", "--runtime", runtime, "--min-ready", "2", "--slots", "4"], {
    env: { ...process.env, BERTH_PG_URL: "", BERTH_LOG_LEVEL: "error" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`berth up (${runtime}) not up after 180 s:\n${out}`)), 180_000);
    const check = () => {
      if (!out.includes("berth is up")) return;
      clearTimeout(t);
      child.stdout!.off("data", check);
      resolve({ runtime, dir, config: join(state, "client.json"), child });
    };
    child.stdout!.on("data", check);
    child.once("exit", (code) => reject(new Error(`berth up (${runtime}) exited ${code}:\n${out}`)));
  });
}

async function stopUp(u: Up): Promise<void> {
  if (u.child.exitCode === null) {
    const exited = new Promise((r) => u.child.once("exit", r));
    u.child.kill("SIGINT");
    await exited;
  }
  rmSync(u.dir, { recursive: true, force: true });
}

const TIME = existsSync("/usr/bin/time") ? "/usr/bin/time" : null;

/**
 * Wall time of one process, start to exit (ms), and its CPU time (user +
 * system, ms; from /usr/bin/time when present, else NaN). CPU time is what
 * other load on the machine moves least. Throws if the process fails.
 */
function timed(argv: string[]): { wall: number; cpu: number } {
  const full = TIME ? [TIME, "-f", "BERTH-CPU %U %S", ...argv] : argv;
  const t0 = process.hrtime.bigint();
  const r = spawnSync(full[0]!, full.slice(1), { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, BERTH_PG_URL: "" } });
  const wall = Number(process.hrtime.bigint() - t0) / 1e6;
  const err = r.stderr.toString();
  if (r.status !== 0) throw new Error(`${argv.join(" ")} exited ${r.status}: ${err}`);
  const m = /BERTH-CPU ([\d.]+) ([\d.]+)/.exec(err);
  return { wall, cpu: m ? (Number(m[1]) + Number(m[2])) * 1000 : NaN };
}

const median = (xs: number[]) => dist(xs).p50;

/** The phases of one SSH connect + exec, in order: each ends at the first trace line matching its pattern. */
const PHASES: [string, RegExp][] = [
  ["tcp connect", /^Socket connected/],
  ["version lines", /^Remote ident/],
  ["key exchange", /^Handshake completed/],
  ["auth: key probe (PK_OK)", /^Inbound: Received USERAUTH_PK_OK/],
  ["auth: signed request", /^Inbound: Received USERAUTH_SUCCESS/],
  ["channel open", /^Inbound: CHANNEL_OPEN_CONFIRMATION/],
  ["exec request answered", /^Inbound: CHANNEL_SUCCESS/],
  ["command to exit status", /^Inbound: CHANNEL_REQUEST \(r:\d+, exit-status/],
  ["channel closed", /^Inbound: CHANNEL_CLOSE/],
];

/** One connect + exec(true) to a borrowed machine with ssh2's trace timestamped: ms per phase (NaN where a phase was not seen). */
async function tracedExec(target: Parameters<typeof connect>[0]): Promise<number[]> {
  const marks: { at: number; msg: string }[] = [];
  const t0 = performance.now();
  const conn = await connect(target, { debug: (msg) => marks.push({ at: performance.now(), msg }) });
  try {
    const sink = new (await import("node:stream")).PassThrough();
    sink.resume();
    const cmd = await conn.start("true", { stdout: sink, stderr: sink });
    const r = await cmd.done;
    if (r.status !== 0) throw new Error(`true exited ${r.status}`);
  } finally {
    conn.end();
  }
  const out: number[] = [];
  let prev = t0;
  for (const [, re] of PHASES) {
    const m = marks.find((x) => x.at >= prev && re.test(x.msg));
    if (!m) {
      out.push(NaN);
      continue;
    }
    out.push(m.at - prev);
    prev = m.at;
  }
  return out;
}

async function main(): Promise<void> {
  const rounds = Number(arg("rounds", "9"));
  const libRuns = Number(arg("lib-runs", "31"));
  const phaseRuns = Number(arg("phase-runs", "31"));
  let runtimes = arg("runtimes", "process,gvisor").split(",") as ("process" | "gvisor")[];
  const gvSkip = gvisorSkipReason();
  if (gvSkip && runtimes.includes("gvisor")) {
    process.stdout.write(`${gvSkip}\n`);
    runtimes = runtimes.filter((r) => r !== "gvisor");
  }
  const ups: Up[] = [];
  const loadStart = loadavg()[0]!;
  try {
    for (const rt of runtimes) ups.push(await startUp(rt));
    const rows: Record<string, { argv: string[]; samples: number[]; cpu: number[] }> = {
      "node -e 0": { argv: [process.execPath, "-e", "0"], samples: [], cpu: [] },
      "berth --version": { argv: [process.execPath, BIN, "--version"], samples: [], cpu: [] },
    };
    for (const u of ups) rows[`berth run -- true (${u.runtime})`] = { argv: [process.execPath, BIN, "run", "-q", "--config", u.config, "--pool", "default", "--", "true"], samples: [], cpu: [] };
    // One warm-up round (page cache, pool settled), then alternate.
    for (const r of Object.values(rows)) timed(r.argv);
    process.stdout.write(`measuring ${rounds} rounds…\n`);
    for (let i = 0; i < rounds; i++) {
      for (const r of Object.values(rows)) {
        const t = timed(r.argv);
        r.samples.push(t.wall);
        r.cpu.push(t.cpu);
      }
    }

    // The library, in-process: what an agent harness pays per command with no process per command.
    const proc = ups.find((u) => u.runtime === "process");
    const lib: { total: number[]; borrow: number[]; exec: number[]; ret: number[] } = { total: [], borrow: [], exec: [], ret: [] };
    if (proc) {
      const client = BerthClient.fromConfig({ config: proc.config });
      try {
        for (let i = 0; i < libRuns + 3; i++) {
          const t0 = performance.now();
          const b = await client.borrow({ pool: "default", waitMs: 10_000 });
          const t1 = performance.now();
          const r = await client.exec(b, "true");
          const t2 = performance.now();
          await client.return(b);
          const t3 = performance.now();
          if (r.status !== 0) throw new Error(`exec(true) exited ${r.status}`);
          if (i < 3) continue;
          lib.total.push(t3 - t0);
          lib.borrow.push(t1 - t0);
          lib.exec.push(t2 - t1);
          lib.ret.push(t3 - t2);
          // Let the returned machine be fenced and scrubbed, as between a harness's commands.
          await new Promise((r) => setTimeout(r, 100));
        }
      } finally {
        await client.close();
      }
    }

    // Where the SSH connect + exec goes: one borrow, a fresh connection per traced exec.
    const phases: number[][] = PHASES.map(() => []);
    const phaseTotal: number[] = [];
    if (proc && phaseRuns > 0) {
      const client = BerthClient.fromConfig({ config: proc.config });
      const cfg = loadConfig({ config: proc.config });
      const b = await client.borrow({ pool: "default", waitMs: 10_000 });
      try {
        const s = b.receipt.machine.ssh;
        const target = { host: s.host ?? "127.0.0.1", port: s.port ?? 22, user: s.user ?? b.receipt.machine.id, hostKey: s.hostKey ?? "", privateKey: readFileSync(cfg.keeperKeyFile!, "utf8") };
        for (let i = 0; i < phaseRuns + 3; i++) {
          const p = await tracedExec(target);
          if (i < 3) continue;
          p.forEach((ms, k) => phases[k]!.push(ms));
          phaseTotal.push(p.reduce((a, x) => a + (Number.isNaN(x) ? 0 : x), 0));
        }
      } finally {
        await client.return(b);
        await client.close();
      }
    }

    const floor = median(rows["node -e 0"]!.samples);
    const cpuFloor = median(rows["node -e 0"]!.cpu);
    const aims: Record<string, number> = { "berth --version": 1.5, "berth run -- true (process)": 2.5, "berth run -- true (gvisor)": 3.5 };
    const table: Record<string, string | number>[] = Object.entries(rows).map(([name, r]) => {
      const d = dist(r.samples);
      const cpu = median(r.cpu);
      return { what: name, p50_ms: round(d.p50, 1), min_ms: round(Math.min(...r.samples), 1), max_ms: round(Math.max(...r.samples), 1), ratio: round(d.p50 / floor, 2), aim: aims[name] ? `<= ${aims[name]}x` : "", cpu_p50_ms: round(cpu, 0), cpu_ratio: round(cpu / cpuFloor, 2) };
    });
    if (lib.total.length) {
      table.push({ what: "library borrow->exec(true)->return (process)", p50_ms: round(median(lib.total), 1), min_ms: round(Math.min(...lib.total), 1), max_ms: round(Math.max(...lib.total), 1), ratio: round(median(lib.total) / floor, 2), aim: "p50 <= 50 ms", cpu_p50_ms: "", cpu_ratio: "" });
    }
    printTable(`CLI latency: medians of ${rounds} alternating rounds (library: ${libRuns} runs)`, table);
    if (lib.total.length) {
      process.stdout.write(`library steps p50 (ms): borrow ${round(median(lib.borrow), 1)}, exec(true) incl. SSH connect ${round(median(lib.exec), 1)}, return ${round(median(lib.ret), 1)}\n`);
    }
    if (phaseTotal.length) {
      printTable(
        `SSH connect + exec(true) by phase, process runtime (${phaseRuns} connections; ms)`,
        [
          ...PHASES.map(([name], k) => {
            const xs = phases[k]!.filter((x) => !Number.isNaN(x));
            return { phase: name, p50_ms: xs.length ? round(median(xs), 2) : "not seen", min_ms: xs.length ? round(Math.min(...xs), 2) : "", max_ms: xs.length ? round(Math.max(...xs), 2) : "" };
          }),
          { phase: "total", p50_ms: round(median(phaseTotal), 2), min_ms: round(Math.min(...phaseTotal), 2), max_ms: round(Math.max(...phaseTotal), 2) },
        ],
      );
    }
    const file = writeResult("cli-latency", {
      sshPhases: phaseTotal.length ? Object.fromEntries(PHASES.map(([name], k) => [name, { p50: round(median(phases[k]!.filter((x) => !Number.isNaN(x))), 3), samples: phases[k]!.map((x) => round(x, 3)) }])) : null,
      rounds,
      libRuns,
      rows: Object.fromEntries(
        Object.entries(rows).map(([k, r]) => [k, { samples: r.samples.map((x) => round(x, 2)), p50: round(median(r.samples), 2), ratio: round(median(r.samples) / floor, 3), cpuSamples: r.cpu, cpuP50: median(r.cpu), cpuRatio: round(median(r.cpu) / cpuFloor, 3) }]),
      ),
      library: lib.total.length ? { p50: round(median(lib.total), 2), borrowP50: round(median(lib.borrow), 2), execP50: round(median(lib.exec), 2), returnP50: round(median(lib.ret), 2), samples: lib.total.map((x) => round(x, 2)) } : null,
      gvisor: gvSkip,
      // Other work on the machine moves every row; the ratios are what to compare.
      loadavg1m: { start: round(loadStart, 2), end: round(loadavg()[0]!, 2) },
    });
    process.stdout.write(`load average (1 min): ${round(loadStart, 2)} at start, ${round(loadavg()[0]!, 2)} at end\n`);
    process.stdout.write(`wrote ${file}\n`);
  } finally {
    for (const u of ups) await stopUp(u);
  }
}

await main();
