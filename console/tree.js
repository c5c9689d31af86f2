// The observation tree, live: run → items (a team's children inside the team) → observations,
// with a tool call's result, its suspension, its flowchart steps and its remote agent's updates
// under the call. It is built only from `parentId` links (null: the run; an item id: the item;
// an observation id: that observation) plus one convenience: a `TOOL_EXECUTION` or
// `AGENT_SUSPENDED` names its call (`toolCallId`), so it goes under that `TOOL_CALL`.
//
// Runs and items are <details> (open while they work), so the tree folds by keyboard; an
// observation's content is shown when its own <details> is opened, and only then turned into
// text, so a long log stays cheap to render.
//
// It also gives the model's live text (live.js) its place: under the item it is for, or under the
// run for the run's own plan and synthesis, and says which item each observation belongs to.

import { h, pretty, words } from "./dom.js";

const END_STATUS = {
  RUN_COMPLETED: "completed",
  RUN_FAILED: "failed",
  RUN_CANCELLED: "cancelled",
  RUN_SUSPENDED: "suspended",
};

export class ObservationTree {
  /** `root` is a <ul>; `todo` (a TodoList) names items and tells which team holds which. */
  constructor(root, todo) {
    this.root = root;
    this.todo = todo;
    this.runs = new Map(); // runId → node
    this.items = new Map(); // `${runId} ${itemId}` → node
    this.nodes = new Map(); // observation id → node
    this.calls = new Map(); // `${runId} ${toolCallId}` → TOOL_CALL observation id
  }

  /** Add one observation where its links put it. */
  add(obs) {
    if (this.nodes.has(obs.id)) return; // never twice, whatever the stream does
    const run = this.run(obs);
    const parent = this.parentOf(obs, run);
    const node = this.observationNode(obs);
    node.itemId = this.scopeOf(obs);
    this.nodes.set(obs.id, node);
    parent.append(node.li);
    if (obs.type === "TOOL_CALL" && obs.content?.toolCallId) {
      this.calls.set(`${obs.runId} ${obs.content.toolCallId}`, obs.id);
    }
    this.follow(obs, run);
  }

  /** The item an observation (added already) belongs to, at any depth; null for the run's own. */
  itemOf(obs) {
    return this.nodes.get(obs.id)?.itemId ?? null;
  }

  /** The item of a new observation: its parent's, or its parent when that is no observation. */
  scopeOf(obs) {
    if (obs.parentId === null || obs.parentId === undefined) return null;
    const above = this.nodes.get(obs.parentId);
    return above ? above.itemId : obs.parentId;
  }

  /** The list where the live text of an item (null: of the run) goes. */
  holder(runId, itemId) {
    const run = this.run({ runId });
    return itemId ? this.item(runId, itemId, run).list : run.list;
  }

  /** The list an observation belongs in. */
  parentOf(obs, run) {
    const c = obs.content ?? {};
    const callId = c.toolCallId ?? (obs.type === "AGENT_SUSPENDED" ? c.toolCall?.id : null);
    if (callId && obs.type !== "TOOL_CALL") {
      const call = this.calls.get(`${obs.runId} ${callId}`);
      if (call && this.nodes.has(call)) return this.children(this.nodes.get(call));
    }
    if (obs.parentId === null || obs.parentId === undefined) return run.list;
    const above = this.nodes.get(obs.parentId);
    if (above) return this.children(above);
    return this.item(obs.runId, obs.parentId, run).list;
  }

  /** Keep run and item headers in step with what the observation says. */
  follow(obs, run) {
    const c = obs.content ?? {};
    if (obs.type === "RUN_STARTED") {
      run.title.textContent = c.query ?? "";
      setBadge(run, "running");
      // The newest run is the one to watch: fold the ones before it.
      for (const other of this.runs.values()) other.details.open = other === run;
    } else if (obs.type in END_STATUS) {
      setBadge(run, END_STATUS[obs.type]);
    } else if (obs.type === "AGENT_RESUMED") {
      setBadge(run, "running");
    } else if (obs.type === "ITEM_STATUS_CHANGE" && c.itemId) {
      const item = this.item(obs.runId, c.itemId, run);
      setBadge(item, c.status);
      // A finished item folds away; one at work (or waiting for a person) stays open.
      item.details.open = !["completed", "failed", "cancelled", "skipped"].includes(c.status);
    }
  }

  run(obs) {
    const id = obs.runId ?? "none";
    let run = this.runs.get(id);
    if (!run) {
      run = branch("run", "Run", h("code", {}, id.slice(0, 13)), "");
      run.li.dataset.run = id;
      this.runs.set(id, run);
      this.root.append(run.li);
    }
    return run;
  }

  /** An item's node in a run (made when first seen), inside its team's node when it has one. */
  item(runId, itemId, run) {
    const key = `${runId} ${itemId}`;
    let item = this.items.get(key);
    if (item) return item;
    const known = this.todo.get(itemId);
    item = branch("item", "Item", h("code", {}, itemId), known?.description ?? "");
    item.li.dataset.item = itemId;
    if (known?.status) setBadge(item, known.status);
    this.items.set(key, item);
    // A team's child: `parentItemId` from the plan, else the id's prefix (`<team>.<child>`).
    const team = known?.parentItemId ?? (itemId.includes(".") ? itemId.slice(0, itemId.lastIndexOf(".")) : null);
    const holder = team && this.items.get(`${runId} ${team}`);
    (holder ?? run).list.append(item.li);
    return item;
  }

  /** Fill in item descriptions the plan gave after the item's node was made. */
  refreshItems() {
    for (const [key, item] of this.items) {
      const known = this.todo.get(key.slice(key.indexOf(" ") + 1));
      if (known && !item.title.textContent) item.title.textContent = known.description;
    }
  }

  /** The list of an observation's children, made on the first child. */
  children(node) {
    if (!node.list) {
      node.list = h("ul", { class: "children" });
      node.li.append(node.list);
    }
    return node.list;
  }

  observationNode(obs) {
    const pre = h("pre", { class: "content" });
    const details = h(
      "details",
      {
        ontoggle: () => {
          if (details.open && !pre.textContent) pre.textContent = pretty(obs.content);
        },
      },
      h(
        "summary",
        {},
        h("span", { class: "type" }, obs.type),
        " ",
        h("span", { class: "title" }, obs.title),
        h("span", { class: "seq" }, ` #${obs.seq}`),
      ),
      pre,
    );
    const li = h("li", { class: "obs", "data-seq": obs.seq, "data-type": obs.type }, details);
    return { li, list: null };
  }
}

/** A run or item node: an open <details> with a header and a list of children. */
function branch(kind, label, id, title) {
  const titleEl = h("span", { class: "title" }, title);
  const badge = h("span", { class: "badge" });
  const list = h("ul", { class: "children" });
  const details = h(
    "details",
    { open: true },
    h("summary", {}, h("span", { class: "kind" }, label), " ", id, " ", titleEl, " ", badge),
    list,
  );
  const li = h("li", { class: kind }, details);
  return { li, details, list, title: titleEl, badge };
}

function setBadge(node, status) {
  node.badge.textContent = words(status);
  node.li.dataset.status = status;
}
