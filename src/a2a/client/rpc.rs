//! Talking to one remote agent over A2A JSON-RPC, in the protocol generation its card declares:
//! v1.0 (`SendMessage`, `GetTask`, … with `A2A-Version: 1.0`; states `TASK_STATE_WORKING`, parts
//! `{text}`, events `{statusUpdate}`/`{artifactUpdate}`/`{task}`) or v0.3 (`message/send`,
//! `tasks/get`, …; states `working`, parts `{kind: "text", text}`, events with a `kind`). Answers
//! are read with the protocol's own types (`crate::a2a::types`, either generation) into the
//! shape delegation needs ([`RemoteTask`], [`RemoteEvent`]).
//!
//! Requests go through [`Reach`] (the SSRF guard for endpoints the operator did not configure,
//! the agent's headers only to the ones it did, no redirect followed); a reply and each stream
//! event are read up to `PES_A2A_MAX_BYTES` and refused past it ([`RpcError::Refused`]).
//!
//! A stream ends when the remote closes it; its end is judged by state (terminal or
//! `input-required`), never by a `final` flag (v1.0 has none, and v0.3 sets it false on
//! `input-required` although the stream closes).

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

use super::card::{Protocol, RemoteCard};
use super::net::{NetError, Reach, too_large};
use crate::a2a::types::{Message, Part, PartContent, StreamResponse, Task, TaskState};

/// Where a remote task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RemoteState {
    Submitted,
    Working,
    InputRequired,
    AuthRequired,
    Completed,
    Canceled,
    Failed,
    Rejected,
    Unknown,
}

impl RemoteState {
    /// The task will change no more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Canceled | Self::Failed | Self::Rejected
        )
    }

    /// The remote waits for its caller: a stream of it ends here.
    pub fn is_interrupted(self) -> bool {
        matches!(self, Self::InputRequired | Self::AuthRequired)
    }
}

/// A remote task, read from either generation.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteTask {
    pub id: String,
    pub context_id: String,
    pub state: RemoteState,
    /// The text of the status message (the question of `input-required`, why it failed).
    pub message: Option<String>,
    /// Each artifact's parts: text parts as strings, data parts as their JSON.
    pub artifacts: Vec<Vec<Value>>,
}

/// One event of a task's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum RemoteEvent {
    /// A snapshot of the whole task (first on a subscription).
    Task(RemoteTask),
    /// A new status.
    Status {
        state: RemoteState,
        message: Option<String>,
    },
    /// An artifact (or a chunk of one), with its parts.
    Artifact {
        name: Option<String>,
        parts: Vec<Value>,
    },
    /// A plain message from the agent (a task-less answer).
    Message(Option<String>),
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RpcError {
    /// The remote answered with a JSON-RPC error.
    #[error("the remote agent answered error {code}: {message}")]
    Remote { code: i64, message: String },
    /// No usable answer: unreachable, an HTTP error, or a reply that is not JSON-RPC.
    #[error("{0}")]
    Transport(String),
    /// Refused on our side, so trying again gives the same: an endpoint or redirect the SSRF
    /// guard refuses, or a reply or stream event larger than `PES_A2A_MAX_BYTES`.
    #[error("{0}")]
    Refused(String),
}

impl RpcError {
    /// The remote does not know the task (-32001).
    pub fn is_task_not_found(&self) -> bool {
        matches!(self, Self::Remote { code: -32001, .. })
    }

    /// Refused on our side: not worth retrying.
    pub fn is_refused(&self) -> bool {
        matches!(self, Self::Refused(_))
    }

    /// A [`NetError`] of `method`'s request, named.
    fn of(method: &str, e: NetError) -> Self {
        match e {
            NetError::Refused(m) => Self::Refused(format!("{method}: {m}")),
            NetError::Transport(m) => Self::Transport(format!("{method}: {m}")),
        }
    }
}

/// A JSON-RPC client of one remote agent.
#[derive(Clone)]
pub struct A2aClient {
    reach: Reach,
    endpoint: String,
    protocol: Protocol,
}

impl A2aClient {
    /// A client of the agent `card` describes, reached as `reach` allows (the agent's headers
    /// only to its configured origins; any other endpoint through the SSRF guard).
    pub fn new(reach: Reach, card: &RemoteCard) -> Self {
        Self {
            reach,
            endpoint: card.endpoint.clone(),
            protocol: card.protocol,
        }
    }

    /// The most bytes read of a reply or a stream event; remote text for a prompt is cut to it.
    pub fn max_bytes(&self) -> usize {
        self.reach.max_bytes()
    }

    /// The protocol's own headers, sent to every endpoint.
    fn protocol_headers(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        if self.protocol == Protocol::V1 {
            map.insert("a2a-version", HeaderValue::from_static("1.0"));
        }
        map
    }

    fn method(&self, v1: &'static str, v03: &'static str) -> &'static str {
        match self.protocol {
            Protocol::V1 => v1,
            Protocol::V03 => v03,
        }
    }

    fn envelope(&self, method: &str, params: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": uuid::Uuid::now_v7().to_string(), "method": method, "params": params})
    }

    async fn call(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, RpcError> {
        let resp = self
            .reach
            .post(
                &self.endpoint,
                &self.protocol_headers(),
                &self.envelope(method, params),
                Some(timeout),
            )
            .await
            .map_err(|e| RpcError::of(method, e))?;
        let status = resp.status();
        let body = self
            .reach
            .read_body(resp, "the reply")
            .await
            .map_err(|e| RpcError::of(method, e))?;
        let body: Value = serde_json::from_slice(&body).map_err(|e| {
            RpcError::Transport(format!(
                "{method}: HTTP {status}, not a JSON-RPC answer: {e}"
            ))
        })?;
        result_of(body)
    }

    /// The message of a send: text from the user, in an existing task or context when given.
    fn message(
        &self,
        text: &str,
        message_id: &str,
        context_id: Option<&str>,
        task_id: Option<&str>,
    ) -> Value {
        let mut m = match self.protocol {
            Protocol::V1 => {
                json!({"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]})
            }
            Protocol::V03 => json!({"kind": "message", "messageId": message_id, "role": "user",
                                    "parts": [{"kind": "text", "text": text}]}),
        };
        if let Some(c) = context_id {
            m["contextId"] = json!(c);
        }
        if let Some(t) = task_id {
            m["taskId"] = json!(t);
        }
        m
    }

    /// Send a message and return at once with the task it made (or continued): the caller
    /// records the task before it waits for it.
    ///
    /// # Errors
    /// [`RpcError`]; a task-less answer is a transport error (delegation needs a task).
    pub async fn send_message(
        &self,
        text: &str,
        message_id: &str,
        context_id: Option<&str>,
        task_id: Option<&str>,
        timeout: Duration,
    ) -> Result<RemoteTask, RpcError> {
        let configuration = match self.protocol {
            Protocol::V1 => json!({"returnImmediately": true}),
            Protocol::V03 => json!({"blocking": false}),
        };
        let params = json!({"message": self.message(text, message_id, context_id, task_id),
                            "configuration": configuration});
        let result = self
            .call(self.method("SendMessage", "message/send"), params, timeout)
            .await?;
        match event_of(&result) {
            Some(RemoteEvent::Task(t)) => Ok(t),
            _ => Err(RpcError::Transport(format!(
                "the remote agent answered without a task: {}",
                crate::llm::truncate(&result.to_string(), 300)
            ))),
        }
    }

    /// The task now.
    ///
    /// # Errors
    /// [`RpcError`] (`is_task_not_found` when the remote forgot it).
    pub async fn get_task(&self, id: &str, timeout: Duration) -> Result<RemoteTask, RpcError> {
        let result = self
            .call(
                self.method("GetTask", "tasks/get"),
                json!({"id": id}),
                timeout,
            )
            .await?;
        task_of(&result)
            .ok_or_else(|| RpcError::Transport("GetTask answered without a task".into()))
    }

    /// Ask the remote to cancel the task.
    ///
    /// # Errors
    /// [`RpcError`] (a finished task is not cancelable).
    pub async fn cancel_task(&self, id: &str, timeout: Duration) -> Result<RemoteTask, RpcError> {
        let result = self
            .call(
                self.method("CancelTask", "tasks/cancel"),
                json!({"id": id}),
                timeout,
            )
            .await?;
        task_of(&result)
            .ok_or_else(|| RpcError::Transport("CancelTask answered without a task".into()))
    }

    /// The tasks of a context (v1.0 only: `None` from a v0.3 agent, which cannot list).
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn tasks_of_context(
        &self,
        context_id: &str,
        timeout: Duration,
    ) -> Result<Option<Vec<RemoteTask>>, RpcError> {
        if self.protocol == Protocol::V03 {
            return Ok(None);
        }
        let result = self
            .call("ListTasks", json!({"contextId": context_id}), timeout)
            .await?;
        Ok(Some(
            result["tasks"]
                .as_array()
                .map(|a| a.iter().filter_map(task_of).collect())
                .unwrap_or_default(),
        ))
    }

    /// The task's events from now on (a snapshot first), until the remote closes the stream.
    ///
    /// # Errors
    /// [`RpcError`] when the subscription is refused.
    pub async fn subscribe(
        &self,
        id: &str,
    ) -> Result<BoxStream<'static, Result<RemoteEvent, RpcError>>, RpcError> {
        let method = self.method("SubscribeToTask", "tasks/resubscribe");
        let mut headers = self.protocol_headers();
        headers.insert(
            reqwest::header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        let resp = self
            .reach
            .post(
                &self.endpoint,
                &headers,
                &self.envelope(method, json!({"id": id})),
                None,
            )
            .await
            .map_err(|e| RpcError::of(method, e))?;
        let is_sse = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_sse {
            // A refusal comes back as one JSON-RPC error.
            let body = self
                .reach
                .read_body(resp, "the reply")
                .await
                .map_err(|e| RpcError::of(method, e))?;
            let body: Value = serde_json::from_slice(&body)
                .map_err(|e| RpcError::Transport(format!("{method}: not a stream: {e}")))?;
            result_of(body)?;
            return Err(RpcError::Transport(format!("{method}: not a stream")));
        }
        Ok(sse_events(resp, self.reach.max_bytes()))
    }
}

impl A2aClient {
    /// The task's events until the remote closes the stream: a subscription, or, when the
    /// remote refuses one (a task already finished refuses it, -32004), the task as it is now.
    ///
    /// # Errors
    /// [`RpcError`] when neither works (`is_task_not_found` when the remote forgot the task).
    pub async fn watch(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<BoxStream<'static, Result<RemoteEvent, RpcError>>, RpcError> {
        // The refusal comes as a JSON-RPC error answer, or (v0.3) as the stream's first event.
        match self.subscribe(id).await {
            Ok(mut stream) => match stream.next().await {
                Some(Err(RpcError::Remote { .. })) => {}
                Some(first) => return Ok(futures::stream::iter([first]).chain(stream).boxed()),
                None => return Ok(futures::stream::empty().boxed()),
            },
            Err(RpcError::Remote { .. }) => {}
            Err(e) => return Err(e),
        }
        let task = self.get_task(id, timeout).await?;
        Ok(futures::stream::iter([Ok(RemoteEvent::Task(task))]).boxed())
    }
}

/// The `result` of a JSON-RPC answer, or its error.
fn result_of(body: Value) -> Result<Value, RpcError> {
    if let Some(e) = body.get("error").filter(|e| !e.is_null()) {
        return Err(RpcError::Remote {
            code: e["code"].as_i64().unwrap_or(0),
            message: e["message"].as_str().unwrap_or("").to_owned(),
        });
    }
    body.get("result")
        .cloned()
        .ok_or_else(|| RpcError::Transport("a JSON-RPC answer without result or error".into()))
}

/// The parts of a message or artifact: text as strings, data as JSON, files by their URL or as
/// a note of their size.
fn parts_of(parts: &[Part]) -> Vec<Value> {
    parts
        .iter()
        .map(|p| match &p.content {
            PartContent::Text(t) => Value::String(t.clone()),
            PartContent::Data(v) => v.clone(),
            PartContent::Url(u) => json!({"url": u}),
            PartContent::Raw(b) => {
                json!({"bytes": format!("{} base64 characters not shown", b.len())})
            }
        })
        .collect()
}

/// The text of a status message.
fn message_text(message: Option<&Message>) -> Option<String> {
    let texts: Vec<String> = parts_of(&message?.parts)
        .into_iter()
        .map(|p| match p {
            Value::String(s) => s,
            other => other.to_string(),
        })
        .collect();
    (!texts.is_empty()).then(|| texts.join("\n"))
}

fn remote_state(s: TaskState) -> RemoteState {
    match s {
        TaskState::Submitted => RemoteState::Submitted,
        TaskState::Working => RemoteState::Working,
        TaskState::InputRequired => RemoteState::InputRequired,
        TaskState::AuthRequired => RemoteState::AuthRequired,
        TaskState::Completed => RemoteState::Completed,
        TaskState::Canceled => RemoteState::Canceled,
        TaskState::Failed => RemoteState::Failed,
        TaskState::Rejected => RemoteState::Rejected,
        TaskState::Unspecified => RemoteState::Unknown,
    }
}

fn remote_task(t: Task) -> RemoteTask {
    RemoteTask {
        state: remote_state(t.status.state),
        message: message_text(t.status.message.as_ref()),
        artifacts: t
            .artifacts
            .unwrap_or_default()
            .iter()
            .map(|a| parts_of(&a.parts))
            .collect(),
        id: t.id,
        context_id: t.context_id,
    }
}

/// A task object of either generation (bare, or under `task`).
fn task_of(v: &Value) -> Option<RemoteTask> {
    match event_of(v)? {
        RemoteEvent::Task(t) => Some(t),
        _ => None,
    }
}

/// One event (a send's result, or a stream's), of either generation, read with the protocol's
/// own types.
pub(crate) fn event_of(v: &Value) -> Option<RemoteEvent> {
    Some(match StreamResponse::from_wire(v).ok()? {
        StreamResponse::Task(t) => RemoteEvent::Task(remote_task(t)),
        StreamResponse::StatusUpdate(e) => RemoteEvent::Status {
            state: remote_state(e.status.state),
            message: message_text(e.status.message.as_ref()),
        },
        StreamResponse::ArtifactUpdate(e) => RemoteEvent::Artifact {
            name: e.artifact.name.clone(),
            parts: parts_of(&e.artifact.parts),
        },
        StreamResponse::Message(m) => RemoteEvent::Message(message_text(Some(&m))),
    })
}

/// Server-sent events read from bytes as they come, each event's data bounded: complete lines are
/// taken from the buffer as soon as they end, a `data:` line is added to the event being built,
/// and a blank line ends the event. Neither an event's data nor a line still being received may
/// pass `max` bytes, so what is held stays within about `max` plus one network chunk.
struct SseParser {
    buf: Vec<u8>,
    data: String,
    has_data: bool,
    max: usize,
}

impl SseParser {
    fn new(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            data: String::new(),
            has_data: false,
            max,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The data of the next complete event in what was pushed (`None`: more bytes are needed).
    ///
    /// # Errors
    /// The event (or a line of it) is larger than `max`: the stream cannot go on.
    fn next_event(&mut self) -> Option<Result<String, NetError>> {
        while let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=nl).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.is_empty() {
                if self.has_data {
                    self.has_data = false;
                    return Some(Ok(std::mem::take(&mut self.data)));
                }
                continue;
            }
            // Other fields (`event:`, `id:`, `retry:`) and comments carry nothing we read.
            let Some(value) = line.strip_prefix(b"data:") else {
                continue;
            };
            let value = value.strip_prefix(b" ").unwrap_or(value);
            let sep = usize::from(self.has_data);
            if self.data.len() + sep + value.len() > self.max {
                return Some(Err(too_large("a stream event", self.max)));
            }
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(&String::from_utf8_lossy(value));
            self.has_data = true;
        }
        if self.buf.len() > self.max {
            return Some(Err(too_large("a stream event", self.max)));
        }
        None
    }
}

/// The events of a JSON-RPC SSE response: each event's data is one JSON-RPC answer, at most
/// `max` bytes. An event past it ends the stream with a [`RpcError::Refused`].
fn sse_events(
    resp: reqwest::Response,
    max: usize,
) -> BoxStream<'static, Result<RemoteEvent, RpcError>> {
    futures::stream::unfold(
        (Some(resp), SseParser::new(max)),
        |(mut resp, mut parser)| async move {
            loop {
                match parser.next_event() {
                    Some(Ok(data)) => {
                        let item = serde_json::from_str::<Value>(&data)
                            .map_err(|e| {
                                RpcError::Transport(format!("a stream event that is not JSON: {e}"))
                            })
                            .and_then(result_of)
                            .and_then(|r| {
                                event_of(&r).ok_or_else(|| {
                                    RpcError::Transport(format!(
                                        "an event of no known kind: {}",
                                        crate::llm::truncate(&r.to_string(), 200)
                                    ))
                                })
                            });
                        return Some((item, (resp, parser)));
                    }
                    // Nothing after an error: no connection, nothing buffered.
                    Some(Err(e)) => {
                        return Some((
                            Err(RpcError::of("the stream", e)),
                            (None, SseParser::new(0)),
                        ));
                    }
                    None => {}
                }
                match resp.as_mut()?.chunk().await {
                    Ok(Some(chunk)) => parser.push(&chunk),
                    Ok(None) => return None,
                    Err(e) => {
                        return Some((
                            Err(RpcError::Transport(format!("the stream broke: {e}"))),
                            (None, SseParser::new(0)),
                        ));
                    }
                }
            }
        },
    )
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_of_both_generations_read_alike() {
        let v1 = json!({"statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_INPUT_REQUIRED",
            "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "What is your name?"}]}}}});
        let v03 = json!({"kind": "status-update", "taskId": "t", "contextId": "c", "final": false, "status": {"state": "input-required",
            "message": {"kind": "message", "messageId": "m", "role": "agent", "parts": [{"kind": "text", "text": "What is your name?"}]}}});
        for e in [v1, v03] {
            assert_eq!(
                event_of(&e),
                Some(RemoteEvent::Status {
                    state: RemoteState::InputRequired,
                    message: Some("What is your name?".into())
                })
            );
        }
        let art = json!({"artifactUpdate": {"taskId": "t", "contextId": "c", "artifact": {"artifactId": "a", "name": "echo", "parts": [{"text": "echo: hi"}, {"data": {"a": 1}}]}}});
        assert_eq!(
            event_of(&art),
            Some(RemoteEvent::Artifact {
                name: Some("echo".into()),
                parts: vec![json!("echo: hi"), json!({"a": 1})]
            })
        );
        let task = json!({"task": {"id": "t1", "contextId": "c", "status": {"state": "TASK_STATE_SUBMITTED"}}});
        let Some(RemoteEvent::Task(t)) = event_of(&task) else {
            panic!()
        };
        assert_eq!((t.id.as_str(), t.state), ("t1", RemoteState::Submitted));
        let old = json!({"kind": "task", "id": "t2", "contextId": "c", "status": {"state": "completed"},
                         "artifacts": [{"artifactId": "a", "parts": [{"kind": "text", "text": "done"}]}]});
        let Some(RemoteEvent::Task(t)) = event_of(&old) else {
            panic!()
        };
        assert_eq!(
            (t.state, t.artifacts.clone()),
            (RemoteState::Completed, vec![vec![json!("done")]])
        );
        assert!(RemoteState::Canceled.is_terminal() && RemoteState::InputRequired.is_interrupted());
        assert!(
            result_of(json!({"error": {"code": -32001, "message": "Task not found"}}))
                .unwrap_err()
                .is_task_not_found()
        );
    }

    #[test]
    fn stream_events_are_read_across_chunks_and_bounded_each() {
        let mut p = SseParser::new(1024);
        p.push(b": keep-alive\r\n\r\nevent: x\r\ndata: {\"a\":");
        assert!(p.next_event().is_none(), "the event is not complete yet");
        p.push(b"1}\r\ndata: 2\r\n\r\ndata: \xc3");
        assert_eq!(p.next_event().unwrap().unwrap(), "{\"a\":1}\n2");
        assert!(p.next_event().is_none());
        p.push(b"\xa9\n\n");
        assert_eq!(
            p.next_event().unwrap().unwrap(),
            "é",
            "a character split between chunks"
        );

        // An event's data lines add up past the bound.
        let mut p = SseParser::new(1024);
        let line = format!("data: {}\n", "x".repeat(600));
        p.push(line.as_bytes());
        assert!(p.next_event().is_none());
        p.push(line.as_bytes());
        let err = p.next_event().unwrap().unwrap_err().to_string();
        assert!(
            err.contains("larger than 1024 bytes (PES_A2A_MAX_BYTES)"),
            "{err}"
        );

        // A line that never ends is refused once it passes the bound, not held.
        let mut p = SseParser::new(1024);
        p.push(format!("data: {}", "y".repeat(1100)).as_bytes());
        assert!(p.next_event().unwrap().is_err());
    }
}
