//! Flowchart runs (`kind: "flowchart"`): a run that runs one flowchart with an input, with no
//! model planning and no synthesis, its output the run's answer.
//!
//! The design: **a run whose plan is one item that makes one flowchart call.** Instead of asking
//! the planner, the run starts with that item already in progress and its one call already made
//! (`TOOL_CALL`, committed before the call starts, so the flowchart's steps nest under it as in
//! any run). From there the run is an ordinary run: the scheduler takes the call as it takes
//! every call, through the flowchart [`super::calls`] kind, so everything a flowchart call inside
//! an agent run has, this run has with no code of its own — each stage committed as a
//! `FLOWCHART_STEP` and replayed after a crash (no committed stage runs again); a stage, or the
//! whole call, waiting for a person on the thread's `requireApproval` (and the server's floor)
//! with the suspension decided through the usual routes; `llm` stages passing the run's budget
//! meter; the thread's `tools` bounding what it and its `tool` stages may call; cancel, drain and
//! lease loss. Once the call has its result, the item asks the model nothing more, and the run
//! ends here: the output becomes `FINAL_RESPONSE` (`output`, and as text in `response`) and the
//! run completes; a failed or rejected call fails the run with the reason.
//!
//! Why not a path of its own beside `drive`: suspensions, decisions, cancellation, budgets and
//! resumption are all keyed by an item and its call; a separate path would repeat each of them.
//! Why not a plan the planner makes: it would need a model call, which is what a deterministic
//! flowchart must not need. A flowchart run works only on its own item: it never starts the
//! thread's pending items of earlier runs (see [`Ctx::works_on`]).

use chrono::Utc;
use serde_json::Value;
use uuid::Uuid;

use super::Engine;
use super::changes::{Op, RunUpdate};
use super::journal::{Ctx, Halt};
use crate::model::payloads::{
    FinalResponseContent, PlanContent, RunCompletedContent, ToolCallContent, summary,
};
use crate::model::{
    ConversationMessage, ErrorInfo, ItemId, ItemKind, ItemStatus, Message, MessageRole, RunKind,
    RunPhase, RunStatus, StepType, TodoItem, ToolCallRecord, ToolResultStatus, ToolValidationMode,
    Usage, ValidationStatus, new_id,
};

/// The id of a flowchart run's one item, and of its one call: made from the run's id, so it is
/// unique on the thread (a stage's suspension is `<call id>:…`) and found again on resume.
fn own_id(run: Uuid) -> String {
    format!("flowchart-{run}")
}

/// A failure of the flowchart run (on its item).
fn failed(ctx: &Ctx<'_>, code: &str, message: String) -> Halt {
    Halt::Fail(
        ErrorInfo {
            code: code.into(),
            message,
        },
        Some(own_id(ctx.run.run_id)),
    )
}

impl Ctx<'_> {
    /// Whether the run works on `item`: an agent run on any of its thread's items; a flowchart
    /// run on its own item only (it plans nothing and starts nothing else).
    pub(super) fn works_on(&self, item: &TodoItem) -> bool {
        self.run.kind == RunKind::Agent || self.is_flowchart_item(item)
    }

    /// Whether `item` is this flowchart run's one item, which asks the model nothing: once its
    /// call has a result, the run ends ([`Engine::finish_flowchart`]).
    pub(super) fn is_flowchart_item(&self, item: &TodoItem) -> bool {
        self.run.kind == RunKind::Flowchart && item.id.as_str() == own_id(self.run.run_id)
    }
}

impl Engine {
    /// The plan of a flowchart run, instead of the planner's: its one item, in progress, with
    /// its call made (`PLAN`, `ITEM_STATUS_CHANGE`, `TOOL_CALL`), committed with `RUN_STARTED`
    /// before the call starts.
    pub(super) async fn start_flowchart(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let Some(call) = ctx.run.flowchart.clone() else {
            return Err(Halt::Fail(
                ErrorInfo {
                    code: "flowchart_failed".into(),
                    message: "the run names no flowchart to run".into(),
                },
                None,
            ));
        };
        let id = own_id(ctx.run.run_id);
        let record = ToolCallRecord {
            id: id.clone(),
            name: call.name.clone(),
            arguments: call.input,
        };
        let now = Utc::now();
        let item = TodoItem {
            id: ItemId::from_stored(id.clone()),
            position: ctx.items.iter().map(|i| i.position + 1).max().unwrap_or(0),
            description: format!("Run the flowchart `{}`", call.name),
            status: ItemStatus::InProgress,
            dependencies: vec![],
            step_type: StepType::Tool,
            required_tools: vec![],
            tool_validation_mode: ctx
                .env
                .cfg
                .tool_validation_mode
                .unwrap_or(ToolValidationMode::Strict),
            validation_status: ValidationStatus::Skipped,
            expected_outcome: None,
            tool_calls: vec![record.clone()],
            actual_tool_calls: vec![],
            tool_results: vec![],
            thoughts: vec![],
            result: None,
            error: None,
            attempts: 1,
            usage: Usage::default(),
            conversation: vec![ConversationMessage {
                role: MessageRole::Assistant,
                content: None,
                tool_calls: vec![record.clone()],
                tool_call_id: None,
            }],
            run_id: Some(ctx.run.run_id),
            created_at: now,
            updated_at: now,
            started_at: Some(now),
            completed_at: None,
            kind: ItemKind::Leaf,
            parent_item_id: None,
            role: None,
            tool_allowlist: None,
            compacted_output: None,
        };
        ctx.items.push(item.clone());
        ctx.state.current_step_id = Some(id.clone());
        let mut b = ctx.batch();
        b.op(Op::UpsertItem(Box::new(item.clone())));
        b.op(Op::SetAgentState(ctx.state.clone()));
        // The call's turn, as a model's would be: the tool message that answers it follows.
        b.op(Op::AppendMessage(Message {
            id: new_id(),
            thread_id: ctx.env.thread_id.clone(),
            run_id: Some(ctx.run.run_id),
            role: MessageRole::Assistant,
            content: String::new(),
            item_id: Some(id.clone()),
            tool_call_id: None,
            name: None,
            tool_calls: vec![record.clone()],
            created_at: now,
        }));
        b.observe(ctx.emit(
            None,
            "Plan",
            &PlanContent {
                plan: item.description.clone(),
                todo_list: summary(&ctx.items),
                team_id: None,
            },
        ));
        b.observe(ctx.status_change(&item, ItemStatus::Pending));
        b.observe(ctx.emit(
            Some(&id),
            record.name.clone(),
            &ToolCallContent {
                tool_call_id: record.id.clone(),
                name: record.name.clone(),
                arguments: record.arguments.clone(),
            },
        ));
        b.op(Op::UpdateRun(RunUpdate {
            phase: Some(RunPhase::Executing),
            ..Default::default()
        }));
        ctx.commit(b).await?;
        ctx.run.phase = RunPhase::Executing;
        Ok(())
    }

    /// The end of a flowchart run whose item has nothing left to do: its call's output is the
    /// answer (`FINAL_RESPONSE` with `output`, `RUN_COMPLETED`), committed with the item's
    /// completion; a call that failed, or that a person rejected, fails the run with why.
    pub(super) async fn finish_flowchart(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let id = own_id(ctx.run.run_id);
        let name = ctx
            .run
            .flowchart
            .as_ref()
            .map(|c| c.name.clone())
            .unwrap_or_default();
        let Some(idx) = ctx.item_idx(&id) else {
            return Err(Halt::Fail(
                ErrorInfo {
                    code: "flowchart_failed".into(),
                    message: format!("the flowchart `{name}` did not run: its item is gone"),
                },
                None,
            ));
        };
        let result = ctx.items[idx]
            .tool_results
            .iter()
            .find(|r| r.tool_call_id == id)
            .cloned();
        let Some(result) = result else {
            return Err(failed(
                ctx,
                "flowchart_failed",
                format!("the flowchart `{name}` did not run to its end"),
            ));
        };
        let output = match result.status {
            ToolResultStatus::Success | ToolResultStatus::Responded => result.output,
            ToolResultStatus::Rejected => {
                let reason = result.output["reason"]
                    .as_str()
                    .unwrap_or("no reason given")
                    .to_owned();
                return Err(failed(
                    ctx,
                    "flowchart_rejected",
                    format!("a person rejected running the flowchart `{name}`: {reason}"),
                ));
            }
            ToolResultStatus::Error => {
                let why = result.error.unwrap_or_else(|| result.output.to_string());
                return Err(failed(
                    ctx,
                    "flowchart_failed",
                    format!("the flowchart `{name}` failed: {why}"),
                ));
            }
        };
        let response = match &output {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let now = Utc::now();
        let limit = self.compaction_threshold(ctx);
        let it = &mut ctx.items[idx];
        let previous = it.status;
        it.status = ItemStatus::Completed;
        it.result = Some(response.clone());
        // What later runs' items read of it: no model is asked to compact it.
        it.compacted_output = Some(super::prompts::truncate(&response, limit));
        it.completed_at = Some(now);
        it.updated_at = now;
        ctx.state.current_step_id = None;
        let final_response = FinalResponseContent {
            response: response.clone(),
            sources: vec![],
            suggestions: vec![],
            output: Some(output),
        };
        let mut b = ctx.batch();
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.op(Op::SetAgentState(ctx.state.clone()));
        b.op(Op::AppendMessage(Message {
            id: new_id(),
            thread_id: ctx.env.thread_id.clone(),
            run_id: Some(ctx.run.run_id),
            role: MessageRole::Assistant,
            content: response,
            item_id: None,
            tool_call_id: None,
            name: None,
            tool_calls: vec![],
            created_at: now,
        }));
        b.observe(ctx.status_change(&ctx.items[idx], previous));
        b.observe(ctx.emit(None, "Final response", &final_response));
        let duration_ms = ctx
            .run
            .started_at
            .map(|s| (now - s).num_milliseconds().max(0))
            .unwrap_or_else(|| ctx.env.started.elapsed().as_millis() as i64);
        b.observe(ctx.emit(
            None,
            "Run completed",
            &RunCompletedContent {
                usage: ctx.usage,
                duration_ms,
            },
        ));
        b.op(Op::UpdateRun(RunUpdate {
            status: Some(RunStatus::Completed),
            phase: Some(RunPhase::Done),
            usage: Some(ctx.usage),
            final_response: Some(
                serde_json::to_value(&final_response)
                    .map_err(|e| Halt::Store(anyhow::anyhow!("the final response as JSON: {e}")))?,
            ),
            ended: true,
            ..Default::default()
        }));
        ctx.commit(b).await?;
        ctx.run.phase = RunPhase::Done;
        Ok(())
    }
}
