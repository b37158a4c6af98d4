/**
 * The allocation launch, takeover, withdrawal and release model
 * (model/allocation.pml), checked exhaustively by SPIN: the model and each
 * of its operator arms (resolve, host gone, expiry; one configuration each)
 * has no error; each mutant is caught by the invariant it breaks; each
 * witness scenario is reached. Skipped, with the reason, where spin or gcc
 * is not installed.
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

/** The configurations checked in full: the model alone, and with each operator arm. */
const CONFIGS: Record<string, string[]> = {
  "launch, takeover, withdrawal, release, restart": [],
  "with expiry": ["-DARM_EXPIRY"],
  "with the host gone for good and resolve --host-gone": ["-DARM_HOSTGONE"],
  "with quarantine and resolve --destroy|--keep-volume": ["-DARM_RESOLVE"],
};

const MUTANTS: Record<string, { flags: string[]; caughtBy: string }> = {
  MUTANT_NO_FLOOR: { flags: [], caughtBy: "inv_fenced" },
  MUTANT_RETAIN_STALE: { flags: [], caughtBy: "inv_ends" },
  MUTANT_NO_EPOCH: { flags: [], caughtBy: "inv_no_launch_after_withdraw" },
  MUTANT_ACK_UNPUSHED: { flags: [], caughtBy: "inv_no_launch_after_withdraw" },
  MUTANT_REFUND_EARLY: { flags: [], caughtBy: "inv_budget" },
  MUTANT_RESTART_UNGATED: { flags: [], caughtBy: "inv_no_launch_after_withdraw" },
  MUTANT_RESOLVE_EARLY: { flags: ["-DARM_RESOLVE"], caughtBy: "inv_budget" },
  MUTANT_LATE_WIPE: { flags: ["-DARM_RESOLVE"], caughtBy: "inv_kept" },
  MUTANT_GONE_UNATTESTED: { flags: ["-DARM_HOSTGONE"], caughtBy: "inv_budget" },
  MUTANT_GONE_CHARGED: { flags: ["-DARM_HOSTGONE"], caughtBy: "inv_budget" },
  MUTANT_EXPIRY_UNFENCED: { flags: ["-DARM_EXPIRY"], caughtBy: "inv_budget" },
};

const WITNESSES: Record<string, { flags: string[]; what: string }> = {
  WITNESS_READY_AFTER_TAKEOVER: { flags: [], what: "ready after a lapsed actor's late hold was refused by the floor" },
  WITNESS_RESTARTED: { flags: [], what: "ready again after the sandbox died and a restart ran" },
  WITNESS_QUIESCENT: { flags: [], what: "a state where nothing more can happen (the end-of-run checks run)" },
  WITNESS_RESOLVED: { flags: ["-DARM_RESOLVE"], what: "released by an operator's resolve of a mismatched machine" },
  WITNESS_HOST_GONE: { flags: ["-DARM_HOSTGONE"], what: "a launched allocation released on a host gone for good" },
  WITNESS_EXPIRED: { flags: ["-DARM_EXPIRY"], what: "a launched allocation released by its expiry" },
};

function missingTool(): string | null {
  for (const [cmd, args] of [["spin", ["-V"]], ["gcc", ["--version"]]] as const) {
    const r = spawnSync(cmd, [...args], { encoding: "utf8" });
    if (r.error) return `${cmd}: ${(r.error as NodeJS.ErrnoException).code ?? r.error.message}`;
  }
  return null;
}

/** Generates, compiles and runs one verifier; returns pan's output. `-O2` for full runs (pan runs ~2.5x faster), `-O0` for the short ones. */
function check(flags: string[], optimize = false): string {
  const dir = mkdtempSync(join(tmpdir(), "berth-spin-alloc-"));
  try {
    copyFileSync(MODEL, join(dir, "allocation.pml"));
    const gen = spawnSync("spin", [...flags, "-a", "allocation.pml"], { cwd: dir, encoding: "utf8" });
    assert.equal(gen.status, 0, `spin -a failed: ${gen.stdout}${gen.stderr}`);
    const cc = spawnSync("gcc", ["-w", optimize ? "-O2" : "-O0", "-DSAFETY", "-o", "pan", "pan.c"], { cwd: dir, encoding: "utf8" });
    assert.equal(cc.status, 0, `gcc failed: ${cc.stderr}`);
    const pan = spawnSync("./pan", ["-m100000"], { cwd: dir, encoding: "utf8", timeout: 300_000 });
    return `${pan.stdout}${pan.stderr}`;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe("allocation launch, takeover, withdrawal and release model (SPIN)", () => {
  for (const [name, flags] of Object.entries(CONFIGS)) {
    test(`the model ${name}: 0 errors, every assertion and end state checked`, { timeout: 360_000 }, (t) => {
      const missing = missingTool();
      if (missing) return t.skip(`spin not installed: ${missing}`);
      const out = check(flags, true);
      const m = /errors: (\d+)/.exec(out);
      const states = /(\d+) states, stored/.exec(out);
      t.diagnostic(`${flags.join(" ") || "(no arm)"}: errors ${m?.[1]}, ${states?.[1]} states stored`);
      assert.equal(m?.[1], "0", out);
      assert.ok(Number(states?.[1]) > 100_000, `suspiciously small state space:\n${out}`);
      assert.doesNotMatch(out, /max search depth too small/, out);
    });
  }

  test("every mutant is caught by its invariant; every witness is reached", { timeout: 360_000 }, (t) => {
    const missing = missingTool();
    if (missing) return t.skip(`spin not installed: ${missing}`);
    for (const [mutant, { flags, caughtBy }] of Object.entries(MUTANTS)) {
      const out = check([...flags, `-D${mutant}`]);
      const by = /assertion violated \(+([a-z_]+)/.exec(out)?.[1];
      assert.equal(by, caughtBy, `${mutant}: expected ${caughtBy} to catch it:\n${out}`);
      t.diagnostic(`${mutant} -> ${by}`);
    }
    for (const [witness, { flags, what }] of Object.entries(WITNESSES)) {
      const out = check([...flags, `-D${witness}`]);
      assert.match(out, /assertion violated \(?witness/, `${witness} (${what}) was not reached:\n${out}`);
    }
  });
});
