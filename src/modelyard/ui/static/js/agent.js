// Playground agent: one question to the knowledge agent, its answer next to the chunks it
// retrieved. The whole call is askAgent(); the rest only draws its result.

import { ApiError, postJSON } from "./api.js";
import { $, fill, h, setStatus } from "./dom.js";

export const AGENT_PATH = "/v1/agent/ask";

/** {answer, chunks: [{text, source, score}], mode, calls, timings} for one question. */
export async function askAgent(question, { mode = "rag", topK = 4, model } = {}) {
  return postJSON(AGENT_PATH, { question, mode, top_k: topK, model });
}

function renderChunks(chunks) {
  fill($("#agent-chunks"), chunks.length ? chunks.map((c, i) => h("li", { dataset: { rank: i } },
    h("div", { class: "chunk-head" }, h("span", { class: "chunk-source" }, c.source ?? `chunk ${i + 1}`),
      c.score === undefined ? null : h("span", { class: "score" }, Number(c.score).toFixed(3))),
    h("p", { class: "chunk-text" }, c.text))) : h("li", { class: "muted" }, "No chunks retrieved."));
}

async function ask(event) {
  event.preventDefault();
  const question = $("#agent-question").value.trim();
  if (!question) return;
  const status = $("#agent-status");
  setStatus(status, "Thinking…", "info");
  $("#agent-ask").disabled = true;
  fill($("#agent-answer"));
  fill($("#agent-chunks"));
  try {
    const mode = $("#agent-mode").value;
    const result = await askAgent(question, { mode, model: $("#agent-model").value || undefined });
    $("#agent-answer").textContent = result.answer;
    renderChunks(result.chunks ?? []);
    const calls = result.calls === undefined ? "" : ` · ${result.calls} model calls`;
    setStatus(status, `${result.mode ?? mode}${calls}`, "info");
  } catch (err) {
    const missing = err instanceof ApiError && err.status === 404;
    setStatus(status, missing ? "This server has no knowledge agent." : err.message);
  } finally {
    $("#agent-ask").disabled = false;
  }
}

export function initAgent() {
  $("#agent-form").addEventListener("submit", ask);
}

/** Enable the question box when the server has the agent (summary.features.agent). */
export function setAgentAvailable(available) {
  $("#agent-ask").disabled = !available;
  $("#agent-question").disabled = !available;
  if (!available) setStatus($("#agent-status"), "This server has no knowledge agent.", "info");
  else if ($("#agent-status").textContent === "This server has no knowledge agent.") {
    setStatus($("#agent-status"), "");
  }
}
