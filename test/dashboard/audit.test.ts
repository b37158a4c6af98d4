/**
 * The dashboard's audit view (`/ui/audit`, operators) over plain HTTP on
 * SQLite and PostgreSQL: the organisation's trail newest first, 50 entries
 * a page with an "Older" link, filtered by event and by machine, machines
 * linking to their timeline; another organisation's entries and members
 * are kept out.
 */
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator, PG_SKIP, type Engine } from "../helpers/env.js";
import type { Api } from "../../src/cli/api.js";
import { audit } from "../../src/store/audit.js";

async function signIn(url: string, token: string): Promise<string> {
  const r = await fetch(`${url}/ui/sign-in`, { method: "POST", body: new URLSearchParams({ token }), redirect: "manual" });
  return r.headers.get("set-cookie")!.split(";")[0]!;
}

async function seed(api: Api, pool: string, n: number): Promise<string[]> {
  const e = await api.call<{ claims: Array<{ token: string }> }>("POST", `/v1/pools/${pool}/ensure`, { minReady: n, maxReady: n, compatibilityKey: "k" });
  const ids: string[] = [];
  for (const [i, c] of e.claims.entries()) ids.push((await api.call<{ machineId: string }>("POST", `/v1/pools/${pool}/machines`, { claimToken: c.token, resourceId: `${pool}-${i}`, ssh: { host: "10.0.0.1", port: 22 } })).machineId);
  return ids;
}

/** The listed entries' sequence numbers and events, the machine links, and the "Older" link. */
async function view(url: string, cookie: string) {
  const r = await fetch(url, { headers: { cookie } });
  const html = await r.text();
  const rows = [...html.matchAll(/<tr data-seq="(\d+)" data-event="([a-z_]+)">/g)].map((m) => ({ seq: Number(m[1]), event: m[2]! }));
  const older = /<a rel="next" href="([^"]+)">/.exec(html)?.[1]?.replaceAll("&amp;", "&") ?? null;
  return { status: r.status, html, rows, older };
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`dashboard audit view on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("newest first, 50 a page, filtered by event and machine, org-scoped, operators only", async () => {
      const t = await startTestCoordinator({ engine, reconcile: false });
      try {
        const api = await t.api("operator");
        // Two machines registered by an outside keeper (an entry each), 50 older entries, then one drain.
        const ids = await seed(api, "a", 2);
        await t.store.transaction(async (tx) => {
          for (let i = 0; i < 50; i++) await audit(tx, { at: Date.now(), machineId: ids[0]!, subject: null, event: "late_install", from: "ready", to: "ready", generation: 1, actor: "c-test" });
        });
        await api.call("POST", `/v1/machines/${ids[1]}/drain`, {});
        await seed(await t.api("admin", "globex"), "theirs", 2);
        const cookie = await signIn(t.coord.url, (await t.token("operator")).token);
        const first = await view(`${t.coord.url}/ui/audit`, cookie);
        assert.equal(first.status, 200);
        assert.equal(first.rows.length, 50);
        assert.deepEqual(first.rows.map((r) => r.seq), [...first.rows.map((r) => r.seq)].sort((a, b) => b - a), "newest first");
        assert.equal(first.rows[0]!.event, "drain");
        assert.ok(first.older, "an Older link");
        const second = await view(`${t.coord.url}${first.older}`, cookie);
        assert.equal(second.rows.length, 3, "53 entries of this organisation in all");
        assert.ok(second.rows[0]!.seq < first.rows[49]!.seq);
        assert.equal(second.older, null);
        const drains = await view(`${t.coord.url}/ui/audit?event=drain`, cookie);
        assert.deepEqual(drains.rows.map((r) => r.event), ["drain"]);
        assert.ok(drains.html.includes(`<a href="/ui/machines/${ids[1]}">${ids[1]}</a>`), "the machine links to its timeline");
        const one = await view(`${t.coord.url}/ui/audit?record=${ids[1]}`, cookie);
        assert.deepEqual(one.rows.map((r) => r.event), ["drain", "register"]);
        const member = await signIn(t.coord.url, (await t.token("member")).token);
        assert.equal((await view(`${t.coord.url}/ui/audit`, member)).status, 403);
      } finally {
        await t.close();
      }
    });
  });
}
