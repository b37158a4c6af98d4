/**
 * Portable access end to end: real `berth serve --portable` and `berth agent`
 * processes (process runtime), independently configured clients using the
 * real CLI, real SSH into the agent's gateway.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import { BerthClient } from "../../src/client/client.js";
import { cutFirstBorrowReply } from "../helpers/cut-proxy.js";
import { allCmdlines, berth, PortableCluster, receiptOf, runscAvailable, sleep, sshConnect, sshExec, sshHold, stop, until } from "../helpers/portable-e2e.js";

const mode = (p: string) => statSync(p).mode & 0o777;

describe("portable access with real processes (process runtime)", () => {
  let c: PortableCluster;
  before(async () => {
    c = await new PortableCluster({ runtime: "process", minReady: 2, maxReady: 3, heartbeatMs: 3_000 }).start();
  });
  after(async () => {
    await c?.close();
  });

  test("[I1] two independently configured clients borrow without sharing a key; an open session is cut by return; reborrow gets a fresh key", async () => {
    const alice = c.client("alice");
    const bob = c.client("bob");
    const ra = join(alice.dir, "borrow.json");
    const rb = join(bob.dir, "borrow.json");
    const borrowedA = await berth(["borrow", "agents", "--access", "portable", "--receipt", ra, ...alice.args]);
    assert.equal(borrowedA.status, 0, borrowedA.stderr);
    assert.match(borrowedA.stdout, /PENDING/);
    assert.match(borrowedA.stdout, /hard deadline/);
    // Both borrowers heartbeat from the borrow on, as `berth run` does (the pool's period is 3 s).
    const stopA = c.heartbeating(alice, receiptOf(ra));
    assert.equal((await berth(["borrow", "agents", "--access", "portable", "--receipt", rb, ...bob.args])).status, 0);
    const stopB = c.heartbeating(bob, receiptOf(rb));
    const ackedA = await berth(["ack", "--receipt", ra, ...alice.args]);
    assert.equal(ackedA.status, 0, ackedA.stderr);
    assert.match(ackedA.stdout, /ACTIVE/);
    assert.equal((await berth(["ack", "--receipt", rb, ...bob.args])).status, 0);
    const a = receiptOf(ra);
    const b = receiptOf(rb);
    for (const f of [ra, rb, a.keyFile, b.keyFile]) assert.equal(mode(f), 0o600, `${f} is owner-only`);
    assert.ok(a.keyFile.startsWith(alice.dir) && b.keyFile.startsWith(bob.dir));
    assert.notEqual(a.publicKey, b.publicKey);
    assert.notEqual(a.machine.id, b.machine.id);
    for (const out of [borrowedA.stdout, borrowedA.stderr, ackedA.stdout, ackedA.stderr]) {
      assert.ok(!out.includes(a.borrowToken) && !out.includes(a.grantToken), "no token printed");
    }

    const keyA = readFileSync(a.keyFile, "utf8");
    const keyB = readFileSync(b.keyFile, "utf8");
    const sa = await sshConnect(a.machine, keyA);
    assert.equal((await sshExec(sa, "echo hello-from-a")).out.trim(), "hello-from-a");
    // Alice's key opens nothing of Bob's, and the other way round.
    await assert.rejects(sshConnect(b.machine, keyA), /authentication/i);
    await assert.rejects(sshConnect(a.machine, keyB), /authentication/i);

    // An already-open session is cut when its borrow is returned.
    const held = await sshHold(sa, "echo started; sleep 600");
    await stopA();
    const returned = await berth(["return", "--receipt", ra, ...alice.args]);
    assert.equal(returned.status, 0, returned.stderr);
    const ended = await held.closed;
    assert.notEqual(ended.code, 0, "the session did not finish on its own");
    assert.ok(!existsSync(a.keyFile), "the ephemeral key is gone after the return");
    await assert.rejects(sshConnect(a.machine, keyA), /authentication/i);
    await until("alice's grant closed", async () => (await c.grant(a.borrowId)).state === "closed");
    const gb = await c.grant(b.borrowId);
    assert.equal(gb.state, "active", "bob's borrow is untouched");
    assert.equal((await sshExec(await sshConnect(b.machine, keyB), "echo still-bob")).out.trim(), "still-bob");

    // Reborrow: a fresh grant with a fresh key.
    const ra2 = join(alice.dir, "again.json");
    assert.equal((await berth(["borrow", "agents", "--access", "portable", "--receipt", ra2, ...alice.args])).status, 0);
    const stopA2 = c.heartbeating(alice, receiptOf(ra2));
    assert.equal((await berth(["ack", "--receipt", ra2, ...alice.args])).status, 0);
    const a2 = receiptOf(ra2);
    assert.notEqual(a2.publicKey, a.publicKey);
    assert.notEqual(a2.borrowId, a.borrowId);
    assert.equal((await sshExec(await sshConnect(a2.machine, readFileSync(a2.keyFile, "utf8")), "echo again")).out.trim(), "again");
    await Promise.all([stopA2(), stopB()]);
    for (const [r, cl] of [[ra2, alice], [rb, bob]] as const) assert.equal((await berth(["return", "--receipt", r, ...cl.args])).status, 0);
    await c.waitReady(2);
  });

  test("a portable borrow whose reply is lost is sent again: the same grant, acknowledged and used; no second grant", async () => {
    const carol = c.client("carol");
    const proxy = await cutFirstBorrowReply(c.coordinator!.url);
    const via = new BerthClient({ url: proxy.url, token: readFileSync(join(carol.dir, "token"), "utf8").trim(), keeperKeyFile: null });
    try {
      const b = await via.borrow({ pool: "agents", access: "portable" });
      assert.equal(proxy.cut(), 1, "the first answer was cut");
      await via.ack(b);
      const r = await via.exec(b, ["echo", "portable-after-a-lost-reply"]);
      assert.equal(r.stdout!.toString(), "portable-after-a-lost-reply\n");
      const db = new Database(join(c.coordDir, "berth.db"), { readonly: true });
      try {
        const grants = db.prepare("SELECT id, state FROM grants WHERE borrower = ?").all(carol.tokenId) as { id: string; state: string }[];
        assert.deepEqual(grants, [{ id: b.id, state: "active" }], "one grant, the one the client holds");
      } finally {
        db.close();
      }
      assert.equal((await via.return(b)).repeated, false);
    } finally {
      await via.close();
      await proxy.close();
    }
  });

  test("[I8] berth run: the command's exit status; no token in stdout, stderr or any process's argv; key and receipt removed", async () => {
    const carol = c.client("carol");
    let scanned = 0;
    let leaked: string[] = [];
    let scanning: Promise<ReturnType<typeof receiptOf>> | null = null;
    const running = berth(["run", "--pool", "agents", "--pool-access", "portable", ...carol.args, "--", "sh", "-c", "echo out-line; echo err-line >&2; sleep 2; exit 7"], {
      onSpawn: () => {
        const scan = async () => {
          const receipts = join(carol.dir, "receipts");
          const file = await until("a run receipt", () => existsSync(receipts) && readdirSync(receipts).find((f) => f.endsWith(".json")), 15_000, 20);
          const r = receiptOf(join(receipts, file));
          await until("the grant active", () => receiptOf(join(receipts, file)).state === "active", 15_000, 20);
          assert.equal(mode(join(receipts, file)), 0o600);
          assert.equal(mode(r.keyFile), 0o600);
          const apiToken = readFileSync(join(carol.dir, "token"), "utf8").trim();
          for (let i = 0; i < 5; i++) {
            const lines = allCmdlines();
            scanned += lines.length;
            leaked = leaked.concat(lines.filter((l) => l.includes(r.borrowToken) || l.includes(r.grantToken) || l.includes(apiToken)));
            await sleep(100);
          }
          return r;
        };
        scanning = scan();
      },
    });
    const res = await running;
    const r = await scanning!;
    assert.equal(res.status, 7, res.stderr);
    assert.match(res.stdout, /out-line/);
    assert.match(res.stderr, /err-line/);
    assert.ok(scanned > 0);
    assert.deepEqual(leaked, [], "no token in any process's argv");
    for (const out of [res.stdout, res.stderr]) assert.ok(!out.includes(r.borrowToken) && !out.includes(r.grantToken), "no token in the output");
    assert.ok(!existsSync(r.keyFile), "private key removed after cleanup");
    assert.equal(readdirSync(join(carol.dir, "receipts")).length, 0, "receipt removed after cleanup");
  });

  test("[I3] berth run: sleep 600 borrowed for 5 s is interrupted at the deadline (124); heartbeats leave the deadline where it was", async () => {
    const dan = c.client("dan");
    const hbBefore = await heartbeatsOk(c);
    const res = await berth(["run", "--pool", "agents", "--pool-access", "portable", "--duration", "5s", ...dan.args, "--", "sleep", "600"]);
    assert.equal(res.status, 124, res.stderr);
    assert.match(res.stderr, /expired at (\S+); the command was interrupted/);
    const disclosed = /hard deadline (\S+)/.exec(res.stderr)![1]!;
    const reported = /expired at (\S+);/.exec(res.stderr)![1]!;
    assert.equal(reported, disclosed, "the deadline reported at the end is the one disclosed at the start");
    const borrowId = /borrow (g_\S+) expired/.exec(res.stderr)![1]!;
    const g = await c.grant(borrowId);
    assert.equal(new Date(g.expiresAt).toISOString().replace(/\.\d{3}Z$/, "Z"), disclosed, "the coordinator's expiry never moved");
    assert.ok((await heartbeatsOk(c)) - hbBefore >= 2, "heartbeats were sent during the job");
    // The sandbox's sleep is gone with the grant (fenced).
    await until("the sleep gone", () => !allCmdlines().some((l) => l.trim() === "sleep 600"), 15_000);
  });

  test("[I6] a SIGKILLed borrower is quarantined and its machine destroyed; the pool refills", async () => {
    const eve = c.client("eve");
    let pid = 0;
    const running = berth(["run", "--pool", "agents", "--pool-access", "portable", ...eve.args, "--", "sleep", "600.25"], { onSpawn: (ch) => (pid = ch.pid!) });
    const receipts = join(eve.dir, "receipts");
    const file = await until("a run receipt", () => existsSync(receipts) && readdirSync(receipts).find((f) => f.endsWith(".json")), 15_000, 20);
    await until("the command running", () => allCmdlines().some((l) => l.trim() === "sleep 600.25"), 15_000, 20);
    const r = receiptOf(join(receipts, file));
    process.kill(pid, "SIGKILL");
    await running;
    const g = await until("the grant invalidated", async () => {
      const x = await c.grant(r.borrowId);
      return x.state !== "active" ? x : null;
    }, 20_000);
    assert.equal(g.reason, "heartbeat_missed");
    await until("the machine destroyed", async () => ["destroyed", "pruned"].includes((await c.grant(r.borrowId)).machine.state), 30_000);
    await until("the sandbox's process gone", () => !allCmdlines().some((l) => l.trim() === "sleep 600.25"), 15_000);
    await assert.rejects(sshConnect(r.machine, readFileSync(r.keyFile, "utf8")), /ECONNREFUSED|authentication|closed|reset/i);
    await c.waitReady(2);
  });

  test("command status and cleanup failure: the command's failure wins; a success with failed cleanup is 75; the kept receipt retries cleanup", async () => {
    const fay = c.client("fay");
    const receipts = join(fay.dir, "receipts");
    for (const [cmd, want] of [["exit 3", 3], ["exit 0", 75]] as const) {
      const running = berth(["run", "--pool", "agents", "--pool-access", "portable", ...fay.args, "--", "sh", "-c", `sleep 1.5; ${cmd}`]);
      await until("the grant active", () => existsSync(receipts) && readdirSync(receipts).some((f) => f.endsWith(".json") && receiptOf(join(receipts, f)).state === "active"), 15_000, 20);
      await stop(c.coordinator); // the return will find no coordinator
      const res = await running;
      assert.equal(res.status, want, res.stderr);
      assert.match(res.stderr, /cleanup failed: .*the receipt is kept at (\S+)/);
      const kept = /the receipt is kept at (\S+?) \(/.exec(res.stderr)![1]!;
      const r = receiptOf(kept);
      assert.ok(existsSync(r.keyFile), "the key stays until cleanup is done");
      await c.startCoordinator();
      const retry = await berth(["return", "--receipt", kept, ...fay.args]);
      assert.equal(retry.status, 0, retry.stderr);
      assert.ok(!existsSync(r.keyFile), "and goes after it");
      await until("cleanup finished", async () => (await c.grant(r.borrowId)).state === "closed", 20_000);
      (await import("node:fs")).rmSync(kept);
    }
    await c.waitReady(2);
  });

  test("[I3][I6] with the coordinator stopped, the agent still cuts access at expiresAt", async () => {
    const gus = c.client("gus");
    const rf = join(gus.dir, "borrow.json");
    assert.equal((await berth(["borrow", "agents", "--access", "portable", "--duration", "6s", "--receipt", rf, ...gus.args])).status, 0);
    assert.equal((await berth(["ack", "--receipt", rf, ...gus.args])).status, 0);
    const r = receiptOf(rf);
    const key = readFileSync(r.keyFile, "utf8");
    const conn = await sshConnect(r.machine, key);
    const held = await sshHold(conn, "echo started; sleep 600");
    await stop(c.coordinator);
    const ended = await held.closed;
    assert.ok(Date.now() >= r.expiresAt, "cut at the deadline, not before");
    assert.notEqual(ended.code, 0);
    await assert.rejects(sshConnect(r.machine, key), /authentication/i);
    await c.startCoordinator();
    await until("the expired grant cleaned up", async () => (await c.grant(r.borrowId)).state === "closed", 20_000);
    assert.equal((await c.grant(r.borrowId)).reason, "expired");
  });

  test("[I9] nothing is left running: drained, every machine destroyed, both processes gone", async () => {
    const agentPid = c.agent!.child.pid!;
    const coordPid = c.coordinator!.child.pid!;
    await c.admin.call("POST", "/v1/pools/agents/drain", {});
    await until("every machine destroyed", async () => Object.entries(await c.machineStates()).every(([s, n]) => s === "destroyed" || n === 0), 60_000);
    const root = c.tmp.path;
    await c.close();
    for (const pid of [agentPid, coordPid]) assert.ok(!existsSync(`/proc/${pid}`) || readFileSync(`/proc/${pid}/stat`, "utf8").split(" ")[2] === "Z", `process ${pid} is gone`);
    assert.deepEqual(allCmdlines().filter((l) => l.includes(root) || /^sleep 600(\.25)? $/.test(l)), []);
  });
});

describe("portable access on the gvisor runtime", { skip: runscAvailable() }, () => {
  test("run on a gvisor sandbox: exit status kept, key removed, machine fenced back to ready", async () => {
    const c = await new PortableCluster({ runtime: "gvisor", minReady: 1, maxReady: 1, slots: 2 }).start();
    try {
      const hal = c.client("hal");
      const res = await berth(["run", "--pool", "agents", "--pool-access", "portable", ...hal.args, "--", "sh", "-c", "echo in-gvisor; exit 5"]);
      assert.equal(res.status, 5, res.stderr);
      assert.match(res.stdout, /in-gvisor/);
      assert.equal(readdirSync(join(hal.dir, "receipts")).length, 0);
      await c.waitReady(1); // fenced (new sandbox incarnation) and scrubbed before anyone borrows it again
      const rf = join(hal.dir, "borrow.json");
      assert.equal((await berth(["borrow", "agents", "--access", "portable", "--receipt", rf, ...hal.args])).status, 0);
      assert.equal((await berth(["ack", "--receipt", rf, ...hal.args])).status, 0);
      const r = receiptOf(rf);
      const key = readFileSync(r.keyFile, "utf8");
      const held = await sshHold(await sshConnect(r.machine, key), "echo started; sleep 600");
      assert.equal((await berth(["return", "--receipt", rf, ...hal.args])).status, 0);
      await held.closed;
      await assert.rejects(sshConnect(r.machine, key), /authentication/i);
      await until("fenced, scrubbed, ready again", async () => (await c.grant(r.borrowId)).state === "closed", 60_000);
      await c.waitReady(1);
    } finally {
      await c.close();
    }
  });
});

async function heartbeatsOk(c: PortableCluster): Promise<number> {
  const text = (await c.admin.raw("GET", "/metrics")).text;
  const line = text.split("\n").find((l) => l.startsWith("berth_heartbeats_total{") && l.includes('outcome="ok"'));
  return line ? Number(line.split(" ").pop()) : 0;
}
