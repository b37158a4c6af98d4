/**
 * The client's files API over SFTP (import from "berth"), against a real
 * `berth serve` + `berth agent` (process runtime), keeper and portable
 * borrows: read/write/list, upload/download of a file (sha256) and of a tree
 * with its modes, refusals with stable codes (missing file, a directory where
 * a file is meant, a returned borrow), a download cut by the return leaves
 * nothing under the local name, and the machine is ready again afterwards.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { BerthClient, BerthError } from "berth";
import { Cluster } from "../helpers/cluster.js";

const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");

async function refusedWith(p: Promise<unknown>, code: string): Promise<BerthError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof BerthError, `a BerthError, not ${String(e)}`);
    assert.equal(e.code, code, e.message);
    return e;
  }
  assert.fail(`expected a ${code} refusal`);
}

describe("client files over SFTP", { timeout: 240_000 }, () => {
  const c = new Cluster({ runtime: "process", minReady: 2, maxReady: 2, slots: 3 });
  let client: BerthClient;
  before(async () => {
    await c.start();
    await c.ensurePool("ci");
    await c.waitFor("two ready machines", async () => (await c.readyCount("ci")) >= 2, 60_000);
    client = BerthClient.fromConfig({ config: c.clientConfig });
  });
  after(async () => {
    await client?.close();
    await c.close();
  });

  test("write, read, list, stat; upload and download a file and a tree with modes; refusals with codes", async () => {
    const b = await client.borrow({ pool: "ci" });
    const dir = c.dir.path;
    try {
      await client.writeFile(b, "hello.txt", "hi there\n", { mode: 0o640 });
      assert.equal((await client.readFile(b, "hello.txt")).toString(), "hi there\n");
      const files = await client.files(b);
      try {
        const ls = await files.list(".");
        const hello = ls.find((e) => e.name === "hello.txt");
        assert.deepEqual({ type: hello?.type, size: hello?.size, mode: hello?.mode }, { type: "file", size: 9, mode: 0o640 });
        assert.ok(!ls.some((e) => e.name.includes("berth-partial")), "no partial file left behind");
        // Relative paths are the workspace.
        const ws = await files.realpath(".");
        assert.equal((await client.exec(b, "pwd")).stdout?.toString().trim(), ws);

        // Replacing a file is whole: the old content until the rename.
        await files.write("hello.txt", Buffer.from("second"));
        assert.equal((await files.read("hello.txt")).toString(), "second");

        // 20 MB up and down, byte-exact.
        const big = randomBytes(20 * 1024 * 1024);
        writeFileSync(join(dir, "big.bin"), big);
        chmodSync(join(dir, "big.bin"), 0o600);
        let progress = 0;
        await files.upload(join(dir, "big.bin"), "big.bin", { onProgress: (done) => (progress = done) });
        assert.equal(progress, big.length);
        assert.equal((await files.stat("big.bin")).mode, 0o600);
        await files.download("big.bin", join(dir, "big.back"));
        assert.equal(sha(readFileSync(join(dir, "big.back"))), sha(big));
        assert.equal(statSync(join(dir, "big.back")).mode & 0o777, 0o600);
        assert.equal(existsSync(join(dir, "big.back.partial")), false);

        // A tree with its modes, both ways.
        const tree = join(dir, "tree");
        mkdirSync(join(tree, "sub"), { recursive: true });
        writeFileSync(join(tree, "run.sh"), "#!/bin/sh\n");
        chmodSync(join(tree, "run.sh"), 0o755);
        writeFileSync(join(tree, "sub", "key"), "k");
        chmodSync(join(tree, "sub", "key"), 0o600);
        chmodSync(join(tree, "sub"), 0o700);
        await refusedWith(files.upload(tree, "tree"), "conflict");
        await files.upload(tree, "tree", { recursive: true });
        assert.deepEqual((await files.list("tree")).map((e) => [e.name, e.type, e.mode.toString(8)]), [["run.sh", "file", "755"], ["sub", "directory", "700"]]);
        await files.download("tree", join(dir, "tree.back"), { recursive: true });
        assert.deepEqual(readdirSync(join(dir, "tree.back")).sort(), ["run.sh", "sub"]);
        assert.equal(statSync(join(dir, "tree.back", "sub", "key")).mode & 0o777, 0o600);
        assert.equal(statSync(join(dir, "tree.back", "sub")).mode & 0o777, 0o700);

        // Refusals.
        await refusedWith(files.read("no-such-file"), "not_found");
        await refusedWith(files.read("tree"), "conflict");
        await refusedWith(files.download("nope", join(dir, "nope")), "not_found");
        assert.equal(existsSync(join(dir, "nope")) || existsSync(join(dir, "nope.partial")), false);
        await refusedWith(files.upload(join(dir, "missing-local"), "x"), "not_found");
        await refusedWith(files.write("tree", "x"), "conflict");
        await refusedWith(files.list("no-such-dir"), "not_found");
      } finally {
        files.close();
      }
    } finally {
      await client.return(b);
    }
    await refusedWith(client.readFile(b, "hello.txt"), "borrow_not_active");
  });

  test("a return cuts an open download: transfer_cut, nothing under the local name, the machine ready again", async () => {
    const b = await client.borrow({ pool: "ci" });
    const dir = c.dir.path;
    // 300 MB of zeros on the machine (fast to make there; the download is what is cut).
    const made = await client.exec(b, "head -c 314572800 /dev/zero > zeros.bin && echo ok");
    assert.equal(made.stdout?.toString().trim(), "ok");
    const files = await client.files(b);
    let started!: () => void;
    const running = new Promise<void>((r) => (started = r));
    const local = join(dir, "zeros.bin");
    const dl = files.download("zeros.bin", local, { onProgress: (done) => done > 0 && started() });
    dl.catch(() => undefined);
    await running;
    await client.return(b);
    await refusedWith(dl, "transfer_cut");
    assert.equal(existsSync(local), false, "nothing under the local name");
    assert.equal(existsSync(`${local}.partial`), false, "the partial file removed");
    await c.waitFor("both machines ready again", async () => {
      const ms = await c.machines();
      return ms.length >= 2 && ms.every((m) => m.state === "ready") ? ms : null;
    });
  });
});
