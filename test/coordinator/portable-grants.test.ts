/**
 * Portable grants over the real HTTP API and a real store (SQLite file, and
 * PostgreSQL where configured): what a grant binds and stores, the two-phase
 * acknowledgement, replays, deadlines at exact equality, abandonment, TTL
 * rotation and retention. The provider is scripted (outermost boundary).
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { PG_SKIP, type Engine } from "../helpers/env.js";
import { hashToken } from "../../src/core/tokens.js";
import { MAX_GRANT_MS } from "../../src/core/grant.js";
import { Api } from "../../src/cli/api.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import {
  ackBody,
  auditEvents,
  borrowPortable,
  grantRow,
  machineRow,
  metricValue,
  portableEnv,
  refused,
  settle,
  tokens,
  type Borrowed,
} from "../helpers/portable.js";

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`portable grants on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("a client-chosen grant id and tokens: a repeat with the same key answers the same grant (pending, then active); other tokens or key are conflict; once returned, borrow_not_active", async () => {
      const env = await portableEnv(engine, { n: 1 });
      try {
        const member = await env.t.api("member");
        const pair = generateSshKeyPair("test-borrow");
        const chosen = { access: "portable", publicKey: pair.publicKey, borrowId: "g_" + "p".repeat(20), borrowToken: "bbt_" + "P".repeat(43), grantToken: "bgt_" + "G".repeat(43) };
        const first = await member.raw("POST", "/v1/pools/agents/borrow", chosen);
        assert.equal(first.status, 201, first.text);
        const b: Borrowed = { ...(first.body as Borrowed), publicKey: pair.publicKey, privateKey: pair.privateKey };
        assert.deepEqual([b.borrowId, b.borrowToken, b.grantToken, b.state], [chosen.borrowId, chosen.borrowToken, chosen.grantToken, "pending"]);
        // The pool's one machine is reserved: a repeat (a retry after a lost reply) still gets its grant.
        const again = await member.raw("POST", "/v1/pools/agents/borrow", chosen);
        assert.equal(again.status, 200, again.text);
        const a = again.body as Borrowed & { repeated: boolean };
        assert.equal(a.repeated, true);
        assert.deepEqual([a.borrowId, a.state, a.machine.id, a.generation, a.ackDeadline, a.expiresAt], [b.borrowId, "pending", b.machine.id, b.generation, b.ackDeadline, b.expiresAt]);
        await refused(borrowPortable(member), "pool_exhausted", 503);
        assert.equal(env.provider.callsOf("install_key").length, 0, "a borrow, repeated or not, installs nothing");
        await member.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        const afterAck = await member.raw("POST", "/v1/pools/agents/borrow", chosen);
        assert.equal(afterAck.status, 200, afterAck.text);
        assert.equal((afterAck.body as Borrowed).state, "active");
        assert.equal(env.provider.callsOf("install_key").length, 1);
        // The same id with another key or other tokens: conflict, and nothing changes.
        await refused(member.call("POST", "/v1/pools/agents/borrow", { ...chosen, publicKey: generateSshKeyPair("other").publicKey }), "conflict", 409);
        await refused(member.call("POST", "/v1/pools/agents/borrow", { ...chosen, grantToken: "bgt_" + "H".repeat(43) }), "conflict", 409);
        await member.call("POST", `/v1/borrows/${b.borrowId}/return`, tokens(b));
        await settle(env.t.coord);
        await refused(member.call("POST", "/v1/pools/agents/borrow", chosen), "borrow_not_active", 409);
        // Half-given, or a keeper id on a portable borrow: refused before anything is read.
        await refused(member.call("POST", "/v1/pools/agents/borrow", { ...chosen, grantToken: undefined }), "invalid_request", 400);
        await refused(member.call("POST", "/v1/pools/agents/borrow", { ...chosen, borrowId: "b_" + "p".repeat(20) }), "invalid_request", 400);
        assert.equal((await grantRow(env.t, b.borrowId)).state, "closed");
      } finally {
        await env.close();
      }
    });

    test("[I8] the store keeps only domain-separated hashes: no raw token or private key in any table", async () => {
      const env = await portableEnv(engine);
      try {
        const member = await env.t.api("member");
        const b = await borrowPortable(member);
        await member.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        await member.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, tokens(b));
        await member.call("POST", `/v1/borrows/${b.borrowId}/return`, tokens(b));
        await settle(env.t.coord);
        const g = await env.t.store.transaction((tx) => tx.get<{ token_hash: string; grant_token_hash: string }>("SELECT * FROM grants WHERE id = ?", [b.borrowId]));
        assert.equal(g!.token_hash, hashToken("borrow", b.borrowToken));
        assert.equal(g!.grant_token_hash, hashToken("grant", b.grantToken));
        // Domain separation: the same raw value hashes differently per domain.
        assert.notEqual(hashToken("grant", b.borrowToken), g!.token_hash);
        assert.notEqual(hashToken("api", b.borrowToken), g!.token_hash);
        const privateBody = b.privateKey.split("\n")[1]!;
        for (const table of ["grants", "machines", "operations", "audit", "due", "pools", "api_tokens", "claims", "borrows"]) {
          const rows = await env.t.store.transaction((tx) => tx.all(`SELECT * FROM ${table}`));
          const text = JSON.stringify(rows);
          for (const secret of [b.borrowToken, b.grantToken, privateBody]) assert.ok(!text.includes(secret), `${table} holds a raw secret`);
        }
        // Nor does the metrics text.
        const metrics = (await env.admin.raw("GET", "/metrics")).text;
        assert.ok(!metrics.includes(b.borrowToken) && !metrics.includes(b.grantToken) && !metrics.includes(b.borrowId));
      } finally {
        await env.close();
      }
    });

    test("[I3] a grant binds borrower, org, pool, machine, resource, generation and key; expiresAt is the minimum of its four caps", async () => {
      const env = await portableEnv(engine, { n: 4, poolBody: { hardTtlMs: 3_600_000 } });
      try {
        const now = env.clock.now();
        const tok = await env.t.token("member", "acme", now + 20 * 60_000);
        const member = new Api(env.t.coord.url, tok.token);
        try {
          const requested = await borrowPortable(member, "agents", { durationMs: 5 * 60_000 });
          assert.equal(requested.expiresAt, now + 5 * 60_000);
          const byToken = await borrowPortable(member, "agents", { durationMs: 25 * 60_000 });
          assert.equal(byToken.expiresAt, now + 20 * 60_000, "capped by the token's authorization expiry");
          const g = await env.t.store.transaction((tx) => tx.get<Record<string, unknown>>("SELECT * FROM grants WHERE id = ?", [requested.borrowId]));
          const m = await env.t.store.transaction((tx) => tx.get<Record<string, unknown>>("SELECT * FROM machines WHERE id = ?", [requested.machine.id]));
          assert.equal(g!.borrower, tok.id);
          assert.equal(g!.org, "acme");
          assert.equal(g!.pool, "agents");
          assert.equal(g!.machine_id, m!.id);
          assert.equal(g!.resource_id, m!.resource_id);
          assert.equal(Number(g!.generation), Number(m!.generation));
          assert.equal(g!.fingerprint, requested.fingerprint);
          assert.equal(g!.state, "pending");
          assert.equal(m!.state, "reserved");
          // No key was installed by the issue.
          assert.equal(env.provider.callsOf("install_key").length, 0);
        } finally {
          await member.close();
        }
        const admin = await env.t.api("admin");
        const def = await borrowPortable(admin);
        assert.equal(def.expiresAt, now + MAX_GRANT_MS, "default and maximum is 30 minutes");
        const tooLong = await borrowPortable(admin, "agents", { durationMs: 2 * 3_600_000 });
        assert.equal(tooLong.expiresAt, now + MAX_GRANT_MS);
      } finally {
        await env.close();
      }
    });

    test("[I3] the machine's hard TTL caps the grant; a machine inside the rotation margin is never admitted", async () => {
      // hardTtl 1 h: rotation margin 5 min. At 40 min the grant is capped at the TTL (20 min left).
      const env = await portableEnv(engine, { n: 1, poolBody: { hardTtlMs: 3_600_000 } });
      try {
        const start = env.clock.now();
        env.clock.advance(40 * 60_000);
        const member = await env.t.api("member");
        const b = await borrowPortable(member);
        const hard = start + 3_600_000 - 1; // registered one ms after start
        assert.ok(b.expiresAt <= start + 3_600_000 && b.expiresAt >= hard - 1, `expiresAt ${b.expiresAt} is the machine's hard expiry`);
        await member.call("POST", `/v1/borrows/${b.borrowId}/return`, tokens(b));
        await settle(env.t.coord);
        env.clock.advance(16 * 60_000); // inside the 5-minute margin
        await refused(borrowPortable(member), "pool_exhausted", 503);
      } finally {
        await env.close();
      }
    });

    test("[I2][I4] ack installs exactly once: replays, concurrent acks and a lost reply never install twice", async () => {
      const env = await portableEnv(engine, { n: 2 });
      try {
        const member = await env.t.api("member");
        const b = await borrowPortable(member);
        const [a1, a2] = await Promise.all([
          member.call<{ state: string }>("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b)),
          member.call<{ state: string }>("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b)),
        ]);
        const a3 = await member.call<{ state: string }>("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        // The concurrent one may see the install still under way; neither installs again.
        for (const a of [a1, a2]) assert.ok(a.state === "active" || a.state === "installing", a.state);
        assert.equal(a3.state, "active");
        assert.equal(env.provider.callsOf("install_key").length, 1, "one install for three acks");
        assert.equal((await grantRow(env.t, b.borrowId)).state, "active");

        // A lost reply: the provider installed, the answer never came. The retry carries the same op id.
        env.provider.on("install_key", "ambiguous");
        const c = await borrowPortable(member);
        const first = await member.call<{ state: string }>("POST", `/v1/borrows/${c.borrowId}/ack`, ackBody(c));
        assert.equal(first.state, "installing", "not active until the provider confirms");
        env.clock.advance(1_000);
        await settle(env.t.coord);
        const installs = env.provider.callsOf("install_key").filter((x) => x.resourceId !== env.provider.callsOf("install_key")[0]!.resourceId);
        assert.equal(installs.length, 2, "the install was asked again to learn its outcome");
        assert.equal(new Set(installs.map((x) => x.opId)).size, 1, "with the same operation id (no blind second install)");
        assert.equal((await grantRow(env.t, c.borrowId)).state, "active");
        // A replayed ack of an active grant changes nothing.
        await member.call("POST", `/v1/borrows/${c.borrowId}/ack`, ackBody(c));
        assert.equal(env.provider.callsOf("install_key").length, 3);
      } finally {
        await env.close();
      }
    });

    test("[I2] an ack is refused for another key, another grant's tokens, or another borrower, and changes nothing", async () => {
      const env = await portableEnv(engine, { n: 2 });
      try {
        const member = await env.t.api("member");
        const other = await env.t.api("member");
        const a = await borrowPortable(member);
        const b = await borrowPortable(member);
        const before = await env.t.store.transaction((tx) => tx.all("SELECT * FROM grants ORDER BY id"));
        await refused(member.call("POST", `/v1/borrows/${a.borrowId}/ack`, { ...ackBody(a), publicKey: b.publicKey }), "key_mismatch", 403);
        await refused(member.call("POST", `/v1/borrows/${a.borrowId}/ack`, { ...ackBody(a), token: b.borrowToken }), "token_mismatch", 403);
        await refused(member.call("POST", `/v1/borrows/${a.borrowId}/ack`, { ...ackBody(a), grantToken: b.grantToken }), "token_mismatch", 403);
        await refused(other.call("POST", `/v1/borrows/${a.borrowId}/ack`, ackBody(a)), "forbidden", 403);
        const orgB = await env.t.api("admin", "other-org");
        await refused(orgB.call("POST", `/v1/borrows/${a.borrowId}/ack`, ackBody(a)), "not_found", 404);
        assert.deepEqual(await env.t.store.transaction((tx) => tx.all("SELECT * FROM grants ORDER BY id")), before);
        assert.equal(env.provider.callsOf("install_key").length, 0);
      } finally {
        await env.close();
      }
    });

    test("[I2] authorization changes between issue and ack: a revoked token or one now ending before the grant gets no install", async () => {
      const env = await portableEnv(engine, { n: 2 });
      try {
        const { revokeTokenWithGrants } = await import("../../src/coordinator/auth.js");
        const tokA = await env.t.token("member");
        const apiA = new Api(env.t.coord.url, tokA.token);
        const tokB = await env.t.token("member");
        const apiB = new Api(env.t.coord.url, tokB.token);
        try {
          const a = await borrowPortable(apiA);
          const b = await borrowPortable(apiB, "agents", { durationMs: 20 * 60_000 });
          // Revoked between issue and ack.
          await revokeTokenWithGrants(env.t.store, tokA.id, env.clock.now());
          await refused(apiA.call("POST", `/v1/borrows/${a.borrowId}/ack`, ackBody(a)), "unauthorized", 401);
          await settle(env.t.coord);
          assert.equal((await grantRow(env.t, a.borrowId)).state, "closed");
          assert.equal((await grantRow(env.t, a.borrowId)).reason, "token_revoked");
          // Authorization shortened so that it now ends before the grant's deadline.
          await env.t.store.transaction((tx) => tx.run("UPDATE api_tokens SET expires_at = ? WHERE id = ?", [b.expiresAt - 1, tokB.id]));
          await refused(apiB.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b)), "forbidden", 403);
          const g = await grantRow(env.t, b.borrowId);
          assert.equal(g.state, "invalidated");
          assert.equal(g.reason, "revalidation_failed");
          assert.equal((await machineRow(env.t, b.machine.id))!.state, "quarantined");
          assert.equal(env.provider.callsOf("install_key").length, 0, "no key was ever installed");
          await settle(env.t.coord);
          assert.equal((await machineRow(env.t, b.machine.id))!.state, "destroyed");
          const metrics = (await env.admin.raw("GET", "/metrics")).text;
          assert.equal(metricValue(metrics, "berth_grants_total", 'event="revoked"'), 1);
        } finally {
          await apiA.close();
          await apiB.close();
        }
      } finally {
        await env.close();
      }
    });

    test("[I2][I3][I6] expiry at exact equality: heartbeat and ack at expiresAt are refused, the due row invalidates, nothing moves the deadline", async () => {
      const env = await portableEnv(engine, { n: 2 });
      try {
        const member = await env.t.api("member");
        const b = await borrowPortable(member, "agents", { durationMs: 60_000 });
        await member.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        for (let i = 0; i < 6; i++) {
          env.clock.advance(9_999);
          const hb = await member.call<{ expiresAt: number }>("POST", `/v1/borrows/${b.borrowId}/heartbeat`, tokens(b));
          assert.equal(hb.expiresAt, b.expiresAt, "a heartbeat never moves the hard deadline");
          await settle(env.t.coord);
        }
        env.clock.t = b.expiresAt - 1;
        await settle(env.t.coord);
        assert.equal((await grantRow(env.t, b.borrowId)).state, "active", "usable one millisecond before");
        env.clock.t = b.expiresAt;
        await refused(member.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, tokens(b)), "grant_expired", 409);
        assert.equal((await grantRow(env.t, b.borrowId)).expires_at, b.expiresAt);
        await settle(env.t.coord);
        const g = await grantRow(env.t, b.borrowId);
        assert.equal(g.reason, "expired");
        assert.equal(g.state, "closed", "expired -> key removed, fenced, scrubbed");
        assert.deepEqual(env.provider.callsOf("remove_key").map((c) => c.args.fingerprint), [b.fingerprint]);
        assert.equal((await machineRow(env.t, b.machine.id))!.state, "ready");

        // An ack arriving exactly at the deadline is refused and installs nothing.
        const c = await borrowPortable(member, "agents", { durationMs: 5_000 });
        env.clock.t = c.expiresAt;
        await refused(member.call("POST", `/v1/borrows/${c.borrowId}/ack`, ackBody(c)), "grant_expired", 409);
        assert.equal(env.provider.callsOf("install_key").length, 1);
        // An install confirmed exactly at the deadline never activates.
        const d = await borrowPortable(member, "agents", { durationMs: 5_000 });
        env.provider.on("install_key", "hold");
        const acking = member.call<{ state: string }>("POST", `/v1/borrows/${d.borrowId}/ack`, ackBody(d));
        await env.provider.heldOne("install_key");
        env.clock.t = d.expiresAt;
        env.provider.release("install_key");
        const acked = await acking;
        assert.notEqual(acked.state, "active");
        assert.equal((await grantRow(env.t, d.borrowId)).activated_at, null);
        assert.equal((await grantRow(env.t, d.borrowId)).reason, "expired");
      } finally {
        await env.close();
      }
    });

    test("[I6] abandoned borrows are quarantined: ack timeout and missed heartbeat; late acks and heartbeats never revive them", async () => {
      const env = await portableEnv(engine, { n: 2, config: { ackTimeoutMs: 10_000 } });
      try {
        const member = await env.t.api("member");
        const a = await borrowPortable(member);
        env.clock.advance(10_000); // exactly the ack deadline
        await settle(env.t.coord);
        assert.equal((await grantRow(env.t, a.borrowId)).reason, "ack_timeout");
        assert.equal((await machineRow(env.t, a.machine.id))!.state, "destroyed", "quarantined, then destroyed: never ready by time passing");
        await refused(member.call("POST", `/v1/borrows/${a.borrowId}/ack`, ackBody(a)), "grant_not_pending", 409);
        assert.equal(env.provider.callsOf("install_key").length, 0);

        const b = await borrowPortable(member);
        await member.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        env.clock.advance(10_000); // heartbeat interval 10 s: deadline reached
        await refused(member.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, tokens(b)), "borrow_expired", 409);
        await settle(env.t.coord);
        assert.equal((await grantRow(env.t, b.borrowId)).reason, "heartbeat_missed");
        await refused(member.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, tokens(b)), "borrow_not_active", 409);
        env.clock.advance(7 * 86_400_000);
        await settle(env.t.coord);
        const m = await machineRow(env.t, b.machine.id);
        assert.ok(m === undefined || m.state === "destroyed", `machine is ${m?.state}`);
        assert.ok(!(await auditEvents(env.t, b.machine.id)).includes("scrubbed"), "never went through cleanup back to ready");
        const metrics = (await env.admin.raw("GET", "/metrics")).text;
        assert.equal(metricValue(metrics, "berth_machines_quarantined_total", 'reason="ack_timeout"'), 1);
        assert.equal(metricValue(metrics, "berth_machines_quarantined_total", 'reason="heartbeat_missed"'), 1);
      } finally {
        await env.close();
      }
    });

    test("[I3][I7] TTL rotation drains a ready machine near its hard TTL, leaves the lent one to its capped grant, and refills within maxReady", async () => {
      const env = await portableEnv(engine, { n: 2, poolBody: { hardTtlMs: 600_000, heartbeatMs: 3_600_000 } });
      try {
        const member = await env.t.api("member");
        const b = await borrowPortable(member);
        await member.call("POST", `/v1/borrows/${b.borrowId}/ack`, ackBody(b));
        assert.ok(b.expiresAt <= env.clock.now() + 600_000, "the grant cannot outlive its machine");
        // Margin is 60 s: at 540 s the idle machine rotates out; the lent one stays with its grant.
        env.clock.advance(540_000);
        await settle(env.t.coord);
        const idle = env.machines.find((id) => id !== b.machine.id)!;
        assert.equal((await machineRow(env.t, idle))!.state, "destroyed");
        assert.equal((await machineRow(env.t, b.machine.id))!.state, "busy");
        // The outside keeper's ensure gets a replacement claim; the total stays within maxReady.
        const e = await env.admin.call<{ counts: { ready: number; lent: number; cleanup: number; openClaims: number }; claims: unknown[]; maxReady: number }>("POST", "/v1/pools/agents/ensure", {
          minReady: 2, maxReady: 2, compatibilityKey: "linux-x64", access: "portable", provider: "external", hardTtlMs: 600_000, heartbeatMs: 3_600_000,
        });
        assert.equal(e.claims.length, 1, "one replacement: the lent machine still holds its place");
        const c = e.counts;
        assert.ok(c.ready + c.lent + c.cleanup + c.openClaims <= e.maxReady, JSON.stringify(c));
        // At the hard TTL the grant expires; its machine goes through cleanup and, being past its TTL, is rotated out.
        env.clock.t = b.expiresAt;
        await settle(env.t.coord);
        assert.equal((await grantRow(env.t, b.borrowId)).reason, "expired");
        env.clock.advance(10_000);
        await settle(env.t.coord);
        assert.equal((await machineRow(env.t, b.machine.id))!.state, "destroyed");
        const metrics = (await env.admin.raw("GET", "/metrics")).text;
        assert.equal(metricValue(metrics, "berth_ttl_rotations_total", 'pool="agents"'), 2);
      } finally {
        await env.close();
      }
    });

    test("retention: closed grants and destroyed machines age out; a machine whose destruction is unproven is never pruned", async () => {
      const env = await portableEnv(engine, { n: 2, config: { retentionMs: 3_600_000, ackTimeoutMs: 10_000 } });
      try {
        const member = await env.t.api("member");
        const a = await borrowPortable(member);
        await member.call("POST", `/v1/borrows/${a.borrowId}/ack`, ackBody(a));
        await member.call("POST", `/v1/borrows/${a.borrowId}/return`, tokens(a));
        await settle(env.t.coord);
        assert.equal((await grantRow(env.t, a.borrowId)).state, "closed");
        // The second machine is abandoned, and its destruction keeps failing.
        const b = await borrowPortable(member);
        env.provider.on("destroy", "ambiguous", 1000);
        env.clock.advance(10_000);
        await settle(env.t.coord);
        for (let i = 0; i < 12; i++) {
          env.clock.advance(3_600_000);
          await settle(env.t.coord);
        }
        const rows = await env.t.store.transaction((tx) => tx.all<{ id: string }>("SELECT id FROM grants"));
        assert.deepEqual(rows.map((r) => r.id), [b.borrowId], "the returned grant aged out; the one whose machine may still exist stays");
        assert.equal((await machineRow(env.t, b.machine.id))!.state, "destroying");
        assert.ok(env.provider.callsOf("destroy").length > 6, "destruction is retried for as long as it takes");
        // Once destruction is confirmed, the rest ages out too.
        env.provider.clearRules();
        env.clock.advance(60_000);
        await settle(env.t.coord);
        assert.equal((await machineRow(env.t, b.machine.id))!.state, "destroyed");
        env.clock.advance(3_600_000);
        await settle(env.t.coord);
        assert.equal(await machineRow(env.t, b.machine.id), undefined);
        assert.equal((await env.t.store.transaction((tx) => tx.all("SELECT id FROM grants"))).length, 0);
        const metrics = (await env.admin.raw("GET", "/metrics")).text;
        assert.equal(metricValue(metrics, "berth_records_pruned_total", 'kind="grant"'), 2);
      } finally {
        await env.close();
      }
    });
  });
}
