/**
 * The runtime itself, without coordinator or SSH: an old runsc against a new
 * one, alternating, medians and ratios in one run.
 *
 * Variants: `process` (the process runtime; steps only), `old runsc`
 * (`--old-runsc`, default /opt/runsc-20221219/runsc; `auto` picks ptrace
 * for it), `new runsc` (`--new-runsc`, default runsc on PATH; `auto` picks
 * kvm where /dev/kvm opens, else systrap), with `--new-ptrace` also the new
 * runsc forced onto ptrace (what the platform alone is worth), and `host`
 * (the workload run directly on this host; workload only).
 *
 * Per round (`--rounds`, default 3; the order of the variants rotates every
 * round), per variant, in a fresh state directory:
 *   steps    : `--steps` times (default 10): create; exec `echo ok` → first
 *              byte; two background `sleep`s started, then fence; scrub;
 *              a file written, then fenceAndScrub (return → ready); destroy
 *              (the rows of docs/runtimes.md's table);
 *   workload : once: 300 process spawns and `find /usr/lib -type f | wc -l`
 *              in one shell (inside the machine; on the host for `host`),
 *              timed from the exec to its exit.
 * Printed: each variant's median over rounds of the round's p50 per step,
 * the workload's median, and the ratios new / old (and host / new).
 *
 * Usage: node dist/bench/gvisor-workload.js [--rounds 3] [--steps 10] [--new-ptrace] [--no-steps]
 * Needs root and runsc (skipped with the reason otherwise).
 */
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { arg, dist, printTable, round, writeResult } from "./lib.js";
import { gvisorSkipReason } from "./cluster.js";
import { GvisorRuntime, ProcessRuntime, type ExecHandle, type Runtime } from "../src/agent/runtime/index.js";
import { findRunsc } from "../src/agent/runtime/gvisor-runsc.js";
import type { PlatformChoice } from "../src/agent/runtime/gvisor-platform.js";

export const WORKLOAD = "i=0; while [ $i -lt 300 ]; do /bin/true; i=$((i+1)); done; find /usr/lib -type f | wc -l";

interface Variant {
  name: string;
  make: ((stateDir: string) => Runtime) | null;
  steps: boolean;
  workload: boolean;
}

const median = (xs: number[]): number => {
  const s = [...xs].filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

async function run(h: ExecHandle, onFirst?: () => void): Promise<{ code: number | null; out: string }> {
  let out = "";
  h.stdout.once("data", () => onFirst?.());
  h.stdout.on("data", (d: Buffer) => (out += d.toString()));
  h.stderr.on("data", (d: Buffer) => (out += d.toString()));
  h.stdin.end();
  const { code } = await h.exited;
  return { code, out };
}

async function steps(rt: Runtime, n: number, tag: string): Promise<Record<string, number[]>> {
  const s: Record<string, number[]> = { create: [], "exec → first byte": [], fence: [], scrub: [], "fenceAndScrub (return → ready)": [], destroy: [] };
  for (let i = 0; i < n; i++) {
    const id = `m_${tag}_${i}`;
    let t = performance.now();
    await rt.create(id);
    s.create!.push(performance.now() - t);
    t = performance.now();
    let first = NaN;
    const echo = await run(await rt.exec(id, { argv: ["echo", "ok"], env: {} }), () => (first = performance.now() - t));
    if (echo.code !== 0) throw new Error(`echo exited ${echo.code}: ${echo.out}`);
    s["exec → first byte"]!.push(first);
    const bg = await run(await rt.exec(id, { argv: ["sh", "-c", "sleep 600 >/dev/null 2>&1 & sleep 600 >/dev/null 2>&1 & echo up"], env: {} }));
    if (bg.code !== 0) throw new Error(`background sleeps: ${bg.out}`);
    t = performance.now();
    await rt.fence(id);
    s.fence!.push(performance.now() - t);
    t = performance.now();
    await rt.scrub(id);
    s.scrub!.push(performance.now() - t);
    await run(await rt.exec(id, { argv: ["sh", "-c", "echo x > /workspace/left; echo y > /tmp/left"], env: {} }));
    t = performance.now();
    await rt.fenceAndScrub(id);
    s["fenceAndScrub (return → ready)"]!.push(performance.now() - t);
    t = performance.now();
    await rt.destroy(id);
    s.destroy!.push(performance.now() - t);
  }
  return s;
}

async function workloadIn(rt: Runtime, tag: string): Promise<number> {
  const id = `w_${tag}`;
  await rt.create(id);
  try {
    const t = performance.now();
    const r = await run(await rt.exec(id, { argv: ["sh", "-c", WORKLOAD], env: {} }));
    const ms = performance.now() - t;
    if (r.code !== 0 || !/^\d+\s*$/.test(r.out)) throw new Error(`workload exited ${r.code}: ${r.out.slice(0, 500)}`);
    return ms;
  } finally {
    await rt.destroy(id);
  }
}

async function workloadOnHost(): Promise<number> {
  const t = performance.now();
  const child = spawn("sh", ["-c", WORKLOAD], { stdio: ["ignore", "pipe", "inherit"] });
  child.stdout.resume();
  const code = await new Promise<number | null>((r) => child.once("exit", r));
  if (code !== 0) throw new Error(`workload on the host exited ${code}`);
  return performance.now() - t;
}

const gv = gvisorSkipReason();
if (gv) {
  process.stdout.write(`${gv}\n`);
  process.exit(0);
}
const rounds = Number(arg("rounds", "3"));
const nSteps = process.argv.includes("--no-steps") ? 0 : Number(arg("steps", "10"));
const oldRunsc = arg("old-runsc", "/opt/runsc-20221219/runsc");
const newRunsc = arg("new-runsc", findRunsc() ?? "runsc");
const gvisor = (runsc: string, platform: PlatformChoice = "auto") => (stateDir: string) => new GvisorRuntime({ stateDir, runsc, platform });
const variants: Variant[] = [
  { name: "process", make: (stateDir) => new ProcessRuntime({ stateDir }), steps: true, workload: false },
  ...(existsSync(oldRunsc) ? [{ name: "old runsc", make: gvisor(oldRunsc), steps: true, workload: true }] : []),
  { name: "new runsc", make: gvisor(newRunsc), steps: true, workload: true },
  ...(process.argv.includes("--new-ptrace") ? [{ name: "new runsc, ptrace", make: gvisor(newRunsc, "ptrace"), steps: false, workload: true }] : []),
  { name: "host", make: null, steps: false, workload: true },
];
if (!existsSync(oldRunsc)) process.stdout.write(`old runsc skipped: ${oldRunsc} does not exist (--old-runsc PATH)\n`);
const platforms: Record<string, string> = {};
const stepsBy: Record<string, Array<Record<string, number[]>>> = {};
const workBy: Record<string, number[]> = {};
const base = mkdtempSync(join(tmpdir(), "berth-bench-workload-"));
try {
  for (let r = 0; r < rounds; r++) {
    const order = variants.map((_, i) => variants[(i + r) % variants.length]!);
    for (const v of order) {
      process.stderr.write(`round ${r + 1}/${rounds}: ${v.name}\n`);
      if (!v.make) {
        (workBy[v.name] ??= []).push(await workloadOnHost());
        continue;
      }
      const dir = join(base, `${v.name.replace(/\W+/g, "-")}-${r}`);
      const rt = v.make(dir);
      if (rt instanceof GvisorRuntime) platforms[v.name] = `runsc ${rt.runscInfo.version} ${rt.runscInfo.platform}`;
      if (v.steps && nSteps > 0) (stepsBy[v.name] ??= []).push(await steps(rt, nSteps, String(r)));
      if (v.workload) (workBy[v.name] ??= []).push(await workloadIn(rt, String(r)));
      rmSync(dir, { recursive: true, force: true });
    }
  }
} finally {
  rmSync(base, { recursive: true, force: true });
}

const withSteps = variants.filter((v) => stepsBy[v.name]);
const stepRows = Object.keys(stepsBy[withSteps[0]?.name ?? ""]?.[0] ?? {}).map((step) => {
  const row: Record<string, string | number> = { step };
  const med: Record<string, number> = {};
  for (const v of withSteps) {
    const p50s = stepsBy[v.name]!.map((x) => dist(x[step]!).p50);
    med[v.name] = median(p50s);
    row[`${v.name} p50`] = round(med[v.name]!, 1);
    row[`${v.name} max`] = round(Math.max(...stepsBy[v.name]!.map((x) => dist(x[step]!).max)), 1);
  }
  if (med["old runsc"] !== undefined && med["new runsc"] !== undefined) row["new / old"] = round(med["new runsc"] / med["old runsc"], 2);
  return row;
});
printTable(`runtime steps (ms; medians over ${rounds} rotating rounds of each round's p50 of ${nSteps}; max over all)`, stepRows);
const workRows = variants
  .filter((v) => workBy[v.name])
  .map((v) => ({ variant: v.name, platform: platforms[v.name] ?? "—", "median ms": round(median(workBy[v.name]!), 0), runs: workBy[v.name]!.map((x) => Math.round(x)).join(" / ") }));
const newMed = median(workBy["new runsc"] ?? []);
const oldMed = median(workBy["old runsc"] ?? []);
const hostMed = median(workBy.host ?? []);
printTable(`workload: 300 spawns + find /usr/lib -type f | wc -l (ms; ${rounds} rotating rounds)`, workRows);
process.stdout.write(`\nratios: new / old ${round(newMed / oldMed, 3)} (old is ${round(oldMed / newMed, 2)}× slower); new / host ${round(newMed / hostMed, 2)}; old / host ${round(oldMed / hostMed, 2)}\n`);
const path = writeResult("gvisor-workload", { rounds, steps: nSteps, platforms, stepsBy, workBy, stepRows, workRows, load: (await import("node:os")).loadavg() });
process.stdout.write(`wrote ${path}\n`);
