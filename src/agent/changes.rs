//! The change set the engine commits through its [`Journal`](super::Journal): row changes
//! ([`Op`]) and the observations that report them, gathered in a [`Batch`] that a store applies
//! atomically, and the [`AgentSnapshot`] a run starts from. These are the engine's types: the
//! store depends on them, not the reverse.

use serde_json::Value;

use crate::model::{
    AgentStateRow, ErrorInfo, ItemId, Message, NewObservation, RunPhase, RunStatus, Suspension,
    ThreadId, TodoItem, Usage,
};

/// The agent-facing view of a thread: thread-level fields, the todo list in plan order, and the
/// pending suspension if any.
#[derive(Debug, Clone)]
pub struct AgentSnapshot {
    pub state: AgentStateRow,
    pub items: Vec<TodoItem>,
    pub pending_suspension: Option<Suspension>,
}

/// Changes to a run's own row, applied under its fence.
#[derive(Debug, Clone, Default)]
pub struct RunUpdate {
    pub status: Option<RunStatus>,
    pub phase: Option<RunPhase>,
    pub usage: Option<Usage>,
    pub error: Option<ErrorInfo>,
    pub final_response: Option<Value>,
    /// Set `ended_at` to now (with a terminal status).
    pub ended: bool,
    /// With `status: suspended`: the pending suspensions the run waits on. Should one of them
    /// have been decided meanwhile (a person answered while other items ran), the run is queued
    /// again instead, so the decision is never left unread.
    pub unless_decided: Vec<uuid::Uuid>,
}

impl RunUpdate {
    /// Fold a later update into this one: fields it sets win.
    pub fn merge(&mut self, later: RunUpdate) {
        self.status = later.status.or(self.status);
        self.phase = later.phase.or(self.phase);
        self.usage = later.usage.or(self.usage);
        self.error = later.error.or(self.error.take());
        self.final_response = later.final_response.or(self.final_response.take());
        self.ended |= later.ended;
        if !later.unless_decided.is_empty() {
            self.unless_decided = later.unless_decided;
        }
    }
}

/// One state change inside a [`Batch`].
#[derive(Debug, Clone)]
pub enum Op {
    /// Replace the thread-level agent fields (the store bumps `version`).
    SetAgentState(AgentStateRow),
    /// Insert or replace one todo item row.
    UpsertItem(Box<TodoItem>),
    /// Remove one todo item row (a plan update dropped it).
    DeleteItem(ItemId),
    /// Append to the thread's conversation history (a user query, an assistant turn, a tool
    /// result).
    AppendMessage(Message),
    /// Change the fenced run's row.
    UpdateRun(RunUpdate),
    /// Record a new pending suspension (the run moves to `suspended` through `UpdateRun`).
    InsertSuspension(Box<Suspension>),
    /// Resolve the fenced run's pending suspensions as `cancelled`: the run ended, so nobody may
    /// decide them any more and no later run may take them up.
    CancelSuspensions,
}

/// State changes and the observations that report them, committed together or not at all.
#[derive(Debug, Clone)]
pub struct Batch {
    pub tenant: String,
    pub thread_id: ThreadId,
    pub ops: Vec<Op>,
    pub observations: Vec<NewObservation>,
}

impl Batch {
    /// The items this batch moves to a final status, with how long each ran (start to end): read from
    /// its `ITEM_STATUS_CHANGE` observations, so each end is counted once, when it is committed. An
    /// item cancelled before it started has no duration and is left out.
    pub fn item_ends(&self) -> Vec<(&'static str, std::time::Duration)> {
        self.observations
            .iter()
            .filter(|o| o.kind == crate::model::ObservationType::ItemStatusChange)
            .filter_map(|o| {
                let status: crate::model::ItemStatus =
                    serde_json::from_value(o.content.get("status")?.clone()).ok()?;
                if !status.is_done() {
                    return None;
                }
                let id = o.content.get("itemId")?.as_str()?;
                let item = self.ops.iter().find_map(|op| match op {
                    Op::UpsertItem(i) if i.id.as_str() == id => Some(i),
                    _ => None,
                })?;
                let took = (item.completed_at? - item.started_at?).to_std().ok()?;
                Some((status.as_str(), took))
            })
            .collect()
    }

    pub fn new(tenant: impl Into<String>, thread_id: ThreadId) -> Self {
        Self {
            tenant: tenant.into(),
            thread_id,
            ops: Vec::new(),
            observations: Vec::new(),
        }
    }
    /// Add a change. Changes to the same row coalesce (a later item row or agent state replaces
    /// the earlier one in place; run updates merge field by field), so a batch that gathered
    /// several steps still writes each row once.
    pub fn op(&mut self, op: Op) -> &mut Self {
        match op {
            Op::UpsertItem(item) => {
                if let Some(slot) = self.ops.iter_mut().find_map(|o| match o {
                    Op::UpsertItem(i) if i.id == item.id => Some(i),
                    _ => None,
                }) {
                    *slot = item;
                } else {
                    self.ops.push(Op::UpsertItem(item));
                }
            }
            Op::SetAgentState(state) => {
                if let Some(slot) = self.ops.iter_mut().find_map(|o| match o {
                    Op::SetAgentState(s) => Some(s),
                    _ => None,
                }) {
                    *slot = state;
                } else {
                    self.ops.push(Op::SetAgentState(state));
                }
            }
            Op::UpdateRun(u) => {
                if let Some(slot) = self.ops.iter_mut().find_map(|o| match o {
                    Op::UpdateRun(r) => Some(r),
                    _ => None,
                }) {
                    slot.merge(u);
                } else {
                    self.ops.push(Op::UpdateRun(u));
                }
            }
            other => self.ops.push(other),
        }
        self
    }

    /// Append another batch of the same thread: its changes after ours, coalesced.
    pub fn absorb(&mut self, other: Batch) {
        for op in other.ops {
            self.op(op);
        }
        self.observations.extend(other.observations);
    }
    pub fn observe(&mut self, obs: NewObservation) -> &mut Self {
        self.observations.push(obs);
        self
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.observations.is_empty()
    }
}
