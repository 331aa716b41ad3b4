// Playground image classification: upload a picture, POST /predict as multipart, show the top 5.

import { request } from "./api.js";
import { $, bar, fill, h, setStatus } from "./dom.js";

let previewUrl = null;

function preview(file) {
  if (previewUrl) URL.revokeObjectURL(previewUrl);
  previewUrl = URL.createObjectURL(file);
  fill($("#img-preview"), h("img", { src: previewUrl, alt: file.name }));
}

async function classify(file) {
  const status = $("#img-status");
  const model = $("#img-model").value;
  if (!file || !model) return;
  preview(file);
  fill($("#img-results"));
  setStatus(status, `Classifying with ${model}…`, "info");
  const form = new FormData();
  form.append("model_id", model);
  form.append("file", file, file.name);
  form.append("options", JSON.stringify({ top_k: 5 }));
  const started = performance.now();
  try {
    const body = await (await request("/predict", { method: "POST", form })).json();
    const top = body.predictions[0];
    fill($("#img-results"), top.map((p, rank) => h("li", { dataset: { rank, label: p.label } },
      h("div", { class: "label-row" }, h("span", { class: "label" }, p.label),
        h("span", { class: "score" }, `${(100 * p.score).toFixed(1)} %`)),
      bar(p.score, { kind: rank === 0 ? "top" : "" }))));
    const ms = performance.now() - started;
    setStatus(status, `${body.model_id} · ${ms.toFixed(0)} ms (including a load on first use)`, "info");
  } catch (err) {
    setStatus(status, err.message);
  }
}

export function initImage() {
  const input = $("#img-file");
  input.addEventListener("change", () => classify(input.files[0]));
  const zone = $("#img-drop");
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    if (event.dataTransfer.files.length) classify(event.dataTransfer.files[0]);
  });
  $("#img-model").addEventListener("change", () => {
    if (input.files.length) classify(input.files[0]);
  });
}
