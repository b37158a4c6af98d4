/**
 * The dashboard's own browser script (served as /ui/assets/ui.js): hard
 * deadlines counting down, ages ("Age", "In state") counting up, confirmation of every action form, uPlot charts
 * drawn from the JSON a page embeds (again after each live refresh), and the
 * live stream.
 *
 * The live stream (`#events`): an EventSource on `/ui/events`; `changed`
 * refreshes the live region (htmx, `changed from:#events`), `signed-out`
 * (sent only when the session has really ended) goes to the sign-in form.
 * When the stream breaks (the coordinator stopped, crashed or is out of
 * reach; or no ping for 12 s) the page stays where it is: a banner says
 * since when the coordinator is unreachable and from when the data is, the
 * live region is greyed (`.stale`), and the page probes its own live region
 * after 0.25 and 0.5 s and then every second (so a coordinator that is back
 * is seen within about a second). A probe answered 401 (or redirected
 * to the sign-in form) means the session is gone: then, and only then, the
 * page goes to the sign-in form. Any other answer below 500 reopens the
 * stream; once it is open, the banner goes and the live region is refreshed
 * in place.
 */
export const UI_JS = String.raw`(function () {
  "use strict";
  function left(ms) {
    if (ms <= 0) return "expired";
    var s = Math.floor(ms / 1000), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return (h ? h + "h " : "") + (h || m ? m + "m " : "") + r + "s left";
  }
  /** The same form as the server's duration(): 42s, 3m 5s, 4h 10m, 3d 2h. */
  function dur(ms) {
    var s = Math.floor(Math.max(0, ms) / 1000);
    if (s < 60) return s + "s";
    var m = Math.floor(s / 60);
    if (m < 60) return m + "m " + (s % 60) + "s";
    var h = Math.floor(m / 60);
    if (h < 48) return h + "h " + (m % 60) + "m";
    return Math.floor(h / 24) + "d " + (h % 24) + "h";
  }
  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-since]").forEach(function (el) {
      el.textContent = dur(now - Number(el.getAttribute("data-since")));
    });
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var ms = Number(el.getAttribute("data-deadline")) - now;
      el.textContent = left(ms);
      el.classList.toggle("expired", ms <= 0);
    });
  }
  function charts(root) {
    if (!window.uPlot) return;
    root.querySelectorAll("script[data-chart]").forEach(function (s) {
      var box = document.getElementById(s.getAttribute("data-chart"));
      if (!box || box.getAttribute("data-drawn")) return;
      var d = JSON.parse(s.textContent);
      box.setAttribute("data-drawn", "1");
      var xs = d.labels.map(function (_, i) { return i; });
      var width = Math.max(240, Math.min(640, box.clientWidth || 480));
      // Narrow: every other bucket is labelled, so the labels do not overlap (the table under "Figures" has them all).
      var step = width < 520 ? 2 : 1;
      new window.uPlot({
        width: width,
        height: 200,
        scales: { x: { time: false, range: [-0.5, xs.length - 0.5] }, y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
        legend: { show: false },
        cursor: { show: false },
        axes: [
          { splits: function () { return xs; }, values: function () { return d.labels.map(function (l, i) { return i % step ? "" : l; }); }, label: d.xLabel, size: 48 },
          { label: "borrows" }
        ],
        series: [{}, { label: "borrows", paths: window.uPlot.paths.bars({ size: [0.8] }), points: { show: false }, fill: "#4a6fa5", stroke: "#1d3557" }]
      }, [xs, d.counts], box);
    });
  }
  /**
   * The history charts: time on x (the browser's local time), drawn from the
   * page's JSON; each uPlot instance is kept in window.berthCharts by its
   * element's id (its data is what the page shows).
   */
  window.berthCharts = window.berthCharts || {};
  function history(root) {
    if (!window.uPlot) return;
    root.querySelectorAll("script[data-history]").forEach(function (s) {
      var d = JSON.parse(s.textContent);
      var defs = [
        { id: "history-borrows", y: "borrows", series: [["served", d.started, "#1d3557"], ["returned", d.returned, "#2a9d8f"]], bars: true },
        { id: "history-latency", y: "ms", series: [["p50", d.p50, "#1d3557"], ["p95", d.p95, "#e76f51"]] },
        { id: "history-machines", y: "machines", series: [["ready", d.ready, "#2a9d8f"], ["lent", d.lent, "#b08a1e"], ["cleanup", d.cleanup, "#8d99ae"], ["quarantined", d.quarantined, "#9b2226"]] }
      ];
      draw(d, defs);
    });
    // Labelled series: one line per label (reasons, hosts, owners), drawn from their own JSON.
    root.querySelectorAll("script[data-series]").forEach(function (s) {
      var d = JSON.parse(s.textContent);
      var palette = ["#1d3557", "#e76f51", "#2a9d8f", "#b08a1e", "#9b2226", "#8d99ae", "#6a4c93", "#457b9d"];
      draw(d, d.charts.map(function (c) {
        return { id: c.id, y: c.y, series: c.series.map(function (x, i) { return [x[0], x[1], palette[i % palette.length]]; }) };
      }));
    });
  }
  function draw(d, defs) {
    defs.forEach(function (c) {
      var box = document.getElementById(c.id);
      if (!box || box.getAttribute("data-drawn")) return;
      box.setAttribute("data-drawn", "1");
      box.textContent = "";
      var width = Math.max(240, Math.min(640, box.clientWidth || 480));
      var series = [{}].concat(c.series.map(function (x, i) {
        var o = { label: x[0], stroke: x[2], width: 2, spanGaps: true, points: { show: !c.bars, size: 5, fill: x[2] } };
        // Bars side by side in their bucket (served left, returned right).
        if (c.bars) { o.paths = window.uPlot.paths.bars({ size: [0.45, 8], align: i ? 1 : -1 }); o.fill = x[2]; }
        return o;
      }));
      var u = new window.uPlot({
        width: width,
        height: 180,
        scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, Math.max(1, max || 0)]; } } },
        cursor: { drag: { x: false, y: false } },
        axes: [{ space: 70 }, { label: c.y, size: 50 }],
        series: series
      }, [d.x].concat(c.series.map(function (x) { return x[1]; })), box);
      window.berthCharts[c.id] = u;
    });
  }
  /** Each cell carries its column's heading, shown before it where tables collapse to cards (narrow windows). */
  function labels(root) {
    root.querySelectorAll("table").forEach(function (t) {
      var heads = Array.prototype.map.call(t.querySelectorAll("thead th"), function (th) { return th.textContent.trim(); });
      if (!heads.length) return;
      t.querySelectorAll("tbody tr").forEach(function (tr) {
        Array.prototype.forEach.call(tr.children, function (td, i) { if (heads[i] && !td.hasAttribute("data-label")) td.setAttribute("data-label", heads[i]); });
      });
    });
  }
  document.addEventListener("submit", function (e) {
    var b = e.submitter, f = e.target;
    var checked = f && f.getAttribute && f.getAttribute("data-confirm-checked") && f.querySelector("input[type=checkbox]:checked");
    var msg = (b && b.getAttribute("data-confirm")) || (f && f.getAttribute && f.getAttribute(checked ? "data-confirm-checked" : "data-confirm"));
    if (msg && !window.confirm(msg)) e.preventDefault();
  }, true);
  function hms(t) {
    var d = new Date(t);
    return [d.getHours(), d.getMinutes(), d.getSeconds()].map(function (n) { return (n < 10 ? "0" : "") + n; }).join(":");
  }
  var live = { es: null, down: 0, fresh: Date.now(), delay: 250, retry: 0, heard: 0 };
  function stream() { return document.getElementById("events"); }
  function refresh() { var el = stream(); if (el) el.dispatchEvent(new CustomEvent("changed")); }
  function connect() {
    var el = stream();
    if (!el) return;
    var es = new EventSource(el.getAttribute("data-stream"));
    live.es = es;
    live.heard = Date.now();
    es.addEventListener("open", function () {
      live.heard = Date.now();
      live.delay = 250;
      if (live.down) restored();
    });
    es.addEventListener("ping", function () { live.heard = Date.now(); });
    es.addEventListener("changed", function (e) {
      live.heard = Date.now();
      // The next stream starts from what this page has seen.
      el.setAttribute("data-stream", el.getAttribute("data-stream").replace(/since=[^&]*/, "since=" + encodeURIComponent(e.data)));
      refresh();
    });
    es.addEventListener("signed-out", function () { es.close(); window.location.assign("/ui/sign-in"); });
    es.onerror = function () { broken(es); };
  }
  function broken(es) {
    es.close();
    if (live.es !== es) return;
    live.es = null;
    lost();
  }
  function lost() {
    if (!live.down) {
      live.down = Date.now();
      var b = document.getElementById("outage");
      if (b) {
        b.textContent = "Coordinator unreachable since " + hms(live.down) + " \u2014 showing data from " + hms(live.fresh) + ". Reconnecting\u2026";
        b.hidden = false;
      }
      var r = document.getElementById("live");
      if (r) { r.classList.add("stale"); r.setAttribute("aria-busy", "true"); }
    }
    clearTimeout(live.retry);
    live.retry = setTimeout(probe, live.delay);
    live.delay = Math.min(1000, live.delay * 2);
  }
  function probe() {
    var el = stream();
    fetch(el.getAttribute("data-probe"), { credentials: "same-origin", cache: "no-store", redirect: "manual" }).then(function (r) {
      if (r.status === 401 || r.type === "opaqueredirect") window.location.assign("/ui/sign-in");
      else if (r.status >= 500 || r.status === 0) lost();
      else connect();
    }, lost);
  }
  function restored() {
    live.down = 0;
    var b = document.getElementById("outage");
    if (b) b.hidden = true;
    var r = document.getElementById("live");
    if (r) { r.classList.remove("stale"); r.removeAttribute("aria-busy"); }
    refresh();
  }
  setInterval(function () { if (live.es && Date.now() - live.heard > 12000) broken(live.es); }, 2000);
  document.addEventListener("htmx:after:swap", function () { live.fresh = Date.now(); labels(document); charts(document); history(document); tick(); });
  document.addEventListener("DOMContentLoaded", function () { labels(document); charts(document); history(document); tick(); setInterval(tick, 1000); connect(); });
})();
`;
