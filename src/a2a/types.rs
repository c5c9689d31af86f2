//! The A2A protocol's data types, as this service speaks them: protocol v1.0 on the wire by
//! default (ProtoJSON: camelCase fields, `TASK_STATE_WORKING`, `ROLE_USER`, parts told apart by
//! which field they carry, stream events wrapped as `{"statusUpdate": …}`), v0.3 on request
//! ([`Version::V03`]: `working`, `user`, parts and events told apart by `kind`, `final` on status
//! updates). Reading is lenient: every type here parses the spellings of both versions, so the
//! A2A client (ours, talking to remote agents of either version) reuses them as they are.
//!
//! Why our own serde types rather than a crate: the a2aproject's `a2a-lf` 0.4 is lean (its few
//! dependencies are already in our tree) and maintained, but it models v1.0 only, so the v0.3
//! method names we must also serve (and the v0.3 agents our client must talk to) would need a
//! second set of types anyway, and it has no OpenAPI schemas; `a2a-rs` (another author) pulls its
//! own HTTP stack and needs a newer compiler than ours. The part of the protocol we use is a few
//! hundred lines, written once here for both versions.

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value, json};

/// The `A2A-Version` header (the spec's service parameter, case-insensitive).
pub const VERSION_HEADER: &str = "A2A-Version";

/// Protocol versions we speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// v0.3: slash method names (`message/send`), kebab-case states, `kind` discriminators.
    V03,
    /// v1.0: PascalCase method names (`SendMessage`), ProtoJSON enums, wrapped stream events.
    V1,
}

impl Version {
    /// `Major.Minor`, as in an agent card's `protocolVersion` and the `A2A-Version` header.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V03 => "0.3",
            Self::V1 => "1.0",
        }
    }

    /// The version a header or card value names (`0.3`, `0.3.0`, `1.0`, `1.0.1`…); `None` for one
    /// we do not speak. Patch numbers do not count (spec §3.6).
    pub fn parse(raw: &str) -> Option<Self> {
        let mut parts = raw.trim().split('.');
        let major = parts.next()?.parse::<u32>().ok()?;
        let minor = parts.next().map_or(Some(0), |m| m.parse::<u32>().ok())?;
        match (major, minor) {
            (0, 3) => Some(Self::V03),
            (1, 0) => Some(Self::V1),
            _ => None,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who sent a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Agent,
}

impl Role {
    fn wire(self, v: Version) -> &'static str {
        match (self, v) {
            (Self::User, Version::V1) => "ROLE_USER",
            (Self::Agent, Version::V1) => "ROLE_AGENT",
            (Self::User, Version::V03) => "user",
            (Self::Agent, Version::V03) => "agent",
        }
    }
}

impl Serialize for Role {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.wire(Version::V1))
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match String::deserialize(d)?.as_str() {
            "ROLE_USER" | "user" => Ok(Self::User),
            "ROLE_AGENT" | "agent" => Ok(Self::Agent),
            other => Err(D::Error::custom(format!(
                "unknown role `{other}` (ROLE_USER or ROLE_AGENT)"
            ))),
        }
    }
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    Submitted,
    Working,
    InputRequired,
    Completed,
    Canceled,
    Failed,
    Rejected,
    AuthRequired,
    /// v1.0 `TASK_STATE_UNSPECIFIED`, v0.3 `unknown`.
    Unspecified,
}

impl TaskState {
    /// Every state, for parsing and tests.
    pub const ALL: [TaskState; 9] = [
        Self::Submitted,
        Self::Working,
        Self::InputRequired,
        Self::Completed,
        Self::Canceled,
        Self::Failed,
        Self::Rejected,
        Self::AuthRequired,
        Self::Unspecified,
    ];

    /// The spelling of `v`.
    pub fn wire(self, v: Version) -> &'static str {
        match v {
            Version::V1 => match self {
                Self::Submitted => "TASK_STATE_SUBMITTED",
                Self::Working => "TASK_STATE_WORKING",
                Self::InputRequired => "TASK_STATE_INPUT_REQUIRED",
                Self::Completed => "TASK_STATE_COMPLETED",
                Self::Canceled => "TASK_STATE_CANCELED",
                Self::Failed => "TASK_STATE_FAILED",
                Self::Rejected => "TASK_STATE_REJECTED",
                Self::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
                Self::Unspecified => "TASK_STATE_UNSPECIFIED",
            },
            Version::V03 => match self {
                Self::Submitted => "submitted",
                Self::Working => "working",
                Self::InputRequired => "input-required",
                Self::Completed => "completed",
                Self::Canceled => "canceled",
                Self::Failed => "failed",
                Self::Rejected => "rejected",
                Self::AuthRequired => "auth-required",
                Self::Unspecified => "unknown",
            },
        }
    }

    /// A state in either version's spelling.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|s| s.wire(Version::V1) == raw || s.wire(Version::V03) == raw)
    }

    /// Completed, failed, canceled, rejected: nothing more happens to the task.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Canceled | Self::Rejected
        )
    }

    /// Terminal, or waiting for the client (input or auth required): where a stream ends and a
    /// blocking send answers.
    pub fn is_final(self) -> bool {
        self.is_terminal() || matches!(self, Self::InputRequired | Self::AuthRequired)
    }
}

impl Serialize for TaskState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.wire(Version::V1))
    }
}

impl<'de> Deserialize<'de> for TaskState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::parse(&raw).ok_or_else(|| D::Error::custom(format!("unknown task state `{raw}`")))
    }
}

/// What a part holds (v1.0 names; v0.3 `text`/`data`/`file` parts map onto them).
#[derive(Debug, Clone, PartialEq)]
pub enum PartContent {
    Text(String),
    /// Bytes, base64 as on the wire.
    Raw(String),
    Url(String),
    Data(Value),
}

/// One piece of a message or an artifact.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub content: PartContent,
    pub metadata: Option<Map<String, Value>>,
    pub filename: Option<String>,
    pub media_type: Option<String>,
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self::of(PartContent::Text(text.into()))
    }

    /// A structured data part (`application/json`).
    pub fn data(value: Value) -> Self {
        Self::of(PartContent::Data(value))
    }

    fn of(content: PartContent) -> Self {
        Self {
            content,
            metadata: None,
            filename: None,
            media_type: None,
        }
    }

    /// The wire form of `v`.
    pub fn to_wire(&self, v: Version) -> Value {
        let mut out = Map::new();
        match v {
            Version::V1 => {
                let (key, value) = match &self.content {
                    PartContent::Text(t) => ("text", json!(t)),
                    PartContent::Raw(b) => ("raw", json!(b)),
                    PartContent::Url(u) => ("url", json!(u)),
                    PartContent::Data(d) => ("data", d.clone()),
                };
                out.insert(key.into(), value);
                if let Some(f) = &self.filename {
                    out.insert("filename".into(), json!(f));
                }
                if let Some(m) = &self.media_type {
                    out.insert("mediaType".into(), json!(m));
                }
            }
            Version::V03 => match &self.content {
                PartContent::Text(t) => {
                    out.insert("kind".into(), json!("text"));
                    out.insert("text".into(), json!(t));
                }
                PartContent::Data(d) => {
                    out.insert("kind".into(), json!("data"));
                    // v0.3 data parts hold an object.
                    let d = if d.is_object() {
                        d.clone()
                    } else {
                        json!({"value": d})
                    };
                    out.insert("data".into(), d);
                }
                PartContent::Raw(_) | PartContent::Url(_) => {
                    let mut file = Map::new();
                    match &self.content {
                        PartContent::Raw(b) => file.insert("bytes".into(), json!(b)),
                        PartContent::Url(u) => file.insert("uri".into(), json!(u)),
                        _ => None,
                    };
                    if let Some(f) = &self.filename {
                        file.insert("name".into(), json!(f));
                    }
                    if let Some(m) = &self.media_type {
                        file.insert("mimeType".into(), json!(m));
                    }
                    out.insert("kind".into(), json!("file"));
                    out.insert("file".into(), Value::Object(file));
                }
            },
        }
        if let Some(m) = &self.metadata {
            out.insert("metadata".into(), Value::Object(m.clone()));
        }
        Value::Object(out)
    }

    /// A part in either version's shape.
    ///
    /// # Errors
    /// A part that holds none (or more than one) of text, raw, url, data, or an unknown `kind`.
    pub fn from_wire(v: &Value) -> Result<Self, String> {
        let obj = v.as_object().ok_or("a part must be an object")?;
        let metadata = match obj.get("metadata") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m.clone()),
            Some(_) => return Err("part metadata must be an object".into()),
        };
        let text_of = |key: &str| -> Result<Option<String>, String> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(format!("part `{key}` must be a string")),
            }
        };
        if let Some(kind) = obj.get("kind") {
            // v0.3
            let part = match kind.as_str() {
                Some("text") => Part::text(text_of("text")?.ok_or("a text part needs `text`")?),
                Some("data") => {
                    Part::data(obj.get("data").cloned().ok_or("a data part needs `data`")?)
                }
                Some("file") => {
                    let file = obj
                        .get("file")
                        .and_then(Value::as_object)
                        .ok_or("a file part needs a `file` object")?;
                    let s = |k: &str| file.get(k).and_then(Value::as_str).map(str::to_owned);
                    let content = match (s("bytes"), s("uri")) {
                        (Some(b), None) => PartContent::Raw(b),
                        (None, Some(u)) => PartContent::Url(u),
                        _ => return Err("a file part needs `bytes` or `uri`".into()),
                    };
                    Part {
                        content,
                        metadata: None,
                        filename: s("name"),
                        media_type: s("mimeType"),
                    }
                }
                _ => return Err(format!("unknown part kind {kind}")),
            };
            return Ok(Part { metadata, ..part });
        }
        let mut found = Vec::new();
        if let Some(t) = text_of("text")? {
            found.push(PartContent::Text(t));
        }
        if let Some(b) = text_of("raw")? {
            found.push(PartContent::Raw(b));
        }
        if let Some(u) = text_of("url")? {
            found.push(PartContent::Url(u));
        }
        if let Some(d) = obj.get("data") {
            found.push(PartContent::Data(d.clone()));
        }
        if found.len() != 1 {
            return Err("a part holds exactly one of `text`, `raw`, `url`, `data`".into());
        }
        Ok(Part {
            content: found.remove(0),
            metadata,
            filename: text_of("filename")?,
            media_type: text_of("mediaType")?,
        })
    }
}

impl Serialize for Part {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_wire(Version::V1).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Part::from_wire(&Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// A message between a client and an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    pub message_id: String,
    pub role: Role,
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_task_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
}

impl Message {
    /// A message from the agent.
    pub fn agent(message_id: impl Into<String>, parts: Vec<Part>) -> Self {
        Self {
            message_id: message_id.into(),
            role: Role::Agent,
            parts,
            context_id: None,
            task_id: None,
            metadata: None,
            reference_task_ids: Vec::new(),
            extensions: Vec::new(),
        }
    }

    /// The wire form of `v`.
    pub fn to_wire(&self, v: Version) -> Value {
        let mut out = to_object(self);
        out.insert("role".into(), json!(self.role.wire(v)));
        out.insert(
            "parts".into(),
            Value::Array(self.parts.iter().map(|p| p.to_wire(v)).collect()),
        );
        if v == Version::V03 {
            out.insert("kind".into(), json!("message"));
        }
        Value::Object(out)
    }
}

/// A task's state at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    pub state: TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    /// RFC 3339, UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

impl TaskStatus {
    fn to_wire(&self, v: Version) -> Value {
        let mut out = Map::new();
        out.insert("state".into(), json!(self.state.wire(v)));
        if let Some(m) = &self.message {
            out.insert("message".into(), m.to_wire(v));
        }
        if let Some(t) = &self.timestamp {
            out.insert("timestamp".into(), json!(t));
        }
        Value::Object(out)
    }
}

/// An output of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    pub artifact_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

impl Artifact {
    fn to_wire(&self, v: Version) -> Value {
        let mut out = to_object(self);
        out.insert(
            "parts".into(),
            Value::Array(self.parts.iter().map(|p| p.to_wire(v)).collect()),
        );
        Value::Object(out)
    }
}

/// A unit of work: here, a run (`id` = runId, `contextId` = threadId).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub id: String,
    pub context_id: String,
    pub status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<Vec<Artifact>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<Message>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

impl Task {
    /// The wire form of `v`.
    pub fn to_wire(&self, v: Version) -> Value {
        let mut out = to_object(self);
        out.insert("status".into(), self.status.to_wire(v));
        if let Some(a) = &self.artifacts {
            out.insert(
                "artifacts".into(),
                Value::Array(a.iter().map(|a| a.to_wire(v)).collect()),
            );
        }
        if let Some(h) = &self.history {
            out.insert(
                "history".into(),
                Value::Array(h.iter().map(|m| m.to_wire(v)).collect()),
            );
        }
        if v == Version::V03 {
            out.insert("kind".into(), json!("task"));
        }
        Value::Object(out)
    }
}

/// A task's status changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusUpdateEvent {
    pub task_id: String,
    pub context_id: String,
    pub status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// A task produced (part of) an artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskArtifactUpdateEvent {
    pub task_id: String,
    pub context_id: String,
    pub artifact: Artifact,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub append: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_chunk: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// One item of a stream (and, as `Task` or `Message`, the answer of `SendMessage`).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamResponse {
    Task(Task),
    Message(Message),
    StatusUpdate(TaskStatusUpdateEvent),
    ArtifactUpdate(TaskArtifactUpdateEvent),
}

impl StreamResponse {
    /// The wire form of `v`: v1.0 wraps the payload (`{"statusUpdate": {…}}`); v0.3 sends it bare
    /// with its `kind`, and a status update carries `final` (true when the stream ends with it).
    pub fn to_wire(&self, v: Version) -> Value {
        match (self, v) {
            (Self::Task(t), Version::V1) => json!({"task": t.to_wire(v)}),
            (Self::Message(m), Version::V1) => json!({"message": m.to_wire(v)}),
            (Self::StatusUpdate(e), Version::V1) => {
                let mut body = to_object(e);
                body.insert("status".into(), e.status.to_wire(v));
                json!({"statusUpdate": body})
            }
            (Self::ArtifactUpdate(e), Version::V1) => {
                let mut body = to_object(e);
                body.insert("artifact".into(), e.artifact.to_wire(v));
                json!({"artifactUpdate": body})
            }
            (Self::Task(t), Version::V03) => t.to_wire(v),
            (Self::Message(m), Version::V03) => m.to_wire(v),
            (Self::StatusUpdate(e), Version::V03) => {
                let mut body = to_object(e);
                body.insert("status".into(), e.status.to_wire(v));
                body.insert("kind".into(), json!("status-update"));
                body.insert("final".into(), json!(e.status.state.is_final()));
                Value::Object(body)
            }
            (Self::ArtifactUpdate(e), Version::V03) => {
                let mut body = to_object(e);
                body.insert("artifact".into(), e.artifact.to_wire(v));
                body.insert("kind".into(), json!("artifact-update"));
                Value::Object(body)
            }
        }
    }

    /// A stream item (or a `SendMessage` result) in either version's shape: v1.0's wrapper key,
    /// or v0.3's `kind` (a bare object without `kind` is a task when it has `status`, a message
    /// when it has `messageId`).
    ///
    /// # Errors
    /// Anything else, or a payload that does not parse.
    pub fn from_wire(v: &Value) -> Result<Self, String> {
        let obj = v.as_object().ok_or("a stream item must be an object")?;
        let parse = |key: &str, value: &Value| -> Result<Self, String> {
            let value = value.clone();
            let e = |e: serde_json::Error| format!("invalid `{key}`: {e}");
            Ok(match key {
                "task" => Self::Task(serde_json::from_value(value).map_err(e)?),
                "message" => Self::Message(serde_json::from_value(value).map_err(e)?),
                "statusUpdate" | "status-update" => {
                    Self::StatusUpdate(serde_json::from_value(value).map_err(e)?)
                }
                _ => Self::ArtifactUpdate(serde_json::from_value(value).map_err(e)?),
            })
        };
        for key in ["task", "message", "statusUpdate", "artifactUpdate"] {
            if let Some(inner) = obj.get(key).filter(|i| i.is_object()) {
                return parse(key, inner);
            }
        }
        match obj.get("kind").and_then(Value::as_str) {
            Some(k @ ("task" | "message" | "status-update" | "artifact-update")) => parse(k, v),
            Some(other) => Err(format!("unknown stream item kind `{other}`")),
            None if obj.contains_key("status") && obj.contains_key("id") => parse("task", v),
            None if obj.contains_key("messageId") => parse("message", v),
            None => Err("not a task, message, status update or artifact update".into()),
        }
    }
}

/// How a `SendMessage` is to be handled. Both versions' fields are read: v1.0
/// `returnImmediately`, v0.3 `blocking`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageConfiguration {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_output_modes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_length: Option<i64>,
    /// v1.0: answer at once instead of when the task ends or needs input (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_immediately: Option<bool>,
    /// v0.3: wait for the task to end or need input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocking: Option<bool>,
}

impl SendMessageConfiguration {
    /// Whether the sender waits for the task to end or need input: blocking unless
    /// `returnImmediately` is true or `blocking` is false (both versions default to blocking).
    pub fn blocking(&self) -> bool {
        !(self.return_immediately == Some(true) || self.blocking == Some(false))
    }
}

/// Parameters of `SendMessage` / `SendStreamingMessage` (`message/send`, `message/stream`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageParams {
    pub message: Message,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<SendMessageConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl SendMessageParams {
    /// The wire form of `v` (what a client sends).
    pub fn to_wire(&self, v: Version) -> Value {
        let mut out = to_object(self);
        out.insert("message".into(), self.message.to_wire(v));
        if let Some(c) = &self.configuration {
            let mut c = c.clone();
            match v {
                Version::V1 => {
                    c.return_immediately = Some(!c.blocking());
                    c.blocking = None;
                }
                Version::V03 => {
                    c.blocking = Some(c.blocking());
                    c.return_immediately = None;
                }
            }
            out.insert("configuration".into(), json!(c));
        }
        Value::Object(out)
    }
}

/// Parameters naming one task: `GetTask`, `CancelTask`, `SubscribeToTask` (and their v0.3
/// names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskIdParams {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_length: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// Parameters of `ListTasks`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TaskState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_length: Option<i64>,
    /// RFC 3339: only tasks whose status changed after this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_timestamp_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_artifacts: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// The answer of `ListTasks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksResponse {
    pub tasks: Vec<Task>,
    /// Empty on the last page.
    pub next_page_token: String,
    pub page_size: i64,
    pub total_size: i64,
}

/// Serialize `value` (a struct) into its JSON object.
fn to_object<T: Serialize>(value: &T) -> Map<String, Value> {
    match serde_json::to_value(value) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_spelled_per_version_and_read_in_both() {
        assert_eq!(
            serde_json::to_value(TaskState::InputRequired).unwrap(),
            "TASK_STATE_INPUT_REQUIRED"
        );
        assert_eq!(
            TaskState::InputRequired.wire(Version::V03),
            "input-required"
        );
        for s in TaskState::ALL {
            for v in [Version::V1, Version::V03] {
                assert_eq!(TaskState::parse(s.wire(v)), Some(s));
            }
        }
        assert_eq!(TaskState::parse("running"), None);
    }

    #[test]
    fn parts_read_both_shapes_and_write_each() {
        let v1 = json!({"text": "hi"});
        let v03 = json!({"kind": "text", "text": "hi"});
        assert_eq!(Part::from_wire(&v1).unwrap(), Part::text("hi"));
        assert_eq!(Part::from_wire(&v03).unwrap(), Part::text("hi"));
        assert_eq!(Part::text("hi").to_wire(Version::V1), v1);
        assert_eq!(Part::text("hi").to_wire(Version::V03), v03);
        let data = Part::data(json!({"a": 1}));
        assert_eq!(
            data.to_wire(Version::V03),
            json!({"kind": "data", "data": {"a": 1}})
        );
        let file =
            json!({"kind": "file", "file": {"uri": "http://x/y.png", "mimeType": "image/png"}});
        let p = Part::from_wire(&file).unwrap();
        assert_eq!(p.content, PartContent::Url("http://x/y.png".into()));
        assert_eq!(
            p.to_wire(Version::V1),
            json!({"url": "http://x/y.png", "mediaType": "image/png"})
        );
        assert!(Part::from_wire(&json!({"text": "a", "data": {}})).is_err());
        assert!(Part::from_wire(&json!({})).is_err());
        assert!(Part::from_wire(&json!({"kind": "video"})).is_err());
    }

    #[test]
    fn stream_items_are_wrapped_in_v1_and_kinded_in_v03() {
        let e = StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: "t".into(),
            context_id: "c".into(),
            status: TaskStatus {
                state: TaskState::Completed,
                message: None,
                timestamp: None,
            },
            metadata: None,
        });
        let v1 = e.to_wire(Version::V1);
        assert_eq!(
            v1["statusUpdate"]["status"]["state"],
            "TASK_STATE_COMPLETED"
        );
        let v03 = e.to_wire(Version::V03);
        assert_eq!(v03["kind"], "status-update");
        assert_eq!(v03["final"], true);
        assert_eq!(v03["status"]["state"], "completed");
        assert_eq!(StreamResponse::from_wire(&v1).unwrap(), e);
        assert_eq!(StreamResponse::from_wire(&v03).unwrap(), e);
    }

    #[test]
    fn blocking_is_the_default_of_both_versions() {
        let c = SendMessageConfiguration::default();
        assert!(c.blocking());
        let v1: SendMessageConfiguration =
            serde_json::from_value(json!({"returnImmediately": true})).unwrap();
        assert!(!v1.blocking());
        let v03: SendMessageConfiguration =
            serde_json::from_value(json!({"blocking": false})).unwrap();
        assert!(!v03.blocking());
    }

    #[test]
    fn versions_parse_without_patch_numbers() {
        assert_eq!(Version::parse("1.0"), Some(Version::V1));
        assert_eq!(Version::parse("1.0.2"), Some(Version::V1));
        assert_eq!(Version::parse("0.3.0"), Some(Version::V03));
        assert_eq!(Version::parse("0.2"), None);
        assert_eq!(Version::parse("2.0"), None);
        assert_eq!(Version::parse("x"), None);
    }
}
