/**
 * The host identity switch model (model/host-switch.pml), with an attacker
 * holding only the shared enroll token, checked exhaustively by SPIN: the
 * full model has no error; each mutant (the bugs of issue 22 among them) is
 * caught by the invariant it breaks; each witness is reached. Skipped, with
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
const MODEL = join(ROOT, "model", "host-switch.pml");

const MUTANTS: Record<string, string> = {
  MUTANT_RUN_UNDURABLE: "inv_durable_before_irreversible",
  MUTANT_DAMAGED_IS_LEGACY: "inv_no_legacy_after_local",
  MUTANT_DROP_OWED_ON_SEND: "inv_reports_taken",
  // issue 22, items 1-3 and the attacker's replays, put back
  MUTANT_ENROLL_PREPARED: "inv_borrowers_to_proven",
  MUTANT_PREPARE_UNPROVEN: "inv_key_proven",
  MUTANT_ENROLL_LEGACY: "inv_borrowers_to_proven",
  MUTANT_PREPARED_REVERTS: "inv_not_stranded",
  MUTANT_PROOF_REPLAY: "inv_borrowers_to_proven",
  MUTANT_RESET_SHARED_TOKEN: "inv_key_proven",
  MUTANT_RESET_TOKEN_REUSABLE: "inv_key_proven",
};

const WITNESSES = ["WITNESS_DONE_AFTER_FAULTS", "WITNESS_REBOUND_UNDER_ATTACK"];

function missingTool(): string | null {
  for (const [cmd, args] of [["spin", ["-V"]], ["gcc", ["--version"]]] as const) {
    const r = spawnSync(cmd, [...args], { encoding: "utf8" });
    if (r.error) return `${cmd}: ${(r.error as NodeJS.ErrnoException).code ?? r.error.message}`;
  }
  return null;
}

/** Generates, compiles and runs one verifier; resolves to pan's output. */
function check(flags: string[]): string {
  const dir = mkdtempSync(join(tmpdir(), "berth-spin-switch-"));
  try {
    copyFileSync(MODEL, join(dir, "host-switch.pml"));
    const gen = spawnSync("spin", [...flags, "-a", "host-switch.pml"], { cwd: dir, encoding: "utf8" });
    assert.equal(gen.status, 0, `spin -a failed: ${gen.stdout}${gen.stderr}`);
    const cc = spawnSync("gcc", ["-w", "-O0", "-DSAFETY", "-o", "pan", "pan.c"], { cwd: dir, encoding: "utf8" });
    assert.equal(cc.status, 0, `gcc failed: ${cc.stderr}`);
    const pan = spawnSync("./pan", ["-m100000"], { cwd: dir, encoding: "utf8", timeout: 120_000 });
    return `${pan.stdout}${pan.stderr}`;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe("host identity switch model (SPIN)", () => {
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
    for (const witness of WITNESSES) {
      const w = check([`-D${witness}`]);
      assert.match(w, /assertion violated \(+witness/, `${witness} was not reached:\n${w}`);
    }
  });
});
