//! Following a recorded remote task to the point where the call settles: its result, a
//! failure, or a question for a person. The update that settles it says how (`settled`), so the
//! call, resumed later, reads the outcome back from the log instead of asking the remote again.
//!
//! What the remote says becomes text in a prompt (the result, a question, why it failed), so it
//! is cut to the client's bound (`PES_A2A_MAX_BYTES`) by the one helper the client has for it
//! ([`bound_text`]); artifact parts past the bound are counted, not kept. A request the client
//! refuses (the SSRF guard, a reply or event past the bound) ends the call at once: retrying
//! would be refused again.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use super::{CALL_TIMEOUT, DelegationError, POLL, task_json};
use crate::a2a::client::net::bound_text;
use crate::a2a::client::rpc::{A2aClient, RemoteEvent, RemoteState, RpcError};

/// A task's artifact parts as they arrive, kept up to a byte bound; the bytes of parts past it
/// are counted (for the truncation marker), not kept.
struct Parts {
    kept: Vec<Value>,
    bytes: usize,
    dropped: usize,
    max: usize,
}

impl Parts {
    fn new(max: usize) -> Self {
        Self {
            kept: Vec::new(),
            bytes: 0,
            dropped: 0,
            max,
        }
    }

    /// Start again from a snapshot of the whole task.
    fn clear(&mut self) {
        (self.kept, self.bytes, self.dropped) = (Vec::new(), 0, 0);
    }

    /// Keep `parts` in order while they fit; the text part that passes the bound keeps what
    /// fits of it, and nothing after it is kept (a result never skips a middle part). Sizes are
    /// those of the joined text (a line break before every part but the first), so the count
    /// in the marker is exact for text.
    fn extend<'p>(&mut self, parts: impl IntoIterator<Item = &'p Value>) {
        for p in parts {
            let sep = usize::from(!self.kept.is_empty() || self.dropped > 0);
            let len = match p {
                Value::String(s) => s.len(),
                other => other.to_string().len(),
            };
            let room = self.max - self.bytes;
            if self.dropped == 0 && sep + len <= room {
                self.kept.push(p.clone());
                self.bytes += sep + len;
                continue;
            }
            match p {
                Value::String(s) if self.dropped == 0 && room > sep => {
                    let mut keep = room - sep;
                    while !s.is_char_boundary(keep) {
                        keep -= 1;
                    }
                    self.kept.push(Value::String(s[..keep].to_owned()));
                    self.bytes += sep + keep;
                    self.dropped += len - keep;
                }
                _ => self.dropped += sep + len,
            }
        }
    }
}

/// How a remote task settled.
pub(super) enum Settled {
    /// Completed: its result.
    Result(Value),
    /// It asks its caller.
    Asks { task_id: String, question: String },
}

/// How a settled task is recorded: `{result}`, `{error}` or `{question}`.
pub(super) fn settled_json(s: &Result<Settled, DelegationError>) -> Value {
    match s {
        Ok(Settled::Result(v)) => json!({"result": v}),
        Ok(Settled::Asks { question, .. }) => json!({"question": question}),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// How a call settled, from what its update recorded (`settled_json`).
///
/// # Errors
/// It settled with an error: the text it was recorded with.
pub(super) fn read_settled(v: &Value, task_id: &str) -> Result<Settled, DelegationError> {
    if let Some(q) = v["question"].as_str() {
        return Ok(Settled::Asks {
            task_id: task_id.to_owned(),
            question: q.to_owned(),
        });
    }
    if let Some(e) = v["error"].as_str() {
        return Err(DelegationError::Recorded(e.to_owned()));
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
) -> Result<Settled, DelegationError>
where
    F: Fn(Value) -> Fut,
    Fut: std::future::Future<Output = Result<(), DelegationError>>,
{
    let give_up = |e: DelegationError| async move {
        let settled = Err(e);
        update(json!({"taskId": id, "settled": settled_json(&settled)})).await?;
        settled
    };
    let max = client.max_bytes();
    let mut artifacts = Parts::new(max);
    // Since when the remote cannot be reached (reset by any event it sends).
    let mut down_since: Option<tokio::time::Instant> = None;
    let mut failures = 0u32;
    loop {
        let mut events = match client.watch(id, CALL_TIMEOUT).await {
            Ok(s) => s,
            Err(e) if e.is_task_not_found() => {
                return give_up(DelegationError::TaskUnknown {
                    agent: agent.to_owned(),
                    task: id.to_owned(),
                })
                .await;
            }
            Err(source) if source.is_refused() => {
                return give_up(DelegationError::Remote {
                    agent: agent.to_owned(),
                    source,
                })
                .await;
            }
            Err(source) => {
                failures += 1;
                let since = *down_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= give_up_after {
                    return give_up(DelegationError::Unreachable {
                        agent: agent.to_owned(),
                        secs: since.elapsed().as_secs(),
                        source,
                    })
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
                Err(source) => {
                    return give_up(DelegationError::Remote {
                        agent: agent.to_owned(),
                        source,
                    })
                    .await;
                }
            };
            failures = 0;
            down_since = None;
            let (mut content, state, message) = match &event {
                RemoteEvent::Task(t) => {
                    artifacts.clear();
                    artifacts.extend(t.artifacts.iter().flatten());
                    (task_json(t), Some(t.state), t.message.clone())
                }
                RemoteEvent::Status { state, message } => (
                    json!({"taskId": id, "state": state, "message": message}),
                    Some(*state),
                    message.clone(),
                ),
                RemoteEvent::Artifact { name, parts } => {
                    artifacts.extend(parts);
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
                    question: message.map_or_else(
                        || "(the remote agent asks for input)".into(),
                        |q| bound_text(&q, max, 0),
                    ),
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

/// The tool's result for a settled task: the artifacts' text (data parts as JSON when there are
/// any), or why there is none; the remote's text cut to the bound.
fn outcome(
    agent: &str,
    state: RemoteState,
    message: Option<String>,
    artifacts: &Parts,
) -> Result<Value, DelegationError> {
    let why = message.map_or_else(
        || "no reason given".into(),
        |m| bound_text(&m, artifacts.max, 0),
    );
    match state {
        RemoteState::Completed => Ok(match artifacts.kept.as_slice() {
            [] if artifacts.dropped == 0 => Value::String(String::new()),
            parts if parts.iter().all(Value::is_string) => Value::String(bound_text(
                &parts
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("\n"),
                artifacts.max,
                artifacts.dropped,
            )),
            parts => {
                let all = Value::Array(parts.to_vec());
                let text = all.to_string();
                if artifacts.dropped == 0 && text.len() <= artifacts.max {
                    all
                } else {
                    Value::String(bound_text(&text, artifacts.max, artifacts.dropped))
                }
            }
        }),
        RemoteState::InputRequired | RemoteState::AuthRequired => {
            Err(DelegationError::NeedsInput {
                agent: agent.to_owned(),
                why,
            })
        }
        other => Err(DelegationError::Ended {
            agent: agent.to_owned(),
            state: serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            why,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_past_the_bound_is_cut_once_with_the_count() {
        let mut parts = Parts::new(1024);
        let big = "x".repeat(700);
        parts.extend([&json!(big), &json!(big), &json!("tail")]);
        assert_eq!(
            (parts.kept.len(), parts.bytes, parts.dropped),
            (2, 1024, 382),
            "what fits of the second part, nothing after it"
        );
        let Ok(Value::String(text)) = outcome("a", RemoteState::Completed, None, &parts) else {
            panic!()
        };
        assert!(text.len() <= 1024, "{}", text.len());
        // 700 + 1 + 700 + 1 + 4 bytes in all, 960 of them kept.
        assert!(
            text.ends_with("…[truncated: 446 bytes cut]"),
            "the parts left out are counted: {text}"
        );
        assert!(!text.contains("tail"));
        let mut small = Parts::new(1024);
        small.extend([&json!("a"), &json!("b")]);
        assert_eq!(
            outcome("a", RemoteState::Completed, None, &small).ok(),
            Some(json!("a\nb"))
        );
        let mut data = Parts::new(1024);
        data.extend([&json!({"k": "x".repeat(2000)})]);
        let Ok(Value::String(text)) = outcome("a", RemoteState::Completed, None, &data) else {
            panic!("data past the bound is cut as its JSON text")
        };
        assert!(text.contains("bytes cut]"), "{text}");
        let failed = outcome(
            "a",
            RemoteState::Failed,
            Some("y".repeat(5000)),
            &Parts::new(1024),
        )
        .unwrap_err()
        .to_string();
        assert!(
            failed.len() < 1200 && failed.contains("bytes cut]"),
            "{failed}"
        );
    }
}
