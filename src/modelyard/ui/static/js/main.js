// The console's entry point: tabs, the API-key dialog, model menus, and the dashboard poller.

import { apiKey, setApiKey, setAuthRequiredHandler } from "./api.js";
import { initAgent, setAgentAvailable } from "./agent.js";
import { initChat } from "./chat.js";
import { updateCapabilities } from "./chat_tools.js";
import { onSummary, poll, startDashboard } from "./dashboard.js";
import { $, $$, h } from "./dom.js";
import { initEmbeddings } from "./embeddings.js";
import { initImage } from "./image.js";

// Which model kinds each playground menu offers.
const MENUS = {
  "#chat-model": ["chat"],
  "#agent-model": ["chat"],
  "#emb-model": ["embedding"],
  "#img-model": ["image-classification"],
};

function showView(name) {
  for (const tab of $$(".tab")) tab.setAttribute("aria-selected", String(tab.dataset.view === name));
  for (const view of $$(".view")) view.hidden = view.id !== `view-${name}`;
  if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
}

function showPanel(name) {
  for (const tab of $$(".subtab")) tab.setAttribute("aria-selected", String(tab.dataset.panel === name));
  for (const panel of $$(".panel")) panel.hidden = panel.id !== `panel-${name}`;
}

function fillMenus(summary) {
  for (const [selector, kinds] of Object.entries(MENUS)) {
    const select = $(selector);
    const models = summary.models.filter((m) => kinds.includes(m.kind));
    const ids = models.map((m) => m.id);
    const current = [...select.options].map((o) => o.value).filter(Boolean);
    if (ids.join() === current.join()) continue;
    const chosen = select.value;
    select.replaceChildren(...models.map((m) => h("option", { value: m.id }, m.id)));
    if (select.dataset.optional !== undefined) select.prepend(h("option", { value: "" }, "agent default"));
    if (ids.includes(chosen) || (chosen === "" && select.dataset.optional !== undefined)) select.value = chosen;
  }
}

function openKeyDialog(message = "") {
  const dialog = $("#key-dialog");
  $("#key-message").textContent = message;
  if (dialog.open) return; // never overwrite what is being typed
  $("#key-input").value = apiKey();
  dialog.showModal();
  $("#key-input").focus();
}

function initKeyDialog() {
  $("#key-button").addEventListener("click", () => openKeyDialog());
  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    setApiKey($("#key-input").value.trim(), $("#key-remember").checked);
    $("#key-dialog").close();
    poll();
  });
  $("#key-clear").addEventListener("click", () => {
    setApiKey("");
    $("#key-dialog").close();
    poll();
  });
  $("#key-cancel").addEventListener("click", () => $("#key-dialog").close());
  setAuthRequiredHandler((error) => openKeyDialog(apiKey()
    ? `The server refused this key: ${error.message}` : "This server needs an API key."));
}

function init() {
  for (const tab of $$(".tab")) tab.addEventListener("click", () => showView(tab.dataset.view));
  for (const tab of $$(".subtab")) tab.addEventListener("click", () => showPanel(tab.dataset.panel));
  showView(location.hash === "#playground" ? "playground" : "dashboard");
  showPanel("chat");
  initKeyDialog();
  initChat();
  initEmbeddings();
  initImage();
  initAgent();
  onSummary(fillMenus);
  onSummary(updateCapabilities); // after the menus: the chosen model's capabilities
  onSummary((summary) => setAgentAvailable(Boolean(summary.features?.agent)));
  startDashboard();
}

init();
