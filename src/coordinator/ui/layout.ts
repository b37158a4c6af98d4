/**
 * The page shell and the small pieces every page uses: navigation, the
 * signed-in line with its sign-out form, the live region (refreshed by htmx
 * when the server-sent event stream says `changed`), bars that carry their
 * numbers in text, ages, deadlines and action forms (each with the session's
 * CSRF token and a confirmation).
 */
import { allows, type Principal } from "../auth.js";
import { html, type Html } from "./html.js";
import { assetUrl } from "./assets.js";

export interface View {
  principal: Principal;
  csrf: string;
  now: number;
  /** The page's path: action forms come back to it. */
  here: string;
  /** The session's token's label, where it has one (shown beside its id). */
  tokenLabel?: string | null;
}

const NAV: Array<{ href: string; label: string; role?: "operator" | "admin" }> = [
  { href: "/ui", label: "Overview" },
  { href: "/ui/borrows", label: "Borrows" },
  { href: "/ui/allocations", label: "Allocations" },
  { href: "/ui/audit", label: "Audit", role: "operator" },
  { href: "/ui/tokens", label: "Tokens", role: "admin" },
];

export function shell(o: { title: string; head?: Html; body: Html }): Html {
  return html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${o.title} · berth</title><link rel="icon" href="data:,">
<link rel="stylesheet" href="${assetUrl("/ui/assets/ui.css")}"><link rel="stylesheet" href="${assetUrl("/ui/assets/uplot.css")}">
<script src="${assetUrl("/ui/assets/htmx.js")}" defer></script>
<script src="${assetUrl("/ui/assets/uplot.js")}" defer></script><script src="${assetUrl("/ui/assets/ui.js")}" defer></script>
${o.head}</head><body>${o.body}</body></html>`;
}

/**
 * A signed-in page. `live` is the page's own URL: its `?part=live` answer is
 * the inner HTML of the live region, re-fetched on every `changed` event and
 * morphed into place (not replaced), so the element that has the keyboard
 * focus keeps it across refreshes.
 * `mark` is the change mark the page was rendered at, so the stream reports
 * a change that happened between the render and the stream's start.
 */
export function page(v: View, o: { title: string; current: string; live: string; mark: string; body: Html; notice?: string }): Html {
  return shell({
    title: o.title,
    body: html`${header(v, o.current)}
<main id="main" tabindex="-1"><h1>${o.title}</h1>${o.notice ? html`<p class="notice done" role="status">${o.notice}</p>` : ""}
<form id="ui-action" method="post" action="/ui" hidden><input type="hidden" name="csrf" value="${v.csrf}"><input type="hidden" name="back" value="${v.here}"></form>
<div id="outage" class="notice error" role="status" aria-live="polite" hidden></div>
<div id="events" hidden data-stream="/ui/events?since=${o.mark}" data-probe="${withPart(o.live)}"></div>
<div id="live" hx-get="${withPart(o.live)}" hx-trigger="changed from:#events" hx-swap="innerMorph">${o.body}</div>
</main>`,
  });
}

/** The navigation and the signed-in line with its sign-out form (every signed-in page, error pages too). */
export function header(v: View, current: string): Html {
  const p = v.principal;
  return html`<a class="skip" href="#main">Skip to content</a>
<header><nav aria-label="Main">${NAV.filter((n) => !n.role || allows(p, n.role)).map(
    (n) => html`<a href="${n.href}"${n.href === current ? html` aria-current="page"` : ""}>${n.label}</a>`,
  )}</nav>
<form method="post" action="/ui/sign-out"><span class="who">org <b>${p.org}</b> · role <b>${p.role}</b> · ${v.tokenLabel ? html`token <b>${v.tokenLabel}</b> ` : "token "}<code>${p.tokenId}</code></span>
<input type="hidden" name="csrf" value="${v.csrf}"><button type="submit">Sign out</button></form></header>`;
}

/** A refusal (403, 404…) of a signed-in page: the navigation stays, so the operator can go on from it. */
export function errorPage(v: View, status: number, message: string): Html {
  return shell({
    title: `Error ${status}`,
    body: html`${header(v, "")}<main id="main" tabindex="-1"><h1>Error ${status}</h1><p class="notice error" role="alert">${message}</p>
<p><a href="/ui">Back to the overview</a></p></main>`,
  });
}

function withPart(url: string): string {
  return url + (url.includes("?") ? "&" : "?") + "part=live";
}

export interface Segment {
  label: string;
  n: number;
  cls: "ready" | "lent" | "cleanup" | "other" | "used";
}

/**
 * A stacked bar of `segments` against `max` (with an optional tick at
 * `min`), followed by the same figures in text, so it reads without colour.
 */
export function bar(segments: Segment[], max: number, o: { min?: number; text?: string; label: string }): Html {
  const total = segments.reduce((a, s) => a + s.n, 0);
  const scale = Math.max(max, total, 1);
  let x = 0;
  const rects = segments.map((s) => {
    const w = (s.n / scale) * 100;
    const r = html`<rect class="seg-${s.cls}" x="${x.toFixed(2)}%" y="0" width="${w.toFixed(2)}%" height="100%"></rect>`;
    x += w;
    return r;
  });
  const tick = o.min !== undefined && o.min > 0 ? html`<line class="mark" x1="${((o.min / scale) * 100).toFixed(2)}%" x2="${((o.min / scale) * 100).toFixed(2)}%" y1="0" y2="100%"></line>` : "";
  const text = o.text ?? segments.map((s) => `${s.label} ${s.n}`).join(" · ") + ` / ${max}`;
  return html`<span class="bar"><svg role="img" aria-label="${o.label}: ${text}" preserveAspectRatio="none"><rect class="bg" x="0" y="0" width="100%" height="100%"></rect>${rects}${tick}</svg><span class="txt">${text}</span></span>`;
}

/** Memory as the CLI shows it: MiB → GiB, at most one decimal. */
export function gib(mib: number): number {
  return Math.round((mib / 1024) * 10) / 10;
}

/** One capacity dimension: used of total, in text too. */
export function capacity(label: string, used: number, total: number, unit = ""): Html {
  return bar([{ label, n: used, cls: "used" }], total, { label, text: `${used}${unit} / ${total}${unit} ${label}` });
}

export function ago(now: number, at: number | null): string {
  if (at === null) return "—";
  return duration(Math.max(0, now - at));
}

/** A token by its label (its id beside it); the id alone where it has none. */
export function tokenName(id: string, labels: ReadonlyMap<string, string | null>): Html {
  const label = labels.get(id);
  return label ? html`${label} <code class="muted">${id}</code>` : html`<code>${id}</code>`;
}

/** A borrow id as a link to its row on the Borrows page. */
export function lentTo(id: string | null): Html {
  return id === null ? html`—` : html`<a href="/ui/borrows#${id}">${id}</a>`;
}

/** A time since `at` that keeps counting in the browser (the script updates every `data-since` each second). */
export function since(now: number, at: number | null): Html {
  return at === null ? html`—` : html`<span data-since="${at}">${ago(now, at)}</span>`;
}

export function duration(ms: number): string {
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${m % 60}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

export function iso(at: number | null): string {
  return at === null ? "—" : new Date(at).toISOString().replace(".000Z", "Z");
}

/** A hard deadline: the time itself, and the time left (counted down in the browser). */
export function deadline(now: number, at: number): Html {
  const left = at - now;
  return html`<time datetime="${iso(at)}">${iso(at)}</time> <span data-deadline="${at}"${left <= 0 ? html` class="expired"` : ""}>${left <= 0 ? "expired" : duration(left) + " left"}</span>`;
}

/**
 * A confirmed action: a button posting the page's one action form (in the
 * shell, outside the live region: it holds the session's CSRF token and the
 * way back) to `action`. One form per page, not one per row, keeps a page of
 * 1,000 machines small.
 */
export function action(o: { action: string; label: string; confirm: string }): Html {
  return html`<button form="ui-action" formaction="${o.action}" data-confirm="${o.confirm}">${o.label}</button>`;
}

/**
 * An action with fields of its own (a checkbox): a form of its own, with the
 * CSRF token. `confirmChecked` is the confirmation asked instead when its
 * checkbox is ticked.
 */
export function actionForm(v: View, o: { action: string; label: string; confirm: string; confirmChecked?: string; extra: Html }): Html {
  return html`<form class="inline" method="post" action="${o.action}" data-confirm="${o.confirm}"${o.confirmChecked ? html` data-confirm-checked="${o.confirmChecked}"` : ""}><input type="hidden" name="csrf" value="${v.csrf}"><input type="hidden" name="back" value="${v.here}">${o.extra}<button type="submit" class="danger">${o.label}</button></form>`;
}

/** Machine states grouped as capacity is counted (src/coordinator/actions/capacity.ts). */
export function stateClass(state: string): Segment["cls"] {
  if (state === "ready") return "ready";
  if (state === "reserved" || state === "installing" || state === "busy") return "lent";
  if (state === "revoking" || state === "fencing" || state === "scrubbing") return "cleanup";
  return "other";
}
