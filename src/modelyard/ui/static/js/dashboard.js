// The dashboard: polls GET /ui/api/summary (and GET /v1/prefixes when the server has it),
// keeps the last few minutes of snapshots and draws the live tiles: request rate, TTFT, ITL
// and tokens/s, windowed from the cumulative snapshots. The cards below are in cards.js.

import { getJSON } from "./api.js";
import { renderKv, renderMemory, renderModels, renderTenants } from "./cards.js";
import { $, fill, h, setStatus, svg } from "./dom.js";
import {
  formatBytes, formatCount, formatRate, formatSeconds, histDelta, histSum, mean, quantile,
} from "./stats.js";

const POLL_MS = 2000;
const MAX_POLL_MS = 32000;
const WINDOW_S = 30; // rates and latency quantiles are over the last 30 s
const HISTORY = 90; // snapshots kept (3 min at 2 s): the sparklines

const history = []; // [{t, summary}] oldest first
const listeners = [];
let timer = null;
let delay = POLL_MS;
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
    const ok = document.hidden || $("#key-dialog").open || await poll();
    // each poll is a request against the key's rate limit: back off while refused (429)
    delay = ok ? POLL_MS : Math.min(MAX_POLL_MS, delay * 2);
    timer = setTimeout(tick, delay);
  };
  tick();
}

/** Fetch one summary now (also after the key changed); false when the server said 429. */
export async function poll() {
  const status = $("#dash-status");
  try {
    const summary = await getJSON("/ui/api/summary");
    if (summary.features?.prefixes && summary.models.some((m) => m.engine && !m.engine.error)) {
      prefixes = await pinnedPrefixes();
    }
    history.push({ t: summary.time, summary });
    if (history.length > HISTORY) history.shift();
    setStatus(status, summary.ready ? "" : "Starting: the preloaded models are loading…", "info");
    render(summary);
    document.body.dataset.live = "on";
    for (const listener of listeners) listener(summary);
  } catch (err) {
    document.body.dataset.live = "off";
    setStatus(status, err.status === 401 ? "An API key is needed to see the dashboard."
      : `Could not load the summary: ${err.message}`);
    return err.status !== 429;
  }
  return true;
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
  // a tenant's view has no memory figures nor engine state: those cards are for admins
  $("#server-cards").hidden = !summary.memory;
  $("#tenant-note").hidden = Boolean(summary.memory);
  if (summary.memory) {
    renderMemory(summary);
    renderKv(summary, prefixes);
  }
  renderModels(summary);
  renderTenants(summary);
}

function renderViewer(viewer) {
  const text = !viewer.auth ? "auth off" : `${viewer.tenant}${viewer.admin ? " · admin" : ""}`;
  $("#viewer").textContent = text;
}

function tile(id, label, value, sub, spark) {
  const el = $(`#${id}`);
  el.classList.remove("stale");
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
  if (memory) latencyTile("tile-itl", "ITL mean", mean, w.itl, current.itl);
  else tile("tile-itl", "ITL mean", "—", "shown to admins"); // ITL has no tenant label
  tile("tile-tokens", "Tokens / s", formatRate(w.tokensPerS),
    `${formatCount(current.generation)} generated`);
  if (memory) {
    tile("tile-inflight", "Running / waiting", `${running} / ${waiting}`,
      `${llms.length} LLM engine${llms.length === 1 ? "" : "s"}`);
  } else {
    tile("tile-inflight", "Running / waiting", "—", "shown to admins");
  }
  tile("tile-loaded", "Models loaded", `${loaded} / ${models.length}`, memory
    ? `${formatBytes(memory.used_bytes)} of ${formatBytes(memory.budget_bytes)}` : "that you may use");
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
