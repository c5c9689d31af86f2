//! Where the engine's changes go: the [`Journal`] trait the worker implements, and the context of
//! one run being driven ([`Ctx`]), which stages changes and commits them (with the observations
//! that report them) at the points where they must be durable. Also the internal [`Halt`] reasons
//! that leave the normal flow.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use super::changes::Batch;
use crate::llm::{LlmError, LlmProvider, Phase, TokenSink, Tokens};
use crate::model::payloads::ItemStatusChangeContent;
use crate::model::{
    AgentConfig, AgentStateRow, ErrorInfo, ItemStatus, Message, NewObservation, Run, Suspension,
    ThreadId, TodoItem, Usage,
};

use super::{EngineError, Signals};

/// Where the text of a run's model replies goes while it streams (the worker's implementation
/// fans it out to the run's thread's `?tokens=true` streams). Ephemeral: nothing sent here is
/// committed, and a publisher never waits.
pub trait TokenOut: Send + Sync {
    /// Whether anyone listens now (the engine's requests skip forwarding when not).
    fn listening(&self) -> bool;
    /// A piece of the reply of the model call for `item_id` (none for the run's plan and
    /// synthesis) in `phase`.
    fn publish(&self, item_id: Option<&str>, phase: Phase, delta: &str);
}

/// A [`TokenOut`] as the sink of one model request: it knows the item and the phase.
struct RequestTokens {
    out: Arc<dyn TokenOut>,
    item_id: Option<String>,
    phase: Phase,
}

impl TokenSink for RequestTokens {
    fn listening(&self) -> bool {
        self.out.listening()
    }

    fn delta(&self, text: &str) {
        self.out.publish(self.item_id.as_deref(), self.phase, text);
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

    /// Which of these suspensions a person (or the expiry sweeper) has decided since the run
    /// loaded them: read before the run suspends, so a decision made while other items were
    /// running is applied now rather than after a needless suspend and re-claim.
    ///
    /// # Errors
    /// [`EngineError::Store`] when they cannot be read.
    async fn decided(&self, _ids: &[uuid::Uuid]) -> Result<Vec<Suspension>, EngineError> {
        Ok(vec![])
    }

    /// Resolves when a decision on one of the run's suspensions may have arrived (a push: the
    /// worker's run registry is poked by the command that resolved it, here or on another
    /// replica), so the scheduler reads [`Journal::decided`] at once instead of at its next
    /// fallback look (`EngineSettings::decision_poll`). A spurious wake-up costs one read. The
    /// default never resolves: a journal without pushes relies on the fallback look alone.
    async fn decision_arrived(&self) {
        std::future::pending::<()>().await;
    }

    /// Resolves when a person may have steered the run (pushed like a decision); the run then
    /// reads its `STEERING` observations. The default never resolves.
    async fn steering_arrived(&self) {
        std::future::pending::<()>().await;
    }

    /// The latest version of every flowchart of the run's tenant (mounted as tools). The
    /// default has none.
    ///
    /// # Errors
    /// [`EngineError::Store`] when they cannot be read.
    async fn flowcharts(&self) -> Result<Vec<crate::flowchart::FlowchartRecord>, EngineError> {
        Ok(vec![])
    }

    /// One flowchart of the run's tenant: the latest version, or `version` (even when deleted
    /// since: a call in progress resumes on the version it started with).
    ///
    /// # Errors
    /// [`EngineError::Store`] when it cannot be read.
    async fn flowchart(
        &self,
        _name: &str,
        _version: Option<i64>,
    ) -> Result<Option<crate::flowchart::FlowchartRecord>, EngineError> {
        Ok(None)
    }

    /// The run's committed observations of these types, in `seq` order (a flowchart call
    /// resuming reads its steps back).
    ///
    /// # Errors
    /// [`EngineError::Store`] when they cannot be read.
    async fn run_observations(
        &self,
        _types: &[crate::model::ObservationType],
    ) -> Result<Vec<crate::model::Observation>, EngineError> {
        Ok(vec![])
    }

    /// What the run's tenant spent on its models since `since` (the committed usage of its runs
    /// created since then) and what the operator raised its daily budget by since then: its
    /// daily budget's day. The default: nothing.
    ///
    /// # Errors
    /// [`EngineError::Store`] when it cannot be read.
    async fn tenant_spend(
        &self,
        _since: chrono::DateTime<chrono::Utc>,
    ) -> Result<crate::model::TenantDay, EngineError> {
        Ok(crate::model::TenantDay::default())
    }

    /// Where the run's streamed model text goes. The default: nowhere.
    fn token_out(&self) -> Option<Arc<dyn TokenOut>> {
        None
    }
}

/// Internal reasons to leave the normal flow.
pub(super) enum Halt {
    Cancel,
    Shutdown,
    LeaseLost,
    Store(anyhow::Error),
    /// The run fails: code, message, and the item it failed in.
    Fail(ErrorInfo, Option<String>),
    /// The next model call would pass the run's budget, which suspends at the limit.
    OverBudget,
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

pub(super) fn llm_halt(e: LlmError, item: Option<&str>) -> Halt {
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

pub(super) fn halt_to_error(h: Halt) -> EngineError {
    match h {
        Halt::LeaseLost => EngineError::LeaseLost,
        Halt::Store(s) => EngineError::Store(s),
        Halt::Shutdown | Halt::Cancel | Halt::Fail(..) | Halt::OverBudget => EngineError::Stopped,
    }
}

/// What one run being driven reads and never changes while it runs: where it commits, the
/// signals that stop it, its model provider, whose run it is, its effective configuration and the
/// flowcharts mounted as its tools. A durable call borrows this while the loop owns the rest.
pub(super) struct RunEnv<'a> {
    pub(super) journal: &'a dyn Journal,
    pub(super) signals: &'a Signals,
    pub(super) llm: Arc<dyn LlmProvider>,
    pub(super) tenant: String,
    pub(super) thread_id: ThreadId,
    pub(super) cfg: AgentConfig,
    /// The tenant's flowcharts, mounted as tools for this run (loaded when it starts).
    pub(super) flowcharts:
        Arc<std::collections::BTreeMap<String, crate::flowchart::tool::FlowTool>>,
    pub(super) started: Instant,
    /// Where the streamed text of the run's model calls goes (the journal's).
    pub(super) tokens: Option<Arc<dyn TokenOut>>,
    /// The run's budget: every model call passes it first (shared with flowchart calls).
    pub(super) budget: Arc<super::budget::Meter>,
}

/// One run being driven: what it reads ([`RunEnv`]) and what its loop owns and changes — the run
/// row, the state and todo items, the conversation, the suspensions, the usage so far, and the
/// changes staged for the next commit.
pub(super) struct Ctx<'a> {
    pub(super) env: RunEnv<'a>,
    pub(super) run: Run,
    pub(super) state: AgentStateRow,
    pub(super) items: Vec<TodoItem>,
    pub(super) history: Vec<Message>,
    pub(super) suspensions: Vec<Suspension>,
    pub(super) usage: Usage,
    /// Changes staged since the last commit: written together at the next point where they must
    /// be durable (before a model or tool call, at a suspension, at the end).
    pub(super) pending: Batch,
    /// The budget reservations of the model calls in flight, by item id (`""`: the run's own).
    pub(super) tickets: std::collections::HashMap<String, super::budget::Ticket>,
    /// What people said to the run while it ran (its `STEERING`), and whether the planner took
    /// each in.
    pub(super) steering: Vec<super::steer::Steer>,
}

impl Ctx<'_> {
    pub(super) fn batch(&self) -> Batch {
        Batch::new(self.env.tenant.clone(), self.env.thread_id.clone())
    }

    /// An observation of `payload`'s type from this run (serialized once, here).
    pub(super) fn emit<P: crate::model::payloads::Payload>(
        &self,
        parent: Option<&str>,
        title: impl Into<String>,
        payload: &P,
    ) -> NewObservation {
        NewObservation::of(self.run.run_id, parent.map(str::to_owned), title, payload)
    }

    /// Stage changes; they are committed with the next [`Ctx::flush`].
    pub(super) fn stage(&mut self, batch: Batch) {
        self.pending.absorb(batch);
    }

    /// Commit everything staged.
    pub(super) async fn flush(&mut self) -> Result<(), Halt> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(
            &mut self.pending,
            Batch::new(self.env.tenant.clone(), self.env.thread_id.clone()),
        );
        self.env.journal.commit(batch).await.map_err(Halt::from)
    }

    /// Stage and commit now.
    pub(super) async fn commit(&mut self, batch: Batch) -> Result<(), Halt> {
        self.stage(batch);
        self.flush().await
    }

    /// Run `fut` unless the run is cancelled or the process stops first.
    pub(super) async fn guard<T>(&self, fut: impl Future<Output = T>) -> Result<T, Halt> {
        tokio::select! {
            biased;
            _ = self.env.signals.shutdown.cancelled() => Err(Halt::Shutdown),
            _ = self.env.signals.cancel.cancelled() => Err(Halt::Cancel),
            v = fut => Ok(v),
        }
    }

    /// The token sink of a model call for `item_id` (none for the run's own plan and synthesis)
    /// in `phase`.
    pub(super) fn tap(&self, item_id: Option<&str>, phase: Phase) -> Tokens {
        match &self.env.tokens {
            Some(out) => Tokens::to(Arc::new(RequestTokens {
                out: out.clone(),
                item_id: item_id.map(str::to_owned),
                phase,
            })),
            None => Tokens::none(),
        }
    }

    /// Commit what is staged, then ask for a structured reply (one repair attempt included),
    /// abandoning it on cancel or shutdown; its usage is added to the run's. The call passes the
    /// run's budget first. The reply streams to the run's token sink, as the run's own (no item).
    pub(super) async fn ask_structured(
        &mut self,
        mut req: crate::llm::ChatRequest,
    ) -> Result<serde_json::Value, Halt> {
        req.tokens = self.tap(None, req.phase);
        self.refresh_tenant_spend().await?;
        self.admit("", &req)?;
        self.flush().await?;
        let reply = self
            .guard(crate::llm::structured::complete_structured(
                self.env.llm.as_ref(),
                req,
            ))
            .await?;
        let (value, resp) = match reply {
            Ok(r) => r,
            Err(e) => {
                self.unadmit("");
                return Err(llm_halt(e, None));
            }
        };
        self.spend("", &resp.usage, false);
        Ok(value)
    }

    /// At a safe point (everything so far committed): stop here if asked to.
    pub(super) fn check_signals(&self) -> Result<(), Halt> {
        if self.env.signals.cancel.is_cancelled() {
            return Err(Halt::Cancel);
        }
        if self.env.signals.shutdown.is_cancelled() || self.env.signals.drain.is_cancelled() {
            return Err(Halt::Shutdown);
        }
        Ok(())
    }

    pub(super) fn item_idx(&self, id: &str) -> Option<usize> {
        self.items.iter().position(|i| i.id.as_str() == id)
    }

    pub(super) fn status_change(&self, item: &TodoItem, previous: ItemStatus) -> NewObservation {
        self.emit(
            Some(item.id.as_str()),
            format!("{}: {} → {}", item.id, previous, item.status),
            &ItemStatusChangeContent {
                item_id: item.id.clone(),
                status: item.status,
                previous_status: previous,
            },
        )
    }

    pub(super) fn model(&self) -> Option<String> {
        self.env.cfg.model.clone()
    }

    /// The model the run's requests go to: the thread's or run's `model`, else the provider's
    /// default.
    pub(super) fn model_in_use(&self) -> Option<String> {
        self.env
            .cfg
            .model
            .clone()
            .filter(|m| !m.trim().is_empty())
            .or_else(|| self.env.llm.default_model().map(str::to_owned))
    }
}
