//! Observations in, AG-UI events out: the one place that knows how a run of ours reads as an
//! AG-UI run. Pure (no I/O): the stream feeds it the run's observations and token deltas in log
//! order, and it keeps what the order rules need (the open steps and text message, the todo
//! list the deltas are computed against), so the events it gives back always form a valid
//! AG-UI run: `RUN_STARTED` first, every `*_START` closed, `RUN_FINISHED` or `RUN_ERROR` last.
//!
//! The mapping:
//!
//! | observation | events |
//! | --- | --- |
//! | `PLAN`, `PLAN_UPDATE` | `STATE_DELTA` of the todo list |
//! | `ITEM_STATUS_CHANGE` | `STATE_DELTA`; `STEP_STARTED` when the item starts, `STEP_FINISHED` when it ends |
//! | `TOOL_CALL` | `TOOL_CALL_START`, `TOOL_CALL_ARGS` (the arguments as JSON), `TOOL_CALL_END` |
//! | `TOOL_EXECUTION` | `TOOL_CALL_RESULT` |
//! | token deltas of the synthesis | `TEXT_MESSAGE_START`, `TEXT_MESSAGE_CONTENT` (the answer as it is written) |
//! | `FINAL_RESPONSE` | the rest of the answer's text, `TEXT_MESSAGE_END` |
//! | `RUN_COMPLETED` | `RUN_FINISHED` success, with the answer as `result` |
//! | `RUN_SUSPENDED` | `RUN_FINISHED` interrupt, one interrupt per pending suspension |
//! | `RUN_CANCELLED` | `RUN_FINISHED` cancelled |
//! | `RUN_FAILED` | `RUN_ERROR` |
//!
//! One run of ours may be several AG-UI runs: one until it first suspends, then one per resume.
//! Each opens with `RUN_STARTED` and a `STATE_SNAPSHOT` ([`Fold::open`]); its usage is what
//! it spent itself (the AG-UI accounting), so the usage reported when it last suspended is
//! subtracted.

use serde_json::{Value, json};
use uuid::Uuid;

use super::answer::AnswerText;
use super::events::{Body, Event, Interrupt, Outcome, PROTOCOL_VERSION, TokenUsage};
pub use super::state::Base;
use crate::events::TokenDelta;
use crate::llm::Phase;
use crate::model::payloads::{
    FinalResponseContent, ItemStatusChangeContent, RunCancelledContent, RunCompletedContent,
    RunFailedContent, RunSuspendedContent, ToolCallContent, ToolExecutionContent,
};
use crate::model::{
    ItemStatus, Observation, ObservationType, Run, RunStatus, Suspension, SuspensionKind, Usage,
};

/// The final answer's text as it streams: read until the answer begins, then a message.
#[derive(Debug, Default)]
struct Text {
    /// The message, once the answer has begun.
    message_id: Option<String>,
    /// What has been sent of it.
    sent: String,
    reader: AnswerText,
}

/// One AG-UI run over the observations of one run of ours.
#[derive(Debug)]
pub struct Fold {
    thread_id: String,
    run_id: String,
    pes_run_id: Uuid,
    base: Base,
    open_steps: Vec<String>,
    text: Option<Text>,
    /// Text messages made so far (the answer normally takes one).
    messages: u32,
    answer: Option<Value>,
    finished: bool,
}

fn millis(o: &Observation) -> Option<i64> {
    Some(o.created_at.timestamp_millis())
}

impl Fold {
    /// The AG-UI run `run_id` of thread `thread_id`, over our run `pes_run_id`, from `base`.
    pub fn new(thread_id: String, run_id: String, pes_run_id: Uuid, base: Base) -> Self {
        Self {
            thread_id,
            run_id,
            pes_run_id,
            base,
            open_steps: Vec::new(),
            text: None,
            messages: 0,
            answer: None,
            finished: false,
        }
    }

    /// Whether the AG-UI run has ended (`RUN_FINISHED` or `RUN_ERROR` given).
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The events that open the run: `RUN_STARTED` (our thread and run ids and `seq` in
    /// `metadata.pes`), the state, and, when the run goes on from where another stream left it
    /// (`continuing`), a step for each item already running or waiting.
    pub fn open(&mut self, continuing: bool, seq: i64, now: i64) -> Vec<Event> {
        let at = Some(now);
        let mut out = vec![
            Event::at(
                Body::RunStarted {
                    thread_id: self.thread_id.clone(),
                    run_id: self.run_id.clone(),
                    protocol_version: PROTOCOL_VERSION,
                    metadata: Some(json!({"pes": {
                        "threadId": self.thread_id,
                        "runId": self.pes_run_id,
                        "seq": seq,
                    }})),
                },
                at,
            ),
            Event::at(
                Body::StateSnapshot {
                    snapshot: self.base.todo.snapshot(),
                },
                at,
            ),
        ];
        if continuing {
            for id in self.base.todo.active() {
                out.push(Event::at(
                    Body::StepStarted {
                        step_name: id.clone(),
                    },
                    at,
                ));
                self.open_steps.push(id);
            }
        }
        out
    }

    /// The events `o` stands for. `suspensions` are the suspensions a `RUN_SUSPENDED` names
    /// (read by the caller; ignored for other observations).
    pub fn observation(&mut self, o: &Observation, suspensions: &[Suspension]) -> Vec<Event> {
        if self.finished || o.run_id != Some(self.pes_run_id) {
            return Vec::new();
        }
        let at = millis(o);
        let mut out = Vec::new();
        match o.kind {
            ObservationType::Plan | ObservationType::PlanUpdate => self.state(o, &mut out),
            ObservationType::ItemStatusChange => {
                self.state(o, &mut out);
                let Some(c) = o.payload::<ItemStatusChangeContent>() else {
                    return out;
                };
                let item = c.item_id.to_string();
                match c.status {
                    ItemStatus::InProgress | ItemStatus::Waiting => {
                        if !self.open_steps.contains(&item) {
                            self.open_steps.push(item.clone());
                            out.push(Event::at(Body::StepStarted { step_name: item }, at));
                        }
                    }
                    _ => {
                        if let Some(i) = self.open_steps.iter().position(|s| *s == item) {
                            self.open_steps.remove(i);
                            out.push(Event::at(Body::StepFinished { step_name: item }, at));
                        }
                    }
                }
            }
            ObservationType::ToolCall => {
                let Some(c) = o.payload::<ToolCallContent>() else {
                    return out;
                };
                let id = c.tool_call_id;
                out.push(Event::at(
                    Body::ToolCallStart {
                        tool_call_id: id.clone(),
                        tool_call_name: c.name,
                    },
                    at,
                ));
                out.push(Event::at(
                    Body::ToolCallArgs {
                        tool_call_id: id.clone(),
                        delta: c.arguments.to_string(),
                    },
                    at,
                ));
                out.push(Event::at(Body::ToolCallEnd { tool_call_id: id }, at));
            }
            ObservationType::ToolExecution => {
                if let Some(c) = o.payload::<ToolExecutionContent>() {
                    out.push(Event::at(
                        Body::ToolCallResult {
                            message_id: o.id.to_string(),
                            content: result_text(&c),
                            tool_call_id: c.tool_call_id,
                            role: "tool",
                        },
                        at,
                    ));
                }
            }
            ObservationType::RunStarted => self.base.started(o),
            ObservationType::FinalResponse => {
                if let Some(c) = o.payload::<FinalResponseContent>() {
                    self.answer = Some(o.content.clone());
                    self.final_text(&c.response, at, &mut out);
                }
            }
            ObservationType::RunCompleted => {
                self.close(at, &mut out);
                let usage = o.payload::<RunCompletedContent>().map(|c| c.usage);
                let usage = self.usage(usage);
                out.push(self.finish(Outcome::Success, self.answer.clone(), usage, at));
            }
            ObservationType::RunCancelled => {
                self.close(at, &mut out);
                let usage = o.payload::<RunCancelledContent>().and_then(|c| c.usage);
                let usage = self.usage(usage);
                out.push(self.finish(Outcome::Cancelled, None, usage, at));
            }
            ObservationType::RunSuspended => {
                self.close(at, &mut out);
                let usage = o.payload::<RunSuspendedContent>().map(|c| c.usage);
                let usage = self.usage(usage);
                out.push(self.interrupted(suspensions, usage, at));
            }
            ObservationType::RunFailed => {
                let c = o.payload::<RunFailedContent>();
                let (message, code) = match &c {
                    Some(c) => (c.error.message.clone(), Some(c.error.code.clone())),
                    None => ("the run failed".to_owned(), None),
                };
                let usage = self.usage(c.map(|c| c.usage));
                out.push(self.error(message, code, usage, at));
            }
            _ => {}
        }
        out
    }

    /// The events a token delta stands for: the answer's text as the model writes it (the
    /// message starts with the first character of the answer, not with the JSON around it).
    pub fn token(&mut self, d: &TokenDelta, now: i64) -> Vec<Event> {
        if self.finished || d.run_id != self.pes_run_id || d.phase != Phase::Synthesize {
            return Vec::new();
        }
        let at = Some(now);
        let piece = self
            .text
            .get_or_insert_with(Text::default)
            .reader
            .push(&d.delta);
        if piece.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if self.text.as_ref().is_some_and(|t| t.message_id.is_none()) {
            let id = self.start_text(at, &mut out);
            if let Some(t) = &mut self.text {
                t.message_id = Some(id);
            }
        }
        if let Some(t) = &mut self.text {
            t.sent.push_str(&piece);
            out.push(Event::at(
                Body::TextMessageContent {
                    message_id: t.message_id.clone().unwrap_or_default(),
                    delta: piece,
                },
                at,
            ));
        }
        out
    }

    /// The run ends without its end in the log: the stream is cut (`code` says why).
    pub fn cut(&mut self, message: &str, code: &str, now: i64) -> Vec<Event> {
        if self.finished {
            return Vec::new();
        }
        vec![self.error(message.to_owned(), Some(code.to_owned()), None, Some(now))]
    }

    /// The end of a run that had already ended when the stream reached the point it was asked
    /// to start after: said again from the run as it is stored (`suspensions`: its pending ones).
    pub fn ended(&mut self, run: &Run, suspensions: &[Suspension], now: i64) -> Vec<Event> {
        let at = Some(now);
        let mut out = Vec::new();
        self.close(at, &mut out);
        let usage = self.usage(Some(run.usage));
        out.push(match run.status {
            RunStatus::Completed => {
                self.finish(Outcome::Success, run.final_response.clone(), usage, at)
            }
            RunStatus::Cancelled => self.finish(Outcome::Cancelled, None, usage, at),
            RunStatus::Suspended => self.interrupted(suspensions, usage, at),
            _ => {
                let (message, code) = run
                    .error
                    .as_ref()
                    .map(|e| (e.message.clone(), Some(e.code.clone())))
                    .unwrap_or_else(|| ("the run failed".into(), None));
                self.error(message, code, usage, at)
            }
        });
        out
    }

    /// Open a text message for the answer: its id.
    fn start_text(&mut self, at: Option<i64>, out: &mut Vec<Event>) -> String {
        self.messages += 1;
        let message_id = if self.messages == 1 {
            format!("{}:answer", self.pes_run_id)
        } else {
            format!("{}:answer:{}", self.pes_run_id, self.messages)
        };
        out.push(Event::at(
            Body::TextMessageStart {
                message_id: message_id.clone(),
                role: "assistant",
            },
            at,
        ));
        message_id
    }

    /// The answer as stored: what the streamed text lacks, then the end. A streamed text the
    /// answer does not continue (the model's reply was retried) is closed as it is, and the
    /// answer is sent whole as a message of its own.
    fn final_text(&mut self, response: &str, at: Option<i64>, out: &mut Vec<Event>) {
        let open = self
            .text
            .take()
            .and_then(|t| t.message_id.map(|id| (id, t.sent)));
        let (message_id, rest) = match open {
            Some((id, sent)) if response.starts_with(&sent) => {
                (id, response[sent.len()..].to_owned())
            }
            stale => {
                if let Some((message_id, _)) = stale {
                    out.push(Event::at(Body::TextMessageEnd { message_id }, at));
                }
                (self.start_text(at, out), response.to_owned())
            }
        };
        if !rest.is_empty() {
            out.push(Event::at(
                Body::TextMessageContent {
                    message_id: message_id.clone(),
                    delta: rest,
                },
                at,
            ));
        }
        out.push(Event::at(Body::TextMessageEnd { message_id }, at));
    }

    /// Apply a change of the todo list; its patch, when it changed anything.
    fn state(&mut self, o: &Observation, out: &mut Vec<Event>) {
        let before = self.base.todo.snapshot();
        self.base.todo.apply(o);
        let after = self.base.todo.snapshot();
        let delta = json_patch::diff(&before, &after);
        if !delta.0.is_empty() {
            out.push(Event::at(Body::StateDelta { delta }, millis(o)));
        }
    }

    /// Close what the run opened: the text message and the steps.
    fn close(&mut self, at: Option<i64>, out: &mut Vec<Event>) {
        if let Some(message_id) = self.text.take().and_then(|t| t.message_id) {
            out.push(Event::at(Body::TextMessageEnd { message_id }, at));
        }
        for step_name in std::mem::take(&mut self.open_steps) {
            out.push(Event::at(Body::StepFinished { step_name }, at));
        }
    }

    /// This AG-UI run's usage: the run's so far, less what it had spent when it last suspended.
    fn usage(&self, total: Option<Usage>) -> Option<Vec<TokenUsage>> {
        let total = total?;
        let base = &self.base.usage;
        let input = total.prompt_tokens.saturating_sub(base.prompt_tokens);
        let output = total
            .completion_tokens
            .saturating_sub(base.completion_tokens);
        Some(vec![TokenUsage {
            provider: self.base.provider.clone(),
            model: self.base.model.clone(),
            input_tokens: input,
            output_tokens: output,
            total_tokens: input + output,
        }])
    }

    fn finish(
        &mut self,
        outcome: Outcome,
        result: Option<Value>,
        usage: Option<Vec<TokenUsage>>,
        at: Option<i64>,
    ) -> Event {
        self.finished = true;
        Event::at(
            Body::RunFinished {
                thread_id: self.thread_id.clone(),
                run_id: self.run_id.clone(),
                outcome,
                result,
                usage,
            },
            at,
        )
    }

    fn interrupted(
        &mut self,
        suspensions: &[Suspension],
        usage: Option<Vec<TokenUsage>>,
        at: Option<i64>,
    ) -> Event {
        let interrupts: Vec<Interrupt> = suspensions.iter().map(interrupt).collect();
        if interrupts.is_empty() {
            // Decided in the meantime (an interrupt outcome needs at least one): the run goes
            // on, and a new AG-UI run (a resume input, or a reconnect) shows the rest.
            return self.finish(Outcome::Success, None, usage, at);
        }
        self.finish(Outcome::Interrupt { interrupts }, None, usage, at)
    }

    fn error(
        &mut self,
        message: String,
        code: Option<String>,
        usage: Option<Vec<TokenUsage>>,
        at: Option<i64>,
    ) -> Event {
        self.finished = true;
        self.text = None;
        self.open_steps.clear();
        Event::at(
            Body::RunError {
                message,
                code,
                usage,
            },
            at,
        )
    }
}

/// A tool result as text: a string output as it is, anything else as JSON; an error's message.
fn result_text(c: &ToolExecutionContent) -> String {
    if let Some(e) = &c.error {
        return format!("error: {e}");
    }
    match &c.output {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        v => v.to_string(),
    }
}

/// What a person must answer, as an AG-UI interrupt: the suspension's id is the interrupt's,
/// and `responseSchema` says what the resume entry's `payload` is (the decision for an approval,
/// the answer itself for a question).
pub fn interrupt(s: &Suspension) -> Interrupt {
    let offered = s.tenant_decisions();
    let decisions: Vec<&str> = offered.iter().map(|d| d.as_str()).collect();
    let call = &s.tool_call;
    let message = s.asks();
    let (reason, tool_call_id, schema) = match s.kind {
        SuspensionKind::Approval => (
            "tool_approval",
            Some(call.id.clone()),
            json!({
                "type": "object",
                "properties": {
                    "decision": {"type": "string", "enum": decisions},
                    "reason": {"type": "string", "maxLength": 4000},
                    "modifiedArgs": {"type": "object", "description": "With `edit`: the arguments to run the call with."},
                    "response": {"description": "With `respond`: the call's result."}
                },
                "required": ["decision"]
            }),
        ),
        SuspensionKind::Budget => (
            "budget_exceeded",
            None,
            json!({
                "type": "object",
                "properties": {
                    "decision": {"type": "string", "enum": decisions},
                    "reason": {"type": "string", "maxLength": 4000},
                    "raiseBy": {
                        "type": "object",
                        "description": "With `approve`: what to add to the budget.",
                        "properties": {
                            "tokens": {"type": "integer", "minimum": 1},
                            "usd": {"type": "number", "exclusiveMinimum": 0}
                        }
                    }
                },
                "required": ["decision"]
            }),
        ),
        SuspensionKind::Input | SuspensionKind::RemoteInput => (
            if s.kind == SuspensionKind::Input {
                "input_required"
            } else {
                "remote_input_required"
            },
            None,
            s.input_schema
                .clone()
                .filter(Value::is_object)
                .unwrap_or_else(
                    || json!({"description": "The answer: any JSON value (a string will do)."}),
                ),
        ),
    };
    Interrupt {
        id: s.suspension_id.to_string(),
        reason: reason.into(),
        message: Some(message),
        tool_call_id,
        response_schema: Some(schema),
        expires_at: s.expires_at.map(|t| t.to_rfc3339()),
        metadata: Some(json!({"pes": {
            "suspensionId": s.suspension_id,
            "kind": s.kind,
            "itemId": s.item_id,
            "runId": s.run_id,
            "allowedDecisions": decisions,
            "toolCall": {"id": call.id, "name": call.name, "arguments": call.arguments},
        }})),
    }
}

#[cfg(test)]
#[path = "fold_tests.rs"]
mod tests;
