//! Following a recorded remote task to the point where the call settles: its result, a
//! failure, or a question for a person. The update that settles it says how (`settled`), so the
//! call, resumed later, reads the outcome back from the log instead of asking the remote again.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use super::{CALL_TIMEOUT, POLL, task_json};
use crate::a2a::client::rpc::{A2aClient, RemoteEvent, RemoteState, RpcError};

/// How a remote task settled.
pub(super) enum Settled {
    /// Completed: its result.
    Result(Value),
    /// It asks its caller.
    Asks { task_id: String, question: String },
}

/// How a settled task is recorded: `{result}`, `{error}` or `{question}`.
pub(super) fn settled_json(s: &Result<Settled, String>) -> Value {
    match s {
        Ok(Settled::Result(v)) => json!({"result": v}),
        Ok(Settled::Asks { question, .. }) => json!({"question": question}),
        Err(e) => json!({"error": e}),
    }
}

pub(super) fn read_settled(v: &Value, task_id: &str) -> Result<Settled, String> {
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

/// Follow the task to its end, committing what it reports; its result, or why it has none. The
/// update that settles the call carries how (`settled`), and so does giving up on the remote.
pub(super) async fn watch<F, Fut>(
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
