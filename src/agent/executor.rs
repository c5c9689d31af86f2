//! Execution of one item: its ReAct loop (ask the model, run the tool calls it makes, repeat until
//! it answers), TAEF's required-tool check, and the brief the item gets (the query, the plan and
//! the results of earlier items).

use crate::model::payloads::{RequiredToolRetry, ThoughtsContent, ToolCallContent};
use chrono::Utc;

use super::changes::{Op, RunUpdate};
use crate::llm::{ChatMessage, ChatRequest, ChatResponse, Phase, ToolCall, ToolSpec};
use crate::model::{
    ConversationMessage, ErrorInfo, ItemStatus, Message, MessageRole, StepType, TodoItem,
    ToolCallRecord, ToolValidationMode, ValidationStatus, new_id,
};

use super::Engine;
use super::journal::{Ctx, Halt};
use super::prompts::{self, truncate};
use super::tool_calls::CallStep;

/// What an item needs next (see [`Engine::item_step`]).
pub(super) enum Next {
    /// A model call with this request.
    Ask(ChatRequest),
    /// The structured request that compacts the item's result.
    Compact(ChatRequest),
    /// The structured request that plans a team item.
    PlanTeam(ChatRequest),
    /// Run this tool call with these arguments (the model's, or a person's edit).
    Invoke(ToolCallRecord, serde_json::Value),
    /// Nothing to start now: the item finished, failed or waits for a person.
    Idle,
}

impl Engine {
    fn item_tools(&self, ctx: &Ctx<'_>, item: &TodoItem) -> Vec<ToolSpec> {
        let mut specs = match item.step_type {
            StepType::Tool => self
                .enabled_catalogue(ctx)
                .into_iter()
                .filter(|t| self.item_may_call(ctx, item, &t.name))
                .map(super::calls::spec)
                .collect(),
            StepType::Reasoning => vec![],
        };
        // A team's child works inside its team's plan: the run's plan is not its to change.
        if item.parent_item_id.is_some() {
            return specs;
        }
        specs.push(ToolSpec {
            name: prompts::UPDATE_PLAN_TOOL.into(),
            description: "Replace the items of the plan that have not started yet with this list."
                .into(),
            parameters: prompts::update_plan_parameters(),
        });
        specs
    }

    /// A pending item starts (staged): in progress, an attempt more, the current step.
    pub(super) fn start_item(&self, ctx: &mut Ctx<'_>, idx: usize) {
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

    /// What the item needs next, read from its journal: the tool calls of its last turn that
    /// have no result yet come first (a call refused or answered by a person is journaled here,
    /// without I/O), then the next model call, or the compaction of its result. An item out of
    /// model calls fails here.
    pub(super) fn item_step(&self, ctx: &mut Ctx<'_>, item_id: &str) -> Result<Next, Halt> {
        let max_iterations = ctx
            .env
            .cfg
            .max_iterations
            .unwrap_or(self.settings.max_iterations)
            .max(1) as usize;
        loop {
            let Some(idx) = ctx.item_idx(item_id) else {
                return Ok(Next::Idle);
            };
            let status = ctx.items[idx].status;
            if status == ItemStatus::Completed && ctx.items[idx].compacted_output.is_none() {
                return Ok(self.compaction_step(ctx, idx));
            }
            if !matches!(status, ItemStatus::InProgress | ItemStatus::Waiting) {
                return Ok(Next::Idle);
            }
            if ctx.items[idx].kind == crate::model::ItemKind::Team {
                return Ok(self.team_step(ctx, idx));
            }
            if let Some(call) = unanswered_calls(&ctx.items[idx]).into_iter().next() {
                match self.call_step(ctx, item_id, &call) {
                    CallStep::Invoke(args) => return Ok(Next::Invoke(call, args)),
                    CallStep::Answered(result, obs, ops) => {
                        self.journal_result(ctx, item_id, &call, result, obs, ops);
                        continue;
                    }
                    CallStep::Wait => return Ok(Next::Idle),
                }
            }
            if ctx.is_flowchart_item(&ctx.items[idx]) {
                // A flowchart run's call is answered: the run ends with its result, and no
                // model is asked about it.
                return Ok(Next::Idle);
            }
            let item = ctx.items[idx].clone();
            if iterations_since_last_prompt(&item) >= max_iterations {
                self.fail_item(
                    ctx,
                    item_id,
                    ErrorInfo {
                        code: "max_iterations_exceeded".into(),
                        message: format!(
                            "the item used its {max_iterations} model calls without an answer"
                        ),
                    },
                    None,
                );
                return Ok(Next::Idle);
            }
            let mut messages = vec![
                ChatMessage::system(prompts::execution_system(&ctx.env.cfg, true)),
                ChatMessage::user(self.item_brief(ctx, &item)),
            ];
            messages.extend(item.conversation.iter().map(to_chat));
            messages.extend(super::steer::note(&ctx.steering));
            return Ok(Next::Ask(ChatRequest {
                phase: Phase::Execute,
                model: ctx.model(),
                messages,
                tools: self.item_tools(ctx, &item),
                response_format: None,
                tokens: crate::llm::Tokens::none(),
            }));
        }
    }

    /// The model's turn for an item: tool calls to run next, or its answer (staged).
    pub(super) fn take_reply(&self, ctx: &mut Ctx<'_>, item_id: &str, resp: ChatResponse) {
        let Some(idx) = ctx.item_idx(item_id) else {
            return;
        };
        ctx.spend(item_id, &resp.usage, false);
        let it = &mut ctx.items[idx];
        it.updated_at = Utc::now();
        let text = resp.content.clone().filter(|t| !t.trim().is_empty());
        let iteration = iterations_since_last_prompt(it) + 1;
        if resp.tool_calls.is_empty() {
            self.take_answer(ctx, idx, item_id, text.unwrap_or_default(), iteration);
        } else {
            self.record_tool_turn(ctx, idx, item_id, text, &resp.tool_calls, iteration);
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
            thread_id: ctx.env.thread_id.clone(),
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
            b.observe(ctx.emit(
                Some(&item_id),
                truncate(t, 120),
                &ThoughtsContent::turn(ctx.items[idx].id.clone(), t, iteration),
            ));
        }
        for c in &calls {
            b.observe(ctx.emit(
                Some(&item_id),
                c.name.clone(),
                &ToolCallContent {
                    tool_call_id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                },
            ));
        }
        b.op(Op::UpdateRun(RunUpdate {
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        ctx.stage(b);
    }

    /// The model answered: the item's result, unless TAEF strict sends it back (the model is
    /// asked again) or fails the item.
    fn take_answer(
        &self,
        ctx: &mut Ctx<'_>,
        idx: usize,
        item_id: &str,
        answer: String,
        iteration: usize,
    ) {
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
            b.observe(ctx.emit(
                Some(&item_id),
                "Required tool skipped: retrying",
                &ThoughtsContent {
                    validation: Some(RequiredToolRetry {
                        missing_tools: missing,
                        retry: ctx.items[idx].attempts - 1,
                    }),
                    ..ThoughtsContent::turn(ctx.items[idx].id.clone(), &answer, iteration)
                },
            ));
            b.op(Op::UpdateRun(RunUpdate {
                usage: Some(ctx.usage),
                ..Default::default()
            }));
            ctx.stage(b);
            return;
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
            self.fail_item(ctx, &item_id, err, Some(answer));
            return;
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
        self.settle_compaction(ctx, idx);
        self.item_left(ctx);
        let mut b = ctx.batch();
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.op(Op::SetAgentState(ctx.state.clone()));
        b.observe(ctx.emit(
            Some(&item_id),
            truncate(&answer, 120),
            &ThoughtsContent {
                is_final: Some(true),
                validation_status: Some(ctx.items[idx].validation_status),
                ..ThoughtsContent::turn(ctx.items[idx].id.clone(), &answer, iteration)
            },
        ));
        b.observe(ctx.status_change(&ctx.items[idx], previous));
        b.op(Op::UpdateRun(RunUpdate {
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        ctx.stage(b);
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
