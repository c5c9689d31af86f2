//! The webhook outbox: which webhook a run announces its end to (resolved once, when it is
//! enqueued), and the delivery loop's claim, outcome, listing and retry. The outbox row itself is
//! written by the very commit that ends or suspends a run, with SQL that lives below the store
//! (`fragments::outbox_insert`, used by both dialects' commits and the store's own cancels).
//!
//! Invariants: a delivery row exists if and only if the commit that moved its run to the
//! event's status committed (same statement or transaction); a pending row is sent by one
//! replica at a time (the claim moves `next_attempt_at` to the end of the claimer's lease and
//! counts the attempt; the outcome is fenced by `lease_owner` and `attempts`, so a replica whose
//! lease ran out writes nothing).

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::fragments::lease_secs;
use super::rows;
use super::sql::{Arg, Dialect, Row, q};
use super::sql_store::SqlStore;
use super::{PageCursor, StoreError, StoreResult};
use crate::model::{
    AgentConfig, AssistantId, AssistantRef, DeliveryStatus, Run, ThreadId, WebhookDelivery,
    WebhookEvent,
};

/// A JSON config column's `webhook` field, as SQL for `d`.
pub(super) fn config_webhook(d: Dialect, col: &str) -> String {
    match d {
        Dialect::Postgres => format!("{col} -> 'webhook'"),
        Dialect::Sqlite => format!("json_extract({col}, '$.webhook')"),
    }
}

/// What an enqueue reads of its assistant version for the run's webhook.
#[derive(Debug, Clone, Default)]
pub(super) struct VersionHook {
    /// The version's `config.webhook`, as stored.
    pub webhook: Option<Value>,
    /// The version locks `webhook`.
    pub locked: bool,
}

/// The webhook a run being enqueued announces to: the run's own (`config.webhook`), else its
/// thread's, else its assistant version's — unless that version locks `webhook`, when it is the
/// version's (the enqueue refused a run that sets it). `None`: no webhook. Read with the rows the
/// enqueue locks anyway, so it costs no statement of its own.
pub(super) fn resolve_for_run(
    run: &AgentConfig,
    thread: Option<Value>,
    version: Option<VersionHook>,
) -> StoreResult<Option<Value>> {
    if let Some(w) = &run.webhook {
        return Ok(Some(rows::to_json(w)?));
    }
    let version = version.unwrap_or_default();
    Ok(if version.locked {
        version.webhook
    } else {
        thread.or(version.webhook)
    })
}

/// A run from its outbox snapshot (the run row as the ending commit left it, as JSON).
fn run_from_snapshot(v: &Value) -> StoreResult<Run> {
    let bad = |what: &str| StoreError::Decode(format!("webhook run snapshot: {what}"));
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let need = |k: &str| text(k).ok_or_else(|| bad(&format!("no `{k}`")));
    let int = |k: &str| v.get(k).and_then(Value::as_i64);
    let ts = |k: &str| text(k).map(|s| rows::parse_ts_text(&s)).transpose();
    let json = |k: &str| match v.get(k) {
        None | Some(Value::Null) => None,
        // Some drivers keep a JSON column as its text.
        Some(Value::String(s)) => serde_json::from_str(s).ok(),
        Some(other) => Some(other.clone()),
    };
    let typed =
        |k: &str| -> StoreResult<Value> { json(k).ok_or_else(|| bad(&format!("no `{k}`"))) };
    fn parse<T: std::str::FromStr<Err = String>>(k: &str, s: String) -> StoreResult<T> {
        s.parse()
            .map_err(|e: String| StoreError::Decode(format!("webhook run snapshot: {k}: {e}")))
    }
    let uuid = |k: &str, s: String| Uuid::parse_str(&s).map_err(|e| bad(&format!("{k}: {e}")));
    Ok(Run {
        run_id: uuid("run_id", need("run_id")?)?,
        thread_id: ThreadId::from_stored(need("thread_id")?),
        tenant: need("tenant")?,
        status: parse("status", need("status")?)?,
        // A snapshot made before runs had kinds is an agent run's.
        kind: text("kind")
            .map(|s| parse("kind", s))
            .transpose()?
            .unwrap_or_default(),
        query: need("query")?,
        flowchart: None,
        config: serde_json::from_value(typed("config")?).map_err(|e| bad(&e.to_string()))?,
        assistant: match (text("assistant_id"), int("assistant_version")) {
            (Some(id), Some(version)) => Some(AssistantRef {
                assistant_id: AssistantId::from_stored(id),
                version,
            }),
            _ => None,
        },
        multitask_strategy: parse("multitask_strategy", need("multitask_strategy")?)?,
        idempotency_key: text("idempotency_key"),
        created_at: ts("created_at")?.ok_or_else(|| bad("no `created_at`"))?,
        started_at: ts("started_at")?,
        ended_at: ts("ended_at")?,
        usage: serde_json::from_value(typed("usage")?).map_err(|e| bad(&e.to_string()))?,
        error: json("error")
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| bad(&e.to_string()))?,
        final_response: json("final_response"),
        suspension: None,
        attempt: int("attempt").unwrap_or_default(),
        cron_id: text("cron_id").map(|s| uuid("cron_id", s)).transpose()?,
        phase: text("phase")
            .map(|s| parse("phase", s))
            .transpose()?
            .unwrap_or_default(),
        cancel_requested: match v.get("cancel_requested") {
            Some(Value::Bool(b)) => *b,
            Some(n) => n.as_i64().unwrap_or(0) != 0,
            None => false,
        },
        start_seq: int("start_seq").unwrap_or_default(),
        trace_context: text("trace_context"),
    })
}

/// A delivery the loop claimed: the row, the run as the event left it, and the body frozen by
/// an earlier attempt (if one got that far).
#[derive(Debug, Clone)]
pub struct ClaimedDelivery {
    pub delivery: WebhookDelivery,
    pub tenant: String,
    pub run: Run,
    /// The suspension a `run.suspended` event is about.
    pub suspension_id: Option<Uuid>,
    pub body: Option<String>,
    /// Attempts of this round, this one included: the delivery's attempts since it was made or
    /// last retried by hand (each round gets `PES_WEBHOOK_MAX_ATTEMPTS`).
    pub round_attempts: i64,
}

/// What one attempt came to.
#[derive(Debug, Clone)]
pub enum DeliveryOutcome {
    /// 2xx.
    Delivered { status_code: i64 },
    /// Try again after `after`.
    Retry {
        after: Duration,
        error: String,
        status_code: Option<i64>,
    },
    /// Give up (410, the last attempt, a refused URL).
    Failed {
        error: String,
        status_code: Option<i64>,
    },
}

/// Which of a tenant's deliveries [`SqlStore::list_deliveries`] lists.
#[derive(Debug, Clone, Default)]
pub struct DeliveryFilter {
    pub run_id: Option<Uuid>,
    pub status: Option<DeliveryStatus>,
}

fn delivery_from_row(r: &Row) -> StoreResult<WebhookDelivery> {
    let status: DeliveryStatus = r.enumeration("status")?;
    Ok(WebhookDelivery {
        delivery_id: r.uuid("delivery_id")?,
        run_id: r.uuid("run_id")?,
        thread_id: ThreadId::from_stored(r.text("thread_id")?),
        event: r.enumeration::<WebhookEvent>("event")?,
        url: r.text("url")?,
        status,
        attempts: r.int("attempts")?,
        next_attempt_at: match status {
            DeliveryStatus::Pending => Some(r.ts("next_attempt_at")?),
            _ => None,
        },
        last_error: r.opt_text("last_error")?,
        last_status_code: r.opt_int("last_status_code")?,
        created_at: r.ts("created_at")?,
        last_attempt_at: r.opt_ts("last_attempt_at")?,
        delivered_at: r.opt_ts("delivered_at")?,
    })
}

impl SqlStore {
    /// Claim up to `max` due deliveries for `owner`: each attempt is counted and the row is not
    /// due again until `lease` has passed (another replica then takes it over).
    ///
    /// # Errors
    /// [`StoreError::Database`]; [`StoreError::Decode`] for a row that cannot be read.
    pub async fn claim_deliveries(
        &self,
        owner: &str,
        lease: Duration,
        max: usize,
    ) -> StoreResult<Vec<ClaimedDelivery>> {
        let skip = match self.dialect() {
            Dialect::Postgres => "FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        };
        let sql = format!(
            "UPDATE webhook_deliveries SET lease_owner = $1, next_attempt_at = {{later 2}}, \
               attempts = attempts + 1, last_attempt_at = {{now}} \
             WHERE delivery_id IN (SELECT delivery_id FROM webhook_deliveries \
               WHERE status = 'pending' AND next_attempt_at <= {{now}} \
               ORDER BY next_attempt_at LIMIT $3 {skip}) \
             RETURNING *"
        );
        let mut conn = self.write_one().await?;
        let found = conn
            .all(
                q(sql)
                    .bind(owner)
                    .bind(lease_secs(lease))
                    .bind(i64::try_from(max).unwrap_or(i64::MAX)),
            )
            .await?;
        found
            .iter()
            .map(|r| {
                Ok(ClaimedDelivery {
                    delivery: delivery_from_row(r)?,
                    tenant: r.text("tenant")?,
                    run: run_from_snapshot(&r.json("run_snapshot")?)?,
                    suspension_id: r.opt_uuid("suspension_id")?,
                    body: r.opt_text("body")?,
                    round_attempts: r.int("attempts")? - r.int("round_start")?,
                })
            })
            .collect()
    }

    /// Record an attempt's outcome, fenced by the claim: false when the lease was lost (another
    /// replica took the delivery over). See [`SqlStore::finish_deliveries`].
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn finish_delivery(
        &self,
        claimed: &ClaimedDelivery,
        owner: &str,
        body: &str,
        outcome: &DeliveryOutcome,
    ) -> StoreResult<bool> {
        let one = [(claimed, body, outcome)];
        Ok(self.finish_deliveries(owner, &one).await? == 1)
    }

    /// Record the outcomes of one round's attempts in one statement, each fenced by its claim
    /// (`owner` and the attempt count); how many were recorded (the others' leases were lost).
    /// The body is kept for a delivery that will be sent again (pending or failed), so every
    /// attempt sends the same bytes; a delivered one does not need it.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn finish_deliveries(
        &self,
        owner: &str,
        done: &[(&ClaimedDelivery, &str, &DeliveryOutcome)],
    ) -> StoreResult<usize> {
        if done.is_empty() {
            return Ok(0);
        }
        let rows: Vec<Value> = done
            .iter()
            .map(|(c, body, outcome)| {
                let (status, after, error, code) = match outcome {
                    DeliveryOutcome::Delivered { status_code } => {
                        (DeliveryStatus::Delivered, 0.0, None, Some(*status_code))
                    }
                    DeliveryOutcome::Retry {
                        after,
                        error,
                        status_code,
                    } => (
                        DeliveryStatus::Pending,
                        after.as_secs_f64(),
                        Some(error.clone()),
                        *status_code,
                    ),
                    DeliveryOutcome::Failed { error, status_code } => (
                        DeliveryStatus::Failed,
                        0.0,
                        Some(error.clone()),
                        *status_code,
                    ),
                };
                let keep = (status != DeliveryStatus::Delivered).then_some(*body);
                serde_json::json!({
                    "id": c.delivery.delivery_id.hyphenated().to_string(),
                    "attempts": c.delivery.attempts,
                    "status": status.as_str(),
                    "after": after,
                    "error": error,
                    "code": code,
                    "body": keep,
                })
            })
            .collect();
        let source = match self.dialect() {
            Dialect::Postgres => {
                "jsonb_to_recordset($2::jsonb) AS x(id uuid, attempts bigint, \
                 status text, after float8, error text, code bigint, body text)"
            }
            Dialect::Sqlite => {
                "(SELECT json_extract(value, '$.id') AS id, \
                 json_extract(value, '$.attempts') AS attempts, \
                 json_extract(value, '$.status') AS status, \
                 json_extract(value, '$.after') AS after, \
                 json_extract(value, '$.error') AS error, \
                 json_extract(value, '$.code') AS code, \
                 json_extract(value, '$.body') AS body FROM json_each($2)) AS x"
            }
        };
        let later = match self.dialect() {
            Dialect::Postgres => "now() + make_interval(secs => x.after)",
            Dialect::Sqlite => {
                "(strftime('%Y-%m-%dT%H:%M:%f', 'now', x.after || ' seconds') || '000Z')"
            }
        };
        let sql = format!(
            "UPDATE webhook_deliveries SET status = x.status, \
               next_attempt_at = CASE WHEN x.status = 'pending' THEN {later} \
                 ELSE webhook_deliveries.next_attempt_at END, \
               lease_owner = NULL, \
               last_error = COALESCE(x.error, webhook_deliveries.last_error), \
               last_status_code = x.code, \
               delivered_at = CASE WHEN x.status = 'delivered' THEN {{now}} END, \
               body = COALESCE(webhook_deliveries.body, x.body) \
             FROM {source} \
             WHERE webhook_deliveries.delivery_id = x.id AND webhook_deliveries.lease_owner = $1 \
               AND webhook_deliveries.attempts = x.attempts \
               AND webhook_deliveries.status = 'pending'"
        );
        let mut conn = self.write_one().await?;
        let n = conn
            .exec(q(sql).bind(owner).bind(Value::Array(rows)))
            .await?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// A tenant's deliveries, newest first, `filter`ed, after `cursor`.
    ///
    /// # Errors
    /// [`StoreError::Database`]; [`StoreError::Decode`] for a cursor whose id is not a UUID.
    pub async fn list_deliveries(
        &self,
        tenant: &str,
        filter: &DeliveryFilter,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Vec<WebhookDelivery>> {
        let mut sql = String::from("SELECT * FROM webhook_deliveries WHERE tenant = $1");
        let mut stmt_args: Vec<Arg> = vec![tenant.into()];
        let next = |args: &mut Vec<Arg>, a: Arg| {
            args.push(a);
            format!("${}", args.len())
        };
        if let Some(run) = filter.run_id {
            let p = next(&mut stmt_args, run.into());
            sql.push_str(&format!(" AND run_id = {p}"));
        }
        if let Some(status) = filter.status {
            let p = next(&mut stmt_args, status.as_str().into());
            sql.push_str(&format!(" AND status = {p}"));
        }
        if let Some(c) = cursor {
            let at = next(&mut stmt_args, c.created_at.into());
            let id = next(&mut stmt_args, rows::cursor_uuid(&c.id)?.into());
            sql.push_str(&format!(" AND (created_at, delivery_id) < ({at}, {id})"));
        }
        let lim = next(&mut stmt_args, rows::sql_limit(limit).into());
        sql.push_str(&format!(
            " ORDER BY created_at DESC, delivery_id DESC LIMIT {lim}"
        ));
        let stmt = stmt_args.into_iter().fold(q(sql), super::sql::Q::bind);
        let found = self.read().await?.all(stmt).await?;
        found.iter().map(delivery_from_row).collect()
    }

    /// Send a failed delivery again: it is pending at once, for a new round of attempts; its
    /// `attempts` go on counting every attempt of its life.
    /// `None` when the tenant has no such delivery; `Some((delivery, false))` when it is not
    /// failed (nothing changed).
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn retry_delivery(
        &self,
        tenant: &str,
        delivery_id: Uuid,
    ) -> StoreResult<Option<(WebhookDelivery, bool)>> {
        let mut conn = self.write_one().await?;
        let retried = conn
            .opt(
                q(
                    "UPDATE webhook_deliveries SET status = 'pending', round_start = attempts, \
                     next_attempt_at = {now}, lease_owner = NULL \
                   WHERE tenant = $1 AND delivery_id = $2 AND status = 'failed' RETURNING *",
                )
                .bind(tenant)
                .bind(delivery_id),
            )
            .await?;
        if let Some(row) = retried {
            self.webhook_written();
            return Ok(Some((delivery_from_row(&row)?, true)));
        }
        let current = conn
            .opt(
                q("SELECT * FROM webhook_deliveries WHERE tenant = $1 AND delivery_id = $2")
                    .bind(tenant)
                    .bind(delivery_id),
            )
            .await?;
        current
            .map(|r| Ok((delivery_from_row(&r)?, false)))
            .transpose()
    }

    /// Tell this process's delivery loop that a commit may have written a delivery.
    pub(crate) fn webhook_written(&self) {
        self.outbox.notify_one();
    }

    /// Resolves at the next commit of this process that may have written a delivery (or at once
    /// for one made while nobody waited): what the delivery loop sleeps on.
    pub async fn webhook_written_wait(&self) {
        self.outbox.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_reads_back_as_the_run() {
        let v = serde_json::json!({
            "run_id": "0190b7c1-0000-7000-8000-000000000001", "tenant": "t", "thread_id": "th",
            "status": "completed", "query": "q", "config": "{}", "assistant_id": null,
            "assistant_version": null, "multitask_strategy": "enqueue", "idempotency_key": "k",
            "created_at": "2026-01-02T03:04:05.123456Z",
            "started_at": "2026-01-02T03:04:05.5+00:00", "ended_at": null,
            "usage": {"promptTokens": 1, "completionTokens": 2, "totalTokens": 3, "llmCalls": 1},
            "error": null, "final_response": {"answer": "x"}, "attempt": 1, "phase": "done",
            "cancel_requested": 0, "start_seq": 3, "trace_context": null, "cron_id": null
        });
        let run = run_from_snapshot(&v).unwrap();
        assert_eq!(run.status, crate::model::RunStatus::Completed);
        assert_eq!(run.usage.total_tokens, 3);
        assert_eq!(run.idempotency_key.as_deref(), Some("k"));
        assert_eq!(run.final_response, Some(serde_json::json!({"answer": "x"})));
        assert!(run.started_at.is_some() && run.ended_at.is_none());
    }
}
