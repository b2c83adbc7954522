// Every time on every page in one zone: the viewer's. The server writes each time as
// <time datetime="ISO 8601 with offset" data-format="...">fallback</time> (the fallback, in the
// portal's zone and labelled, is what a page without JavaScript shows); this module rewrites each
// in the browser's zone, and pages that insert times later (live updates) make them with
// RingmasterTime.element() or call RingmasterTime.apply(node), so a time reads the same before and
// after a live update. Elements with data-tz-name show the zone's name.
//   data-format="datetime"  2026-11-25 11:45:02 GMT+5:30
//                "time"      11:45:02
//                "auto"      11:45:02 today, else 2026-11-24 11:45
(function () {
  "use strict";
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
  const pad = (n) => String(n).padStart(2, "0");

  const zoneFormat = new Intl.DateTimeFormat("en-US", {timeZoneName: "short"});

  function zoneAbbreviation(date) {          // EST, EDT, GMT+5:30: the offset of that very moment
    const part = zoneFormat.formatToParts(date).find((p) => p.type === "timeZoneName");
    return part ? part.value : zone;
  }

  function day(date) {
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}`;
  }

  function clock(date, seconds) {
    return `${pad(date.getHours())}:${pad(date.getMinutes())}` + (seconds ? `:${pad(date.getSeconds())}` : "");
  }

  function text(iso, format) {
    const date = new Date(iso);
    if (Number.isNaN(date.getTime())) return "";
    if (format === "time") return clock(date, true);
    if (format === "auto") return day(date) === day(new Date()) ? clock(date, true) : `${day(date)} ${clock(date, false)}`;
    return `${day(date)} ${clock(date, true)} ${zoneAbbreviation(date)}`;
  }

  function full(iso) {
    const date = new Date(iso);
    return `${day(date)} ${clock(date, true)} ${zoneAbbreviation(date)} (${zone})`;
  }

  function format(element) {
    const iso = element.getAttribute("datetime");
    if (!iso || !element.dataset.format) return;
    element.textContent = text(iso, element.dataset.format);
    element.title = full(iso);
    element.dataset.zone = zone;
  }

  function apply(root) {
    const scope = root || document;
    if (scope.matches && scope.matches("time[data-format]")) format(scope);
    scope.querySelectorAll("time[data-format]").forEach(format);
    scope.querySelectorAll("[data-tz-name]").forEach((el) => { el.textContent = zone; });
  }

  function element(iso, fmt) {
    const time = document.createElement("time");
    time.setAttribute("datetime", iso);
    time.dataset.format = fmt || "datetime";
    format(time);
    return time;
  }

  window.RingmasterTime = {zone, text, element, apply};
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", () => apply());
  else apply();
})();
