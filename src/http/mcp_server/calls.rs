//! Waiting for a run while an MCP tool call is open, and what the call answers. While it waits,
//! a client that sent a `progressToken` gets one progress notification per observation of the
//! run (from the same replay-then-live stream as `/v1/threads/{id}/events`): `progress` counts
//! them, `message` is the observation's type and title, and `_meta["pes-server/observation"]`
//! the observation itself. The call answers when the run completes, fails, is cancelled or
//! needs a person, or when `PES_MCP_CALL_TIMEOUT_SECONDS` have passed (the run goes on).

use std::time::Duration;

use futures::StreamExt;
use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, NotificationMetaObject, ProgressNotificationParam,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};

use super::api_error;
use crate::commands::{StreamItem, StreamSpec};
use crate::http::AppState;
use crate::model::{Run, RunKind, RunStatus, Suspension};

/// The `_meta` key a progress notification carries its observation under.
pub const OBSERVATION_META: &str = "pes-server/observation";

/// Wait until `run` ends or needs a person (its observations after `after` sent as progress
/// when the client asked for progress): the run as it then is. `None` when the client went away
/// or cancelled the call.
///
/// # Errors
/// The store fails, or the run is gone.
pub async fn wait(
    state: &AppState,
    ctx: &RequestContext<RoleServer>,
    run: &Run,
    after: i64,
) -> Result<Option<Run>, McpError> {
    let limit = Duration::from_secs(state.config.mcp_call_timeout_seconds);
    let waited = async {
        match ctx.meta.get_progress_token() {
            Some(token) => {
                let spec = StreamSpec {
                    tenant: run.tenant.clone(),
                    thread_id: run.thread_id.clone(),
                    after,
                    types: None,
                    parent_id: None,
                    run_id: Some(run.run_id),
                    until_run_end: true,
                };
                let mut items = state.cases.follow(spec, None).boxed();
                let mut n = 0u32;
                while let Some(item) = items.next().await {
                    let StreamItem::Obs(o) = item else { continue };
                    n += 1;
                    let mut meta = JsonObject::new();
                    meta.insert(
                        OBSERVATION_META.into(),
                        serde_json::to_value(&*o).unwrap_or(Value::Null),
                    );
                    let mut note = ProgressNotificationParam::new(token.clone(), f64::from(n));
                    note.message = Some(format!("{} {}", o.kind, o.title).trim().to_owned());
                    note.meta = Some(NotificationMetaObject(rmcp::model::MetaObject(meta)));
                    // A client that stopped listening does not stop the wait: the answer may
                    // still reach it.
                    let _ = ctx.peer.notify_progress(note).await;
                }
                state
                    .cases
                    .get_run(&run.tenant, &run.thread_id, run.run_id)
                    .await
                    .map_err(|e| api_error(e.into()))?
                    .ok_or_else(|| McpError::internal_error("the run is gone", None))
            }
            None => state
                .cases
                .wait_for_run(&run.tenant, &run.thread_id, run.run_id)
                .await
                .map_err(api_error),
        }
    };
    tokio::select! {
        _ = ctx.ct.cancelled() => Ok(None),
        r = tokio::time::timeout(limit, waited) => match r {
            Ok(run) => run.map(Some),
            // Still going: answer with it as it is now.
            Err(_) => state
                .cases
                .get_run(&run.tenant, &run.thread_id, run.run_id)
                .await
                .map_err(|e| api_error(e.into())),
        },
    }
}

/// The pending suspensions of `run`.
///
/// # Errors
/// The store fails.
pub async fn pending(state: &AppState, run: &Run) -> Result<Vec<Suspension>, McpError> {
    state
        .cases
        .pending_of_run(run)
        .await
        .map_err(|e| api_error(e.into()))
}

/// A suspension as a tool result shows it.
pub fn suspension_json(s: &Suspension) -> Value {
    json!({
        "suspensionId": s.suspension_id,
        "kind": s.kind,
        "itemId": s.item_id,
        "question": s.question,
        "toolCall": {"name": s.tool_call.name, "arguments": s.tool_call.arguments},
        "allowedDecisions": s.allowed_decisions,
        "inputSchema": s.input_schema,
        "expiresAt": s.expires_at,
    })
}

/// The tool result for `run` as it stands (`suspended`: its pending suspensions). A completed
/// flowchart run's result is the flowchart's output: its JSON text as the content, and `result`
/// in the structured content.
///
/// # Errors
/// The store fails.
pub async fn result_of(state: &AppState, run: &Run) -> Result<CallToolResult, McpError> {
    let mut out = json!({
        "threadId": run.thread_id,
        "runId": run.run_id,
    });
    let (text, is_error) = match run.status {
        RunStatus::Completed => {
            let answer = run.final_response.clone().unwrap_or(Value::Null);
            let response = answer["response"].as_str().unwrap_or_default().to_owned();
            out["status"] = "completed".into();
            out["answer"] = response.clone().into();
            out["sources"] = answer["sources"].clone();
            out["suggestions"] = answer["suggestions"].clone();
            if run.kind == RunKind::Flowchart {
                let output = answer.get("output").cloned().unwrap_or(Value::Null);
                let text = output.to_string();
                out["result"] = output;
                (text, false)
            } else {
                (response, false)
            }
        }
        RunStatus::Suspended => {
            let pending = pending(state, run).await?;
            let lines: Vec<String> = pending
                .iter()
                .map(|s| {
                    let what = s.question.clone().unwrap_or_else(|| {
                        format!(
                            "approve the call of `{}` with {}",
                            s.tool_call.name, s.tool_call.arguments
                        )
                    });
                    let allowed: Vec<&str> =
                        s.allowed_decisions.iter().map(|d| d.as_str()).collect();
                    format!(
                        "- suspension {}: {what} (decisions: {})",
                        s.suspension_id,
                        allowed.join(", ")
                    )
                })
                .collect();
            out["status"] = "suspended".into();
            out["suspensions"] = pending.iter().map(suspension_json).collect();
            (
                format!(
                    "The run waits for a person. Decide with the `resume` tool:\n{}",
                    lines.join("\n")
                ),
                false,
            )
        }
        RunStatus::Failed => {
            let error = run.error.clone();
            out["status"] = "failed".into();
            out["error"] = json!(error);
            (
                format!(
                    "The run failed: {}",
                    error.map(|e| e.message).unwrap_or_default()
                ),
                true,
            )
        }
        RunStatus::Cancelled => {
            out["status"] = "cancelled".into();
            ("The run was cancelled.".into(), true)
        }
        RunStatus::Queued | RunStatus::Running => {
            out["status"] = "running".into();
            (
                format!(
                    "The run is still going (thread {}, run {}): follow it at \
                     /v1/threads/{}/runs/{}.",
                    run.thread_id, run.run_id, run.thread_id, run.run_id
                ),
                false,
            )
        }
    };
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    result.structured_content = Some(out);
    Ok(result)
}
