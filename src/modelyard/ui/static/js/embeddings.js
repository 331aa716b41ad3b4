// Playground embeddings: embed a few sentences with /v1/embeddings and show their cosine
// similarity matrix.

import { postJSON } from "./api.js";
import { $, fill, h, setStatus } from "./dom.js";

export function cosine(a, b) {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i += 1) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return na > 0 && nb > 0 ? dot / Math.sqrt(na * nb) : 0;
}

/** A cell colour from white (≤ 0) to the accent (1). */
function heat(value) {
  const t = Math.max(0, Math.min(1, value));
  const mix = (from, to) => Math.round(from + (to - from) * t);
  return `rgb(${mix(247, 79)}, ${mix(248, 107)}, ${mix(252, 237)})`;
}

function renderMatrix(sentences, vectors) {
  const n = sentences.length;
  const head = h("tr", {}, h("th", {}, ""), sentences.map((_, j) => h("th", { scope: "col" }, String(j + 1))));
  const rows = sentences.map((sentence, i) => h("tr", {},
    h("th", { scope: "row", title: sentence }, `${i + 1}. ${sentence}`),
    vectors.map((_, j) => {
      const value = cosine(vectors[i], vectors[j]);
      return h("td", { dataset: { i, j, value: value.toFixed(6) },
        class: value > 0.6 ? "hot" : "", style: { background: heat(value) } }, value.toFixed(2));
    })));
  fill($("#emb-matrix"), h("thead", {}, head), h("tbody", {}, rows));
  $("#emb-meta").textContent = `${n} sentences · ${vectors[0]?.length ?? 0} dimensions · cosine similarity`;
}

async function run(event) {
  event.preventDefault();
  const sentences = $("#emb-input").value.split("\n").map((s) => s.trim()).filter(Boolean);
  const status = $("#emb-status");
  if (sentences.length < 2) {
    setStatus(status, "Write at least two sentences, one per line.");
    return;
  }
  setStatus(status, "Embedding…", "info");
  $("#emb-run").disabled = true;
  try {
    const body = await postJSON("/v1/embeddings", { model: $("#emb-model").value, input: sentences });
    const vectors = [...body.data].sort((a, b) => a.index - b.index).map((d) => d.embedding);
    renderMatrix(sentences, vectors);
    setStatus(status, "");
  } catch (err) {
    setStatus(status, err.message);
  } finally {
    $("#emb-run").disabled = false;
  }
}

export function initEmbeddings() {
  $("#emb-form").addEventListener("submit", run);
}
