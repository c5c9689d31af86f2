//! The Plan-Execute-Synthesize engine: pure logic over traits. It talks to an [`LlmProvider`], a
//! [`ToolRegistry`] and a [`Journal`] (where it commits state changes together with the
//! observations that report them); it knows nothing of SQL or HTTP.
//!
//! A run is driven from whatever its persisted state says: a run re-claimed after a crash skips the
//! phases it finished, continues the item that was in progress from its journaled conversation, and
//! runs only the tool calls that have no journaled result. Nothing that completed runs again.
//!
//! This file owns the engine's public types and [`Engine::drive`], which runs the phases in order.
//! Each concept lives in its own file:
//!
//! - `journal.rs`: the [`Journal`] trait and the run context: what a run reads (`RunEnv`) and what
//!   its loop owns (`Ctx`: items, usage, the staged batch), which stages and commits changes.
//! - `changes.rs`: the change set a journal commits (`Batch`, `Op`, `RunUpdate`) and the snapshot
//!   a run starts from; the store applies these types, the engine never sees the store.
//! - `planner.rs`: the run's plan, its refinement, its repair, and the `update_plan` tool.
//! - `teams.rs`: team items: their nested plan, their depth limit, their end.
//! - `scheduler.rs`: the plan as a graph: ready items in parallel under `maxParallelItems`, failure
//!   propagation, and suspending the run once nothing can proceed.
//! - `executor.rs`: one item's next step in its ReAct loop, and taking the model's reply.
//! - `compaction.rs`: the compacted output other items read of a result.
//! - `context.rs`: what an item's brief and the synthesis read of the other items (`contextMode`).
//! - `tool_calls.rs`: deciding whether a tool call runs, and journaling its result.
//! - `calls/`: durable calls, one `CallKind` per file — a plain tool (`tool.rs`), a flowchart
//!   (`flowchart.rs`: steps committed and replayed on resume), a delegation (`delegation/`: sent
//!   once, recorded, watched until it settles; a run parked on remote agents,
//!   [`RunEnd::WaitingRemote`]; the `DelegationLedger` every reader derives its state from). The
//!   scheduler starts and takes in every kind the same way.
//! - `steer.rs` (a steering message, what a model call reads of them) and `steering.rs` (reading
//!   them again, the planner's refinement for them).
//! - `hitl.rs`: suspending an item on a call that needs a person, and applying their decision.
//! - `synthesizer.rs`: cancelling what can no longer run, and the final answer.
//! - `flowchart_run.rs`: a run of `kind: "flowchart"`: one item that makes one flowchart call,
//!   in place of planning, and its output as the answer, in place of synthesis.
//! - `endings.rs`: committing a run that failed or was cancelled.
//! - `plan.rs` (plan validation and merge) and `prompts.rs` (prompts, their labels, and schemas).

mod budget;
mod budget_gate;
mod calls;
pub mod changes;
mod compaction;
mod context;
mod endings;
mod executor;
mod failures;
mod flowchart_run;
mod hitl;
mod journal;
pub mod plan;
mod planner;
pub mod prompts;
mod scheduler;
mod steer;
mod steering;
mod synthesizer;
mod teams;
mod tenant_budget;
#[cfg(test)]
mod tests;
mod tool_calls;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::llm::LlmProvider;
use crate::model::{Message, MessageRole, Run, RunKind, RunPhase, Suspension, Thread, new_id};
use crate::telemetry::spans;
use crate::tools::ToolRegistry;
use changes::{AgentSnapshot, Batch, Op, RunUpdate};

pub use calls::delegation::ledger::DelegationLedger;
pub use journal::{Journal, TokenOut};
pub use steer::STEERING_NAME;
pub use tool_calls::FLUSH_SLOW_TOOL_AFTER;

use journal::{Ctx, Halt, RunEnv, halt_to_error};

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
    /// Ready items that execute at once when the thread sets no `maxParallelItems`.
    pub max_parallel_items: u32,
    /// Results longer than this are compacted, when the thread sets no
    /// `compactionThresholdChars`.
    pub compaction_threshold_chars: u32,
    /// Team nesting limit when the thread sets no `maxTeamDepth`.
    pub max_team_depth: u32,
    /// How often a run busy with some items re-reads the suspensions its other items wait on.
    /// Decisions are pushed to the run the moment they are taken ([`Journal::decision_arrived`]);
    /// this slow look only covers a push that was lost (a replica's LISTEN connection was down).
    pub decision_poll: std::time::Duration,
    /// Stages one flowchart call may execute, sub-flows included (`PES_FLOWCHART_MAX_STEPS`).
    pub flowchart_max_steps: u32,
    /// Where flowchart expressions run and their bounds (`PES_FLOWCHART_MAX_VALUE_BYTES`,
    /// `PES_FLOWCHART_EXPR_TIMEOUT_MS`): a handle shared by every run of the engine.
    pub flowchart_expr: crate::flowchart::expr::Evaluator,
    /// How long a run holds its worker slot while all it has in flight waits on remote agents
    /// before it parks (`PES_A2A_PARK_AFTER_MS`): see [`RunEnd::WaitingRemote`].
    pub a2a_park_after: std::time::Duration,
    /// How long a remote agent may stay unreachable before a delegation to it fails with a
    /// tool error (`PES_A2A_UNREACHABLE_SECONDS`).
    pub a2a_unreachable_for: std::time::Duration,
    /// Tools every call of which needs a person, on every thread (`PES_REQUIRE_APPROVAL`): added
    /// to each run's `requireApproval`.
    pub require_approval: Vec<String>,
    /// The most bytes of one tool result that is stored and shown to the model
    /// (`PES_TOOL_RESULT_MAX_BYTES`), applied where every result is journaled.
    pub tool_result_max_bytes: usize,
    /// What each model costs (`PES_MODEL_PRICES`): a run's `costUsd` and its dollar budget.
    pub prices: Arc<crate::model::Prices>,
    /// The models a config may name (`PES_ALLOWED_MODELS`).
    pub allowed_models: Arc<crate::model::AllowedModels>,
    /// What each tenant may spend per UTC day (`PES_TENANT_BUDGETS`).
    pub tenant_budgets: Arc<crate::model::TenantBudgets>,
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
            max_parallel_items: 4,
            compaction_threshold_chars: 1500,
            max_team_depth: 2,
            decision_poll: std::time::Duration::from_secs(5),
            flowchart_max_steps: 1000,
            flowchart_expr: crate::flowchart::expr::Evaluator::default(),
            a2a_park_after: std::time::Duration::from_secs(2),
            a2a_unreachable_for: std::time::Duration::from_secs(120),
            require_approval: Vec::new(),
            tool_result_max_bytes: 262_144,
            prices: Arc::new(crate::model::Prices::default()),
            allowed_models: Arc::new(crate::model::AllowedModels::any()),
            tenant_budgets: Arc::new(crate::model::TenantBudgets::default()),
        }
    }
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
    /// The store failed; the source error is kept, with its chain, for the one log line.
    #[error("store error: {0:#}")]
    Store(anyhow::Error),
}

/// How a run ended (or paused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    Completed,
    Failed,
    Cancelled,
    Suspended,
    /// Every item in flight waits on a remote agent's task (already recorded), and nothing else
    /// can start: the run gives its worker slot back but keeps its lease, still `running`.
    /// [`Engine::watch_remote`] follows the tasks without a slot; when one settles (or a person
    /// decides, or someone cancels) the run is handed back to the queue and continues where it
    /// was, reading the settled result from its log.
    WaitingRemote,
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
    /// The run's own recent thread-level messages (its query, the messages that steered it).
    pub own_messages: Vec<Message>,
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

/// The PES engine. Cheap to share behind an `Arc`.
pub struct Engine {
    providers: HashMap<String, Arc<dyn LlmProvider>>,
    tools: ToolRegistry,
    settings: EngineSettings,
    /// The remote agents `delegate_to_agent` reaches, when the operator configured some.
    remote_agents: Option<Arc<crate::a2a::client::agents::RemoteAgents>>,
    /// Where tool calls are counted.
    metrics: crate::telemetry::metrics::Metrics,
    /// What each tenant with a daily budget spent today, as this process knows it.
    gauges: Arc<tenant_budget::Gauges>,
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
            remote_agents: None,
            metrics: crate::telemetry::metrics::Metrics::new(),
            gauges: Arc::default(),
        }
    }

    /// The same engine, counting its tool calls in `metrics` (the service's `/metrics`).
    #[must_use]
    pub fn with_metrics(mut self, metrics: crate::telemetry::metrics::Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The same engine, delegating to these remote agents (its registry should hold the
    /// `delegate_to_agent` tool over them).
    #[must_use]
    pub fn with_remote_agents(
        mut self,
        agents: Arc<crate::a2a::client::agents::RemoteAgents>,
    ) -> Self {
        self.remote_agents = Some(agents);
        self
    }

    /// The tool registry (the HTTP layer validates `requireApproval` and edited arguments with it).
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// Each tenant's daily budget (`PES_TENANT_BUDGETS`), as the engine enforces it.
    pub fn tenant_budgets(&self) -> &crate::model::TenantBudgets {
        &self.settings.tenant_budgets
    }

    /// How often a run waiting on people re-reads their decisions, should a push be lost.
    pub fn decision_poll(&self) -> std::time::Duration {
        self.settings.decision_poll
    }

    /// The models a config may name (`PES_ALLOWED_MODELS`).
    pub fn allowed_models(&self) -> &crate::model::AllowedModels {
        &self.settings.allowed_models
    }

    /// What each model costs (`PES_MODEL_PRICES`).
    pub fn prices(&self) -> &crate::model::Prices {
        &self.settings.prices
    }

    /// The daily budget of `tenant`, when it has one (`PES_TENANT_BUDGETS`).
    pub fn tenant_budget(&self, tenant: &str) -> Option<&crate::model::Budget> {
        self.settings.tenant_budgets.of(tenant)
    }

    /// The model a run of `provider` (the default provider when `None`) uses when its config
    /// names none.
    pub fn default_model(&self, provider: Option<&str>) -> Option<String> {
        let name = provider.unwrap_or(&self.settings.default_provider);
        self.providers
            .get(name)
            .or_else(|| self.providers.get(&self.settings.default_provider))
            .and_then(|p| p.default_model().map(str::to_owned))
    }

    /// The default models of every configured provider.
    pub fn default_models(&self) -> Vec<String> {
        self.providers
            .values()
            .filter_map(|p| p.default_model().map(str::to_owned))
            .collect()
    }

    /// Names of the configured providers, sorted.
    pub fn provider_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.providers.keys().cloned().collect();
        names.sort_unstable();
        names
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
        let mut cfg = input.thread.config.overlay(&input.run.config);
        if !self.settings.require_approval.is_empty() {
            // The server-wide floor (`PES_REQUIRE_APPROVAL`) under whatever the thread and run say.
            cfg = cfg.overlay(&crate::model::AgentConfig {
                require_approval: Some(self.settings.require_approval.clone()),
                ..Default::default()
            });
        }
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
                    EngineError::Store(anyhow::anyhow!(
                        "no provider `{provider_name}` is configured"
                    ))
                })?,
        };
        let pending = Batch::new(input.run.tenant.clone(), input.run.thread_id.clone());
        let mut flowcharts = std::collections::BTreeMap::new();
        for record in journal.flowcharts().await? {
            let name = record.name.clone();
            match crate::flowchart::tool::FlowTool::new(record) {
                Ok(t) => {
                    flowcharts.insert(name, t);
                }
                Err(e) => tracing::warn!(flowchart = %name, error = %e, "flowchart left out"),
            }
        }
        let run_id = input.run.run_id;
        let decided = budget::decisions(&input.suspensions, run_id);
        let model = cfg
            .model
            .clone()
            .filter(|m| !m.trim().is_empty())
            .or_else(|| llm.default_model().map(str::to_owned));
        // A dollar limit over a model without a price would cap nothing (refused at enqueue;
        // this catches a config changed since, such as a thread's model patched).
        let dollar_limited = cfg.budget.as_ref().and_then(|b| b.max_cost_usd).is_some()
            || self
                .settings
                .tenant_budgets
                .of(&input.run.tenant)
                .and_then(|b| b.max_cost_usd)
                .is_some();
        let unpriced = model
            .as_deref()
            .filter(|m| dollar_limited && !self.settings.prices.prices(m))
            .map(str::to_owned);
        let tenant_limit = self
            .settings
            .tenant_budgets
            .of(&input.run.tenant)
            .map(|b| tenant_budget::TenantLimit::new(b, self.gauges.of(&input.run.tenant)));
        if decided.tenant_approved
            && let Some(t) = &tenant_limit
        {
            // The operator raised the day so that this run goes on: read the raise first.
            t.gauge.expire();
        }
        let meter = Arc::new(budget::Meter::new(
            cfg.budget.as_ref(),
            tenant_limit,
            self.settings.prices.clone(),
            model,
            &input.run.usage,
            decided.raised,
        ));
        let mut ctx = Ctx {
            env: RunEnv {
                budget: meter,
                journal,
                signals,
                llm,
                tenant: input.run.tenant.clone(),
                thread_id: input.run.thread_id.clone(),
                cfg,
                flowcharts: Arc::new(flowcharts),
                started: Instant::now(),
                tokens: journal.token_out(),
            },
            usage: input.run.usage,
            run: input.run,
            state: input.snapshot.state,
            items: input.snapshot.items,
            history: input.history,
            suspensions: input.suspensions,
            pending,
            tickets: HashMap::new(),
            steering: steer::from_messages(&input.own_messages, run_id),
        };
        if !ctx.steering.is_empty() {
            // Which of it the planner already took in (a run that goes on after a pause).
            ctx.reload_steering().await.map_err(halt_to_error)?;
        }
        let driven = match ctx.refresh_tenant_spend().await {
            Err(h) => Err(h),
            Ok(()) => {
                if ctx.run.phase != RunPhase::New {
                    ctx.env.budget.tenant_reported();
                }
                if let Some(model) = unpriced {
                    Err(Halt::Fail(
                        crate::model::ErrorInfo {
                            code: "model_unpriced".into(),
                            message: format!(
                                "model `{model}` has no price in PES_MODEL_PRICES, so the run's \
                                 dollar limit cannot cap it"
                            ),
                        },
                        None,
                    ))
                } else if let Some(scope) = decided.rejected {
                    // A person refused to raise the budget: the run ends here.
                    ctx.env.budget.shut(scope);
                    Err(Halt::Fail(
                        budget::exceeded_error(&ctx.env.budget.exceeded()),
                        None,
                    ))
                } else {
                    self.drive_inner(&mut ctx).await
                }
            }
        };
        match driven {
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
            Err(Halt::OverBudget) => {
                self.suspend_for_budget(&mut ctx)
                    .await
                    .map_err(halt_to_error)?;
                Ok(RunEnd::Suspended)
            }
        }
    }

    async fn drive_inner(&self, ctx: &mut Ctx<'_>) -> Result<RunEnd, Halt> {
        if ctx.run.phase == RunPhase::New {
            self.start(ctx).await?;
        }
        let flowchart = ctx.run.kind == RunKind::Flowchart;
        if ctx.run.phase == RunPhase::Planning {
            if flowchart {
                self.start_flowchart(ctx).await?;
            } else {
                self.plan(ctx).instrument(spans::plan()).await?;
            }
        }
        if ctx.run.phase == RunPhase::Executing {
            ctx.check_signals()?;
            if let Some(end) = self.execute_plan(ctx).await? {
                return Ok(end);
            }
            if flowchart {
                // Its output is the answer: no synthesis.
                self.finish_flowchart(ctx).await?;
                return Ok(RunEnd::Completed);
            }
            self.begin_synthesis(ctx).await?;
        }
        if ctx.run.phase == RunPhase::Synthesizing {
            self.synthesize(ctx).instrument(spans::synthesize()).await?;
        }
        Ok(RunEnd::Completed)
    }

    /// `RUN_STARTED` and the user's message.
    async fn start(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let mut b = ctx.batch();
        let warning = ctx.env.llm.is_offline().then(|| {
            "offline model: answers are made by a deterministic stand-in, not a real LLM. \
             Set PES_LLM_BASE_URL / PES_LLM_API_KEY to use a real model."
                .to_owned()
        });
        b.observe(ctx.emit(
            None,
            "Run started",
            &crate::model::payloads::RunStartedContent {
                query: ctx.run.query.clone(),
                provider: ctx.env.llm.name().to_owned(),
                model: ctx.model_in_use(),
                attempt: ctx.run.attempt,
                assistant: ctx.run.assistant.clone(),
                warning,
                cron_id: ctx.run.cron_id,
            },
        ));
        b.op(Op::AppendMessage(Message {
            id: new_id(),
            thread_id: ctx.env.thread_id.clone(),
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
            phase: Some(RunPhase::Planning),
            ..Default::default()
        }));
        ctx.stage(b);
        ctx.run.phase = RunPhase::Planning;
        Ok(())
    }
}
