//! Retention, per tenant: `GET /v1/threads/{threadId}/storage` (what a thread
//! stores) and `POST /v1/threads/prune` (delete the tenant's idle threads, or with `dryRun` only
//! count them). The handlers parse the request and call [`crate::commands::UseCases`]; the rules
//! are there. Threads that expire by their time-to-live need no route: every replica's sweeper
//! deletes them (`crate::commands::retention`).
//!
//! `POST /v1/threads/prune` is a fixed path beside `/v1/threads/{threadId}`, which the router
//! matches first; so that a thread whose id is `prune` stays readable, this path also answers
//! GET, PATCH and DELETE as that thread's. Those are the `{threadId}` routes, so neither the
//! document nor `Allow` names them here: `Allow` says POST, what the path itself is for.

use axum::extract::{FromRequest, Request, State};
use axum::http::{Method, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::threads::{self, UpdateThread};
use super::{ApiError, AppJson, AppPath, AppState, Problem, Tenant, parse_thread_id};
use crate::commands::Footprint;
use crate::commands::PruneRequest;
use crate::model::{ThreadId, ThreadStatus};

/// The fixed segment of the prune route (also a valid thread id).
const PRUNE: &str = "prune";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(thread_storage))
        .routes(routes!(prune_threads))
        .route("/v1/threads/prune", any(thread_named_prune))
}

/// Rows and bytes of one kind of record.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageFootprint {
    /// Records of this kind.
    pub rows: u64,
    /// Their stored text and JSON, in bytes (ids, timestamps and indexes not counted).
    pub bytes: u64,
}

impl From<Footprint> for StorageFootprint {
    fn from(f: Footprint) -> Self {
        Self {
            rows: f.rows,
            bytes: f.bytes,
        }
    }
}

/// What a thread stores, by kind: the figures a retention policy is set by.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"threadId": "t-1", "observations": {"rows": 42, "bytes": 18034}, "messages": {"rows": 2, "bytes": 311}, "items": {"rows": 2, "bytes": 2950}, "runs": {"rows": 1, "bytes": 822}, "history": {"rows": 9, "bytes": 5210}, "total": {"rows": 56, "bytes": 27327}}))]
pub struct ThreadStorage {
    #[schema(value_type = String)]
    pub thread_id: ThreadId,
    /// The observation log (`content` as stored JSON, with `type`, `title` and `parentId`).
    pub observations: StorageFootprint,
    /// The conversation (users' queries, answers, items' tool-call turns).
    pub messages: StorageFootprint,
    /// The todo items of the plan, with their tool calls, results and conversations.
    pub items: StorageFootprint,
    /// The runs (query, config, usage, error, final response).
    pub runs: StorageFootprint,
    /// What past states are read from (`state?atSeq=`): a row per commit and a version of
    /// each state row each commit wrote.
    pub history: StorageFootprint,
    /// The five kinds together.
    pub total: StorageFootprint,
}

/// Body of `POST /v1/threads/prune`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"olderThanSeconds": 2_592_000, "status": "idle", "dryRun": true}))]
pub struct PruneThreads {
    /// Threads whose last activity (creation, last observation, last change: `updatedAt`) is at
    /// least this many seconds old; 0 matches every thread without an active run. At most ten
    /// years.
    #[schema(minimum = 0, maximum = 315_360_000)]
    pub older_than_seconds: u64,
    /// Only threads showing this status in the thread list: `idle` or `error` (`busy` and
    /// `suspended` threads have an active run and are never pruned: 422).
    #[serde(default)]
    pub status: Option<ThreadStatus>,
    /// Count and name the threads that would be deleted, deleting none.
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// What a prune did: `deleted` threads (or, with `dryRun`, `matched` ones), at most
/// `PES_PRUNE_MAX_THREADS`; `more` when others match too (call again).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"deleted": 2, "more": false, "dryRun": false, "threadIds": ["t-1", "t-2"]}))]
pub struct PruneResult {
    /// Threads deleted (absent with `dryRun`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted: Option<u64>,
    /// Threads that a prune would delete now (only with `dryRun`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched: Option<u64>,
    /// More threads match than one call handles: call again to go on.
    pub more: bool,
    pub dry_run: bool,
    /// The threads deleted (or matched), oldest activity first.
    #[schema(value_type = Vec<String>)]
    pub thread_ids: Vec<ThreadId>,
}

/// What a thread stores.
///
/// Rows and bytes of its observations, messages, todo items, runs and history, read in one
/// consistent view.
#[utoipa::path(get, path = "/v1/threads/{threadId}/storage", tag = "threads",
    params(("threadId" = String, Path, description = "Thread id: 1–128 characters of `A-Za-z0-9_.:-` (any other id is not found)", pattern = "^[A-Za-z0-9_.:-]{1,128}$")),
    responses(
        (status = 200, description = "What the thread stores", body = ThreadStorage),
        (status = 404, description = "No such thread", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn thread_storage(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppPath(thread_id): AppPath<String>,
) -> Result<AppJson<ThreadStorage>, ApiError> {
    let id = parse_thread_id(&thread_id)?;
    let s = state.cases.thread_storage(&tenant, &id).await?;
    let total = [s.observations, s.messages, s.items, s.runs, s.history]
        .iter()
        .fold(Footprint::default(), |a, f| Footprint {
            rows: a.rows + f.rows,
            bytes: a.bytes + f.bytes,
        });
    Ok(AppJson(ThreadStorage {
        thread_id: id,
        observations: s.observations.into(),
        messages: s.messages.into(),
        items: s.items.into(),
        runs: s.runs.into(),
        history: s.history.into(),
        total: total.into(),
    }))
}

/// Delete the tenant's idle threads.
///
/// Threads without run activity for `olderThanSeconds` (and of `status`, when given) are
/// deleted with everything they own, oldest activity first, at most `PES_PRUNE_MAX_THREADS` per
/// call (`more: true` when others remain); their streams end with `THREAD_DELETED`. A thread
/// with a run queued, running or suspended is never deleted. `dryRun` only counts and names
/// them.
#[utoipa::path(post, path = "/v1/threads/prune", tag = "threads", request_body = PruneThreads,
    responses(
        (status = 200, description = "What was deleted (or, dry, would be)", body = PruneResult)
    ))]
pub async fn prune_threads(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppJson(body): AppJson<PruneThreads>,
) -> Result<AppJson<PruneResult>, ApiError> {
    let dry_run = body.dry_run.unwrap_or(false);
    let pruned = state
        .cases
        .prune_threads(
            &tenant,
            PruneRequest {
                older_than_seconds: body.older_than_seconds,
                status: body.status,
                dry_run,
            },
        )
        .await?;
    let n = pruned.thread_ids.len() as u64;
    if !dry_run {
        state.metrics.threads_pruned(n);
    }
    Ok(AppJson(PruneResult {
        deleted: (!dry_run).then_some(n),
        matched: dry_run.then_some(n),
        more: pruned.more,
        dry_run,
        thread_ids: pruned.thread_ids,
    }))
}

/// Every method of `/v1/threads/prune` but POST: GET, PATCH and DELETE of the thread whose id
/// is `prune`; 405 (allowed: POST) for the others.
async fn thread_named_prune(
    State(state): State<AppState>,
    tenant: Tenant,
    req: Request,
) -> Response {
    let id = || AppPath(PRUNE.to_owned());
    match req.method().clone() {
        Method::GET | Method::HEAD => threads::get_thread(State(state), tenant, id())
            .await
            .into_response(),
        Method::DELETE => threads::delete_thread(State(state), tenant, id())
            .await
            .into_response(),
        Method::PATCH => match AppJson::<UpdateThread>::from_request(req, &state).await {
            Ok(body) => threads::patch_thread(State(state), tenant, id(), body)
                .await
                .into_response(),
            Err(e) => e.into_response(),
        },
        method => {
            let mut res = ApiError::MethodNotAllowed(format!("{method} on /v1/threads/prune"))
                .into_response();
            res.headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
            res
        }
    }
}
