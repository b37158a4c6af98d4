/**
 * The dead-export finder (scripts/dead-exports.mjs, run over the whole
 * project by `npm run check`) on a small project that has one of each case,
 * so a finder that stopped seeing dead exports, or started reporting live
 * ones, fails here. (Over the real tree it takes the whole program's
 * symbols: too long for the suite, so it is part of the check instead.)
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { tempDir } from "../helpers/env.js";

const SCRIPT = resolve("scripts/dead-exports.mjs");

describe("dead exports", () => {
  it("reports an export nothing uses, apart from one used in its own module; imports, re-exports, whole-module imports and the public entry count as uses", () => {
    const dir = tempDir("berth-dead-").path;
    const files: Record<string, string> = {
      "tsconfig.json": JSON.stringify({ compilerOptions: { module: "NodeNext", moduleResolution: "NodeNext", strict: true, target: "ES2022", skipLibCheck: true, types: [] }, include: ["src", "test"] }),
      "src/client/index.ts": 'export { viaEntry } from "../core/a.js";\n',
      "src/core/a.ts": [
        "export function dead(): number { return 1; }",
        "export function imported(): number { return 2; }",
        "export type Local = { n: number };",
        "export function usesLocal(x: Local): number { return x.n; }",
        "export const viaEntry = 3;",
        "export const byTest = 4;",
        "",
      ].join("\n"),
      "src/core/b.ts": 'import { imported, usesLocal } from "./a.js";\nexport const both = imported() + usesLocal({ n: 1 });\n',
      "src/core/whole.ts": "export const w1 = 1;\nexport const w2 = 2;\n",
      "src/cli/c.ts": 'import * as whole from "../core/whole.js";\nimport { both } from "../core/b.js";\nexport const out = whole.w1 + both;\n',
      "test/t.ts": 'import { byTest } from "../src/core/a.js";\nimport { out } from "../src/cli/c.js";\nconsole.log(byTest, out);\n',
    };
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(dir, path)), { recursive: true });
      writeFileSync(join(dir, path), text);
    }
    const r = spawnSync(process.execPath, [SCRIPT, "--json", "--project", join(dir, "tsconfig.json")], { encoding: "utf8" });
    const report = JSON.parse(r.stdout) as { dead: Array<{ file: string; name: string }>; local: Array<{ file: string; name: string }> };
    assert.deepEqual(report.dead.map((d) => `${d.file} ${d.name}`), ["src/core/a.ts dead"]);
    assert.deepEqual(report.local.map((d) => `${d.file} ${d.name}`), ["src/core/a.ts Local"]);
    assert.equal(r.status, 1);
  });
});
