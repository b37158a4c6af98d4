/**
 * The dashboard's stylesheet (served as /ui/assets/ui.css): plain, high
 * contrast, visible focus; every bar has its numbers in text beside it. At
 * 700 px and narrower every table collapses to one card per row, each cell
 * labelled with its column's heading (client/script.ts copies the headings
 * into `data-label`).
 */
export const UI_CSS = String.raw`
:root { --fg: #111; --bg: #fff; --muted: #555; --line: #ccc; --ready: #2a9d8f; --lent: #e9c46a; --cleanup: #8d99ae; --other: #e76f51; --used: #4a6fa5; --free: #eee; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
a { color: #1d3557; }
a:focus, button:focus, input:focus, summary:focus { outline: 3px solid #f4a261; outline-offset: 2px; }
.skip { position: absolute; left: -9999px; } .skip:focus { left: 8px; top: 8px; background: #fff; padding: 4px; }
header { display: flex; flex-wrap: wrap; gap: 12px; align-items: center; justify-content: space-between; padding: 8px 16px; border-bottom: 2px solid var(--fg); }
header nav { display: flex; flex-wrap: wrap; gap: 4px 14px; } header nav a { font-weight: 600; text-decoration: none; } header nav a[aria-current=page] { text-decoration: underline; }
header form { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin: 0; min-width: 0; } .who { color: var(--muted); font-size: 13px; overflow-wrap: anywhere; }
.filters { display: flex; flex-wrap: wrap; gap: 8px 16px; align-items: center; } .filters input, .filters select { font: inherit; max-width: 100%; }
main { padding: 12px 16px 40px; max-width: 1400px; }
h1 { font-size: 22px; margin: 8px 0 12px; } h2 { font-size: 18px; margin: 24px 0 8px; border-bottom: 1px solid var(--line); }
table { border-collapse: collapse; width: 100%; margin: 6px 0; } th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-size: 13px; color: var(--muted); } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.bar { display: flex; align-items: center; gap: 8px; min-width: 260px; } .bar svg { flex: 0 0 160px; height: 14px; border: 1px solid var(--fg); }
.bar .txt { font-size: 13px; font-variant-numeric: tabular-nums; white-space: nowrap; }
.seg-ready { fill: var(--ready); } .seg-lent { fill: var(--lent); } .seg-cleanup { fill: var(--cleanup); } .seg-other { fill: var(--other); } .seg-used { fill: var(--used); } .bg { fill: var(--free); } .mark { stroke: var(--fg); stroke-width: 2; }
.state { font-family: ui-monospace, monospace; font-size: 13px; } .muted { color: var(--muted); } .expired { font-weight: 700; text-decoration: line-through; }
button { font: inherit; padding: 2px 10px; border: 1px solid var(--fg); background: #f5f5f5; cursor: pointer; } button.danger, button[formaction] { border-color: #9b2226; color: #9b2226; }
form.inline { display: inline; margin: 0; } .actions { margin: 8px 0; }
.notice { border: 2px solid var(--fg); padding: 8px 12px; margin: 8px 0; } .error { border-color: #9b2226; }
.charts { display: flex; flex-wrap: wrap; gap: 24px; } .chart { min-width: 320px; flex: 1 1 420px; }
.signin { max-width: 460px; margin: 60px auto; } .signin input[type=password] { width: 100%; padding: 6px; font: inherit; }
.stale { opacity: 0.5; filter: grayscale(1); } #outage { position: sticky; top: 0; background: #fff4f0; z-index: 2; font-weight: 600; }
td { overflow-wrap: anywhere; }
@media (max-width: 700px) {
  header { padding: 6px 10px; } main { padding: 8px 10px 32px; } header nav { gap: 4px 10px; }
  table:not(.u-legend), table:not(.u-legend) > * > tr, table:not(.u-legend) > * > tr > th, table:not(.u-legend) > * > tr > td,
  table:not(.u-legend) > thead, table:not(.u-legend) > tbody { display: block; width: 100%; } table:not(.u-legend) > thead { position: absolute; left: -9999px; }
  table:not(.u-legend) > * > tr { border: 1px solid var(--line); margin: 8px 0; padding: 4px 0; } table:not(.u-legend) > * > tr > td { border: 0; padding: 2px 8px; text-align: left; }
  td.num { text-align: left; } td[data-label]::before { content: attr(data-label) ": "; color: var(--muted); font-size: 13px; }
  .bar { min-width: 0; flex-wrap: wrap; } .bar svg { flex: 0 1 160px; } .bar .txt { white-space: normal; }
  .chart { min-width: 0; flex-basis: 100%; } .charts { gap: 12px; }
}
code { font-family: ui-monospace, monospace; font-size: 13px; }
`;
