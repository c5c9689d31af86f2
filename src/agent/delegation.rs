//! A call of `delegate_to_agent`: the message goes to the remote agent once, the remote task is
//! recorded (an `A2A_TASK_UPDATE` under the `TOOL_CALL`, committed) before the call waits, and
//! every status and artifact the remote reports is committed as it comes. A call resumed after a
//! crash reads its recorded task back and watches it again: the message is never sent twice. (A
//! crash between the send and its record is covered too: the message names a context of our
//! own, and a v1.0 remote is asked for that context's task before anything is sent.)
//!
//! This slice waits inside the run (it holds a worker slot while the remote works); a remote
//! `input-required` ends the call with a tool error that quotes the question.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use super::changes::Batch;
use super::journal::Journal;
use crate::a2a::client::agents::RemoteAgents;
use crate::a2a::client::rpc::{A2aClient, RemoteEvent, RemoteState, RemoteTask, RpcError};
use crate::model::{
    NewObservation, ObservationType, ResumeDecision, Suspension, SuspensionStatus, ThreadId,
    ToolCallRecord, ToolResultRecord, ToolResultStatus,
};

/// How long one call to the remote may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a task is read again when it cannot be streamed.
const POLL: Duration = Duration::from_millis(500);

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
}

/// How a delegation ended.
pub(super) enum Delegated {
    /// With the remote's result, or a tool error.
    Done(ToolResultRecord),
    /// The remote asks a question: the call waits for a person's answer on this call
    /// (`<toolCallId>:remote:<n>`, arguments `{agent, taskId, question}`).
    NeedsInput(ToolCallRecord),
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
        Err(e) => (ToolResultStatus::Error, json!({"error": e}), Some(e)),
    };
    Delegated::Done(ToolResultRecord {
        tool_call_id: call.id.clone(),
        name: call.name.clone(),
        status,
        output,
        error,
    })
}

/// How a remote task settled.
enum Settled {
    /// Completed: its result.
    Result(Value),
    /// It asks its caller.
    Asks { task_id: String, question: String },
}

/// The call's own record: its `TOOL_CALL` observation, its recorded remote task, and the
/// person's answers already forwarded (by suspension id).
struct Recorded {
    parent: Option<String>,
    task_id: Option<String>,
    forwarded: Vec<String>,
}

async fn recorded(d: &Delegation<'_>, call: &ToolCallRecord) -> Result<Recorded, String> {
    let seen = d
        .journal
        .run_observations(&[ObservationType::ToolCall, ObservationType::A2aTaskUpdate])
        .await
        .map_err(|e| format!("its records could not be read: {e}"))?;
    let mine = |o: &&crate::model::Observation| o.content["toolCallId"] == call.id.as_str();
    Ok(Recorded {
        parent: seen
            .iter()
            .filter(mine)
            .rfind(|o| o.kind == ObservationType::ToolCall)
            .map(|o| o.id.to_string()),
        task_id: seen
            .iter()
            .filter(mine)
            .filter(|o| o.kind == ObservationType::A2aTaskUpdate)
            .find_map(|o| o.content["taskId"].as_str().map(str::to_owned)),
        forwarded: seen
            .iter()
            .filter(mine)
            .filter_map(|o| o.content["forwarded"].as_str().map(str::to_owned))
            .collect(),
    })
}

async fn run(d: &Delegation<'_>, call: &ToolCallRecord, args: &Value) -> Result<Settled, String> {
    let name = args["agent"].as_str().unwrap_or("");
    let text = args["message"].as_str().unwrap_or("");
    let agent = d
        .agents
        .get(name)
        .ok_or_else(|| format!("no remote agent is called `{name}`"))?;
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
                    .map_err(|e| format!("the remote agent `{name}` did not take the task: {e}"))?,
            };
            update(task_json(&task)).await?;
            task.id
        }
    };
    // A person answered the remote's question: forward the answer (once), or give up.
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
                update(json!({"taskId": task_id, "forwarded": sid, "declined": true})).await?;
                return Err(format!(
                    "a person declined to answer the remote agent `{name}`: {}",
                    decline_reason(s)
                ));
            }
        };
        let sent = client
            .send_message(&answer, &sid, Some(&context), Some(&task_id), CALL_TIMEOUT)
            .await
            .map_err(|e| format!("the answer could not be sent to `{name}`: {e}"))?;
        update(json!({"taskId": task_id, "forwarded": sid, "state": sent.state})).await?;
        // The remote may still show the question until it reads the answer.
        let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            match client.get_task(&task_id, CALL_TIMEOUT).await {
                Ok(t) if t.state.is_interrupted() => tokio::time::sleep(POLL / 5).await,
                _ => break,
            }
        }
    }
    watch(&client, &task_id, name, &update).await
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

/// Follow the task to its end, committing what it reports; its result, or why it has none.
async fn watch<F, Fut>(
    client: &A2aClient,
    id: &str,
    agent: &str,
    update: &F,
) -> Result<Settled, String>
where
    F: Fn(Value) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut artifacts: Vec<Value> = Vec::new();
    let mut failures = 0u32;
    loop {
        let mut events = match client.watch(id, CALL_TIMEOUT).await {
            Ok(s) => s,
            Err(e) if e.is_task_not_found() => {
                return Err(format!(
                    "the remote agent `{agent}` no longer knows task {id}"
                ));
            }
            Err(e) => {
                failures += 1;
                if failures > 20 {
                    return Err(format!("the remote agent `{agent}` cannot be reached: {e}"));
                }
                tokio::time::sleep(POLL * failures.min(10)).await;
                continue;
            }
        };
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(e) => e,
                Err(RpcError::Transport(_)) => break,
                Err(e) => return Err(format!("the remote agent `{agent}` failed: {e}")),
            };
            failures = 0;
            let (state, message) = match &event {
                RemoteEvent::Task(t) => {
                    artifacts = t.artifacts.iter().flatten().cloned().collect();
                    update(task_json(t)).await?;
                    (Some(t.state), t.message.clone())
                }
                RemoteEvent::Status { state, message } => {
                    update(json!({"taskId": id, "state": state, "message": message})).await?;
                    (Some(*state), message.clone())
                }
                RemoteEvent::Artifact { name, parts } => {
                    artifacts.extend(parts.iter().cloned());
                    update(json!({"taskId": id, "artifact": {"name": name, "parts": parts}}))
                        .await?;
                    (None, None)
                }
                RemoteEvent::Message(text) => {
                    update(json!({"taskId": id, "message": text})).await?;
                    (None, None)
                }
            };
            if let Some(state) = state
                && state == RemoteState::InputRequired
            {
                return Ok(Settled::Asks {
                    task_id: id.to_owned(),
                    question: message.unwrap_or_else(|| "(the remote agent asks for input)".into()),
                });
            }
            if let Some(state) = state
                && (state.is_terminal() || state.is_interrupted())
            {
                return outcome(agent, state, message, &artifacts).map(Settled::Result);
            }
        }
        // The stream ended before the task did: read it as it is, then watch again.
        tokio::time::sleep(POLL).await;
    }
}

/// The tool's result for a settled task.
fn outcome(
    agent: &str,
    state: RemoteState,
    message: Option<String>,
    artifacts: &[Value],
) -> Result<Value, String> {
    let why = message.unwrap_or_else(|| "no reason given".into());
    match state {
        RemoteState::Completed => Ok(match artifacts {
            [] => Value::String(String::new()),
            parts if parts.iter().all(Value::is_string) => Value::String(
                parts
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            parts => Value::Array(parts.to_vec()),
        }),
        RemoteState::InputRequired | RemoteState::AuthRequired => Err(format!(
            "the remote agent `{agent}` needs input this service cannot give it yet: {why}"
        )),
        other => Err(format!(
            "the remote agent `{agent}` ended the task as {}: {why}",
            serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        )),
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
) -> Result<(), String> {
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
        .map_err(|e| format!("the remote task's update could not be committed: {e}"))
}

/// Ask every remote agent still working on a task of this run to cancel it (the run is being
/// cancelled): best effort, each bounded in time. Returns the updates to commit with the
/// cancellation, one per remote task, under its call.
pub(super) async fn cancel_pending(
    journal: &dyn Journal,
    agents: &RemoteAgents,
    run_id: uuid::Uuid,
) -> Vec<NewObservation> {
    let Ok(seen) = journal
        .run_observations(&[
            ObservationType::A2aTaskUpdate,
            ObservationType::ToolExecution,
        ])
        .await
    else {
        return vec![];
    };
    let answered: std::collections::HashSet<&str> = seen
        .iter()
        .filter(|o| o.kind == ObservationType::ToolExecution)
        .filter_map(|o| o.content["toolCallId"].as_str())
        .collect();
    // The first update of each unanswered call names its task, agent and parent.
    let mut pending: Vec<&crate::model::Observation> = Vec::new();
    for o in seen
        .iter()
        .filter(|o| o.kind == ObservationType::A2aTaskUpdate)
    {
        let call = o.content["toolCallId"].as_str().unwrap_or("");
        if answered.contains(call) || pending.iter().any(|p| p.content["toolCallId"] == call) {
            continue;
        }
        if o.content["taskId"].is_string() {
            pending.push(o);
        }
    }
    let mut out = Vec::new();
    for o in pending {
        let (agent, task) = (
            o.content["agent"].as_str().unwrap_or(""),
            o.content["taskId"].as_str().unwrap_or(""),
        );
        let Some(client) = agents.get(agent).and_then(|a| a.client().ok()) else {
            continue;
        };
        let (state, message) = match client.cancel_task(task, Duration::from_secs(5)).await {
            Ok(t) => (json!(t.state), Value::Null),
            Err(e) => (
                Value::Null,
                json!(format!("cancelling the remote task failed: {e}")),
            ),
        };
        out.push(NewObservation::new(
            run_id,
            o.parent_id.clone(),
            ObservationType::A2aTaskUpdate,
            format!("{agent}: cancel requested"),
            json!({"toolCallId": o.content["toolCallId"], "agent": agent, "taskId": task,
                   "state": state, "message": message, "cancelRequested": true}),
        ));
    }
    out
}
