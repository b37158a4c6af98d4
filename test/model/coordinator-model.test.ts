/**
 * Model-based test of the coordinator: random sequences of ensure, register,
 * borrow (keeper and portable), ack, heartbeat, return (ready/drain), SSH
 * connects, reconciler ticks with provider faults (failure, timeout with
 * unknown outcome, lost reply, parked/late completion, duplicate
 * completion), deliveries of late replies and of a dead coordinator's late
 * requests, clock moves (including to exactly a deadline), pool drains and
 * coordinator crash + restart on the same SQLite file. PRODUCT.md's
 * invariants are checked after every step (checks.ts), and after a settle
 * phase without faults every obligation must have finished.
 *
 * The same sequences run a second time against the AWS provider's timing and
 * fault profile (AWS_PROFILE in simulated-agent-provider.ts: slow launch,
 * slow and sometimes lost reboots proven only by a boot change, ambiguous
 * SSM completions), BERTH_MODEL_AWS_RUNS of them (default 150).
 *
 * Seeded and reproducible:
 *   BERTH_MODEL_RUNS (default 400), BERTH_MODEL_SEED, BERTH_MODEL_PATH,
 *   BERTH_MODEL_REPLAY (fast-check's commands replay path),
 *   BERTH_MODEL_NO_SHRINK=1 (stop at the first failure; used by scripts/mutants.sh).
 * scripts/model-many.sh N runs many more.
 */
import { test } from "node:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { World, seededRandom } from "./world.js";
import { commandArbs, prelude } from "./commands.js";
import { AGENT_PROFILE, AWS_PROFILE, type SimProfile } from "./simulated-agent-provider.js";

const RUNS = Number(process.env.BERTH_MODEL_RUNS ?? 400);
const AWS_RUNS = Number(process.env.BERTH_MODEL_AWS_RUNS ?? 150);
const SEED = process.env.BERTH_MODEL_SEED !== undefined ? Number(process.env.BERTH_MODEL_SEED) : (Date.now() ^ (Math.random() * 0x7fffffff)) | 0;
const PATH = process.env.BERTH_MODEL_PATH;
const REPLAY = process.env.BERTH_MODEL_REPLAY;
const RUN_TIMEOUT_MS = 20_000;
const NO_SHRINK = process.env.BERTH_MODEL_NO_SHRINK === "1";

test(`[I1][I2][I3][I4][I5][I6][I7][I8][I9][I10] coordinator model: ${RUNS} random sequences keep every invariant (seed ${SEED})`, { timeout: 30 * 60_000 }, () => runModel(RUNS, AGENT_PROFILE));

test(`[I1][I2][I3][I4][I5][I6][I7][I8][I9][I10] coordinator model with the aws timing and fault profile: ${AWS_RUNS} random sequences keep every invariant (seed ${SEED})`, { timeout: 30 * 60_000 }, () => runModel(AWS_RUNS, AWS_PROFILE));

async function runModel(runs: number, profile: SimProfile): Promise<void> {
  const base = mkdtempSync(join(existsSync("/dev/shm") ? "/dev/shm" : tmpdir(), "berth-model-"));
  let lastTrace: string[] = [];
  const totals: Record<string, number> = {};
  try {
    const property = fc.asyncProperty(fc.integer(), fc.commands(commandArbs, { maxCommands: 32, size: "medium", ...(REPLAY ? { replayPath: REPLAY } : {}) }), async (seed, cmds) => {
      const dir = mkdtempSync(join(base, "run-"));
      const savedRandom = Math.random;
      // Retry backoff jitter comes from Math.random: seed it too, so a run replays exactly.
      Math.random = seededRandom(seed ^ 0x5eed);
      const w = await World.start(dir, seed, profile);
      let timer: NodeJS.Timeout | undefined;
      try {
        const body = (async () => {
          for (const c of prelude) await c.run({}, w);
          await fc.asyncModelRun(() => ({ model: {}, real: w }), cmds);
          await w.settle();
        })();
        // A run that stops making progress is a failure too (a lost wake-up, a transaction that never ends).
        const hang = new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new Error(`[hang] the run made no progress for ${RUN_TIMEOUT_MS} ms`)), RUN_TIMEOUT_MS);
        });
        await Promise.race([body, hang]);
        for (const [k, v] of Object.entries(await w.stats())) totals[k] = (totals[k] ?? 0) + v;
      } catch (e) {
        lastTrace = w.trace.slice(-60);
        throw e;
      } finally {
        clearTimeout(timer);
        Math.random = savedRandom;
        await Promise.race([w.close(), new Promise((r) => setTimeout(r, 2_000))]);
        rmSync(dir, { recursive: true, force: true });
      }
    });
    const out = await fc.check(property, { numRuns: runs, seed: SEED, ...(PATH ? { path: PATH } : {}), endOnFailure: NO_SHRINK });
    const shown = ["install_confirmed", "scrubbed", "late_install", "late_remove_key", "late_fence", "late_scrub", "quarantine", "destroyed", "crashes", "orphans_delivered"];
    if (profile !== AGENT_PROFILE) shown.push("provision_pending", "reboot_lost", "reboot_done", "ssm_ambiguous");
    console.log(`model runs exercised (${profile.name} profile): ${shown.map((k) => `${k}=${totals[k] ?? 0}`).join(" ")}`);
    if (out.failed) {
      const report = fc.defaultReportMessage(out);
      const replay = /replayPath="([^"]*)"/.exec(report ?? "")?.[1];
      const hint = `reproduce (${profile.name} profile): BERTH_MODEL_SEED=${out.seed} BERTH_MODEL_PATH=${out.counterexamplePath}${replay ? ` BERTH_MODEL_REPLAY='${replay}'` : ""} BERTH_MODEL_RUNS=1 node scripts/run-tests.mjs coordinator-model`;
      const why = out.errorInstance instanceof Error ? out.errorInstance.message : String(out.errorInstance);
      console.error(`model run failed (seed ${out.seed}, path ${out.counterexamplePath}): ${why}\n${hint}\nlast steps of the failing run:\n  ${lastTrace.join("\n  ")}`);
      throw new Error(`${why}\n${report}\n${hint}`);
    }
  } finally {
    rmSync(base, { recursive: true, force: true });
  }
}
