//! AG-UI 1.0 at `POST /v1/ag-ui`: the front ends built on the Agent-User Interaction protocol
//! (CopilotKit and others) talk to our agent as they would to any AG-UI agent. The input is a
//! `RunAgentInput`; the answer a stream of AG-UI events mapped from the run's observation log
//! ([`fold`]). A door onto the use cases like the REST routes: a query is enqueued through
//! [`crate::commands::UseCases::enqueue`] (the thread created when missing), and a `resume`
//! entry is a person's decision checked by [`crate::commands::UseCases::decide`] and carried
//! out by [`crate::commands::RunCommands::resume`].
//!
//! - The last `user` message is the query (its text parts; `context` entries are added below
//!   it). The input's `runId` is the run's idempotency key, so the same input posted twice is
//!   one run; without one, an id is made for it.
//! - A run that needs a person ends with the interrupt outcome, one interrupt per pending
//!   suspension (its id is the suspension id); the next input's `resume` entries answer them
//!   and its stream shows the run going on, as a new AG-UI run.
//! - Beyond AG-UI's HTTP binding (which has no resumption): posting the same input again with
//!   `Last-Event-ID` reconnects to the run from that point, applying nothing twice.

mod answer;
mod events;
mod fold;
mod state;
mod stream;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::{ApiError, AppJson, AppState, Problem, Tenant};
use crate::commands::{DecisionRequest, RunRequest, already_decided};
use crate::model::{
    AgentConfig, AssistantId, Decision, MultitaskStrategy, Suspension, SuspensionKind,
    SuspensionStatus, ThreadId, new_id,
};
use crate::problem::Refusal;
use crate::telemetry::TraceContext;
use stream::{Start, agui_sse};

/// The route (behind the API keys, like all of `/v1`).
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(run_agent))
}

/// The path of the route.
pub const PATH: &str = "/v1/ag-ui";

/// Longest `runId` taken (it becomes the run's idempotency key).
const MAX_RUN_ID_CHARS: usize = 200;

/// A message of the conversation, as AG-UI sends it. Only `user` messages are read (the last
/// one is the query); the others are the client's record of the conversation, which the thread
/// already holds.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InputMessage {
    pub id: String,
    /// `user`, `assistant`, `system`, `developer`, `tool`, `activity` or `reasoning`.
    pub role: String,
    /// A string, or (user and tool messages) a list of parts; text parts (`{"type": "text",
    /// "text"}`) are read, other parts are left out.
    #[serde(default)]
    pub content: Option<Value>,
}

/// Ambient information for the run, added below the query.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ContextEntry {
    pub description: String,
    pub value: String,
}

/// Whether an interrupt was answered or abandoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ResumeStatus {
    Resolved,
    Cancelled,
}

/// An answer to one interrupt of the run this input continues.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResumeEntry {
    /// The interrupt's id: a suspension id.
    pub interrupt_id: String,
    /// `resolved` (answered by `payload`) or `cancelled` (abandoned: the suspension is rejected).
    pub status: ResumeStatus,
    /// For a `tool_approval` interrupt: `{decision: approve|edit|reject|respond, reason?,
    /// modifiedArgs?, response?}` (or `{approved: bool, editedArgs?, reason?}`); for a question
    /// (`input_required`, `remote_input_required`): the answer itself, fitting the interrupt's
    /// `responseSchema`.
    #[serde(default)]
    pub payload: Option<Value>,
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// What a run may set of ours, under `forwardedProps.pes` (the rest of `forwardedProps` is the
/// application's and is left alone).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PesProps {
    /// Per-run overrides of the thread's config.
    #[serde(default)]
    pub config: Option<AgentConfig>,
    /// The assistant the run uses.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub assistant_id: Option<AssistantId>,
    /// What to do while another run of the thread is active; default `enqueue`.
    #[serde(default)]
    pub multitask_strategy: Option<MultitaskStrategy>,
}

/// AG-UI's `RunAgentInput`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"threadId": "t-1", "runId": "r-1", "messages": [{"id": "m1", "role": "user", "content": "What is 17 * 23?"}]}))]
pub struct RunAgentInput {
    /// The thread (created when missing): 1–128 characters of `A-Za-z0-9_.:-`.
    #[schema(pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    pub thread_id: String,
    /// The AG-UI run id (1–200 characters): also the run's idempotency key. Made up when absent.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 200)]
    pub run_id: Option<String>,
    /// The protocol version the client speaks (`1.0`).
    #[serde(default)]
    pub protocol_version: Option<String>,
    #[serde(default)]
    pub parent_run_id: Option<String>,
    /// The client's state: not read (the state is the thread's todo list, which the server owns).
    #[serde(default)]
    pub state: Option<Value>,
    /// The conversation; its last `user` message is the query (not read when `resume` answers
    /// interrupts).
    #[serde(default)]
    pub messages: Vec<InputMessage>,
    /// The application's frontend tools: not called (the agent's tools are the server's).
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub context: Option<Vec<ContextEntry>>,
    /// Passed through; `forwardedProps.pes` may set the run's `config`, `assistantId` and
    /// `multitaskStrategy` (see `PesProps`).
    #[serde(default)]
    pub forwarded_props: Option<Value>,
    /// Answers to the interrupts the thread's run ended with.
    #[serde(default)]
    pub resume: Option<Vec<ResumeEntry>>,
}

/// Run the agent, AG-UI style: post the input's last user message as a query on its thread (or
/// answer the run's interrupts with `resume`), and stream the run as AG-UI 1.0 events until it
/// finishes, is interrupted, is cancelled or fails.
///
/// Events (`data:` only; `id:` is the observation `seq` on the last event an observation gave):
/// `RUN_STARTED` (with `protocolVersion`), `STATE_SNAPSHOT` of `{todoList}`, then as the run
/// goes `STATE_DELTA` (RFC 6902), `STEP_STARTED`/`STEP_FINISHED` per item, `TOOL_CALL_START`/
/// `ARGS`/`END`/`RESULT`, `TEXT_MESSAGE_START`/`CONTENT`/`END` for the answer, and last
/// `RUN_FINISHED` (`outcome` success, interrupt or cancelled) or `RUN_ERROR`. With
/// `Last-Event-ID` the same input reconnects to its run after that `seq` instead.
#[utoipa::path(post, path = "/v1/ag-ui", tag = "ag-ui", request_body = RunAgentInput,
    params(
        ("Last-Event-ID" = Option<i64>, Header, minimum = 0, nullable = false,
            description = "Reconnect: the same input again, streaming its run after this `seq` (the last `id:` received); nothing is posted or decided again.")
    ),
    responses(
        (status = 200, description = "The run as AG-UI events (Server-Sent Events, one JSON event per `data:`)", content_type = "text/event-stream", body = String),
        (status = 400, description = "A `Last-Event-ID` that is not an integer from 0 to 2^63−1", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A `resume` entry names no suspension of the tenant (`suspension_not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A `resume` entry answers a suspension already decided (`suspension_resolved`), or the thread is busy and `multitaskStrategy` is `reject`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "No user message to run, a bad thread id, `runId` or `forwardedProps.pes`, or a `resume` payload the suspension does not take", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn run_agent(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    headers: HeaderMap,
    AppJson(input): AppJson<RunAgentInput>,
) -> Result<Response, ApiError> {
    let thread_id = ThreadId::parse(&input.thread_id)
        .map_err(|e| ApiError::validation(format!("threadId: {e}")))?;
    let last_event_id = last_event_id(&headers)?;
    if let Some(r) = &input.run_id
        && (r.is_empty() || r.chars().count() > MAX_RUN_ID_CHARS)
    {
        return Err(ApiError::validation(format!(
            "runId must be 1 to {MAX_RUN_ID_CHARS} characters"
        )));
    }
    let agui_run_id = input.run_id.clone().unwrap_or_else(|| new_id().to_string());
    let entries = input.resume.as_deref().unwrap_or_default();
    // Taken before anything is posted or decided: a stream the quota refuses changes nothing.
    let slot = state.streams.take(&tenant)?;
    // Subscribed before the run goes on, so the answer's first deltas are not missed.
    let tokens = state.cases.token_subscription(&tenant, &thread_id);
    let start = if entries.is_empty() {
        if last_event_id.is_some() && input.run_id.is_none() {
            return Err(ApiError::validation(
                "a reconnect (`Last-Event-ID`) needs the `runId` of the run it reconnects to"
                    .into(),
            ));
        }
        let request = run_request(&input, &agui_run_id, &headers)?;
        let (run, _) = state
            .cases
            .enqueue(tenant.clone(), thread_id, request)
            .await?;
        Start {
            after: last_event_id.unwrap_or(run.start_seq).max(run.start_seq),
            continuing: last_event_id.is_some(),
            reconnect: last_event_id.is_some(),
            run,
            agui_run_id,
        }
    } else {
        let pending = suspensions(&state, &tenant, &thread_id, entries).await?;
        let run_id = pending[0].run_id;
        let run = state
            .cases
            .get_run(&tenant, &thread_id, run_id)
            .await?
            .ok_or_else(ApiError::run_not_found)?;
        match last_event_id {
            Some(n) => Start {
                after: n.max(run.start_seq),
                continuing: true,
                reconnect: true,
                run,
                agui_run_id,
            },
            None => {
                let after = decide_all(&state, &tenant, &pending, entries, &headers).await?;
                Start {
                    after: after.unwrap_or(run.start_seq),
                    continuing: true,
                    reconnect: false,
                    run,
                    agui_run_id,
                }
            }
        }
    };
    agui_sse(&state, start, Some(tokens), slot).await
}

/// `Last-Event-ID` as a `seq`.
fn last_event_id(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    headers
        .get("last-event-id")
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    ApiError::BadHeader("Last-Event-ID must be a seq (an integer ≥ 0)".into())
                })
        })
        .transpose()
}

/// The text of a message's content: a string, or its text parts joined.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The run the input asks for: its last user message (and the context) as the query, the
/// `runId` as idempotency key, `forwardedProps.pes` for config, assistant and strategy.
fn run_request(
    input: &RunAgentInput,
    agui_run_id: &str,
    headers: &HeaderMap,
) -> Result<RunRequest, ApiError> {
    let last = input
        .messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .ok_or_else(|| {
            ApiError::validation(
                "messages hold no `user` message: the last one is the query to run".into(),
            )
        })?;
    let mut query = text_of(last.content.as_ref());
    if query.trim().is_empty() {
        return Err(ApiError::validation(format!(
            "the last user message (`{}`) has no text to run",
            last.id
        )));
    }
    let context: Vec<String> = input
        .context
        .iter()
        .flatten()
        .map(|c| format!("- {}: {}", c.description, c.value))
        .collect();
    if !context.is_empty() {
        query = format!("{query}\n\nContext:\n{}", context.join("\n"));
    }
    let props: PesProps = match input.forwarded_props.as_ref().and_then(|p| p.get("pes")) {
        None | Some(Value::Null) => PesProps::default(),
        Some(p) => crate::json::strict::from_value(p)
            .map_err(|e| ApiError::validation(format!("forwardedProps.pes: {e}")))?,
    };
    Ok(RunRequest {
        query,
        config: props.config.unwrap_or_default(),
        strategy: props.multitask_strategy,
        idempotency_key: Some(format!("ag-ui:{agui_run_id}")),
        create_thread: true,
        trace: TraceContext::for_run(headers),
        assistant_id: props.assistant_id,
        assistant_version: None,
        webhook: None,
        cron_id: None,
        flowchart: None,
    })
}

/// The suspensions the resume entries answer: each of the tenant (else 404), of the input's
/// thread and of one run (else 422).
async fn suspensions(
    state: &AppState,
    tenant: &str,
    thread_id: &ThreadId,
    entries: &[ResumeEntry],
) -> Result<Vec<Suspension>, ApiError> {
    let mut found: Vec<Suspension> = Vec::with_capacity(entries.len());
    for e in entries {
        let id = Uuid::parse_str(&e.interrupt_id).map_err(|_| Refusal::NotFound {
            code: "suspension_not_found",
            detail: format!("interrupt `{}` names no suspension", e.interrupt_id),
        })?;
        if found.iter().any(|s| s.suspension_id == id) {
            return Err(ApiError::validation(format!(
                "interrupt `{id}` is answered twice"
            )));
        }
        let s = state
            .cases
            .get_suspension(tenant, id)
            .await?
            .ok_or_else(|| Refusal::NotFound {
                code: "suspension_not_found",
                detail: format!("interrupt `{id}` names no suspension"),
            })?;
        if s.thread_id != *thread_id {
            return Err(ApiError::validation(format!(
                "interrupt `{id}` is of thread `{}`, not of `{thread_id}`",
                s.thread_id
            )));
        }
        if let Some(first) = found.first()
            && first.run_id != s.run_id
        {
            return Err(ApiError::validation(
                "the resume entries answer interrupts of different runs: answer one run's at a \
                 time"
                    .into(),
            ));
        }
        found.push(s);
    }
    Ok(found)
}

/// What a resume entry decides for its suspension.
fn decision_of(s: &Suspension, e: &ResumeEntry) -> Result<DecisionRequest, ApiError> {
    let field = |v: &Value, k: &str| v.get(k).filter(|x| !x.is_null()).cloned();
    let reason = |v: Option<&Value>| {
        v.and_then(|v| v.get("reason"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    if e.status == ResumeStatus::Cancelled {
        return Ok(DecisionRequest {
            raise_by: None,
            decision: Decision::Reject,
            reason: reason(e.payload.as_ref()).or_else(|| {
                Some("the person abandoned the question (AG-UI resume cancelled)".into())
            }),
            modified_args: None,
            response: None,
        });
    }
    let payload = e.payload.as_ref().ok_or_else(|| {
        ApiError::validation(format!(
            "resume entry for `{}`: a resolved interrupt needs a `payload` (see its responseSchema)",
            s.suspension_id
        ))
    })?;
    if s.kind == SuspensionKind::Budget {
        // `{decision: approve, raiseBy: {tokens?, usd?}}` raises the budget; `reject` fails the run.
        let decision: Decision = payload
            .get("decision")
            .and_then(Value::as_str)
            .and_then(|d| d.parse().ok())
            .ok_or_else(|| {
                ApiError::validation(format!(
                    "resume entry for `{}`: payload.decision must be approve (with raiseBy) or \
                     reject",
                    s.suspension_id
                ))
            })?;
        let raise_by = field(payload, "raiseBy")
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| {
                ApiError::validation(format!(
                    "resume entry for `{}`: payload.raiseBy: {e}",
                    s.suspension_id
                ))
            })?;
        return Ok(DecisionRequest {
            raise_by,
            decision,
            reason: reason(Some(payload)),
            modified_args: None,
            response: None,
        });
    }
    if s.kind != SuspensionKind::Approval {
        return Ok(DecisionRequest {
            raise_by: None,
            decision: Decision::Respond,
            reason: None,
            modified_args: None,
            response: Some(payload.clone()),
        });
    }
    if let Some(d) = payload.get("decision") {
        let decision: Decision = d.as_str().and_then(|d| d.parse().ok()).ok_or_else(|| {
            ApiError::validation(format!(
                "resume entry for `{}`: payload.decision must be approve, edit, reject or respond",
                s.suspension_id
            ))
        })?;
        return Ok(DecisionRequest {
            raise_by: None,
            decision,
            reason: reason(Some(payload)),
            modified_args: field(payload, "modifiedArgs"),
            response: field(payload, "response"),
        });
    }
    if let Some(approved) = payload.get("approved").and_then(Value::as_bool) {
        let edited = field(payload, "editedArgs");
        let decision = match (approved, &edited) {
            (false, _) => Decision::Reject,
            (true, Some(_)) => Decision::Edit,
            (true, None) => Decision::Approve,
        };
        return Ok(DecisionRequest {
            raise_by: None,
            decision,
            reason: reason(Some(payload)),
            modified_args: edited.filter(|_| approved),
            response: None,
        });
    }
    Err(ApiError::validation(format!(
        "resume entry for `{}`: the payload of a tool approval is `{{decision, reason?, \
         modifiedArgs?, response?}}` (or `{{approved, editedArgs?}}`)",
        s.suspension_id
    )))
}

/// Decide every suspension the entries answer (all checked before any is decided): the `seq`
/// the resumed run's events follow, just before the first decision's observations.
async fn decide_all(
    state: &AppState,
    tenant: &str,
    pending: &[Suspension],
    entries: &[ResumeEntry],
    headers: &HeaderMap,
) -> Result<Option<i64>, ApiError> {
    let mut decided = Vec::with_capacity(pending.len());
    for (s, e) in pending.iter().zip(entries) {
        if s.status != SuspensionStatus::Pending {
            return Err(already_decided(Some(s)).into());
        }
        let decision = state.cases.decide(s, decision_of(s, e)?)?;
        decided.push((s.suspension_id, decision));
    }
    let mut after = None;
    for (id, decision) in decided {
        let trace = TraceContext::for_resume(headers).map(|t| t.to_stored());
        match state.cases.carry_out(tenant, id, decision, trace).await {
            Ok(done) => {
                if after.is_none() {
                    after = done.observations.first().map(|o| o.seq - 1);
                }
            }
            // Decided by someone else meanwhile: refused when nothing was decided here yet;
            // otherwise the run goes on with what was, and asks again for the rest.
            Err(e @ Refusal::Conflict { .. }) if after.is_none() => return Err(e.into()),
            Err(Refusal::Conflict { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(after)
}
