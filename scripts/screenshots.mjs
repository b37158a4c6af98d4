#!/usr/bin/env node
// Screenshots of every dashboard page at desktop (1280 px) and phone (390 px)
// widths, for a reviewer to look at. They are taken by the browser test, which
// walks every page against a real coordinator with live data (pools, borrows,
// an allocation, tokens, the audit trail) in the Debian chromium.
//
// Usage: npm run build && node scripts/screenshots.mjs [DIR]   (default: ./screenshots)
import { mkdirSync, readdirSync, rmSync } from "node:fs";
import { resolve } from "node:path";
import { spawnSync } from "node:child_process";

const dir = resolve(process.argv[2] ?? "screenshots");
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });
const r = spawnSync(process.execPath, ["--test", "--test-reporter=dot", "dist/test/dashboard/dashboard.test.js"], {
  stdio: ["ignore", "inherit", "inherit"],
  env: { ...process.env, BERTH_SCREENSHOTS: dir },
});
const shots = readdirSync(dir).filter((f) => f.endsWith(".png")).sort();
const phone = shots.filter((f) => f.startsWith("phone-"));
const desktop = shots.filter((f) => !f.startsWith("phone-"));
if (r.status !== 0) {
  console.error(`screenshots: the browser walk failed (exit ${r.status}); ${shots.length} screenshot(s) in ${dir}`);
  process.exit(1);
}
if (phone.length === 0 || desktop.length === 0) {
  console.error(`screenshots: expected desktop and phone screenshots in ${dir}, found ${shots.join(", ") || "none"} (is chromium installed?)`);
  process.exit(1);
}
console.log(`${dir}\n  desktop (1280 px): ${desktop.join(", ")}\n  phone (390 px):    ${phone.join(", ")}`);
