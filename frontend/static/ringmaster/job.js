// The job page, live: the log view (logview.js), training curves (charts.js), system charts
// and the state badge. The stored log is the source of truth: the page loads the tail of the log
// over the API, then follows the websocket from the last seq it holds (/ws/jobs/<id>/?since=),
// and reconnects from there after any drop, so no line is lost or shown twice. Metric points that
// come from no line (TensorBoard's scalars, seq -1) are the API's, then those the websocket sends
// from the page's mark (?tb_since=: what was stored when the server made the page), each drawn once.
(function () {
  "use strict";
  const root = document.getElementById("job");
  if (!root) return;
  const jobId = root.dataset.jobId;
  const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
  const $ = (id) => document.getElementById(id);

  function api(path) {
    return fetch(`/api/jobs/${jobId}/${path}`, {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then((response) => {
        if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
        return response.json();
      });
  }

  // ---------------------------------------------------------------------------------------
  // Log view (logview.js): the tail over the API, then the lines the websocket brings.
  const logView = RingmasterLog.create({api, lastSeq: Number(root.dataset.lastSeq)});
  const addLines = logView.addLines;

  // ---------------------------------------------------------------------------------------
  // Training curves (charts.js): the API's points, then the websocket's, merged by seq; points
  // of no line (seq < 0) by metric, rank and step.
  const training = RingmasterCharts.create({
    card: $("charts-card"), box: $("charts"), numbers: $("chart-numbers"), controls: $("chart-controls"),
    ended: () => TERMINAL.has(state),
  });
  let metricsUpTo = null;          // the API's points cover every seq up to this one
  let earlyPoints = [];
  const pointsOfNoLine = new Set();    // JSON of [name, rank, step] of the points held with seq < 0

  // Whether `point` of metric `name` is not drawn yet (the API's and the websocket's overlap).
  function isNew(name, point) {
    if (point.seq >= 0) return point.seq > metricsUpTo;
    const key = JSON.stringify([name, point.rank, point.step]);
    if (pointsOfNoLine.has(key)) return false;
    pointsOfNoLine.add(key);
    return true;
  }
  const COLORS = ["#2f5bd3", "#d3572f", "#1f8a4c", "#9b3dc8", "#b7791f", "#0f8fa8", "#c2352b", "#5b6b8c"];

  function addPoints(points) {
    if (metricsUpTo === null) {
      earlyPoints.push(...points);
      return;
    }
    for (const point of points) if (isNew(point.name, point)) training.add(point.name, point);
    scheduleCharts();
  }

  let chartsQueued = false;
  function scheduleCharts() {
    if (chartsQueued) return;
    chartsQueued = true;
    setTimeout(() => {
      chartsQueued = false;
      training.draw();
    }, 250);
  }

  // Draw `data` in chart.box: new data into the same plot while its series (`keys`) stay, else a
  // new plot made from options().
  function plotInto(chart, keys, data, options) {
    if (chart.plot && keys === chart.keys) {
      chart.plot.setData(data);
      return;
    }
    if (chart.plot) chart.plot.destroy();
    chart.keys = keys;
    chart.plot = new uPlot(options(), data, chart.box);
    if (!chart.resizer) {          // the chart is as wide as its box, on a phone too
      chart.resizer = new ResizeObserver(() => {
        const width = chartWidth(chart.box);
        if (chart.plot && width !== chart.plot.width) chart.plot.setSize({width, height: chart.plot.height});
      });
      chart.resizer.observe(chart.box);
    }
  }

  function chartWidth(box) {
    return Math.max(200, Math.floor(box.clientWidth) || 320);
  }

  // ---------------------------------------------------------------------------------------
  // System: what the job's hosts report while it runs (GPU utilization, memory and power per
  // GPU; CPU and memory of its processes on hosts without GPUs), one chart per quantity, one
  // series per host and device. Samples come from the API and then the websocket, deduplicated
  // by id, so their order and overlap do not matter.
  const systemCard = $("system-card"), systemBox = $("system-charts");
  const systemHint = $("system-hint"), systemNote = $("system-note");
  const QUANTITIES = [
    {key: "utilization", title: "Utilization (%)"},
    {key: "memory_used", title: "Memory used (MiB)"},
    {key: "power", title: "Power (W)"},
  ];
  const seenSamples = new Set();
  const systemSeries = new Map();   // "host device" -> Map(ts seconds -> sample)
  const systemCharts = new Map();   // quantity key -> {box, plot, keys}
  let systemQueued = false;

  function showSystemHint(hint) {
    systemHint.textContent = hint || "";
    systemHint.hidden = !hint;
  }

  function addSamples(samples, hint) {
    let added = 0;
    for (const sample of samples) {
      if (seenSamples.has(sample.id)) continue;
      seenSamples.add(sample.id);
      const key = `${sample.host} ${sample.device}`;
      if (!systemSeries.has(key)) systemSeries.set(key, new Map());
      systemSeries.get(key).set(Date.parse(sample.ts) / 1000, sample);
      added += 1;
    }
    if (hint !== undefined) showSystemHint(hint);
    if (added) {
      systemCard.hidden = false;
      if (!systemQueued) {
        systemQueued = true;
        setTimeout(() => { systemQueued = false; drawSystem(); }, 250);
      }
    }
  }

  function drawSystem() {
    const keys = [...systemSeries.keys()].sort();
    const times = [...new Set(keys.flatMap((key) => [...systemSeries.get(key).keys()]))].sort((a, b) => a - b);
    for (const quantity of QUANTITIES) {
      const shown = keys.filter((key) => [...systemSeries.get(key).values()].some((s) => s[quantity.key] !== null));
      if (!shown.length) continue;
      let chart = systemCharts.get(quantity.key);
      if (!chart) {
        const box = document.createElement("div");
        box.className = "chart";
        box.dataset.quantity = quantity.key;
        chart = {box, plot: null, keys: ""};
        systemCharts.set(quantity.key, chart);
        // Always in the order of QUANTITIES, whichever quantity was seen first.
        systemBox.append(...QUANTITIES.filter((q) => systemCharts.has(q.key)).map((q) => systemCharts.get(q.key).box));
      }
      const data = [times, ...shown.map((key) => {
        const series = systemSeries.get(key);
        return times.map((t) => (series.has(t) ? series.get(t)[quantity.key] : null));
      })];
      chart.box.dataset.points = shown.reduce((n, key) => n + systemSeries.get(key).size, 0);
      plotInto(chart, shown.join(","), data, () => ({
        title: quantity.title,
        width: chartWidth(chart.box),
        height: 200,
        series: [{label: "time"}, ...shown.map((key, i) => ({
          label: key, stroke: COLORS[i % COLORS.length], spanGaps: true, points: {show: times.length < 60},
        }))],
      }));
    }
  }

  function loadSystem(system) {
    if (!system) return;
    if (!system.collected && system.note) {
      systemNote.textContent = system.note;
      systemNote.hidden = false;
      systemCard.hidden = false;
    }
    addSamples(system.samples || [], system.hint);
  }

  api("metrics/").then((data) => {
    loadSystem(data.system);
    let upto = -1;
    for (const [name, points] of Object.entries(data.series)) {
      for (const point of points) {
        if (point.seq < 0 && !isNew(name, point)) continue;
        training.add(name, point);
        upto = Math.max(upto, point.seq);
      }
    }
    metricsUpTo = upto;
    const early = earlyPoints;
    earlyPoints = [];
    addPoints(early);
    training.draw();
  }).catch(() => { metricsUpTo = -1; });

  // ---------------------------------------------------------------------------------------
  // State badge, reason and the rest of the summary, kept current by the websocket.
  let state = root.dataset.state;

  function showField(id, value) {
    const dd = $(id);
    const present = value !== null && value !== undefined && value !== "";
    dd.textContent = present ? value : "";
    dd.hidden = !present;
    dd.previousElementSibling.hidden = !present;
  }

  function badge(value) {
    const span = document.createElement("span");
    span.className = `state state-${value.toLowerCase()}`;
    span.dataset.state = value;
    span.textContent = value;
    return span;
  }

  let cancelling = root.dataset.cancelling === "true";

  function showState(newState, reason) {
    state = newState;
    root.dataset.state = newState;
    $("job-state").replaceChildren(badge(newState));
    if (cancelling && !TERMINAL.has(newState)) $("job-state").append(" (cancelling)");
    showField("job-reason", reason);
    if (TERMINAL.has(newState) || cancelling) {
      const cancel = $("cancel-form");
      if (cancel) cancel.hidden = true;
    }
  }

  // Cancel asks first, then cancels over the API and shows it in place (no reload, no flash).
  const cancelForm = $("cancel-form");
  if (cancelForm) {
    cancelForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (!window.confirm(`Cancel job ${jobId}? Every one of its processes is stopped.`)) return;
      const button = cancelForm.querySelector("button");
      button.disabled = true;
      try {
        const response = await fetch(`/api/jobs/${jobId}/cancel/`, {
          method: "POST", credentials: "same-origin",
          headers: {Accept: "application/json",
                    "X-CSRFToken": cancelForm.querySelector("input[name=csrfmiddlewaretoken]").value},
        });
        const job = await response.json().catch(() => ({}));
        if (!response.ok) {
          showField("job-reason", job.detail || `cancel failed: HTTP ${response.status}`);
          return;
        }
        cancelling = true;
        showState(job.state, job.reason);
      } finally {
        button.disabled = false;
      }
    });
  }

  // Times as the server renders them (time.js): the same text before and after an update.
  function showTime(id, iso, after) {
    const dd = $(id);
    dd.hidden = dd.previousElementSibling.hidden = !iso;
    dd.replaceChildren(...(iso ? [RingmasterTime.element(iso, "datetime"), after || ""] : []));
  }

  async function refreshSummary() {
    const job = await api("");
    if (job.state !== state) return;           // a newer state message is on its way
    showField("job-queue-position", job.queue_position);
    showField("job-exit-code", job.exit_code);
    showField("job-failed-rank", job.failed_rank);
    showTime("job-started", job.started_at);
    const seconds = Math.round(job.gpu_seconds || 0);        // as the template writes it
    showTime("job-finished", job.finished_at, ` (${seconds} GPU-second${seconds === 1 ? "" : "s"})`);
    const events = document.querySelector("ol.events");
    events.replaceChildren(...job.events.map((event) => {
      const item = document.createElement("li");
      item.appendChild(RingmasterTime.element(event.ts, "time"));
      item.append(" ");
      if (event.state) item.append(badge(event.state), " ");
      item.append(event.message);
      return item;
    }));
  }

  // ---------------------------------------------------------------------------------------
  // The websocket: replay after the last seq held, then live; reconnect from there.
  const liveStatus = $("live-status");
  let backoff = 500;
  let reconnecting = false;
  let ended = false;                 // the job has ended: nothing more will come

  function setLive(status, text) {
    liveStatus.dataset.status = status;
    liveStatus.textContent = text;
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(
      `${scheme}://${location.host}/ws/jobs/${jobId}/?since=${logView.latestSeq()}&tb_since=${root.dataset.tbSince}`);
    socket.onopen = () => {
      // Samples stored while the socket was down are not replayed by it: fetch them.
      if (reconnecting) api("metrics/").then((data) => loadSystem(data.system)).catch(() => {});
      reconnecting = false;
      backoff = 500;
      setLive("live", "live");
    };
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "lines") addLines(message.lines);
      else if (message.type === "metrics") addPoints(message.points);
      else if (message.type === "system") addSamples(message.samples, message.hint);
      else if (message.type === "state") {
        const changed = message.state !== state;
        showState(message.state, message.reason);
        if (changed || TERMINAL.has(message.state)) refreshSummary().catch(() => {});
        if (TERMINAL.has(message.state)) {
          // The lines stored before the job ended came before this message: the log is whole.
          ended = true;
          training.draw(true);     // a metric with one value per rank is now a summary
          socket.close();
        }
      }
    };
    socket.onclose = (event) => {
      if (ended) {
        setLive("ended", "ended");
        return;
      }
      if (event.code === 4404) {
        setLive("refused", "not allowed");
        return;
      }
      setLive("reconnecting", "reconnecting…");
      reconnecting = true;
      setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 10000);
    };
  }

  connect();
})();
