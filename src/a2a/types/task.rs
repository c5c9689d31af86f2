//! A task (here, a run) and what is said about it: its state and status, its artifacts, and the
//! stream items that report them (a task, a message, a status or an artifact update), with
//! v1.0's wrapper keys or v0.3's `kind`.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value, json};

use super::{Message, Part, Version, to_object};

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
    pub fn from_wire(v: &Value) -> Result<Self, StreamItemError> {
        let obj = v.as_object().ok_or(StreamItemError::NotAnObject)?;
        let parse = |key: &str, value: &Value| -> Result<Self, StreamItemError> {
            let value = value.clone();
            let e = |source| StreamItemError::Invalid {
                key: key.to_owned(),
                source,
            };
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
            Some(other) => Err(StreamItemError::UnknownKind(other.to_owned())),
            None if obj.contains_key("status") && obj.contains_key("id") => parse("task", v),
            None if obj.contains_key("messageId") => parse("message", v),
            None => Err(StreamItemError::Unrecognized),
        }
    }
}

/// Why a value is not a stream item of either version.
#[derive(Debug, thiserror::Error)]
pub enum StreamItemError {
    #[error("a stream item must be an object")]
    NotAnObject,
    #[error("invalid `{key}`: {source}")]
    Invalid {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("unknown stream item kind `{0}`")]
    UnknownKind(String),
    #[error("not a task, message, status update or artifact update")]
    Unrecognized,
}
