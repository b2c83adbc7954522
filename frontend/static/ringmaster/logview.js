// The job page's log view (job.js creates it): rank filter, search with the lines around each
// hit and a jump to the hit in the full log, line times, hidden metric lines, wrapping, follow,
// paging. Only the rows in sight are in the DOM, so a million-line log scrolls as easily as a
// short one; lines above and below what is held are fetched from the server as the viewer
// scrolls. The toggles are remembered in localStorage.
(function () {
  "use strict";
  const PAGE = 2000;          // lines per request
  const HIT_PAGE = 200;       // search hits per request (each comes with its context)
  const CONTEXT = 2;          // lines shown before and after a search hit
  const MAX_HELD = 200000;    // lines kept in memory; the oldest are dropped (and refetched)
  const OVERSCAN = 40;        // rows rendered above and below the visible ones
  const METRIC_MARK = "RINGMASTER_METRIC ";
  const OPTIONS_KEY = "ringmaster.log.options";
  const $ = (id) => document.getElementById(id);

  function plural(n, word, words) {
    return `${n.toLocaleString()} ${n === 1 ? word : (words || `${word}s`)}`;
  }

  const rankLabel = (rank) => (rank === null || rank === undefined ? "launcher" : String(rank));

  function loadOptions() {
    try {
      return JSON.parse(localStorage.getItem(OPTIONS_KEY)) || {};
    } catch (error) {
      return {};
    }
  }

  function create({api, lastSeq}) {
    const log = $("log"), spacer = $("log-spacer"), rows = $("log-rows"), empty = $("log-empty");
    const rankFilter = $("rank-filter"), search = $("log-search"), follow = $("log-follow");
    const count = $("log-count"), downloadRank = $("download-rank"), downloadAll = $("download-all");
    const toggles = {times: $("log-times"), hideMetrics: $("log-hide-metrics"), wrap: $("log-wrap")};

    let latestSeq = lastSeq;   // the last seq received, in any view
    let view = null;           // {filter, lines, hasOlder, hasNewer, ready, pending, target, ...}
    let lineHeight = 0, charWidth = 0;
    let layout = null;         // {lines, n, cols, tops}: row offsets while lines wrap
    let cols = 0;              // text columns while lines wrap (measured at each render)

    const saved = loadOptions();
    for (const [key, box] of Object.entries(toggles)) box.checked = Boolean(saved[key]);
    applyLook();

    function saveOptions() {
      const options = {};
      for (const [key, box] of Object.entries(toggles)) options[key] = box.checked;
      try {
        localStorage.setItem(OPTIONS_KEY, JSON.stringify(options));
      } catch (error) { /* private mode: the toggles last for this page only */ }
    }

    function applyLook() {
      log.classList.toggle("with-times", toggles.times.checked);
      log.classList.toggle("wrap", toggles.wrap.checked);
    }

    function currentFilter() {
      return {rank: rankFilter.value, text: search.value.trim(), hideMetrics: toggles.hideMetrics.checked};
    }

    // The view without the search: the rank filter and the hidden metric lines.
    function inView(filter, line) {
      if (filter.rank !== "" && rankLabel(line.rank) !== filter.rank) return false;
      return !filter.hideMetrics || !line.text.includes(METRIC_MARK);
    }

    function isHit(filter, line) {
      return line.text.toLowerCase().includes(filter.text.toLowerCase());
    }

    function logQuery(filter, params) {
      const query = new URLSearchParams(params);
      if (filter.rank !== "") query.set("rank", filter.rank);
      if (filter.hideMetrics) query.set("hide_metrics", "1");
      if (filter.text) {
        query.set("q", filter.text);
        query.set("context", CONTEXT);
        query.set("limit", HIT_PAGE);
      }
      return `logs/?${query}`;
    }

    // Open a view of `filter`: the tail of the log, or (around) the lines around one seq.
    async function openView(filter, around) {
      const current = {filter, lines: [], hasOlder: false, hasNewer: false, ready: false, pending: [],
                       loading: false, target: around, recent: [], afterLeft: 0};
      view = current;
      layout = null;
      const upto = latestSeq;
      render();
      try {
        let older, newer = [];
        if (around === undefined) {
          older = await api(logQuery(filter, {before: upto + 1, limit: PAGE}));
        } else {
          [older, newer] = await Promise.all([
            api(logQuery(filter, {before: around + 1, limit: PAGE / 2})),
            api(logQuery(filter, {since: around, limit: PAGE / 2})),
          ]);
          current.hasNewer = newer.lines.length === PAGE / 2;
          newer = newer.lines;
        }
        if (view !== current) return;                 // the filter changed meanwhile
        current.lines = merge(older.lines, newer);
        current.hasOlder = filter.text ? hitCount(older.lines) >= HIT_PAGE
          : older.lines.length === (around === undefined ? PAGE : PAGE / 2);
        current.ready = true;
        if (filter.text) startContext(current);
        if (!current.hasNewer) flushPending(current);
        follow.checked = around === undefined;
        render(around === undefined);
        if (around !== undefined) scrollToSeq(around);
      } catch (error) {
        count.textContent = `Could not load the log: ${error.message}`;
      }
    }

    const hitCount = (lines) => lines.reduce((n, line) => n + (line.hit ? 1 : 0), 0);

    function merge(a, b) {
      const last = a.length ? a[a.length - 1].seq : -1;
      return a.concat(b.filter((line) => line.seq > last));
    }

    // After the last hit held, how many more lines of context live lines may still add.
    function startContext(current) {
      const lines = current.lines;
      let after = 0;
      for (let i = lines.length - 1; i >= 0 && !lines[i].hit; i--) after += 1;
      current.afterLeft = lines.some((line) => line.hit) ? Math.max(0, CONTEXT - after) : 0;
      current.recent = lines.slice(-CONTEXT);
    }

    async function loadOlder() {
      const current = view;
      if (!current.ready || !current.hasOlder || current.loading || !current.lines.length) return;
      current.loading = true;
      try {
        const firstHit = current.filter.text ? current.lines.find((line) => line.hit) : current.lines[0];
        const data = await api(logQuery(current.filter, {before: (firstHit || current.lines[0]).seq, limit: PAGE}));
        if (view !== current) return;
        const first = current.lines[0].seq;
        const above = data.lines.filter((line) => line.seq < first);
        const before = totalHeight();
        current.lines = above.concat(current.lines);
        current.hasOlder = current.filter.text ? hitCount(data.lines) >= HIT_PAGE : data.lines.length === PAGE;
        // Keep the lines in sight where they were (grow the spacer first, or the scroll is clamped).
        const grown = totalHeight() - before;
        spacer.style.height = `${totalHeight()}px`;
        log.scrollTop += grown;
        render();
      } finally {
        current.loading = false;
      }
    }

    async function loadNewer() {
      const current = view;
      if (!current.ready || !current.hasNewer || current.loading || !current.lines.length) return;
      current.loading = true;
      try {
        const data = await api(logQuery(current.filter, {since: current.lines[current.lines.length - 1].seq, limit: PAGE}));
        if (view !== current) return;
        current.lines = merge(current.lines, data.lines);
        current.hasNewer = data.lines.length === PAGE;
        if (!current.hasNewer) flushPending(current);
        render();
        // The end of the log is held now. A view still at its bottom (the page brought nothing
        // below it) follows the live lines, as a scroll to the end does; one that was read on
        // from stays where it is.
        if (!current.hasNewer && atBottom()) follow.checked = true;
      } finally {
        current.loading = false;
      }
    }

    function flushPending(current) {
      const pending = current.pending;
      current.pending = [];
      for (const line of pending) take(current, line);
    }

    // One live line that is in the view's filter: shown as it is, or in a search as a hit with
    // the lines before it, or as a line after a hit (grep -C, as the server answers).
    function take(current, line) {
      const last = current.lines.length ? current.lines[current.lines.length - 1].seq : -1;
      if (line.seq <= last) return;
      if (!current.filter.text) {
        current.lines.push(line);
        return;
      }
      if (isHit(current.filter, line)) {
        for (const before of current.recent) if (before.seq > last) current.lines.push({...before, hit: false});
        current.lines.push({...line, hit: true});
        current.afterLeft = CONTEXT;
      } else if (current.afterLeft > 0) {
        current.lines.push({...line, hit: false});
        current.afterLeft -= 1;
      }
      current.recent = current.recent.concat([line]).slice(-CONTEXT);
    }

    function addLines(lines) {
      for (const line of lines) latestSeq = Math.max(latestSeq, line.seq);
      const current = view;
      const wanted = lines.filter((line) => inView(current.filter, line));
      if (!current.ready || current.hasNewer) {
        current.pending.push(...wanted);      // shown once the view reaches the end of the log
        return;
      }
      for (const line of wanted) take(current, line);
      const excess = current.lines.length - MAX_HELD;
      if (excess > 0) {
        const removed = topOf(excess);               // keep the rest in place
        current.lines.splice(0, excess);
        current.hasOlder = true;
        layout = null;
        if (!follow.checked) log.scrollTop -= removed;
      }
      scheduleRender();
    }

    // ---------------------------------------------------------------------------------------
    // Layout: every row is lineHeight tall, or, while lines wrap, as many rows as its text
    // needs at the view's width (the font is monospaced, so that is a division).
    function measure() {
      const probe = makeRow({seq: -1, rank: 0, stream: "stdout", text: "x".repeat(100), ts: ""}, "");
      probe.style.whiteSpace = "pre";
      rows.appendChild(probe);
      lineHeight = probe.getBoundingClientRect().height || 18;
      const text = probe.querySelector(".text");
      charWidth = (text && text.getBoundingClientRect().width / 100) || 7.5;
      probe.remove();
    }

    function columns() {
      const style = getComputedStyle(rows);
      const inner = log.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      const prefix = parseFloat(getComputedStyle(log).getPropertyValue("--prefix-ch")) || 0;
      return Math.max(10, Math.floor(inner / charWidth - prefix - 0.01));
    }

    function wrapLayout() {
      if (!toggles.wrap.checked) return null;
      if (!cols) cols = columns();
      const lines = view.lines;
      if (layout && layout.lines === lines && layout.cols === cols && layout.n === lines.length) return layout;
      let start = 0, tops;
      if (layout && layout.lines === lines && layout.cols === cols && layout.n < lines.length) {
        start = layout.n;                          // lines were added at the end: extend
        tops = new Float64Array(lines.length + 1);
        tops.set(layout.tops.subarray(0, start + 1));
      } else {
        tops = new Float64Array(lines.length + 1);
      }
      for (let i = start; i < lines.length; i++) {
        tops[i + 1] = tops[i] + lineHeight * Math.max(1, Math.ceil(lines[i].text.length / cols));
      }
      layout = {lines, n: lines.length, cols, tops};
      return layout;
    }

    function topOf(index) {
      const wrapped = wrapLayout();
      return wrapped ? wrapped.tops[index] : index * lineHeight;
    }

    const totalHeight = () => (view ? topOf(view.lines.length) : 0);

    function indexAt(y) {
      const wrapped = wrapLayout();
      if (!wrapped) return Math.floor(y / lineHeight);
      let low = 0, high = view.lines.length;        // the last row whose top is <= y
      while (low < high) {
        const mid = (low + high + 1) >> 1;
        if (wrapped.tops[mid] <= y) low = mid; else high = mid - 1;
      }
      return low;
    }

    function makeRow(line, needle) {
      const row = document.createElement("div");
      row.className = `line ${line.stream}`;
      row.dataset.rank = rankLabel(line.rank);
      row.dataset.seq = line.seq;
      if (line.hit !== undefined) {
        row.classList.add(line.hit ? "hit" : "context");
        const jump = document.createElement(line.hit ? "button" : "span");
        jump.className = "jump";
        if (line.hit) {
          jump.type = "button";
          jump.textContent = "↪";
          jump.title = "Show this line in the full log";
        }
        row.appendChild(jump);
      }
      if (toggles.times.checked) {
        const time = document.createElement("span");
        time.className = "ts";
        time.textContent = line.ts && window.RingmasterTime ? RingmasterTime.text(line.ts, "time") : "";
        row.appendChild(time);
      }
      const rank = document.createElement("span");
      rank.className = "rank";
      rank.textContent = row.dataset.rank === "launcher" ? "L" : row.dataset.rank;
      row.appendChild(rank);
      const body = document.createElement("span");
      body.className = "text";
      const text = line.text;
      const at = needle && line.hit ? text.toLowerCase().indexOf(needle) : -1;
      if (at < 0) {
        body.textContent = text;
      } else {                                        // text nodes only: user output is never HTML
        const mark = document.createElement("mark");
        mark.textContent = text.slice(at, at + needle.length);
        body.append(text.slice(0, at), mark, text.slice(at + needle.length));
      }
      row.appendChild(body);
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
      log.classList.toggle("searching", Boolean(view.filter.text));
      if (!lineHeight) measure();
      cols = toggles.wrap.checked ? columns() : 0;   // once a render: a scrollbar may have come or gone
      const lines = view.lines;
      spacer.style.height = `${totalHeight()}px`;
      if (toBottom || follow.checked) log.scrollTop = log.scrollHeight;
      const first = Math.max(0, indexAt(log.scrollTop) - OVERSCAN);
      const last = Math.min(lines.length, indexAt(log.scrollTop + log.clientHeight) + 1 + OVERSCAN);
      const needle = view.filter.text.toLowerCase();
      const fragment = document.createDocumentFragment();
      for (let i = first; i < last; i++) {
        const row = makeRow(lines[i], needle);
        if (needle && i > 0 && lines[i].seq !== lines[i - 1].seq + 1 && !view.filter.rank && !view.filter.hideMetrics) {
          row.classList.add("gap");                   // a new group of hit and context
        }
        if (lines[i].seq === view.target) row.classList.add("target");
        if (toggles.wrap.checked) row.style.height = `${topOf(i + 1) - topOf(i)}px`;
        fragment.appendChild(row);
      }
      rows.style.transform = `translateY(${topOf(first)}px)`;
      rows.replaceChildren(fragment);
      log.dataset.held = lines.length;                // what the view holds, for scripts and tests
      log.dataset.first = lines.length ? lines[0].seq : "";
      log.dataset.last = lines.length ? lines[lines.length - 1].seq : "";
      empty.hidden = lines.length > 0 || !view.ready;
      const filtered = view.filter.rank || view.filter.text || view.filter.hideMetrics;
      empty.textContent = filtered ? "No matching lines." : "No output yet.";
      count.textContent = !view.ready ? "loading…" : summary(lines);
    }

    function summary(lines) {
      const more = [], what = view.filter.text ? "hits" : "lines";
      if (view.hasOlder) more.push(`older ${what} load as you scroll up`);
      if (view.hasNewer) more.push(`newer ${what} load as you scroll down`);
      const tail = more.length ? `; ${more.join(", ")}` : "";
      if (!view.filter.text) return `${plural(lines.length, "line")} loaded${tail}`;
      const hits = hitCount(lines);
      return `${plural(hits, "hit")} shown with ${CONTEXT} lines around each` +
        (hits ? "; ↪ shows a hit in the full log" : "") + tail;
    }

    function scrollToSeq(seq) {
      const index = view.lines.findIndex((line) => line.seq >= seq);
      if (index < 0) return;
      log.scrollTop = Math.max(0, topOf(index) - log.clientHeight / 2 + lineHeight / 2);
      render();
    }

    // The full log (the same rank filter, no search) around one line, which stays marked.
    function jumpTo(seq) {
      search.value = "";
      filterChanged(seq);
      log.focus();
    }

    rows.addEventListener("click", (event) => {
      const row = event.target.closest(".line.hit");
      if (row && (event.target.closest(".jump") || !window.getSelection().toString())) jumpTo(Number(row.dataset.seq));
    });

    const atBottom = () => log.scrollTop + log.clientHeight >= log.scrollHeight - 2 * lineHeight;

    log.addEventListener("scroll", () => {
      follow.checked = atBottom() && !view.hasNewer;
      if (log.scrollTop < OVERSCAN * lineHeight) loadOlder();
      if (log.scrollTop + log.clientHeight > log.scrollHeight - OVERSCAN * lineHeight) loadNewer();
      scheduleRender();
    });
    follow.addEventListener("change", () => {
      if (!follow.checked) return;
      if (view.hasNewer || view.target !== undefined) openView(currentFilter());   // back to the tail
      else render(true);
    });

    function filterChanged(around) {
      const filter = currentFilter();
      const base = downloadAll.getAttribute("href");
      downloadRank.hidden = filter.rank === "";
      downloadRank.href = `${base}?rank=${encodeURIComponent(filter.rank)}`;
      openView(filter, typeof around === "number" ? around : undefined);
    }
    rankFilter.addEventListener("change", () => filterChanged());
    let searchTimer = null;
    search.addEventListener("input", () => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(filterChanged, 250);
    });
    toggles.hideMetrics.addEventListener("change", () => {
      saveOptions();
      filterChanged(view.target);
    });
    for (const box of [toggles.times, toggles.wrap]) {
      box.addEventListener("change", () => {
        saveOptions();
        const anchor = view.lines[indexAt(log.scrollTop)];  // keep the top line in sight
        applyLook();
        lineHeight = 0;
        layout = null;
        render();
        if (anchor && !follow.checked) {
          log.scrollTop = topOf(view.lines.indexOf(anchor));
          render();
        }
      });
    }
    window.addEventListener("resize", () => {
      layout = null;
      scheduleRender();
    });

    openView(currentFilter());
    return {addLines, latestSeq: () => latestSeq};
  }

  window.RingmasterLog = {create, plural, rankLabel};
})();
