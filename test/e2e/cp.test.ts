/**
 * `berth cp` against a real `berth serve` + `berth agent` (process runtime),
 * with a keeper receipt (the client config's keeper key) and a portable
 * receipt (its per-borrow key): a file up and down byte-exact; with the
 * keeper receipt also a tree with
 * modes (-r), several sources into a directory, and bad input with stable
 * codes and exit statuses: a missing file on either side, a directory without
 * -r, both sides local (usage, 2), a returned borrow. Then a copy
 * interrupted by SIGINT (Ctrl-C) mid-way, each way: exit 130 and no partial
 * file on either side; and a copy into a machine whose workspace is full (a
 * small tmpfs mounted over it): `disk_full`, nothing partial left, and the
 * machine takes a small file and runs a command afterwards.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { execFileSync } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, readFileSync, readdirSync, statSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
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
    test(`${pool === "ci" ? "keeper receipt: files and trees both ways, refusals with codes, Ctrl-C, a full disk" : "portable receipt: a file both ways"}`, async () => {
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
      // The pool's heartbeat period is 60 s and this test can take longer on a loaded host: heartbeat as a borrower would.
      const beat = setInterval(() => void berth(["heartbeat", "--receipt", receipt, ...cfg]), 15_000).unref();

      const data = randomBytes(8 * 1024 * 1024);
      writeFileSync(join(dir, "data.bin"), data);
      chmodSync(join(dir, "data.bin"), 0o640);
      r = await cp("data.bin", ":");
      assert.equal(r.status, 0, r.stderr);
      r = await cp(":data.bin", "back.bin");
      assert.equal(r.status, 0, r.stderr);
      assert.equal(sha(readFileSync(join(dir, "back.bin"))), sha(data));
      assert.equal(statSync(join(dir, "back.bin")).mode & 0o777, 0o640);

      // The rest does not depend on the key: the keeper borrow only (the portable one proved its key above).
      if (pool === "ci") {
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

        await interruptedAndFull(receipt, cfg, join(dir, "interrupt"));
      }

      clearInterval(beat);
      r = await berth(["return", "--receipt", receipt, ...cfg]);
      assert.equal(r.status, 0, r.stderr);
      r = await cp("a.txt", ":");
      assert.notEqual(r.status, 0);
      assert.match(r.stderr, /borrow_not_active|was returned/);
    });
  }
});

/** On a borrowed process-runtime machine: Ctrl-C mid-copy each way (exit 130, no partial file on either side); a full workspace (disk_full, nothing partial, the machine still usable). */
async function interruptedAndFull(receipt: string, cfg: string[], dir: string): Promise<void> {
  mkdirSync(dir);
  let r: Awaited<ReturnType<typeof berth>>;
  const cp = (args: string[], onSpawn?: (ch: ChildProcess) => void) => berth(["cp", "--receipt", receipt, ...cfg, ...args], { cwd: dir, ...(onSpawn ? { onSpawn } : {}) });
  const sh = (cmd: string) => berth(["ssh", "--receipt", receipt, ...cfg, "--", "sh", "-c", cmd]);
  // The process runtime's workspace is a directory on this host: watched directly.
  r = await sh("pwd -P");
  assert.equal(r.status, 0, r.stderr);
  const ws = r.stdout.trim();
  assert.ok(existsSync(ws), `workspace ${ws} on this host`);
  const partials = (d: string) => readdirSync(d).filter((n) => n.includes("partial"));
  /** Starts `berth cp`, sends SIGINT once a partial file holding bytes shows up in `watch`, returns the result. */
  const interrupted = async (args: string[], watch: string) => {
    let child!: ChildProcess;
    const done = cp(args, (ch) => (child = ch));
    let exited = false;
    void done.then(() => (exited = true));
    for (;;) {
      assert.equal(exited, false, "the copy ended before it could be interrupted");
      const p = partials(watch).find((n) => statSync(join(watch, n)).size > 0);
      if (p) break;
      await sleep(20);
    }
    child.kill("SIGINT");
    return done;
  };
  // Up: 1 GiB (sparse here; the bytes still cross), interrupted mid-way.
  writeFileSync(join(dir, "big.bin"), "");
  truncateSync(join(dir, "big.bin"), 1 << 30);
  r = await interrupted(["big.bin", ":"], ws);
  assert.equal(r.status, 130, `exit 130 after SIGINT: ${r.stderr}`);
  assert.match(r.stderr, /interrupted/);
  assert.deepEqual(partials(ws), [], "no partial file left on the machine");
  assert.equal(existsSync(join(ws, "big.bin")), false, "nothing under the target name");

  // Down: 1 GiB made on the machine, interrupted mid-way.
  r = await sh("truncate -s 1G zeros.bin && echo ok");
  assert.equal(r.status, 0, r.stderr);
  r = await interrupted([":zeros.bin", "zeros.bin"], dir);
  assert.equal(r.status, 130, `exit 130 after SIGINT: ${r.stderr}`);
  assert.deepEqual(partials(dir), [], "no partial file left locally");
  assert.equal(existsSync(join(dir, "zeros.bin")), false, "nothing under the local name");
  assert.deepEqual(partials(ws), [], "nor on the machine");

  // A full workspace: a 4 MiB tmpfs over it, owned by the machine's user.
  const st = statSync(ws);
  execFileSync("mount", ["-t", "tmpfs", "-o", `size=4m,mode=0700,uid=${st.uid},gid=${st.gid}`, "berth-test-full", ws]);
  try {
    writeFileSync(join(dir, "eight.bin"), randomBytes(8 * 1024 * 1024));
    r = await cp(["eight.bin", ":"]);
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /disk_full: upload to eight\.bin: no space left on the machine's disk/);
    assert.deepEqual(readdirSync(ws), [], "nothing partial left in the full workspace");
    writeFileSync(join(dir, "small.txt"), "still usable\n");
    r = await cp(["small.txt", ":"]);
    assert.equal(r.status, 0, r.stderr);
    r = await sh("cat small.txt");
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout.trim(), "still usable");
  } finally {
    execFileSync("umount", ["-l", ws]);
  }
}
