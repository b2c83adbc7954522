// Rank tabs on the job page: show one rank's lines, or all.
(function () {
  const tabs = document.getElementById("rank-tabs");
  const log = document.getElementById("log");
  if (!tabs || !log) return;
  tabs.addEventListener("click", (event) => {
    const tab = event.target.closest(".tab");
    if (!tab) return;
    tabs.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t === tab));
    const rank = tab.dataset.rank;
    log.querySelectorAll(".line").forEach((line) => {
      line.hidden = rank !== "all" && line.dataset.rank !== rank;
    });
  });
})();
