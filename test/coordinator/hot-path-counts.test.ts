/**
 * The keeper borrow's cost, counted rather than timed: for one keeper borrow
 * and one return, the SQL statements the coordinator runs, the transactions
 * it commits and (SQLite) the fsyncs it makes. Counts do not move with the
 * load on the machine, so this guard fails on the change that adds work to
 * the hot path, not on a busy day. The expected counts are written below
 * with what each one is; a change that needs more must say here why, and a
 * change that needs fewer lowers them (the test fails either way, so the
 * guard stays tight).
 *
 * How each is counted:
 *   SQLite statements   every execution of a prepared statement (better-sqlite3's
 *                       run/get/all/iterate), the coordinator in-process;
 *   SQLite fsyncs       `strace -f` attached to a real `berth serve` for the
 *                       cycle (every thread: a sync may run off the main one);
 *   PostgreSQL          on the wire, through a counting proxy between the
 *                       coordinator and the server (test/helpers/pg-wire.ts):
 *                       statements executed, and transactions that committed —
 *                       an autocommit statement is a transaction of its own.
 * The reconciler is off in-process; the strace window is checked to be quiet
 * without requests first.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import Database from "better-sqlite3";
import { startTestCoordinator, tempDir, PG_SKIP, PG_URL, type TestCoordinator } from "../helpers/env.js";
import { startServe } from "../helpers/serve.js";
import { startPgWireProxy } from "../helpers/pg-wire.js";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import { createToken } from "../../src/coordinator/auth.js";
import { Api } from "../../src/cli/api.js";
import { ALL_CAPABILITIES, ScriptedExternalProvider } from "../helpers/portable.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";

/** What one keeper borrow and one return may cost. */
const EXPECTED = {
  sqlite: {
    borrow: {
      // BEGIN IMMEDIATE, pool with the API token's standing (the route takes the
      // token from its cache; the transaction re-checks it), ready machine,
      // machine compare-and-set, audit, borrow, heartbeat due, COMMIT
      statements: 8,
      // the borrow's transaction
      commits: 1,
    },
    return: {
      // BEGIN IMMEDIATE, borrow (locked) with the API token's standing, machine (locked),
      // borrow ended, heartbeat due cleared, retention due set, machine compare-and-set, audit, COMMIT
      statements: 9,
      // the return's transaction
      commits: 1,
    },
    // one per commit (the WAL on disk before each answer)
    fsyncs: 2,
  },
  postgres: {
    borrow: {
      // BEGIN, pool with the API token's standing, ready machine (SKIP LOCKED),
      // machine + audit + borrow + heartbeat due in one statement, COMMIT
      statements: 5,
      // the borrow's transaction (no token read of its own: see the SQLite borrow)
      commits: 1,
    },
    return: {
      // BEGIN, borrow (FOR UPDATE) with the API token's standing, machine (FOR UPDATE),
      // borrow + due rows + machine + audit in one statement, COMMIT
      statements: 5,
      // the return's transaction
      commits: 1,
    },
  },
};

/**
 * What a portable borrow → active may cost: the borrow (pending) and the ack
 * (the install through the machine's provider, answered active). The
 * protocol's order puts four commits on this path: the borrow's, the ack's
 * install intent (durable before the provider is called), the agent's own
 * (its install record; counted in the agent's tests, not here) and the
 * completion that publishes `active`. Nothing else may commit between the
 * borrow and the active answer: no reconciler pass is woken by the borrow
 * (it used to be, and its fill visit committed just as the ack arrived; the
 * fill row the borrow sets is visited on the loop's next pass).
 */
const EXPECTED_PORTABLE = {
  sqlite: {
    borrow: {
      // BEGIN IMMEDIATE, pool with the API token's standing (the route takes the token from its
      // cache; the transaction re-checks it; the ack reads it committed), ready machine, machine compare-and-set, audit, grant,
      // ack due, grant due, fill due (the pool's provider provisions), COMMIT
      statements: 10,
      // the borrow's transaction
      commits: 1,
      // none: a portable borrow installs nothing
      agentCalls: 0,
    },
    ack: {
      // the API token read committed (the ack re-validates the borrower's authorization as it is now);
      // intent (11): BEGIN IMMEDIATE, grant (locked), machine,
      //   machine compare-and-set, audit, install operation, its due row, grant installing,
      //   operation leased, its due row pushed to the lease end, COMMIT;
      // completion (13): BEGIN IMMEDIATE, operation, machine, operation done, its due row cleared,
      //   grant at the operation's generation, machine compare-and-set, audit, grant active,
      //   grant due, the answer's grant and machine, COMMIT
      statements: 25,
      // install intent (durable before the agent is called), then the completion (the answer read inside it)
      commits: 2,
      // the install, once
      agentCalls: 1,
    },
    // one per commit: borrow, install intent, completion
    fsyncs: 3,
  },
  postgres: {
    borrow: {
      // BEGIN, pool with the API token's standing, ready machine (SKIP LOCKED), the held writes
      // (machine, audit, grant, due rows) in one statement, fill due, COMMIT
      statements: 6,
      // the borrow's transaction (no token read of its own)
      commits: 1,
      agentCalls: 0,
    },
    ack: {
      // the API token read committed (autocommit), then two transactions as on SQLite, reads each
      // one statement and held writes sent together: 2 BEGIN, 11 reads or held-write groups,
      // 1 UPDATE, 1 INSERT, 2 COMMIT
      statements: 17,
      // the token read, the install intent, then the completion
      commits: 3,
      agentCalls: 1,
    },
  },
};

type Borrowed = { borrowId: string; borrowToken: string };
type Step = Record<string, number>;

/** Fails when a count differs from the expectation, saying which way and listing what was seen. */
function assertCounts(what: string, actual: Step, expected: Step, seen: string[]): void {
  for (const k of Object.keys(expected)) {
    if (actual[k] === expected[k]) continue;
    const way = actual[k]! > expected[k]! ? "grew" : "fell (lower the expectation in this test)";
    assert.fail(`${what}: ${k} ${way}: ${actual[k]} instead of ${expected[k]}. Seen:\n  ${seen.join("\n  ")}`);
  }
}

/** Counts every statement better-sqlite3 executes in this process until stopped. */
function countSqliteStatements(): { take(): string[]; stop(): void } {
  const probe = new Database(":memory:");
  const proto = Object.getPrototypeOf(probe.prepare("SELECT 1")) as Record<"run" | "get" | "all" | "iterate", (...a: unknown[]) => unknown>;
  probe.close();
  const originals = { run: proto.run, get: proto.get, all: proto.all, iterate: proto.iterate };
  let seen: string[] = [];
  for (const name of Object.keys(originals) as Array<keyof typeof originals>) {
    const original = originals[name];
    proto[name] = function (this: { source: string }, ...a: unknown[]) {
      seen.push(this.source.replace(/\s+/g, " ").slice(0, 90));
      return original.apply(this, a);
    };
  }
  return {
    take() {
      const s = seen;
      seen = [];
      return s;
    },
    stop() {
      Object.assign(proto, originals);
    },
  };
}

/** A keeper pool of `n` registered machines on the external provider (no provider work on borrow or return). */
async function keeperPool(admin: Api, n: number): Promise<void> {
  const e = await admin.call<{ claims: { token: string }[] }>("POST", "/v1/pools/p/ensure", { minReady: n, maxReady: n, compatibilityKey: "k", provider: "external" });
  for (const [i, c] of e.claims.entries()) {
    await admin.call("POST", "/v1/pools/p/machines", { claimToken: c.token, resourceId: `vm-${i}`, ssh: { host: "10.0.0.1", port: 22, user: "u" } });
  }
}

async function borrow(api: Api): Promise<Borrowed> {
  return api.call<Borrowed>("POST", "/v1/pools/p/borrow", {});
}

async function giveBack(api: Api, b: Borrowed): Promise<void> {
  await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
}

/** Waits until the store has no deadline due within the next minute (the reconciler has nothing to write). */
async function untilNothingDueSoon(path: string): Promise<void> {
  const db = new Database(path, { readonly: true });
  try {
    for (let i = 0; ; i++) {
      const r = db.prepare("SELECT COUNT(*) AS n FROM due WHERE due_at <= ?").get(Date.now() + 60_000) as { n: number };
      if (r.n === 0) return;
      if (i > 600) assert.fail(`${r.n} deadline(s) still due after 60 s`);
      await new Promise((res) => setTimeout(res, 100));
    }
  } finally {
    db.close();
  }
}

const hasStrace = spawnSync("strace", ["-V"]).status === 0;

/** strace attached to every thread of `pid`, counting sync calls until stopped. */
async function attachSyncCounter(pid: number): Promise<{ stop(): Promise<number> }> {
  const child = spawn("strace", ["-f", "-c", "-U", "calls,name", "-e", "trace=fsync,fdatasync,syncfs,sync_file_range,msync", "-p", String(pid)], { stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  child.stderr.on("data", (d: Buffer) => (err += d.toString()));
  // Attached once it says so; then a moment for the other threads.
  await new Promise<void>((resolve, reject) => {
    const check = () => (/attached/.test(err) ? resolve() : undefined);
    child.stderr.on("data", check);
    child.once("exit", () => reject(new Error(`strace ended before attaching: ${err}`)));
  });
  await new Promise((r) => setTimeout(r, 300));
  return {
    async stop() {
      const done = new Promise((r) => child.once("exit", r));
      child.kill("SIGINT");
      await done;
      let n = 0;
      for (const line of err.split("\n")) {
        const m = /^\s*(\d+)\s+(fsync|fdatasync|syncfs|sync_file_range|msync)\s*$/.exec(line);
        if (m) n += Number(m[1]);
      }
      return n;
    },
  };
}

describe("a keeper borrow + return, counted (the hot path's guard)", () => {
  test("SQLite: statements and commits", async () => {
    const t: TestCoordinator = await startTestCoordinator({ engine: "sqlite", reconcile: false });
    const counter = countSqliteStatements();
    try {
      await keeperPool(await t.api("admin"), 2);
      const member = await t.api("member");
      await giveBack(member, await borrow(member)); // warm: statements prepared, pool row cached by SQLite
      counter.take();
      const b = await borrow(member);
      const borrowed = counter.take();
      await giveBack(member, b);
      const returned = counter.take();
      const commits = (s: string[]) => s.filter((x) => /^COMMIT/i.test(x)).length;
      assertCounts("SQLite keeper borrow", { statements: borrowed.length, commits: commits(borrowed) }, EXPECTED.sqlite.borrow, borrowed);
      assertCounts("SQLite keeper return", { statements: returned.length, commits: commits(returned) }, EXPECTED.sqlite.return, returned);
    } finally {
      counter.stop();
      await t.close();
    }
  });

  test("SQLite: fsyncs of berth serve", { skip: hasStrace ? false : "needs strace (installed by .ci/run)" }, async () => {
    const dir = tempDir();
    const serve = await startServe({ engine: "sqlite", dir: dir.path });
    const apis: Api[] = [];
    try {
      const store = new SqliteStore({ path: join(dir.path, "berth.db") });
      const token = async (role: "admin" | "member") => (await createToken(store, { org: "acme", role, expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n))).token;
      const admin = new Api(serve.url, await token("admin"));
      const member = new Api(serve.url, await token("member"), { connections: 1 });
      apis.push(admin, member);
      await store.close();
      await keeperPool(admin, 2);
      await giveBack(member, await borrow(member));
      // The reconciler's visit of the new pool (due a second after ensure) is done first.
      await untilNothingDueSoon(join(dir.path, "berth.db"));
      // Nothing in the background syncs: a window without requests counts none.
      const quiet = await attachSyncCounter(serve.child.pid!);
      await new Promise((r) => setTimeout(r, 1000));
      assert.equal(await quiet.stop(), 0, "berth serve synced while no request came");
      const window = await attachSyncCounter(serve.child.pid!);
      await giveBack(member, await borrow(member));
      const fsyncs = await window.stop();
      if (fsyncs !== EXPECTED.sqlite.fsyncs) {
        assert.fail(`SQLite keeper borrow + return: fsyncs ${fsyncs > EXPECTED.sqlite.fsyncs ? "grew" : "fell (lower the expectation in this test)"}: ${fsyncs} instead of ${EXPECTED.sqlite.fsyncs}`);
      }
    } finally {
      await Promise.all(apis.map((a) => a.close()));
      await serve.kill();
      dir.cleanup();
    }
  });

  test("PostgreSQL: statements and commits on the wire", { skip: PG_SKIP }, async () => {
    const proxy = await startPgWireProxy(PG_URL!);
    const schema = "t_" + randomBytes(6).toString("hex");
    const store = await PostgresStore.open({ connectionString: proxy.url, schema });
    const t = await startTestCoordinator({ engine: "postgres", store, reconcile: false });
    try {
      await keeperPool(await t.api("admin"), 2);
      const member = await t.api("member");
      await giveBack(member, await borrow(member)); // warm: the pool's connections made, statements prepared
      const step = async (what: string, f: () => Promise<unknown>) => {
        proxy.reset();
        const r = await f();
        const c = proxy.counts();
        assertCounts(what, { statements: c.statements, commits: c.commits }, EXPECTED.postgres[what.endsWith("borrow") ? "borrow" : "return"], Object.entries(c.tags).map(([k, v]) => `${v} × ${k}`));
        assert.equal(c.rollbacks, 0, `${what}: rolled back`);
        return r;
      };
      const b = (await step("PostgreSQL keeper borrow", () => borrow(member))) as Borrowed;
      await step("PostgreSQL keeper return", () => giveBack(member, b));
    } finally {
      await t.close();
      await store.close();
      await proxy.close();
    }
  });
});

/** A portable pool of `n` machines on the scripted provider (the outermost boundary: it stands for the agents). */
async function portablePool(admin: Api, n: number): Promise<void> {
  const e = await admin.call<{ claims: { token: string }[] }>("POST", "/v1/pools/g/ensure", { minReady: n, maxReady: n, compatibilityKey: "k", access: "portable", provider: "external" });
  for (const [i, c] of e.claims.entries()) {
    await admin.call("POST", "/v1/pools/g/machines", { claimToken: c.token, resourceId: `vm-${i}`, ssh: { host: "10.0.0.1", port: 22, user: "u", hostKey: generateSshKeyPair("host").publicKey } });
  }
}

/** A portable borrow → active: the borrow, then the ack answered active. */
async function borrowToActive(api: Api): Promise<Borrowed & { grantToken: string }> {
  const pair = generateSshKeyPair("count");
  const b = await api.call<Borrowed & { grantToken: string }>("POST", "/v1/pools/g/borrow", { access: "portable", publicKey: pair.publicKey });
  await api.call("POST", `/v1/borrows/${b.borrowId}/ack`, { token: b.borrowToken, grantToken: b.grantToken, publicKey: pair.publicKey });
  return b;
}

const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("a portable borrow → active, counted (the hot path's guard)", () => {
  for (const engine of ["sqlite", "postgres"] as const) {
    test(`${engine}: statements, commits, agent calls${engine === "sqlite" ? ", fsyncs" : ""}`, { skip: engine === "postgres" ? PG_SKIP : false }, async () => {
      // The provider provisions from the first counted borrow on (as the hosts provider does): a
      // borrow then sets its pool's fill row, the case where it used to wake the reconciler.
      // The pool's machines were registered through claims before, as an outside keeper's are.
      const capabilities = { ...ALL_CAPABILITIES };
      const provider = new ScriptedExternalProvider(capabilities);
      const proxy = engine === "postgres" ? await startPgWireProxy(PG_URL!) : null;
      const store = proxy ? await PostgresStore.open({ connectionString: proxy.url, schema: "t_" + randomBytes(6).toString("hex") }) : undefined;
      // The reconciler runs, woken only when something kicks it (its interval is an hour): a pass
      // woken by the borrow or the ack shows in their counts.
      const t = await startTestCoordinator({ engine, ...(store ? { store } : {}), providers: [provider], config: { portable: true }, reconcileIntervalMs: 3_600_000 });
      const counter = engine === "sqlite" ? countSqliteStatements() : null;
      try {
        await portablePool(await t.api("admin"), 3);
        capabilities.provision = true;
        const member = await t.api("member");
        // Warm: statements prepared, connections made; the returned machine's cleanup runs (the return kicks).
        const w = await borrowToActive(member);
        await member.call("POST", `/v1/borrows/${w.borrowId}/return`, { token: w.borrowToken, grantToken: w.grantToken });
        const quiet = () => (counter ? counter.take().length : proxy!.counts().statements);
        for (let i = 0; ; i++) {
          proxy?.reset();
          quiet();
          await pause(200);
          if (quiet() === 0) break;
          if (i > 100) assert.fail("the coordinator did not fall quiet after the warm-up cycle");
        }
        // This process's own syncs (the coordinator runs in it; strace is installed by .ci/run).
        const window = engine === "sqlite" && hasStrace ? await attachSyncCounter(process.pid) : null;
        // Each request, then 50 ms for whatever it woke in this process to show.
        const step = async (what: "borrow" | "ack", f: () => Promise<void>) => {
          counter?.take();
          proxy?.reset();
          const calls = provider.calls.length;
          await f();
          await pause(50);
          const agentCalls = provider.calls.length - calls;
          if (counter) {
            const seen = counter.take();
            assertCounts(`SQLite portable ${what}`, { statements: seen.length, commits: seen.filter((x) => /^COMMIT/i.test(x)).length, agentCalls }, EXPECTED_PORTABLE.sqlite[what], seen);
          } else {
            const c = proxy!.counts();
            assertCounts(`PostgreSQL portable ${what}`, { statements: c.statements, commits: c.commits, agentCalls }, EXPECTED_PORTABLE.postgres[what], Object.entries(c.tags).map(([k, v]) => `${v} × ${k}`));
            assert.equal(c.rollbacks, 0, `${what}: rolled back`);
          }
        };
        const pair = generateSshKeyPair("count");
        let b: (Borrowed & { grantToken: string }) | null = null;
        await step("borrow", async () => {
          b = await member.call<Borrowed & { grantToken: string }>("POST", "/v1/pools/g/borrow", { access: "portable", publicKey: pair.publicKey });
        });
        await step("ack", async () => {
          const r = await member.call<{ state: string }>("POST", `/v1/borrows/${b!.borrowId}/ack`, { token: b!.borrowToken, grantToken: b!.grantToken, publicKey: pair.publicKey });
          assert.equal(r.state, "active");
        });
        if (window) {
          const fsyncs = await window.stop();
          if (fsyncs !== EXPECTED_PORTABLE.sqlite.fsyncs) {
            assert.fail(`SQLite portable borrow → active: fsyncs ${fsyncs > EXPECTED_PORTABLE.sqlite.fsyncs ? "grew" : "fell (lower the expectation in this test)"}: ${fsyncs} instead of ${EXPECTED_PORTABLE.sqlite.fsyncs}`);
          }
        }
      } finally {
        counter?.stop();
        await t.close();
        await store?.close();
        await proxy?.close();
      }
    });
  }
});
