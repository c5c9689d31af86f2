// The threads page: the tenant's threads, newest first, a page at a time, each shown by what a
// person recognises it by (its title, else its last query, else its id; the id always below); a
// form to create one (with an optional configuration) and one to open a thread by id.

import { ApiError, call } from "./api.js";
import { announce, fill, h, when, words } from "./dom.js";

const PAGE = 20;
/** The most of a last query a row shows (the list's `lastQuery` holds up to 200 characters). */
const QUERY_SHOWN = 80;

export function threadHref(id) {
  return `console?thread=${encodeURIComponent(id)}`;
}

export async function showThreads(main) {
  document.title = "Threads · pes-server console";
  const rows = h("tbody");
  const more = h("button", { type: "button", id: "more-threads", hidden: true }, "Show older threads");
  const listError = h("p", { class: "error", role: "alert" });
  const empty = h("p", { hidden: true }, "No threads yet: create one above.");
  fill(
    main,
    h("h1", {}, "Threads"),
    createForm(),
    openForm(),
    h(
      "section",
      { "aria-labelledby": "list-title" },
      h("h2", { id: "list-title" }, "Recent threads"),
      h(
        "table",
        { class: "threads" },
        h("thead", {}, h("tr", {}, ["Thread", "Status", "Created", "Updated"].map((t) => h("th", { scope: "col" }, t)))),
        rows,
      ),
      empty,
      listError,
      more,
    ),
  );

  let cursor = null;
  const load = async () => {
    more.disabled = true;
    try {
      const query = `limit=${PAGE}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
      const page = await call("GET", `v1/threads?${query}`);
      for (const t of page.items) {
        rows.append(
          h(
            "tr",
            { "data-thread": t.threadId },
            h("td", {}, ...threadCell(t)),
            h("td", {}, words(t.status)),
            h("td", {}, h("time", { datetime: t.createdAt }, when(t.createdAt))),
            h("td", {}, h("time", { datetime: t.updatedAt }, when(t.updatedAt))),
          ),
        );
      }
      cursor = page.nextCursor ?? null;
      more.hidden = cursor === null;
      empty.hidden = rows.children.length > 0;
      announce(`${rows.children.length} threads shown.`);
    } catch (e) {
      listError.textContent = `Could not list the threads: ${e instanceof ApiError ? e.describe() : e}`;
    } finally {
      more.disabled = false;
    }
  };
  more.addEventListener("click", load);
  await load();
}

/**
 * A thread's name in the list: a link labelled with its title, else its last query (shortened,
 * whole on hover), else its id; the id below when the label is not the id.
 */
function threadCell(t) {
  const [label, kind] = t.title
    ? [t.title, "title"]
    : t.lastQuery
      ? [shorten(t.lastQuery, QUERY_SHOWN), "query"]
      : [t.threadId, "id"];
  const hover = kind === "query" ? t.lastQuery : null;
  return [
    h("a", { href: threadHref(t.threadId), "data-label": kind, title: hover }, label),
    kind === "id" ? null : h("code", { class: "thread-id" }, t.threadId),
  ];
}

/** `text` on one line, at most `max` characters (an ellipsis when cut). */
function shorten(text, max) {
  const line = text.replace(/\s+/g, " ").trim();
  const chars = [...line];
  return chars.length <= max ? line : `${chars.slice(0, max - 1).join("").trimEnd()}…`;
}

function createForm() {
  const id = h("input", { id: "new-thread-id", name: "threadId", pattern: "[A-Za-z0-9_.:\\-]{1,128}", autocomplete: "off" });
  const config = h("textarea", { id: "new-thread-config", rows: 3, spellcheck: "false", class: "json", placeholder: '{"requireApproval": ["calculator"]}' });
  const error = h("p", { class: "error", role: "alert" });
  const button = h("button", { type: "submit" }, "Create thread");
  return h(
    "section",
    { "aria-labelledby": "new-title" },
    h("h2", { id: "new-title" }, "New thread"),
    h(
      "form",
      {
        id: "new-thread",
        onsubmit: async (event) => {
          event.preventDefault();
          error.textContent = "";
          const body = {};
          if (id.value.trim()) body.threadId = id.value.trim();
          if (config.value.trim()) {
            try {
              body.config = JSON.parse(config.value);
            } catch (e) {
              error.textContent = `The configuration is not JSON: ${e.message}`;
              config.focus();
              return;
            }
          }
          button.disabled = true;
          try {
            const thread = await call("POST", "v1/threads", body);
            location.assign(threadHref(thread.threadId));
          } catch (e) {
            error.textContent = e instanceof ApiError ? e.describe() : String(e);
          } finally {
            button.disabled = false;
          }
        },
      },
      h("p", {}, h("label", { for: "new-thread-id" }, "Thread id (optional: one is made up when empty)"), h("br"), id),
      h("p", {}, h("label", { for: "new-thread-config" }, "Configuration (JSON, optional)"), h("br"), config),
      error,
      button,
    ),
  );
}

function openForm() {
  const id = h("input", { id: "open-thread-id", required: true, autocomplete: "off" });
  return h(
    "form",
    {
      class: "inline",
      onsubmit: (event) => {
        event.preventDefault();
        if (id.value.trim()) location.assign(threadHref(id.value.trim()));
      },
    },
    h("label", { for: "open-thread-id" }, "Open a thread by id "),
    id,
    " ",
    h("button", { type: "submit" }, "Open"),
  );
}
