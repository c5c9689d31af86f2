//! JSON-RPC 2.0 as A2A uses it: the request envelope, the method names of both protocol versions,
//! and the errors with their A2A codes. Shared by the server (`POST /a2a`) and the client.
//!
//! Errors keep one rule: a body that is not a JSON-RPC request at all (not JSON, not an object,
//! no `method`, a wrong `jsonrpc`, `id` or `params` type) answers HTTP 400 with the JSON-RPC
//! error (-32700 or -32600); every well-formed request answers HTTP 200, its failures
//! (-32601, -32602, -32001…) in the JSON-RPC `error`.

use serde::Serialize;
use serde_json::{Map, Value, json};
use utoipa::ToSchema;

use super::types::Version;

/// JSON-RPC and A2A error codes (spec §5.4, §9.5).
pub mod codes {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    pub const TASK_NOT_FOUND: i64 = -32001;
    pub const TASK_NOT_CANCELABLE: i64 = -32002;
    pub const PUSH_NOTIFICATION_NOT_SUPPORTED: i64 = -32003;
    pub const UNSUPPORTED_OPERATION: i64 = -32004;
    pub const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
    pub const INVALID_AGENT_RESPONSE: i64 = -32006;
    pub const EXTENDED_AGENT_CARD_NOT_CONFIGURED: i64 = -32007;
    pub const VERSION_NOT_SUPPORTED: i64 = -32009;
}

/// The operations, whatever their version's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    SendMessage,
    SendStreamingMessage,
    GetTask,
    ListTasks,
    CancelTask,
    SubscribeToTask,
    /// Push notification configuration (any of its methods): not supported here.
    PushConfig,
    GetExtendedAgentCard,
}

impl Method {
    /// The operation and the protocol version a method name belongs to.
    pub fn parse(name: &str) -> Option<(Self, Version)> {
        use Version::{V1, V03};
        Some(match name {
            "SendMessage" => (Self::SendMessage, V1),
            "SendStreamingMessage" => (Self::SendStreamingMessage, V1),
            "GetTask" => (Self::GetTask, V1),
            "ListTasks" => (Self::ListTasks, V1),
            "CancelTask" => (Self::CancelTask, V1),
            "SubscribeToTask" => (Self::SubscribeToTask, V1),
            "CreateTaskPushNotificationConfig"
            | "GetTaskPushNotificationConfig"
            | "ListTaskPushNotificationConfigs"
            | "DeleteTaskPushNotificationConfig" => (Self::PushConfig, V1),
            "GetExtendedAgentCard" => (Self::GetExtendedAgentCard, V1),
            "message/send" => (Self::SendMessage, V03),
            "message/stream" => (Self::SendStreamingMessage, V03),
            "tasks/get" => (Self::GetTask, V03),
            "tasks/list" => (Self::ListTasks, V03),
            "tasks/cancel" => (Self::CancelTask, V03),
            "tasks/resubscribe" => (Self::SubscribeToTask, V03),
            "tasks/pushNotificationConfig/set"
            | "tasks/pushNotificationConfig/get"
            | "tasks/pushNotificationConfig/list"
            | "tasks/pushNotificationConfig/delete" => (Self::PushConfig, V03),
            "agent/getAuthenticatedExtendedCard" => (Self::GetExtendedAgentCard, V03),
            _ => return None,
        })
    }

    /// The method's name in `v`.
    pub fn name(self, v: Version) -> &'static str {
        match (self, v) {
            (Self::SendMessage, Version::V1) => "SendMessage",
            (Self::SendStreamingMessage, Version::V1) => "SendStreamingMessage",
            (Self::GetTask, Version::V1) => "GetTask",
            (Self::ListTasks, Version::V1) => "ListTasks",
            (Self::CancelTask, Version::V1) => "CancelTask",
            (Self::SubscribeToTask, Version::V1) => "SubscribeToTask",
            (Self::PushConfig, Version::V1) => "CreateTaskPushNotificationConfig",
            (Self::GetExtendedAgentCard, Version::V1) => "GetExtendedAgentCard",
            (Self::SendMessage, Version::V03) => "message/send",
            (Self::SendStreamingMessage, Version::V03) => "message/stream",
            (Self::GetTask, Version::V03) => "tasks/get",
            (Self::ListTasks, Version::V03) => "tasks/list",
            (Self::CancelTask, Version::V03) => "tasks/cancel",
            (Self::SubscribeToTask, Version::V03) => "tasks/resubscribe",
            (Self::PushConfig, Version::V03) => "tasks/pushNotificationConfig/set",
            (Self::GetExtendedAgentCard, Version::V03) => "agent/getAuthenticatedExtendedCard",
        }
    }

    /// Whether the answer is a stream of events.
    pub fn streams(self) -> bool {
        matches!(self, Self::SendStreamingMessage | Self::SubscribeToTask)
    }
}

/// A JSON-RPC error with its A2A meaning.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message} ({code})")]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    /// v1.0 `google.rpc.ErrorInfo` reason (`TASK_NOT_FOUND`…).
    pub reason: &'static str,
    /// Facts for the client (`taskId`…), as the ErrorInfo's metadata.
    pub metadata: Map<String, Value>,
}

impl RpcError {
    fn new(code: i64, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            reason,
            metadata: Map::new(),
        }
    }

    /// Add a fact to the error's metadata.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.metadata.insert(key.to_owned(), value.into());
        self
    }

    pub fn parse_error(detail: impl std::fmt::Display) -> Self {
        Self::new(
            codes::PARSE_ERROR,
            "PARSE_ERROR",
            format!("Invalid JSON payload: {detail}"),
        )
    }
    pub fn invalid_request(detail: impl std::fmt::Display) -> Self {
        Self::new(
            codes::INVALID_REQUEST,
            "INVALID_REQUEST",
            format!("Request payload validation error: {detail}"),
        )
    }
    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            codes::METHOD_NOT_FOUND,
            "METHOD_NOT_FOUND",
            format!("Method not found: `{method}`"),
        )
        .with("method", method)
    }
    pub fn invalid_params(detail: impl std::fmt::Display) -> Self {
        Self::new(
            codes::INVALID_PARAMS,
            "INVALID_PARAMS",
            format!("Invalid parameters: {detail}"),
        )
    }
    pub fn internal() -> Self {
        Self::new(
            codes::INTERNAL_ERROR,
            "INTERNAL_ERROR",
            "Internal error (it has been logged)",
        )
    }
    pub fn task_not_found(task_id: &str) -> Self {
        Self::new(codes::TASK_NOT_FOUND, "TASK_NOT_FOUND", "Task not found").with("taskId", task_id)
    }
    pub fn task_not_cancelable(task_id: &str, detail: impl std::fmt::Display) -> Self {
        Self::new(
            codes::TASK_NOT_CANCELABLE,
            "TASK_NOT_CANCELABLE",
            format!("Task cannot be canceled: {detail}"),
        )
        .with("taskId", task_id)
    }
    pub fn unsupported(detail: impl std::fmt::Display) -> Self {
        Self::new(
            codes::UNSUPPORTED_OPERATION,
            "UNSUPPORTED_OPERATION",
            format!("This operation is not supported: {detail}"),
        )
    }
    pub fn push_not_supported() -> Self {
        Self::new(
            codes::PUSH_NOTIFICATION_NOT_SUPPORTED,
            "PUSH_NOTIFICATION_NOT_SUPPORTED",
            "Push notifications are not supported: stream (SubscribeToTask) or poll (GetTask)",
        )
    }
    pub fn content_type(detail: impl std::fmt::Display) -> Self {
        Self::new(
            codes::CONTENT_TYPE_NOT_SUPPORTED,
            "CONTENT_TYPE_NOT_SUPPORTED",
            format!("Incompatible content types: {detail}"),
        )
    }
    pub fn version_not_supported(requested: &str) -> Self {
        Self::new(
            codes::VERSION_NOT_SUPPORTED,
            "VERSION_NOT_SUPPORTED",
            format!("A2A protocol version `{requested}` is not supported (supported: 1.0, 0.3)"),
        )
        .with("requestedVersion", requested)
        .with("supportedVersions", "1.0,0.3")
    }
    pub fn extended_card_not_configured() -> Self {
        Self::new(
            codes::UNSUPPORTED_OPERATION,
            "UNSUPPORTED_OPERATION",
            "This agent has no extended agent card (capabilities.extendedAgentCard is false)",
        )
    }

    /// The JSON-RPC `error` object: `data` is v1.0's list of typed details (an ErrorInfo), or
    /// v0.3's plain metadata object.
    pub fn to_wire(&self, v: Version) -> Value {
        let mut out = json!({"code": self.code, "message": self.message});
        match v {
            Version::V1 => {
                out["data"] = json!([{
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": self.reason,
                    "domain": "a2a-protocol.org",
                    "metadata": self.metadata,
                }]);
            }
            Version::V03 if !self.metadata.is_empty() => {
                out["data"] = Value::Object(self.metadata.clone());
            }
            Version::V03 => {}
        }
        out
    }
}

/// A parsed request envelope.
#[derive(Debug, Clone)]
pub struct Request {
    /// String, integer or null, echoed in the response.
    pub id: Value,
    pub method: String,
    /// An object (absent params are `{}`).
    pub params: Value,
}

impl Request {
    /// Parse a request body.
    ///
    /// # Errors
    /// -32700 for text that is not JSON; -32600 for JSON that is not a request object (a batch,
    /// a wrong `jsonrpc`, a missing or non-string `method`, an `id` that is not a string, an
    /// integer or null); -32602 for `params` that is not an object. The id, when it was
    /// readable, comes with the error.
    pub fn parse(body: &[u8]) -> Result<Self, (Value, RpcError)> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| (Value::Null, RpcError::parse_error(e)))?;
        let Value::Object(obj) = value else {
            let what = if value.is_array() {
                "batch requests are not supported"
            } else {
                "the request must be a JSON object"
            };
            return Err((Value::Null, RpcError::invalid_request(what)));
        };
        let id = match obj.get("id") {
            None | Some(Value::Null) => Value::Null,
            Some(v @ Value::String(_)) => v.clone(),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n.clone()),
            Some(_) => {
                return Err((
                    Value::Null,
                    RpcError::invalid_request("`id` must be a string, an integer or null"),
                ));
            }
        };
        let bad = |detail: &str| Err((id.clone(), RpcError::invalid_request(detail)));
        if obj.get("jsonrpc") != Some(&json!("2.0")) {
            return bad("`jsonrpc` must be exactly \"2.0\"");
        }
        let method = match obj.get("method") {
            Some(Value::String(m)) if !m.is_empty() => m.clone(),
            _ => return bad("`method` must be a non-empty string"),
        };
        let params = match obj.get("params") {
            None | Some(Value::Null) => json!({}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err((id, RpcError::invalid_params("`params` must be an object")));
            }
        };
        Ok(Self { id, method, params })
    }
}

/// A JSON-RPC success response.
pub fn success(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC error response.
pub fn failure(id: &Value, error: &RpcError, v: Version) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error.to_wire(v)})
}

fn schema(v: Value) -> utoipa::openapi::schema::Schema {
    serde_json::from_value(v).expect("a schema object")
}

/// `"2.0"`.
fn version_schema() -> utoipa::openapi::schema::Schema {
    schema(json!({"type": "string", "enum": ["2.0"]}))
}

/// A JSON-RPC id: a string, an integer or null.
fn id_schema() -> utoipa::openapi::schema::Schema {
    schema(json!({"type": ["string", "integer", "null"]}))
}

/// An error's details: a list of objects (v1.0) or an object (v0.3). Written as a `oneOf` of
/// the two, each with its type whole (an `array` without `items` is a type a client generator
/// cannot build).
fn data_schema() -> utoipa::openapi::schema::Schema {
    schema(json!({"oneOf": [
        {"type": "array", "items": {"type": "object"}},
        {"type": "object"},
    ]}))
}

/// A JSON-RPC 2.0 request (the body of `POST /a2a`), for the OpenAPI document.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
    "params": {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "What is 17 * 23?"}]},
               "configuration": {"returnImmediately": true}}
}))]
pub struct JsonRpcRequest {
    /// Exactly `"2.0"`.
    #[schema(schema_with = version_schema)]
    pub jsonrpc: String,
    /// Echoed in the response: a string, an integer or null.
    #[schema(schema_with = id_schema)]
    pub id: Option<Value>,
    /// `SendMessage`, `SendStreamingMessage`, `GetTask`, `ListTasks`, `CancelTask`,
    /// `SubscribeToTask`, or their v0.3 names (`message/send`, `message/stream`, `tasks/get`,
    /// `tasks/cancel`, `tasks/resubscribe`); any other method answers -32601.
    #[schema(min_length = 1)]
    pub method: String,
    /// The method's parameters (A2A `SendMessageRequest`, `GetTaskRequest`, …).
    #[schema(value_type = Option<Object>)]
    pub params: Option<Value>,
}

/// A JSON-RPC 2.0 error object.
#[derive(Debug, Serialize, ToSchema)]
pub struct JsonRpcErrorObject {
    /// -32700 parse error, -32600 invalid request, -32601 method not found, -32602 invalid
    /// params, -32603 internal error, -32001 task not found, -32002 task not cancelable, -32003
    /// push notifications not supported, -32004 unsupported operation, -32005 content type not
    /// supported, -32009 version not supported.
    pub code: i64,
    pub message: String,
    /// v1.0: a list of typed details (`google.rpc.ErrorInfo` with `reason` and `metadata`); v0.3:
    /// an object.
    #[schema(schema_with = data_schema)]
    pub data: Option<Value>,
}

/// A JSON-RPC 2.0 response: `result` or `error`.
#[derive(Debug, Serialize, ToSchema)]
pub struct JsonRpcResponse {
    /// `"2.0"`.
    #[schema(schema_with = version_schema)]
    pub jsonrpc: String,
    /// The request's id (null when it could not be read).
    #[schema(schema_with = id_schema)]
    pub id: Option<Value>,
    /// The method's result (A2A `SendMessageResponse`, `Task`, `ListTasksResponse`, …).
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    pub error: Option<JsonRpcErrorObject>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> (Value, i64) {
        let (id, e) = Request::parse(body.as_bytes()).unwrap_err();
        (id, e.code)
    }

    #[test]
    fn envelopes_are_checked_with_the_right_codes() {
        assert_eq!(err("{").1, codes::PARSE_ERROR);
        assert_eq!(err("[]").1, codes::INVALID_REQUEST);
        assert_eq!(err("3").1, codes::INVALID_REQUEST);
        assert_eq!(
            err(r#"{"jsonrpc":"1.0","id":7,"method":"GetTask"}"#),
            (json!(7), codes::INVALID_REQUEST)
        );
        assert_eq!(
            err(r#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#).1,
            codes::INVALID_REQUEST
        );
        assert_eq!(
            err(r#"{"jsonrpc":"2.0","id":"a"}"#),
            (json!("a"), codes::INVALID_REQUEST)
        );
        assert_eq!(
            err(r#"{"jsonrpc":"2.0","id":"a","method":"GetTask","params":[1]}"#),
            (json!("a"), codes::INVALID_PARAMS)
        );
        let r = Request::parse(br#"{"jsonrpc":"2.0","id":"a","method":"GetTask"}"#).unwrap();
        assert_eq!(r.params, json!({}));
    }

    #[test]
    fn both_versions_name_every_method() {
        for (m, v) in [
            ("SendMessage", Version::V1),
            ("tasks/resubscribe", Version::V03),
            ("message/stream", Version::V03),
        ] {
            let (method, version) = Method::parse(m).unwrap();
            assert_eq!((method.name(version), version), (m, v));
        }
        assert!(Method::parse("message.send").is_none());
    }

    #[test]
    fn errors_carry_error_info_in_v1_and_metadata_in_v03() {
        let e = RpcError::task_not_found("t-1");
        let v1 = e.to_wire(Version::V1);
        assert_eq!(v1["code"], -32001);
        assert_eq!(v1["data"][0]["reason"], "TASK_NOT_FOUND");
        assert_eq!(v1["data"][0]["metadata"]["taskId"], "t-1");
        assert_eq!(e.to_wire(Version::V03)["data"]["taskId"], "t-1");
    }
}
