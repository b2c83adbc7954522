// Training curves on the job page (job.js feeds the points): one chart per metric, in name
// order, with integer steps on the x axis, the metric's name on the y axis, smoothing as
// TensorBoard does it (an exponential moving average, debiased; the raw line faint under the
// smoothed one), a log scale, each rank or the mean across ranks with its min–max band, cursors
// that move together, and a reset of the zoom. A metric with one value per rank (a summary such
// as total_img_per_sec, printed once at the end) is a row of numbers, not a dot on a chart.
// The controls are remembered in localStorage. Charts are uPlot (vendored).
(function () {
  "use strict";
  const COLORS = ["#2f5bd3", "#d3572f", "#1f8a4c", "#9b3dc8", "#b7791f", "#0f8fa8", "#c2352b", "#5b6b8c"];
  const OPTIONS_KEY = "ringmaster.charts.options";
  const SYNC_KEY = "ringmaster-training";
  const DEFAULTS = {smoothing: 0.6, log: false, mean: false};

  // TensorBoard's smoothing: an exponential moving average with weight w in [0, 1), divided by
  // 1 - w^n so the first values are not pulled towards zero. Gaps (null) stay gaps.
  function ema(values, weight) {
    let last = 0, count = 0;
    return values.map((value) => {
      if (value === null || value === undefined || !Number.isFinite(value)) return value === undefined ? null : value;
      if (!(weight > 0)) return value;
      count += 1;
      last = last * weight + (1 - weight) * value;
      return last / (1 - Math.pow(weight, count));
    });
  }

  // Steps are whole numbers: the x axis ticks only at integers, however far it is zoomed in.
  const STEP_INCRS = [1, 2, 5];
  for (let i = 1; i < 16; i++) STEP_INCRS.push(...[1, 2, 5].map((m) => m * 10 ** i));
  function stepTicks(u, splits) {
    return splits.map((v) => (Number.isInteger(v) ? v.toLocaleString("en-US").replace(/,/g, " ") : ""));
  }

  function byRank(a, b) {
    if (a === "launcher" || b === "launcher") return a === b ? 0 : (a === "launcher" ? 1 : -1);
    return Number(a) - Number(b);
  }

  const rankName = (rank) => (rank === "launcher" ? "launcher" : `rank ${rank}`);

  function loadOptions() {
    try {
      return {...DEFAULTS, ...(JSON.parse(localStorage.getItem(OPTIONS_KEY)) || {})};
    } catch (error) {
      return {...DEFAULTS};
    }
  }

  function fade(color, alpha) {
    const n = parseInt(color.slice(1), 16);
    return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
  }

  // The per-step rows of one metric: x (steps) and, per rank, the values (null where missing).
  function table(metric) {
    const ranks = [...metric.ranks.keys()].filter((r) => [...metric.ranks.get(r).keys()].some((s) => s !== null))
      .sort(byRank);
    const steps = [...new Set(ranks.flatMap((r) => [...metric.ranks.get(r).keys()]))]
      .filter((s) => s !== null).sort((a, b) => a - b);
    const columns = ranks.map((r) => {
      const values = metric.ranks.get(r);
      return steps.map((s) => (values.has(s) ? values.get(s) : null));
    });
    return {ranks, steps, columns};
  }

  function across(columns, steps, reduce) {
    return steps.map((_, i) => {
      const here = columns.map((c) => c[i]).filter((v) => v !== null);
      return here.length ? reduce(here) : null;
    });
  }

  // `label` names a series (a rank on the job page, a job on the compare page).
  function create({card, box, numbers, controls, ended, label = rankName}) {
    const metrics = new Map();    // name -> {ranks: Map(rank -> Map(step|null -> value)), points, chart}
    const options = loadOptions();
    const smoothing = controls.querySelector("#chart-smoothing");
    const smoothingShown = controls.querySelector("#chart-smoothing-value");
    const logBox = controls.querySelector("#chart-log"), meanBox = controls.querySelector("#chart-mean");
    smoothing.value = options.smoothing;
    smoothingShown.textContent = Number(options.smoothing).toFixed(2);
    logBox.checked = options.log;
    meanBox.checked = options.mean;

    function save() {
      options.smoothing = Number(smoothing.value);
      options.log = logBox.checked;
      options.mean = meanBox.checked;
      try {
        localStorage.setItem(OPTIONS_KEY, JSON.stringify(options));
      } catch (error) { /* the controls last for this page only */ }
    }

    function add(name, point) {
      let metric = metrics.get(name);
      if (!metric) {
        metric = {ranks: new Map(), points: 0, chart: null, dirty: true, stepless: true};
        metrics.set(name, metric);
      }
      const rank = point.rank === null || point.rank === undefined ? "launcher" : String(point.rank);
      if (!metric.ranks.has(rank)) metric.ranks.set(rank, new Map());
      metric.ranks.get(rank).set(point.step === undefined ? null : point.step, point.value);
      metric.points += 1;
      metric.dirty = true;
      // A point printed without a step is stored with the seq of its line as its step.
      metric.stepless = metric.stepless && (point.step === null || point.step === undefined || point.step === point.seq);
    }

    // One value per rank: once the job has ended, or while it runs when every rank printed it
    // without a step (each at its own line's seq; a point on the first step of a running job,
    // printed by one rank, or by every rank at one step, is the start of a curve).
    function isSummary(metric) {
      const series = [...metric.ranks.values()];
      if (!series.every((values) => values.size === 1)) return false;
      return ended() || (metric.stepless && series.length > 1);
    }

    function draw(all) {
      const names = [...metrics.keys()].sort();
      const summaries = names.filter((name) => isSummary(metrics.get(name)));
      const charted = names.filter((name) => !summaries.includes(name));
      showNumbers(summaries);
      for (const name of charted) {
        const metric = metrics.get(name);
        if (!metric.chart) metric.chart = makeBox(name);
        if (metric.dirty || all) drawChart(name, metric);
        metric.dirty = false;
      }
      for (const name of summaries) {                 // a metric that turned out to be a summary
        const metric = metrics.get(name);
        if (metric.chart) {
          if (metric.chart.plot) metric.chart.plot.destroy();
          if (metric.chart.resizer) metric.chart.resizer.disconnect();
          metric.chart.box.remove();
          metric.chart = null;
        }
      }
      box.append(...charted.map((name) => metrics.get(name).chart.box));   // always in name order
      box.hidden = !charted.length;
      controls.hidden = !charted.length;
      card.hidden = !names.length;
    }

    function makeBox(name) {
      const chartBox = document.createElement("div");
      chartBox.className = "chart";
      chartBox.dataset.metric = name;
      return {box: chartBox, plot: null, keys: ""};
    }

    function showNumbers(names) {
      numbers.hidden = !names.length;
      if (!names.length) return;
      const ranks = [...new Set(names.flatMap((name) => [...metrics.get(name).ranks.keys()]))].sort(byRank);
      const head = document.createElement("tr");
      head.append(cell("th", "metric"), ...ranks.map((r) => cell("th", label(r))));
      const body = names.map((name) => {
        const row = document.createElement("tr");
        row.dataset.metric = name;
        const values = metrics.get(name).ranks;
        row.append(cell("th", name), ...ranks.map((r) => {
          const series = values.get(r);
          const value = series ? [...series.values()].pop() : undefined;
          const td = cell("td", value === undefined ? "" : formatNumber(value));
          td.className = "num";
          td.dataset.rank = r;
          return td;
        }));
        return row;
      });
      const thead = document.createElement("thead"), tbody = document.createElement("tbody");
      thead.append(head);
      tbody.append(...body);
      numbers.querySelector("table").replaceChildren(thead, tbody);
    }

    function cell(tag, text) {
      const element = document.createElement(tag);
      element.textContent = text;
      return element;
    }

    function formatNumber(value) {
      return Math.abs(value) >= 1000 ? value.toLocaleString("en-US", {maximumFractionDigits: 1})
        : String(Number(value.toPrecision(4)));
    }

    function drawChart(name, metric) {
      const chart = metric.chart;
      const {ranks, steps, columns} = table(metric);
      const weight = Number(smoothing.value);
      const mean = meanBox.checked && ranks.length > 1;
      const positive = columns.every((c) => c.every((v) => v === null || v > 0));
      const log = logBox.checked && positive;
      let data, series, bands;
      if (mean) {
        const avg = across(columns, steps, (v) => v.reduce((a, b) => a + b, 0) / v.length);
        data = [steps, across(columns, steps, (v) => Math.min(...v)), across(columns, steps, (v) => Math.max(...v)),
          avg, ema(avg, weight)];
        series = [{label: "step"},
          {label: "min", stroke: fade(COLORS[0], 0.35), width: 1, spanGaps: true, points: {show: false}, aux: true},
          {label: "max", stroke: fade(COLORS[0], 0.35), width: 1, spanGaps: true, points: {show: false}, aux: true},
          {label: `mean of ${ranks.length} ranks (raw)`, stroke: fade(COLORS[0], 0.3), width: 1, spanGaps: true,
            points: {show: false}, aux: true},
          {label: `mean of ${ranks.length} ranks`, stroke: COLORS[0], width: 2, spanGaps: true,
            points: {show: steps.length < 2}}];
        bands = [{series: [2, 1], fill: fade(COLORS[0], 0.12)}];
      } else {
        data = [steps];
        series = [{label: "step"}];
        ranks.forEach((rank, i) => {
          const color = COLORS[i % COLORS.length];
          data.push(columns[i], ema(columns[i], weight));
          series.push(
            {label: `${label(rank)} (raw)`, stroke: fade(color, 0.3), width: 1, spanGaps: true, points: {show: false},
              aux: true},
            {label: label(rank), stroke: color, width: 2, spanGaps: true, points: {show: steps.length < 2}});
        });
        bands = [];
      }
      chart.box.dataset.points = metric.points;
      chart.box.dataset.mode = mean ? "mean" : "ranks";
      const keys = `${ranks.join(",")}|${mean}|${log}|${steps.length < 2}`;
      if (chart.plot && keys === chart.keys) {
        chart.plot.setData(data, !chart.zoomed);
        return;
      }
      if (chart.plot) chart.plot.destroy();
      chart.keys = keys;
      chart.zoomed = false;
      chart.plot = new uPlot({
        title: name,
        width: width(chart.box),
        height: 220,
        scales: {x: {time: false}, y: {distr: log ? 3 : 1}},
        axes: [{label: "step", incrs: STEP_INCRS, values: stepTicks},
               {label: name, size: 60}],
        series,
        bands,
        cursor: {sync: {key: SYNC_KEY, setSeries: false}},
        hooks: {setScale: [(u, key) => {          // zoomed in: new points keep the zoom
          const xs = u.data[0];
          if (key === "x" && xs.length) chart.zoomed = u.scales.x.min > xs[0] || u.scales.x.max < xs[xs.length - 1];
        }]},
      }, data, chart.box);
      chart.box.uplot = chart.plot;                 // for scripts and tests
      // The legend names what a viewer reads: the smoothed lines, not the faint raw ones or the band's edges.
      const legend = chart.plot.root.querySelectorAll(".u-legend .u-series");
      series.forEach((item, i) => { if (item.aux && legend[i]) legend[i].remove(); });
      if (!chart.resizer) {                         // as wide as its box, on a phone too
        chart.resizer = new ResizeObserver(() => {
          const w = width(chart.box);
          if (chart.plot && w !== chart.plot.width) chart.plot.setSize({width: w, height: chart.plot.height});
        });
        chart.resizer.observe(chart.box);
      }
    }

    function width(element) {
      return Math.max(200, Math.floor(element.clientWidth) || 320);
    }

    function resetZoom() {
      for (const metric of metrics.values()) {
        const chart = metric.chart;
        if (!chart || !chart.plot) continue;
        chart.zoomed = false;
        const xs = chart.plot.data[0];
        if (xs.length) chart.plot.setScale("x", {min: xs[0], max: xs[xs.length - 1]});
      }
    }

    smoothing.addEventListener("input", () => {
      smoothingShown.textContent = Number(smoothing.value).toFixed(2);
      save();
      draw(true);
    });
    for (const control of [logBox, meanBox]) control.addEventListener("change", () => { save(); draw(true); });
    controls.querySelector("#chart-reset-zoom").addEventListener("click", resetZoom);

    return {add, draw};
  }

  window.RingmasterCharts = {create, ema, stepTicks, STEP_INCRS};
})();
