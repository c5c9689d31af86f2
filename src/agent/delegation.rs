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
//! worker slot back ([`super::RunEnd::WaitingRemote`]): [`Engine::watch_remote`] follows the
//! recorded tasks with the same code, until one settles.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::{Value, json};

use super::Engine;
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

/// The items of a run whose delegation has recorded its remote task and now only waits on it:
/// the scheduler may park the run when every item in flight is one of these.
#[derive(Default)]
pub(super) struct Watching {
    items: Mutex<HashSet<String>>,
    /// Poked when an item starts waiting, so the scheduler looks again.
    pub changed: tokio::sync::Notify,
}

impl Watching {
    fn insert(&self, item: &str) {
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
    /// How the task settled, when that came after the last answer forwarded to it.
    settled: Option<Value>,
}

async fn recorded(d: &Delegation<'_>, call: &ToolCallRecord) -> Result<Recorded, String> {
    let seen = d
        .journal
        .run_observations(&[ObservationType::ToolCall, ObservationType::A2aTaskUpdate])
        .await
        .map_err(|e| format!("its records could not be read: {e}"))?;
    let mine = |o: &&crate::model::Observation| o.content["toolCallId"] == call.id.as_str();
    let mut settled = None;
    for o in seen.iter().filter(mine) {
        if o.content["forwarded"].is_string() {
            settled = None;
        }
        if o.content["settled"].is_object() {
            settled = Some(o.content["settled"].clone());
        }
    }
    Ok(Recorded {
        settled,
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
                let declined = Err(format!(
                    "a person declined to answer the remote agent `{name}`: {}",
                    decline_reason(s)
                ));
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
            .map_err(|e| format!("the answer could not be sent to `{name}`: {e}"))?;
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

/// How a settled task is recorded: `{result}`, `{error}` or `{question}`.
fn settled_json(s: &Result<Settled, String>) -> Value {
    match s {
        Ok(Settled::Result(v)) => json!({"result": v}),
        Ok(Settled::Asks { question, .. }) => json!({"question": question}),
        Err(e) => json!({"error": e}),
    }
}

fn read_settled(v: &Value, task_id: &str) -> Result<Settled, String> {
    if let Some(q) = v["question"].as_str() {
        return Ok(Settled::Asks {
            task_id: task_id.to_owned(),
            question: q.to_owned(),
        });
    }
    if let Some(e) = v["error"].as_str() {
        return Err(e.to_owned());
    }
    Ok(Settled::Result(v["result"].clone()))
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

/// Follow the task to its end, committing what it reports; its result, or why it has none. The
/// update that settles the call carries how (`settled`), and so does giving up on the remote.
async fn watch<F, Fut>(
    client: &A2aClient,
    id: &str,
    agent: &str,
    give_up_after: Duration,
    update: &F,
) -> Result<Settled, String>
where
    F: Fn(Value) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let give_up = |e: String| async move {
        let settled = Err(e);
        update(json!({"taskId": id, "settled": settled_json(&settled)})).await?;
        settled
    };
    let mut artifacts: Vec<Value> = Vec::new();
    // Since when the remote cannot be reached (reset by any event it sends).
    let mut down_since: Option<tokio::time::Instant> = None;
    let mut failures = 0u32;
    loop {
        let mut events = match client.watch(id, CALL_TIMEOUT).await {
            Ok(s) => s,
            Err(e) if e.is_task_not_found() => {
                return give_up(format!(
                    "the remote agent `{agent}` no longer knows task {id}"
                ))
                .await;
            }
            Err(e) => {
                failures += 1;
                let since = *down_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= give_up_after {
                    return give_up(format!(
                        "the remote agent `{agent}` cannot be reached (for {} s): {e}",
                        since.elapsed().as_secs()
                    ))
                    .await;
                }
                tokio::time::sleep((POLL * failures.min(10)).min(give_up_after / 4)).await;
                continue;
            }
        };
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(e) => e,
                Err(RpcError::Transport(_)) => break,
                Err(e) => return give_up(format!("the remote agent `{agent}` failed: {e}")).await,
            };
            failures = 0;
            down_since = None;
            let (mut content, state, message) = match &event {
                RemoteEvent::Task(t) => {
                    artifacts = t.artifacts.iter().flatten().cloned().collect();
                    (task_json(t), Some(t.state), t.message.clone())
                }
                RemoteEvent::Status { state, message } => (
                    json!({"taskId": id, "state": state, "message": message}),
                    Some(*state),
                    message.clone(),
                ),
                RemoteEvent::Artifact { name, parts } => {
                    artifacts.extend(parts.iter().cloned());
                    (
                        json!({"taskId": id, "artifact": {"name": name, "parts": parts}}),
                        None,
                        None,
                    )
                }
                RemoteEvent::Message(text) => (json!({"taskId": id, "message": text}), None, None),
            };
            let settled = match state {
                Some(RemoteState::InputRequired) => Some(Ok(Settled::Asks {
                    task_id: id.to_owned(),
                    question: message.unwrap_or_else(|| "(the remote agent asks for input)".into()),
                })),
                Some(s) if s.is_terminal() || s.is_interrupted() => {
                    Some(outcome(agent, s, message, &artifacts).map(Settled::Result))
                }
                _ => None,
            };
            if let Some(s) = &settled {
                content["settled"] = settled_json(s);
            }
            update(content).await?;
            if let Some(s) = settled {
                return s;
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
async fn unanswered(journal: &dyn Journal) -> Result<Vec<Unanswered>, super::EngineError> {
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
    /// Follow the remote tasks a parked run waits on ([`super::RunEnd::WaitingRemote`]), with the
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
    ) -> Result<(), super::EngineError> {
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
pub(super) async fn cancel_pending(
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
