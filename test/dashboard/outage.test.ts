/**
 * The dashboard through coordinator outages, in a real browser (chromium
 * through playwright-core) against a real `berth serve` process on a SQLite
 * file and a fixed port: a graceful stop (SIGTERM) and a crash (SIGKILL)
 * while a page is open. The page keeps its place (no navigation, no reload),
 * shows a banner naming since when the coordinator is unreachable within
 * 2 s, greys its stale figures, and is refreshed in place within 2 s of the
 * coordinator's return. Only a session that is really gone (deleted while the
 * coordinator was down) takes the page to the sign-in form.
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { randomBytes } from "node:crypto";
import type { Browser, Page } from "playwright-core";
import { createToken } from "../../src/coordinator/auth.js";
import { Api } from "../../src/cli/api.js";
import type { Store } from "../../src/store/store.js";
import { tempDir } from "../helpers/env.js";
import { openLocation, startServe, type ServeProcess, type StoreLocation } from "../helpers/serve.js";
import { BROWSER_SKIP, launch, recordedPage, type Seen } from "../helpers/browser.js";

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

describe("dashboard through coordinator outages", { skip: BROWSER_SKIP }, () => {
  const dir = tempDir("berth-dash-outage-");
  const loc: StoreLocation = { engine: "sqlite", dir: dir.path };
  const seen: Seen = { urls: [], html: [] };
  let port: number;
  let serve: ServeProcess;
  let store: Store;
  let browser: Browser;
  let page: Page;
  let token: string;
  const navigations: string[] = [];
  let url: string;

  const start = async () => {
    serve = await startServe(loc, {}, ["--listen", `127.0.0.1:${port}`]);
    url = serve.url;
  };
  const api = async <T>(method: string, path: string, body?: unknown): Promise<T> => {
    const a = new Api(url, token);
    try {
      return await a.call<T>(method, path, body);
    } finally {
      await a.close();
    }
  };
  /** A failed test before this one may have left the coordinator down. */
  const up = async () => {
    if (serve.child.exitCode !== null || serve.child.signalCode !== null) await start();
  };
  const streaming = (p: Page) => p.waitForResponse((r) => r.url().includes("/ui/events") && r.status() === 200, { timeout: 5000 });

  before(async () => {
    port = await freePort();
    await start();
    store = await openLocation(loc);
    token = (await createToken(store, { org: "acme", role: "admin", expiresAt: null, label: "outage" }, Date.now(), (n) => randomBytes(n))).token;
    const e = await api<{ claims: Array<{ token: string }> }>("POST", "/v1/pools/ci/ensure", { minReady: 3, maxReady: 4, compatibilityKey: "linux-x64" });
    for (const [i, c] of e.claims.entries()) await api("POST", "/v1/pools/ci/machines", { claimToken: c.token, resourceId: `ci-vm-${i}`, ssh: { host: "10.0.0.1", port: 22, user: "ci" } });
    browser = await launch();
    ({ page } = await recordedPage(browser, seen));
    // Document loads of the page (a reload, or a move to another page, tried even if it fails).
    page.on("request", (r) => {
      if (r.isNavigationRequest() && r.frame() === page.mainFrame()) navigations.push(r.url());
    });
    await page.goto(`${url}/ui/sign-in`);
    await page.fill("#token", token);
    await page.press("#token", "Enter");
    await page.waitForURL(`${url}/ui`);
  });

  after(async () => {
    await browser?.close();
    await serve?.kill("SIGKILL");
    await store?.close();
    dir.cleanup();
  });

  for (const signal of ["SIGTERM", "SIGKILL"] as const) {
    test(`${signal} while a page is open: banner within 2 s, no sign-out, refreshed in place within 2 s of the restart`, async () => {
      await up();
      const open = streaming(page);
      await page.goto(`${url}/ui/borrows`);
      await open;
      await page.evaluate(() => ((window as unknown as { marker: number }).marker = 7));
      navigations.length = 0;
      const banner = page.locator("#outage");
      assert.equal(await banner.isVisible(), false, "no banner while the coordinator answers");

      await serve.kill(signal);
      await banner.waitFor({ state: "visible", timeout: 2000 });
      const text = await banner.innerText();
      assert.match(text, /Coordinator unreachable since \d\d:\d\d:\d\d/);
      assert.match(text, /showing data from \d\d:\d\d:\d\d/);
      assert.match((await page.locator("#live").getAttribute("class")) ?? "", /\bstale\b/, "stale figures are greyed");
      // Several reconnect attempts pass; the page stays where it was.
      await new Promise((r) => setTimeout(r, 3000));
      assert.deepEqual(navigations, [], "the page navigated during the outage");
      assert.equal(page.url(), `${url}/ui/borrows`);

      await start();
      const back = Date.now();
      // A change made once it is back reaches the page (live again), and the banner goes.
      const b = await api<{ borrowId: string }>("POST", "/v1/pools/ci/borrow", {});
      await banner.waitFor({ state: "hidden", timeout: 2000 });
      await page.locator(`tr[data-borrow="${b.borrowId}"]`).waitFor({ timeout: Math.max(100, 2000 - (Date.now() - back)) });
      assert.doesNotMatch((await page.locator("#live").getAttribute("class")) ?? "", /\bstale\b/);
      assert.deepEqual(navigations, [], "the page navigated on the coordinator's return");
      assert.equal(await page.evaluate(() => (window as unknown as { marker?: number }).marker), 7, "the page was reloaded");
    });
  }

  test("a session that ended while the coordinator was down: the page goes to the sign-in form once it is back", async () => {
    await up();
    const open = streaming(page);
    await page.goto(`${url}/ui/borrows`);
    await open;
    await serve.kill("SIGTERM");
    await page.locator("#outage").waitFor({ state: "visible", timeout: 2000 });
    await store.transaction((tx) => tx.run("DELETE FROM ui_sessions", []));
    await start();
    await page.waitForURL(`${url}/ui/sign-in`, { timeout: 3000 });
  });
});
