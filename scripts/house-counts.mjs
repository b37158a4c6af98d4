#!/usr/bin/env node
/**
 * The house counts of src/ (docs/architecture.md): files over 300 lines,
 * functions over 80 lines, and duplicate pairs.
 *
 * - A function is any function declaration, method, constructor, accessor,
 *   function expression or arrow function (TypeScript's parser); its length
 *   is from its first to its last line, nested functions included (each
 *   nested one is also counted on its own).
 * - A duplicate pair is two places (in one file or two) sharing a run of at
 *   least 5 consecutive lines (jscpd's default; BERTH_DUP_LINES sets another) that are equal once whitespace is trimmed,
 *   blank lines, comments and lines of only brackets/punctuation left out; a
 *   longer shared run is one pair, not many.
 *
 * Usage: node scripts/house-counts.mjs [--json] [--list] [DIR (default src)]
 * Informational: exit status 0.
 */
import { readFileSync } from "node:fs";
import { relative, sep } from "node:path";
import { tsFiles } from "./ts-files.mjs";
import ts from "typescript";

const FILE_LINES = 300;
const FUNCTION_LINES = 80;
const DUP_LINES = Number(process.env.BERTH_DUP_LINES ?? 5);

export function houseCounts(dir) {
  const files = tsFiles(dir);
  const longFiles = [];
  const longFunctions = [];
  const code = []; // per file: [{line, text}] of significant lines
  for (const f of files) {
    const rel = relative(dir, f).split(sep).join("/");
    const text = readFileSync(f, "utf8");
    const lines = text.split("\n").length - (text.endsWith("\n") ? 1 : 0);
    if (lines > FILE_LINES) longFiles.push({ file: rel, lines });
    const sf = ts.createSourceFile(f, text, ts.ScriptTarget.Latest, true);
    const visit = (node) => {
      if (ts.isFunctionLike(node) && "body" in node && node.body) {
        const a = sf.getLineAndCharacterOfPosition(node.getStart(sf)).line;
        const b = sf.getLineAndCharacterOfPosition(node.getEnd()).line;
        const n = b - a + 1;
        if (n > FUNCTION_LINES) longFunctions.push({ file: rel, line: a + 1, lines: n, name: nameOf(node, sf) });
      }
      ts.forEachChild(node, visit);
    };
    visit(sf);
    const sig = [];
    let inBlock = false;
    text.split("\n").forEach((raw, i) => {
      let t = raw.trim();
      if (inBlock) {
        if (t.includes("*/")) inBlock = false;
        return;
      }
      if (t.startsWith("/*")) {
        if (!t.includes("*/")) inBlock = true;
        return;
      }
      if (t.startsWith("//") || t.startsWith("*")) return;
      t = t.replace(/\s+/g, " ");
      if (!/[A-Za-z0-9]/.test(t) || /^import\b/.test(t)) return;
      sig.push({ line: i + 1, text: t });
    });
    code.push({ file: rel, sig });
  }
  return { files: files.length, longFiles, longFunctions, duplicates: duplicates(code) };
}

function nameOf(node, sf) {
  if (node.name) return node.name.getText(sf);
  const p = node.parent;
  if (p && (ts.isVariableDeclaration(p) || ts.isPropertyAssignment(p) || ts.isPropertyDeclaration(p)) && p.name) return p.name.getText(sf);
  if (ts.isConstructorDeclaration(node)) return "constructor";
  return "(anonymous)";
}

function duplicates(code) {
  // Windows of DUP_LINES significant lines, by their text; a pair of places sharing one starts a run.
  const seen = new Map();
  code.forEach((c, fi) => {
    for (let i = 0; i + DUP_LINES <= c.sig.length; i++) {
      const key = c.sig.slice(i, i + DUP_LINES).map((x) => x.text).join("\n");
      const list = seen.get(key);
      if (list) list.push([fi, i]);
      else seen.set(key, [[fi, i]]);
    }
  });
  const pairs = new Map(); // "fa:ia|fb:ib" of the run's start, after extending
  const covered = new Set();
  for (const list of seen.values()) {
    if (list.length < 2) continue;
    for (let x = 0; x < list.length; x++) {
      for (let y = x + 1; y < list.length; y++) {
        let [fa, ia] = list[x];
        let [fb, ib] = list[y];
        if (fa === fb && Math.abs(ia - ib) < DUP_LINES) continue; // overlapping repeats of one block
        // Back to the start of the shared run, so each run is counted once.
        while (ia > 0 && ib > 0 && code[fa].sig[ia - 1].text === code[fb].sig[ib - 1].text) {
          ia--;
          ib--;
        }
        const id = `${fa}:${ia}|${fb}:${ib}`;
        if (covered.has(id)) continue;
        covered.add(id);
        let n = 0;
        while (ia + n < code[fa].sig.length && ib + n < code[fb].sig.length && code[fa].sig[ia + n].text === code[fb].sig[ib + n].text) n++;
        pairs.set(id, { a: `${code[fa].file}:${code[fa].sig[ia].line}`, b: `${code[fb].file}:${code[fb].sig[ib].line}`, lines: n });
      }
    }
  }
  return [...pairs.values()].sort((p, q) => q.lines - p.lines);
}

const isMain = import.meta.url === `file://${process.argv[1]}`;
if (isMain) {
  const args = process.argv.slice(2);
  const dir = args.find((a) => !a.startsWith("--")) ?? "src";
  const r = houseCounts(dir);
  if (args.includes("--json")) console.log(JSON.stringify(r, null, 1));
  else {
    if (args.includes("--list")) {
      for (const f of [...r.longFiles].sort((a, b) => b.lines - a.lines)) console.log(`file     ${f.lines}  ${f.file}`);
      for (const f of [...r.longFunctions].sort((a, b) => b.lines - a.lines)) console.log(`function ${f.lines}  ${f.file}:${f.line} ${f.name}`);
      for (const d of r.duplicates) console.log(`dup      ${d.lines}  ${d.a}  ${d.b}`);
    }
    console.log(`${r.files} files in ${dir}: ${r.longFiles.length} over ${FILE_LINES} lines, ${r.longFunctions.length} functions over ${FUNCTION_LINES} lines, ${r.duplicates.length} duplicate pairs (runs of ${DUP_LINES}+ equal lines)`);
  }
}
