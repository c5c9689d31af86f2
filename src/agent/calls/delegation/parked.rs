//! Runs parked on remote agents: which items only wait on a remote (so the scheduler may park
//! the run), the run's delegations still unanswered (read from its log), following them without
//! a worker slot, and cancelling them when the run is cancelled.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::{Value, json};

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

/// A delegation of the run with no tool result yet, as its updates record it.
struct Unanswered {
    call_id: String,
    item_id: String,
    agent: String,
    task_id: String,
    /// Its `TOOL_CALL` observation.
    parent: Option<String>,
    /// Settled after the last answer forwarded (the run reads the outcome when it goes on).
    settled: bool,
}

/// The run's delegations whose remote task is recorded and that have no tool result yet, in the
/// order they were sent.
async fn unanswered(journal: &dyn Journal) -> Result<Vec<Unanswered>, crate::agent::EngineError> {
    let seen = journal
        .run_observations(&[
            ObservationType::A2aTaskUpdate,
            ObservationType::ToolExecution,
        ])
        .await?;
    let answered: HashSet<&str> = seen
        .iter()
        .filter(|o| o.kind == ObservationType::ToolExecution)
        .filter_map(|o| o.content["toolCallId"].as_str())
        .collect();
    let mut out: Vec<Unanswered> = Vec::new();
    for o in seen
        .iter()
        .filter(|o| o.kind == ObservationType::A2aTaskUpdate)
    {
        let c = &o.content;
        let call = c["toolCallId"].as_str().unwrap_or("");
        if answered.contains(call) {
            continue;
        }
        let known = out.iter().position(|u| u.call_id == call);
        let u = match (known, c["taskId"].as_str()) {
            (Some(k), _) => &mut out[k],
            // The first update of a call names its task, agent, item and parent.
            (None, Some(task)) => {
                out.push(Unanswered {
                    call_id: call.to_owned(),
                    item_id: c["itemId"].as_str().unwrap_or("").to_owned(),
                    agent: c["agent"].as_str().unwrap_or("").to_owned(),
                    task_id: task.to_owned(),
                    parent: o.parent_id.clone(),
                    settled: false,
                });
                out.last_mut().expect("just pushed")
            }
            (None, None) => continue,
        };
        if c["forwarded"].is_string() {
            u.settled = false;
        }
        if c["settled"].is_object() {
            u.settled = true;
        }
    }
    Ok(out)
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
        let calls: Vec<Unanswered> = unanswered(journal)
            .await?
            .into_iter()
            .filter(|u| !u.settled)
            .collect();
        let delegations: Vec<(Delegation<'_>, ToolCallRecord, Value)> = calls
            .into_iter()
            .map(|u| {
                let args = json!({"agent": u.agent});
                let call = ToolCallRecord {
                    id: u.call_id,
                    name: crate::a2a::client::agents::DELEGATE_TOOL.to_owned(),
                    arguments: args.clone(),
                };
                let d = Delegation {
                    item_id: u.item_id,
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
        let Some(client) = agents.get(&u.agent).and_then(|a| a.client().ok()) else {
            continue;
        };
        let (state, message) = match client.cancel_task(&u.task_id, Duration::from_secs(5)).await {
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
            format!("{}: cancel requested", u.agent),
            json!({"toolCallId": u.call_id, "agent": u.agent, "taskId": u.task_id,
                   "state": state, "message": message, "cancelRequested": true}),
        ));
    }
    out
}
