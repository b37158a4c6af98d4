/**
 * The dashboard in a real browser (chromium through playwright-core) against
 * a real coordinator on a SQLite file: sign in, the overview, a borrow made
 * through the API appearing and leaving without a reload, draining a machine
 * from the page, organisation isolation, CSRF refusal, sign-out ending the
 * session server-side; screenshots of every page; and no token in any page,
 * URL or log line of the run.
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import pino from "pino";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { startCoordinator, type Coordinator } from "../../src/coordinator/server.js";
import { createToken, type Role } from "../../src/coordinator/auth.js";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import { Api } from "../../src/cli/api.js";
import { hashToken } from "../../src/core/tokens.js";
import { tempDir } from "../helpers/env.js";
import { BROWSER_SKIP, launch, recordedPage, screenshotDir, type Seen } from "../helpers/browser.js";

type Claim = { token: string };

describe("dashboard in chromium", { skip: BROWSER_SKIP }, () => {
  const dir = tempDir("berth-dash-");
  const logFile = join(dir.path, "coordinator.log");
  const seen: Seen = { urls: [], html: [] };
  const secrets: string[] = [];
  const shots = screenshotDir();
  let store: SqliteStore;
  let coord: Coordinator;
  let browser: Browser;
  let ctxA: BrowserContext;
  let page: Page;
  const apis: Api[] = [];
  const tok: Record<string, { id: string; token: string }> = {};

  const token = async (name: string, role: Role, org: string) => {
    tok[name] = await createToken(store, { org, role, expiresAt: null, label: name }, Date.now(), (n) => randomBytes(n));
    secrets.push(tok[name]!.token);
    return tok[name]!;
  };
  const api = (name: string) => {
    const a = new Api(coord.url, tok[name]!.token);
    apis.push(a);
    return a;
  };
  const seedPool = async (a: Api, name: string, n: number) => {
    const e = await a.call<{ claims: Claim[] }>("POST", `/v1/pools/${name}/ensure`, { minReady: n, maxReady: n + 1, compatibilityKey: "linux-x64" });
    for (const [i, c] of e.claims.entries()) await a.call("POST", `/v1/pools/${name}/machines`, { claimToken: c.token, resourceId: `${name}-vm-${i}`, ssh: { host: "10.0.0.1", port: 22, user: "ci" } });
  };
  const shot = (p: Page, name: string) => p.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
  const signIn = async (p: Page, t: string) => {
    await p.goto(`${coord.url}/ui`);
    assert.match(p.url(), /\/ui\/sign-in$/);
    await p.fill("#token", t);
    await p.press("#token", "Enter");
    await p.waitForURL(`${coord.url}/ui`);
  };
  /** Waits until the page's live stream is open (a change is then pushed to it). */
  const streaming = (p: Page) => p.waitForResponse((r) => r.url().includes("/ui/events"), { timeout: 5000 });

  before(async () => {
    store = new SqliteStore({ path: join(dir.path, "berth.db") });
    const log = pino({ level: "trace" }, pino.destination({ dest: logFile, sync: true }));
    // The default token-free rate (20/s, bursts of 40): a signed-in session's /ui requests are not counted
    // against it, however fast the pages are walked (test/dashboard/serving).
    coord = await startCoordinator({ store, secret: randomBytes(32), log, reconcileIntervalMs: 50, ui: { liveIntervalMs: 200, liveRecheckMs: 500 } });
    await token("adminA", "admin", "acme");
    await token("memberA", "member", "acme");
    await token("agentA", "agent", "acme");
    await token("adminB", "admin", "globex");
    await seedPool(api("adminA"), "ci", 3);
    await seedPool(api("adminA"), "build", 1);
    await seedPool(api("adminB"), "zeta", 1);
    await api("agentA").call("POST", "/v1/hosts/enroll", {
      name: "host-a",
      url: "http://127.0.0.1:1",
      runtime: "process",
      capacity: { vcpu: 8, memoryMb: 16384, slots: 4 },
      ssh: { host: "127.0.0.1", port: 2222, hostKey: "ssh-ed25519 AAAA", fingerprint: "SHA256:x" },
    });
    // A gvisor host on an old runsc: the overview names its platform and release, and the warning.
    await api("agentA").call("POST", "/v1/hosts/enroll", {
      name: "host-g",
      url: "http://127.0.0.1:2",
      runtime: "gvisor",
      runtimeDetail: { runsc: { version: "0.0~20221219.0", platform: "ptrace" }, warning: "runsc 0.0~20221219.0 is older than 0.0~20240729: inside its machines `ls -l` fails" },
      capacity: { vcpu: 8, memoryMb: 16384, slots: 4 },
      ssh: { host: "127.0.0.1", port: 2223, hostKey: "ssh-ed25519 AAAB", fingerprint: "SHA256:y" },
    });
    await api("adminA").call("POST", `/v1/owners/${tok.memberA!.id}/admit`, { vcpu: 4, memoryMib: 8192, count: 2 });
    await api("memberA").call("POST", "/v1/allocations", { id: "al-dash-1", size: "small", durationMs: 3_600_000 });
    browser = await launch();
    ({ context: ctxA, page } = await recordedPage(browser, seen));
    page.on("dialog", (d) => void d.accept());
  });

  after(async () => {
    await browser?.close();
    await Promise.all(apis.map((a) => a.close()));
    await coord?.stop();
    await store?.close();
    dir.cleanup();
  });

  test("sign in with a token: an httpOnly, SameSite=Strict session cookie; a wrong token is refused", async () => {
    await page.goto(`${coord.url}/ui/sign-in`);
    await shot(page, "sign-in");
    await page.fill("#token", "bat_not-a-real-token");
    await page.press("#token", "Enter");
    assert.match(await page.locator("[role=alert]").innerText(), /not known/);
    await signIn(page, tok.adminA!.token);
    const [cookie] = await ctxA.cookies();
    assert.equal(cookie?.name, "berth_session");
    assert.equal(cookie?.httpOnly, true);
    assert.equal(cookie?.sameSite, "Strict");
    assert.equal(cookie?.path, "/ui");
  });

  test("the overview shows the organisation's seeded pools, hosts and their figures", async () => {
    await page.goto(`${coord.url}/ui`);
    assert.deepEqual(await page.locator("tr[data-pool]").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-pool"))), ["build", "ci"]);
    assert.match(await page.locator('tr[data-pool="ci"]').innerText(), /ready 3 · lent 0 · cleanup 0 \(min 3, max 4\)/);
    assert.match(await page.locator('tr[data-host="host-a"]').innerText(), /process/);
    const gvisorRow = await page.locator('tr[data-host="host-g"]').innerText();
    assert.match(gvisorRow, /gvisor ptrace \(runsc 0\.0~20221219\.0\)/);
    assert.match(gvisorRow, /older than 0\.0~20240729: inside its machines `ls -l` fails/);
    await shot(page, "overview");
    // Keyboard: the focused button keeps the focus while a live refresh changes the page around it.
    const open = streaming(page);
    await page.reload();
    await open;
    const drainCi = page.locator('tr[data-pool="ci"] button');
    await drainCi.focus();
    await seedPool(api("adminA"), "zz-late", 1);
    await page.locator('tr[data-pool="zz-late"]').waitFor({ timeout: 2000 });
    assert.equal(await page.evaluate(() => document.activeElement?.getAttribute("formaction")), "/ui/pools/ci/drain");
  });

  test("a borrow made through the API appears within 2 s without a reload, and leaves after its return", async () => {
    const open = streaming(page);
    await page.goto(`${coord.url}/ui/borrows`);
    await open;
    await page.evaluate(() => ((window as unknown as { marker: number }).marker = 42));
    const b = await api("memberA").call<{ borrowId: string; borrowToken: string }>("POST", "/v1/pools/ci/borrow", {});
    secrets.push(b.borrowToken);
    const row = page.locator(`tr[data-borrow="${b.borrowId}"]`);
    await row.waitFor({ state: "visible", timeout: 2000 });
    assert.match(await row.innerText(), /left/);
    await shot(page, "borrows");
    await api("memberA").call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
    await row.waitFor({ state: "detached", timeout: 2000 });
    assert.equal(await page.evaluate(() => (window as unknown as { marker?: number }).marker), 42, "the page was not reloaded");
  });

  test("history: a burst of borrows made here shows on the pool's chart in the bucket of its time", async () => {
    const a = api("memberA");
    await seedPool(api("adminA"), "hist", 3);
    const t0 = Date.now();
    const made = [];
    for (let i = 0; i < 3; i++) made.push(await a.call<{ borrowId: string; borrowToken: string }>("POST", "/v1/pools/hist/borrow", {}));
    for (const b of made) {
      secrets.push(b.borrowToken);
      await a.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
    }
    const t1 = Date.now();
    // Written to the store now rather than at the next 10 s tick: the page reads them back from there.
    await coord.ctx.metrics.history.flush(store, coord.ctx.actor, Date.now(), true);
    await page.goto(`${coord.url}/ui/pools/hist?window=15m`);
    await page.waitForFunction(() => Boolean((window as unknown as { berthCharts?: Record<string, unknown> }).berthCharts?.["history-borrows"]));
    const [x, served, returned] = await page.evaluate(() => (window as unknown as { berthCharts: Record<string, { data: number[][] }> }).berthCharts["history-borrows"]!.data);
    const inBurst = (i: number) => x![i]! * 1000 >= t0 - (t0 % 10_000) && x![i]! * 1000 <= t1;
    const sum = (ys: number[], f: (i: number) => boolean) => ys.reduce((acc, n, i) => acc + (f(i) ? n : 0), 0);
    assert.equal(sum(served!, inBurst), 3, `served ${JSON.stringify(served)} at ${JSON.stringify(x)}`);
    assert.equal(sum(returned!, inBurst), 3);
    assert.equal(sum(served!, (i) => !inBurst(i)), 0, "nothing outside the burst's buckets");
    assert.match(await page.locator("#history-summary").innerText(), /3 borrows served and 3 returned in the last 15m/);
    // "In state" keeps counting between live refreshes.
    const inState = page.locator("tr[data-machine] [data-since]").first();
    const was = await inState.innerText();
    await page.waitForFunction((w) => document.querySelector("tr[data-machine] [data-since]")?.textContent !== w, was, { timeout: 3000 });
    await shot(page, "pool-history");
  });

  test("history: a machine quarantined here (heartbeat missed) is drawn on its pool's quarantine chart under its reason", async () => {
    const a = api("adminA");
    const e = await a.call<{ claims: Claim[] }>("POST", "/v1/pools/quar/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "linux-x64", heartbeatMs: 1_000 });
    await a.call("POST", "/v1/pools/quar/machines", { claimToken: e.claims[0]!.token, resourceId: "quar-vm-0", ssh: { host: "10.0.0.1", port: 22, user: "ci" } });
    const b = await api("memberA").call<{ borrowId: string; borrowToken: string }>("POST", "/v1/pools/quar/borrow", {});
    secrets.push(b.borrowToken);
    const t0 = Date.now();
    for (;;) {
      const p = await a.call<{ states: Record<string, number> }>("GET", "/v1/pools/quar");
      if ((p.states.quarantined ?? 0) > 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const t1 = Date.now();
    await coord.ctx.metrics.history.flush(store, coord.ctx.actor, Date.now(), true);
    await page.goto(`${coord.url}/ui/pools/quar?window=15m`);
    await page.waitForFunction(() => Boolean((window as unknown as { berthCharts?: Record<string, unknown> }).berthCharts?.["history-quarantine"]));
    const [data, labels] = await page.evaluate(() => {
      const u = (window as unknown as { berthCharts: Record<string, { data: number[][]; series: Array<{ label?: string }> }> }).berthCharts["history-quarantine"]!;
      return [u.data, u.series.map((s) => s.label ?? "")] as const;
    });
    assert.deepEqual(labels.slice(1), ["abandoned"]);
    const [x, n] = data as [number[], number[]];
    const at = x.filter((_, i) => n[i]! > 0);
    assert.equal(n.reduce((acc, v) => acc + v, 0), 1, JSON.stringify(n));
    assert.ok(at[0]! * 1000 >= t0 - (t0 % 10_000) && at[0]! * 1000 <= t1, `drawn at ${at[0]}, quarantined between ${t0} and ${t1}`);
    assert.match(await page.locator('[data-figures="history-quarantine"]').innerText(), /abandoned 1/);
  });

  test("drain a machine from the pool page: it leaves the ready machines, and the page when destroyed", async () => {
    const open = streaming(page);
    await page.goto(`${coord.url}/ui/pools/ci`);
    await open;
    await shot(page, "pool");
    const ready = page.locator('table[data-group="ready"] tr[data-machine]');
    const before = await ready.count();
    const id = (await ready.first().getAttribute("data-machine"))!;
    const reopened = streaming(page);
    await page.locator(`tr[data-machine="${id}"] button`).click();
    await page.waitForURL(`${coord.url}/ui/pools/ci?done=machine-drained&id=${id}`);
    await reopened;
    assert.match(await page.locator("main p.notice.done[role=status]").innerText(), new RegExp(`Machine ${id} is draining`));
    await page.locator(`table[data-group="draining"] tr[data-machine="${id}"]`).waitFor({ timeout: 2000 });
    assert.equal(await page.locator(`table[data-group="ready"] tr[data-machine="${id}"]`).count(), 0);
    assert.equal(await ready.count(), before - 1);
    // The outside keeper confirms destruction; the machine leaves the page live.
    await api("adminA").call("POST", `/v1/machines/${id}/destroyed`, {});
    await page.locator(`tr[data-machine="${id}"]`).waitFor({ state: "detached", timeout: 2000 });
    await page.goto(`${coord.url}/ui/machines/${id}`);
    // The timeline, newest first: confirmed destroyed, drained from the page, … registered ready.
    const states = await page.locator("#live table").last().locator("tbody tr td:nth-child(4)").allInnerTexts();
    assert.deepEqual(states.slice(0, 2), ["destroyed", "draining"]);
    await shot(page, "machine");
  });

  test("the drain-pool confirmation follows its 'also end live borrows now' box; a confirmed action shows a success notice", async () => {
    await page.goto(`${coord.url}/ui/pools/zz-late`);
    const asked: string[] = [];
    const answer = (d: import("playwright-core").Dialog) => {
      asked.push(d.message());
      void d.dismiss();
    };
    page.removeAllListeners("dialog");
    page.on("dialog", answer);
    try {
      await page.getByRole("button", { name: "Drain pool" }).click();
      await page.getByLabel("also end live borrows now").check();
      await page.getByRole("button", { name: "Drain pool" }).click();
    } finally {
      page.off("dialog", answer);
      page.on("dialog", (d) => void d.accept());
    }
    assert.equal(asked.length, 2);
    assert.doesNotMatch(asked[0]!, /ended now/);
    assert.match(asked[0]!, /live borrows run to their end/);
    assert.match(asked[1]!, /live borrows are ended now/);
    // Dismissed twice: nothing happened.
    assert.equal(page.url(), `${coord.url}/ui/pools/zz-late`);
    await page.getByRole("button", { name: "Drain pool" }).click();
    await page.waitForURL(/\/ui\/pools\/zz-late/);
    assert.match(await page.locator("main p.notice.done[role=status]").innerText(), /Pool zz-late is draining/);
  });

  test("memory is shown in GiB, as the CLI shows it", async () => {
    await page.goto(`${coord.url}/ui`);
    const hosts = (await page.locator("tr[data-host]").allInnerTexts()).join("\n");
    // One host holds al-dash-1 (small: 4 GiB), the other none.
    assert.match(hosts, /4 GiB \/ 16 GiB memory/);
    assert.match(hosts, /0 GiB \/ 16 GiB memory/);
    assert.doesNotMatch(hosts, /MiB/);
  });

  test("a form posted without the session's CSRF token (or from another site) is refused and changes nothing", async () => {
    const pool = await api("adminA").call<{ states: Record<string, number> }>("GET", "/v1/pools/build");
    await page.goto(`${coord.url}/ui/pools/build`);
    const id = (await page.locator('table[data-group="ready"] tr[data-machine]').first().getAttribute("data-machine"))!;
    const csrf = (await page.locator('input[name="csrf"]').first().getAttribute("value"))!;
    const none = await page.request.post(`${coord.url}/ui/machines/${id}/drain`, { form: { back: "/ui" }, maxRedirects: 0 });
    assert.equal(none.status(), 403);
    assert.match(await none.text(), /CSRF token is missing or does not match/);
    const wrong = await page.request.post(`${coord.url}/ui/machines/${id}/drain`, { form: { csrf: "0".repeat(64) }, maxRedirects: 0 });
    assert.equal(wrong.status(), 403);
    const elsewhere = await page.request.post(`${coord.url}/ui/machines/${id}/drain`, { form: { csrf }, headers: { origin: "http://evil.example" }, maxRedirects: 0 });
    assert.equal(elsewhere.status(), 403);
    assert.deepEqual((await api("adminA").call<{ states: Record<string, number> }>("GET", "/v1/pools/build")).states, pool.states);
  });

  test("allocations and owners' budgets; release from the page; the tokens page", async () => {
    await page.goto(`${coord.url}/ui/allocations`);
    assert.match(await page.locator('tr[data-allocation="al-dash-1"]').innerText(), /placed/);
    assert.match(await page.locator(`tr[data-owner="${tok.memberA!.id}"]`).innerText(), /2 \/ 4 vCPU/);
    // Allocation use over time: the placed allocation is drawn on its host's and its owner's lines.
    await coord.ctx.metrics.history.flush(store, coord.ctx.actor, Date.now(), true);
    await page.goto(`${coord.url}/ui/allocations?window=15m`);
    await page.waitForFunction(() => Boolean((window as unknown as { berthCharts?: Record<string, unknown> }).berthCharts?.["use-owner-allocations"]));
    const drawn = await page.evaluate(() =>
      ["use-host-allocations", "use-owner-allocations", "use-owner-vcpu"].map((id) => {
        const u = (window as unknown as { berthCharts: Record<string, { data: number[][]; series: Array<{ label?: string }> }> }).berthCharts[id]!;
        return { labels: u.series.slice(1).map((s) => s.label ?? ""), max: u.data.slice(1).map((ys) => Math.max(...ys)) };
      }),
    );
    const placed = await api("adminA").call<{ plan: { hostName: string } }>("GET", "/v1/allocations/al-dash-1");
    assert.deepEqual(drawn[0], { labels: [placed.plan.hostName], max: [1] }, JSON.stringify(drawn));
    assert.equal(drawn[1]!.labels.length, 1);
    assert.match(drawn[1]!.labels[0]!, new RegExp(tok.memberA!.id));
    assert.deepEqual(drawn[1]!.max, [1]);
    assert.deepEqual(drawn[2]!.max, [2]);
    await shot(page, "allocations");
    await page.locator('tr[data-allocation="al-dash-1"] button').click();
    await page.waitForURL(`${coord.url}/ui/allocations?done=allocation-released&id=al-dash-1`);
    assert.match(await page.locator("main p.notice.done[role=status]").innerText(), /Allocation al-dash-1 was released/);
    assert.equal(await page.locator('tr[data-allocation="al-dash-1"]').count(), 0);
    await page.goto(`${coord.url}/ui/tokens`);
    assert.equal(await page.locator("tr[data-token]").count(), 3);
    await shot(page, "tokens");
    await page.goto(`${coord.url}/ui/audit`);
    assert.ok((await page.locator("tr[data-seq]").count()) > 0);
    await shot(page, "audit");
  });

  test("a second organisation's session sees none of the first's pools, machines, borrows or actions", async () => {
    const { context, page: pb } = await recordedPage(browser, seen);
    try {
      await signIn(pb, tok.adminB!.token);
      assert.deepEqual(await pb.locator("tr[data-pool]").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-pool"))), ["zeta"]);
      assert.equal(await pb.locator("tr[data-host]").count(), 0);
      const html = await pb.content();
      for (const word of ["ci", "build", "host-a"]) assert.ok(!html.includes(`>${word}<`), `org B's overview shows ${word}`);
      await shot(pb, "overview-other-org");
      const machineA = (await api("adminA").call<{ states: Record<string, number> }>("GET", "/v1/pools/ci")) && (await page.goto(`${coord.url}/ui/pools/ci`), await page.locator("tr[data-machine]").first().getAttribute("data-machine"))!;
      assert.equal((await pb.goto(`${coord.url}/ui/pools/ci`))!.status(), 404);
      assert.equal((await pb.goto(`${coord.url}/ui/machines/${machineA}`))!.status(), 404);
      await pb.goto(`${coord.url}/ui/borrows`);
      assert.equal(await pb.locator("tr[data-borrow]").count(), 0);
      await pb.goto(`${coord.url}/ui/tokens`);
      assert.equal(await pb.locator("tr[data-token]").count(), 1);
      const csrf = (await pb.locator('input[name="csrf"]').first().getAttribute("value"))!;
      const drain = await pb.request.post(`${coord.url}/ui/machines/${machineA}/drain`, { form: { csrf }, maxRedirects: 0 });
      assert.equal(drain.status(), 404);
      const revoke = await pb.request.post(`${coord.url}/ui/tokens/${tok.adminA!.id}/revoke`, { form: { csrf }, maxRedirects: 0 });
      assert.equal(revoke.status(), 404);
    } finally {
      await context.close();
    }
  });

  test("at 390 px (a phone) no page scrolls sideways and every action button is reachable", async () => {
    const b = await api("memberA").call<{ borrowId: string; borrowToken: string }>("POST", "/v1/pools/ci/borrow", {});
    secrets.push(b.borrowToken);
    await api("memberA").call("POST", "/v1/allocations", { id: "al-dash-phone", size: "small", durationMs: 3_600_000 });
    await page.goto(`${coord.url}/ui/pools/ci`);
    const machine = (await page.locator("tr[data-machine]").first().getAttribute("data-machine"))!;
    await page.setViewportSize({ width: 390, height: 844 });
    try {
      const pages = ["/ui", "/ui/pools/ci", "/ui/borrows", "/ui/allocations", `/ui/machines/${machine}`, "/ui/tokens", "/ui/audit", "/ui/pools/no-such-pool"];
      for (const path of pages) {
        await page.goto(`${coord.url}${path}`);
        const { scroll, client } = await page.evaluate(() => ({ scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth }));
        assert.ok(scroll <= client, `${path}: scrollWidth ${scroll} > clientWidth ${client}`);
        const buttons = page.locator("main button, header button");
        const n = await buttons.count();
        if (path === "/ui/borrows") assert.ok(n >= 1, "the borrows page shows its End borrow button");
        for (let i = 0; i < n; i++) {
          const button = buttons.nth(i);
          await button.scrollIntoViewIfNeeded();
          const box = (await button.boundingBox())!;
          assert.ok(box && box.x >= 0 && box.x + box.width <= 390 && box.width > 0, `${path}: button ${await button.innerText()} lies outside the 390 px width (${JSON.stringify(box)})`);
        }
        await shot(page, `phone${path.replace(machine, "machine").replaceAll("/", "-")}`);
      }
    } finally {
      await page.setViewportSize({ width: 1280, height: 900 });
    }
  });

  test("signing out ends the session server-side: the old cookie is refused", async () => {
    await page.goto(`${coord.url}/ui`);
    const [cookie] = await ctxA.cookies();
    const old = `berth_session=${cookie!.value}`;
    const rows = () => store.transaction((tx) => tx.all("SELECT hash FROM ui_sessions WHERE hash = ?", [hashToken("session", cookie!.value)]));
    assert.equal((await rows()).length, 1);
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.waitForURL(`${coord.url}/ui/sign-in`);
    assert.equal((await rows()).length, 0);
    const again = await fetch(`${coord.url}/ui`, { headers: { cookie: old }, redirect: "manual" });
    assert.equal(again.status, 303);
    assert.equal(again.headers.get("location"), "/ui/sign-in");
    const events = await fetch(`${coord.url}/ui/events`, { headers: { cookie: old } });
    assert.equal(events.status, 401);
    await events.text();
  });

  test("no token appears in any HTML page, URL or log line of the run", async () => {
    const log = readFileSync(logFile, "utf8");
    assert.ok(seen.html.length >= 10, `only ${seen.html.length} pages recorded`);
    assert.ok(log.length > 0);
    for (const s of secrets) {
      for (const h of seen.html) assert.ok(!h.includes(s), "a token appears in a page");
      for (const u of seen.urls) assert.ok(!u.includes(s), `a token appears in the URL ${u.slice(0, 40)}…`);
      assert.ok(!log.includes(s), "a token appears in the coordinator's log");
    }
    process.stdout.write(`# dashboard screenshots in ${shots}\n`);
  });
});
