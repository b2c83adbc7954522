// The compare page: one chart per metric (charts.js, as on the job page: smoothing, log scale,
// zoom), with a line per job, the mean of its ranks at each step (the server's series).
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const series = JSON.parse($("compare-series").textContent);
  const labels = JSON.parse($("compare-labels").textContent);
  const charts = RingmasterCharts.create({
    card: $("charts-card"), box: $("charts"), numbers: $("chart-numbers"), controls: $("chart-controls"),
    ended: () => true, label: (job) => labels[job] || `job ${job}`,
  });
  for (const [name, perJob] of Object.entries(series)) {
    for (const [job, points] of Object.entries(perJob)) {
      for (const [step, value] of points) charts.add(name, {rank: job, step, value, seq: -1});
    }
  }
  charts.draw(true);
})();
