#!/usr/bin/env node
/**
 * The import rules of src/, checked over the source (every `import … from`,
 * `export … from` and `import("…")` of a relative path, type-only imports
 * included: a type import is still a dependency of the design).
 *
 *   - no import cycle anywhere in src/;
 *   - no upward import: each layer below lists what of berth it must not import
 *     (and, in `except`, files under a forbidden prefix that it may import);
 *   - every folder under src/ has such a rule.
 *
 * Usage: node scripts/check-imports.mjs [srcDir]
 * Prints every violation and exits 1 if there is one; `--json` prints them as JSON.
 */
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve, sep } from "node:path";

/** Layers and the berth paths they must not import (prefixes under src/). */
export const RULES = [
  { from: "core/", forbid: [""], why: "src/core is pure: it imports nothing of berth" },
  { from: "protocol/", forbid: ["store/", "coordinator/", "agent/", "cli/", "providers/", "client/", "http/", "mcp/"], why: "src/protocol holds the contracts (coordinator-agent, client-coordinator): core only" },
  { from: "http/", forbid: ["store/", "coordinator/", "agent/", "cli/", "providers/", "client/", "mcp/", "protocol/"], why: "src/http is berth's one HTTP layer (the servers' kit and the one client): core only" },
  { from: "io/", forbid: [""], why: "src/io holds file helpers every process uses (durable whole-file writes): it imports nothing of berth" },
  { from: "client/", forbid: ["coordinator/", "agent/", "cli/", "providers/", "mcp/", "http/", "store/"], except: ["http/client.ts"], why: "the client library talks to the coordinator over HTTP (the shared client of src/http, none of its server kit): core, protocol and src/io only" },
  { from: "store/", forbid: ["coordinator/", "agent/", "cli/", "providers/"], why: "src/store holds tables and statements: no coordinator, agent, cli or provider" },
  { from: "providers/", forbid: ["coordinator/", "agent/", "cli/"], why: "src/providers carry out operations: no coordinator, agent or cli" },
  { from: "agent/", forbid: ["coordinator/", "cli/", "providers/"], why: "the agent is its own process: no coordinator, cli or provider" },
  { from: "coordinator/", forbid: ["agent/", "cli/"], why: "the coordinator talks to agents over HTTP only: no agent or cli" },
  { from: "mcp/", forbid: ["agent/", "coordinator/", "cli/", "providers/", "store/"], why: "the MCP server is a client: the client library and core only" },
  { from: "cli/", forbid: ["agent/", "coordinator/"], why: "the CLI talks to the coordinator over HTTP: no agent or coordinator internals" },
];

/**
 * The CLI commands that start a process (`berth serve`, `berth up`, `berth agent`),
 * and `berth image --state-dir`, which works on an agent's own directory,
 * may load the coordinator or the agent, and only through a dynamic import (so
 * every other command starts without loading them); `import type` is erased
 * at compile time and allowed there too.
 */
export const DYNAMIC_EXCEPTIONS = {
  "cli/commands/serve.ts": ["coordinator/"],
  "cli/commands/up.ts": ["coordinator/", "agent/"],
  "cli/commands/agent.ts": ["agent/"],
  // `berth image ls|rm --state-dir`: the agent's image cache, on the agent's host, with no agent running for rm.
  "cli/commands/image.ts": ["agent/"],
  // `berth up` stopping: its volumes' disk images unmounted with the agent's own unmount, after the agent ended.
  "cli/up-allocations.ts": ["agent/"],
};

const IMPORT_RE = /(?:^|[\s;])(?:import|export)\s+(type\s+)?(?:[\w*{}\s,$]+?\s+from\s+)?["'](\.[^"']+)["']|import\(\s*["'](\.[^"']+)["']\s*\)/g;

function walk(dir, out) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) walk(p, out);
    else if (name.endsWith(".ts") && !name.endsWith(".d.ts")) out.push(p);
  }
  return out;
}

/** Strips comments so that an import written in a comment is not counted. */
function code(text) {
  return text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/(^|[^:"'`\\])\/\/.*$/gm, "$1");
}

/** The import graph of `srcDir`: file (relative, "/"-separated) -> [{to, dynamic, typeOnly}]. */
export function importGraph(srcDir) {
  const root = resolve(srcDir);
  const graph = new Map();
  for (const file of walk(root, [])) {
    const rel = relative(root, file).split(sep).join("/");
    const edges = [];
    for (const m of code(readFileSync(file, "utf8")).matchAll(IMPORT_RE)) {
      const spec = m[2] ?? m[3];
      const target = relative(root, resolve(dirname(file), spec)).split(sep).join("/").replace(/\.js$/, ".ts");
      if (target.startsWith("..")) continue; // outside src/ (none expected)
      edges.push({ to: target, dynamic: m[3] !== undefined, typeOnly: m[1] !== undefined });
    }
    graph.set(rel, edges);
  }
  return graph;
}

/** Every elementary cycle found by a depth-first search (each reported once, from its smallest member). */
export function findCycles(graph) {
  const cycles = [];
  const seen = new Set();
  const state = new Map(); // 1 = on stack, 2 = done
  const stack = [];
  const visit = (n) => {
    state.set(n, 1);
    stack.push(n);
    for (const { to } of graph.get(n) ?? []) {
      if (!graph.has(to)) continue;
      if (state.get(to) === 1) {
        const cyc = stack.slice(stack.indexOf(to));
        const start = cyc.indexOf([...cyc].sort()[0]);
        const norm = [...cyc.slice(start), ...cyc.slice(0, start)];
        const key = norm.join(" -> ");
        if (!seen.has(key)) {
          seen.add(key);
          cycles.push([...norm, norm[0]]);
        }
      } else if (!state.has(to)) visit(to);
    }
    stack.pop();
    state.set(n, 2);
  };
  for (const n of [...graph.keys()].sort()) if (!state.has(n)) visit(n);
  return cycles;
}

/** Imports that break a layer rule. */
export function findUpward(graph) {
  const out = [];
  for (const [file, edges] of graph) {
    for (const e of edges) {
      for (const rule of RULES) {
        if (!file.startsWith(rule.from)) continue;
        const hit = rule.forbid.find((p) => e.to.startsWith(p) && !(p === "" && e.to.startsWith(rule.from)) && !rule.except?.includes(e.to));
        if (hit === undefined) continue;
        const allowed = DYNAMIC_EXCEPTIONS[file]?.some((p) => e.to.startsWith(p)) && (e.dynamic || e.typeOnly);
        if (!allowed) out.push({ file, imports: e.to, dynamic: e.dynamic, why: rule.why });
      }
    }
  }
  return out;
}

/** Folders directly under `srcDir` that no layer rule is written for (each must have one). */
export function findUnruled(srcDir) {
  const root = resolve(srcDir);
  return readdirSync(root)
    .filter((name) => statSync(join(root, name)).isDirectory())
    .filter((name) => !RULES.some((r) => r.from === `${name}/`))
    .sort();
}

export function check(srcDir) {
  const graph = importGraph(srcDir);
  return { files: graph.size, cycles: findCycles(graph), upward: findUpward(graph), unruled: findUnruled(srcDir) };
}

const isMain = process.argv[1] && resolve(process.argv[1]) === resolve(new URL(import.meta.url).pathname);
if (isMain) {
  const args = process.argv.slice(2);
  const json = args.includes("--json");
  const srcDir = args.find((a) => !a.startsWith("--")) ?? "src";
  const r = check(srcDir);
  if (json) console.log(JSON.stringify(r, null, 2));
  else {
    for (const c of r.cycles) console.log(`cycle: ${c.join(" -> ")}`);
    for (const u of r.upward) console.log(`upward import: ${u.file} imports ${u.imports}${u.dynamic ? " (dynamic)" : ""}: ${u.why}`);
    for (const f of r.unruled) console.log(`folder without a rule: ${f}/ (add it to RULES)`);
    console.log(`${r.files} files, ${r.cycles.length} cycles, ${r.upward.length} upward imports, ${r.unruled.length} folders without a rule`);
  }
  process.exit(r.cycles.length + r.upward.length + r.unruled.length > 0 ? 1 : 0);
}
