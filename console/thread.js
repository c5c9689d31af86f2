// A thread's page: post a query, see the plan and the live tree, answer what waits for a person,
// read the final answer (the answer box, `answer.js`, says meanwhile what the run is doing). Everything after the first read of the thread comes from its stream
// (replayed from the start, then live), so reloading the page or reconnecting shows the same;
// the model's text as it is written comes on the same stream and shows until it is committed.

import { AnswerBox } from "./answer.js";
import { ApiError, call, seg } from "./api.js";
import { announce, fill, h, words } from "./dom.js";
import { follow } from "./events.js";
import { LiveText } from "./live.js";
import { Suspensions } from "./suspensions.js";
import { TodoList } from "./todo.js";
import { ObservationTree } from "./tree.js";

const RUN_END = new Set(["RUN_COMPLETED", "RUN_FAILED", "RUN_CANCELLED"]);
// Observations after which the pending suspensions may have changed.
const SUSPENSION_EVENTS = new Set(["AGENT_SUSPENDED", "AGENT_RESUMED", "RUN_SUSPENDED", ...RUN_END]);

export async function showThread(main, threadId) {
  document.title = `${threadId} · pes-server console`;
  let thread;
  try {
    thread = await call("GET", `v1/threads/${seg(threadId)}`);
  } catch (e) {
    const gone = e instanceof ApiError && e.status === 404;
    fill(
      main,
      h("h1", {}, "Thread ", h("code", {}, threadId)),
      h("p", { class: "error", role: "alert" }, gone ? "There is no such thread." : `Could not read the thread: ${e.describe?.() ?? e}`),
      h("p", {}, h("a", { href: "console" }, "Back to the threads")),
    );
    return;
  }

  const page = layout(threadId, thread);
  fill(main, page.root);
  const todo = new TodoList(page.plan);
  todo.render();
  const tree = new ObservationTree(page.tree, todo);
  const live = new LiveText((runId, itemId) => tree.holder(runId, itemId));
  const answer = new AnswerBox(page.answer);
  const suspensions = new Suspensions(page.suspensions, threadId, (pending) => answer.waiting(pending));
  suspensions.refresh();
  const runs = new RunControl(threadId, page);

  follow(threadId, {
    onObservation(obs) {
      todo.apply(obs);
      tree.add(obs);
      live.committed(obs, tree.itemOf(obs));
      if (obs.type === "PLAN" || obs.type === "PLAN_UPDATE") tree.refreshItems();
      if (obs.type === "TITLE") page.title.textContent = obs.content?.title ?? obs.title;
      runs.observe(obs);
      if (obs.type === "RUN_STARTED") answer.working(obs.content?.query);
      if (obs.type === "FINAL_RESPONSE") answer.answered(obs.content);
      if (obs.type === "RUN_FAILED") answer.failed(obs.content);
      if (obs.type === "RUN_CANCELLED") answer.cancelled();
      if (SUSPENSION_EVENTS.has(obs.type)) suspensions.refresh();
    },
    onToken(t) {
      live.token(t);
    },
    onState(state, detail) {
      if (state === "live") live.reset();
      const text = {
        // Saying where it resumed shows the person (and the tests) that nothing is replayed.
        live: detail > 0 ? `Live (resumed after #${detail})` : "Live",
        reconnecting: `Connection lost (${detail?.message ?? detail}); reconnecting…`,
        deleted: "This thread was deleted.",
        gone: "This thread no longer exists.",
      }[state];
      page.connection.textContent = text;
      page.connection.dataset.state = state;
      if (state !== "live") announce(text);
    },
  });
}

function layout(threadId, thread) {
  const title = h("p", { class: "thread-title" });
  const connection = h("p", { class: "connection", "data-state": "connecting" }, "Connecting…");
  const query = h("textarea", { id: "query", rows: 3, required: true });
  const config = h("textarea", { id: "run-config", rows: 3, spellcheck: "false", class: "json", placeholder: '{"maxParallelItems": 2}' });
  const askError = h("p", { class: "error", role: "alert" });
  const send = h("button", { type: "submit" }, "Send");
  const runStatus = h("p", { class: "run-status" });
  const cancel = h("button", { type: "button", class: "secondary", hidden: true }, "Cancel the run");
  // What the latest run spent (tokens, and dollars when the service has prices).
  const spend = h("p", { class: "spend", hidden: true });
  // A message to the run at work: it reads it at its next step (POST …/steer).
  const steerText = h("textarea", { id: "steer", rows: 2, placeholder: "Tell the run something while it works" });
  const steerSend = h("button", { type: "submit", class: "secondary" }, "Steer");
  const steerError = h("p", { class: "error", role: "alert" });
  const steer = h(
    "form",
    { id: "steer-form", hidden: true },
    h("p", {}, h("label", { for: "steer" }, "Steer the run"), h("br"), steerText),
    steerError,
    steerSend,
  );
  const suspensions = h(
    "section",
    { class: "suspensions", "aria-labelledby": "susp-title", hidden: true },
    h("h2", { id: "susp-title" }, "Waiting for you"),
    h("p", { class: "notice", role: "alert" }),
    h("div", { class: "suspension-list" }),
  );
  const answer = h("div", { class: "answer" }, h("p", {}, "No answer yet."));
  const plan = h("div", { class: "plan" });
  const tree = h("ul", { class: "tree", "aria-label": "Observations" });
  const configText = Object.keys(thread.config ?? {}).length ? JSON.stringify(thread.config) : null;
  const root = h(
    "div",
    { class: "thread" },
    h("h1", {}, "Thread ", h("code", {}, threadId)),
    title,
    configText ? h("p", { class: "meta" }, "Configuration: ", h("code", {}, configText)) : null,
    connection,
    h(
      "div",
      { class: "columns" },
      h(
        "div",
        { class: "side" },
        suspensions,
        h(
          "section",
          { "aria-labelledby": "ask-title" },
          h("h2", { id: "ask-title" }, "Ask"),
          h(
            "form",
            { id: "ask" },
            h("p", {}, h("label", { for: "query" }, "Query"), h("br"), query),
            h(
              "details",
              {},
              h("summary", {}, "Run configuration (JSON, optional)"),
              h("p", {}, h("label", { for: "run-config" }, "Overrides the thread's configuration for this run"), h("br"), config),
            ),
            askError,
            send,
          ),
          runStatus,
          spend,
          cancel,
          steer,
        ),
        h("section", { "aria-labelledby": "answer-title" }, h("h2", { id: "answer-title" }, "Answer"), answer),
        h("section", { "aria-labelledby": "plan-title" }, h("h2", { id: "plan-title" }, "Plan"), plan),
      ),
      h(
        "section",
        { class: "activity", "aria-labelledby": "tree-title" },
        h("h2", { id: "tree-title" }, "Activity"),
        h("p", { class: "hint" }, "Runs, items and tool calls as they happen. Open an entry to see its content."),
        tree,
      ),
    ),
  );
  return { root, title, connection, form: root.querySelector("#ask"), query, config, askError, send, runStatus, cancel, spend, steer, steerText, steerSend, steerError, suspensions, answer, plan, tree };
}

/** Posting queries, and the state and cancel button of the run at work. */
class RunControl {
  constructor(threadId, page) {
    this.threadId = threadId;
    this.page = page;
    this.active = null; // runId of the run at work, when one is
    page.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.post();
    });
    page.cancel.addEventListener("click", () => this.cancel());
    page.steer.addEventListener("submit", (event) => {
      event.preventDefault();
      this.steer();
    });
  }

  async steer() {
    const runId = this.active;
    const { steerText, steerSend, steerError } = this.page;
    steerError.textContent = "";
    if (!runId || !steerText.value.trim()) return;
    steerSend.disabled = true;
    try {
      await call("POST", `v1/threads/${seg(this.threadId)}/runs/${seg(runId)}/steer`, { message: steerText.value });
      steerText.value = "";
      announce("The run will read your message at its next step.");
    } catch (e) {
      steerError.textContent = e instanceof ApiError ? e.describe() : String(e);
    } finally {
      steerSend.disabled = false;
    }
  }

  /** Show what a run spent: tokens, and dollars when the service prices its model. */
  spent(tokens, usd) {
    const { spend } = this.page;
    spend.hidden = false;
    spend.dataset.tokens = String(tokens);
    const cost = typeof usd === "number" && usd > 0 ? ` · $${usd.toFixed(4)}` : "";
    if (cost) spend.dataset.costUsd = String(usd);
    spend.textContent = `Spent: ${tokens} tokens${cost}`;
  }

  async post() {
    const { query, config, askError, send } = this.page;
    askError.textContent = "";
    const body = { query: query.value };
    if (config.value.trim()) {
      try {
        body.config = JSON.parse(config.value);
      } catch (e) {
        askError.textContent = `The run configuration is not JSON: ${e.message}`;
        config.focus();
        return;
      }
    }
    send.disabled = true;
    try {
      const run = await call("POST", `v1/threads/${seg(this.threadId)}/runs`, body);
      query.value = "";
      this.show(run.runId, run.status);
    } catch (e) {
      askError.textContent = e instanceof ApiError ? e.describe() : String(e);
    } finally {
      send.disabled = false;
    }
  }

  async cancel() {
    const runId = this.active;
    if (!runId) return;
    this.page.cancel.disabled = true;
    try {
      await call("POST", `v1/threads/${seg(this.threadId)}/runs/${seg(runId)}/cancel`);
      announce("Cancelling the run…");
    } catch (e) {
      announce(`Could not cancel: ${e instanceof ApiError ? e.describe() : e}`);
    } finally {
      this.page.cancel.disabled = false;
    }
  }

  observe(obs) {
    const usage = obs.content?.usage;
    if (usage && typeof usage.totalTokens === "number") this.spent(usage.totalTokens, usage.costUsd);
    if (obs.type === "BUDGET") this.spent(obs.content.spentTokens, obs.content.spentUsd);
    if (obs.type === "RUN_STARTED") this.show(obs.runId, "running");
    else if (obs.type === "RUN_SUSPENDED") this.show(obs.runId, "suspended");
    else if (obs.type === "AGENT_RESUMED" && this.active === obs.runId) this.show(obs.runId, "running");
    else if (RUN_END.has(obs.type)) this.show(obs.runId, obs.type.slice(4).toLowerCase());
  }

  show(runId, status) {
    const ended = ["completed", "failed", "cancelled"].includes(status);
    this.active = ended ? null : runId;
    this.page.cancel.hidden = ended;
    this.page.steer.hidden = ended;
    this.page.runStatus.dataset.status = status;
    this.page.runStatus.textContent = `Run ${runId.slice(0, 13)}…: ${words(status)}`;
    announce(`Run ${words(status)}.`);
  }
}
