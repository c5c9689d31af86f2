// Pending suspensions: what the agent waits on a person for, and the decisions the person can
// send. The list comes from the API (`GET /v1/threads/{id}/suspensions`, the truth), read again
// whenever the stream says a suspension appeared or was decided. Cards are kept by id across
// those reads, so text a person is typing into one is never wiped by another arriving.
//
// The server validates every decision: edited arguments against the tool's schema, a response
// against the question's schema (422, shown in the card as the server wrote it), and a decision
// someone else already made (409, shown plainly).

import { ApiError, call, seg } from "./api.js";
import { announce, h, pretty, when, words } from "./dom.js";

export class Suspensions {
  /** `onChange(pending)` hears the pending suspensions after every read of the list. */
  constructor(section, threadId, onChange = () => {}) {
    this.section = section;
    this.threadId = threadId;
    this.onChange = onChange;
    this.list = section.querySelector(".suspension-list");
    this.notice = section.querySelector(".notice");
    this.cards = new Map(); // suspensionId → <article>
    this.reading = null;
    this.again = false;
  }

  /** Read the pending suspensions again (coalescing calls made while a read is under way). */
  refresh() {
    if (this.reading) {
      this.again = true;
      return this.reading;
    }
    this.reading = (async () => {
      try {
        do {
          this.again = false;
          const page = await call("GET", `v1/threads/${seg(this.threadId)}/suspensions`);
          this.show(page.items ?? []);
        } while (this.again);
      } catch (error) {
        this.notice.textContent = `Could not read the suspensions: ${describe(error)}`;
        this.section.hidden = false;
      } finally {
        this.reading = null;
      }
    })();
    return this.reading;
  }

  show(items) {
    const ids = new Set(items.map((s) => s.suspensionId));
    for (const [id, card] of this.cards) {
      if (!ids.has(id)) {
        card.remove();
        this.cards.delete(id);
      }
    }
    for (const s of items) {
      if (!this.cards.has(s.suspensionId)) {
        const card = this.card(s);
        this.cards.set(s.suspensionId, card);
        this.list.append(card);
      }
    }
    this.section.hidden = this.cards.size === 0 && !this.notice.textContent;
    this.onChange(items);
  }

  card(s) {
    const error = h("p", { class: "error", role: "alert" });
    const send = async (body, button) => {
      error.textContent = "";
      button.disabled = true;
      try {
        await call("POST", `v1/suspensions/${seg(s.suspensionId)}/resume`, body);
        announce(`Sent: ${body.decision}${s.toolCall ? ` for ${s.toolCall.name}` : ""}.`);
        this.notice.textContent = "";
        await this.refresh();
      } catch (e) {
        if (e instanceof ApiError && e.status === 409) {
          // Someone (another tab, person or client) decided first: say so, and drop the card.
          this.notice.textContent =
            `Already decided elsewhere: "${s.question}" (${e.describe()}). Nothing was sent.`;
          announce("That suspension was already decided elsewhere.");
          await this.refresh();
        } else {
          error.textContent = describe(e);
        }
      } finally {
        button.disabled = false;
      }
    };
    const allowed = new Set(s.allowedDecisions ?? []);
    const toolCall = s.toolCall;
    return h(
      "article",
      { class: "suspension", "data-suspension": s.suspensionId, "aria-labelledby": `q-${s.suspensionId}` },
      h("h3", { id: `q-${s.suspensionId}` }, s.question),
      h(
        "p",
        { class: "meta" },
        `${words(s.kind)} · item `,
        h("code", {}, s.itemId ?? "?"),
        ` · since ${when(s.createdAt)}`,
        s.expiresAt ? ` · expires ${when(s.expiresAt)}` : "",
      ),
      toolCall
        ? [h("p", {}, "Proposed call: ", h("code", {}, toolCall.name)), h("pre", { class: "args" }, pretty(toolCall.arguments))]
        : null,
      s.inputSchema
        ? h("details", {}, h("summary", {}, "Expected answer (JSON Schema)"), h("pre", {}, pretty(s.inputSchema)))
        : null,
      allowed.has("approve") ? approveForm(send) : null,
      allowed.has("edit") ? editForm(send, toolCall, error) : null,
      allowed.has("reject") ? rejectForm(send) : null,
      allowed.has("respond") ? respondForm(send, s) : null,
      error,
    );
  }
}

function describe(e) {
  return e instanceof ApiError ? e.describe() : String(e?.message ?? e);
}

/**
 * One decision as its own small form, so Enter in its field sends that decision. Decisions with
 * fields fold into a <details>: approving is the common answer, the others a click away.
 */
function decisionForm(title, fields, label, onSubmit) {
  const button = h("button", { type: "submit" }, label);
  const form = h(
    "form",
    {
      class: "decision",
      onsubmit: (event) => {
        event.preventDefault();
        onSubmit(button);
      },
    },
    fields,
    button,
  );
  return fields.length ? h("details", { class: "decision" }, h("summary", {}, title), form) : form;
}

function approveForm(send) {
  return decisionForm("Approve", [], "Approve", (b) => send({ decision: "approve" }, b));
}

function editForm(send, toolCall, error) {
  const area = h("textarea", { rows: 4, spellcheck: "false", class: "json" });
  area.value = toolCall ? pretty(toolCall.arguments) : "{}";
  return decisionForm("Edit the arguments (JSON)", [labelled("Arguments", area)], "Run with these arguments", (b) => {
    let args;
    try {
      args = JSON.parse(area.value);
    } catch (e) {
      error.textContent = `The arguments are not JSON: ${e.message}`;
      area.focus();
      return;
    }
    send({ decision: "edit", modifiedArgs: args }, b);
  });
}

function rejectForm(send) {
  const input = h("input", { type: "text" });
  return decisionForm("Reject", [labelled("Reason (the model is told)", input)], "Reject", (b) => {
    const body = { decision: "reject" };
    if (input.value.trim()) body.reason = input.value.trim();
    send(body, b);
  });
}

function respondForm(send, s) {
  const area = h("textarea", { rows: 3 });
  const hint = s.inputSchema ? "JSON that fits the schema above" : "JSON, or plain text";
  return decisionForm(
    "Respond instead (your answer becomes the result)",
    [labelled(`Response (${hint})`, area)],
    "Respond",
    (b) => {
      let response;
      try {
        response = JSON.parse(area.value);
      } catch {
        // Not JSON: the person wrote text, and text is what they meant to send.
        response = area.value;
      }
      send({ decision: "respond", response }, b);
    },
  );
}

let fieldCount = 0;

function labelled(text, control) {
  const id = `field-${++fieldCount}`;
  control.id = id;
  return h("p", {}, h("label", { for: id }, text), h("br"), control);
}
