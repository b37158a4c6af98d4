/**
 * Secrets (invariant 8) and authentication: raw API, claim and borrow tokens
 * are never in the database (the SQLite file and its WAL read as bytes; every
 * PostgreSQL table dumped), the coordinator's log at debug level, or
 * /metrics. Expired and revoked API tokens are refused at once; another
 * organisation's pool, borrow or machine is a 404.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import pino from "pino";
import { startCoordinator, type Coordinator } from "../../src/coordinator/server.js";
import { createToken, revokeTokenWithGrants } from "../../src/coordinator/auth.js";
import { Api, ApiError } from "../../src/cli/api.js";
import type { Store } from "../../src/store/store.js";
import { openStore, dropSchema, PG_SKIP, tempDir, TestClock, type Engine } from "../helpers/env.js";
import { dumpAll } from "../helpers/serve.js";
import { hashToken } from "../../src/core/tokens.js";

type Claim = { id: string; token: string };
type Borrow = { borrowId: string; borrowToken: string; machine: { id: string } };

async function refused(p: Promise<unknown>, status: number, code: string, says?: RegExp): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof ApiError, String(e));
    assert.equal(e.status, status, e.message);
    assert.equal(e.code, code, e.message);
    if (says) assert.match(e.message, says);
    return true;
  });
}

interface Setup {
  store: Store;
  coord: Coordinator;
  clock: TestClock;
  logFile: string;
  dir: ReturnType<typeof tempDir>;
  apis: Api[];
  api(token: string): Api;
  close(): Promise<void>;
}

async function setup(engine: Engine): Promise<Setup> {
  const dir = tempDir();
  const store = await openStore(engine, dir.path);
  const clock = new TestClock();
  const logFile = join(dir.path, "coordinator.log");
  const log = pino({ level: "trace" }, pino.destination({ dest: logFile, sync: true }));
  const coord = await startCoordinator({ store, secret: randomBytes(32), log, now: clock.now, reconcile: false });
  const apis: Api[] = [];
  return {
    store,
    coord,
    clock,
    logFile,
    dir,
    apis,
    api(token: string) {
      const a = new Api(coord.url, token);
      apis.push(a);
      return a;
    },
    async close() {
      await Promise.all(apis.map((a) => a.close()));
      await coord.stop();
      await dropSchema(store);
      await store.close();
      dir.cleanup();
    },
  };
}

const token = (s: Setup, role: "admin" | "member", org = "acme", expiresAt: number | null = null) =>
  createToken(s.store, { org, role, expiresAt, label: null }, s.clock.now(), (n) => randomBytes(n));

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`secrets and authentication on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("[I8] raw API, claim and borrow tokens appear in no stored byte, log line or metric", async () => {
      const s = await setup(engine);
      try {
        const admin = await token(s, "admin");
        const member = await token(s, "member");
        const secrets: string[] = [admin.token, member.token];
        const api = s.api(admin.token);
        const mem = s.api(member.token);
        const e = await api.call<{ claims: Claim[] }>("POST", "/v1/pools/ci/ensure", { minReady: 3, maxReady: 3, compatibilityKey: "linux-x64" });
        secrets.push(...e.claims.map((c) => c.token));
        for (const [i, c] of e.claims.entries()) {
          await api.call("POST", "/v1/pools/ci/machines", { claimToken: c.token, resourceId: `vm-${i}`, ssh: { host: "10.0.0.1", port: 22 } });
        }
        // The claim is spent: a second use is refused (and logged as a refusal).
        await refused(api.call("POST", "/v1/pools/ci/machines", { claimToken: e.claims[0]!.token, resourceId: "vm-x", ssh: { host: "h", port: 22 } }), 409, "claim_consumed");
        const b1 = await mem.call<Borrow>("POST", "/v1/pools/ci/borrow", {});
        const b2 = await mem.call<Borrow>("POST", "/v1/pools/ci/borrow", {});
        secrets.push(b1.borrowToken, b2.borrowToken);
        await mem.call("POST", `/v1/borrows/${b1.borrowId}/heartbeat`, { token: b1.borrowToken });
        // Refusals that carry a real token in the request: the wrong borrow's token, an unknown API token.
        await refused(mem.call("POST", `/v1/borrows/${b1.borrowId}/return`, { token: b2.borrowToken }), 403, "token_mismatch");
        const stranger = "bat_" + randomBytes(32).toString("base64url");
        secrets.push(stranger);
        await refused(s.api(stranger).call("GET", "/v1/pools"), 401, "unauthorized");
        await mem.call("POST", `/v1/borrows/${b1.borrowId}/return`, { token: b1.borrowToken });
        // A return retried after a lost reply answers where the first went; another token is still refused.
        const again = await mem.call<{ repeated?: boolean }>("POST", `/v1/borrows/${b1.borrowId}/return`, { token: b1.borrowToken });
        assert.equal(again.repeated, true);
        await refused(mem.call("POST", `/v1/borrows/${b1.borrowId}/return`, { token: b2.borrowToken }), 403, "token_mismatch");
        await mem.call("POST", `/v1/borrows/${b2.borrowId}/return`, { token: b2.borrowToken, disposition: "drain" });
        // A dashboard session: the API token in a form body, the session id in a cookie; neither is stored raw.
        const signIn = await fetch(`${s.coord.url}/ui/sign-in`, { method: "POST", body: new URLSearchParams({ token: admin.token }), redirect: "manual" });
        const session = /berth_session=([^;]+)/.exec(signIn.headers.get("set-cookie") ?? "")![1]!;
        secrets.push(session);
        assert.equal((await fetch(`${s.coord.url}/ui`, { headers: { cookie: `berth_session=${session}` } })).status, 200);
        await fetch(`${s.coord.url}/ui/sign-in`, { method: "POST", body: new URLSearchParams({ token: stranger }) });

        const metrics = (await api.raw("GET", "/metrics")).text;
        assert.match(metrics, /berth_borrow_requests_total\{[^}]*\} 2/, "the metrics are really there");
        assert.doesNotMatch(metrics, /b_[a-z0-9]{20}|m_[a-z0-9]{20}|tok_/, "no borrow, machine or token id as a label");

        // What is stored, while the coordinator runs (SQLite: the main file and its WAL, as bytes).
        const stored: Array<[string, string]> = [];
        const readFiles = () => {
          for (const f of ["berth.db", "berth.db-wal", "berth.db-journal"]) {
            const p = join(s.dir.path, f);
            if (existsSync(p)) stored.push([f, readFileSync(p).toString("latin1")]);
          }
        };
        if (engine === "sqlite") readFiles();
        else stored.push(["all tables", JSON.stringify(await dumpAll(s.store))]);
        await s.coord.stop();
        if (engine === "sqlite") {
          await s.store.close();
          readFiles(); // after the WAL is checkpointed into the file
        }
        const log = readFileSync(s.logFile, "utf8");
        assert.match(log, /request refused/, "the debug log holds the refusals, so it was really captured");

        for (const raw of secrets) {
          const body = raw.slice(raw.indexOf("_") + 1); // without the recognisable prefix too
          for (const [where, text] of [...stored, ["log", log], ["/metrics", metrics]] as Array<[string, string]>) {
            assert.ok(!text.includes(raw) && !text.includes(body), `a raw ${raw.slice(0, 3)} token is in ${where}`);
          }
        }
        // The search looks at real stored content: the tokens' hashes are there.
        assert.ok(stored.some(([, text]) => text.includes(hashToken("api", admin.token))), "the admin token's hash is stored");
        assert.ok(stored.some(([, text]) => text.includes(hashToken("borrow", b1.borrowToken))), "the borrow token's hash is stored");
      } finally {
        if (engine === "sqlite") {
          await s.coord.stop().catch(() => undefined);
          s.dir.cleanup();
        } else await s.close();
      }
    });

    test("an expired API token is refused from the instant it expires; a revoked one at once", async () => {
      const s = await setup(engine);
      try {
        const t = await token(s, "member", "acme", s.clock.now() + 60_000);
        const api = s.api(t.token);
        await api.call("GET", "/v1/pools");
        s.clock.advance(59_999);
        await api.call("GET", "/v1/pools");
        s.clock.advance(1); // now == expiresAt: already expired
        await refused(api.call("GET", "/v1/pools"), 401, "unauthorized", /expired/);

        const r = await token(s, "admin");
        const rapi = s.api(r.token);
        await rapi.call("GET", "/v1/pools");
        assert.deepEqual(await revokeTokenWithGrants(s.store, r.id, s.clock.now()), { revoked: true, grants: 0 });
        await refused(rapi.call("GET", "/v1/pools"), 401, "unauthorized", /revoked/);
        await refused(rapi.call("POST", "/v1/pools/ci/ensure", { minReady: 0, maxReady: 1, compatibilityKey: "k" }), 401, "unauthorized", /revoked/);
        await refused(s.api("bat_not-a-real-token").call("GET", "/v1/pools"), 401, "unauthorized", /not known/);
        const none = await new Api(s.coord.url, null).raw("GET", "/v1/pools");
        assert.equal(none.status, 401);
        assert.equal((none.body as { error: { code: string } }).error.code, "unauthorized");
        // Nothing was created by the refused ensure.
        assert.equal((await s.store.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM pools")))!.n, 0);
      } finally {
        await s.close();
      }
    });

    test("organisations are isolated: another org's pool, borrow and machine are 404 and untouched", async () => {
      const s = await setup(engine);
      try {
        const acme = s.api((await token(s, "admin", "acme")).token);
        const other = s.api((await token(s, "admin", "globex")).token);
        const e = await acme.call<{ claims: Claim[] }>("POST", "/v1/pools/ci/ensure", { minReady: 2, maxReady: 2, compatibilityKey: "linux-x64" });
        for (const [i, c] of e.claims.entries()) {
          await acme.call("POST", "/v1/pools/ci/machines", { claimToken: c.token, resourceId: `vm-${i}`, ssh: { host: "10.0.0.1", port: 22 } });
        }
        const b = await acme.call<Borrow>("POST", "/v1/pools/ci/borrow", {});
        const before = await dumpAll(s.store);

        await refused(other.call("GET", "/v1/pools/ci"), 404, "not_found");
        await refused(other.call("POST", "/v1/pools/ci/borrow", {}), 404, "not_found");
        await refused(other.call("POST", "/v1/pools/ci/drain", {}), 404, "not_found");
        await refused(other.call("GET", `/v1/borrows/${b.borrowId}`), 404, "not_found");
        // Even holding the real borrow token.
        await refused(other.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, { token: b.borrowToken }), 404, "not_found");
        await refused(other.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken }), 404, "not_found");
        await refused(other.call("POST", `/v1/machines/${b.machine.id}/destroyed`, {}), 404, "not_found");
        // A claim token of acme does not register into globex's pool of the same name.
        await refused(other.call("POST", "/v1/pools/ci/machines", { claimToken: e.claims[0]!.token, resourceId: "vm-9", ssh: { host: "h", port: 22 } }), 404, "not_found");
        assert.deepEqual((await other.call<{ pools: unknown[] }>("GET", "/v1/pools")).pools, []);
        assert.deepEqual(await dumpAll(s.store), before);

        // globex may have its own pool of the same name; acme's stays as it was.
        await other.call("POST", "/v1/pools/ci/ensure", { minReady: 0, maxReady: 5, compatibilityKey: "other" });
        const mine = await acme.call<{ maxReady: number; compatibilityKey: string; counts: { ready: number; lent: number } }>("GET", "/v1/pools/ci");
        assert.deepEqual([mine.maxReady, mine.compatibilityKey, mine.counts.ready, mine.counts.lent], [2, "linux-x64", 1, 1]);
        await refused(other.call("POST", "/v1/pools/ci/borrow", {}), 503, "pool_exhausted");
      } finally {
        await s.close();
      }
    });
  });
}
