#!/usr/bin/env node
/**
 * Casts on data crossing the coordinator ↔ agent boundary: in every file of
 * src/ that calls an agent or reads what one answered (it imports the
 * operation contract, the agent reply contract, the provider interface or
 * the agent call helpers; and the agent's two callers of the coordinator,
 * enroll.ts and identity/coordinator.ts; the call helper agent-call.ts), each `x as T` where T is not
 * `const`. Not counted: `(e as Error)` on a caught error, a widening
 * `as unknown`, a placeholder `null as unknown as T`, an empty literal
 * `[] as T[]`, and a SQLite statement's row type (`.get(...) as Row`,
 * `.all() as T[]`): none
 * of these reads an answer. src/protocol/ is where answers are parsed, apart.
 *
 * Usage: node scripts/contract-casts.mjs [--json] [DIR (default src)]
 * Exit status 1 when any cast is found.
 */
import { readFileSync } from "node:fs";
import { relative, sep } from "node:path";
import { tsFiles } from "./ts-files.mjs";

const BOUNDARY = /from "[./\w-]*\/(?:agent-call|allocation-agent|provider|operations|agent-api)\.js"/;
const AGENT_CALLERS = ["agent/enroll.ts", "agent/identity/coordinator.ts", "providers/hosts/agent-call.ts"];
const CAST = /\bas\s+(?!const\b)(?:unknown\b|object\b|string\b|number\b|boolean\b|"|[A-Z][\w.]*|\{|\(|Record<|Array<)/g;

export function contractCasts(dir) {
  const files = tsFiles(dir);
  const found = [];
  let seen = 0;
  for (const f of files.sort()) {
    const rel = relative(dir, f).split(sep).join("/");
    if (rel.startsWith("protocol/")) continue;
    const text = readFileSync(f, "utf8");
    if (!BOUNDARY.test(text) && !AGENT_CALLERS.includes(rel)) continue;
    seen++;
    text.split("\n").forEach((line, i) => {
      if (/^\s*(\*|\/\/|\/\*|import\b|export\s*\{|export \* )/.test(line)) return;
      for (const m of line.matchAll(CAST)) {
        const before = line.slice(0, m.index);
        const after = line.slice(m.index);
        if (/\((e|err|error)\s*$/.test(before)) continue;
        if (/^as unknown(?!\s+as\b)/.test(after)) continue;
        if (/\bnull\s*$/.test(before) && /^as unknown as\b/.test(after)) continue;
        if (/\bnull as unknown\s*$/.test(before)) continue;
        if (/\.(get|all)\([^()]*\)\s*$/.test(before)) continue;
        if (/\[\]\s*$/.test(before)) continue;
        if (/^as Row\b/.test(after)) continue;
        found.push({ file: rel, line: i + 1, text: line.trim().slice(0, 160) });
      }
    });
  }
  return { files: seen, casts: found };
}

const isMain = import.meta.url === `file://${process.argv[1]}`;
if (isMain) {
  const args = process.argv.slice(2);
  const json = args.includes("--json");
  const dir = args.find((a) => !a.startsWith("--")) ?? "src";
  const r = contractCasts(dir);
  if (json) console.log(JSON.stringify(r));
  else {
    for (const c of r.casts) console.log(`${c.file}:${c.line}: ${c.text}`);
    console.log(`${r.casts.length} casts on coordinator↔agent data in ${r.files} boundary files`);
  }
  process.exit(r.casts.length === 0 ? 0 : 1);
}
