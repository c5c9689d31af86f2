// The answer box of a thread's page: what the run at work is doing, as a person reads it, then
// its answer. "Working on: <query>" while the run goes; "Waiting for a person: <question>" while
// a suspension is pending (a decision is needed before it can go on, whichever item waits); the
// final answer with its sources and suggestions, or why there is none.
//
// The pending suspensions come from the API (the list `Suspensions` reads again whenever the
// stream says one appeared or was decided), so a page opened on a waiting run says so at once.

import { fill, h } from "./dom.js";

export class AnswerBox {
  constructor(el) {
    this.el = el;
    this.query = null; // the query of the run at work; null when no run is at work
    this.pending = []; // the pending suspensions
  }

  /** A run started on `query`. */
  working(query) {
    this.query = query ?? "";
    this.render();
  }

  /** The pending suspensions changed (the API's list, in order). */
  waiting(suspensions) {
    this.pending = suspensions;
    if (this.query !== null) this.render();
  }

  render() {
    const [first, ...more] = this.pending;
    if (first) {
      const what = first.question || (first.toolCall ? first.toolCall.name : "a decision");
      this.show(
        "waiting",
        h("p", {}, `Waiting for a person: ${what}`, more.length ? ` (and ${more.length} more)` : ""),
        h("p", { class: "hint" }, "Decide under “Waiting for you”; the run goes on once you do."),
      );
    } else {
      this.show("working", h("p", {}, `Working on: ${this.query}`));
    }
  }

  answered(content) {
    this.query = null;
    const sources = (content?.sources ?? []).filter((s) => s && s.url);
    const suggestions = content?.suggestions ?? [];
    this.show(
      "answered",
      h("p", { class: "response" }, content?.response ?? ""),
      sources.length ? [h("h3", {}, "Sources"), h("ul", {}, sources.map((s) => h("li", {}, link(s))))] : null,
      suggestions.length ? [h("h3", {}, "Suggestions"), h("ul", {}, suggestions.map((s) => h("li", {}, s)))] : null,
    );
  }

  failed(content) {
    this.query = null;
    const err = content?.error ?? {};
    this.show("failed", h("p", { class: "error" }, `The run failed: ${err.code ?? ""} ${err.message ?? ""}`.trim()));
  }

  cancelled() {
    this.query = null;
    this.show("cancelled", h("p", {}, "The run was cancelled."));
  }

  show(state, ...children) {
    this.el.dataset.state = state;
    fill(this.el, ...children);
  }
}

/** A source as a link when its URL is http(s) (never `javascript:`), else as text. */
function link(source) {
  const title = source.title || source.url;
  return /^https?:\/\//i.test(source.url)
    ? h("a", { href: source.url, rel: "noreferrer noopener" }, title)
    : `${title} (${source.url})`;
}
