#!/usr/bin/env node
// Runs every compiled test file under dist/test with node's own test runner.
// Usage: node scripts/run-tests.mjs [substring ...]  (filters test files by path)
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { spawnSync } from "node:child_process";

function walk(dir, out) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) walk(p, out);
    else if (name.endsWith(".test.js")) out.push(p);
  }
  return out;
}
const filters = process.argv.slice(2);
const files = walk("dist/test", []).filter((f) => filters.length === 0 || filters.some((s) => f.includes(s))).sort();
if (files.length === 0) {
  console.error("no test files matched");
  process.exit(1);
}
const r = spawnSync(process.execPath, ["--test", `--test-concurrency=${process.env.BERTH_TEST_CONCURRENCY ?? 2}`, "--test-reporter=spec", ...files], { stdio: "inherit" });
process.exit(r.status ?? 1);
