//! The A2A server: `POST /a2a` (JSON-RPC 2.0) and the agent card route. A task is a run and a
//! context a thread, so every method is a door onto what the REST API already does, through the
//! same [`crate::commands::RunCommands`] (enqueue, cancel, resume) and the same store reads:
//!
//! - `SendMessage` without `taskId` posts the message's text as a query on the thread its
//!   `contextId` names (created when missing; a new thread when no `contextId` is given); with a
//!   `taskId` whose run waits for a person it answers the oldest pending suspension (`respond`,
//!   the message's data or text as the response). Blocking unless the configuration says
//!   otherwise, like `runs/wait`.
//! - `SendStreamingMessage` and `SubscribeToTask` stream the task from its observation log
//!   ([`stream`]).
//! - `GetTask`, `ListTasks`, `CancelTask` read and cancel runs; another tenant's run is not found.
//!
//! Method names of v1.0 and v0.3 are both served; the version of the name decides the shapes of
//! the answer. An `A2A-Version` header naming a version we do not speak is refused (-32009).

mod card;
mod stream;

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::a2a::rpc::{
    JsonRpcRequest, JsonRpcResponse, Method, Request, RpcError, failure, success,
};
use crate::a2a::tasks::{state_of_run, statuses_of_state, task_of_run};
use crate::a2a::types::{
    ListTasksParams, ListTasksResponse, Message, PartContent, Role, SendMessageParams,
    TaskIdParams, VERSION_HEADER, Version,
};
use crate::commands::{DecisionRequest, RunRequest};
use crate::commands::{RunFilter, StoreError};
use crate::http::{AppState, CursorKey, Tenant, decode_cursor, encode_cursor, error::reject_nul};
use crate::model::{Decision, Run, ThreadId, new_id};
use crate::problem::Refusal;
use stream::task_events;

/// The card route (open: no key needed).
pub fn card_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(card::agent_card))
}

/// The JSON-RPC route (behind the API keys, like `/v1`).
pub fn rpc_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(a2a))
}

/// How long `CancelTask` waits for a running run to stop before answering with it as it is.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// Page size of `ListTasks`: 1–100, default 50.
const MAX_PAGE: i64 = 100;
const DEFAULT_PAGE: i64 = 50;

/// The A2A agent's JSON-RPC endpoint.
///
/// Answers the JSON-RPC response (HTTP 200, success or error), or for
/// `SendStreamingMessage`/`SubscribeToTask` (`message/stream`, `tasks/resubscribe`) a stream of
/// Server-Sent Events, each `data:` a JSON-RPC response whose `result` is a `Task`, a
/// `TaskStatusUpdateEvent` or a `TaskArtifactUpdateEvent`, `id:` the observation `seq` it comes
/// from; the stream ends when the task ends or needs input. A body that is not a JSON-RPC
/// request (not JSON: -32700; not a request object: -32600; `params` not an object: -32602)
/// answers HTTP 400 with the JSON-RPC error.
#[utoipa::path(post, path = "/a2a", tag = "a2a", request_body = JsonRpcRequest,
    params(
        ("A2A-Version" = Option<String>, Header, nullable = false,
            description = "The protocol version the client speaks (`1.0` or `0.3`; empty means 0.3). Another version answers -32009."),
        ("Last-Event-ID" = Option<String>, Header, nullable = false,
            description = "`SubscribeToTask`: replay the task's events after this `id:` (an observation `seq`) instead of from now.")
    ),
    responses(
        (status = 200, description = "The JSON-RPC response; for the streaming methods, Server-Sent Events of JSON-RPC responses",
            content((JsonRpcResponse = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "Not a JSON-RPC request: the JSON-RPC error (-32700, -32600 or -32602) with id null unless it was readable", body = JsonRpcResponse)
    ))]
pub async fn a2a(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => return crate::http::error::from_bytes_rejection(e).into_response(),
    };
    let req = match Request::parse(&body) {
        Ok(r) => r,
        Err((id, e)) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(failure(&id, &e, Version::V1)),
            )
                .into_response();
        }
    };
    let Some((method, version)) = Method::parse(&req.method) else {
        let e = RpcError::method_not_found(&req.method);
        return axum::Json(failure(&req.id, &e, Version::V1)).into_response();
    };
    let id = req.id.clone();
    match call(&state, &tenant, &headers, method, version, req).await {
        Ok(Answer::Json(result)) => axum::Json(success(&id, result)).into_response(),
        Ok(Answer::Stream(resp)) => resp,
        Err(e) => axum::Json(failure(&id, &e, version)).into_response(),
    }
}

/// What a method answers.
enum Answer {
    Json(Value),
    Stream(Response),
}

async fn call(
    state: &AppState,
    tenant: &str,
    headers: &HeaderMap,
    method: Method,
    version: Version,
    req: Request,
) -> Result<Answer, RpcError> {
    if let Some(raw) = headers
        .get(VERSION_HEADER)
        .map(|v| v.to_str().unwrap_or("?").trim())
        .filter(|v| !v.is_empty())
        && Version::parse(raw).is_none()
    {
        return Err(RpcError::version_not_supported(raw));
    }
    reject_nul(&req.params).map_err(RpcError::invalid_params)?;
    match method {
        Method::SendMessage => {
            let p: SendMessageParams = params(req.params)?;
            let config = p.configuration.clone().unwrap_or_default();
            let run = send(state, tenant, p).await?.run;
            let run = if config.blocking() {
                state
                    .cases
                    .wait_for_run(tenant, &run.thread_id, run.run_id)
                    .await
                    .map_err(api_error)?
            } else {
                run
            };
            let task = task_of_run(&run, config.history_length, true);
            Ok(Answer::Json(match version {
                Version::V1 => json!({"task": task.to_wire(version)}),
                Version::V03 => task.to_wire(version),
            }))
        }
        Method::SendStreamingMessage => {
            let p: SendMessageParams = params(req.params)?;
            let slot = state.streams.take(tenant).map_err(api_error)?;
            let sent = send(state, tenant, p).await?;
            // From where the message took effect: a new task's every update, a resumed one's
            // since the answer.
            Ok(Answer::Stream(
                task_events(state, sent.run, Some(sent.after), req.id, version, slot).await?,
            ))
        }
        Method::GetTask => {
            let p: TaskIdParams = params(req.params)?;
            check_history(p.history_length)?;
            let run = find_task(state, tenant, &p.id).await?;
            Ok(Answer::Json(
                task_of_run(&run, p.history_length, true).to_wire(version),
            ))
        }
        Method::CancelTask => {
            let p: TaskIdParams = params(req.params)?;
            let run = cancel(state, tenant, &p.id).await?;
            Ok(Answer::Json(task_of_run(&run, None, true).to_wire(version)))
        }
        Method::SubscribeToTask => {
            let p: TaskIdParams = params(req.params)?;
            let run = find_task(state, tenant, &p.id).await?;
            let task_state = state_of_run(&run);
            if task_state.is_terminal() {
                return Err(RpcError::unsupported(format!(
                    "task {} is {}: a finished task has no more updates (read it with GetTask)",
                    p.id,
                    task_state.wire(version)
                ))
                .with("taskId", p.id));
            }
            let replay = match headers.get("last-event-id") {
                None => None,
                Some(v) => Some(
                    v.to_str()
                        .ok()
                        .and_then(|s| s.trim().parse::<i64>().ok())
                        .filter(|n| *n >= 0)
                        .ok_or_else(|| {
                            RpcError::invalid_params("Last-Event-ID must be a seq (an integer ≥ 0)")
                        })?,
                ),
            };
            let slot = state.streams.take(tenant).map_err(api_error)?;
            Ok(Answer::Stream(
                task_events(state, run, replay, req.id, version, slot).await?,
            ))
        }
        Method::ListTasks => {
            let p: ListTasksParams = params(req.params)?;
            Ok(Answer::Json(list(state, tenant, p, version).await?))
        }
        Method::PushConfig => Err(RpcError::push_not_supported()),
        Method::GetExtendedAgentCard => Err(RpcError::extended_card_not_configured()),
    }
}

/// A method's parameters.
fn params<T: DeserializeOwned>(raw: Value) -> Result<T, RpcError> {
    serde_json::from_value(raw).map_err(RpcError::invalid_params)
}

fn check_history(length: Option<i64>) -> Result<(), RpcError> {
    match length {
        Some(n) if n < 0 => Err(RpcError::invalid_params(
            "historyLength must not be negative",
        )),
        _ => Ok(()),
    }
}

/// A store failure: logged whole, answered as an internal error.
fn store_error(e: StoreError) -> RpcError {
    api_error(Refusal::from(e))
}

/// A REST-side error in JSON-RPC terms: what the client sent that the API refuses is invalid
/// params; what conflicts with the task's state is an unsupported operation.
fn api_error(e: Refusal) -> RpcError {
    match crate::http::error::refusal_parts(&e).0.as_u16() {
        400 | 422 => RpcError::invalid_params(e),
        // Only the operator may do that (approve a raise of the tenant's day).
        403 | 409 => RpcError::unsupported(e),
        503 => RpcError::internal().with("detail", e.to_string()),
        // A tenant quota: the caller may try again later (`detail` says which quota).
        429 => RpcError::internal()
            .with("detail", e.to_string())
            .with("code", "quota_exceeded"),
        _ => {
            if let Refusal::Internal(cause) = &e {
                tracing::error!(
                    cause = format!("{cause:#}"),
                    "internal error in an A2A call"
                );
            }
            RpcError::internal()
        }
    }
}

/// The run a task id names, in this tenant.
async fn find_task(state: &AppState, tenant: &str, task_id: &str) -> Result<Run, RpcError> {
    let Ok(run_id) = Uuid::parse_str(task_id) else {
        return Err(RpcError::task_not_found(task_id));
    };
    state
        .cases
        .find_run(tenant, run_id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| RpcError::task_not_found(task_id))
}

/// What a sent message started.
struct Sent {
    /// The new run, or the resumed one (queued again).
    run: Run,
    /// The last observation before the message took effect: the new run's `start_seq`, or the
    /// `AGENT_RESUMED` the answer committed.
    after: i64,
}

/// What a message says, as one text (its text parts, then its data parts as JSON), and its
/// single data value when it is only that.
fn read_message(m: &Message) -> Result<(String, Option<Value>), RpcError> {
    if m.role != Role::User {
        return Err(RpcError::invalid_params("message.role must be ROLE_USER"));
    }
    if m.parts.is_empty() {
        return Err(RpcError::invalid_params(
            "message.parts must hold at least one part",
        ));
    }
    let mut texts = Vec::new();
    let mut data = Vec::new();
    for p in &m.parts {
        if let Some(mt) = &p.media_type
            && !matches!(mt.as_str(), "text/plain" | "application/json")
        {
            return Err(RpcError::content_type(format!(
                "this agent reads text/plain and application/json parts, not {mt}"
            )));
        }
        match &p.content {
            PartContent::Text(t) => texts.push(t.clone()),
            PartContent::Data(d) => data.push(d.clone()),
            PartContent::Raw(_) | PartContent::Url(_) => {
                return Err(RpcError::content_type(
                    "this agent reads text and data parts, not files (raw bytes or URLs)",
                ));
            }
        }
    }
    let only_data = (texts.is_empty() && data.len() == 1).then(|| data[0].clone());
    texts.extend(data.iter().map(Value::to_string));
    Ok((texts.join("\n\n"), only_data))
}

/// `SendMessage`: a new run, or the answer to the task's pending question.
async fn send(state: &AppState, tenant: &str, p: SendMessageParams) -> Result<Sent, RpcError> {
    let m = &p.message;
    if m.message_id.trim().is_empty() {
        return Err(RpcError::invalid_params("message.messageId is required"));
    }
    check_history(p.configuration.as_ref().and_then(|c| c.history_length))?;
    let (text, only_data) = read_message(m)?;
    if let Some(task_id) = &m.task_id {
        let run = find_task(state, tenant, task_id).await?;
        if let Some(c) = &m.context_id
            && c != run.thread_id.as_str()
        {
            return Err(RpcError::invalid_params(format!(
                "contextId `{c}` is not the context of task {task_id}"
            )));
        }
        return answer(state, tenant, &run, text, only_data).await;
    }
    let thread_id = match &m.context_id {
        Some(c) => {
            ThreadId::parse(c).map_err(|e| RpcError::invalid_params(format!("contextId: {e}")))?
        }
        None => ThreadId::parse(&new_id().to_string()).map_err(|_| RpcError::internal())?,
    };
    if m.message_id.chars().count() > 250 {
        return Err(RpcError::invalid_params(
            "message.messageId is longer than 250 characters",
        ));
    }
    let request = RunRequest {
        query: text,
        create_thread: true,
        // A message sent twice (a client's retry) is one task.
        idempotency_key: Some(format!("a2a:{}", m.message_id)),
        trace: crate::telemetry::TraceContext::current(),
        ..RunRequest::default()
    };
    let (run, _) = state
        .cases
        .enqueue(tenant.to_owned(), thread_id, request)
        .await
        .map_err(api_error)?;
    Ok(Sent {
        after: run.start_seq,
        run,
    })
}

/// A message to an existing task: it answers the task's oldest pending question with
/// `respond` (the message's single data value, else its text).
async fn answer(
    state: &AppState,
    tenant: &str,
    run: &Run,
    text: String,
    only_data: Option<Value>,
) -> Result<Sent, RpcError> {
    let task_id = run.run_id.to_string();
    let pending = state
        .cases
        .pending_of_run(run)
        .await
        .map_err(store_error)?
        .into_iter()
        .next();
    let Some(s) = pending else {
        let task_state = state_of_run(run);
        let why = if task_state.is_terminal() {
            "it has ended; send a message without taskId (with the same contextId) to start a follow-up task"
        } else {
            "it is not waiting for input"
        };
        return Err(
            RpcError::unsupported(format!("task {task_id} takes no message now: {why}"))
                .with("taskId", task_id),
        );
    };
    let body = DecisionRequest {
        decision: Decision::Respond,
        reason: None,
        modified_args: None,
        response: Some(only_data.unwrap_or(Value::String(text))),
        raise_by: None,
    };
    let decision = state.cases.decide(&s, body).map_err(api_error)?;
    match state
        .cases
        .carry_out(tenant, s.suspension_id, decision, None)
        .await
    {
        Ok(done) => Ok(Sent {
            after: done
                .observations
                .last()
                .map_or(done.run.start_seq, |o| o.seq),
            run: done.run,
        }),
        Err(Refusal::Conflict { detail, .. }) => Err(RpcError::unsupported(format!(
            "task {task_id} no longer waits for this input: {detail}"
        ))
        .with("taskId", task_id)),
        Err(e) => Err(api_error(e)),
    }
}

/// `CancelTask`: cancel the run; a running one is given [`CANCEL_WAIT`] to stop.
async fn cancel(state: &AppState, tenant: &str, task_id: &str) -> Result<Run, RpcError> {
    let run = find_task(state, tenant, task_id).await?;
    let cancelled = match state.cases.cancel(tenant, &run.thread_id, run.run_id).await {
        Ok(c) => c.run,
        Err(StoreError::Conflict(detail)) => {
            return Err(RpcError::task_not_cancelable(task_id, detail));
        }
        Err(StoreError::RunNotFound | StoreError::ThreadNotFound) => {
            return Err(RpcError::task_not_found(task_id));
        }
        Err(e) => return Err(store_error(e)),
    };
    if cancelled.status.is_terminal() {
        return Ok(cancelled);
    }
    let waited = tokio::time::timeout(
        CANCEL_WAIT,
        state.cases.wait_for_run(tenant, &run.thread_id, run.run_id),
    )
    .await;
    Ok(match waited {
        Ok(Ok(run)) => run,
        _ => cancelled,
    })
}

/// `ListTasks`: the tenant's tasks, newest first.
async fn list(
    state: &AppState,
    tenant: &str,
    p: ListTasksParams,
    version: Version,
) -> Result<Value, RpcError> {
    let page_size = p.page_size.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&page_size) {
        return Err(RpcError::invalid_params(format!(
            "pageSize must be between 1 and {MAX_PAGE}, got {page_size}"
        )));
    }
    check_history(p.history_length)?;
    let cursor = match p.page_token.as_deref().filter(|t| !t.is_empty()) {
        Some(t) => Some(
            decode_cursor(t, CursorKey::Uuid)
                .map_err(|_| RpcError::invalid_params("pageToken was not made by this server"))?,
        ),
        None => None,
    };
    let mut filter = RunFilter::default();
    if let Some(c) = p.context_id.as_deref().filter(|c| !c.is_empty()) {
        filter.thread_id = Some(
            ThreadId::parse(c).map_err(|e| RpcError::invalid_params(format!("contextId: {e}")))?,
        );
    }
    if let Some(s) = p
        .status
        .filter(|s| *s != crate::a2a::types::TaskState::Unspecified)
    {
        let (statuses, started) = statuses_of_state(s);
        if statuses.is_empty() {
            let empty = ListTasksResponse {
                tasks: vec![],
                next_page_token: String::new(),
                page_size,
                total_size: 0,
            };
            return Ok(list_wire(&empty, version));
        }
        filter.statuses = Some(statuses);
        filter.queued_started = started;
    }
    if let Some(t) = p.status_timestamp_after.as_deref() {
        filter.updated_after = Some(
            chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|e| {
                    RpcError::invalid_params(format!("statusTimestampAfter is not RFC 3339: {e}"))
                })?
                .with_timezone(&chrono::Utc),
        );
    }
    let limit = u32::try_from(page_size).unwrap_or(50);
    let (mut runs, total) = state
        .cases
        .list_tenant_runs(tenant, &filter, limit + 1, cursor.as_ref())
        .await
        .map_err(store_error)?;
    let next_page_token = if runs.len() > limit as usize {
        runs.truncate(limit as usize);
        runs.last()
            .map(|r| encode_cursor(r.created_at, &r.run_id.to_string()))
            .unwrap_or_default()
    } else {
        String::new()
    };
    let with_artifacts = p.include_artifacts.unwrap_or(false);
    let response = ListTasksResponse {
        tasks: runs
            .iter()
            .map(|r| task_of_run(r, p.history_length, with_artifacts))
            .collect(),
        next_page_token,
        page_size,
        total_size: i64::try_from(total).unwrap_or(i64::MAX),
    };
    Ok(list_wire(&response, version))
}

fn list_wire(r: &ListTasksResponse, version: Version) -> Value {
    json!({
        "tasks": r.tasks.iter().map(|t| t.to_wire(version)).collect::<Vec<_>>(),
        "nextPageToken": r.next_page_token,
        "pageSize": r.page_size,
        "totalSize": r.total_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a2a::types::Part;

    fn message(parts: Vec<Part>) -> Message {
        let mut m = Message::agent("m", parts);
        m.role = Role::User;
        m
    }

    #[test]
    fn a_message_reads_as_text_and_as_its_one_data_value() {
        let (text, data) = read_message(&message(vec![Part::text("hi")])).unwrap();
        assert_eq!((text.as_str(), data), ("hi", None));
        let (text, data) =
            read_message(&message(vec![Part::data(json!({"name": "Ada"}))])).unwrap();
        assert_eq!(text, r#"{"name":"Ada"}"#);
        assert_eq!(data, Some(json!({"name": "Ada"})));
        let mut file = Part::text("x");
        file.content = PartContent::Url("http://x/y.png".into());
        let e = read_message(&message(vec![file])).unwrap_err();
        assert_eq!(e.code, crate::a2a::rpc::codes::CONTENT_TYPE_NOT_SUPPORTED);
        let e = read_message(&message(vec![])).unwrap_err();
        assert_eq!(e.code, crate::a2a::rpc::codes::INVALID_PARAMS);
        let mut agent = message(vec![Part::text("hi")]);
        agent.role = Role::Agent;
        assert!(read_message(&agent).is_err());
    }
}
