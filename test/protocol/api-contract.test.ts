/**
 * The client↔coordinator contract (src/protocol/api.ts) against what is
 * documented (docs/api.md's route table) and what is served (the routes a
 * real coordinator registers), both ways; and the client's reading of replies
 * through it: a reply that does not match is `invalid_reply` naming the field.
 */
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync, statSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { join } from "node:path";
import { API, standingSchema } from "../../src/protocol/api.js";
import { HOST_STANDINGS } from "../../src/core/allocation-placement.js";
import { Api, ApiError } from "../../src/client/http.js";
import { startTestCoordinator, type TestCoordinator } from "../helpers/env.js";

/** "GET /v1/pools/{pool}" and "GET /v1/pools/:pool" alike: params unnamed, optional query dropped. */
function shape(route: string): string {
  return route
    .replace(/\[[^\]]*\]$/, "")
    .replace(/\{[^}]+\}|:[A-Za-z]+/g, "{}")
    .trim();
}

/** The routes of docs/api.md's table: rows whose first cell is `METHOD /path`. */
function documentedRoutes(markdown: string): string[] {
  return [...markdown.matchAll(/^\| `((?:GET|POST|PUT|DELETE|PATCH) \/[^`]*)` \|/gm)].map((m) => m[1]!);
}

/** What one side has that the other lacks, by shape. */
function difference(have: readonly string[], want: readonly string[]): { missing: string[]; extra: string[] } {
  const h = new Set(have.map(shape));
  const w = new Set(want.map(shape));
  return { missing: [...w].filter((x) => !h.has(x)).sort(), extra: [...h].filter((x) => !w.has(x)).sort() };
}

const DOCS = readFileSync("docs/api.md", "utf8");
const CONTRACT = Object.keys(API);

describe("API contract", () => {
  it("docs/api.md documents exactly the routes of src/protocol/api.ts", () => {
    const documented = documentedRoutes(DOCS);
    assert.ok(documented.length >= 40, `only ${documented.length} routes read from docs/api.md`);
    assert.deepEqual(difference(CONTRACT, documented), { missing: [], extra: [] });
  });

  it("the check catches a documented route missing from the contract, and a route missing from the docs", () => {
    const row = DOCS.split("\n").find((l) => l.startsWith("| `POST /v1/volumes/{allocation}/reset` |"));
    assert.ok(row, "the reset row is in docs/api.md");
    // A route the docs lack: the contract has one more.
    assert.deepEqual(difference(CONTRACT, documentedRoutes(DOCS.replace(row + "\n", ""))), { missing: [], extra: ["POST /v1/volumes/{}/reset"] });
    // A route the contract lacks: the docs have one more.
    const fewer = CONTRACT.filter((r) => r !== "POST /v1/volumes/{allocation}/reset");
    assert.deepEqual(difference(fewer, documentedRoutes(DOCS)), { missing: ["POST /v1/volumes/{}/reset"], extra: [] });
  });

  describe("against a running coordinator", () => {
    let t: TestCoordinator;
    before(async () => {
      t = await startTestCoordinator();
    });
    after(async () => {
      await t.close();
    });

    it("serves exactly the contract's routes (the dashboard's /ui apart)", () => {
      const served = t.coord
        .routes()
        .filter((r) => r.path !== "/ui" && !r.path.startsWith("/ui/"))
        .map((r) => `${r.method} ${r.path}`);
      assert.deepEqual(difference(CONTRACT, served), { missing: [], extra: [] });
    });

    it("its replies parse by the contract", async () => {
      const api = await t.api("admin");
      assert.equal((await api.send("GET /v1/health", {})).status, "ok");
      const ensured = await api.send("POST /v1/pools/{pool}/ensure", { pool: "p1" }, { minReady: 0, maxReady: 1, compatibilityKey: "k" });
      assert.equal(ensured.name, "p1");
      const shown = await api.send("GET /v1/pools/{pool}", { pool: "p1" });
      assert.deepEqual(shown.counts, { ready: 0, lent: 0, cleanup: 0, openClaims: 0 });
      assert.deepEqual((await api.send("GET /v1/pools", {})).pools.map((p) => p.name), ["p1"]);
      assert.deepEqual(await api.send("POST /v1/pools/{pool}/drain", { pool: "p1" }, {}), { drained: 0, remaining: 0 });
      const sizes = await api.send("GET /v1/sizes", {});
      assert.ok(sizes.sizes.length > 0);
      assert.match(await api.send("GET /metrics", {}), /^# HELP /m);
    });
  });

  describe("a reply that does not match", () => {
    let server: Server;
    let url: string;
    let answer: unknown;
    before(async () => {
      server = createServer((_req, res) => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify(answer));
      });
      await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
      const a = server.address();
      url = `http://127.0.0.1:${typeof a === "object" && a ? a.port : 0}`;
    });
    after(async () => {
      await new Promise<void>((r) => server.close(() => r()));
    });

    it("is invalid_reply naming the field, never a cast value", async () => {
      const api = new Api(url, "t");
      try {
        answer = { drained: 1, remaining: "none" };
        await assert.rejects(api.send("POST /v1/pools/{pool}/drain", { pool: "p" }, {}), (e: unknown) => {
          assert.ok(e instanceof ApiError);
          assert.equal(e.code, "invalid_reply");
          assert.match(e.message, /POST \/v1\/pools\/\{pool\}\/drain .*field remaining: /);
          return true;
        });
        answer = { pools: [{ name: "p", access: "keeper", provider: "hosts", compatibilityKey: "k", minReady: 0, maxReady: 1, hardTtlMs: 1, heartbeatMs: 1, counts: { ready: 0 } }] };
        await assert.rejects(api.send("GET /v1/pools", {}), (e: unknown) => e instanceof ApiError && e.code === "invalid_reply" && /field pools\.0\.counts\.lent: /.test(e.message));
        answer = null;
        await assert.rejects(api.send("GET /v1/health", {}), (e: unknown) => e instanceof ApiError && e.code === "invalid_reply" && /field reply: /.test(e.message));
        // Fields the contract does not name are kept as they came.
        answer = { drained: 1, remaining: 0, later: { x: 1 } };
        assert.deepEqual(await api.send("POST /v1/pools/{pool}/drain", { pool: "p" }, {}), answer);
      } finally {
        await api.close();
      }
    });
  });

  it("the standing schema takes exactly the host standings", () => {
    assert.deepEqual([...standingSchema.shape.standing.options].sort(), [...HOST_STANDINGS].sort());
  });

  it("berth's own code calls coordinator routes only through the contract", () => {
    const files: string[] = [];
    const walk = (d: string): void => {
      for (const n of readdirSync(d)) {
        const p = join(d, n);
        if (statSync(p).isDirectory()) walk(p);
        else if (p.endsWith(".ts")) files.push(p);
      }
    };
    walk("src");
    const casts = files.flatMap((f) =>
      readFileSync(f, "utf8")
        .split("\n")
        .map((l, i) => ({ f, i, l }))
        .filter((x) => /\b(?:api|probe)\.call\s*[<(]/.test(x.l))
        .map((x) => `${x.f}:${x.i + 1}`),
    );
    assert.deepEqual(casts, []);
  });
});
