/**
 * No cast on data crossing the coordinator ↔ agent boundary
 * (scripts/contract-casts.mjs): op-row arguments, operation results, agent
 * replies and the agent's reading of the coordinator's answers are parsed by
 * src/protocol/ (operations.ts, agent-api.ts, api.ts). Run over the real tree,
 * and over a small tree with one of each cast, so a scan that stopped seeing
 * them would fail here.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { tempDir } from "../helpers/env.js";

const SCRIPT = resolve("scripts/contract-casts.mjs");

interface Report {
  files: number;
  casts: Array<{ file: string; line: number; text: string }>;
}

function scan(dir: string): { status: number | null; report: Report } {
  const r = spawnSync(process.execPath, [SCRIPT, "--json", dir], { encoding: "utf8" });
  return { status: r.status, report: JSON.parse(r.stdout) as Report };
}

describe("casts on coordinator↔agent data", () => {
  it("src/ has none", () => {
    const { status, report } = scan(resolve("src"));
    assert.ok(report.files >= 20, `only ${report.files} boundary files seen`);
    assert.deepEqual(report.casts, []);
    assert.equal(status, 0);
  });

  it("the scan finds each kind of cast in a boundary file, and leaves alone what reads no answer", () => {
    const dir = tempDir("berth-casts-").path;
    const files: Record<string, string> = {
      "coordinator/executor.ts": [
        'import { parseOpRowArgs } from "../protocol/operations.js";',
        "const args = JSON.parse(op.args) as Record<string, unknown>;",
        "const evidence = (result.network ?? null) as ReadinessEvidence | null;",
        'const code = body.error.code as "conflict";',
        "const v = { ...(await agent.volume(h, p)) as object };",
        "try { x(); } catch (e) { log((e as Error).message); }",
        "const k = [1, 2] as const;",
        "const w = body as unknown;",
        "const rows = db.prepare(sql).all() as Row[];",
        "const none = [] as string[];",
        "",
      ].join("\n"),
      "agent/identity/coordinator.ts": "export async function post<T>(text: string): Promise<T> { return JSON.parse(text) as T; }\n",
      "coordinator/elsewhere.ts": "const x = JSON.parse(s) as Foo;\n",
      "protocol/operations.ts": "export const y = z as Bar;\n",
    };
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(dir, path)), { recursive: true });
      writeFileSync(join(dir, path), text);
    }
    const { status, report } = scan(dir);
    assert.equal(status, 1);
    assert.deepEqual(
      report.casts.map((c) => `${c.file}:${c.line}`),
      ["agent/identity/coordinator.ts:1", "coordinator/executor.ts:2", "coordinator/executor.ts:3", "coordinator/executor.ts:4", "coordinator/executor.ts:5"],
    );
  });
});
