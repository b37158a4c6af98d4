/**
 * Narrow roles, over real HTTP against a running coordinator (SQLite):
 *   - the enroll token (`agent` role) may call only the enrollment: every
 *     read (hosts, pools, a pool, a borrow) and every other write is
 *     `forbidden`;
 *   - `POST /v1/borrows/{id}/report` needs that borrow's own token (an
 *     unknown id is `not_found`, another token `token_mismatch`, nothing is
 *     recorded for either);
 *   - a host's API address is http: or https: only, at enrollment and when
 *     an identity host describes itself;
 *   - the role is checked before any byte of the body is read: the refusal
 *     arrives while the client still holds its body back.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { generateKeyPairSync, sign } from "node:crypto";
import { connect } from "node:net";
import { request } from "undici";
import { proofMessage } from "../../src/core/host-identity.js";
import { startTestCoordinator, type TestCoordinator } from "../helpers/env.js";
import { dumpAll } from "../helpers/serve.js";

async function call(base: string, method: "GET" | "POST", path: string, token: string | null, body?: unknown): Promise<{ status: number; body: { error?: { code: string; message: string } } & Record<string, unknown> }> {
  const r = await request(`${base}${path}`, {
    method,
    headers: { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await r.body.text();
  return { status: r.statusCode, body: text.startsWith("{") ? JSON.parse(text) : { text } };
}

const DESCRIPTION = (url: string) => ({
  url,
  runtime: "process",
  capacity: { vcpu: 1, memoryMb: 512, slots: 1 },
  ssh: { host: "127.0.0.1", port: 2222, hostKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyHostKeyHostKeyHostKeyHostKey", fingerprint: "SHA256:x" },
});

/** The status line of the answer to a request whose body is declared but never sent (resolves once it arrives). */
function statusWithBodyHeldBack(base: string, path: string, token: string | null): Promise<string> {
  const u = new URL(base);
  return new Promise((resolve, reject) => {
    const s = connect(Number(u.port), u.hostname, () => {
      s.write(`POST ${path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 4000\r\n${token ? `authorization: Bearer ${token}\r\n` : ""}\r\n{"na`);
    });
    let got = "";
    const guard = setTimeout(() => {
      s.destroy();
      reject(new Error(`no answer to ${path} while its body was held back: the body is read before the role is checked`));
    }, 10_000);
    s.on("data", (d: Buffer) => {
      got += d.toString();
      const line = got.split("\r\n")[0]!;
      if (got.includes("\r\n")) {
        clearTimeout(guard);
        s.destroy();
        resolve(line);
      }
    });
    s.on("error", reject);
  });
}

describe("narrow roles (a running coordinator, real HTTP)", () => {
  let t: TestCoordinator;
  let enroll: string;
  let member: string;
  let borrow: { borrowId: string; borrowToken: string };
  before(async () => {
    // No background reconciler: a dump taken before a refusal must not race its fill re-checks.
    t = await startTestCoordinator({ reconcile: false });
    enroll = (await t.token("agent")).token;
    member = (await t.token("member")).token;
    const admin = await t.api("admin");
    await admin.call("POST", "/v1/pools/p/ensure", { minReady: 0, maxReady: 1, compatibilityKey: "k", provider: "external" });
    const ensured = await admin.call<{ claims: Array<{ token: string }> }>("POST", "/v1/pools/p/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "k", provider: "external" });
    await admin.call("POST", "/v1/pools/p/machines", { claimToken: ensured.claims[0]!.token, resourceId: "r1", ssh: { host: "127.0.0.1", port: 22 } });
    borrow = await admin.call("POST", "/v1/pools/p/borrow", {});
  });
  after(() => t.close());

  it("the enroll token may call only the enrollment: every read and every other write is forbidden", async () => {
    const base = t.coord.url;
    const refused: Array<[("GET" | "POST"), string, unknown?]> = [
      ["GET", "/v1/hosts"],
      ["GET", "/v1/pools"],
      ["GET", "/v1/pools/p"],
      ["GET", `/v1/borrows/${borrow.borrowId}`],
      ["GET", "/v1/sizes"],
      ["GET", "/v1/allocations"],
      ["GET", "/v1/host-accounts"],
      ["GET", "/v1/volumes"],
      ["POST", "/v1/pools/p/borrow", {}],
      ["POST", "/v1/pools/p/ensure", { minReady: 0, maxReady: 0, compatibilityKey: "k" }],
      ["POST", `/v1/borrows/${borrow.borrowId}/heartbeat`, { token: borrow.borrowToken }],
      ["POST", `/v1/borrows/${borrow.borrowId}/report`, { token: borrow.borrowToken, firstCommandMs: 1 }],
      ["POST", `/v1/borrows/${borrow.borrowId}/return`, { token: borrow.borrowToken }],
      ["POST", "/v1/hosts/x/activate", {}],
    ];
    for (const [method, path, body] of refused) {
      const r = await call(base, method, path, enroll, body);
      assert.equal(r.status, 403, `${method} ${path}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.error?.code, "forbidden", `${method} ${path}`);
      assert.match(r.body.error!.message, /needs the (member|operator) role; the token has agent/);
    }
    // The one route it is for.
    const ok = await call(base, "POST", "/v1/hosts/enroll", enroll, { name: "fresh", ...DESCRIPTION("http://127.0.0.1:1") });
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
    // And a member may not enroll.
    assert.equal((await call(base, "POST", "/v1/hosts/enroll", member, { name: "fresh2", ...DESCRIPTION("http://127.0.0.1:1") })).status, 403);
  });

  it("a report needs the borrow's own token: an unknown borrow is not_found, another token token_mismatch, and neither is recorded", async () => {
    const base = t.coord.url;
    const count = async () => {
      const m = /berth_client_report_seconds_count\{kind="first_command"\} (\d+)/.exec(await (await request(`${base}/metrics`)).body.text());
      return Number(m?.[1] ?? 0);
    };
    const before0 = await count();
    const unknown = await call(base, "POST", "/v1/borrows/b_doesnotexist000000000/report", member, { token: borrow.borrowToken, firstCommandMs: 5 });
    assert.equal(unknown.status, 404);
    assert.equal(unknown.body.error?.code, "not_found");
    const other = await call(base, "POST", `/v1/borrows/${borrow.borrowId}/report`, member, { token: "bbt_someoneelsestoken", firstCommandMs: 5 });
    assert.equal(other.status, 403);
    assert.equal(other.body.error?.code, "token_mismatch");
    const otherOrg = (await t.token("member", "elsewhere")).token;
    const cross = await call(base, "POST", `/v1/borrows/${borrow.borrowId}/report`, otherOrg, { token: borrow.borrowToken, firstCommandMs: 5 });
    assert.equal(cross.status, 404, "another organisation's borrow is not there");
    assert.equal(await count(), before0, "nothing recorded for a refused report");
    const own = await call(base, "POST", `/v1/borrows/${borrow.borrowId}/report`, member, { token: borrow.borrowToken, firstCommandMs: 5 });
    assert.equal(own.status, 200);
    assert.equal(await count(), before0 + 1);
  });

  it("a host's API address is http: or https: only, at enrollment and when an identity host describes itself; a refusal changes nothing", async () => {
    const base = t.coord.url;
    const dump = await dumpAll(t.store);
    for (const url of ["javascript:alert(1)", "file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1:70/", "data:text/plain,x"]) {
      const r = await call(base, "POST", "/v1/hosts/enroll", enroll, { name: "badurl", ...DESCRIPTION(url) });
      assert.equal(r.status, 400, `${url}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.error?.code, "invalid_request");
      assert.match(r.body.error!.message, /url/);
    }
    assert.deepEqual(await dumpAll(t.store), dump);

    // An identity host (enrolled with a key proof) describing itself with a bad address.
    const key = generateKeyPairSync("ed25519");
    const publicKey = key.publicKey.export({ format: "der", type: "spki" }).toString("base64");
    const challenge = async () => (await call(base, "POST", "/v1/hosts/challenge", null, {})).body.challenge as string;
    const c1 = await challenge();
    const enrolled = await call(base, "POST", "/v1/hosts/enroll", enroll, {
      name: "keyed",
      ...DESCRIPTION("https://keyed.example:8443"),
      identity: { publicKey, challenge: c1, signature: sign(null, proofMessage("enroll", "keyed", c1), key.privateKey).toString("base64") },
    });
    assert.equal(enrolled.status, 200, JSON.stringify(enrolled.body));
    const hostId = enrolled.body.hostId as string;
    const c2 = await challenge();
    const session = await call(base, "POST", "/v1/hosts/session", null, { hostId, challenge: c2, signature: sign(null, proofMessage("session", hostId, c2), key.privateKey).toString("base64") });
    assert.equal(session.status, 200);
    const credential = session.body.credential as string;
    const bad = await call(base, "POST", "/v1/hosts/self/describe", credential, { description: DESCRIPTION("javascript:alert(1)"), step: "active", owed: 0, version: "x" });
    assert.equal(bad.status, 400);
    assert.match(bad.body.error!.message, /description\.url/);
    const good = await call(base, "POST", "/v1/hosts/self/describe", credential, { description: DESCRIPTION("http://127.0.0.1:7777"), step: "active", owed: 0, version: "x" });
    assert.equal(good.status, 200);
  });

  it("the role is checked before the body is read: the refusal arrives while the body is still held back", async () => {
    const base = t.coord.url;
    assert.match(await statusWithBodyHeldBack(base, "/v1/hosts/enroll", member), /^HTTP\/1\.1 403 /, "a member token at the enrollment");
    assert.match(await statusWithBodyHeldBack(base, "/v1/hosts/enroll", null), /^HTTP\/1\.1 401 /, "no token at the enrollment");
    assert.match(await statusWithBodyHeldBack(base, "/v1/pools/p/ensure", enroll), /^HTTP\/1\.1 403 /, "the enroll token elsewhere");
    assert.match(await statusWithBodyHeldBack(base, "/v1/pools/p/ensure", member), /^HTTP\/1\.1 403 /, "a member at an operator route");
  });
});
