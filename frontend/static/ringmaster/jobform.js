// The job form: the GPU field's maximum follows the chosen backend and group (data-limits,
// computed by the server: what the backend holds, the quota, the site's cap), the chosen image's
// and script's descriptions follow their selects, and "replace" drops an upload kept from an
// earlier try of the form.
(function () {
  "use strict";
  const form = document.getElementById("job-form");
  if (!form) return;

  const gpus = form.querySelector("#id_gpus");
  const backend = form.querySelector("#id_backend");
  const group = form.querySelector("#id_group");
  const limitNote = document.getElementById("gpus-limit");
  let limits = {};
  try { limits = JSON.parse(gpus.dataset.limits || "{}"); } catch (e) { limits = {}; }

  function followLimit() {
    const byGroup = limits[backend ? backend.value : ""] || {};
    const [most, text] = byGroup[group ? group.value : ""] || [null, ""];
    if (most === null || most === undefined) gpus.removeAttribute("max");
    else gpus.max = String(most);
    if (limitNote) limitNote.textContent = text;
  }
  if (gpus && backend) {
    backend.addEventListener("change", followLimit);
    if (group) group.addEventListener("change", followLimit);
  }

  for (const select of form.querySelectorAll("select[data-descriptions]")) {
    const hint = document.getElementById(select.id + "-description");
    let descriptions = {};
    try { descriptions = JSON.parse(select.dataset.descriptions); } catch (e) { descriptions = {}; }
    if (!hint) continue;
    select.addEventListener("change", () => { hint.textContent = descriptions[select.value] || ""; });
  }

  // While an earlier upload is kept the file input stays out of the way; "replace" brings it back.
  const replace = document.getElementById("replace-upload");
  const file = form.querySelector("#id_script_file");
  if (replace && file) {
    file.hidden = true;
    replace.addEventListener("click", (event) => {
      event.preventDefault();
      form.querySelector("#id_uploaded_script").value = "";
      document.getElementById("kept-upload").remove();
      file.hidden = false;
      file.focus();
    });
  }
})();
