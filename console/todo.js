// The todo list with live statuses, rebuilt from the observation stream alone: `PLAN` (the run's
// plan, or with `teamId` a team's nested plan), `PLAN_UPDATE` (the refined list) and
// `ITEM_STATUS_CHANGE`. Replaying the stream from the start therefore yields the same list as
// the thread's state, and no second source can disagree with what the tree shows.

import { h, fill, words } from "./dom.js";

export class TodoList {
  constructor(container) {
    this.container = container;
    /** id → item summary ({id, description, status, dependencies, kind, parentItemId, role}). */
    this.items = new Map();
    this.pending = false;
  }

  /** The item with this id, if the plan has it. */
  get(id) {
    return this.items.get(id);
  }

  /** Take in one observation; redraws (once per frame) when it changed the list. */
  apply(obs) {
    const c = obs.content ?? {};
    if (obs.type === "PLAN" && c.teamId) {
      for (const item of c.todoList ?? []) {
        this.items.set(item.id, { parentItemId: c.teamId, ...item });
      }
    } else if (obs.type === "PLAN") {
      this.items = new Map((c.todoList ?? []).map((i) => [i.id, i]));
    } else if (obs.type === "PLAN_UPDATE") {
      this.replace(c);
    } else if (obs.type === "ITEM_STATUS_CHANGE") {
      const item = this.items.get(c.itemId);
      if (!item) return;
      item.status = c.status;
    } else {
      return;
    }
    this.schedule();
  }

  /** A refined list replaces the old one; a team's children it does not list stay, unless it
   * removed them, so that a refinement summarised at the top level cannot hide a team's plan. */
  replace(c) {
    const removed = new Set((c.removed ?? []).map((r) => (typeof r === "string" ? r : r.id)));
    const next = new Map((c.todoList ?? []).map((i) => [i.id, i]));
    for (const [id, item] of this.items) {
      if (!next.has(id) && !removed.has(id) && item.parentItemId && next.has(item.parentItemId)) {
        next.set(id, item);
      }
    }
    this.items = next;
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.render();
    });
  }

  render() {
    const all = [...this.items.values()];
    if (all.length === 0) {
      fill(this.container, h("p", {}, "No plan yet: post a query."));
      return;
    }
    const counts = new Map();
    for (const i of all) counts.set(i.status, (counts.get(i.status) ?? 0) + 1);
    const summary = [...counts].map(([s, n]) => `${n} ${words(s)}`).join(", ");
    const children = (parent) => all.filter((i) => (i.parentItemId ?? null) === parent);
    fill(
      this.container,
      h("p", { class: "todo-summary" }, `${all.length} items: ${summary}`),
      this.list(children(null), children),
    );
  }

  list(items, children) {
    return h(
      "ol",
      { class: "todo" },
      items.map((i) => {
        const kids = children(i.id);
        return h(
          "li",
          { "data-item": i.id, "data-status": i.status, class: `status-${i.status}` },
          h("span", { class: "badge" }, words(i.status)),
          " ",
          h("code", {}, i.id),
          " ",
          i.description,
          i.kind === "team" ? h("span", { class: "tag" }, " team") : null,
          i.role ? h("span", { class: "tag" }, ` role: ${i.role}`) : null,
          i.dependencies?.length
            ? h("span", { class: "deps" }, ` (after ${i.dependencies.join(", ")})`)
            : null,
          kids.length ? this.list(kids, children) : null,
        );
      }),
    );
  }
}
