//! A call of `delegate_to_agent`: the message goes to the remote agent once, the remote task is
//! recorded (an `A2A_TASK_UPDATE` under the `TOOL_CALL`, committed) before the call waits, and
//! every status and artifact the remote reports is committed as it comes. A call resumed after a
//! crash reads its recorded task back and watches it again: the message is never sent twice. (A
//! crash between the send and its record is covered too: the message names a context of our
//! own, and a v1.0 remote is asked for that context's task before anything is sent.)
//!
//! How a call settles (the result, a failure, or a question for a person) is committed with the
//! update that reports it (`settled`), so the call, resumed later, reads it back without asking
//! the remote again. While every item a run has in flight waits on a remote, the run gives its
//! worker slot back ([`crate::agent::RunEnd::WaitingRemote`]): [`Engine::watch_remote`] follows the
//! recorded tasks with the same code, until one settles.

pub mod ledger;
mod parked;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{CallFuture, CallKind, Flowcharts, KindFuture, Outcome, RunRef, Watching};
use crate::a2a::client::agents::{DELEGATE_TOOL, RemoteAgents, Unavailable};
use crate::a2a::client::rpc::{RemoteTask, RpcError};
use crate::agent::changes::Batch;
use crate::agent::journal::{Ctx, Journal, RunEnv};
use crate::agent::{Engine, EngineError};
use crate::model::{
    NewObservation, ObservationType, ResumeDecision, Suspension, SuspensionStatus, ThreadId,
    ToolCallRecord, ToolResultRecord, ToolResultStatus,
};
use crate::tools::{ToolError, ToolInfo, ToolSource};

use ledger::{DelegationLedger, DelegationRecord};
use watch::{Settled, read_settled, settled_json, watch};

/// How long one call to the remote may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a task is read again when it cannot be streamed.
const POLL: Duration = Duration::from_millis(500);

/// Why a delegation ended without a result. Its text is the call's tool error, which the model
/// reads and the log records (`settled`).
#[derive(Debug, thiserror::Error)]
pub(super) enum DelegationError {
    #[error("no remote agent is called `{0}`")]
    NoSuchAgent(String),
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    #[error("its records could not be read: {0}")]
    RecordsUnread(#[source] EngineError),
    #[error("the remote agent `{agent}` did not take the task: {source}")]
    NotTaken {
        agent: String,
        #[source]
        source: RpcError,
    },
    #[error("a person declined to answer the remote agent `{agent}`: {reason}")]
    Declined { agent: String, reason: String },
    #[error("the answer could not be sent to `{agent}`: {source}")]
    AnswerNotSent {
        agent: String,
        #[source]
        source: RpcError,
    },
    #[error("the remote task's update could not be committed: {0}")]
    UpdateNotCommitted(#[source] EngineError),
    #[error("the remote agent `{agent}` no longer knows task {task}")]
    TaskUnknown { agent: String, task: String },
    #[error("the remote agent `{agent}` failed: {source}")]
    Remote {
        agent: String,
        #[source]
        source: RpcError,
    },
    #[error("the remote agent `{agent}` cannot be reached (for {secs} s): {source}")]
    Unreachable {
        agent: String,
        secs: u64,
        #[source]
        source: RpcError,
    },
    #[error("the remote agent `{agent}` needs input this service cannot give it yet: {why}")]
    NeedsInput { agent: String, why: String },
    #[error("the remote agent `{agent}` ended the task as {state}: {why}")]
    Ended {
        agent: String,
        state: String,
        why: String,
    },
    /// How the call settled, read back from the log: the text it was recorded with.
    #[error("{0}")]
    Recorded(String),
}

/// What a delegation uses of the run.
pub(super) struct Delegation<'a> {
    /// The item that delegates.
    pub item_id: String,
    /// The suspensions of this call's remote questions (ids `<toolCallId>:remote:<n>`).
    pub decisions: Vec<Suspension>,
    pub journal: &'a dyn Journal,
    pub agents: Arc<RemoteAgents>,
    pub tenant: String,
    pub thread_id: ThreadId,
    pub run_id: uuid::Uuid,
    /// Told when the call only waits on its recorded remote task (none for the watcher).
    pub watching: Option<Arc<Watching>>,
    /// How long the remote may be unreachable before the call fails
    /// (`PES_A2A_UNREACHABLE_SECONDS`).
    pub unreachable_for: Duration,
}

/// How a delegation ended.
pub(super) enum Delegated {
    /// With the remote's result, or a tool error.
    Done(ToolResultRecord),
    /// The remote asks a question: the call waits for a person's answer on this call
    /// (`<toolCallId>:remote:<n>`, arguments `{agent, taskId, question}`).
    NeedsInput(ToolCallRecord),
}

/// A call of `delegate_to_agent`, when remote agents are configured.
pub(super) struct Delegate;

/// The tool `delegate_to_agent {agent, message}` over `agents` (described as they are now).
fn offered(agents: &RemoteAgents) -> ToolInfo {
    let spec = agents.delegate_spec();
    ToolInfo {
        name: spec.name,
        description: spec.description,
        parameters: spec.parameters,
        source: ToolSource::A2a,
        server: None,
        available: true,
        unavailable_reason: None,
    }
}

/// Check a call's arguments against the tool's schema (every problem, with its JSON path).
fn check(agents: &RemoteAgents, args: &Value) -> Result<(), ToolError> {
    crate::json::schema::validate(&agents.delegate_spec().parameters, args)
        .map_err(|errors| ToolError::InvalidArguments(errors.join("; ")))
}

impl CallKind for Delegate {
    fn claims(&self, engine: &Engine, _: &dyn Flowcharts, name: &str) -> bool {
        name == DELEGATE_TOOL && engine.remote_agents.is_some()
    }

    fn offers(&self, engine: &Engine, _: &dyn Flowcharts) -> Vec<ToolInfo> {
        engine.remote_agents.iter().map(|a| offered(a)).collect()
    }

    fn knows(&self, engine: &Engine, flowcharts: &dyn Flowcharts, name: &str) -> bool {
        self.claims(engine, flowcharts, name)
    }

    fn side_effects(&self, _: &Engine, _: &str) -> bool {
        true
    }

    fn pauses_inside(&self) -> bool {
        true
    }

    fn validate(
        &self,
        engine: &Engine,
        _: &RunEnv<'_>,
        _: &str,
        args: &Value,
    ) -> Result<(), ToolError> {
        check(engine.remote_agents.as_ref().expect("claimed"), args)
    }

    /// `a2a:<agent>` for a configured agent, else `a2a:other` (never a name the model made up).
    fn metric_label(&self, engine: &Engine, call: &ToolCallRecord) -> String {
        match call.arguments.get("agent").and_then(Value::as_str) {
            Some(a)
                if engine
                    .remote_agents
                    .as_ref()
                    .is_some_and(|r| r.get(a).is_some()) =>
            {
                format!("a2a:{a}")
            }
            _ => "a2a:other".into(),
        }
    }

    /// Remote agents still working for the run are asked to stop too.
    fn cancel<'f>(
        &self,
        engine: &'f Engine,
        journal: &'f dyn Journal,
        run_id: uuid::Uuid,
    ) -> KindFuture<'f, Vec<NewObservation>> {
        Box::pin(async move {
            match &engine.remote_agents {
                Some(agents) => parked::cancel_pending(journal, agents, run_id).await,
                None => Vec::new(),
            }
        })
    }

    fn follow<'f>(
        &self,
        engine: &'f Engine,
        journal: &'f dyn Journal,
        run: RunRef<'f>,
    ) -> Option<KindFuture<'f, Result<(), EngineError>>> {
        let agents = engine.remote_agents.clone()?;
        Some(Box::pin(parked::follow(engine, agents, journal, run)))
    }

    fn start<'f>(
        &self,
        engine: &'f Engine,
        ctx: &Ctx<'f>,
        item: &str,
        call: ToolCallRecord,
        args: Value,
        parkable: &Arc<Watching>,
    ) -> CallFuture<'f> {
        let d = Delegation {
            item_id: item.to_owned(),
            decisions: super::decisions_of(&ctx.suspensions, &call),
            journal: ctx.env.journal,
            agents: engine.remote_agents.clone().expect("claimed"),
            tenant: ctx.env.tenant.clone(),
            thread_id: ctx.env.thread_id.clone(),
            run_id: ctx.run.run_id,
            watching: Some(parkable.clone()),
            unreachable_for: engine.settings.a2a_unreachable_for,
        };
        Box::pin(async move {
            if let Err(e) = check(&d.agents, &args) {
                let result = error_record(&call, &e);
                return Outcome::Done(result, crate::model::Usage::default());
            }
            match delegate(&d, &call, &args).await {
                Delegated::Done(result) => Outcome::Done(result, crate::model::Usage::default()),
                Delegated::NeedsInput(question) => {
                    Outcome::Paused(question, crate::model::SuspensionKind::RemoteInput)
                }
            }
        })
    }
}

/// Run one call until it ends or its remote agent asks a question.
pub(super) async fn delegate(d: &Delegation<'_>, call: &ToolCallRecord, args: &Value) -> Delegated {
    let (status, output, error) = match run(d, call, args).await {
        Ok(Settled::Result(v)) => (ToolResultStatus::Success, v, None),
        Ok(Settled::Asks { task_id, question }) => {
            let round = d.decisions.len() + 1;
            return Delegated::NeedsInput(ToolCallRecord {
                id: format!("{}:remote:{round}", call.id),
                name: call.name.clone(),
                arguments: json!({"agent": args["agent"], "taskId": task_id, "question": question}),
            });
        }
        Err(e) => {
            let e = e.to_string();
            (ToolResultStatus::Error, json!({"error": e}), Some(e))
        }
    };
    Delegated::Done(ToolResultRecord {
        tool_call_id: call.id.clone(),
        name: call.name.clone(),
        status,
        output,
        error,
    })
}

/// The call's own record in the run's log (its `TOOL_CALL`, its recorded task, the answers
/// already forwarded, how it settled), from the run's [`DelegationLedger`].
async fn recorded(
    d: &Delegation<'_>,
    call: &ToolCallRecord,
) -> Result<DelegationRecord, DelegationError> {
    let seen = d
        .journal
        .run_observations(&[ObservationType::ToolCall, ObservationType::A2aTaskUpdate])
        .await
        .map_err(DelegationError::RecordsUnread)?;
    let ledger = DelegationLedger::read(&seen);
    Ok(ledger
        .call(&call.id)
        .cloned()
        .unwrap_or_else(|| DelegationRecord::new(&call.id)))
}

async fn run(
    d: &Delegation<'_>,
    call: &ToolCallRecord,
    args: &Value,
) -> Result<Settled, DelegationError> {
    let name = args["agent"].as_str().unwrap_or("");
    let text = args["message"].as_str().unwrap_or("");
    let agent = d
        .agents
        .get(name)
        .ok_or_else(|| DelegationError::NoSuchAgent(name.to_owned()))?;
    let client = agent.client()?;
    let rec = recorded(d, call).await?;
    let update = |content: Value| commit_update(d, &rec.parent, call, name, content);
    // Ours, so a task sent just before a crash can be found again.
    let context = format!("pes-{}-{}", d.run_id, call.id);
    let task_id = match rec.task_id {
        Some(id) => id,
        None => {
            let earlier = client
                .tasks_of_context(&context, CALL_TIMEOUT)
                .await
                .ok()
                .flatten()
                .and_then(|ts| ts.into_iter().next());
            let task = match earlier {
                Some(t) => t,
                None => client
                    .send_message(text, &context, Some(&context), None, CALL_TIMEOUT)
                    .await
                    .map_err(|source| DelegationError::NotTaken {
                        agent: name.to_owned(),
                        source,
                    })?,
            };
            update(task_json(&task)).await?;
            task.id
        }
    };
    // A person answered the remote's question: forward the answer (once), or give up.
    let mut forwarded_now = false;
    for s in &d.decisions {
        let sid = s.suspension_id.to_string();
        if rec.forwarded.contains(&sid) || s.status == SuspensionStatus::Pending {
            continue;
        }
        let answer = match (&s.status, &s.decision) {
            (SuspensionStatus::Resolved, Some(ResumeDecision::Respond { response, .. })) => {
                match response {
                    Value::String(t) => t.clone(),
                    other => other.to_string(),
                }
            }
            _ => {
                let _ = client.cancel_task(&task_id, CALL_TIMEOUT).await;
                let declined = Err(DelegationError::Declined {
                    agent: name.to_owned(),
                    reason: decline_reason(s),
                });
                update(
                    json!({"taskId": task_id, "forwarded": sid, "declined": true,
                              "settled": settled_json(&declined)}),
                )
                .await?;
                return declined;
            }
        };
        let sent = client
            .send_message(&answer, &sid, Some(&context), Some(&task_id), CALL_TIMEOUT)
            .await
            .map_err(|source| DelegationError::AnswerNotSent {
                agent: name.to_owned(),
                source,
            })?;
        update(json!({"taskId": task_id, "forwarded": sid, "state": sent.state})).await?;
        forwarded_now = true;
        // The remote may still show the question until it reads the answer.
        let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            match client.get_task(&task_id, CALL_TIMEOUT).await {
                Ok(t) if t.state.is_interrupted() => tokio::time::sleep(POLL / 5).await,
                _ => break,
            }
        }
    }
    if !forwarded_now && let Some(settled) = rec.settled {
        // Settled while the run was parked, or just before a crash: nothing to ask the remote.
        return read_settled(&settled, &task_id);
    }
    if let Some(w) = &d.watching {
        w.insert(&d.item_id);
    }
    watch(&client, &task_id, name, d.unreachable_for, &update).await
}

fn decline_reason(s: &Suspension) -> String {
    match &s.decision {
        Some(ResumeDecision::Reject { reason }) => {
            reason.clone().unwrap_or_else(|| "no reason given".into())
        }
        _ => match s.status {
            SuspensionStatus::Expired => "no one answered in time".into(),
            _ => "the question was withdrawn".into(),
        },
    }
}

fn task_json(t: &RemoteTask) -> Value {
    json!({"taskId": t.id, "contextId": t.context_id, "state": t.state, "message": t.message})
}

/// Commit one `A2A_TASK_UPDATE` under the call's `TOOL_CALL`.
async fn commit_update(
    d: &Delegation<'_>,
    parent: &Option<String>,
    call: &ToolCallRecord,
    agent: &str,
    mut content: Value,
) -> Result<(), DelegationError> {
    content["toolCallId"] = json!(call.id);
    content["agent"] = json!(agent);
    content["itemId"] = json!(d.item_id);
    let title = match (&content["state"], &content["artifact"]) {
        (Value::String(s), _) => format!("{agent}: {s}"),
        (_, Value::Object(_)) => format!("{agent}: artifact"),
        _ => format!("{agent}: update"),
    };
    let obs = NewObservation::new(
        d.run_id,
        parent.clone(),
        ObservationType::A2aTaskUpdate,
        title,
        content,
    );
    let mut batch = Batch::new(d.tenant.clone(), d.thread_id.clone());
    batch.observe(obs);
    d.journal
        .commit(batch)
        .await
        .map_err(DelegationError::UpdateNotCommitted)
}

/// A failed call's record, `error` as its reason.
fn error_record(call: &ToolCallRecord, error: &ToolError) -> ToolResultRecord {
    let error = error.to_string();
    ToolResultRecord {
        tool_call_id: call.id.clone(),
        name: call.name.clone(),
        status: ToolResultStatus::Error,
        output: json!({"error": error}),
        error: Some(error),
    }
}
