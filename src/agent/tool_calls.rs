//! One tool call of an item: decide whether it runs, needs a person or is refused; run it (a tool
//! with side effects only once its call is committed); and journal its result, the tool message
//! the model reads next, and the `TOOL_EXECUTION` observation in one commit.

use chrono::Utc;
use serde_json::{Value, json};

use crate::model::{
    ConversationMessage, ItemStatus, Message, MessageRole, NewObservation, ObservationType,
    StepType, SuspensionKind, SuspensionStatus, ToolCallRecord, ToolResultRecord, ToolResultStatus,
    new_id,
};
use crate::store::Op;
use crate::tools::ToolContext;

use super::journal::{Ctx, Halt};
use super::prompts;
use super::{Engine, RunEnd};

/// A pure tool call still running after this long gets its tool-call turn committed on its own
/// (a tool with side effects has its turn committed before it starts).
pub const FLUSH_SLOW_TOOL_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

impl Engine {
    /// Execute one tool call of the item and journal its result before anything else happens.
    /// A call that needs a person (a blocking tool, or one in `requireApproval`) suspends the run
    /// instead, and once the person decided, the decision becomes the call's result.
    pub(super) async fn run_tool_call(
        &self,
        ctx: &mut Ctx<'_>,
        item_id: &str,
        call: ToolCallRecord,
    ) -> Result<Option<RunEnd>, Halt> {
        let mut extra: Vec<NewObservation> = Vec::new();
        let mut extra_ops: Vec<Op> = Vec::new();
        let error_result = |msg: String| ToolResultRecord {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            status: ToolResultStatus::Error,
            output: Value::Null,
            error: Some(msg),
        };
        let item_is_reasoning =
            ctx.items[ctx.item_idx(item_id).expect("item")].step_type == StepType::Reasoning;
        let result = if call.name == prompts::UPDATE_PLAN_TOOL {
            let (r, obs, ops) = self.apply_plan_update(ctx, &call);
            extra.extend(obs);
            extra_ops.extend(ops);
            r
        } else if !self.enabled_tools(&ctx.cfg).contains(&call.name) || item_is_reasoning {
            error_result(format!(
                "tool `{}` is not available for this item",
                call.name
            ))
        } else if let Some(kind) = self.needs_person(ctx, &call.name) {
            let decided = ctx
                .suspensions
                .iter()
                .find(|s| s.tool_call.id == call.id && s.item_id.as_str() == item_id)
                .cloned();
            match decided {
                Some(s) if s.status == SuspensionStatus::Pending => {
                    return Ok(Some(RunEnd::Suspended));
                }
                Some(s) => self.apply_decision(ctx, &call, &s).await?,
                None => match self.tools.validate(&call.name, &call.arguments) {
                    // Arguments that do not fit are the model's to fix, not a person's.
                    Err(e) => error_result(e.to_string()),
                    Ok(()) => return self.suspend(ctx, item_id, &call, kind).await.map(Some),
                },
            }
        } else {
            self.invoke(ctx, &call, call.arguments.clone()).await?
        };
        let idx = ctx
            .item_idx(item_id)
            .expect("the running item is never removed");
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
            thread_id: ctx.thread_id.clone(),
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
        b.observe(ctx.obs(
            Some(item_id),
            ObservationType::ToolExecution,
            call.name.clone(),
            json!({
                "toolCallId": result.tool_call_id,
                "name": result.name,
                "status": result.status,
                "output": result.output,
                "error": result.error,
            }),
        ));
        for o in extra {
            b.observe(o);
        }
        ctx.commit(b).await?;
        Ok(None)
    }

    /// Whether calls of `name` wait for a person, and what they ask.
    fn needs_person(&self, ctx: &Ctx<'_>, name: &str) -> Option<SuspensionKind> {
        if let Some(kind) = self.tools.get(name).and_then(|t| t.blocking()) {
            return Some(kind);
        }
        ctx.cfg
            .require_approval
            .as_ref()
            .is_some_and(|list| list.iter().any(|n| n == name))
            .then_some(SuspensionKind::Approval)
    }

    /// Run a tool (its arguments are validated by the registry) and describe the outcome.
    ///
    /// A tool with side effects starts only once everything staged, the model turn that names
    /// the call included, is committed: should a later commit fail, the run's next owner finds
    /// this very call unanswered and runs it under the same idempotency key, instead of asking
    /// the model again and running a call it names anew under a new key. A pure tool keeps the
    /// fast path: the staged turn is committed together with its result when the tool is quick,
    /// and on its own as soon as the tool has taken [`FLUSH_SLOW_TOOL_AFTER`], so a person
    /// watching sees a slow call while it runs (a pure call repeated after a failed commit is
    /// harmless).
    pub(super) async fn invoke(
        &self,
        ctx: &mut Ctx<'_>,
        call: &ToolCallRecord,
        args: Value,
    ) -> Result<ToolResultRecord, Halt> {
        if self.tools.has_side_effects(&call.name) {
            // A cancel this commit brings back is seen below before the tool is first polled.
            ctx.flush().await?;
        }
        let tctx = ToolContext {
            tenant: ctx.tenant.clone(),
            thread_id: ctx.thread_id.to_string(),
            idempotency_key: format!("{}:{}", ctx.run.run_id, call.id),
        };
        let signals = ctx.signals;
        let running = self.tools.invoke(&call.name, args, &tctx);
        tokio::pin!(running);
        let slow = tokio::time::sleep(FLUSH_SLOW_TOOL_AFTER);
        tokio::pin!(slow);
        let mut flushed = ctx.pending.is_empty();
        let outcome = loop {
            tokio::select! {
                biased;
                _ = signals.shutdown.cancelled() => return Err(Halt::Shutdown),
                _ = signals.cancel.cancelled() => return Err(Halt::Cancel),
                outcome = &mut running => break outcome,
                _ = &mut slow, if !flushed => {
                    flushed = true;
                    ctx.flush().await?;
                }
            }
        };
        Ok(ToolResultRecord {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            status: if outcome.error.is_none() {
                ToolResultStatus::Success
            } else {
                ToolResultStatus::Error
            },
            error: outcome.error.map(|e| {
                let mut text = e.to_string();
                crate::model::scrub_nul_str(&mut text);
                text
            }),
            output: outcome.output,
        })
    }
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
