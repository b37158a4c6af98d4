/**
 * What berth prints is a command that works, and a refusal says its real
 * cause. Through the binary, against a real `berth serve` + `berth agent`
 * (process runtime, one host of 2 slots):
 *   - usage errors are one line and a pointer to the command's --help, exit 2
 *     (`berth ssh` with nothing to connect to included);
 *   - an invalid URL names where it came from (BERTH_URL=notaurl, --url);
 *   - `berth run` on a keeper pool without a keeper key refuses before
 *     borrowing anything;
 *   - `berth token ls|create` refuse a directory without a coordinator
 *     database (none is created) unless --init;
 *   - `berth --help` says which key reaches which kind of pool;
 *   - the ssh line `berth borrow` prints works as printed with the system ssh
 *     client (the host key pinned in a known_hosts file next to the receipt).
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { berth, Cluster } from "../helpers/cluster.js";

describe("hints are commands that work", { timeout: 180_000 }, () => {
  const c = new Cluster({ runtime: "process", minReady: 1, maxReady: 1, slots: 2 });
  before(async () => {
    await c.start();
    await c.ensurePool("ci");
    await c.waitFor("a ready machine", async () => (await c.readyCount("ci")) >= 1);
  });
  after(() => c.close());

  const settled = () =>
    c.waitFor("the machine ready", async () => {
      const ms = (await c.machines()).filter((m) => m.state !== "destroyed");
      return ms.length > 0 && ms.every((m) => m.state === "ready") ? ms : null;
    });

  test("usage errors: one line and a --help pointer, exit 2; `berth ssh` with nothing to connect to is one", async () => {
    for (const [args, help] of [
      [["ssh"], "berth ssh --help"],
      [["run", "--pool", "ci"], "berth run --help"],
      [["pool", "ls", "--no-such-flag"], "berth pool ls --help"],
      [["borrow"], "berth borrow --help"],
      [["run", "--pool-access", "sideways", "--", "true"], "berth run --help"],
    ] as const) {
      const r = await berth([...args, "--config", c.clientConfig]);
      assert.equal(r.status, 2, `${args.join(" ")}: ${r.stderr}`);
      const lines = r.stderr.trimEnd().split("\n");
      assert.equal(lines.length, 2, `${args.join(" ")}: one line and the pointer, not the whole help:\n${r.stderr}`);
      assert.match(lines[0]!, /^berth: \S/);
      assert.equal(lines[1], `(see: ${help})`);
      assert.equal(r.stdout, "");
    }
  });

  test("an invalid URL names where it came from", async () => {
    const env = await berth(["pool", "ls"], { env: { BERTH_URL: "notaurl", BERTH_TOKEN_FILE: c.adminTokenFile } });
    assert.equal(env.status, 2, env.stderr);
    assert.match(env.stderr, /BERTH_URL=notaurl is not a coordinator URL/);
    assert.doesNotMatch(env.stderr, /^berth: Invalid URL$/m);
    const flag = await berth(["pool", "ls", "--url", "ftp://x", "--token-file", c.adminTokenFile]);
    assert.equal(flag.status, 2, flag.stderr);
    assert.match(flag.stderr, /--url ftp:\/\/x is not a coordinator URL/);
    const file = join(c.dir.path, "bad-url.json");
    writeFileSync(file, JSON.stringify({ url: "127.0.0.1:7420", tokenFile: "admin.token" }), { mode: 0o600 });
    const conf = await berth(["pool", "ls", "--config", file]);
    assert.equal(conf.status, 2, conf.stderr);
    assert.match(conf.stderr, new RegExp(`"url" in ${file.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")} \\(127\\.0\\.0\\.1:7420\\) is not a coordinator URL`));
  });

  test("`berth run` on a keeper pool without a keeper key refuses before borrowing", async () => {
    const before = await settled();
    const keyless = join(c.dir.path, "keyless.json");
    writeFileSync(keyless, JSON.stringify({ url: c.coordinator!.url, tokenFile: "admin.token" }), { mode: 0o600 });
    const r = await berth(["run", "--config", keyless, "--pool", "ci", "--", "true"]);
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, /no keeper key/);
    assert.doesNotMatch(r.stderr, /borrowed/);
    const after = await settled();
    assert.deepEqual(after.map((m) => [m.id, m.generation]), before.map((m) => [m.id, m.generation]), "nothing was borrowed");
  });

  test("`berth token ls|create` refuse a directory without a coordinator database unless --init", async () => {
    const empty = join(c.dir.path, "not-a-coordinator");
    for (const args of [["token", "ls"], ["token", "create", "--org", "x"]]) {
      const r = await berth([...args, "--state-dir", empty]);
      assert.equal(r.status, 2, `${args.join(" ")}: ${r.stderr}`);
      assert.match(r.stderr, /no coordinator database/);
      assert.match(r.stderr, /--init/);
      assert.ok(!existsSync(join(empty, "berth.db")), "no database created");
    }
    const init = await berth(["token", "create", "--org", "x", "--init", "--state-dir", empty]);
    assert.equal(init.status, 0, init.stderr);
    assert.ok(existsSync(join(empty, "berth.db")));
    const ls = await berth(["token", "ls", "--state-dir", empty]);
    assert.equal(ls.status, 0, ls.stderr);
    assert.match(ls.stdout, /tok_/);
  });

  test("`berth --help` says which key reaches which pool", async () => {
    const r = await berth(["--help"]);
    assert.equal(r.status, 0);
    assert.doesNotMatch(r.stdout, /with a key that exists only for the borrow/);
    assert.match(r.stdout, /keeper pool[^]*keeper's own key/);
    assert.match(r.stdout, /portable pool[^]*its own key/);
  });

  test("the ssh line `berth borrow` prints works as printed: the host key is pinned next to the receipt", async () => {
    await settled();
    const receipt = join(c.dir.path, "hint.json");
    const b = await berth(["borrow", "ci", "--config", c.clientConfig, "--receipt", receipt]);
    assert.equal(b.status, 0, b.stderr);
    const line = /^ssh: (ssh .+)$/m.exec(b.stdout)?.[1];
    assert.ok(line, b.stdout);
    assert.match(line, /StrictHostKeyChecking=yes/);
    assert.match(line, new RegExp(`UserKnownHostsFile=${receipt.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")}\\.known_hosts`));
    const r = JSON.parse(readFileSync(receipt, "utf8")) as { machine: { ssh: { hostKey: string } } };
    assert.match(readFileSync(`${receipt}.known_hosts`, "utf8"), new RegExp(r.machine.ssh.hostKey.split(" ")[1]!.replace(/[+/]/g, "\\$&")));
    const viaSsh = spawnSync("sh", ["-c", `${line} -o BatchMode=yes 'echo hint-$((6*7))'`], { encoding: "utf8", timeout: 30_000, stdio: ["ignore", "pipe", "pipe"] });
    assert.equal(viaSsh.stdout, "hint-42\n", viaSsh.stderr);
    assert.equal(viaSsh.status, 0);
    const back = await berth(["return", "--config", c.clientConfig, "--receipt", receipt]);
    assert.equal(back.status, 0, back.stderr);
  });
});
