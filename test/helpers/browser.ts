/**
 * A real browser for the dashboard's tests: Debian's chromium driven by
 * playwright-core (installed by .ci/run), launched once per test file. Every
 * HTML answer and every URL the browser requests is recorded, so a test can
 * assert that no secret ever reached a page or a URL.
 */
import { existsSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type Browser, type BrowserContext, type Page } from "playwright-core";

export const CHROMIUM = process.env.BERTH_CHROMIUM ?? "/usr/bin/chromium";
export const BROWSER_SKIP = existsSync(CHROMIUM) ? false : `the dashboard's browser tests need chromium at ${CHROMIUM} (Debian package chromium; .ci/run installs it)`;

export interface Seen {
  urls: string[];
  html: string[];
}

export async function launch(): Promise<Browser> {
  return chromium.launch({ executablePath: CHROMIUM, args: process.getuid?.() === 0 ? ["--no-sandbox"] : [] });
}

/** A fresh browser context (its own cookies) whose traffic is recorded into `seen`. */
export async function recordedPage(browser: Browser, seen: Seen): Promise<{ context: BrowserContext; page: Page }> {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.on("request", (r) => seen.urls.push(r.url()));
  page.on("response", (r) => {
    const type = r.headers()["content-type"] ?? "";
    if (type.startsWith("text/html")) void r.text().then((t) => seen.html.push(t), () => undefined);
  });
  return { context, page };
}

/** Where this run's screenshots go (under the OS temp dir unless BERTH_SCREENSHOTS names one). */
export function screenshotDir(): string {
  const dir = process.env.BERTH_SCREENSHOTS ?? join(tmpdir(), "berth-dashboard-screenshots");
  mkdirSync(dir, { recursive: true });
  return dir;
}
