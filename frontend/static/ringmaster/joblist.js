// The job list, live: every few seconds it fetches its own rows and pager (the same query
// string, so filters, sort and page stay; ?live=1 gives only those parts) and puts in the rows
// that changed, keeping the rest as they are: no reload, no flash, no lost scroll or focus.
(function () {
  "use strict";
  const table = document.getElementById("job-table");
  if (!table) return;
  const EVERY_MS = 3000;
  const rows = document.getElementById("job-rows"), pager = document.getElementById("job-pager");
  const seen = new Map();              // row key -> the server's HTML for it, as last shown

  const key = (tr) => tr.dataset.jobId || "empty";
  for (const tr of rows.rows) seen.set(key(tr), null);   // first poll replaces what changed since

  function update(html) {
    const fresh = document.createElement("template");
    fresh.innerHTML = html;
    const newRows = fresh.content.getElementById("job-rows");
    if (!newRows) return;
    const old = new Map([...rows.rows].map((tr) => [key(tr), tr]));
    // Jobs ticked for comparing stay ticked in the rows that change.
    const picked = new Set([...rows.querySelectorAll('input[name="jobs"]:checked')].map((box) => box.value));
    const next = [...newRows.rows].map((tr) => {
      const source = tr.outerHTML, id = key(tr);
      if (old.has(id) && seen.get(id) === source) return old.get(id);
      seen.set(id, source);
      RingmasterTime.apply(tr);
      const box = tr.querySelector('input[name="jobs"]');
      if (box) box.checked = picked.has(box.value);
      return tr;
    });
    const same = next.length === rows.rows.length && next.every((tr, i) => tr === rows.rows[i]);
    if (!same) rows.replaceChildren(...next);
    const newPager = fresh.content.getElementById("job-pager");
    if (newPager && newPager.innerHTML !== pager.innerHTML) pager.innerHTML = newPager.innerHTML;
    table.dataset.updated = String(Number(table.dataset.updated || 0) + 1);   // for tests and scripts
  }

  async function poll() {
    if (!document.hidden) {
      try {
        const response = await fetch(table.dataset.live, {credentials: "same-origin", headers: {Accept: "text/html"}});
        if (response.redirected || [401, 403, 404].includes(response.status)) return;   // logged out: stop
        if (response.ok) update(await response.text());     // else (a restart, a 502): next time
      } catch (error) {
        // the portal is restarting: try again next time
      }
    }
    setTimeout(poll, EVERY_MS);
  }
  setTimeout(poll, EVERY_MS);

  // A changed menu applies at once; the search box on Enter (or the Filter button).
  const filters = document.getElementById("job-filters");
  if (filters) filters.querySelectorAll("select, input[type=checkbox]").forEach((field) => {
    field.addEventListener("change", () => filters.requestSubmit());
  });
})();
