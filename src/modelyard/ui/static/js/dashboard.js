// The dashboard: polls GET /ui/api/summary and draws the catalog, memory, KV cache, live
// request rate / TTFT / ITL (windowed from cumulative snapshots) and per-tenant usage.

import { getJSON } from "./api.js";
import { $, bar, fill, h, setStatus, svg } from "./dom.js";
import {
  formatAgo, formatBytes, formatCount, formatRate, formatSeconds, histDelta, histSum, mean,
  quantile,
} from "./stats.js";

const POLL_MS = 2000;
const WINDOW_S = 30; // rates and latency quantiles are over the last 30 s
const HISTORY = 90; // snapshots kept (3 min at 2 s): the sparklines
const PALETTE = ["#4f6bed", "#e8833a", "#2aa876", "#c94f7c", "#8d6cd9", "#d4b106", "#3aa6c9",
  "#7a8a99"];

const history = []; // [{t, summary}] oldest first
const listeners = [];
let timer = null;
let prefixes = null; // the last GET /v1/prefixes answer; null while unknown

/** Called with every new summary (the playground fills its model menus from it). */
export function onSummary(listener) {
  listeners.push(listener);
}

export function latestSummary() {
  return history.length ? history[history.length - 1].summary : null;
}

export function startDashboard() {
  if (timer !== null) return;
  const tick = async () => {
    // nothing to show while hidden, nor while the key dialog waits for a key
    if (!document.hidden && !$("#key-dialog").open) await poll();
    timer = setTimeout(tick, POLL_MS);
  };
  tick();
}

/** Fetch one summary now (also after the key changed). */
export async function poll() {
  const status = $("#dash-status");
  try {
    const summary = await getJSON("/ui/api/summary");
    if (summary.features?.prefixes && summary.models.some((m) => m.engine && !m.engine.error)) {
      prefixes = await pinnedPrefixes();
    }
    history.push({ t: summary.time, summary });
    if (history.length > HISTORY) history.shift();
    setStatus(status, "");
    render(summary);
    document.body.dataset.live = "on";
    for (const listener of listeners) listener(summary);
  } catch (err) {
    document.body.dataset.live = "off";
    setStatus(status, err.status === 401 ? "An API key is needed to see the dashboard."
      : `Could not load the summary: ${err.message}`);
  }
}

/** The pins this key may see (GET /v1/prefixes), or null when they cannot be listed. */
async function pinnedPrefixes() {
  try {
    return await getJSON("/v1/prefixes");
  } catch {
    return null;
  }
}

function snapshotBefore(seconds) {
  const now = history[history.length - 1];
  let base = null;
  for (const entry of history) {
    if (entry !== now && now.t - entry.t <= seconds + 0.5) {
      base = entry;
      break;
    }
  }
  return base;
}

function totals(summary) {
  const metrics = Object.values(summary.metrics);
  const sum = (key) => metrics.reduce((acc, m) => acc + (m[key] ?? 0), 0);
  return {
    requests: sum("requests"),
    generation: sum("generation_tokens"),
    ttft: histSum(metrics.map((m) => m.ttft)),
    itl: histSum(metrics.map((m) => m.itl)),
  };
}

/** Live values over the window: {rate, tokensPerS, ttft, itl, total...}. */
export function windowed() {
  const now = history[history.length - 1];
  const base = snapshotBefore(WINDOW_S);
  const current = totals(now.summary);
  if (!base) return { current, rate: null, tokensPerS: null, ttft: null, itl: null };
  const before = totals(base.summary);
  const dt = Math.max(1e-3, now.t - base.t);
  return {
    current,
    rate: Math.max(0, current.requests - before.requests) / dt,
    tokensPerS: Math.max(0, current.generation - before.generation) / dt,
    ttft: histDelta(current.ttft, before.ttft),
    itl: histDelta(current.itl, before.itl),
  };
}

function render(summary) {
  renderViewer(summary.viewer);
  renderTiles(summary);
  renderMemory(summary);
  renderKv(summary);
  renderModels(summary);
  renderTenants(summary);
}

function renderViewer(viewer) {
  const text = !viewer.auth ? "auth off" : `${viewer.tenant}${viewer.admin ? " · admin" : ""}`;
  $("#viewer").textContent = text;
}

function tile(id, label, value, sub, spark) {
  const el = $(`#${id}`);
  fill(el, h("div", { class: "tile-label" }, label), h("div", { class: "tile-value" }, value),
    h("div", { class: "tile-sub" }, sub), spark ?? "");
}

function renderTiles(summary) {
  const w = windowed();
  const { current } = w;
  const models = summary.models;
  const llms = models.filter((m) => m.engine && !m.engine.error);
  const running = llms.reduce((acc, m) => acc + m.engine.num_running, 0);
  const waiting = llms.reduce((acc, m) => acc + m.engine.num_waiting, 0);
  const loaded = models.filter((m) => m.status === "loaded").length;
  const memory = summary.memory;

  tile("tile-requests", "Requests / s", formatRate(w.rate),
    `${formatCount(current.requests)} total`, sparkline(series(requestRate)));
  $("#tile-requests").dataset.total = String(current.requests);
  latencyTile("tile-ttft", "TTFT p50", (hist) => quantile(0.5, hist), w.ttft, current.ttft,
    sparkline(series(ttftMean)));
  latencyTile("tile-itl", "ITL mean", mean, w.itl, current.itl);
  tile("tile-tokens", "Tokens / s", formatRate(w.tokensPerS),
    `${formatCount(current.generation)} generated`);
  tile("tile-inflight", "Running / waiting", `${running} / ${waiting}`,
    `${llms.length} LLM engine${llms.length === 1 ? "" : "s"}`);
  tile("tile-loaded", "Models loaded", `${loaded} / ${models.length}`,
    `${formatBytes(memory.used_bytes)} of ${formatBytes(memory.budget_bytes)}`);
  $("#window-note").textContent = `rates and quantiles over the last ${WINDOW_S} s`;
}

/** A latency tile: `stat` over the window, p95 beside it; with no request in the window, the
 * all-time values, greyed. */
function latencyTile(id, label, stat, recent, allTime, spark) {
  const idle = !recent || recent.count <= 0;
  const hist = idle ? allTime : recent;
  const when = idle ? (allTime?.count ? "idle, all-time" : "no requests yet") : `last ${WINDOW_S} s`;
  tile(id, label, formatSeconds(stat(hist)), `p95 ${formatSeconds(quantile(0.95, hist))} · ${when}`,
    spark);
  $(`#${id}`).classList.toggle("stale", idle);
}

function requestRate(a, b) {
  return Math.max(0, totals(b).requests - totals(a).requests) / Math.max(1e-3, b.t - a.t);
}

function ttftMean(a, b) {
  return mean(histDelta(totals(b).ttft, totals(a).ttft));
}

/** One value per pair of consecutive snapshots: fn(summary a, summary b) with t attached. */
function series(fn) {
  const out = [];
  for (let i = 1; i < history.length; i += 1) {
    const a = { ...history[i - 1].summary, t: history[i - 1].t };
    const b = { ...history[i].summary, t: history[i].t };
    out.push(fn(a, b));
  }
  return out;
}

function sparkline(values) {
  const width = 160;
  const height = 28;
  const points = values.map((v) => (v === null || !Number.isFinite(v) ? 0 : v));
  const max = Math.max(...points, 1e-9);
  const step = width / Math.max(1, HISTORY - 1);
  const offset = width - step * (points.length - 1);
  const coords = points.map((v, i) =>
    `${(offset + i * step).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`);
  return svg("svg", { class: "spark", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none" },
    svg("polyline", { points: coords.join(" ") }));
}

function colorOf(summary, id) {
  const index = summary.models.findIndex((m) => m.id === id);
  return PALETTE[(index < 0 ? 0 : index) % PALETTE.length];
}

function renderMemory(summary) {
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

function renderKv(summary) {
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
      pinnedSection(m, e));
  }));
}

/** Pinned prefixes of one engine: blocks held against the pin budget, and the pins this key
 * may see (its own tenant's; an admin's: all). */
function pinnedSection(model, engine) {
  const budget = prefixes?.models?.[model.id];
  const pins = (prefixes?.data ?? []).filter((p) => p.model === model.id);
  const blocks = budget?.pinned_blocks ?? engine.num_pinned_blocks;
  if (blocks === undefined) return null; // an engine without pinned prefixes
  const count = engine.num_pinned_prefixes ?? pins.length;
  const max = budget?.max_pinned_blocks;
  const label = `${count} pinned prefix${count === 1 ? "" : "es"} · ${blocks}${max ? ` / ${max}` : ""} blocks`
    + (engine.pinned_prefix_hits !== undefined ? ` · ${engine.pinned_prefix_hits} hits` : "");
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

function renderModels(summary) {
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

function renderTenants(summary) {
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
