/**
 * The host identity switch model (model/allocation.pml), checked
 * exhaustively by SPIN: the full model has no error; each mutant is caught
 * by the invariant it breaks; the witness scenario is reached. Skipped, with
 * the reason, where spin or gcc is not installed.
 */
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../../", import.meta.url));
const MODEL = join(ROOT, "model", "allocation.pml");

const MUTANTS: Record<string, string> = {
  MUTANT_NO_FLOOR: "inv_fenced",
  MUTANT_RETAIN_STALE: "inv_ends",
  MUTANT_NO_EPOCH: "inv_no_launch_after_withdraw",
  MUTANT_ACK_UNPUSHED: "inv_no_launch_after_withdraw",
  MUTANT_REFUND_EARLY: "inv_budget",
  MUTANT_RESTART_UNGATED: "inv_no_launch_after_withdraw",
};

function missingTool(): string | null {
  for (const [cmd, args] of [["spin", ["-V"]], ["gcc", ["--version"]]] as const) {
    const r = spawnSync(cmd, [...args], { encoding: "utf8" });
    if (r.error) return `${cmd}: ${(r.error as NodeJS.ErrnoException).code ?? r.error.message}`;
  }
  return null;
}

/** Generates, compiles and runs one verifier; resolves to pan's output. */
function check(flags: string[]): string {
  const dir = mkdtempSync(join(tmpdir(), "berth-spin-alloc-"));
  try {
    copyFileSync(MODEL, join(dir, "allocation.pml"));
    const gen = spawnSync("spin", [...flags, "-a", "allocation.pml"], { cwd: dir, encoding: "utf8" });
    assert.equal(gen.status, 0, `spin -a failed: ${gen.stdout}${gen.stderr}`);
    const cc = spawnSync("gcc", ["-w", "-O0", "-DSAFETY", "-o", "pan", "pan.c"], { cwd: dir, encoding: "utf8" });
    assert.equal(cc.status, 0, `gcc failed: ${cc.stderr}`);
    const pan = spawnSync("./pan", ["-m100000"], { cwd: dir, encoding: "utf8", timeout: 120_000 });
    return `${pan.stdout}${pan.stderr}`;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe("allocation launch, takeover, withdrawal and release model (SPIN)", () => {
  test("the full model: 0 errors, every assertion and end state checked", { timeout: 180_000 }, (t) => {
    const missing = missingTool();
    if (missing) return t.skip(`spin not installed: ${missing}`);
    const out = check([]);
    const m = /errors: (\d+)/.exec(out);
    const states = /(\d+) states, stored/.exec(out);
    t.diagnostic(`errors ${m?.[1]}, ${states?.[1]} states stored`);
    assert.equal(m?.[1], "0", out);
    assert.ok(Number(states?.[1]) > 100_000, `suspiciously small state space:\n${out}`);
  });

  test("every mutant is caught by its invariant; the witness is reached", { timeout: 180_000 }, (t) => {
    const missing = missingTool();
    if (missing) return t.skip(`spin not installed: ${missing}`);
    for (const [mutant, invariant] of Object.entries(MUTANTS)) {
      const out = check([`-D${mutant}`]);
      const by = /assertion violated \(+([a-z_]+)/.exec(out)?.[1];
      assert.equal(by, invariant, `${mutant}: expected ${invariant} to catch it:\n${out}`);
      t.diagnostic(`${mutant} -> ${by}`);
    }
    const w = check(["-DWITNESS_READY_AFTER_TAKEOVER"]);
    assert.match(w, /assertion violated \(+witness/, `ready after a fenced late hold was not reached:\n${w}`);
    const r = check(["-DWITNESS_RESTARTED"]);
    assert.match(r, /assertion violated \(?witness/, `ready again after a restart was not reached:\n${r}`);
  });
});
