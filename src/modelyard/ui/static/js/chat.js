// Playground chat: /v1/chat/completions with stream: true, tokens appended as they arrive;
// a JSON schema and tools from the side panel (chat_tools.js), tool calls shown as they stream.

import { streamEvents } from "./api.js";
import { extraFields, FieldError, initChatTools, ToolCalls } from "./chat_tools.js";
import { $, h, setStatus } from "./dom.js";
import { formatSeconds } from "./stats.js";

const conversation = []; // [{role, content[, tool_calls]}] sent with every turn
let controller = null; // AbortController of the stream in flight

/** The sampling fields of the form: only those the user filled in are sent. */
function samplingParams() {
  const params = {};
  for (const input of document.querySelectorAll("#chat-params [data-param]")) {
    if (input.value.trim() === "") continue;
    const value = Number(input.value);
    params[input.dataset.param] = input.dataset.int !== undefined ? Math.round(value) : value;
  }
  return params;
}

function addMessage(role, text) {
  const content = h("div", { class: "content" }, text);
  const msg = h("div", { class: `msg ${role}` }, h("div", { class: "role" }, role), content);
  $("#chat-log").append(msg);
  $("#chat-log").scrollTop = $("#chat-log").scrollHeight;
  return { msg, content };
}

async function send(event) {
  event.preventDefault();
  const input = $("#chat-input");
  const text = input.value.trim();
  const model = $("#chat-model").value;
  if (!text || controller || !model) return;
  let extras;
  try {
    extras = extraFields();
  } catch (err) {
    if (!(err instanceof FieldError)) throw err;
    setStatus($("#chat-status"), err.message);
    return; // nothing sent; the question stays in the box
  }
  input.value = "";
  const system = $("#chat-system").value.trim();
  conversation.push({ role: "user", content: text });
  addMessage("user", text);
  const { msg, content } = addMessage("assistant", "");
  msg.classList.add("streaming");
  const toolCalls = new ToolCalls(msg);
  const messages = system ? [{ role: "system", content: system }, ...conversation] : conversation;
  const body = { model, messages, stream: true, stream_options: { include_usage: true },
    ...samplingParams(), ...extras };
  controller = new AbortController();
  setBusy(true);
  setStatus($("#chat-status"), "");
  const started = performance.now();
  let firstToken = null;
  let chunks = 0;
  let usage = null;
  try {
    await streamEvents("/v1/chat/completions", body, (event) => {
      const delta = event.choices?.[0]?.delta ?? {};
      if (delta.content || delta.tool_calls) {
        firstToken ??= performance.now();
        chunks += 1;
        content.textContent += delta.content ?? "";
        if (delta.tool_calls) toolCalls.add(delta.tool_calls);
        msg.dataset.chunks = String(chunks);
        $("#chat-log").scrollTop = $("#chat-log").scrollHeight;
      }
      if (event.usage) usage = { ...event.usage, server: event.modelyard };
    }, { signal: controller.signal });
    msg.dataset.done = "true";
  } catch (err) {
    msg.dataset.done = "error";
    if (err.name !== "AbortError") setStatus($("#chat-status"), err.message);
  } finally {
    msg.classList.remove("streaming");
    if (chunks === 0 && msg.dataset.done === "error") {
      conversation.pop(); // refused (a 400) or stopped before any output: the turn is dropped
    } else {
      const answer = { role: "assistant", content: content.textContent };
      if (toolCalls.length) answer.tool_calls = toolCalls.asMessageField();
      conversation.push(answer);
    }
    showStats(started, firstToken, usage);
    controller = null;
    setBusy(false);
  }
}

function showStats(started, firstToken, usage) {
  const elapsed = (performance.now() - started) / 1000;
  const ttft = firstToken === null ? null : (firstToken - started) / 1000;
  const parts = [`TTFT ${formatSeconds(ttft)} (browser)`];
  if (usage) {
    const decode = ttft === null ? elapsed : elapsed - ttft;
    const rate = usage.completion_tokens > 1 && decode > 0 ? (usage.completion_tokens - 1) / decode : null;
    parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
    if (rate !== null) parts.push(`${rate.toFixed(1)} tok/s`);
    if (usage.server) {
      parts.push(`server TTFT ${formatSeconds(usage.server.ttft)}, queue ${formatSeconds(usage.server.queue_time)}`);
      if (usage.server.cached_tokens) parts.push(`${usage.server.cached_tokens} cached`);
    }
  }
  $("#chat-stats").textContent = parts.join(" · ");
}

function setBusy(busy) {
  $("#chat-send").hidden = busy;
  $("#chat-stop").hidden = !busy;
}

export function initChat() {
  initChatTools();
  $("#chat-form").addEventListener("submit", send);
  $("#chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) send(event);
  });
  $("#chat-stop").addEventListener("click", () => controller?.abort());
  $("#chat-clear").addEventListener("click", () => {
    controller?.abort();
    conversation.length = 0;
    $("#chat-log").replaceChildren();
    $("#chat-stats").textContent = "";
  });
}
