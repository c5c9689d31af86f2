//! Runs parked on remote agents: which items only wait on a remote (so the scheduler may park
//! the run), the run's delegations still unanswered (read from its log), following them without
//! a worker slot, and cancelling them when the run is cancelled.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::{Value, json};

use super::ledger::{DelegationLedger, DelegationRecord};
use super::{Delegation, run};
use crate::a2a::client::agents::RemoteAgents;
use crate::agent::Engine;
use crate::agent::journal::Journal;
use crate::model::{NewObservation, ObservationType, ThreadId, ToolCallRecord};

/// The items of a run whose delegation has recorded its remote task and now only waits on it:
/// the scheduler may park the run when every item in flight is one of these.
#[derive(Default)]
pub(in crate::agent) struct Watching {
    items: Mutex<HashSet<String>>,
    /// Poked when an item starts waiting, so the scheduler looks again.
    pub changed: tokio::sync::Notify,
}

impl Watching {
    pub(super) fn insert(&self, item: &str) {
        self.items
            .lock()
            .expect("never poisoned")
            .insert(item.to_owned());
        self.changed.notify_one();
    }

    /// The item's I/O ended: it waits no more.
    pub fn remove(&self, item: &str) {
        self.items.lock().expect("never poisoned").remove(item);
    }

    /// Whether `item` only waits on its remote task.
    pub fn contains(&self, item: &str) -> bool {
        self.items.lock().expect("never poisoned").contains(item)
    }

    /// Whether every one of `items` only waits on a remote task (false for none).
    pub fn all<'i>(&self, mut items: impl Iterator<Item = &'i String>) -> bool {
        let set = self.items.lock().expect("never poisoned");
        let mut any = false;
        let all = items.all(|i| {
            any = true;
            set.contains(i)
        });
        any && all
    }
}

/// The run's delegations whose remote task is recorded and that have no tool result yet, in the
/// order they were sent.
async fn unanswered(
    journal: &dyn Journal,
) -> Result<Vec<DelegationRecord>, crate::agent::EngineError> {
    let seen = journal
        .run_observations(&[
            ObservationType::A2aTaskUpdate,
            ObservationType::ToolExecution,
        ])
        .await?;
    Ok(DelegationLedger::read(&seen)
        .unanswered()
        .cloned()
        .collect())
}

impl Engine {
    /// Follow the remote tasks a parked run waits on ([`crate::agent::RunEnd::WaitingRemote`]), with the
    /// run's lease but no worker slot, committing their updates as the run itself would. Returns
    /// once one of them settles (its outcome is committed: the run, back in the queue, reads it)
    /// or when none is left to follow.
    ///
    /// # Errors
    /// The run's records could not be read.
    pub async fn watch_remote(
        &self,
        journal: &dyn Journal,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: uuid::Uuid,
    ) -> Result<(), crate::agent::EngineError> {
        let Some(agents) = self.remote_agents.clone() else {
            return Ok(());
        };
        let calls: Vec<DelegationRecord> = unanswered(journal)
            .await?
            .into_iter()
            .filter(|u| u.settled.is_none())
            .collect();
        let delegations: Vec<(Delegation<'_>, ToolCallRecord, Value)> = calls
            .into_iter()
            .map(|u| {
                let args = json!({"agent": u.agent.unwrap_or_default()});
                let call = ToolCallRecord {
                    id: u.call_id,
                    name: crate::a2a::client::agents::DELEGATE_TOOL.to_owned(),
                    arguments: args.clone(),
                };
                let d = Delegation {
                    item_id: u.item_id.unwrap_or_default(),
                    decisions: vec![],
                    journal,
                    agents: agents.clone(),
                    tenant: tenant.to_owned(),
                    thread_id: thread_id.clone(),
                    run_id,
                    watching: None,
                    unreachable_for: self.settings.a2a_unreachable_for,
                };
                (d, call, args)
            })
            .collect();
        let mut following: FuturesUnordered<_> = delegations
            .iter()
            .map(|(d, call, args)| run(d, call, args))
            .collect();
        // The first to settle (or to fail) hands the run back; the rest are followed again by
        // the run itself, or by the next watcher, from what was committed.
        let _ = following.next().await;
        Ok(())
    }
}

/// Ask every remote agent still working on a task of this run to cancel it (the run is being
/// cancelled): best effort, each bounded in time. Returns the updates to commit with the
/// cancellation, one per remote task, under its call.
pub(in crate::agent) async fn cancel_pending(
    journal: &dyn Journal,
    agents: &RemoteAgents,
    run_id: uuid::Uuid,
) -> Vec<NewObservation> {
    let Ok(pending) = unanswered(journal).await else {
        return vec![];
    };
    let mut out = Vec::new();
    for u in pending {
        let (agent, task_id) = (u.agent.unwrap_or_default(), u.task_id.unwrap_or_default());
        let Some(client) = agents.get(&agent).and_then(|a| a.client().ok()) else {
            continue;
        };
        let (state, message) = match client.cancel_task(&task_id, Duration::from_secs(5)).await {
            Ok(t) => (json!(t.state), Value::Null),
            Err(e) => (
                Value::Null,
                json!(format!("cancelling the remote task failed: {e}")),
            ),
        };
        out.push(NewObservation::new(
            run_id,
            u.parent,
            ObservationType::A2aTaskUpdate,
            format!("{agent}: cancel requested"),
            json!({"toolCallId": u.call_id, "agent": agent, "taskId": task_id,
                   "state": state, "message": message, "cancelRequested": true}),
        ));
    }
    out
}
