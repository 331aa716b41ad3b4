// The console's only door to the server: every data call goes through apiFetch, which adds the
// API key (when one is set) as a Bearer token and turns error envelopes into ApiError.

const KEY_NAME = "modelyard.apiKey";
let onAuthRequired = () => {};

export class ApiError extends Error {
  constructor(status, message, body = null) {
    super(message);
    this.status = status; // HTTP status (0: the network failed)
    this.body = body; // the parsed error envelope, when there was one
  }
}

/** The key in use: this tab's (sessionStorage) first, then a remembered one (localStorage). */
export function apiKey() {
  return sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME) || "";
}

export function setApiKey(key, remember = false) {
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
  if (!key) return;
  (remember ? localStorage : sessionStorage).setItem(KEY_NAME, key);
}

/** Called with the ApiError whenever the server answers 401 (the key is missing or wrong). */
export function setAuthRequiredHandler(handler) {
  onAuthRequired = handler;
}

function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, authorization: `Bearer ${key}` } : { ...extra };
}

/** The message of an OpenAI ({"error": {"message"}}), KServe ({"error": "..."}) or FastAPI
 * ({"detail": ...}) error envelope. */
export function errorMessage(body, fallback) {
  if (!body || typeof body !== "object") return fallback;
  const error = body.error ?? body.detail;
  if (typeof error === "string") return error;
  if (error && typeof error.message === "string") return error.message;
  return fallback;
}

async function check(response) {
  if (response.ok) return response;
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  const error = new ApiError(
    response.status, errorMessage(body, `${response.status} ${response.statusText}`), body);
  if (response.status === 401) onAuthRequired(error);
  throw error;
}

/** fetch(path) with the key; resolves to the Response, rejects with ApiError. */
export async function request(path, { method = "GET", json, form, signal } = {}) {
  const init = { method, headers: headers(), signal };
  if (json !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (form !== undefined) {
    init.body = form; // the browser sets the multipart boundary
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, `network error: ${err.message}`);
  }
  return check(response);
}

export async function getJSON(path, options = {}) {
  return (await request(path, options)).json();
}

export async function postJSON(path, json, options = {}) {
  return (await request(path, { ...options, method: "POST", json })).json();
}

/**
 * POST a streaming OpenAI request and call onEvent(parsed JSON) for every `data:` event until
 * `[DONE]`. An error event (`data: {"error": ...}`) rejects with ApiError.
 */
export async function streamEvents(path, json, onEvent, { signal } = {}) {
  const response = await request(path, { method: "POST", json, signal });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) throw new ApiError(500, errorMessage(event, "stream failed"), event);
      onEvent(event);
    }
  }
}
