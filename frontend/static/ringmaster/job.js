// The job page, live: the log view (rank filter, search, follow, paging), training curves,
// system charts and the state badge. The stored log is the source of truth: the page loads the tail of the log
// over the API, then follows the websocket from the last seq it holds (/ws/jobs/<id>/?since=),
// and reconnects from there after any drop, so no line is lost or shown twice.
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
  // Log view. Only the rows in sight are in the DOM, so a million-line log scrolls as easily
  // as a short one; older lines are fetched from the server as the viewer scrolls up.
  const PAGE = 2000;          // lines per request
  const MAX_HELD = 200000;    // lines kept in memory; the oldest are dropped (and refetched)
  const OVERSCAN = 40;        // rows rendered above and below the visible ones

  const log = $("log"), spacer = $("log-spacer"), rows = $("log-rows"), empty = $("log-empty");
  const rankFilter = $("rank-filter"), search = $("log-search"), follow = $("log-follow");
  const count = $("log-count"), downloadRank = $("download-rank"), downloadAll = $("download-all");

  let latestSeq = Number(root.dataset.lastSeq);   // the last seq received, in any view
  let view = null;                                // {filter, lines, hasOlder, ready, pending}
  let lineHeight = 0;

  const rankLabel = (rank) => (rank === null || rank === undefined ? "launcher" : String(rank));

  function currentFilter() {
    return {rank: rankFilter.value, text: search.value.trim()};
  }

  function matches(filter, line) {
    if (filter.rank !== "" && rankLabel(line.rank) !== filter.rank) return false;
    return !filter.text || line.text.toLowerCase().includes(filter.text.toLowerCase());
  }

  function logQuery(filter, params) {
    const query = new URLSearchParams(params);
    if (filter.rank !== "") query.set("rank", filter.rank);
    if (filter.text) query.set("q", filter.text);
    return `logs/?${query}`;
  }

  async function openView(filter) {
    const current = {filter, lines: [], hasOlder: false, ready: false, pending: [], loadingOlder: false};
    view = current;
    const upto = latestSeq;
    render();
    try {
      const data = await api(logQuery(filter, {before: upto + 1, limit: PAGE}));
      if (view !== current) return;                 // the filter changed meanwhile
      current.lines = data.lines.concat(current.pending.filter((line) => line.seq > upto));
      current.hasOlder = data.lines.length === PAGE;
      current.pending = [];
      current.ready = true;
      follow.checked = true;
      render(true);
    } catch (error) {
      count.textContent = `Could not load the log: ${error.message}`;
    }
  }

  async function loadOlder() {
    const current = view;
    if (!current.ready || !current.hasOlder || current.loadingOlder || !current.lines.length) return;
    current.loadingOlder = true;
    try {
      const data = await api(logQuery(current.filter, {before: current.lines[0].seq, limit: PAGE}));
      if (view !== current) return;
      current.lines = data.lines.concat(current.lines);
      current.hasOlder = data.lines.length === PAGE;
      // Keep the lines in sight where they were (grow the spacer first, or the scroll is clamped).
      spacer.style.height = `${current.lines.length * lineHeight}px`;
      log.scrollTop += data.lines.length * lineHeight;
      render();
    } finally {
      current.loadingOlder = false;
    }
  }

  function addLines(lines) {
    for (const line of lines) latestSeq = Math.max(latestSeq, line.seq);
    const current = view;
    const wanted = lines.filter((line) => matches(current.filter, line));
    if (!current.ready) {
      current.pending.push(...wanted);
      return;
    }
    current.lines.push(...wanted);
    const excess = current.lines.length - MAX_HELD;
    if (excess > 0) {
      current.lines.splice(0, excess);
      current.hasOlder = true;
      if (!follow.checked) log.scrollTop -= excess * lineHeight;
    }
    scheduleRender();
  }

  function measureLineHeight() {
    const probe = makeRow({seq: -1, rank: 0, stream: "stdout", text: "x"}, "");
    rows.appendChild(probe);
    lineHeight = probe.getBoundingClientRect().height || 18;
    probe.remove();
  }

  function makeRow(line, needle) {
    const row = document.createElement("div");
    row.className = `line ${line.stream}`;
    row.dataset.rank = rankLabel(line.rank);
    row.dataset.seq = line.seq;
    const rank = document.createElement("span");
    rank.className = "rank";
    rank.textContent = row.dataset.rank === "launcher" ? "L" : row.dataset.rank;
    row.appendChild(rank);
    const text = line.text;
    const at = needle ? text.toLowerCase().indexOf(needle) : -1;
    if (at < 0) {
      row.appendChild(document.createTextNode(text));
    } else {                                          // text nodes only: user output is never HTML
      const mark = document.createElement("mark");
      mark.textContent = text.slice(at, at + needle.length);
      row.append(text.slice(0, at), mark, text.slice(at + needle.length));
    }
    return row;
  }

  let renderQueued = false;
  function scheduleRender() {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(() => {
      renderQueued = false;
      render();
    });
  }

  function render(toBottom) {
    if (!lineHeight) measureLineHeight();
    const lines = view.lines;
    spacer.style.height = `${lines.length * lineHeight}px`;
    if (toBottom || follow.checked) log.scrollTop = log.scrollHeight;
    const first = Math.max(0, Math.floor(log.scrollTop / lineHeight) - OVERSCAN);
    const last = Math.min(lines.length, Math.ceil((log.scrollTop + log.clientHeight) / lineHeight) + OVERSCAN);
    const needle = view.filter.text.toLowerCase();
    const fragment = document.createDocumentFragment();
    for (let i = first; i < last; i++) fragment.appendChild(makeRow(lines[i], needle));
    rows.style.transform = `translateY(${first * lineHeight}px)`;
    rows.replaceChildren(fragment);
    log.dataset.held = lines.length;                  // what the view holds, for scripts and tests
    log.dataset.first = lines.length ? lines[0].seq : "";
    log.dataset.last = lines.length ? lines[lines.length - 1].seq : "";
    empty.hidden = lines.length > 0 || !view.ready;
    empty.textContent = view.filter.rank || view.filter.text ? "No matching lines." : "No output yet.";
    count.textContent = !view.ready ? "loading…"
      : `${lines.length.toLocaleString()} lines loaded${view.hasOlder ? "; older lines load as you scroll up" : ""}`;
  }

  log.addEventListener("scroll", () => {
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 2 * lineHeight;
    follow.checked = atBottom;
    if (log.scrollTop < OVERSCAN * lineHeight) loadOlder();
    scheduleRender();
  });
  follow.addEventListener("change", () => {
    if (follow.checked) render(true);
  });

  function filterChanged() {
    const filter = currentFilter();
    const base = downloadAll.getAttribute("href");
    downloadRank.hidden = filter.rank === "";
    downloadRank.href = `${base}?rank=${encodeURIComponent(filter.rank)}`;
    openView(filter);
  }
  rankFilter.addEventListener("change", filterChanged);
  let searchTimer = null;
  search.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(filterChanged, 250);
  });
  window.addEventListener("resize", scheduleRender);

  // ---------------------------------------------------------------------------------------
  // Training curves: one chart per metric, one series per rank (uPlot, vendored).
  const chartsCard = $("charts-card"), chartsBox = $("charts");
  const charts = new Map();        // name -> {ranks: Map(rank -> Map(step -> value)), plot, box, keys}
  let metricsUpTo = null;          // the API's points cover every seq up to this one
  let earlyPoints = [];
  const COLORS = ["#2f5bd3", "#d3572f", "#1f8a4c", "#9b3dc8", "#b7791f", "#0f8fa8", "#c2352b", "#5b6b8c"];

  function addPoint(name, point) {
    let chart = charts.get(name);
    if (!chart) {
      const box = document.createElement("div");
      box.className = "chart";
      box.dataset.metric = name;
      chartsBox.appendChild(box);
      chart = {ranks: new Map(), plot: null, box, keys: "", points: 0};
      charts.set(name, chart);
      chartsCard.hidden = false;
    }
    const rank = rankLabel(point.rank);
    if (!chart.ranks.has(rank)) chart.ranks.set(rank, new Map());
    chart.ranks.get(rank).set(point.step, point.value);
    chart.points += 1;
    chart.dirty = true;
  }

  function addPoints(points) {
    if (metricsUpTo === null) {
      earlyPoints.push(...points);
      return;
    }
    for (const point of points) if (point.seq > metricsUpTo) addPoint(point.name, point);
    scheduleCharts();
  }

  let chartsQueued = false;
  function scheduleCharts() {
    if (chartsQueued) return;
    chartsQueued = true;
    setTimeout(() => {
      chartsQueued = false;
      drawCharts();
    }, 250);
  }

  function byRank(a, b) {
    if (a === "launcher" || b === "launcher") return a === "launcher" ? 1 : -1;
    return Number(a) - Number(b);
  }

  function drawCharts() {
    for (const [name, chart] of charts) {
      if (!chart.dirty) continue;
      chart.dirty = false;
      const ranks = [...chart.ranks.keys()].sort(byRank);
      const steps = [...new Set(ranks.flatMap((rank) => [...chart.ranks.get(rank).keys()]))].sort((a, b) => a - b);
      const data = [steps, ...ranks.map((rank) => {
        const values = chart.ranks.get(rank);
        return steps.map((step) => (values.has(step) ? values.get(step) : null));
      })];
      chart.box.dataset.points = chart.points;
      plotInto(chart, ranks.join(","), data, () => ({
        title: name,
        width: Math.max(280, chart.box.clientWidth || 520),
        height: 220,
        scales: {x: {time: false}},
        axes: [{label: "step"}, {}],
        series: [{label: "step"}, ...ranks.map((rank, i) => ({
          label: rank === "launcher" ? "launcher" : `rank ${rank}`,
          stroke: COLORS[i % COLORS.length],
          spanGaps: true,
          points: {show: steps.length < 60},
        }))],
      }));
    }
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
        width: Math.max(280, chart.box.clientWidth || 520),
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
        addPoint(name, point);
        upto = Math.max(upto, point.seq);
      }
    }
    metricsUpTo = upto;
    const early = earlyPoints;
    earlyPoints = [];
    addPoints(early);
    drawCharts();
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

  function dateTime(iso) {
    const date = new Date(iso);
    const pad = (n) => String(n).padStart(2, "0");
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
      `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  }

  async function refreshSummary() {
    const job = await api("");
    if (job.state !== state) return;           // a newer state message is on its way
    showField("job-queue-position", job.queue_position);
    showField("job-exit-code", job.exit_code);
    showField("job-failed-rank", job.failed_rank);
    showField("job-started", job.started_at && dateTime(job.started_at));
    showField("job-finished", job.finished_at &&
      `${dateTime(job.finished_at)} (${Math.round(job.gpu_seconds || 0)} GPU-seconds)`);
    const events = document.querySelector("ol.events");
    events.replaceChildren(...job.events.map((event) => {
      const item = document.createElement("li");
      const time = document.createElement("time");
      time.textContent = new Date(event.ts).toLocaleTimeString([], {hour12: false});
      item.appendChild(time);
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
    const socket = new WebSocket(`${scheme}://${location.host}/ws/jobs/${jobId}/?since=${latestSeq}`);
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

  openView(currentFilter());
  connect();
})();
