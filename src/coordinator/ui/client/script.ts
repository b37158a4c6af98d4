/**
 * The dashboard's own browser script (served as /ui/assets/ui.js): hard
 * deadlines counting down, confirmation of every action form, uPlot charts
 * drawn from the JSON a page embeds (again after each live refresh), and the
 * way back to the sign-in page when the server ends the session.
 */
export const UI_JS = String.raw`(function () {
  "use strict";
  function left(ms) {
    if (ms <= 0) return "expired";
    var s = Math.floor(ms / 1000), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return (h ? h + "h " : "") + (h || m ? m + "m " : "") + r + "s left";
  }
  function tick() {
    var now = Date.now();
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
      new window.uPlot({
        width: Math.max(300, Math.min(640, box.clientWidth || 480)),
        height: 200,
        scales: { x: { time: false, range: [-0.5, xs.length - 0.5] }, y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
        legend: { show: false },
        cursor: { show: false },
        axes: [
          { splits: function () { return xs; }, values: function () { return d.labels; }, label: d.xLabel, size: 48 },
          { label: "borrows" }
        ],
        series: [{}, { label: "borrows", paths: window.uPlot.paths.bars({ size: [0.8] }), points: { show: false }, fill: "#4a6fa5", stroke: "#1d3557" }]
      }, [xs, d.counts], box);
    });
  }
  document.addEventListener("submit", function (e) {
    var b = e.submitter, f = e.target;
    var msg = (b && b.getAttribute("data-confirm")) || (f && f.getAttribute && f.getAttribute("data-confirm"));
    if (msg && !window.confirm(msg)) e.preventDefault();
  }, true);
  document.addEventListener("signed-out", function () { window.location.assign("/ui/sign-in"); });
  document.addEventListener("htmx:after:swap", function () { charts(document); tick(); });
  document.addEventListener("DOMContentLoaded", function () { charts(document); tick(); setInterval(tick, 1000); });
})();
`;
