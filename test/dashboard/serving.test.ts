/**
 * How the dashboard is served, over plain HTTP (no browser) on SQLite with
 * the default token-free rate (20/s, bursts of 40): a signed-in session's
 * /ui requests are not counted against it (a client without one still gets
 * 429); pages and assets are compressed; pages name assets by content hash,
 * cached immutable (no revalidation per view); a refusal page keeps the
 * navigation; names are shown beside ids (token labels, host name, agent
 * version, borrow links).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:http";
import { gunzipSync } from "node:zlib";
import { startTestCoordinator } from "../helpers/env.js";
import { setAgentReport } from "../../src/store/host-identity.js";

/** The page-weight budget (docs/dashboard.md): one page as sent, compressed; the assets of a first view, compressed. */
const PAGE_BUDGET = 24 * 1024;
const ASSET_BUDGET = 96 * 1024;

async function signIn(url: string, token: string): Promise<string> {
  const r = await fetch(`${url}/ui/sign-in`, { method: "POST", body: new URLSearchParams({ token }), redirect: "manual" });
  return r.headers.get("set-cookie")!.split(";")[0]!;
}

/** A raw GET (fetch would decompress and hide the encoding). */
function raw(url: string, headers: Record<string, string>): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: Buffer }> {
  return new Promise((resolve, reject) => {
    request(url, { headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
    }).on("error", reject).end();
  });
}

test("dashboard serving: signed-in requests skip the token-free rate; compression; hashed immutable assets; refusal pages with navigation; names beside ids", async (ctx) => {
  const t = await startTestCoordinator({ reconcile: false });
  try {
    const op = await t.token("operator");
    await t.store.transaction((tx) => tx.run("UPDATE api_tokens SET label = 'alice-ci' WHERE id = ?", [op.id]));
    const cookie = await signIn(t.coord.url, op.token);
    // Signed in before the burst below spends this address's token-free allowance (sign-in is a token-free route).
    const member = await signIn(t.coord.url, (await t.token("member")).token);
    // 60 pages at once (more than the burst of 40): none refused.
    const codes = await Promise.all(Array.from({ length: 60 }, () => fetch(`${t.coord.url}/ui/borrows`, { headers: { cookie } }).then(async (r) => (await r.arrayBuffer(), r.status))));
    assert.deepEqual([...new Set(codes)], [200]);
    // Without a session (or with a made-up one) the same address is limited.
    const anon = await Promise.all(Array.from({ length: 60 }, () => fetch(`${t.coord.url}/ui/borrows`, { headers: { cookie: "berth_session=made-up" }, redirect: "manual" }).then(async (r) => (await r.arrayBuffer(), r.status))));
    assert.ok(anon.includes(429), `no 429 among ${[...new Set(anon)].join(",")}`);

    const page = await raw(`${t.coord.url}/ui/borrows`, { cookie, "accept-encoding": "gzip, deflate, br" });
    assert.equal(page.headers["content-encoding"], "gzip");
    const html = gunzipSync(page.body).toString("utf8");
    const assets = [...html.matchAll(/(?:src|href)="(\/ui\/assets\/[^"]+)"/g)].map((m) => m[1]!);
    assert.equal(assets.length, 5);
    for (const a of assets) {
      assert.match(a, /^\/ui\/assets\/[a-z]+\.[A-Za-z0-9_-]{16}\.(js|css)$/);
      const r = await raw(`${t.coord.url}${a}`, { cookie, "accept-encoding": "br, gzip" });
      assert.equal(r.status, 200);
      assert.equal(r.headers["content-encoding"], "br");
      assert.match(String(r.headers["cache-control"]), /immutable/);
    }

    // A refusal keeps the navigation.
    const missing = await (await fetch(`${t.coord.url}/ui/pools/nope`, { headers: { cookie } })).text();
    assert.match(missing, /Error 404/);
    assert.match(missing, /<nav aria-label="Main"><a href="\/ui">Overview<\/a>/);
    const forbidden = await fetch(`${t.coord.url}/ui/audit`, { headers: { cookie: member } });
    assert.equal(forbidden.status, 403);
    assert.match(await forbidden.text(), /<nav aria-label="Main">/);

    // Names: the borrower's token label, the borrow linked from its machine, the agent's version.
    const api = await t.api("operator");
    const e = await api.call<{ claims: Array<{ token: string }> }>("POST", "/v1/pools/n/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "k" });
    await api.call("POST", "/v1/pools/n/machines", { claimToken: e.claims[0]!.token, resourceId: "n-0", ssh: { host: "10.0.0.1", port: 22 } });
    const b = await fetch(`${t.coord.url}/v1/pools/n/borrow`, { method: "POST", headers: { authorization: `Bearer ${op.token}`, "content-type": "application/json" }, body: "{}" }).then((r) => r.json() as Promise<{ borrowId: string; machine: { id: string } }>);
    const borrows = await (await fetch(`${t.coord.url}/ui/borrows`, { headers: { cookie } })).text();
    assert.match(borrows, new RegExp(`<tr data-borrow="${b.borrowId}" id="${b.borrowId}">[^]*?alice-ci <code class="muted">${op.id}</code>`));
    const machine = await (await fetch(`${t.coord.url}/ui/machines/${b.machine.id}`, { headers: { cookie } })).text();
    assert.ok(machine.includes(`<a href="/ui/borrows#${b.borrowId}">${b.borrowId}</a>`), "the machine links its borrow");
    assert.match(machine, /data-since="\d+"/, "ages carry their start, for the browser to keep counting");
    const agent = await t.api("agent");
    const host = await agent.call<{ hostId: string }>("POST", "/v1/hosts/enroll", { name: "h-1", url: "http://127.0.0.1:1", runtime: "process", capacity: { vcpu: 2, memoryMb: 2048, slots: 1 }, ssh: { host: "127.0.0.1", port: 2222, hostKey: "ssh-ed25519 AAAA", fingerprint: "SHA256:x" } });
    await t.store.transaction((tx) => setAgentReport(tx, host.hostId, { version: "0.1.0" }));
    const overview = await (await fetch(`${t.coord.url}/ui`, { headers: { cookie } })).text();
    assert.match(overview, /<tr data-host="h-1" id="host-h-1">[^]*?<td>0\.1\.0<\/td>/);

    // Page weight (docs/dashboard.md "Serving and page weight"): every page as sent compressed, and the
    // assets a first view fetches once per release, within the stated budget.
    const weights: Record<string, number> = {};
    for (const path of ["/ui", "/ui/pools/n", "/ui/pools/n?window=24h", "/ui/borrows", "/ui/allocations", "/ui/audit", `/ui/machines/${b.machine.id}`]) {
      const r = await raw(`${t.coord.url}${path}`, { cookie, "accept-encoding": "gzip" });
      assert.equal(r.status, 200, path);
      weights[path] = r.body.length;
    }
    let assetBytes = 0;
    for (const a of assets) assetBytes += (await raw(`${t.coord.url}${a}`, { cookie, "accept-encoding": "br, gzip" })).body.length;
    ctx.diagnostic(`compressed bytes: ${JSON.stringify(weights)}; assets ${assetBytes}`);
    for (const [path, n] of Object.entries(weights)) assert.ok(n <= PAGE_BUDGET, `${path}: ${n} bytes compressed, over the ${PAGE_BUDGET}-byte budget`);
    assert.ok(assetBytes <= ASSET_BUDGET, `assets: ${assetBytes} bytes compressed, over the ${ASSET_BUDGET}-byte budget`);
  } finally {
    await t.close();
  }
});
