//! Crons as use cases: creating, reading, changing and deleting a tenant's crons
//! (the schedule and time zone checked with [`Schedule`], the query and config as a run's), and
//! the scheduler every replica runs ([`run_scheduler`]), which turns due ticks into runs through
//! the same enqueue as every other door.
//!
//! One run per tick whatever the number of replicas: the store hands a due cron to one replica
//! at a time (a lease), and the tick's run is enqueued under the idempotency key that names the
//! tick (`cron:<cronId>:<tick>`), so a tick enqueued twice (a replica that died before it moved
//! the cron on) is still one run. A tick reached more than `PES_CRON_MISSED_AFTER_SECONDS` late
//! was missed: `onMissed: run_once` makes one run for the latest missed tick, `skip` none.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use super::{RunRequest, UseCases};
use crate::model::{
    AgentConfig, AssistantId, Cron, MultitaskStrategy, OnMissed, Schedule, ScheduleError, ThreadId,
};
use crate::problem::Refusal;
use crate::store::{CronDraft, PageCursor, StoreError, TickRecord};

/// Crons one replica claims at once.
const TICK_BATCH: usize = 32;

/// How long a claim holds a cron: enqueueing its run takes far less; past it another replica
/// takes the tick over.
const TICK_LEASE: Duration = Duration::from_secs(30);

/// A cron as a door asks for it (create), once parsed.
#[derive(Debug, Clone, Default)]
pub struct CronInput {
    pub thread_id: Option<ThreadId>,
    pub assistant_id: Option<AssistantId>,
    pub schedule: String,
    /// Default `UTC`.
    pub timezone: Option<String>,
    pub query: String,
    pub config: AgentConfig,
    pub multitask_strategy: Option<MultitaskStrategy>,
    /// Default true.
    pub enabled: Option<bool>,
    /// Default `run_once`.
    pub on_missed: Option<OnMissed>,
}

/// What an update changes; `None` keeps the field.
#[derive(Debug, Clone, Default)]
pub struct CronPatch {
    pub schedule: Option<String>,
    pub timezone: Option<String>,
    pub query: Option<String>,
    pub config: Option<AgentConfig>,
    pub multitask_strategy: Option<MultitaskStrategy>,
    pub enabled: Option<bool>,
    pub on_missed: Option<OnMissed>,
}

fn cron_not_found(id: Uuid) -> Refusal {
    Refusal::NotFound {
        code: "cron_not_found",
        detail: format!("cron `{id}` not found"),
    }
}

impl UseCases {
    /// The schedule in its zone, or 422 naming what is wrong.
    fn schedule(&self, schedule: &str, timezone: &str) -> Result<Schedule, Refusal> {
        Schedule::try_new(schedule, timezone, self.config.cron_seconds).map_err(|e| match e {
            ScheduleError::FieldCount { count: 6, .. } if !self.config.cron_seconds => {
                Refusal::Validation(format!(
                    "{e} (a leading seconds field needs PES_CRON_SECONDS=true)"
                ))
            }
            e => Refusal::Validation(e.to_string()),
        })
    }

    /// The query and config of each tick's run, checked as a run's are.
    async fn check_tick_run(
        &self,
        tenant: &str,
        query: &str,
        config: &AgentConfig,
    ) -> Result<(), Refusal> {
        let query = query.trim();
        if query.is_empty() {
            return Err(Refusal::Validation("query must not be empty".into()));
        }
        if query.chars().count() > self.config.max_query_chars {
            return Err(Refusal::Validation(format!(
                "query is longer than {} characters (PES_MAX_QUERY_CHARS)",
                self.config.max_query_chars
            )));
        }
        self.check_config(tenant, config).await
    }

    /// Create a cron; its first tick is the schedule's next after now.
    ///
    /// # Errors
    /// 422 naming a bad schedule, time zone, query or config, or a thread or assistant that
    /// does not exist; 429 `quota_exceeded` past `PES_TENANT_MAX_CRONS`.
    pub async fn create_cron(&self, tenant: &str, input: CronInput) -> Result<Cron, Refusal> {
        let timezone = input.timezone.unwrap_or_else(|| "UTC".to_owned());
        let schedule = self.schedule(&input.schedule, &timezone)?;
        self.check_tick_run(tenant, &input.query, &input.config)
            .await?;
        if let Some(a) = &input.assistant_id {
            self.store
                .get_assistant(tenant, a, None)
                .await
                .map_err(|e| super::assistants::unusable(e, "the cron's"))?;
        }
        let next = schedule
            .next_after(Utc::now())
            .ok_or_else(|| Refusal::Validation("the schedule has no next tick".into()))?;
        let draft = CronDraft {
            thread_id: input.thread_id.clone(),
            assistant_id: input.assistant_id,
            schedule: input.schedule.trim().to_owned(),
            timezone,
            query: input.query.trim().to_owned(),
            config: input.config,
            multitask_strategy: input.multitask_strategy,
            enabled: input.enabled.unwrap_or(true),
            on_missed: input.on_missed.unwrap_or_default(),
            next_run_at: Some(next),
        };
        let max = self.config.tenant_max_crons;
        match self.store.create_cron(tenant, &draft, max).await {
            Ok(Some(c)) => Ok(c),
            Ok(None) => Err(Refusal::QuotaExceeded {
                detail: format!(
                    "the tenant has {max} crons, its quota (PES_TENANT_MAX_CRONS): delete one \
                     to create another"
                ),
                retry_after_seconds: 60,
            }),
            Err(StoreError::ThreadNotFound) => Err(Refusal::Unprocessable {
                code: "thread_not_found",
                detail: format!(
                    "threadId `{}` names no thread of the tenant: create it first, or omit \
                     threadId to run each tick on a new thread",
                    input.thread_id.map(|t| t.to_string()).unwrap_or_default()
                ),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// The tenant's cron `id`.
    ///
    /// # Errors
    /// 404 `cron_not_found`.
    pub async fn get_cron(&self, tenant: &str, id: Uuid) -> Result<Cron, Refusal> {
        self.store
            .get_cron(tenant, id)
            .await?
            .ok_or_else(|| cron_not_found(id))
    }

    /// The tenant's crons (of one thread, when given), newest first.
    ///
    /// # Errors
    /// When the store fails.
    pub async fn list_crons(
        &self,
        tenant: &str,
        thread_id: Option<&ThreadId>,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> Result<Vec<Cron>, Refusal> {
        Ok(self
            .store
            .list_crons(tenant, thread_id, limit, cursor)
            .await?)
    }

    /// Change a cron. A new schedule or time zone, or enabling it, sets its next tick from now
    /// (ticks that passed while it was disabled are not missed ticks: they never ran).
    ///
    /// # Errors
    /// 404 `cron_not_found`; 422 as for a create.
    pub async fn update_cron(
        &self,
        tenant: &str,
        id: Uuid,
        patch: CronPatch,
    ) -> Result<Cron, Refusal> {
        let cur = self.get_cron(tenant, id).await?;
        let schedule_text = patch.schedule.unwrap_or(cur.schedule.clone());
        let timezone = patch.timezone.unwrap_or(cur.timezone.clone());
        let retimed = schedule_text.trim() != cur.schedule || timezone != cur.timezone;
        let schedule = if retimed {
            Some(self.schedule(&schedule_text, &timezone)?)
        } else {
            None
        };
        // What a client did not change is not checked again (a cron whose tool was since
        // removed can still be disabled); its ticks say why they make no run.
        let rewritten = patch.query.is_some() || patch.config.is_some();
        let query = patch.query.unwrap_or(cur.query.clone());
        let config = patch.config.unwrap_or(cur.config.clone());
        if rewritten {
            self.check_tick_run(tenant, &query, &config).await?;
        }
        let enabled = patch.enabled.unwrap_or(cur.enabled);
        let next_run_at = if retimed || (enabled && !cur.enabled) {
            let s = match schedule {
                Some(s) => s,
                // A schedule stored earlier parses (seconds included if it has them).
                None => Schedule::try_new(&cur.schedule, &cur.timezone, true)
                    .map_err(|e| Refusal::Validation(e.to_string()))?,
            };
            s.next_after(Utc::now())
        } else {
            None
        };
        let draft = CronDraft {
            thread_id: cur.thread_id,
            assistant_id: cur.assistant_id,
            schedule: schedule_text.trim().to_owned(),
            timezone,
            query: query.trim().to_owned(),
            config,
            multitask_strategy: patch.multitask_strategy.or(cur.multitask_strategy),
            enabled,
            on_missed: patch.on_missed.unwrap_or(cur.on_missed),
            next_run_at,
        };
        self.store
            .update_cron(tenant, id, &draft)
            .await?
            .ok_or_else(|| cron_not_found(id))
    }

    /// Delete a cron; runs it made are left as they are.
    ///
    /// # Errors
    /// 404 `cron_not_found`.
    pub async fn delete_cron(&self, tenant: &str, id: Uuid) -> Result<(), Refusal> {
        if self.store.delete_cron(tenant, id).await? {
            Ok(())
        } else {
            Err(cron_not_found(id))
        }
    }

    /// One round of the scheduler: claim the due crons (as `owner`), run their ticks, move them
    /// on. How many were claimed.
    ///
    /// # Errors
    /// The claim failed.
    pub async fn tick_due_crons(&self, owner: &str) -> Result<usize, StoreError> {
        let (due, now) = self
            .store
            .claim_due_crons(owner, TICK_LEASE, TICK_BATCH)
            .await?;
        let n = due.len();
        for cron in due {
            self.tick(cron, now, owner).await;
        }
        Ok(n)
    }

    /// Run one claimed cron's due tick (or its catch-up, or nothing when it was missed and
    /// skips), then move it on.
    async fn tick(&self, cron: Cron, now: DateTime<Utc>, owner: &str) {
        let due = cron.next_run_at;
        let schedule = match Schedule::try_new(&cron.schedule, &cron.timezone, true) {
            Ok(s) => s,
            Err(e) => {
                // Only a schedule the parser no longer takes (after an upgrade): look again in
                // a day, and say why.
                let record = TickRecord {
                    error: Some(e.to_string()),
                    ..TickRecord::default()
                };
                let later = now + chrono::Duration::days(1);
                let _ = self.store.finish_tick(&cron, owner, later, &record).await;
                return;
            }
        };
        let late = (now - due).to_std().unwrap_or_default();
        let missed = late > Duration::from_secs(self.config.cron_missed_after_seconds);
        let tick = match (missed, cron.on_missed) {
            (false, _) => Some(due),
            (true, OnMissed::RunOnce) => schedule.latest_at_or_before(now).or(Some(due)),
            (true, OnMissed::Skip) => None,
        };
        let next = if missed {
            schedule.next_after(now)
        } else {
            schedule.next_after(due)
        }
        .unwrap_or(now + chrono::Duration::days(1));
        let record = match tick {
            Some(t) => self.enqueue_tick(&cron, t).await,
            None => {
                info!(cron_id = %cron.cron_id, missed_tick = %due, "cron tick missed; onMissed is skip");
                TickRecord::default()
            }
        };
        match self.store.finish_tick(&cron, owner, next, &record).await {
            Ok(true) => {}
            Ok(false) => warn!(cron_id = %cron.cron_id, "cron lease lost before it moved on"),
            Err(e) => warn!(cron_id = %cron.cron_id, error = %e, "moving a cron on failed"),
        }
    }

    /// Post the tick's run: on the cron's thread (with the cron's multitask strategy) or on the
    /// tick's own new thread, keyed by the tick.
    async fn enqueue_tick(&self, cron: &Cron, tick: DateTime<Utc>) -> TickRecord {
        let thread = cron.tick_thread(tick);
        let request = RunRequest {
            query: cron.query.clone(),
            config: cron.config.clone(),
            strategy: cron.multitask_strategy,
            idempotency_key: Some(cron.tick_key(tick)),
            create_thread: cron.thread_id.is_none(),
            assistant_id: cron.assistant_id.clone(),
            cron_id: Some(cron.cron_id),
            ..RunRequest::default()
        };
        match self
            .enqueue(cron.tenant.clone(), thread.clone(), request)
            .await
        {
            Ok((run, created)) => {
                info!(cron_id = %cron.cron_id, %tick, run_id = %run.run_id, thread_id = %thread, created, "cron ticked");
                TickRecord {
                    tick: Some(tick),
                    run_id: Some(run.run_id),
                    thread_id: Some(thread),
                    error: None,
                }
            }
            Err(e) => {
                warn!(cron_id = %cron.cron_id, %tick, error = %e, "a cron tick made no run");
                TickRecord {
                    tick: Some(tick),
                    error: Some(e.to_string()),
                    ..TickRecord::default()
                }
            }
        }
    }
}

/// The scheduler of this process, until `stop` fires: every `poll`, claim the due crons and run
/// their ticks (at once again while full batches come back).
pub async fn run_scheduler(
    cases: UseCases,
    owner: String,
    poll: Duration,
    stop: CancellationToken,
) {
    loop {
        match cases.tick_due_crons(&owner).await {
            Ok(n) if n >= TICK_BATCH => continue,
            Ok(_) => {}
            Err(e) => warn!(error = %e, "claiming due crons failed; retrying"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
        }
    }
}
