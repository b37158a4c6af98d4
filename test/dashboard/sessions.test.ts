/**
 * The dashboard's sessions and live stream over plain HTTP (no browser), on
 * SQLite and PostgreSQL: the session table (coordinator migration 6) holds
 * only hashes; a session ends with its token's revocation, at its expiry and
 * at sign-out; an agent token opens none; the live stream reports a change
 * and ends with `signed-out`; every value is escaped into pages; and the
 * operator actions the dashboard uses are the API's
 * (`POST /v1/machines/{id}/drain`, `POST /v1/borrows/{id}/end`).
 */
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator, TestClock, PG_SKIP, type Engine, type TestCoordinator } from "../helpers/env.js";
import { revokeTokenWithGrants } from "../../src/coordinator/auth.js";
import { hashToken } from "../../src/core/tokens.js";
import { ApiError, type Api } from "../../src/cli/api.js";

async function signIn(url: string, token: string): Promise<{ status: number; cookie: string | null; text: string }> {
  const r = await fetch(`${url}/ui/sign-in`, { method: "POST", body: new URLSearchParams({ token }), redirect: "manual" });
  const set = r.headers.get("set-cookie");
  return { status: r.status, cookie: set ? set.split(";")[0]! : null, text: await r.text() };
}

function get(url: string, cookie: string): Promise<Response> {
  return fetch(url, { headers: { cookie }, redirect: "manual" });
}

async function seed(api: Api, pool: string, n: number, key = "linux-x64"): Promise<string[]> {
  const e = await api.call<{ claims: Array<{ token: string }> }>("POST", `/v1/pools/${pool}/ensure`, { minReady: n, maxReady: n, compatibilityKey: key });
  const ids: string[] = [];
  for (const [i, c] of e.claims.entries()) {
    ids.push((await api.call<{ machineId: string }>("POST", `/v1/pools/${pool}/machines`, { claimToken: c.token, resourceId: `${pool}-${i}`, ssh: { host: "10.0.0.1", port: 22 } })).machineId);
  }
  return ids;
}

/** A live stream read as it comes: `until` waits for a pattern, at most `ms` (the stream stays open). */
function streamReader(body: ReadableStream<Uint8Array>) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let text = "";
  let ended = false;
  let pending: Promise<void> | null = null;
  const pull = () =>
    (pending ??= reader.read().then(({ done, value }) => {
      pending = null;
      if (done) ended = true;
      else text += dec.decode(value, { stream: true });
    }));
  return {
    async until(re: RegExp, ms: number): Promise<boolean> {
      const deadline = Date.now() + ms;
      while (!re.test(text) && !ended) {
        const left = deadline - Date.now();
        if (left <= 0) return false;
        await Promise.race([pull(), new Promise((r) => setTimeout(r, left))]);
      }
      return re.test(text);
    },
    get text() {
      return text;
    },
    cancel: () => reader.cancel(),
  };
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`dashboard sessions on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    const withT = async (fn: (t: TestCoordinator, clock: TestClock) => Promise<void>) => {
      const clock = new TestClock(Date.now());
      const t = await startTestCoordinator({ engine, clock, reconcile: false });
      try {
        await fn(t, clock);
      } finally {
        await t.close();
      }
    };

    test("a session is stored as a hash and ends with its token's revocation and at its expiry; an agent token opens none", () =>
      withT(async (t, clock) => {
        const admin = await t.token("admin");
        const s = await signIn(t.coord.url, admin.token);
        assert.equal(s.status, 303);
        const raw = s.cookie!.split("=")[1]!;
        const rows = await t.store.transaction((tx) => tx.all<{ hash: string; token_id: string }>("SELECT hash, token_id FROM ui_sessions"));
        assert.deepEqual(rows, [{ hash: hashToken("session", raw), token_id: admin.id }]);
        assert.equal((await get(`${t.coord.url}/ui`, s.cookie!)).status, 200);
        await revokeTokenWithGrants(t.store, admin.id, clock.now());
        const after = await get(`${t.coord.url}/ui`, s.cookie!);
        assert.equal(after.status, 303);
        assert.equal(after.headers.get("location"), "/ui/sign-in");

        const op = await t.token("operator");
        const s2 = await signIn(t.coord.url, op.token);
        clock.advance(60 * 60_000 - 1);
        assert.equal((await get(`${t.coord.url}/ui/borrows`, s2.cookie!)).status, 200);
        clock.advance(1);
        assert.equal((await get(`${t.coord.url}/ui/borrows`, s2.cookie!)).status, 303, "at its expiry the session is over");

        const agent = await t.token("agent");
        const a = await signIn(t.coord.url, agent.token);
        assert.equal(a.status, 403);
        assert.equal(a.cookie, null);
        assert.ok(!a.text.includes(agent.token));
        const wrong = await signIn(t.coord.url, "bat_guess");
        assert.equal(wrong.status, 401);
        assert.ok(!wrong.text.includes("bat_guess"));
      }));

    test("the live stream says `changed` when the organisation's data moves, not for another's, and `signed-out` at sign-out", () =>
      withT(async (t) => {
        const admin = await t.token("admin");
        const s = await signIn(t.coord.url, admin.token);
        const page = await (await get(`${t.coord.url}/ui`, s.cookie!)).text();
        const since = /events\?since=([A-Za-z0-9_-]+)/.exec(page)![1]!;
        const csrf = /name="csrf" value="([0-9a-f]+)"/.exec(page)![1]!;
        const stream = await get(`${t.coord.url}/ui/events?since=${since}`, s.cookie!);
        assert.equal(stream.headers.get("content-type"), "text/event-stream; charset=utf-8");
        const events = streamReader(stream.body!);
        const other = await t.api("admin", "globex");
        await seed(other, "theirs", 1);
        // The stream's tick is 500 ms: three ticks pass without a word for another organisation's change.
        assert.equal(await events.until(/event: changed/, 1600), false, events.text);
        const api = await t.api("admin");
        await seed(api, "ours", 1);
        assert.ok(await events.until(/event: changed/, 5000), events.text);
        const out = await fetch(`${t.coord.url}/ui/sign-out`, { method: "POST", headers: { cookie: s.cookie! }, body: new URLSearchParams({ csrf }), redirect: "manual" });
        assert.equal(out.status, 303);
        assert.match(out.headers.get("set-cookie")!, /Max-Age=0/);
        assert.ok(await events.until(/event: signed-out/, 5000), events.text);
        assert.equal((await t.store.transaction((tx) => tx.all("SELECT hash FROM ui_sessions"))).length, 0);
        assert.equal((await get(`${t.coord.url}/ui/events`, s.cookie!)).status, 401);
      }));

    test("pages escape every value; a form post without a session is refused before its body is read", () =>
      withT(async (t) => {
        const admin = await t.token("admin");
        const api = await t.api("admin");
        await seed(api, "odd", 1, `<img src=x onerror="alert(1)">`);
        const s = await signIn(t.coord.url, admin.token);
        const html = await (await get(`${t.coord.url}/ui/pools/odd`, s.cookie!)).text();
        assert.ok(html.includes("&lt;img src=x onerror=&quot;alert(1)&quot;&gt;"));
        assert.ok(!html.includes("<img src=x"));
        const r = await fetch(`${t.coord.url}/ui/pools/odd/drain`, { method: "POST", body: new URLSearchParams({ csrf: "x" }) });
        assert.equal(r.status, 401);
        assert.equal(((await r.json()) as { error: { code: string } }).error.code, "unauthorized");
      }));

    test("drain one machine and end a borrow: operator actions of the API, org-scoped", () =>
      withT(async (t) => {
        const api = await t.api("operator");
        const [m1, m2] = await seed(api, "ci", 2);
        const member = await t.api("member");
        const other = await t.api("admin", "globex");
        const refused = async (p: Promise<unknown>, code: string) =>
          assert.rejects(p, (e: unknown) => e instanceof ApiError && e.code === code);
        await refused(member.call("POST", `/v1/machines/${m1}/drain`, {}), "forbidden");
        await refused(other.call("POST", `/v1/machines/${m1}/drain`, {}), "not_found");
        assert.deepEqual(await api.call("POST", `/v1/machines/${m1}/drain`, {}), { machineId: m1, state: "draining" });
        assert.deepEqual(await api.call("POST", `/v1/machines/${m1}/drain`, {}), { machineId: m1, state: "draining" }, "a repeated drain changes nothing");
        const b = await member.call<{ borrowId: string; borrowToken: string; machine: { id: string } }>("POST", "/v1/pools/ci/borrow", {});
        assert.equal(b.machine.id, m2);
        await refused(member.call("POST", `/v1/borrows/${b.borrowId}/end`, {}), "forbidden");
        await refused(other.call("POST", `/v1/borrows/${b.borrowId}/end`, {}), "not_found");
        // The external provider cannot fence: the machine is drained (destruction proves the sessions gone).
        assert.deepEqual(await api.call("POST", `/v1/borrows/${b.borrowId}/end`, {}), { borrowId: b.borrowId, state: "returned", machineState: "draining" });
        await refused(member.call("POST", `/v1/borrows/${b.borrowId}/heartbeat`, { token: b.borrowToken }), "borrow_not_active");
        assert.deepEqual(await api.call("POST", `/v1/borrows/${b.borrowId}/end`, {}), { borrowId: b.borrowId, state: "returned", machineState: "draining" });
      }));
  });
}
