// Playground agent: one question to the knowledge agent, its answer next to the chunks it
// retrieved. The whole call is askAgent(); the rest only draws its result.

import { postJSON } from "./api.js";
import { $, fill, h, setStatus } from "./dom.js";
import { formatSeconds } from "./stats.js";

export const AGENT_PATH = "/v1/agent/ask";

/**
 * One question to the knowledge agent: POST /v1/agent/ask {question, mode, top_k, model?} ->
 * {answer, mode, query?, searches?: [{query, k, chunks, error}], chunks: [{chunk_id?, source,
 * text, score}], calls: [{step, seconds}], e2e_s?}. The only place the console talks to the
 * agent.
 */
export async function askAgent(question, { mode = "rag", topK = 4, model } = {}) {
  return postJSON(AGENT_PATH, { question, mode, top_k: topK, model });
}

/** "rag · 4 model calls (plan 0.8 s, retrieve 0.1 s, …) · 3.2 s · query: …" (with tools:
 * "searched: …", the queries the model wrote) */
function describeRun(result, mode) {
  const parts = [result.mode ?? mode];
  const calls = Array.isArray(result.calls) ? result.calls : [];
  if (calls.length) {
    const steps = calls.map((c) => `${c.step} ${formatSeconds(c.seconds)}`).join(", ");
    parts.push(`${calls.length} model call${calls.length === 1 ? "" : "s"} (${steps})`);
  }
  if (result.e2e_s !== undefined) parts.push(formatSeconds(result.e2e_s));
  const searched = (Array.isArray(result.searches) ? result.searches : []).filter((s) => s.query);
  if (searched.length) parts.push(`searched: ${searched.map((s) => s.query).join("; ")}`);
  else if (result.query) parts.push(`query: ${result.query}`);
  return parts.join(" · ");
}

const NO_CHUNKS = {
  cag: "CAG retrieves nothing: the whole knowledge is the pinned prefix the answer reuses.",
  none: "No context: the model answered alone.",
};

function renderChunks(chunks, mode) {
  fill($("#agent-chunks"), chunks.length ? chunks.map((c, i) => h("li", { dataset: { rank: i } },
    h("div", { class: "chunk-head" },
      h("span", { class: "chunk-source" }, c.chunk_id ?? c.source ?? `chunk ${i + 1}`),
      c.score === undefined ? null : h("span", { class: "score" }, Number(c.score).toFixed(3))),
    h("p", { class: "chunk-text" }, c.text))) : h("li", { class: "muted" }, NO_CHUNKS[mode] ?? "No chunks retrieved."));
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
    renderChunks(result.chunks ?? [], result.mode ?? mode);
    setStatus(status, describeRun(result, mode), "info");
  } catch (err) {
    setStatus(status, err.message); // e.g. no index yet: the server says which command makes one
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
