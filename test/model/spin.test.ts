/**
 * The grant protocol model (model/grant.pml), checked exhaustively by SPIN
 * through scripts/check-model.sh (see docs/protocol-model.md):
 *
 *   - every machine edge the model takes is one `machineTransition` accepts
 *     (the model cannot drift from src/core/machine.ts);
 *   - the full model reports 0 errors at every bound configuration;
 *   - every deliberately broken variant (mutant) is caught by the invariant
 *     it breaks, and every witness scenario is reachable (the checked state
 *     space is not vacuous).
 *
 * Skipped, with the reason, where spin or gcc is not installed.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { MACHINE_STATES, machineTransition, type MachineEvent, type MachineState } from "../../src/core/machine.js";

// dist/test/model/spin.test.js -> repository root
const ROOT = fileURLToPath(new URL("../../../", import.meta.url));
const MODEL = join(ROOT, "model", "grant.pml");
const SCRIPT = join(ROOT, "scripts", "check-model.sh");

/** Mutant -> the assertions (invariants) allowed to catch it; SPIN stops at the first one its search meets. */
const MUTANTS: Record<string, string[]> = {
  MUTANT_SPLIT_RETURN_TX: ["inv1_one_grant"],
  MUTANT_PARALLEL_REMOVE_FENCE: ["inv1_ready_clean"],
  MUTANT_ACTIVATE_BEFORE_CONFIRM: ["inv2_confirmed_by_provider"],
  MUTANT_NO_REVALIDATION: ["inv2_revalidated_unexpired"],
  MUTANT_EXPIRY_INCLUSIVE: ["inv3_expired_at_equality", "inv2_revalidated_unexpired"],
  MUTANT_AGENT_EXPIRY_INCLUSIVE: ["inv3_expired_at_equality"],
  MUTANT_NO_AGENT_EXPIRY: ["inv3_expired_at_equality"],
  MUTANT_HEARTBEAT_EXTENDS: ["inv3_expires_at_immutable"],
  MUTANT_SKIP_GENERATION_CHECK: ["inv4_exact_generation"],
  MUTANT_AGENT_NO_TOMBSTONE: ["inv4_no_old_key"],
  MUTANT_AGENT_VOLATILE_TOMBSTONE: ["inv4_no_old_key"],
  MUTANT_BLIND_REINSTALL: ["inv4_no_blind_reinstall"],
  MUTANT_READY_WITHOUT_FENCE: ["inv5_removed_fenced_scrubbed"],
  MUTANT_VOLATILE_CLEANUP_INTENT: ["inv6_ready_only_via_cleanup"],
  MUTANT_ACK_TIMEOUT_READY: ["inv6_ready_only_via_cleanup"],
  MUTANT_LATE_HEARTBEAT_REVIVES: ["inv6_no_revival"],
};

const WITNESSES = [
  "WITNESS_REUSE",
  "WITNESS_SESSION",
  "WITNESS_STALE_COMPLETION",
  "WITNESS_DUPLICATE_COMPLETION",
  "WITNESS_INSTALL_REFUSED",
  "WITNESS_EXPIRY_CUT_WHILE_DOWN",
  "WITNESS_RESTART_RESUMES_CLEANUP",
  "WITNESS_QUARANTINE_DESTROYED",
];

function missingTool(): string | null {
  for (const [cmd, args] of [["spin", ["-V"]], ["gcc", ["--version"]]] as const) {
    const r = spawnSync(cmd, [...args], { encoding: "utf8" });
    if (r.error) return `${cmd}: ${(r.error as NodeJS.ErrnoException).code ?? r.error.message}`;
  }
  return null;
}

/** Runs check-model.sh without blocking, so the full check and the mutants run side by side (each is mostly one core). */
function runScript(args: string[], timeoutMs: number, env: Record<string, string> = {}): Promise<{ status: number | null; out: string }> {
  return new Promise((resolveRun) => {
    const child = spawn("bash", [SCRIPT, ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"], detached: true });
    let stdout = "";
    let stderr = "";
    let timedOut = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    // The script's whole group (spin, gcc, pan) goes on a timeout.
    const timer = setTimeout(() => {
      timedOut = `\ntimed out after ${timeoutMs} ms`;
      try {
        process.kill(-child.pid!, "SIGKILL");
      } catch {
        // gone already
      }
    }, timeoutMs);
    child.once("error", (e) => {
      clearTimeout(timer);
      resolveRun({ status: null, out: `${stdout}${stderr}\n${e.message}` });
    });
    child.once("close", (status) => {
      clearTimeout(timer);
      resolveRun({ status, out: `${stdout}${stderr}${timedOut}` });
    });
  });
}

function eventOf(spec: string): MachineEvent {
  const [kind, mode] = spec.split(":");
  switch (kind) {
    case "reserve":
      return { kind: "reserve", mode: mode === "keeper" ? "keeper" : "portable" };
    case "return":
      return { kind: "return", mode: mode === "keeper" ? "keeper" : "portable", scrub: true };
    case "quarantine":
    case "drain":
      return { kind, reason: "model" };
    case "registered":
    case "install_started":
    case "install_confirmed":
    case "revoked":
    case "fenced":
    case "scrubbed":
    case "destroy_started":
    case "destroyed":
      return { kind };
    default:
      throw new Error(`unknown event '${spec}' in an @edge annotation`);
  }
}

describe("grant protocol model (SPIN)", () => {
  const source = readFileSync(MODEL, "utf8");
  const missing = missingTool();
  // Both checks start at once: the full model's runs go one at a time (each verifier is single-threaded),
  // so the mutants take the other cores meanwhile.
  const full = missing ? null : runScript([], 290_000);
  const mutants = missing ? null : runScript(["--mutants"], 290_000, { CHECK_MODEL_JOBS: String(Math.max(1, availableParallelism() - 1)) });

  test("every machine edge of the model is one machineTransition accepts", () => {
    const edges = [...source.matchAll(/@edge\s+(\S+)\s+([a-z_]+)->([a-z_]+)/g)];
    assert.ok(edges.length >= 15, `expected the model's edges to be annotated, found ${edges.length}`);
    for (const [, ev, from, to] of edges) {
      assert.ok(MACHINE_STATES.includes(from as MachineState), `@edge ${ev} ${from}->${to}: '${from}' is not a MachineState`);
      const t = machineTransition({ state: from as MachineState, generation: 1, stateSince: 0, readySince: null, reason: null }, eventOf(ev!), 1);
      assert.ok(t.ok, `@edge ${ev} ${from}->${to}: machineTransition refuses it (${t.ok ? "" : t.why})`);
      assert.equal(t.machine.state, to, `@edge ${ev} ${from}->${to}: machineTransition goes to ${t.machine.state}`);
    }
    // Every machine state constant of the model names a MachineState.
    for (const [, name] of source.matchAll(/#define M_([A-Z]+)\s+\d+/g)) {
      assert.ok(MACHINE_STATES.includes(name!.toLowerCase() as MachineState), `model state M_${name} is not a MachineState`);
    }
  });

  test("the full model: SPIN reports 0 errors at every bound configuration", { timeout: 300_000 }, async (t) => {
    if (!full) return t.skip(`spin not installed: ${missing}`);
    const r = await full;
    const runs = [...r.out.matchAll(/^model \[(.+?)\]: errors (\S+), (\S+) states stored, (\S+) transitions, depth (\S+)/gm)];
    for (const [line] of runs) t.diagnostic(line);
    assert.equal(r.status, 0, `check-model.sh failed:\n${r.out}`);
    assert.ok(runs.length >= 2, `expected at least two bound configurations:\n${r.out}`);
    for (const [line, , errors, states] of runs) {
      assert.equal(errors, "0", line);
      assert.ok(Number(states) > 100_000, `suspiciously small state space: ${line}`);
    }
    assert.match(r.out, /check-model: OK/);
  });

  test("every mutant is caught by its invariant; every witness scenario is reached", { timeout: 300_000 }, async (t) => {
    if (!mutants) return t.skip(`spin not installed: ${missing}`);
    const r = await mutants;
    assert.equal(r.status, 0, `check-model.sh --mutants failed:\n${r.out}`);
    const caught = new Map([...r.out.matchAll(/^mutant (\S+): caught by (\S+)/gm)].map((m) => [m[1]!, m[2]!]));
    for (const [mutant, allowed] of Object.entries(MUTANTS)) {
      const by = caught.get(mutant);
      assert.ok(by !== undefined, `${mutant} was not caught:\n${r.out}`);
      assert.ok(allowed.includes(by), `${mutant} was caught by ${by}, expected ${allowed.join(" or ")}`);
      t.diagnostic(`${mutant} -> ${by}`);
    }
    // The script may not run a mutant this test does not know (each needs its expected invariant here too).
    for (const mutant of caught.keys()) assert.ok(mutant in MUTANTS, `unexpected mutant ${mutant}: add it to this test`);
    // Every mutant flag used in the model is exercised.
    const inModel = new Set([...source.matchAll(/\bMUTANT_[A-Z_]+/g)].map((m) => m[0]));
    for (const m of inModel) assert.ok(m in MUTANTS, `${m} appears in the model but is not checked`);
    for (const w of WITNESSES) assert.match(r.out, new RegExp(`^witness ${w}: reached`, "m"), `${w} not reached`);
  });
});
