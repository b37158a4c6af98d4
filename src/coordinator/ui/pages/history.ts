/**
 * A pool's history over a window (15 min, 1 h or 24 h): borrows served and
 * returned per bucket, borrow latency p50 and p95, and machines ready / lent
 * / cleanup / quarantined, drawn by uPlot from the JSON the page embeds
 * (every figure is in the JSON and in the summary text, nothing only in
 * pixels). Buckets are 10 s (stored); the 24 h window shows them merged
 * into minutes.
 *
 * Labelled series (`src/store/history-series.ts`) are drawn the same way,
 * one line per label: a pool's provisions given up and quarantines by reason
 * class (on the pool page), the organisation's allocation use per host and
 * per owner (on the Allocations page, to operators).
 */
import type { Principal } from "../../auth.js";
import type { Metrics } from "../../metrics.js";
import type { Tx } from "../../../store/store.js";
import { HISTORY_BUCKET_MS, readHistory, type HistoryRow } from "../../../store/history.js";
import { mergeSeries, readSeries, type SeriesName, type SeriesRow } from "../../../store/history-series.js";
import { html, jsonScript, type Html } from "../html.js";

export const WINDOWS = { "15m": 15 * 60_000, "1h": 3_600_000, "24h": 24 * 3_600_000 } as const;
export type Window = keyof typeof WINDOWS;

export function windowOf(raw: string | null): Window {
  return raw !== null && Object.hasOwn(WINDOWS, raw) ? (raw as Window) : "1h";
}

export interface HistoryData {
  window: Window;
  step: number;
  from: number;
  to: number;
  bounds: readonly number[];
  rows: HistoryRow[];
  /** The pool's provisions given up and quarantines by reason class. */
  series: SeriesRow[];
}

/** A window's time axis: its step (10 s, or a minute for 24 h) and first and last bucket. */
export function axisOf(window: Window, now: number): { step: number; from: number; to: number } {
  const step = window === "24h" ? 60_000 : HISTORY_BUCKET_MS;
  const to = now - (now % step);
  return { step, from: to - WINDOWS[window] + step, to };
}

/** A scope's labelled series over the window, this process's counts not written yet added, merged into the window's step. */
export async function loadSeries(tx: Tx, metrics: Metrics, org: string, scope: string, series: readonly SeriesName[], axis: { step: number; from: number }): Promise<SeriesRow[]> {
  const stored = await readSeries(tx, org, scope, series, axis.from);
  const pending = scope === "" ? [] : metrics.history.pendingSeries(org, scope).filter((r) => r.at >= axis.from && series.includes(r.series));
  return mergeSeries([...stored, ...pending].map((r) => ({ ...r, at: r.at - (r.at % axis.step) })));
}

export async function loadHistory(tx: Tx, metrics: Metrics, p: Principal, pool: string, window: Window, now: number): Promise<HistoryData> {
  const { step, from, to } = axisOf(window, now);
  const stored = await readHistory(tx, p.org, pool, from);
  // This process's buckets not written yet: their counts are added, their state counts are not known yet.
  const byAt = new Map<number, HistoryRow>();
  for (const r of [...stored, ...metrics.history.pending(p.org, pool).filter((r) => r.at >= from)]) {
    const at = r.at - (r.at % step);
    const m = byAt.get(at);
    if (!m) byAt.set(at, { ...r, at, latency: [...r.latency] });
    else {
      m.started += r.started;
      m.returned += r.returned;
      m.latency = m.latency.map((n, i) => n + (r.latency[i] ?? 0));
      // The latest bucket's state counts stand for the merged one.
      if (r.ready !== null && r.at >= m.at) Object.assign(m, { ready: r.ready, lent: r.lent, cleanup: r.cleanup, quarantined: r.quarantined });
    }
  }
  const series = await loadSeries(tx, metrics, p.org, pool, ["provision", "quarantine"], { step, from });
  return { window, step, from, to, bounds: metrics.history.latencyBounds, rows: [...byAt.values()].sort((a, b) => a.at - b.at), series };
}

export interface LabelledChart {
  id: string;
  caption: string;
  /** The y axis' unit. */
  y: string;
  series: SeriesName;
  /** A label as shown (e.g. an owner's token label for its id). */
  name?: (label: string) => string;
  /** What is said when the window has nothing of it. */
  none: string;
}

/**
 * Labelled charts over a window: the JSON the browser draws (x, then per
 * chart one column per label, 0 where a bucket has none) and, per chart, the
 * window's total (counted series) or largest value (use series) per label as
 * text.
 */
export function renderLabelled(axis: { step: number; from: number; to: number }, rows: readonly SeriesRow[], charts: readonly LabelledChart[], key: string): Html {
  const xs: number[] = [];
  for (let at = axis.from; at <= axis.to; at += axis.step) xs.push(at / 1000);
  const index = new Map(xs.map((x, i) => [x * 1000, i]));
  const out = charts.map((c) => {
    const cols = new Map<string, number[]>();
    for (const r of rows) {
      if (r.series !== c.series) continue;
      const i = index.get(r.at);
      if (i === undefined) continue;
      let col = cols.get(r.label);
      if (!col) cols.set(r.label, (col = new Array<number>(xs.length).fill(0)));
      col[i] = r.value;
    }
    const labels = [...cols.keys()].sort();
    return { c, labels, cols: labels.map((l) => cols.get(l)!) };
  });
  const counted = (s: SeriesName) => s === "provision" || s === "quarantine";
  const figure = (o: (typeof out)[number]) => {
    const name = o.c.name ?? ((l: string) => l);
    const text = o.labels.map((l, i) => `${name(l)} ${counted(o.c.series) ? o.cols[i]!.reduce((a, n) => a + n, 0) : Math.max(...o.cols[i]!)}`).join(", ");
    return html`<figure class="chart"><figcaption>${o.c.caption}</figcaption>${o.labels.length === 0 ? html`<p class="muted" data-none="${o.c.id}">${o.c.none}</p>` : html`<div id="${o.c.id}" class="plot"></div><p class="muted" data-figures="${o.c.id}">${counted(o.c.series) ? "In the window" : "Largest in the window"}: ${text}</p>`}</figure>`;
  };
  const json = { x: xs, charts: out.filter((o) => o.labels.length > 0).map((o) => ({ id: o.c.id, y: o.c.y, series: o.labels.map((l, i) => [(o.c.name ?? ((s: string) => s))(l), o.cols[i]]) })) };
  return html`<script type="application/json" data-series="${key}">${jsonScript(json)}</script>
<div class="charts">${out.map(figure)}</div>`;

}

/** The bound (ms) below which a share `q` of a bucket's borrows fall; null with none (the last bucket has no bound: the largest bound is given). */
function quantileMs(bounds: readonly number[], counts: number[], q: number): number | null {
  const total = counts.reduce((a, n) => a + n, 0);
  if (total === 0) return null;
  let seen = 0;
  for (let i = 0; i < counts.length; i++) {
    seen += counts[i]!;
    if (seen >= q * total) return (bounds[Math.min(i, bounds.length - 1)]!) * 1000;
  }
  return null;
}

export function renderHistory(d: HistoryData, here: string): Html {
  const xs: number[] = [];
  const col = { started: [] as number[], returned: [] as number[], p50: [] as Array<number | null>, p95: [] as Array<number | null>, ready: [] as Array<number | null>, lent: [] as Array<number | null>, cleanup: [] as Array<number | null>, quarantined: [] as Array<number | null> };
  const byAt = new Map(d.rows.map((r) => [r.at, r]));
  const all = new Array<number>(d.bounds.length + 1).fill(0);
  let started = 0;
  let returned = 0;
  for (let at = d.from; at <= d.to; at += d.step) {
    const r = byAt.get(at);
    xs.push(at / 1000);
    col.started.push(r?.started ?? 0);
    col.returned.push(r?.returned ?? 0);
    col.p50.push(r ? quantileMs(d.bounds, r.latency, 0.5) : null);
    col.p95.push(r ? quantileMs(d.bounds, r.latency, 0.95) : null);
    for (const k of ["ready", "lent", "cleanup", "quarantined"] as const) col[k].push(r?.[k] ?? null);
    if (r) {
      started += r.started;
      returned += r.returned;
      r.latency.forEach((n, i) => (all[i]! += n));
    }
  }
  const p95 = quantileMs(d.bounds, all, 0.95);
  const busiest = d.rows.filter((r) => r.started > 0 || r.returned > 0).slice(-20).reverse();
  const win = (w: string) => html`<a href="${here}?window=${w}"${w === d.window ? html` aria-current="true"` : ""}>${w}</a>`;
  return html`<h2 id="history">History</h2>
<p class="windows">Window: ${win("15m")} · ${win("1h")} · ${win("24h")} <span class="muted">(${d.step / 1000}-second buckets; kept 24 h)</span></p>
<p id="history-summary">${started} borrows served and ${returned} returned in the last ${d.window}${p95 !== null ? `; borrow latency p95 ≤ ${p95} ms` : ""}.</p>
<script type="application/json" data-history="history">${jsonScript({ x: xs, step: d.step / 1000, ...col })}</script>
<div class="charts"><figure class="chart"><figcaption>Borrows per bucket</figcaption><div id="history-borrows" class="plot"></div></figure>
<figure class="chart"><figcaption>Borrow latency, ms (bucket bounds)</figcaption><div id="history-latency" class="plot"></div></figure>
<figure class="chart"><figcaption>Machines by state</figcaption><div id="history-machines" class="plot"></div></figure></div>
${renderLabelled(d, d.series, [
    { id: "history-provision", caption: "Provisioning: given up, breaker opened", y: "events", series: "provision", none: "No provision given up in this window." },
    { id: "history-quarantine", caption: "Quarantines by reason", y: "machines", series: "quarantine", none: "No machine quarantined in this window." },
  ], "pool")}
<details><summary>Figures (latest buckets with borrows)</summary>${busiest.length === 0 ? html`<p class="muted">No borrow in this window.</p>` : html`<table><thead><tr><th>Bucket (UTC)</th><th class="num">Served</th><th class="num">Returned</th><th class="num">p50 ms</th><th class="num">p95 ms</th></tr></thead><tbody>${busiest.map(
    (r) => html`<tr><td>${new Date(r.at).toISOString().slice(11, 19)}</td><td class="num">${r.started}</td><td class="num">${r.returned}</td><td class="num">${quantileMs(d.bounds, r.latency, 0.5) ?? "—"}</td><td class="num">${quantileMs(d.bounds, r.latency, 0.95) ?? "—"}</td></tr>`,
  )}</tbody></table>`}</details>`;
}
