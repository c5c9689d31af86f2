//! Planning: the first plan of a run, the refinement of an existing plan by a later run, one
//! repair request when the model's plan is invalid, and the `update_plan` tool an item may call to
//! replace the items that have not started.
//!
//! A follow-up is planned like a first query, for its own query only: the planner sees the recent
//! conversation ([`HISTORY_MESSAGES`] queries and answers, each cut to
//! [`HISTORY_MESSAGE_CHARS`]) and a bounded summary of what earlier runs did, never the thread's
//! whole history; earlier runs' items are context, never work (a run's end cancels what it left
//! unfinished, and the plan cancels any item an earlier run left behind before that was so); and
//! `maxItems` bounds what this run plans, not what the thread holds.

use crate::model::payloads::{IntentContent, PlanContent, TitleContent};
use serde_json::{Value, json};
use tracing::debug;

use super::changes::{Op, RunUpdate};
use crate::llm::{ChatMessage, ChatRequest, JsonSchemaFormat, Phase};
use crate::model::RunPhase;
use crate::model::{
    AgentConfig, ErrorInfo, ItemStatus, MessageRole, NewObservation, ToolCallRecord,
    ToolResultRecord, ToolResultStatus, ToolValidationMode,
};

use super::Engine;
use super::journal::{Ctx, Halt};
use super::plan::{self, PlanReply, PlannedItem};
use super::prompts::{self, truncate};

/// Queries and answers of the earlier conversation the planner sees (the latest ones: three
/// exchanges). With the summary of earlier runs' items they are what a follow-up refers to; more
/// would make every follow-up's planning prompt grow with the thread.
pub const HISTORY_MESSAGES: usize = 6;
/// Characters of one earlier query or answer the planner sees: a long earlier answer is context
/// for the plan, not its subject.
pub const HISTORY_MESSAGE_CHARS: usize = 1000;

impl Engine {
    /// The names of the tools a run may use ([`Engine::enabled_catalogue`]).
    pub(super) fn enabled_tools(&self, ctx: &Ctx<'_>) -> Vec<String> {
        self.enabled_catalogue(ctx)
            .into_iter()
            .map(|t| t.name)
            .collect()
    }

    /// The enabled tools as the planning prompt lists them: (name, description).
    pub(super) fn described_tools(&self, ctx: &Ctx<'_>, known: &[String]) -> Vec<(String, String)> {
        self.enabled_catalogue(ctx)
            .into_iter()
            .filter(|t| known.contains(&t.name))
            .map(|t| (t.name, t.description))
            .collect()
    }

    pub(super) fn max_team_depth(&self, cfg: &AgentConfig) -> u32 {
        cfg.max_team_depth.unwrap_or(self.settings.max_team_depth)
    }

    pub(super) fn max_items(&self, cfg: &AgentConfig) -> u32 {
        cfg.max_items.unwrap_or(self.settings.max_items)
    }

    /// The conversation before this run as the planner sees it: the latest
    /// [`HISTORY_MESSAGES`] queries and final answers among the thread's latest `history_messages`
    /// messages (no tool use), each cut to [`HISTORY_MESSAGE_CHARS`], oldest first.
    pub(super) fn recent_conversation(&self, ctx: &Ctx<'_>) -> Vec<ChatMessage> {
        let skip = ctx
            .history
            .len()
            .saturating_sub(self.settings.history_messages);
        let mut out: Vec<ChatMessage> = ctx
            .history
            .iter()
            .skip(skip)
            .rev()
            .filter_map(|m| match m.role {
                MessageRole::User => Some(ChatMessage::user(truncate(
                    &m.content,
                    HISTORY_MESSAGE_CHARS,
                ))),
                MessageRole::Assistant if m.tool_calls.is_empty() && m.item_id.is_none() => {
                    Some(ChatMessage::assistant(
                        Some(truncate(&m.content, HISTORY_MESSAGE_CHARS)),
                        vec![],
                    ))
                }
                _ => None,
            })
            .take(HISTORY_MESSAGES)
            .collect();
        out.reverse();
        out
    }

    /// Plan (or refine the existing plan), with one repair request for an invalid plan.
    pub(super) async fn plan(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let left_behind = end_left_behind(ctx);
        let known = self.enabled_tools(ctx);
        let described = self.described_tools(ctx, &known);
        let max_items = self.max_items(&ctx.env.cfg);
        let refining = !ctx.items.is_empty();
        let mut messages = vec![ChatMessage::system(prompts::planning_system(
            &ctx.env.cfg,
            &described,
            max_items,
            self.max_team_depth(&ctx.env.cfg) > 0,
        ))];
        messages.extend(self.recent_conversation(ctx));
        if refining {
            // Nothing of earlier runs is left to start (see `end_left_behind`): the note is
            // context only.
            messages.push(ChatMessage::user(prompts::refinement_note(
                &self.earlier(ctx, prompts::EARLIER_ITEMS_SHOWN),
                &[],
            )));
        }
        messages.push(ChatMessage::user(ctx.run.query.clone()));
        let frozen = frozen_ids(ctx);

        let mut attempt = 0;
        let (reply, valid) = loop {
            attempt += 1;
            let req = ChatRequest {
                phase: Phase::Plan,
                model: ctx.model(),
                messages: messages.clone(),
                tools: vec![],
                response_format: Some(JsonSchemaFormat {
                    name: prompts::PLAN_SCHEMA_NAME.into(),
                    schema: prompts::plan_schema(),
                }),
                tokens: crate::llm::Tokens::none(),
            };
            let value = ctx.ask_structured(req).await?;
            let parsed: Result<PlanReply, Vec<String>> =
                serde_json::from_value(value.clone()).map_err(|e| vec![e.to_string()]);
            let checked = parsed.and_then(|r| {
                plan::validate(
                    &r.todo_list,
                    &frozen,
                    &plan::Rules {
                        known_tools: &known,
                        roles: ctx.env.cfg.roles.as_ref(),
                        max_items: max_items as usize,
                    },
                )
                .map(|v| (r, v))
            });
            match checked {
                Ok(ok) => break ok,
                Err(errors) if attempt == 1 => {
                    debug!(?errors, "plan invalid; asking the model to repair it");
                    messages.push(ChatMessage::assistant(Some(value.to_string()), vec![]));
                    messages.push(ChatMessage::user(format!(
                        "Your plan is not valid:\n- {}\nReply again with the corrected JSON object.",
                        errors.join("\n- ")
                    )));
                }
                Err(errors) => {
                    return Err(Halt::Fail(
                        ErrorInfo {
                            code: "invalid_plan".into(),
                            message: format!(
                                "the model's plan is not valid after one repair: {}; it returned: {}",
                                errors.join("; "),
                                truncate(&value.to_string(), 500)
                            ),
                        },
                        None,
                    ));
                }
            }
        };

        let mode = ctx
            .env
            .cfg
            .tool_validation_mode
            .unwrap_or(ToolValidationMode::Strict);
        let mut diff = plan::merge(std::mem::take(&mut ctx.items), &valid, mode, ctx.run.run_id);
        let update = refining.then(|| diff.observation_content());
        ctx.state.intent = Some(reply.intent.clone());
        ctx.state.title = Some(reply.title.clone());
        ctx.state.plan = Some(reply.plan.clone());
        ctx.state.current_step_id = None;
        ctx.items = std::mem::take(&mut diff.items);

        let mut b = ctx.batch();
        b.op(Op::SetAgentState(ctx.state.clone()));
        for (id, previous) in &left_behind {
            if let Some(it) = ctx.items.iter().find(|i| &i.id == id) {
                b.op(Op::UpsertItem(Box::new(it.clone())));
                b.observe(ctx.status_change(it, *previous));
            }
        }
        for id in &diff.removed {
            b.op(Op::DeleteItem(id.clone()));
        }
        for it in &ctx.items {
            if diff.dirty.contains(&it.id) {
                b.op(Op::UpsertItem(Box::new(it.clone())));
            }
        }
        b.observe(ctx.emit(
            None,
            truncate(&reply.intent, 120),
            &IntentContent {
                intent: reply.intent.clone(),
            },
        ));
        b.observe(ctx.emit(
            None,
            truncate(&reply.title, 120),
            &TitleContent {
                title: reply.title.clone(),
            },
        ));
        if let Some(mut c) = update {
            c.plan = Some(reply.plan.clone());
            b.observe(ctx.emit(None, "Plan refined", &c));
        } else {
            b.observe(ctx.emit(
                None,
                "Plan",
                &PlanContent {
                    plan: reply.plan.clone(),
                    todo_list: plan::summary(&ctx.items),
                    team_id: None,
                },
            ));
        }
        b.op(Op::UpdateRun(RunUpdate {
            phase: Some(RunPhase::Executing),
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        ctx.stage(b);
        ctx.run.phase = RunPhase::Executing;
        Ok(())
    }

    /// `update_plan`: replace the items not yet started. Returns the tool result and, when the
    /// plan changed, the `PLAN_UPDATE` observation and the row changes (committed with the result).
    pub(super) fn apply_plan_update(
        &self,
        ctx: &mut Ctx<'_>,
        call: &ToolCallRecord,
    ) -> (ToolResultRecord, Vec<NewObservation>, Vec<Op>) {
        let err = |msg: String| ToolResultRecord {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            status: ToolResultStatus::Error,
            output: Value::Null,
            error: Some(msg),
        };
        let list: Vec<PlannedItem> = match call
            .arguments
            .get("todoList")
            .cloned()
            .map(serde_json::from_value)
        {
            Some(Ok(l)) => l,
            Some(Err(e)) => return (err(format!("invalid todoList: {e}")), vec![], vec![]),
            None => return (err("missing `todoList`".into()), vec![], vec![]),
        };
        let frozen = frozen_ids(ctx);
        let known = self.enabled_tools(ctx);
        let rules = plan::Rules {
            known_tools: &known,
            roles: ctx.env.cfg.roles.as_ref(),
            max_items: self.max_items(&ctx.env.cfg) as usize,
        };
        let valid = match plan::validate(&list, &frozen, &rules) {
            Ok(v) => v,
            Err(errors) => {
                return (
                    err(format!("plan not updated: {}", errors.join("; "))),
                    vec![],
                    vec![],
                );
            }
        };
        let mode = ctx
            .env
            .cfg
            .tool_validation_mode
            .unwrap_or(ToolValidationMode::Strict);
        let mut diff = plan::merge(std::mem::take(&mut ctx.items), &valid, mode, ctx.run.run_id);
        let content = diff.observation_content();
        ctx.items = std::mem::take(&mut diff.items);
        let mut ops = Vec::new();
        for id in &diff.removed {
            ops.push(Op::DeleteItem(id.clone()));
        }
        for it in &ctx.items {
            if diff.dirty.contains(&it.id) {
                ops.push(Op::UpsertItem(Box::new(it.clone())));
            }
        }
        let summary = json!({
            "added": diff.added, "changed": diff.changed, "removed": diff.removed,
            "unchanged": diff.frozen,
        });
        let obs = ctx.emit(None, "Plan updated", &content);
        (
            ToolResultRecord {
                tool_call_id: call.id.clone(),
                name: call.name.clone(),
                status: ToolResultStatus::Success,
                output: summary,
                error: None,
            },
            vec![obs],
            ops,
        )
    }
}

/// Cancel the unfinished items earlier runs left behind (a run that ended before its end
/// cancelled its work, in a store written by an earlier version): they are context for this
/// run's plan, never its work. Returns each with the status it had.
fn end_left_behind(ctx: &mut Ctx<'_>) -> Vec<(crate::model::ItemId, ItemStatus)> {
    let run = ctx.run.run_id;
    let now = chrono::Utc::now();
    let mut ended = Vec::new();
    for it in ctx.items.iter_mut() {
        if it.status.is_done() || it.run_id == Some(run) {
            continue;
        }
        ended.push((it.id.clone(), it.status));
        it.status = ItemStatus::Cancelled;
        it.error = Some(ErrorInfo {
            code: "run_ended".into(),
            message: "cancelled: the run it belonged to ended before it finished".into(),
        });
        it.updated_at = now;
        it.completed_at = Some(now);
    }
    ended
}

/// The ids of the items a new plan must keep as they are: every one that has left `pending`.
fn frozen_ids(ctx: &Ctx<'_>) -> Vec<crate::model::ItemId> {
    ctx.items
        .iter()
        .filter(|i| i.status != ItemStatus::Pending)
        .map(|i| i.id.clone())
        .collect()
}
