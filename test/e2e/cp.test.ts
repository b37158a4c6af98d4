/**
 * `berth cp` against a real `berth serve` + `berth agent` (process runtime),
 * with a keeper receipt (the client config's keeper key) and a portable
 * receipt (its per-borrow key): a file up and down byte-exact, a tree with
 * modes (-r), several sources into a directory, and bad input with stable
 * codes and exit statuses: a missing file on either side, a directory without
 * -r, both sides local (usage, 2), a returned borrow.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Cluster, berth } from "../helpers/cluster.js";

const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");

describe("berth cp", { timeout: 240_000 }, () => {
  const c = new Cluster({ runtime: "process", minReady: 1, maxReady: 1, slots: 3, portable: true });
  before(async () => {
    await c.start();
    await c.ensurePool("ci");
    await c.ensurePool("agents", "portable");
    await c.waitFor("ready machines", async () => (await c.readyCount("ci")) >= 1 && (await c.readyCount("agents")) >= 1, 60_000);
  });
  after(() => c.close());

  for (const pool of ["ci", "agents"] as const) {
    test(`${pool === "ci" ? "keeper" : "portable"} receipt: files and trees both ways, refusals with codes`, async () => {
      const dir = join(c.dir.path, pool);
      mkdirSync(dir);
      const receipt = join(dir, "b.json");
      const cfg = ["--config", c.clientConfig];
      const access = pool === "agents" ? ["--access", "portable", "--duration", "10m"] : [];
      let r = await berth(["borrow", pool, ...access, "--receipt", receipt, ...cfg]);
      assert.equal(r.status, 0, r.stderr);
      if (pool === "agents") {
        r = await berth(["ack", "--receipt", receipt, ...cfg]);
        assert.equal(r.status, 0, r.stderr);
      }
      const cp = (...args: string[]) => berth(["cp", "--receipt", receipt, ...cfg, ...args], { cwd: dir });

      const data = randomBytes(8 * 1024 * 1024);
      writeFileSync(join(dir, "data.bin"), data);
      chmodSync(join(dir, "data.bin"), 0o640);
      r = await cp("data.bin", ":");
      assert.equal(r.status, 0, r.stderr);
      r = await cp(":data.bin", "back.bin");
      assert.equal(r.status, 0, r.stderr);
      assert.equal(sha(readFileSync(join(dir, "back.bin"))), sha(data));
      assert.equal(statSync(join(dir, "back.bin")).mode & 0o777, 0o640);

      mkdirSync(join(dir, "src", "lib"), { recursive: true });
      writeFileSync(join(dir, "src", "main.sh"), "echo main\n");
      chmodSync(join(dir, "src", "main.sh"), 0o755);
      writeFileSync(join(dir, "src", "lib", "x"), "x");
      r = await cp("src", ":src");
      assert.equal(r.status, 1, "a directory without -r");
      assert.match(r.stderr, /conflict: upload src: is a directory/);
      r = await cp("-r", "src", ":src");
      assert.equal(r.status, 0, r.stderr);
      // Several sources into a directory (the workspace root).
      writeFileSync(join(dir, "a.txt"), "a");
      writeFileSync(join(dir, "b.txt"), "b");
      r = await cp("a.txt", "b.txt", ":src");
      assert.equal(r.status, 0, r.stderr);
      mkdirSync(join(dir, "out"));
      r = await cp("-r", ":src", ":data.bin", "out");
      assert.equal(r.status, 0, r.stderr);
      assert.equal(readFileSync(join(dir, "out", "src", "main.sh"), "utf8"), "echo main\n");
      assert.equal(statSync(join(dir, "out", "src", "main.sh")).mode & 0o777, 0o755);
      assert.equal(readFileSync(join(dir, "out", "src", "a.txt"), "utf8"), "a");
      assert.equal(readFileSync(join(dir, "out", "src", "lib", "x"), "utf8"), "x");
      assert.equal(sha(readFileSync(join(dir, "out", "data.bin"))), sha(data));

      // Bad input.
      r = await cp(":no-such-file", "x");
      assert.equal(r.status, 1);
      assert.match(r.stderr, /not_found: download no-such-file: no such file or directory on the machine/);
      assert.equal(existsSync(join(dir, "x")) || existsSync(join(dir, "x.partial")), false);
      r = await cp("no-such-local", ":");
      assert.equal(r.status, 1);
      assert.match(r.stderr, /not_found: upload no-such-local: no such local file/);
      r = await cp("a.txt", "b.txt");
      assert.equal(r.status, 2, "both sides local is a usage error");
      r = await cp("a.txt", "b.txt", ":data.bin");
      assert.equal(r.status, 1, r.stderr);
      assert.match(r.stderr, /conflict: copying 2 files needs a directory on the machine/);

      r = await berth(["return", "--receipt", receipt, ...cfg]);
      assert.equal(r.status, 0, r.stderr);
      r = await cp("a.txt", ":");
      assert.notEqual(r.status, 0);
      assert.match(r.stderr, /borrow_not_active|was returned/);
    });
  }
});
