// The model's text as it is written: the stream's token deltas, shown in the tree under the item
// they are for (or under the run, for its plan and synthesis) until what they become is committed.
//
// The committed log stays the truth. A delta is sent after the observations committed before it
// was written and before those committed after, so the first observation committed for an item
// (or, for the run's own text, at the run's level) ends the model call whose text is showing:
// the live text goes, and the observation takes its place. The end of a run removes whatever is
// left of it. A new connection starts afresh: deltas are never replayed, so text kept from before
// a drop would have a hole in it, and the observations replayed after the drop say what it became.
//
// Cheap by construction: deltas are buffered and written once per animation frame, as appended
// text nodes (never re-rendering what is there). Quiet for screen readers: the text is not a live
// region (a word every few milliseconds would drown everything else); the label says what it is.

import { h } from "./dom.js";

/** What the person reads above the text, by phase. Structured phases write JSON. */
const LABELS = {
  plan: "The model is writing the plan (JSON)…",
  execute: "The model is writing…",
  synthesize: "The model is writing the answer (JSON)…",
  compact: "The model is summarising the item's notes (JSON)…",
  flowchart: "The model is writing a flowchart stage…",
};

const RUN_END = new Set(["RUN_COMPLETED", "RUN_FAILED", "RUN_CANCELLED", "RUN_SUSPENDED"]);

export class LiveText {
  /** `holder(runId, itemId)` is the list (<ul>) where the text of that item (null: the run) goes. */
  constructor(holder) {
    this.holder = holder;
    /** `${runId} ${itemId ?? ""}` → {li, pre, phase, runId, pending}. */
    this.blocks = new Map();
    this.dirty = new Set();
    this.frame = 0;
  }

  /** One delta from the stream. */
  token(t) {
    if (!t || typeof t.delta !== "string" || !t.runId) return;
    const key = blockKey(t.runId, t.itemId);
    let block = this.blocks.get(key);
    if (block && block.phase !== t.phase) {
      this.remove(key);
      block = null;
    }
    if (!block) block = this.open(key, t);
    block.pending += t.delta;
    this.dirty.add(block);
    if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
  }

  /** An observation was committed; `itemId` is the item it belongs to (null: the run itself). */
  committed(obs, itemId) {
    if (!obs.runId) return;
    if (RUN_END.has(obs.type)) {
      for (const [key, block] of this.blocks) if (block.runId === obs.runId) this.remove(key);
      return;
    }
    this.remove(blockKey(obs.runId, itemId));
  }

  /** A new connection: what was showing belongs to the one before. */
  reset() {
    for (const key of [...this.blocks.keys()]) this.remove(key);
  }

  open(key, t) {
    const pre = h("pre", { class: "live-text", "aria-live": "off" });
    const li = h(
      "li",
      { class: "live", "data-phase": t.phase, "aria-busy": "true" },
      h("p", { class: "live-label" }, LABELS[t.phase] ?? `The model is writing (${t.phase})…`),
      pre,
    );
    this.holder(t.runId, t.itemId ?? null).append(li);
    const block = { li, pre, phase: t.phase, runId: t.runId, pending: "" };
    this.blocks.set(key, block);
    return block;
  }

  remove(key) {
    const block = this.blocks.get(key);
    if (!block) return;
    this.blocks.delete(key);
    this.dirty.delete(block);
    block.li.remove();
  }

  /** Write what came since the last frame. */
  flush() {
    this.frame = 0;
    for (const block of this.dirty) {
      block.pre.append(block.pending);
      block.pending = "";
      // Follow the end of the text as it grows (the box is only so tall).
      block.pre.scrollTop = block.pre.scrollHeight;
    }
    this.dirty.clear();
  }
}

function blockKey(runId, itemId) {
  return `${runId} ${itemId ?? ""}`;
}
