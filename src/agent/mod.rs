//! The Plan-Execute-Synthesize engine: pure logic over traits. It talks to an [`LlmProvider`], a
//! [`ToolRegistry`] and a [`Journal`] (where it commits state changes together with the
//! observations that report them); it knows nothing of SQL or HTTP.
//!
//! A run is driven from whatever its persisted state says: a run re-claimed after a crash skips the
//! phases it finished, continues the item that was in progress from its journaled conversation, and
//! runs only the tool calls that have no journaled result. Nothing that completed runs again.

pub mod plan;
pub mod prompts;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use chrono::Utc;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::llm::structured::complete_structured;
use crate::llm::{
    ChatMessage, ChatRequest, ChatResponse, JsonSchemaFormat, LlmError, LlmProvider, Phase,
    RequestHints, ToolCall, ToolSpec,
};
use crate::model::{
    AgentConfig, AgentStateRow, ConversationMessage, Decision, ErrorInfo, ItemStatus, Message,
    MessageRole, NewObservation, ObservationType, Run, RunStatus, StepType, Suspension,
    SuspensionKind, SuspensionStatus, Thread, ThreadId, TodoItem, ToolCallRecord, ToolResultRecord,
    ToolValidationMode, Usage, ValidationStatus, new_id,
};
use crate::store::{AgentSnapshot, Batch, Op, RunUpdate};
use crate::tools::{ToolContext, ToolRegistry};

use plan::{PlanReply, PlannedItem};
use prompts::truncate;

/// A pure tool call still running after this long gets its tool-call turn committed on its own
/// (a tool with side effects has its turn committed before it starts).
pub const FLUSH_SLOW_TOOL_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// Engine limits and defaults (each a service setting).
#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub default_provider: String,
    pub max_items: u32,
    pub max_iterations: u32,
    pub step_output_chars: usize,
    pub strict_retries: u32,
    /// Thread messages given to the planner as conversation context.
    pub history_messages: usize,
    /// Suspension expiry when the thread sets none (0 = never).
    pub suspension_ttl_seconds: u64,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            default_provider: "offline".into(),
            max_items: 20,
            max_iterations: 5,
            step_output_chars: 2000,
            strict_retries: 2,
            history_messages: 20,
            suspension_ttl_seconds: 0,
        }
    }
}

/// Where the engine commits. The worker's implementation applies the batch under the run's lease
/// fence and publishes its observations.
#[async_trait]
pub trait Journal: Send + Sync {
    /// Commit state changes and their observations atomically.
    ///
    /// # Errors
    /// [`EngineError::LeaseLost`] when the run is no longer ours; [`EngineError::Store`] otherwise.
    async fn commit(&self, batch: Batch) -> Result<(), EngineError>;
}

/// Why the engine stopped without finishing the run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Another worker owns the run now; touch nothing more.
    #[error("lease lost")]
    LeaseLost,
    /// The process is shutting down; the run is left for another worker.
    #[error("stopped for shutdown")]
    Stopped,
    #[error("store error: {0}")]
    Store(String),
}

/// How a run ended (or paused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    Completed,
    Failed,
    Cancelled,
    Suspended,
}

/// Everything the engine needs to drive one run, loaded by the worker.
#[derive(Debug, Clone)]
pub struct RunInput {
    pub run: Run,
    pub thread: Thread,
    pub snapshot: AgentSnapshot,
    /// The thread's conversation before this run (oldest first).
    pub history: Vec<Message>,
    /// The thread's suspensions, any status: the decisions made while its runs were paused.
    pub suspensions: Vec<Suspension>,
}

/// Tokens that interrupt a run: `cancel` (a client cancelled it: commit `RUN_CANCELLED`, even in
/// the middle of a model or tool call), `drain` (the process is shutting down: stop at the next
/// safe point, after the step in flight, so another worker resumes it) and `shutdown` (the grace
/// period is over: abandon the step in flight too).
#[derive(Debug, Clone, Default)]
pub struct Signals {
    pub cancel: CancellationToken,
    pub drain: CancellationToken,
    pub shutdown: CancellationToken,
}

/// Internal reasons to leave the normal flow.
enum Halt {
    Cancel,
    Shutdown,
    LeaseLost,
    Store(String),
    /// The run fails: code, message, and the item it failed in.
    Fail(ErrorInfo, Option<String>),
}

impl From<EngineError> for Halt {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::LeaseLost => Halt::LeaseLost,
            EngineError::Stopped => Halt::Shutdown,
            EngineError::Store(s) => Halt::Store(s),
        }
    }
}

fn llm_halt(e: LlmError, item: Option<&str>) -> Halt {
    match e {
        LlmError::Cancelled => Halt::Cancel,
        other => Halt::Fail(
            ErrorInfo {
                code: other.code().to_owned(),
                message: other.to_string(),
            },
            item.map(str::to_owned),
        ),
    }
}

/// The PES engine. Cheap to share behind an `Arc`.
pub struct Engine {
    providers: HashMap<String, Arc<dyn LlmProvider>>,
    tools: ToolRegistry,
    settings: EngineSettings,
}

/// Mutable state of one run being driven.
struct Ctx<'a> {
    journal: &'a dyn Journal,
    signals: &'a Signals,
    llm: Arc<dyn LlmProvider>,
    tenant: String,
    thread_id: ThreadId,
    run: Run,
    cfg: AgentConfig,
    state: AgentStateRow,
    items: Vec<TodoItem>,
    history: Vec<Message>,
    suspensions: Vec<Suspension>,
    usage: Usage,
    started: Instant,
    /// Changes staged since the last commit: written together at the next point where they must
    /// be durable (before a model or tool call, at a suspension, at the end).
    pending: Batch,
}

impl Ctx<'_> {
    fn batch(&self) -> Batch {
        Batch::new(self.tenant.clone(), self.thread_id.clone())
    }

    fn obs(
        &self,
        parent: Option<&str>,
        kind: ObservationType,
        title: impl Into<String>,
        content: Value,
    ) -> NewObservation {
        NewObservation::new(
            self.run.run_id,
            parent.map(str::to_owned),
            kind,
            title,
            content,
        )
    }

    /// Stage changes; they are committed with the next [`Ctx::flush`].
    fn stage(&mut self, batch: Batch) {
        self.pending.absorb(batch);
    }

    /// Commit everything staged.
    async fn flush(&mut self) -> Result<(), Halt> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(
            &mut self.pending,
            Batch::new(self.tenant.clone(), self.thread_id.clone()),
        );
        self.journal.commit(batch).await.map_err(Halt::from)
    }

    /// Stage and commit now.
    async fn commit(&mut self, batch: Batch) -> Result<(), Halt> {
        self.stage(batch);
        self.flush().await
    }

    /// Run `fut` unless the run is cancelled or the process stops first.
    async fn guard<T>(&self, fut: impl Future<Output = T>) -> Result<T, Halt> {
        tokio::select! {
            biased;
            _ = self.signals.shutdown.cancelled() => Err(Halt::Shutdown),
            _ = self.signals.cancel.cancelled() => Err(Halt::Cancel),
            v = fut => Ok(v),
        }
    }

    /// At a safe point (everything so far committed): stop here if asked to.
    fn check_signals(&self) -> Result<(), Halt> {
        if self.signals.cancel.is_cancelled() {
            return Err(Halt::Cancel);
        }
        if self.signals.shutdown.is_cancelled() || self.signals.drain.is_cancelled() {
            return Err(Halt::Shutdown);
        }
        Ok(())
    }

    fn item_idx(&self, id: &str) -> Option<usize> {
        self.items.iter().position(|i| i.id.as_str() == id)
    }

    fn status_change(&self, item: &TodoItem, previous: ItemStatus) -> NewObservation {
        self.obs(
            Some(item.id.as_str()),
            ObservationType::ItemStatusChange,
            format!("{}: {} → {}", item.id, previous, item.status),
            json!({"itemId": item.id, "status": item.status, "previousStatus": previous}),
        )
    }

    fn model(&self) -> Option<String> {
        self.cfg.model.clone()
    }

    /// The model the run's requests go to: the thread's or run's `model`, else the provider's
    /// default.
    fn model_in_use(&self) -> Option<String> {
        self.cfg
            .model
            .clone()
            .filter(|m| !m.trim().is_empty())
            .or_else(|| self.llm.default_model().map(str::to_owned))
    }
}

impl Engine {
    /// An engine over the given providers (by name), tools and settings.
    pub fn new(
        providers: HashMap<String, Arc<dyn LlmProvider>>,
        tools: ToolRegistry,
        settings: EngineSettings,
    ) -> Self {
        Self {
            providers,
            tools,
            settings,
        }
    }

    /// The tool registry (the HTTP layer validates `requireApproval` and edited arguments with it).
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// Names of the configured providers.
    pub fn provider_names(&self) -> Vec<String> {
        self.providers.keys().cloned().collect()
    }

    /// Drive a run from its persisted state to completion, failure, cancellation or suspension.
    ///
    /// # Errors
    /// [`EngineError::LeaseLost`], [`EngineError::Stopped`] or [`EngineError::Store`]: the run is left
    /// as last committed, for its next owner.
    pub async fn drive(
        &self,
        input: RunInput,
        journal: &dyn Journal,
        signals: &Signals,
    ) -> Result<RunEnd, EngineError> {
        let cfg = input.thread.config.overlay(&input.run.config);
        let provider_name = cfg
            .provider
            .clone()
            .unwrap_or_else(|| self.settings.default_provider.clone());
        let llm = match self.providers.get(&provider_name) {
            Some(p) => p.clone(),
            None => self
                .providers
                .get(&self.settings.default_provider)
                .cloned()
                .ok_or_else(|| {
                    EngineError::Store(format!("no provider `{provider_name}` is configured"))
                })?,
        };
        let pending = Batch::new(input.run.tenant.clone(), input.run.thread_id.clone());
        let mut ctx = Ctx {
            journal,
            signals,
            llm,
            tenant: input.run.tenant.clone(),
            thread_id: input.run.thread_id.clone(),
            usage: input.run.usage,
            run: input.run,
            cfg,
            state: input.snapshot.state,
            items: input.snapshot.items,
            history: input.history,
            suspensions: input.suspensions,
            started: Instant::now(),
            pending,
        };
        match self.drive_inner(&mut ctx).await {
            Ok(end) => Ok(end),
            Err(Halt::Shutdown) => {
                // Draining: keep what was staged, so the next owner does not redo it.
                if !signals.shutdown.is_cancelled() {
                    ctx.flush().await.map_err(halt_to_error)?;
                }
                Err(EngineError::Stopped)
            }
            Err(Halt::LeaseLost) => Err(EngineError::LeaseLost),
            Err(Halt::Store(s)) => Err(EngineError::Store(s)),
            Err(Halt::Cancel) => {
                self.commit_cancelled(&mut ctx)
                    .await
                    .map_err(halt_to_error)?;
                Ok(RunEnd::Cancelled)
            }
            Err(Halt::Fail(err, item)) => {
                self.commit_failed(&mut ctx, err, item)
                    .await
                    .map_err(halt_to_error)?;
                Ok(RunEnd::Failed)
            }
        }
    }

    async fn drive_inner(&self, ctx: &mut Ctx<'_>) -> Result<RunEnd, Halt> {
        if ctx.run.phase == "new" {
            self.start(ctx).await?;
        }
        if ctx.run.phase == "planning" {
            self.plan(ctx).await?;
        }
        if ctx.run.phase == "executing" {
            loop {
                ctx.check_signals()?;
                match self.next_item(ctx) {
                    Some(idx) => {
                        if let Some(end) = self.execute_item(ctx, idx).await? {
                            return Ok(end);
                        }
                    }
                    None => break,
                }
            }
            self.begin_synthesis(ctx).await?;
        }
        if ctx.run.phase == "synthesizing" {
            self.synthesize(ctx).await?;
        }
        Ok(RunEnd::Completed)
    }

    /// `RUN_STARTED` and the user's message.
    async fn start(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let mut b = ctx.batch();
        let mut content = json!({
            "query": ctx.run.query,
            "provider": ctx.llm.name(),
            "model": ctx.model_in_use(),
            "attempt": ctx.run.attempt,
        });
        if ctx.llm.is_offline() {
            content["warning"] = json!(
                "offline model: answers are made by a deterministic stand-in, not a real LLM. \
                 Set PES_LLM_BASE_URL / PES_LLM_API_KEY to use a real model."
            );
        }
        b.observe(ctx.obs(None, ObservationType::RunStarted, "Run started", content));
        b.op(Op::AppendMessage(Message {
            id: new_id(),
            thread_id: ctx.thread_id.clone(),
            run_id: Some(ctx.run.run_id),
            role: MessageRole::User,
            content: ctx.run.query.clone(),
            item_id: None,
            tool_call_id: None,
            name: None,
            tool_calls: vec![],
            created_at: Utc::now(),
        }));
        b.op(Op::UpdateRun(RunUpdate {
            phase: Some("planning".into()),
            ..Default::default()
        }));
        ctx.stage(b);
        ctx.run.phase = "planning".into();
        Ok(())
    }

    fn enabled_tools(&self, cfg: &AgentConfig) -> Vec<String> {
        let all = self.tools.names();
        match &cfg.tools {
            Some(list) => all.into_iter().filter(|n| list.contains(n)).collect(),
            None => all,
        }
    }

    fn max_items(&self, cfg: &AgentConfig) -> u32 {
        cfg.max_items.unwrap_or(self.settings.max_items)
    }

    /// Plan (or refine the existing plan), with one repair request for an invalid plan.
    async fn plan(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let known = self.enabled_tools(&ctx.cfg);
        let described: Vec<(String, String)> = known
            .iter()
            .filter_map(|n| {
                self.tools
                    .get(n)
                    .map(|t| (n.clone(), t.description().to_owned()))
            })
            .collect();
        let max_items = self.max_items(&ctx.cfg);
        let refining = !ctx.items.is_empty();
        let mut messages = vec![ChatMessage::system(prompts::planning_system(
            &ctx.cfg, &described, max_items,
        ))];
        let skip = ctx
            .history
            .len()
            .saturating_sub(self.settings.history_messages);
        for m in ctx.history.iter().skip(skip) {
            match m.role {
                MessageRole::User => messages.push(ChatMessage::user(m.content.clone())),
                MessageRole::Assistant if m.tool_calls.is_empty() && m.item_id.is_none() => {
                    messages.push(ChatMessage::assistant(Some(m.content.clone()), vec![]))
                }
                _ => {}
            }
        }
        if refining {
            messages.push(ChatMessage::user(prompts::refinement_note(&ctx.items)));
        }
        messages.push(ChatMessage::user(ctx.run.query.clone()));
        let hints = RequestHints {
            query: ctx.run.query.clone(),
            existing_items: ctx
                .items
                .iter()
                .map(|i| {
                    (
                        i.id.to_string(),
                        i.description.clone(),
                        i.status.to_string(),
                    )
                })
                .collect(),
            max_items,
            ..Default::default()
        };
        let frozen: Vec<TodoItem> = ctx
            .items
            .iter()
            .filter(|i| i.status != ItemStatus::Pending)
            .cloned()
            .collect();

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
                hints: hints.clone(),
            };
            ctx.flush().await?;
            let (value, resp) = ctx
                .guard(complete_structured(ctx.llm.as_ref(), req))
                .await?
                .map_err(|e| llm_halt(e, None))?;
            ctx.usage.add(&resp.usage);
            let parsed: Result<PlanReply, Vec<String>> =
                serde_json::from_value(value.clone()).map_err(|e| vec![e.to_string()]);
            let checked = parsed.and_then(|r| {
                plan::validate(&r.todo_list, &frozen, &known, max_items as usize).map(|v| (r, v))
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
            .cfg
            .tool_validation_mode
            .unwrap_or(ToolValidationMode::Strict);
        let diff = plan::merge(&ctx.items, &valid, mode);
        ctx.state.intent = Some(reply.intent.clone());
        ctx.state.title = Some(reply.title.clone());
        ctx.state.plan = Some(reply.plan.clone());
        ctx.state.current_step_id = None;
        ctx.items = diff.items.clone();

        let mut b = ctx.batch();
        b.op(Op::SetAgentState(ctx.state.clone()));
        for id in &diff.removed {
            b.op(Op::DeleteItem(id.clone()));
        }
        for it in &ctx.items {
            if diff.dirty.contains(&it.id) {
                b.op(Op::UpsertItem(Box::new(it.clone())));
            }
        }
        b.observe(ctx.obs(
            None,
            ObservationType::Intent,
            truncate(&reply.intent, 120),
            json!({"intent": reply.intent}),
        ));
        b.observe(ctx.obs(
            None,
            ObservationType::Title,
            truncate(&reply.title, 120),
            json!({"title": reply.title}),
        ));
        if refining {
            b.observe(ctx.obs(None, ObservationType::PlanUpdate, "Plan refined", {
                let mut c = diff.observation_content();
                c["plan"] = json!(reply.plan);
                c
            }));
        } else {
            b.observe(ctx.obs(
                None,
                ObservationType::Plan,
                "Plan",
                json!({"plan": reply.plan, "todoList": plan::summary(&ctx.items)}),
            ));
        }
        b.op(Op::UpdateRun(RunUpdate {
            phase: Some("executing".into()),
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        ctx.stage(b);
        ctx.run.phase = "executing".into();
        Ok(())
    }

    /// The item to work on: one already in progress (resumed), else the first pending item whose
    /// dependencies all completed.
    fn next_item(&self, ctx: &Ctx<'_>) -> Option<usize> {
        if let Some(i) = ctx
            .items
            .iter()
            .position(|i| matches!(i.status, ItemStatus::InProgress | ItemStatus::Waiting))
        {
            return Some(i);
        }
        ctx.items.iter().position(|it| {
            it.status == ItemStatus::Pending
                && it.dependencies.iter().all(|d| {
                    ctx.items
                        .iter()
                        .any(|o| &o.id == d && o.status == ItemStatus::Completed)
                })
        })
    }

    fn step_outputs_text(&self, ctx: &Ctx<'_>) -> String {
        let mut s = String::new();
        for it in &ctx.items {
            match it.status {
                ItemStatus::Completed => s.push_str(&format!(
                    "- [{}] {}: {}\n",
                    it.id,
                    it.description,
                    truncate(
                        it.result.as_deref().unwrap_or(""),
                        self.settings.step_output_chars
                    )
                )),
                ItemStatus::Failed => s.push_str(&format!(
                    "- [{}] {}: FAILED ({})\n",
                    it.id,
                    it.description,
                    it.error
                        .as_ref()
                        .map(|e| e.message.as_str())
                        .unwrap_or("unknown error")
                )),
                _ => {}
            }
        }
        s
    }

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
    async fn execute_item(&self, ctx: &mut Ctx<'_>, idx: usize) -> Result<Option<RunEnd>, Halt> {
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
                hints: RequestHints {
                    query: ctx.run.query.clone(),
                    item_description: Some(item.description.clone()),
                    required_tools: item.required_tools.clone(),
                    step_outputs: self.step_output_pairs(ctx),
                    ..Default::default()
                },
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
                let calls: Vec<ToolCallRecord> = resp.tool_calls.iter().map(to_record).collect();
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
                continue;
            }

            // A plain answer: the item's result, unless TAEF strict sends it back.
            let answer = text.unwrap_or_default();
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
                continue;
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
                    .map(|_| None);
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
            return Ok(None);
        }
    }

    fn step_output_pairs(&self, ctx: &Ctx<'_>) -> Vec<(String, String)> {
        ctx.items
            .iter()
            .filter(|i| i.status == ItemStatus::Completed || i.status == ItemStatus::Failed)
            .map(|i| {
                let out = match (&i.result, &i.error) {
                    (Some(r), _) if i.status == ItemStatus::Completed => {
                        truncate(r, self.settings.step_output_chars)
                    }
                    (_, Some(e)) => format!("failed: {}", e.message),
                    _ => String::new(),
                };
                (i.description.clone(), out)
            })
            .collect()
    }

    fn item_brief(&self, ctx: &Ctx<'_>, item: &TodoItem) -> String {
        let mut s = format!("User query: {}\n", ctx.run.query);
        if let Some(p) = &ctx.state.plan {
            s.push_str(&format!("Plan: {p}\n"));
        }
        let outputs = self.step_outputs_text(ctx);
        if !outputs.is_empty() {
            s.push_str("Results of earlier items:\n");
            s.push_str(&outputs);
        }
        s.push_str(&format!(
            "\nYour item [{}]: {}\n",
            item.id, item.description
        ));
        if let Some(e) = &item.expected_outcome {
            s.push_str(&format!("Expected outcome: {e}\n"));
        }
        if !item.required_tools.is_empty() {
            s.push_str(&format!(
                "Required tools: {}\n",
                item.required_tools.join(", ")
            ));
        }
        s
    }

    /// Execute one tool call of the item and journal its result before anything else happens.
    /// A call that needs a person (a blocking tool, or one in `requireApproval`) suspends the run
    /// instead, and once the person decided, the decision becomes the call's result.
    async fn run_tool_call(
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
            status: "error".into(),
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
    async fn invoke(
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
                "success"
            } else {
                "error"
            }
            .into(),
            error: outcome.error.map(|e| {
                let mut text = e.to_string();
                crate::model::scrub_nul_str(&mut text);
                text
            }),
            output: outcome.output,
        })
    }

    /// The result a person's decision gives a suspended call.
    async fn apply_decision(
        &self,
        ctx: &mut Ctx<'_>,
        call: &ToolCallRecord,
        s: &Suspension,
    ) -> Result<ToolResultRecord, Halt> {
        let d = s.decision.clone().unwrap_or(Value::Null);
        let reason = d.get("reason").and_then(Value::as_str).map(str::to_owned);
        let decision = match s.status {
            SuspensionStatus::Resolved => d
                .get("decision")
                .and_then(Value::as_str)
                .and_then(|x| x.parse::<Decision>().ok()),
            _ => None,
        };
        let rejected = |reason: String| ToolResultRecord {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            status: "rejected".into(),
            output: json!({"rejected": true, "reason": reason,
                           "message": format!("A person rejected this call of `{}`: {reason}", call.name)}),
            error: None,
        };
        Ok(match decision {
            Some(Decision::Approve) => self.invoke(ctx, call, call.arguments.clone()).await?,
            Some(Decision::Edit) => {
                let args = d.get("modifiedArgs").cloned().unwrap_or(Value::Null);
                self.invoke(ctx, call, args).await?
            }
            Some(Decision::Respond) => ToolResultRecord {
                tool_call_id: call.id.clone(),
                name: call.name.clone(),
                status: "responded".into(),
                output: d.get("response").cloned().unwrap_or(Value::Null),
                error: None,
            },
            Some(Decision::Reject) => rejected(reason.unwrap_or_else(|| "no reason given".into())),
            None => rejected(match s.status {
                SuspensionStatus::Expired => "expired: nobody decided in time".into(),
                SuspensionStatus::Cancelled => "cancelled: the run that asked was cancelled".into(),
                _ => "no decision".into(),
            }),
        })
    }

    /// Pause the run on `call` until a person decides.
    async fn suspend(
        &self,
        ctx: &mut Ctx<'_>,
        item_id: &str,
        call: &ToolCallRecord,
        kind: SuspensionKind,
    ) -> Result<RunEnd, Halt> {
        let idx = ctx.item_idx(item_id).expect("item");
        let now = Utc::now();
        let ttl = ctx
            .cfg
            .suspension_ttl_seconds
            .unwrap_or(self.settings.suspension_ttl_seconds);
        let item = &ctx.items[idx];
        let turn_calls: Vec<String> = item
            .conversation
            .iter()
            .rev()
            .find(|m| m.role == MessageRole::Assistant)
            .map(|m| m.tool_calls.iter().map(|c| c.id.clone()).collect())
            .unwrap_or_default();
        let partial: Vec<ToolResultRecord> = item
            .tool_results
            .iter()
            .filter(|r| turn_calls.contains(&r.tool_call_id))
            .cloned()
            .collect();
        let (allowed, question, input_schema) = match kind {
            SuspensionKind::Input => (
                vec![Decision::Respond, Decision::Reject],
                call.arguments
                    .get("question")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                call.arguments
                    .get("inputSchema")
                    .cloned()
                    .filter(|v| !v.is_null()),
            ),
            SuspensionKind::Approval => (
                vec![
                    Decision::Approve,
                    Decision::Edit,
                    Decision::Reject,
                    Decision::Respond,
                ],
                Some(format!(
                    "May the agent call `{}` with these arguments?",
                    call.name
                )),
                None,
            ),
        };
        let suspension = Suspension {
            suspension_id: new_id(),
            thread_id: ctx.thread_id.clone(),
            tenant: ctx.tenant.clone(),
            run_id: ctx.run.run_id,
            item_id: item.id.clone(),
            kind,
            tool_call: call.clone(),
            allowed_decisions: allowed,
            question,
            input_schema,
            iteration_state: serde_json::to_value(&item.conversation).unwrap_or(Value::Null),
            partial_tool_results: partial,
            status: SuspensionStatus::Pending,
            decision: None,
            created_at: now,
            resolved_at: None,
            // Bounded at the edge; clamped again here so a value stored before the bound existed
            // can never overflow the deadline.
            expires_at: (ttl > 0).then(|| {
                let secs = ttl.min(crate::model::MAX_SUSPENSION_TTL_SECONDS) as i64;
                now.checked_add_signed(chrono::Duration::seconds(secs))
                    .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
            }),
        };
        let it = &mut ctx.items[idx];
        let previous = it.status;
        it.status = ItemStatus::Waiting;
        it.updated_at = now;
        let mut b = ctx.batch();
        b.op(Op::InsertSuspension(Box::new(suspension.clone())));
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.op(Op::UpdateRun(RunUpdate {
            status: Some(RunStatus::Suspended),
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        if previous != ItemStatus::Waiting {
            b.observe(ctx.status_change(&ctx.items[idx], previous));
        }
        b.observe(ctx.obs(
            Some(item_id),
            ObservationType::AgentSuspended,
            format!("Waiting for a person: {}", call.name),
            json!({
                "suspensionId": suspension.suspension_id,
                "itemId": item_id,
                "kind": kind,
                "toolCall": call,
                "allowedDecisions": suspension.allowed_decisions,
                "question": suspension.question,
                "inputSchema": suspension.input_schema,
                "expiresAt": suspension.expires_at,
            }),
        ));
        ctx.commit(b).await?;
        ctx.suspensions.push(suspension);
        Ok(RunEnd::Suspended)
    }

    /// `update_plan`: replace the items not yet started. Returns the tool result and, when the
    /// plan changed, the `PLAN_UPDATE` observation and the row changes (committed with the result).
    fn apply_plan_update(
        &self,
        ctx: &mut Ctx<'_>,
        call: &ToolCallRecord,
    ) -> (ToolResultRecord, Vec<NewObservation>, Vec<Op>) {
        let err = |msg: String| ToolResultRecord {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            status: "error".into(),
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
        let frozen: Vec<TodoItem> = ctx
            .items
            .iter()
            .filter(|i| i.status != ItemStatus::Pending)
            .cloned()
            .collect();
        let known = self.enabled_tools(&ctx.cfg);
        let valid = match plan::validate(&list, &frozen, &known, self.max_items(&ctx.cfg) as usize)
        {
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
            .cfg
            .tool_validation_mode
            .unwrap_or(ToolValidationMode::Strict);
        let diff = plan::merge(&ctx.items, &valid, mode);
        ctx.items = diff.items.clone();
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
        let obs = ctx.obs(
            None,
            ObservationType::PlanUpdate,
            "Plan updated",
            diff.observation_content(),
        );
        (
            ToolResultRecord {
                tool_call_id: call.id.clone(),
                name: call.name.clone(),
                status: "success".into(),
                output: summary,
                error: None,
            },
            vec![obs],
            ops,
        )
    }

    /// Mark an item failed (and cancel what can no longer run) in one commit.
    async fn fail_item(
        &self,
        ctx: &mut Ctx<'_>,
        item_id: &str,
        err: ErrorInfo,
        answer: Option<String>,
    ) -> Result<(), Halt> {
        let idx = ctx.item_idx(item_id).expect("item exists");
        let it = &mut ctx.items[idx];
        let previous = it.status;
        it.status = ItemStatus::Failed;
        it.error = Some(err.clone());
        if let Some(a) = answer {
            it.thoughts.push(a);
        }
        it.completed_at = Some(Utc::now());
        it.updated_at = Utc::now();
        ctx.state.current_step_id = None;
        let mut b = ctx.batch();
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.observe(ctx.obs(
            Some(item_id),
            ObservationType::Error,
            err.code.clone(),
            json!({"phase": "execute", "code": err.code, "message": err.message, "itemId": item_id}),
        ));
        b.observe(ctx.status_change(&ctx.items[idx], previous));
        b.op(Op::UpdateRun(RunUpdate {
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        ctx.stage(b);
        Ok(())
    }

    /// No item can run any more: cancel pending items whose dependencies cannot complete, and
    /// announce synthesis.
    async fn begin_synthesis(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let mut b = ctx.batch();
        loop {
            let blocked: Vec<usize> = ctx
                .items
                .iter()
                .enumerate()
                .filter(|(_, it)| it.status == ItemStatus::Pending)
                .map(|(i, _)| i)
                .collect();
            if blocked.is_empty() {
                break;
            }
            for i in blocked {
                let now = Utc::now();
                let it = &mut ctx.items[i];
                it.status = ItemStatus::Cancelled;
                it.error = Some(ErrorInfo {
                    code: "dependency_failed".into(),
                    message: "a dependency did not complete".into(),
                });
                it.updated_at = now;
                b.op(Op::UpsertItem(Box::new(ctx.items[i].clone())));
                b.observe(ctx.status_change(&ctx.items[i], ItemStatus::Pending));
            }
        }
        let count = |s: ItemStatus| ctx.items.iter().filter(|i| i.status == s).count();
        b.observe(ctx.obs(
            None,
            ObservationType::Synthesis,
            "Synthesizing the answer",
            json!({
                "completed": count(ItemStatus::Completed),
                "failed": count(ItemStatus::Failed),
                "cancelled": count(ItemStatus::Cancelled),
            }),
        ));
        b.op(Op::UpdateRun(RunUpdate {
            phase: Some("synthesizing".into()),
            ..Default::default()
        }));
        ctx.stage(b);
        ctx.run.phase = "synthesizing".into();
        Ok(())
    }

    async fn synthesize(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let mut brief = format!("User query: {}\n", ctx.run.query);
        if let Some(p) = &ctx.state.plan {
            brief.push_str(&format!("Plan: {p}\n"));
        }
        brief.push_str("Results of the plan's items:\n");
        brief.push_str(&self.step_outputs_text(ctx));
        let req = ChatRequest {
            phase: Phase::Synthesize,
            model: ctx.model(),
            messages: vec![
                ChatMessage::system(prompts::synthesis_system(&ctx.cfg)),
                ChatMessage::user(brief),
            ],
            tools: vec![],
            response_format: Some(JsonSchemaFormat {
                name: prompts::SYNTHESIS_SCHEMA_NAME.into(),
                schema: prompts::synthesis_schema(),
            }),
            hints: RequestHints {
                query: ctx.run.query.clone(),
                step_outputs: self.step_output_pairs(ctx),
                ..Default::default()
            },
        };
        ctx.flush().await?;
        let (value, resp) = ctx
            .guard(complete_structured(ctx.llm.as_ref(), req))
            .await?
            .map_err(|e| llm_halt(e, None))?;
        ctx.usage.add(&resp.usage);
        let response = value
            .get("response")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let final_response = json!({
            "response": response,
            "sources": non_null_or_empty(value.get("sources")),
            "suggestions": non_null_or_empty(value.get("suggestions")),
        });
        ctx.state.current_step_id = None;
        let mut b = ctx.batch();
        b.op(Op::AppendMessage(Message {
            id: new_id(),
            thread_id: ctx.thread_id.clone(),
            run_id: Some(ctx.run.run_id),
            role: MessageRole::Assistant,
            content: response.clone(),
            item_id: None,
            tool_call_id: None,
            name: None,
            tool_calls: vec![],
            created_at: Utc::now(),
        }));
        b.op(Op::SetAgentState(ctx.state.clone()));
        b.observe(ctx.obs(
            None,
            ObservationType::FinalResponse,
            "Final response",
            final_response.clone(),
        ));
        let duration_ms = ctx
            .run
            .started_at
            .map(|s| (Utc::now() - s).num_milliseconds().max(0))
            .unwrap_or_else(|| ctx.started.elapsed().as_millis() as i64);
        b.observe(ctx.obs(
            None,
            ObservationType::RunCompleted,
            "Run completed",
            json!({"usage": ctx.usage, "durationMs": duration_ms}),
        ));
        b.op(Op::UpdateRun(RunUpdate {
            status: Some(RunStatus::Completed),
            phase: Some("done".into()),
            usage: Some(ctx.usage),
            final_response: Some(final_response),
            ended: true,
            ..Default::default()
        }));
        ctx.commit(b).await?;
        ctx.run.phase = "done".into();
        Ok(())
    }

    async fn commit_failed(
        &self,
        ctx: &mut Ctx<'_>,
        err: ErrorInfo,
        item: Option<String>,
    ) -> Result<(), Halt> {
        warn!(run_id = %ctx.run.run_id, code = %err.code, message = %err.message, "run failed");
        let phase = match ctx.run.phase.as_str() {
            "planning" | "new" => "plan",
            "synthesizing" => "synthesize",
            _ => "execute",
        };
        let mut b = ctx.batch();
        if let Some(item_id) = &item
            && let Some(idx) = ctx.item_idx(item_id)
        {
            let it = &mut ctx.items[idx];
            let previous = it.status;
            it.status = ItemStatus::Failed;
            it.error = Some(err.clone());
            it.updated_at = Utc::now();
            b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
            b.observe(ctx.status_change(&ctx.items[idx], previous));
        }
        ctx.state.current_step_id = None;
        b.op(Op::SetAgentState(ctx.state.clone()));
        b.observe(ctx.obs(
            item.as_deref(),
            ObservationType::Error,
            err.code.clone(),
            json!({"phase": phase, "code": err.code, "message": err.message}),
        ));
        b.observe(ctx.obs(
            None,
            ObservationType::RunFailed,
            "Run failed",
            json!({"error": err, "usage": ctx.usage}),
        ));
        b.op(Op::UpdateRun(RunUpdate {
            status: Some(RunStatus::Failed),
            usage: Some(ctx.usage),
            error: Some(err),
            ended: true,
            ..Default::default()
        }));
        ctx.commit(b).await
    }

    /// Cancelled: the item in progress goes back to pending (its journal kept), the run ends.
    async fn commit_cancelled(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let mut b = ctx.batch();
        for i in 0..ctx.items.len() {
            let previous = ctx.items[i].status;
            if matches!(previous, ItemStatus::InProgress | ItemStatus::Waiting) {
                ctx.items[i].status = ItemStatus::Pending;
                ctx.items[i].updated_at = Utc::now();
                b.op(Op::UpsertItem(Box::new(ctx.items[i].clone())));
                b.observe(ctx.status_change(&ctx.items[i], previous));
            }
        }
        ctx.state.current_step_id = None;
        b.op(Op::SetAgentState(ctx.state.clone()));
        b.observe(ctx.obs(
            None,
            ObservationType::RunCancelled,
            "Run cancelled",
            json!({"reason": "cancelled", "usage": ctx.usage}),
        ));
        b.op(Op::UpdateRun(RunUpdate {
            status: Some(RunStatus::Cancelled),
            usage: Some(ctx.usage),
            ended: true,
            ..Default::default()
        }));
        ctx.commit(b).await
    }
}

/// A nullable array of a structured reply: null or absent is empty.
fn non_null_or_empty(v: Option<&Value>) -> Value {
    match v {
        Some(v @ Value::Array(_)) => v.clone(),
        _ => json!([]),
    }
}

fn halt_to_error(h: Halt) -> EngineError {
    match h {
        Halt::LeaseLost => EngineError::LeaseLost,
        Halt::Store(s) => EngineError::Store(s),
        Halt::Shutdown | Halt::Cancel | Halt::Fail(..) => EngineError::Stopped,
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

/// What the model reads as a tool's result.
fn tool_message_text(r: &ToolResultRecord) -> String {
    match (&r.status[..], &r.error) {
        ("success", _) | ("responded", _) => match &r.output {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        },
        (_, Some(e)) => json!({"error": e}).to_string(),
        _ => r.output.to_string(),
    }
}
