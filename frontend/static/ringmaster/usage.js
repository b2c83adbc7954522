// GPU-hours per day and group, drawn with the vendored uPlot. The numbers are also in the
// tables under the chart; without JavaScript (or uPlot) the page still says everything.
(function () {
  "use strict";
  var holder = document.getElementById("usage-chart");
  var source = document.getElementById("usage-data");
  if (!holder || !source || typeof uPlot === "undefined") return;
  var data = JSON.parse(source.textContent);
  var names = Object.keys(data.series);
  if (!data.days.length || !names.length) {
    holder.textContent = "No GPU time in these days.";
    holder.className += " empty";
    return;
  }
  var palette = ["#2f5bd3", "#1f8a4c", "#b7791f", "#c2352b", "#7a4fd3", "#178a8a", "#8a6d17", "#555"];
  var xs = data.days.map(function (day) { return Date.parse(day + "T12:00:00Z") / 1000; });
  var columns = [xs].concat(names.map(function (name) { return data.series[name]; }));
  var series = [{}].concat(names.map(function (name, i) {
    return {
      label: name,
      stroke: palette[i % palette.length],
      width: 2,
      points: { show: true, size: 5 },
      value: function (u, v) { return v == null ? "" : v.toFixed(1); },
    };
  }));
  var options = {
    width: Math.max(holder.clientWidth, 320),
    height: 260,
    series: series,
    scales: { x: { time: true } },
    axes: [{}, { label: holder.dataset.unit || "", size: 60 }],
  };
  var plot = new uPlot(options, columns, holder);
  window.addEventListener("resize", function () {
    plot.setSize({ width: Math.max(holder.clientWidth, 320), height: 260 });
  });
})();
