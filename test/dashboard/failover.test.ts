/**
 * Several coordinators behind one address (docs/dashboard.md "Outages"): two
 * real `berth serve` processes on one PostgreSQL schema, a TCP forwarder on
 * one loopback address in front of them (what a load balancer is), and a
 * page open in a real browser through that address. The coordinator serving
 * the page is killed -9 and the forwarder sends new connections to the
 * other one: the page stays where it was (no navigation, no reload, no
 * sign-in), its session is the shared store's, and a borrow made through the
 * surviving coordinator reaches it live.
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { connect, createServer, type Server, type Socket } from "node:net";
import { randomBytes } from "node:crypto";
import type { Browser, Page } from "playwright-core";
import { createToken } from "../../src/coordinator/auth.js";
import { Api } from "../../src/cli/api.js";
import type { Store } from "../../src/store/store.js";
import { PG_SKIP, tempDir } from "../helpers/env.js";
import { openLocation, startServe, type ServeProcess, type StoreLocation } from "../helpers/serve.js";
import { BROWSER_SKIP, launch, recordedPage, type Seen } from "../helpers/browser.js";

/** One address in front of several coordinators; new connections go to the current target. */
interface Forwarder {
  url: string;
  point(targetUrl: string): void;
  close(): Promise<void>;
}

async function forwarder(targetUrl: string): Promise<Forwarder> {
  let target = new URL(targetUrl);
  const open = new Set<Socket>();
  const server: Server = createServer((down) => {
    const up = connect(Number(target.port), target.hostname);
    open.add(down).add(up);
    down.pipe(up);
    up.pipe(down);
    const end = () => {
      down.destroy();
      up.destroy();
      open.delete(down);
      open.delete(up);
    };
    down.on("error", end).on("close", end);
    up.on("error", end).on("close", end);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    point: (u) => (target = new URL(u)),
    close: () =>
      new Promise<void>((r) => {
        for (const s of open) s.destroy();
        server.close(() => r());
      }),
  };
}

describe("dashboard behind one address in front of two coordinators", { skip: PG_SKIP || BROWSER_SKIP }, () => {
  const dir = tempDir("berth-dash-failover-");
  const loc: StoreLocation = { engine: "postgres", dir: dir.path, schema: "t_" + randomBytes(6).toString("hex") };
  const seen: Seen = { urls: [], html: [] };
  let a: ServeProcess;
  let b: ServeProcess;
  let front: Forwarder;
  let store: Store;
  let browser: Browser;
  let page: Page;
  let token: string;
  const navigations: string[] = [];

  before(async () => {
    store = await openLocation(loc);
    token = (await createToken(store, { org: "acme", role: "admin", expiresAt: null, label: "failover" }, Date.now(), (n) => randomBytes(n))).token;
    // One after the other: the first sets the schema up, the second finds it ready.
    a = await startServe(loc);
    b = await startServe(loc);
    front = await forwarder(a.url);
    const api = new Api(a.url, token);
    try {
      const e = await api.call<{ claims: Array<{ token: string }> }>("POST", "/v1/pools/ci/ensure", { minReady: 2, maxReady: 2, compatibilityKey: "linux-x64" });
      for (const [i, c] of e.claims.entries()) await api.call("POST", "/v1/pools/ci/machines", { claimToken: c.token, resourceId: `ci-vm-${i}`, ssh: { host: "10.0.0.1", port: 22, user: "ci" } });
    } finally {
      await api.close();
    }
    browser = await launch();
    ({ page } = await recordedPage(browser, seen));
    page.on("request", (r) => {
      if (r.isNavigationRequest() && r.frame() === page.mainFrame()) navigations.push(r.url());
    });
    await page.goto(`${front.url}/ui/sign-in`);
    await page.fill("#token", token);
    await page.press("#token", "Enter");
    await page.waitForURL(`${front.url}/ui`);
  });

  after(async () => {
    await browser?.close();
    await front?.close();
    await a?.kill("SIGKILL");
    await b?.kill("SIGKILL");
    await store?.close();
    dir.cleanup();
  });

  test("the serving coordinator killed -9, the address moved to the other: the page keeps its place and its session, and is live again", async () => {
    const streaming = page.waitForResponse((r) => r.url().includes("/ui/events") && r.status() === 200, { timeout: 10_000 });
    await page.goto(`${front.url}/ui/borrows`);
    await streaming;
    await page.evaluate(() => ((window as unknown as { marker: number }).marker = 7));
    navigations.length = 0;

    // The page's stream now comes through the forwarder from coordinator A.
    const reconnected = page.waitForResponse((r) => r.url().includes("/ui/events") && r.status() === 200, { timeout: 20_000 });
    front.point(b.url);
    await a.kill("SIGKILL");
    await reconnected;

    const api = new Api(b.url, token);
    let borrowId: string;
    try {
      ({ borrowId } = await api.call<{ borrowId: string }>("POST", "/v1/pools/ci/borrow", {}));
    } finally {
      await api.close();
    }
    // A bound against a hang, not a timing check: the row arrives over the stream from B.
    await page.locator(`tr[data-borrow="${borrowId}"]`).waitFor({ timeout: 20_000 });
    await page.locator("#outage").waitFor({ state: "hidden", timeout: 20_000 });
    assert.deepEqual(navigations, [], "the page navigated (reload or sign-in) when its coordinator went away");
    assert.equal(page.url(), `${front.url}/ui/borrows`);
    assert.equal(await page.evaluate(() => (window as unknown as { marker?: number }).marker), 7, "the page was reloaded");
    assert.doesNotMatch((await page.locator("#live").getAttribute("class")) ?? "", /\bstale\b/);
  });
});
