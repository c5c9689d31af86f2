//! Delegations of a run parked on remote agents: the run's delegations still unanswered (read
//! from its log), following them without a worker slot, and cancelling them when the run is
//! cancelled.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::{Value, json};

use super::ledger::{DelegationLedger, DelegationRecord};
use super::{Delegation, run as run_call};
use crate::a2a::client::agents::{DELEGATE_TOOL, RemoteAgents};
use crate::agent::Engine;
use crate::agent::calls::RunRef;
use crate::agent::journal::Journal;
use crate::model::{NewObservation, ObservationType, ToolCallRecord};

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

/// Follow the remote tasks a parked run waits on, with the run's lease but no worker slot,
/// committing their updates as the run itself would. Returns once one of them settles (its
/// outcome is committed: the run, back in the queue, reads it) or when none is left to follow.
///
/// # Errors
/// The run's records could not be read.
pub(super) async fn follow(
    engine: &Engine,
    agents: Arc<RemoteAgents>,
    journal: &dyn Journal,
    run: RunRef<'_>,
) -> Result<(), crate::agent::EngineError> {
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
                name: DELEGATE_TOOL.to_owned(),
                arguments: args.clone(),
            };
            let d = Delegation {
                item_id: u.item_id.unwrap_or_default(),
                decisions: vec![],
                journal,
                agents: agents.clone(),
                tenant: run.tenant.to_owned(),
                thread_id: run.thread_id.clone(),
                run_id: run.run_id,
                watching: None,
                unreachable_for: engine.settings.a2a_unreachable_for,
            };
            (d, call, args)
        })
        .collect();
    let mut following: FuturesUnordered<_> = delegations
        .iter()
        .map(|(d, call, args)| run_call(d, call, args))
        .collect();
    // The first to settle (or to fail) hands the run back; the rest are followed again by the
    // run itself, or by the next watcher, from what was committed.
    let _ = following.next().await;
    Ok(())
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
