//! One tool call of an item: decide whether it runs, needs a person or is refused; run it (a tool
//! with side effects only once its call is committed); and journal its result, the tool message
//! the model reads next, and the `TOOL_EXECUTION` observation in one commit.

use crate::model::payloads::ToolExecutionContent;
use chrono::Utc;
use serde_json::{Value, json};

use super::changes::Op;
use crate::model::{
    ConversationMessage, ItemStatus, Message, MessageRole, NewObservation, StepType,
    SuspensionKind, SuspensionStatus, TodoItem, ToolCallRecord, ToolResultRecord, ToolResultStatus,
    new_id,
};

use super::Engine;
use super::journal::Ctx;
use super::prompts;

/// A pure tool call still running after this long gets the changes staged before it (its
/// tool-call turn) committed on their own, so a person watching sees a slow call while it runs.
/// A tool with side effects starts only once its turn is committed: should a later commit fail,
/// the run's next owner finds this very call unanswered and runs it under the same idempotency
/// key, instead of asking the model again and running a call it names anew. A pure call repeated
/// after a failed commit is harmless, so quick ones have their turn and result committed together.
pub const FLUSH_SLOW_TOOL_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// What happens to one unanswered tool call of an item.
pub(super) enum CallStep {
    /// Run the tool with these arguments.
    Invoke(Value),
    /// Its result is known without running anything (refused, rejected, answered by a person,
    /// or `update_plan`), with the observations and row changes to commit with it.
    Answered(ToolResultRecord, Vec<NewObservation>, Vec<Op>),
    /// It waits for a person (the suspension is staged, or already pending).
    Wait,
}

impl Engine {
    /// Decide what an unanswered call of the item needs: a refusal (the tool is not available
    /// to the item), a person (a blocking tool, or one in `requireApproval`: a suspension is
    /// staged, or the person's decision becomes the call's outcome), or to run.
    pub(super) fn call_step(
        &self,
        ctx: &mut Ctx<'_>,
        item_id: &str,
        call: &ToolCallRecord,
    ) -> CallStep {
        let error_result = |msg: String| ToolResultRecord {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            status: ToolResultStatus::Error,
            output: Value::Null,
            error: Some(msg),
        };
        let item = &ctx.items[ctx.item_idx(item_id).expect("item")];
        if call.name == prompts::UPDATE_PLAN_TOOL && item.parent_item_id.is_some() {
            return CallStep::Answered(
                error_result(format!(
                    "`{}` is not available to an item of a team: the run's plan is not its to \
                     change",
                    prompts::UPDATE_PLAN_TOOL
                )),
                vec![],
                vec![],
            );
        }
        if call.name == prompts::UPDATE_PLAN_TOOL {
            let (r, obs, ops) = self.apply_plan_update(ctx, call);
            return CallStep::Answered(r, obs, ops);
        }
        if item.step_type == StepType::Reasoning || !self.item_may_call(ctx, item, &call.name) {
            // A tool of a server that is down (never listed yet) is not offered; the model
            // named it anyway, so tell it why it cannot have it.
            let msg = match self.tools.validate(&call.name, &call.arguments) {
                Err(e @ crate::tools::ToolError::Unavailable(_)) => e.to_string(),
                _ => format!("tool `{}` is not available for this item", call.name),
            };
            return CallStep::Answered(error_result(msg), vec![], vec![]);
        }
        // A flowchart call paused at one of its stages waits for that decision.
        let paused_at = format!("{}:", call.id);
        if super::calls::kind_of(self, &ctx.env, &call.name).pauses_inside()
            && ctx.suspensions.iter().any(|s| {
                s.status == SuspensionStatus::Pending && s.tool_call.id.starts_with(&paused_at)
            })
        {
            return CallStep::Wait;
        }
        let Some(kind) = self.needs_person(ctx, &call.name) else {
            return CallStep::Invoke(call.arguments.clone());
        };
        let decided = ctx
            .suspensions
            .iter()
            .find(|s| s.tool_call.id == call.id && s.item_id.as_str() == item_id)
            .cloned();
        match decided {
            Some(s) if s.status == SuspensionStatus::Pending => CallStep::Wait,
            Some(s) => self.decision_step(call, &s),
            None => match self.validate_call(ctx, &call.name, &call.arguments) {
                // Arguments that do not fit are the model's to fix, not a person's.
                Err(e) => CallStep::Answered(error_result(e.to_string()), vec![], vec![]),
                Ok(()) => {
                    self.suspend(ctx, item_id, call, kind);
                    CallStep::Wait
                }
            },
        }
    }

    /// Journal a call's outcome (staged): the result in the item's journal, the tool message the
    /// model reads next, and `TOOL_EXECUTION`, with whatever the outcome brought along.
    pub(super) fn journal_result(
        &self,
        ctx: &mut Ctx<'_>,
        item_id: &str,
        call: &ToolCallRecord,
        result: ToolResultRecord,
        extra: Vec<NewObservation>,
        extra_ops: Vec<Op>,
    ) {
        let Some(idx) = ctx.item_idx(item_id) else {
            return;
        };
        let result = cap_result(result, self.settings.tool_result_max_bytes);
        let it = &mut ctx.items[idx];
        let was_waiting = it.status == ItemStatus::Waiting;
        if was_waiting {
            it.status = ItemStatus::InProgress;
        }
        it.actual_tool_calls.push(call.clone());
        it.conversation.push(ConversationMessage {
            role: MessageRole::Tool,
            content: Some(tool_message_text(&result)),
            tool_calls: vec![],
            tool_call_id: Some(call.id.clone()),
        });
        it.tool_results.push(result.clone());
        it.updated_at = Utc::now();
        let mut b = ctx.batch();
        for op in extra_ops {
            b.op(op);
        }
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.op(Op::AppendMessage(Message {
            id: new_id(),
            thread_id: ctx.env.thread_id.clone(),
            run_id: Some(ctx.run.run_id),
            role: MessageRole::Tool,
            content: tool_message_text(&result),
            item_id: Some(item_id.to_owned()),
            tool_call_id: Some(call.id.clone()),
            name: Some(call.name.clone()),
            tool_calls: vec![],
            created_at: Utc::now(),
        }));
        if was_waiting {
            b.observe(ctx.status_change(&ctx.items[idx], ItemStatus::Waiting));
        }
        b.observe(ctx.emit(
            Some(item_id),
            call.name.clone(),
            &ToolExecutionContent {
                tool_call_id: result.tool_call_id.clone(),
                name: result.name.clone(),
                status: result.status,
                output: result.output.clone(),
                error: result.error.clone(),
            },
        ));
        for o in extra {
            b.observe(o);
        }
        ctx.stage(b);
    }

    /// Whether the item may call `name`: the tool is enabled for the thread, and within the
    /// item's `toolAllowlist` and its role's `tools` when they are given.
    pub(super) fn item_may_call(&self, ctx: &Ctx<'_>, item: &TodoItem, name: &str) -> bool {
        self.enabled_tools(ctx).iter().any(|t| t == name)
            && item
                .tool_allowlist
                .as_ref()
                .is_none_or(|l| l.iter().any(|t| t == name))
            && item
                .role
                .as_ref()
                .and_then(|r| ctx.env.cfg.roles.as_ref()?.get(r))
                .and_then(|r| r.tools.as_ref())
                .is_none_or(|l| l.iter().any(|t| t == name))
    }

    /// Whether calls of `name` wait for a person, and what they ask.
    fn needs_person(&self, ctx: &Ctx<'_>, name: &str) -> Option<SuspensionKind> {
        if let Some(kind) = self.tools.get(name).and_then(|t| t.blocking()) {
            return Some(kind);
        }
        ctx.env
            .cfg
            .require_approval
            .as_ref()
            .is_some_and(|list| list.iter().any(|n| n == name))
            .then_some(SuspensionKind::Approval)
    }
}

/// `result` with its output and error at most `max` bytes each (as JSON text), whatever the tool
/// that made it: every result passes here on its way into the journal, so no source (built-in,
/// HTTP, MCP, flowchart, remote agent) can store more or put more in a prompt. A string output is
/// cut on a character boundary; any other output too large becomes the start of its JSON text as
/// a string. Either way a marker says how many bytes were cut.
pub(super) fn cap_result(mut result: ToolResultRecord, max: usize) -> ToolResultRecord {
    if let Some(e) = &result.error
        && e.len() > max
    {
        result.error = Some(cut(e, max));
    }
    let text = match &result.output {
        Value::String(s) if s.len() > max => s.clone(),
        Value::String(_) => return result,
        other => {
            let json = other.to_string();
            if json.len() <= max {
                return result;
            }
            json
        }
    };
    result.output = Value::String(cut(&text, max));
    result
}

/// The first `max` bytes of `text` (at a character boundary) and a marker saying how much was cut.
fn cut(text: &str, max: usize) -> String {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}…[truncated: {} of {} bytes cut (PES_TOOL_RESULT_MAX_BYTES)]",
        &text[..end],
        text.len() - end,
        text.len()
    )
}

/// What the model reads as a tool's result.
fn tool_message_text(r: &ToolResultRecord) -> String {
    match (r.status, &r.error) {
        (ToolResultStatus::Success | ToolResultStatus::Responded, _) => match &r.output {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        },
        (_, Some(e)) => json!({"error": e}).to_string(),
        _ => r.output.to_string(),
    }
}

#[cfg(test)]
mod cap_tests {
    use super::*;

    fn record(output: Value) -> ToolResultRecord {
        ToolResultRecord {
            tool_call_id: "c".into(),
            name: "t".into(),
            status: ToolResultStatus::Success,
            output,
            error: None,
        }
    }

    #[test]
    fn a_large_result_is_cut_with_a_marker_and_a_small_one_is_kept() {
        let small = record(json!({"a": 1}));
        assert_eq!(cap_result(small.clone(), 64), small);
        let big = cap_result(record(Value::String("é".repeat(100))), 51);
        let text = big.output.as_str().unwrap();
        assert!(text.starts_with(&"é".repeat(25)), "{text}");
        assert!(text.contains("truncated: 150 of 200 bytes cut"), "{text}");
        let obj = cap_result(record(json!({"rows": vec![1; 1000]})), 100);
        let text = obj.output.as_str().unwrap();
        assert!(text.starts_with("{\"rows\":[1,1,"), "{text}");
        assert!(text.contains("truncated:"), "{text}");
    }
}
