/**
 * The import rules of src/ (scripts/check-imports.mjs): no import cycle, no
 * upward import. Run over the real tree, and over small trees that break each
 * rule once, so a checker that stopped seeing violations would fail here.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { tempDir } from "../helpers/env.js";

const SCRIPT = resolve("scripts/check-imports.mjs");

interface Report {
  files: number;
  cycles: string[][];
  upward: Array<{ file: string; imports: string; dynamic: boolean }>;
  unruled: string[];
}

function check(dir: string): { status: number | null; report: Report } {
  const r = spawnSync(process.execPath, [SCRIPT, "--json", dir], { encoding: "utf8" });
  return { status: r.status, report: JSON.parse(r.stdout) as Report };
}

function tree(files: Record<string, string>): string {
  const dir = tempDir("berth-imports-").path;
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, path)), { recursive: true });
    writeFileSync(join(dir, path), text);
  }
  return dir;
}

describe("import rules of src/", () => {
  it("src/ has no import cycle and no upward import", () => {
    const { status, report } = check(resolve("src"));
    assert.ok(report.files > 50, `only ${report.files} files seen`);
    assert.deepEqual(report.cycles, [], "import cycles");
    assert.deepEqual(report.upward, [], "upward imports");
    assert.deepEqual(report.unruled, [], "folders without a rule");
    assert.equal(status, 0);
  });

  it("finds a folder without a rule, and the client's and http layer's upward imports (the client may import the shared HTTP client only)", () => {
    const dir = tree({
      "client/a.ts": 'import { y } from "../coordinator/c.js";\nimport { h } from "../http/h.js";\nimport { HttpClient } from "../http/client.js";\n',
      "http/h.ts": 'import { x } from "../store/s.js";\nexport const h = 1;\n',
      "http/client.ts": "export class HttpClient {}\n",
      "store/s.ts": "export const x = 1;\n",
      "coordinator/c.ts": "export const y = 1;\n",
      "gadgets/g.ts": "export const g = 1;\n",
    });
    const { status, report } = check(dir);
    assert.equal(status, 1);
    assert.deepEqual(report.unruled, ["gadgets"]);
    assert.deepEqual(report.upward.map((u) => `${u.file} -> ${u.imports}`).sort(), ["client/a.ts -> coordinator/c.ts", "client/a.ts -> http/h.ts", "http/h.ts -> store/s.ts"]);
  });

  it("src/ imports only runtime dependencies and node built-ins (a devDependency is for tests)", () => {
    const pkg = JSON.parse(readFileSync("package.json", "utf8")) as { dependencies: Record<string, string>; devDependencies: Record<string, string> };
    const bare = new Set<string>();
    const walk = (d: string): void => {
      for (const n of readdirSync(d)) {
        const p = join(d, n);
        if (statSync(p).isDirectory()) walk(p);
        else if (p.endsWith(".ts")) {
          for (const m of readFileSync(p, "utf8").matchAll(/(?:^|[\s;])(?:import|export)\s+(?:type\s+)?(?:[\w*{}\s,$]+?\s+from\s+)?["']([^."'][^"']*)["']|import\(\s*["']([^."'][^"']*)["']\s*\)/g)) {
            const spec = (m[1] ?? m[2])!;
            if (spec.startsWith("node:")) continue;
            bare.add(spec.startsWith("@") ? spec.split("/").slice(0, 2).join("/") : spec.split("/")[0]!);
          }
        }
      }
    };
    walk(resolve("src"));
    assert.ok(bare.has("zod") && bare.has("commander"), "the scan sees package imports");
    const notRuntime = [...bare].filter((p) => !(p in pkg.dependencies)).sort();
    assert.deepEqual(notRuntime, []);
    assert.ok("playwright-core" in pkg.devDependencies && !("playwright-core" in pkg.dependencies), "the browser driver is a test dependency");
  });

  it("finds a cycle, type-only imports included", () => {
    const dir = tree({
      "coordinator/executor.ts": 'import { onInstall } from "./actions/grants.js";\nexport const run = onInstall;\n',
      "coordinator/actions/grants.ts": 'import type { Run } from "../executor.js";\nexport const onInstall = 1;\n',
      "coordinator/reconciler.ts": 'import { run } from "./executor.js";\n',
    });
    const { status, report } = check(dir);
    assert.equal(status, 1);
    assert.deepEqual(report.cycles, [["coordinator/actions/grants.ts", "coordinator/executor.ts", "coordinator/actions/grants.ts"]]);
  });

  it("finds upward imports, and allows the process-starting commands only a dynamic import", () => {
    const dir = tree({
      "core/a.ts": 'import { x } from "../store/b.js";\n',
      "store/b.ts": 'import { y } from "../coordinator/c.js";\nexport const x = 1;\n',
      "providers/hosts/p.ts": 'import { y } from "../../coordinator/c.js";\n',
      "coordinator/c.ts": "export const y = 1;\n// import { z } from \"../agent/d.js\"; (a comment is not an import)\n",
      "agent/d.ts": "export const z = 1;\n",
      "cli/commands/serve.ts": 'export async function go() { return (await import("../../coordinator/c.js")).y; }\n',
      "cli/commands/up.ts": 'import { y } from "../../coordinator/c.js";\n',
      "cli/commands/pool.ts": 'export async function go() { return (await import("../../agent/d.js")).z; }\n',
    });
    const { status, report } = check(dir);
    assert.equal(status, 1);
    assert.deepEqual(
      report.upward.map((u) => `${u.file} -> ${u.imports}`).sort(),
      [
        "cli/commands/pool.ts -> agent/d.ts",
        "cli/commands/up.ts -> coordinator/c.ts",
        "core/a.ts -> store/b.ts",
        "providers/hosts/p.ts -> coordinator/c.ts",
        "store/b.ts -> coordinator/c.ts",
      ],
    );
  });
});
