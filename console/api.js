// The one way the console talks to the server: JSON calls to the public API with the person's
// API key, and the key itself.
//
// Why the key lives here, in the browser only: the page is public (so it can load and then ask),
// and the server keeps no session. The key is in sessionStorage (gone when the tab closes) unless
// the person asks to remember it (localStorage). It is only ever sent to this origin.

const KEY_NAME = "pes-api-key";

// The API's root, relative to the page, so the console works behind a proxy that mounts the
// service under a path prefix (`/pes/console` calls `/pes/v1/...`).
const ROOT = new URL(".", document.baseURI);

/** The URL of an API path such as `v1/threads`. */
export function apiUrl(path) {
  return new URL(path, ROOT).toString();
}

export function storedKey() {
  return sessionStorage.getItem(KEY_NAME) ?? localStorage.getItem(KEY_NAME);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
  keyChanged();
}

function keyChanged() {
  document.getElementById("forget-key").hidden = storedKey() === null;
}

/** Headers every API call carries. */
export function authHeaders() {
  const key = storedKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// One question at a time: every call that meets a 401 while the dialog is open waits for the
// same answer, instead of stacking dialogs.
let asking = null;

/**
 * Ask the person for a key (the server answered 401), store it, and resolve when there is one.
 * `rejected` says the key just tried was refused.
 */
export function askForKey(rejected) {
  if (asking) return asking;
  const dialog = document.getElementById("key-dialog");
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  document.getElementById("key-error").textContent = rejected
    ? "The server refused that key (401). Try another."
    : "";
  asking = new Promise((resolve) => {
    const onSubmit = (event) => {
      event.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      const remember = document.getElementById("key-remember").checked;
      forgetKey();
      (remember ? localStorage : sessionStorage).setItem(KEY_NAME, key);
      keyChanged();
      form.removeEventListener("submit", onSubmit);
      input.value = "";
      dialog.close();
      asking = null;
      resolve(key);
    };
    form.addEventListener("submit", onSubmit);
    dialog.showModal();
    input.focus();
  });
  return asking;
}

/** An answer the API refused: its status and RFC 9457 problem body. */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem ?? {};
  }

  /** The problem as a person reads it: status, code and detail (which names every field). */
  describe() {
    const code = this.problem.code ? ` ${this.problem.code}` : "";
    return `${this.status}${code}: ${this.message}`;
  }
}

/**
 * Call the API: `path` relative to its root, an optional JSON `body`. Resolves with the parsed
 * answer (null for 204); rejects with ApiError on any other status. A 401 asks for a key and
 * tries again with it.
 */
export async function call(method, path, body) {
  for (let attempt = 0; ; attempt++) {
    const headers = { Accept: "application/json", ...authHeaders() };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(apiUrl(path), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) {
      await askForKey(attempt > 0 || storedKey() !== null);
      continue;
    }
    const text = await response.text();
    const parsed = text ? safeJson(text) : null;
    if (!response.ok) throw new ApiError(response.status, parsed);
    return parsed;
  }
}

function safeJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return { detail: text };
  }
}

/** Path segment for an id from the outside (thread ids are plain, but never trust that). */
export function seg(id) {
  return encodeURIComponent(id);
}

export function initKeyControls() {
  keyChanged();
  // Escape would close the dialog and leave every waiting call without a key and no way to ask
  // again: the dialog stays until a key is given.
  document.getElementById("key-dialog").addEventListener("cancel", (event) => event.preventDefault());
  document.getElementById("forget-key").addEventListener("click", () => {
    forgetKey();
    location.reload();
  });
}
