// Small DOM helpers: build elements without innerHTML (nothing the server sends is parsed as HTML).

/** h("div", {class: "x", dataset: {model: id}}, child, "text") -> HTMLElement */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style") Object.assign(el.style, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  el.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}

const SVG = "http://www.w3.org/2000/svg";

/** An SVG element with attributes. */
export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  el.append(...children);
  return el;
}

export const $ = (selector, root = document) => root.querySelector(selector);
export const $$ = (selector, root = document) => [...root.querySelectorAll(selector)];

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

/** A horizontal bar: fraction 0..1 of the track, optional label inside. */
export function bar(fraction, { kind = "", label = "" } = {}) {
  const pct = Math.max(0, Math.min(1, Number(fraction) || 0)) * 100;
  return h("div", { class: `bar ${kind}` },
    h("div", { class: "bar-fill", style: { width: `${pct.toFixed(1)}%` } }),
    label ? h("span", { class: "bar-label" }, label) : null);
}

/** Show an error message in a panel's status line (cleared with an empty message). */
export function setStatus(el, message, kind = "error") {
  el.textContent = message;
  el.className = `status ${message ? kind : ""}`;
}
