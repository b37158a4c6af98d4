#!/usr/bin/env node
/**
 * Builds dist/berth-pty-relay (src/agent/runtime/pty-relay.c) as a static binary, so
 * it runs inside any sandbox root. Part of `npm run build`. Where no C compiler
 * or static C library is present it says so and builds nothing: the gvisor
 * runtime then hands PTY sessions the host terminal as before (docs/runtimes.md).
 */
import { spawnSync } from "node:child_process";
import { mkdirSync, renameSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const src = join(root, "src", "agent", "runtime", "pty-relay.c");
const out = join(root, "dist", "berth-pty-relay");
const cc = process.env.CC || "cc";
mkdirSync(dirname(out), { recursive: true });
const tmp = `${out}.${process.pid}.tmp`;
const r = spawnSync(cc, ["-O2", "-static", "-o", tmp, src], { encoding: "utf8" });
if (r.status !== 0) {
  rmSync(tmp, { force: true });
  const why = r.error ? String(r.error.message) : r.stderr.trim();
  console.warn(`build-pty-relay: not built (${cc}: ${why}); gvisor PTY sessions use the host terminal`);
  process.exit(0);
}
renameSync(tmp, out);
