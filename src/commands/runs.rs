//! Posting a query and waiting for its run: the checks every door applies before a run exists
//! (the query, the config and the tool policy floor, the tenant's quota), and the wait that
//! `runs/wait`, A2A's blocking `SendMessage` and others share.

use std::time::Duration;

use uuid::Uuid;

use super::UseCases;
use crate::events::BusMsg;
use crate::model::{
    AgentConfig, AssistantId, MultitaskStrategy, Run, RunStatus, ThreadId, WebhookSpec,
};
use crate::problem::Refusal;
use crate::store::NewRun;
use crate::telemetry::TraceContext;

/// A run as a door asks for it, once parsed from its wire format.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// The user's query (trimmed here; empty or longer than `PES_MAX_QUERY_CHARS` is refused).
    pub query: String,
    /// The run's overrides of its thread's config.
    pub config: AgentConfig,
    /// What to do while another run of the thread is active; default `enqueue`.
    pub strategy: Option<MultitaskStrategy>,
    /// A repeated key on the same thread returns the first run.
    pub idempotency_key: Option<String>,
    /// Create the thread when it does not exist (else it is not found).
    pub create_thread: bool,
    /// The trace the run's spans continue.
    pub trace: Option<TraceContext>,
    /// The assistant the run uses instead of the thread's (its current version unless
    /// `assistant_version` pins one).
    pub assistant_id: Option<AssistantId>,
    /// A version of `assistant_id` (or, without it, of the thread's assistant) to use.
    pub assistant_version: Option<i64>,
    /// The run's own webhook (a run body's top-level `webhook`); it goes into the run's
    /// `config.webhook`, which must then be unset.
    pub webhook: Option<WebhookSpec>,
    /// The cron whose tick posts this run.
    pub cron_id: Option<Uuid>,
    /// Makes a `flowchart` run of this flowchart and input (see
    /// [`UseCases::run_flowchart`], which checks them); `None`: an `agent` run.
    pub flowchart: Option<crate::model::FlowchartCall>,
}

impl UseCases {
    /// Enqueue a run on `thread_id`: the run, and whether it is new (false for a repeated
    /// idempotency key).
    ///
    /// # Errors
    /// 422 for a bad query or config or a run that would loosen its thread's tool policy; 429
    /// `quota_exceeded` past `PES_TENANT_MAX_ACTIVE_RUNS` or `PES_TENANT_MAX_STORAGE_BYTES`; 404 for a missing thread (unless
    /// `create_thread`), saying how to create it; 409 for a busy thread with `reject`.
    pub async fn enqueue(
        &self,
        tenant: String,
        thread_id: ThreadId,
        request: RunRequest,
    ) -> Result<(Run, bool), Refusal> {
        let query = request.query.trim().to_owned();
        if query.is_empty() {
            return Err(Refusal::Validation("query must not be empty".into()));
        }
        self.storage_room(&tenant).await?;
        if query.chars().count() > self.config.max_query_chars {
            return Err(Refusal::Validation(format!(
                "query is longer than {} characters (PES_MAX_QUERY_CHARS)",
                self.config.max_query_chars
            )));
        }
        if request.strategy == Some(MultitaskStrategy::Steer) {
            // The query may become a steering message: the one rule every steer has.
            super::check_steering_message("query", &query)?;
        }
        if let Some(k) = &request.idempotency_key
            && (k.is_empty() || k.chars().count() > 256)
        {
            return Err(Refusal::Validation(
                "idempotencyKey must be 1 to 256 characters".into(),
            ));
        }
        let mut config = request.config;
        if config.ttl_seconds.is_some() {
            // How long a thread is kept is the thread's (or its assistant's), not one run's.
            return Err(Refusal::Validation(
                "config.ttlSeconds is a thread setting: set it on the thread (PATCH \
                 /v1/threads/{threadId}) or its assistant, not on a run"
                    .into(),
            ));
        }
        if let Some(w) = request.webhook {
            if config.webhook.is_some() {
                return Err(Refusal::Validation(
                    "set the run's webhook once: `webhook` or `config.webhook`, not both".into(),
                ));
            }
            self.check_webhook(&w, "webhook")?;
            config.webhook = Some(w);
        }
        self.check_config(&tenant, &config).await?;
        if request.assistant_version.is_some_and(|v| v < 1) {
            return Err(Refusal::Validation(
                "assistantVersion must be 1 or more".into(),
            ));
        }
        // Locked fields and the tool policy floor; reads only for a run that overrides its
        // thread's config or names an assistant: the common run costs no extra query.
        let assistant = self
            .assistant_for_run(
                &tenant,
                &thread_id,
                request.assistant_id,
                request.assistant_version,
                &config,
            )
            .await?;
        self.check_priced(&tenant, &thread_id, assistant.as_ref(), &config)
            .await?;
        let strategy = request.strategy.unwrap_or(MultitaskStrategy::Enqueue);
        let create_thread = request.create_thread;
        let shown_id = thread_id.to_string();
        let created = self
            .commands
            .enqueue(NewRun {
                tenant,
                thread_id,
                query,
                config,
                strategy,
                idempotency_key: request.idempotency_key,
                create_thread,
                trace_context: request.trace.map(|t| t.to_stored()),
                assistant,
                cron_id: request.cron_id,
                flowchart: request.flowchart,
            })
            .await
            .map_err(|e| match e {
                // Say how to get the thread the client evidently expected.
                crate::store::StoreError::ThreadNotFound => Refusal::NotFound {
                    code: "thread_not_found",
                    detail: format!(
                        "thread `{shown_id}` not found: create it with `POST /v1/threads`, or post \
                         the run with `\"ifNotExists\": \"create\"` to create it on the fly"
                    ),
                },
                e @ (crate::store::StoreError::AssistantNotFound(_)
                | crate::store::StoreError::AssistantVersionNotFound { .. }) => {
                    super::assistants::unusable(e, "the thread's")
                }
                other => other.into(),
            })?;
        Ok((created.run, created.created))
    }

    /// Wait until a run completes, fails, is cancelled or suspends, then return it.
    ///
    /// # Errors
    /// 404 when the run is gone; 503 `unavailable` when the service shuts down first.
    pub async fn wait_for_run(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
    ) -> Result<Run, Refusal> {
        let mut rx = self.commands.bus().subscribe(tenant, thread_id);
        loop {
            let run = self
                .store
                .get_run(tenant, thread_id, run_id)
                .await?
                .ok_or_else(Refusal::run_not_found)?;
            if run.status.is_terminal() || run.status == RunStatus::Suspended {
                return Ok(run);
            }
            // Re-check on any observation of the run that may end it, or every second in case the
            // run is driven by another replica.
            let deadline = tokio::time::sleep(Duration::from_secs(1));
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = self.shutdown.cancelled() => {
                        return Err(Refusal::Unavailable("the service is shutting down".into()));
                    }
                    _ = &mut deadline => break,
                    msg = rx.recv() => match msg {
                        Ok(BusMsg::Obs(o)) if o.run_id == Some(run_id) && o.kind.ends_run_stream() => break,
                        Ok(BusMsg::Obs(_)) => {}
                        Ok(BusMsg::Wake(_) | BusMsg::ThreadDeleted) | Err(_) => break,
                    },
                }
            }
        }
    }
}
