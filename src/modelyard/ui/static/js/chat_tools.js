// Playground chat: structured output and tools. The JSON schema box becomes `response_format`
// (json_schema), the tools box and the tool_choice menu become `tools` / `tool_choice`; each is
// enabled only for a model whose listing says it serves it (`capabilities.structured_output`,
// `capabilities.tools`). The tool calls of an answer (streamed `delta.tool_calls`) are shown in
// its message, each with its name and pretty-printed arguments.

import { $, h } from "./dom.js";

const capabilities = new Map(); // model id -> {chat, tools, structured_output}

/** A box of the form that does not hold what it should (shown, nothing is sent). */
export class FieldError extends Error {}

/** Remember the models' capabilities (a dashboard summary) and apply the chosen model's. */
export function updateCapabilities(summary) {
  for (const model of summary.models) {
    if (model.capabilities) capabilities.set(model.id, model.capabilities);
  }
  applyCapabilities();
}

/** Enable the schema and tool fields the chosen model serves; say which it does not. */
export function applyCapabilities() {
  const model = $("#chat-model").value;
  const caps = capabilities.get(model) ?? {};
  $("#chat-schema").disabled = !caps.structured_output;
  $("#chat-tools").disabled = !caps.tools;
  $("#chat-tool-choice").disabled = !caps.tools;
  const missing = [!caps.structured_output && "a JSON schema", !caps.tools && "tools"].filter(Boolean);
  $("#chat-extras-note").textContent = model && missing.length
    ? `${model} does not take ${missing.join(" or ")}.` : "";
}

function parseBox(box, what) {
  const text = box.value.trim();
  if (box.disabled || !text) return undefined;
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new FieldError(`${what}: not valid JSON (${err.message})`);
  }
}

/** The request fields of the filled, enabled boxes; FieldError when one is not valid JSON. */
export function extraFields() {
  const fields = {};
  const schema = parseBox($("#chat-schema"), "JSON schema");
  if (schema !== undefined) {
    fields.response_format = {
      type: "json_schema", json_schema: { name: "playground", schema, strict: true } };
  }
  const tools = parseBox($("#chat-tools"), "Tools");
  if (tools !== undefined) {
    if (!Array.isArray(tools)) throw new FieldError("Tools: must be a JSON list of tools");
    fields.tools = tools;
    fields.tool_choice = $("#chat-tool-choice").value;
  }
  return fields;
}

/** Arguments as indented JSON (as sent while they are still incomplete or not JSON). */
function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

/** The tool calls of one answer, assembled from streamed `delta.tool_calls` entries and shown
 * in the answer's message as they grow. */
export class ToolCalls {
  constructor(msg) {
    this.msg = msg; // the assistant message element
    this.calls = []; // by the entries' index: {id, name, arguments, el}
  }

  get length() {
    return this.calls.filter(Boolean).length;
  }

  /** Merge one event's `delta.tool_calls` entries. */
  add(entries) {
    for (const entry of entries) {
      const index = entry.index ?? this.calls.length;
      this.calls[index] ??= this.create(index);
      const call = this.calls[index];
      if (entry.id) call.id = entry.id;
      call.name += entry.function?.name ?? "";
      call.arguments += entry.function?.arguments ?? "";
      call.el.dataset.name = call.name;
      call.el.querySelector(".tool-name").textContent = call.name;
      call.el.querySelector(".tool-args").textContent = pretty(call.arguments);
    }
  }

  create(index) {
    const el = h("div", { class: "tool-call", dataset: { index: String(index) } },
      h("div", { class: "tool-head" }, h("span", { class: "badge" }, "tool call"), " ",
        h("code", { class: "tool-name" })),
      h("pre", { class: "tool-args" }));
    this.msg.append(el);
    return { id: `call-${index}`, name: "", arguments: "", el };
  }

  /** The `tool_calls` of the assistant message that goes back into the conversation. */
  asMessageField() {
    return this.calls.filter(Boolean).map((c) => ({
      id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
  }
}

export function initChatTools() {
  $("#chat-model").addEventListener("change", applyCapabilities);
  applyCapabilities();
}
