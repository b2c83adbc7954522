// The size of an elastic job over time: a step chart of its GPUs, from the events that carry a
// size (the page's first data, then GET /api/jobs/<id>/ every few seconds while the job is active).
(function () {
  "use strict";
  const card = document.getElementById("size-card");
  const head = document.getElementById("job");
  if (!card || !head) return;
  const box = document.getElementById("size-chart");
  const jobId = head.dataset.jobId;
  const ACTIVE = new Set(["QUEUED", "LAUNCHING", "RUNNING"]);
  let plot = null;

  function data(history, state) {
    const xs = [], ys = [];
    for (const [ts, gpus] of history) {
      xs.push(Date.parse(ts) / 1000);
      ys.push(gpus);
    }
    if (xs.length && ACTIVE.has(state)) {          // the last size holds until now
      xs.push(Date.now() / 1000);
      ys.push(ys[ys.length - 1]);
    }
    return [xs, ys];
  }

  function draw(history, state) {
    const points = data(history, state);
    box.dataset.sizes = points[1].join(",");       // what the chart shows, for scripts and tests
    if (plot) {
      plot.setData(points);
      return;
    }
    plot = new uPlot({
      width: Math.max(box.clientWidth, 200),
      height: 160,
      scales: {y: {range: (u, min, max) => [0, Math.max(max, 1) + 1]}},
      axes: [{}, {label: "GPUs", size: 50, incrs: [1, 2, 4, 8, 16, 32, 64, 128]}],
      series: [{}, {label: "GPUs", stroke: "#2563eb", width: 2, paths: uPlot.paths.stepped({align: 1})}],
    }, points, box);
    box.uplot = plot;
    new ResizeObserver(() => {
      const w = Math.max(box.clientWidth, 200);
      if (w !== plot.width) plot.setSize({width: w, height: plot.height});
    }).observe(box);
  }

  let state = head.dataset.state;
  draw(JSON.parse(document.getElementById("size-history").textContent), state);

  async function poll() {
    try {
      const response = await fetch(`/api/jobs/${jobId}/`, {headers: {Accept: "application/json"}});
      if (response.ok) {
        const job = await response.json();
        state = job.state;
        draw(job.events.filter((e) => e.gpus !== null && e.gpus !== undefined).map((e) => [e.ts, e.gpus]), state);
        const size = document.getElementById("job-size");
        if (size && job.size) size.textContent = job.size;
      }
    } catch (e) { /* the next poll tries again */ }
    if (ACTIVE.has(state)) setTimeout(poll, 3000);
  }
  if (ACTIVE.has(state)) setTimeout(poll, 3000);
})();
