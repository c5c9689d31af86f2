//! The parameters of the methods (`SendMessage` with how it is to be handled, the methods naming
//! one task, `ListTasks`) and the answer of `ListTasks`, in both versions' names.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{Message, Task, TaskState, Version, to_object};

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
