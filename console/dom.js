// Building the page: one small element factory, so that text from the server is always set as
// text (never parsed as HTML: an observation's title or a tool's output cannot inject markup).

/**
 * Make an element: `h("a", {href: "x", class: "y"}, "text", child, ...)`. Attributes starting
 * with `on` are event listeners; `null`/`false` children and attributes are skipped.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** Say something in the page's live status line (read out by screen readers). */
export function announce(text) {
  document.getElementById("status").textContent = text;
}

/** A time as the person's locale writes it. */
export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

/** JSON as indented text, for `<pre>`. */
export function pretty(value) {
  return JSON.stringify(value, null, 2);
}

/** A status word as a label: `in_progress` → `in progress`. */
export function words(status) {
  return String(status ?? "").replaceAll("_", " ");
}
