/**
 * A closed pipe is a normal end, as for any Unix filter: `berth run -q -- yes
 * | head -2` prints two lines, the remote command is ended (its channel
 * closed, as ssh does), the machine is returned normally — the same machine
 * ready again, never quarantined — and berth exits 141 (128 + SIGPIPE)
 * without a stack trace. Printers (`berth pool ls`, `berth token ls`) piped
 * into a reader that has gone exit 141 quietly too, and an exception nothing
 * expected prints one line and a pointer to `--debug`, never a stack.
 * Real shells (bash pipelines), a real `berth serve` + `berth agent`.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { BIN, Cluster } from "../helpers/cluster.js";

/** Runs a bash pipeline; `$BERTH` is the binary. Resolves with stdout, stderr and bash's own status. */
function pipeline(script: string, env: Record<string, string> = {}): Promise<{ status: number | null; stdout: string; stderr: string }> {
  const child = spawn("/bin/bash", ["-c", script], { env: { ...process.env, BERTH_PG_URL: "", BERTH: `${process.execPath} ${BIN}`, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  return new Promise((r) => child.once("close", (status) => r({ status, stdout, stderr })));
}

/** What a stack trace looks like in Node's output. */
const STACK = /^\s+at .+[(:]\d+|Unhandled 'error' event|node:internal/m;

describe("a closed pipe is a normal end", { timeout: 180_000 }, () => {
  const c = new Cluster({ runtime: "process", minReady: 1, maxReady: 1, slots: 2 });
  before(async () => {
    await c.start();
    await c.ensurePool("ci");
    await c.waitFor("a ready machine", async () => (await c.readyCount("ci")) >= 1);
  });
  after(() => c.close());

  const settled = () =>
    c.waitFor("the machine ready again", async () => {
      const ms = (await c.machines()).filter((m) => m.state !== "destroyed");
      return ms.length > 0 && ms.every((m) => m.state === "ready") ? ms : null;
    });

  for (const [what, remote, reader, expected] of [
    ["`yes | head -2`", "yes", "head -2", "y\ny\n"],
    ["`seq 1 10000000 | head -1`", "seq 1 10000000", "head -1", "1\n"],
    ["`yes | grep -q y`", "yes", "grep -q y", ""],
  ] as const) {
    test(`${what}: exit 141, no stack trace, the machine returned and lent again (not quarantined)`, async () => {
      const before = await settled();
      const r = await pipeline(`$BERTH run -q --config ${c.clientConfig} --pool ci -- ${remote} | ${reader}; echo "status=\${PIPESTATUS[0]}"`);
      assert.equal(r.stdout, `${expected}status=141\n`, r.stderr);
      assert.doesNotMatch(r.stderr, STACK);
      assert.equal(r.stderr, "", "-q: nothing of berth's own");
      const again = await settled();
      assert.deepEqual(again.map((m) => m.id), before.map((m) => m.id), "the same machine, returned normally (a quarantined one is destroyed and replaced)");
      assert.ok(again.every((m) => m.generation > before[0]!.generation));
    });
  }

  test("without -q berth still reports the return on stderr when only stdout was closed", async () => {
    await settled();
    const r = await pipeline(`$BERTH run --config ${c.clientConfig} --pool ci -- yes | head -1; echo "status=\${PIPESTATUS[0]}"`);
    assert.equal(r.stdout, "y\nstatus=141\n", r.stderr);
    assert.match(r.stderr, /returned m_/);
    assert.doesNotMatch(r.stderr, STACK);
    await settled();
  });

  test("printers into a reader that has gone: `berth pool ls | true`, `berth token ls | true` exit 141 quietly", async () => {
    for (const cmd of [`pool ls --config ${c.clientConfig}`, `pool show ci --config ${c.clientConfig}`, `token ls --state-dir ${c.coordDir}`, `pool ls --json --config ${c.clientConfig}`]) {
      // The reader closes its end first and only then lets berth start: every write berth makes meets a closed pipe.
      const fifo = join(c.dir.path, `closed-${Math.random().toString(36).slice(2)}`);
      const r = await pipeline(`mkfifo ${fifo}; { read -r _ < ${fifo}; $BERTH ${cmd}; } | { exec 0<&-; echo > ${fifo}; }; echo "status=\${PIPESTATUS[0]}"`);
      assert.equal(r.stdout, "status=141\n", `${cmd}: ${r.stderr}`);
      assert.equal(r.stderr, "", `${cmd}: nothing on stderr`);
    }
  });

  test("an exception nothing expected: one line and a pointer to --debug; --debug shows the stack", async () => {
    // Fault injection from outside berth: a module preloaded into the CLI throws while its request is in flight.
    const hook = join(c.dir.path, "throw-later.mjs");
    writeFileSync(
      hook,
      `import http from "node:http";\nimport { syncBuiltinESMExports } from "node:module";\nconst request = http.request;\nhttp.request = (...a) => { setImmediate(() => { throw new TypeError("injected fault"); }); return request(...a); };\nsyncBuiltinESMExports();\n`,
    );
    const plain = await pipeline(`${process.execPath} --import ${hook} ${BIN} pool ls --config ${c.clientConfig}`);
    assert.equal(plain.status, 1);
    assert.doesNotMatch(plain.stderr, STACK);
    assert.equal(plain.stderr.trim().split("\n").length, 1, plain.stderr);
    assert.match(plain.stderr, /^berth: internal error: TypeError: injected fault \(run again with --debug for details\)\n$/);
    const debug = await pipeline(`${process.execPath} --import ${hook} ${BIN} --debug pool ls --config ${c.clientConfig}`);
    assert.equal(debug.status, 1);
    assert.match(debug.stderr, /injected fault/);
    assert.match(debug.stderr, /^\s+at /m);
  });
});
