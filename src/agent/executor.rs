//! Execution of one item: its ReAct loop (ask the model, run the tool calls it makes, repeat until
//! it answers), TAEF's required-tool check, and the brief the item gets (the query, the plan and
//! the results of earlier items).

use chrono::Utc;
use serde_json::json;

use crate::llm::{ChatMessage, ChatRequest, ChatResponse, Phase, ToolCall, ToolSpec};
use crate::model::{
    ConversationMessage, ErrorInfo, ItemStatus, Message, MessageRole, ObservationType, StepType,
    TodoItem, ToolCallRecord, ToolValidationMode, ValidationStatus, new_id,
};
use crate::store::{Op, RunUpdate};

use super::journal::{Ctx, Halt, llm_halt};
use super::prompts::{self, truncate};
use super::{Engine, RunEnd};

impl Engine {
    fn item_tools(&self, ctx: &Ctx<'_>, item: &TodoItem) -> Vec<ToolSpec> {
        let mut specs = match item.step_type {
            StepType::Tool => self.tools.specs(Some(&self.enabled_tools(&ctx.cfg))),
            StepType::Reasoning => vec![],
        };
        specs.push(ToolSpec {
            name: prompts::UPDATE_PLAN_TOOL.into(),
            description: "Replace the items of the plan that have not started yet with this list."
                .into(),
            parameters: prompts::update_plan_parameters(),
        });
        specs
    }

    /// Execute one item with its ReAct loop. `Some(end)` when the run must stop here (suspended).
    pub(super) async fn execute_item(
        &self,
        ctx: &mut Ctx<'_>,
        idx: usize,
    ) -> Result<Option<RunEnd>, Halt> {
        let max_iterations = ctx
            .cfg
            .max_iterations
            .unwrap_or(self.settings.max_iterations)
            .max(1) as usize;
        if ctx.items[idx].status == ItemStatus::Pending {
            let now = Utc::now();
            let it = &mut ctx.items[idx];
            it.status = ItemStatus::InProgress;
            it.started_at = Some(now);
            it.updated_at = now;
            it.attempts += 1;
            it.run_id = Some(ctx.run.run_id);
            ctx.state.current_step_id = Some(it.id.to_string());
            let mut b = ctx.batch();
            b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
            b.op(Op::SetAgentState(ctx.state.clone()));
            b.observe(ctx.status_change(&ctx.items[idx], ItemStatus::Pending));
            ctx.stage(b);
        }
        let item_id = ctx.items[idx].id.to_string();

        loop {
            ctx.check_signals()?;
            let idx = ctx
                .item_idx(&item_id)
                .expect("the running item is never removed");
            // Tool calls of the last model turn that have no journaled result yet (the process
            // stopped while they ran): run them before asking the model again.
            let unanswered = unanswered_calls(&ctx.items[idx]);
            if !unanswered.is_empty() {
                for call in unanswered {
                    if let Some(end) = self.run_tool_call(ctx, &item_id, call).await? {
                        return Ok(Some(end));
                    }
                }
                continue;
            }
            let item = ctx.items[idx].clone();
            if iterations_since_last_prompt(&item) >= max_iterations {
                return self
                    .fail_item(
                        ctx,
                        &item_id,
                        ErrorInfo {
                            code: "max_iterations_exceeded".into(),
                            message: format!(
                                "the item used its {max_iterations} model calls without an answer"
                            ),
                        },
                        None,
                    )
                    .await
                    .map(|_| None);
            }
            let mut messages = vec![
                ChatMessage::system(prompts::execution_system(&ctx.cfg, true)),
                ChatMessage::user(self.item_brief(ctx, &item)),
            ];
            messages.extend(item.conversation.iter().map(to_chat));
            let req = ChatRequest {
                phase: Phase::Execute,
                model: ctx.model(),
                messages,
                tools: self.item_tools(ctx, &item),
                response_format: None,
            };
            ctx.flush().await?;
            let resp: ChatResponse = ctx
                .guard(ctx.llm.complete(req))
                .await?
                .map_err(|e| llm_halt(e, Some(&item_id)))?;
            ctx.usage.add(&resp.usage);
            let it = &mut ctx.items[idx];
            it.usage.add(&resp.usage);
            it.updated_at = Utc::now();
            let text = resp.content.clone().filter(|t| !t.trim().is_empty());
            let iteration = iterations_since_last_prompt(it) + 1;

            if !resp.tool_calls.is_empty() {
                self.record_tool_turn(ctx, idx, &item_id, text, &resp.tool_calls, iteration);
                continue;
            }
            let answer = text.unwrap_or_default();
            if self
                .take_answer(ctx, idx, &item_id, answer, iteration)
                .await?
            {
                return Ok(None);
            }
        }
    }

    /// The model asked for tool calls: journal its turn (the calls run next, from the journal).
    fn record_tool_turn(
        &self,
        ctx: &mut Ctx<'_>,
        idx: usize,
        item_id: &str,
        text: Option<String>,
        tool_calls: &[ToolCall],
        iteration: usize,
    ) {
        let item_id = item_id.to_owned();
        let it = &mut ctx.items[idx];
        let calls: Vec<ToolCallRecord> = tool_calls.iter().map(to_record).collect();
        it.conversation.push(ConversationMessage {
            role: MessageRole::Assistant,
            content: text.clone(),
            tool_calls: calls.clone(),
            tool_call_id: None,
        });
        it.tool_calls.extend(calls.iter().cloned());
        if let Some(t) = &text {
            it.thoughts.push(t.clone());
        }
        let mut b = ctx.batch();
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.op(Op::AppendMessage(Message {
            id: new_id(),
            thread_id: ctx.thread_id.clone(),
            run_id: Some(ctx.run.run_id),
            role: MessageRole::Assistant,
            content: text.clone().unwrap_or_default(),
            item_id: Some(item_id.clone()),
            tool_call_id: None,
            name: None,
            tool_calls: calls.clone(),
            created_at: Utc::now(),
        }));
        if let Some(t) = &text {
            b.observe(ctx.obs(
                Some(&item_id),
                ObservationType::Thoughts,
                truncate(t, 120),
                json!({"itemId": item_id, "text": t, "iteration": iteration}),
            ));
        }
        for c in &calls {
            b.observe(ctx.obs(
                Some(&item_id),
                ObservationType::ToolCall,
                c.name.clone(),
                json!({"toolCallId": c.id, "name": c.name, "arguments": c.arguments}),
            ));
        }
        b.op(Op::UpdateRun(RunUpdate {
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        ctx.stage(b);
    }

    /// The model answered: the item's result, unless TAEF strict sends it back (`Ok(false)`: ask
    /// the model again) or fails the item. `Ok(true)` when the item is finished.
    async fn take_answer(
        &self,
        ctx: &mut Ctx<'_>,
        idx: usize,
        item_id: &str,
        answer: String,
        iteration: usize,
    ) -> Result<bool, Halt> {
        let item_id = item_id.to_owned();
        let it = &mut ctx.items[idx];
        let missing: Vec<String> = it
            .required_tools
            .iter()
            .filter(|t| !it.actual_tool_calls.iter().any(|c| &c.name == *t))
            .cloned()
            .collect();
        if !missing.is_empty()
            && it.tool_validation_mode == ToolValidationMode::Strict
            && it.attempts <= self.settings.strict_retries
        {
            it.attempts += 1;
            it.conversation.push(ConversationMessage {
                role: MessageRole::Assistant,
                content: Some(answer.clone()),
                tool_calls: vec![],
                tool_call_id: None,
            });
            let nudge = format!(
                "You answered without calling the required tool(s): {}. Call {} first, then answer.",
                missing.join(", "),
                if missing.len() == 1 { "it" } else { "them" }
            );
            it.conversation.push(ConversationMessage {
                role: MessageRole::User,
                content: Some(nudge.clone()),
                tool_calls: vec![],
                tool_call_id: None,
            });
            it.thoughts.push(answer.clone());
            let mut b = ctx.batch();
            b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
            b.observe(ctx.obs(
                Some(&item_id),
                ObservationType::Thoughts,
                "Required tool skipped: retrying",
                json!({"itemId": item_id, "text": answer, "iteration": iteration,
                       "validation": {"missingTools": missing, "retry": ctx.items[idx].attempts - 1}}),
            ));
            b.op(Op::UpdateRun(RunUpdate {
                usage: Some(ctx.usage),
                ..Default::default()
            }));
            ctx.stage(b);
            return Ok(false);
        }
        if !missing.is_empty() && it.tool_validation_mode == ToolValidationMode::Strict {
            it.validation_status = ValidationStatus::Failed;
            let err = ErrorInfo {
                code: "required_tool_not_called".into(),
                message: format!(
                    "the item skipped its required tool(s) {} after {} retries",
                    missing.join(", "),
                    self.settings.strict_retries
                ),
            };
            return self
                .fail_item(ctx, &item_id, err, Some(answer))
                .await
                .map(|_| true);
        }
        it.validation_status = if it.required_tools.is_empty() {
            ValidationStatus::Skipped
        } else if missing.is_empty() {
            ValidationStatus::Passed
        } else {
            ValidationStatus::Failed
        };
        let previous = it.status;
        it.status = ItemStatus::Completed;
        it.result = Some(answer.clone());
        it.completed_at = Some(Utc::now());
        it.conversation.push(ConversationMessage {
            role: MessageRole::Assistant,
            content: Some(answer.clone()),
            tool_calls: vec![],
            tool_call_id: None,
        });
        ctx.state.current_step_id = None;
        let mut b = ctx.batch();
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.observe(ctx.obs(
            Some(&item_id),
            ObservationType::Thoughts,
            truncate(&answer, 120),
            json!({"itemId": item_id, "text": answer, "iteration": iteration, "final": true,
                   "validationStatus": ctx.items[idx].validation_status}),
        ));
        b.observe(ctx.status_change(&ctx.items[idx], previous));
        b.op(Op::UpdateRun(RunUpdate {
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        ctx.stage(b);
        Ok(true)
    }
}

/// Model calls since the item last got a prompt from us (the brief, or a TAEF retry).
fn iterations_since_last_prompt(item: &TodoItem) -> usize {
    item.conversation
        .iter()
        .rev()
        .take_while(|m| m.role != MessageRole::User)
        .filter(|m| m.role == MessageRole::Assistant)
        .count()
}

/// Calls of the item's last assistant turn that have no tool message yet.
fn unanswered_calls(item: &TodoItem) -> Vec<ToolCallRecord> {
    let Some(pos) = item
        .conversation
        .iter()
        .rposition(|m| m.role == MessageRole::Assistant)
    else {
        return vec![];
    };
    let turn = &item.conversation[pos];
    turn.tool_calls
        .iter()
        .filter(|c| {
            !item.conversation[pos + 1..].iter().any(|m| {
                m.role == MessageRole::Tool && m.tool_call_id.as_deref() == Some(c.id.as_str())
            })
        })
        .cloned()
        .collect()
}

fn to_record(c: &ToolCall) -> ToolCallRecord {
    ToolCallRecord {
        id: c.id.clone(),
        name: c.name.clone(),
        arguments: c.arguments.clone(),
    }
}

fn to_chat(m: &ConversationMessage) -> ChatMessage {
    match m.role {
        MessageRole::Assistant => ChatMessage::assistant(
            m.content.clone(),
            m.tool_calls
                .iter()
                .map(|c| ToolCall {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                })
                .collect(),
        ),
        MessageRole::Tool => ChatMessage::tool(
            m.tool_call_id.clone().unwrap_or_default(),
            m.content.clone().unwrap_or_default(),
        ),
        MessageRole::System => ChatMessage::system(m.content.clone().unwrap_or_default()),
        MessageRole::User => ChatMessage::user(m.content.clone().unwrap_or_default()),
    }
}
