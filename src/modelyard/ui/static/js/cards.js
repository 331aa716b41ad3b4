// The dashboard's cards, drawn from one summary: the memory budget bar, the KV cache of each
// LLM with its pinned prefixes, the models table and the per-tenant usage table.

import { $, bar, fill, h } from "./dom.js";
import { formatAgo, formatBytes, formatCount } from "./stats.js";

const PALETTE = ["#4f6bed", "#e8833a", "#2aa876", "#c94f7c", "#8d6cd9", "#d4b106", "#3aa6c9",
  "#7a8a99"];

function colorOf(summary, id) {
  const index = summary.models.findIndex((m) => m.id === id);
  return PALETTE[(index < 0 ? 0 : index) % PALETTE.length];
}

export function renderMemory(summary) {
  const { budget_bytes: budget, used_bytes: used, reserved_bytes: reserved } = summary.memory;
  const holders = summary.models.filter((m) => m.status === "loaded" && m.memory_bytes > 0)
    .sort((a, b) => b.memory_bytes - a.memory_bytes);
  const segments = holders.map((m) => h("div", {
    class: "seg", title: `${m.id}: ${formatBytes(m.memory_bytes)}`, dataset: { model: m.id },
    style: { width: `${(100 * m.memory_bytes) / budget}%`, background: colorOf(summary, m.id) },
  }));
  if (reserved > 0) {
    segments.push(h("div", { class: "seg reserved", title: `loading: ${formatBytes(reserved)}`,
      style: { width: `${(100 * reserved) / budget}%` } }));
  }
  fill($("#memory-bar"), segments);
  const free = Math.max(0, budget - used - reserved);
  fill($("#memory-legend"),
    holders.map((m) => h("li", {},
      h("span", { class: "chip", style: { background: colorOf(summary, m.id) } }),
      h("span", { class: "legend-name" }, m.id),
      h("span", { class: "legend-value" }, `${formatBytes(m.memory_bytes)} · ${pct(m.memory_bytes, budget)}`))),
    reserved > 0 ? h("li", {}, h("span", { class: "chip reserved" }), h("span", { class: "legend-name" }, "loading"),
      h("span", { class: "legend-value" }, formatBytes(reserved))) : null,
    h("li", {}, h("span", { class: "chip free" }), h("span", { class: "legend-name" }, "free"),
      h("span", { class: "legend-value" }, `${formatBytes(free)} · ${pct(free, budget)}`)));
  $("#memory-total").textContent = `budget ${formatBytes(budget)}`
    + (summary.memory.max_models ? ` · at most ${summary.memory.max_models} models` : "");
}

function pct(part, whole) {
  return whole > 0 ? `${((100 * part) / whole).toFixed(1)} %` : "—";
}

export function renderKv(summary, prefixes) {
  const llms = summary.models.filter((m) => m.engine && !m.engine.error);
  if (!llms.length) {
    fill($("#kv-list"), h("p", { class: "muted" }, "No LLM is loaded."));
    return;
  }
  fill($("#kv-list"), llms.map((m) => {
    const e = m.engine;
    const used = e.num_blocks - e.num_free_blocks;
    const hitRate = e.prefix_cache_queries > 0 ? e.prefix_cache_hits / e.prefix_cache_queries : null;
    return h("div", { class: "kv", dataset: { model: m.id } },
      h("div", { class: "kv-head" }, h("strong", {}, m.id),
        h("span", { class: "muted" }, `${(100 * e.kv_cache_usage).toFixed(1)} % · ${used} / ${e.num_blocks} blocks`)),
      bar(e.kv_cache_usage, { kind: "kv" }),
      h("dl", { class: "facts" },
        fact("running", e.num_running), fact("waiting", e.num_waiting),
        fact("prefix-cache hits", hitRate === null ? "—" : `${(100 * hitRate).toFixed(1)} %`),
        fact("preemptions", e.num_preemptions)),
      pinnedSection(m, e, prefixes));
  }));
}

/** Pinned prefixes of one engine: blocks held against the pin budget, and the pins this key
 * may see (its own tenant's; an admin's: all). */
function pinnedSection(model, engine, prefixes) {
  const budget = prefixes?.models?.[model.id];
  const pins = (prefixes?.data ?? []).filter((p) => p.model === model.id);
  const blocks = budget?.pinned_blocks ?? engine.num_pinned_blocks;
  if (blocks === undefined) return null; // an engine without pinned prefixes
  const count = engine.num_pinned_prefixes ?? pins.length;
  const max = budget?.max_pinned_blocks;
  const label = `${count} pinned prefix${count === 1 ? "" : "es"} · ${blocks}${max ? ` / ${max}` : ""} blocks`
    + (engine.pinned_prefix_hits !== undefined
      ? ` · ${engine.pinned_prefix_hits} hit${engine.pinned_prefix_hits === 1 ? "" : "s"}` : "");
  const now = Date.now() / 1000;
  return h("div", { class: "pins" },
    h("div", { class: "kv-head" }, h("span", {}, "Pinned"), h("span", { class: "muted" }, label)),
    max ? bar(blocks / max, { kind: "pin" }) : null,
    pins.length ? h("table", { class: "table compact" },
      h("thead", {}, h("tr", {}, h("th", {}, "prefix"), h("th", { class: "num" }, "tokens"),
        h("th", { class: "num" }, "blocks"), h("th", { class: "num" }, "hits"),
        h("th", { class: "num" }, "expires in"))),
      h("tbody", {}, pins.map((p) => h("tr", { dataset: { prefix: p.id } },
        h("td", { title: p.owner ? `owner: ${p.owner}` : "" }, p.id),
        h("td", { class: "num" }, formatCount(p.num_tokens)),
        h("td", { class: "num" }, formatCount(p.num_blocks)),
        h("td", { class: "num" }, formatCount(p.hits)),
        h("td", { class: "num" }, formatAgo(p.expires_at - now)))))) : null);
}

function fact(label, value) {
  return h("div", {}, h("dt", {}, label), h("dd", {}, String(value)));
}

export function renderModels(summary) {
  const rows = summary.models.map((m) => {
    const metrics = summary.metrics[m.id] ?? {};
    const badges = [h("span", { class: `badge ${m.status}` }, m.status)];
    if (m.pin) badges.push(h("span", { class: "badge pinned" }, "pinned"));
    return h("tr", { dataset: { model: m.id, status: m.status } },
      h("td", {}, h("span", { class: "chip", style: { background: colorOf(summary, m.id) } }),
        h("span", { class: "model-id" }, m.id),
        m.aliases?.length ? h("div", { class: "muted small" }, m.aliases.join(", ")) : null),
      h("td", {}, m.kind), h("td", {}, m.backend),
      h("td", { class: "status-cell", title: m.last_error ?? "" }, badges),
      h("td", { class: "num" }, m.memory_bytes ? formatBytes(m.memory_bytes) : "—"),
      h("td", { class: "num requests" }, formatCount(metrics.requests ?? 0)),
      h("td", { class: "num" }, m.status === "loaded" ? formatAgo(m.idle_s) : "—"),
      h("td", { class: "num" }, m.status === "loaded" ? String(m.active_leases ?? 0) : "—"));
  });
  fill($("#models-body"), rows);
}

export function renderTenants(summary) {
  const card = $("#tenants-card");
  const tenants = summary.usage?.tenants ?? {};
  card.hidden = !summary.viewer.auth;
  if (card.hidden) return;
  const names = Object.keys(tenants);
  $("#tenants-note").textContent = summary.viewer.admin ? "every tenant (this replica)"
    : "your tenant only (an admin key shows every tenant)";
  fill($("#tenants-body"), names.length ? names.map((name) => {
    const t = tenants[name];
    const rejected = Object.entries(t.rejections ?? {}).map(([k, v]) => `${k} ${v}`).join(", ");
    return h("tr", { dataset: { tenant: name } }, h("td", {}, name),
      h("td", { class: "num" }, formatCount(t.requests)),
      h("td", { class: "num" }, formatCount(t.prompt_tokens)),
      h("td", { class: "num" }, formatCount(t.completion_tokens)),
      h("td", {}, rejected || "—"));
  }) : h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No requests yet.")));
}
