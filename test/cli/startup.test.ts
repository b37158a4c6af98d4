/**
 * Start-up: `berth --version` loads no package at all, and client commands
 * load neither server code nor its native or heavy dependencies (the
 * database drivers, node-pty, pino, undici), nor ssh2 until they open SSH.
 * What is loaded is read from Node's own module trace (NODE_DEBUG=module);
 * the time it takes is measured in bench/cli-latency, never here.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { BIN } from "../helpers/cluster.js";
import { tempDir } from "../helpers/env.js";
import { VERSION } from "../../src/core/version.js";

const SERVER_ONLY = ["better-sqlite3", "pg", "node-pty", "pino", "undici"];

function traced(args: string[]): { status: number | null; stdout: string; packages: Set<string> } {
  const r = spawnSync(process.execPath, [BIN, ...args], { env: { ...process.env, NODE_DEBUG: "module", BERTH_PG_URL: "", BERTH_CONFIG: "" }, encoding: "utf8", timeout: 60_000 });
  const packages = new Set([...r.stderr.matchAll(/node_modules\/((?:@[^/]+\/)?[^/]+)\//g)].map((m) => m[1]!));
  return { status: r.status, stdout: r.stdout, packages };
}

describe("start-up loads only what the command uses", () => {
  test("--version prints the package's version and loads no package", () => {
    const pkg = JSON.parse(readFileSync("package.json", "utf8")) as { version: string };
    assert.equal(VERSION, pkg.version);
    const r = traced(["--version"]);
    assert.equal(r.status, 0);
    assert.equal(r.stdout, `${pkg.version}\n`);
    assert.deepEqual([...r.packages], []);
  });

  test("client commands load no server dependency, and ssh2 only when they open SSH", () => {
    const d = tempDir("berth-startup-");
    try {
      const token = join(d.path, "token");
      writeFileSync(token, "not-a-real-token\n", { mode: 0o600 });
      // A keeper key in the client config: `berth run` refuses a keeper run without one before any request.
      writeFileSync(join(d.path, "keeper"), "not a real key\n", { mode: 0o600 });
      const config = join(d.path, "client.json");
      writeFileSync(config, JSON.stringify({ keeperKeyFile: "keeper" }), { mode: 0o600 });
      const client = ["--url", "http://127.0.0.1:9", "--token-file", token, "--config", config];
      for (const args of [
        ["run", "-q", "--wait", "0s", "--pool", "p", ...client, "--", "true"],
        ["pool", "ls", ...client],
        ["borrow", "p", "--receipt", join(d.path, "r.json"), ...client],
      ]) {
        const r = traced(args);
        assert.equal(r.status, 69, `${args[0]}: the coordinator is unreachable`);
        for (const p of SERVER_ONLY) assert.ok(!r.packages.has(p), `berth ${args[0]} loaded ${p}`);
        assert.ok(!r.packages.has("ssh2"), `berth ${args[0]} loaded ssh2 without opening SSH`);
        assert.ok(r.packages.has("commander"));
      }
    } finally {
      d.cleanup();
    }
  });
});
