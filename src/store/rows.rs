//! Row mapping, written once for both backends: how a [`Row`] reads one column (one reader per
//! kind of column; only where Postgres and SQLite store a value differently does it say how each
//! decodes it), and one `*_from_row` function per domain type built from those readers. Bad
//! stored data becomes [`StoreError::Decode`], never a panic.
//!
//! Also here: the fixed-width SQLite timestamp format, JSON encoding helpers and the observations
//! the store itself writes (`RUN_CANCELLED`, `AGENT_RESUMED`).

use crate::model::payloads::{AgentResumedContent, CancelReason, RunCancelledContent};
use std::str::FromStr;

use chrono::{DateTime, SubsecRound, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sqlx::Row as _;
use sqlx::{Postgres, Sqlite};
use uuid::Uuid;

use super::sql::Row;
use super::{StoreError, StoreResult};
use crate::model::{
    AgentStateRow, AssistantId, AssistantRef, ItemId, Message, NewObservation, Observation,
    ResumeDecision, Run, RunStatus, Suspension, SuspensionStatus, Thread, ThreadId, TodoItem,
};

pub(crate) use super::sql::{parse_ts_text, ts_text};

/// A timestamp at stored precision, so what a caller passed in equals what it reads back.
pub(crate) fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    t.trunc_subsecs(6)
}

/// Serialize a value for a JSON column.
pub(crate) fn to_json<T: Serialize + ?Sized>(v: &T) -> StoreResult<Value> {
    serde_json::to_value(v).map_err(|e| StoreError::Decode(format!("cannot encode JSON: {e}")))
}

/// Serialize an optional value for a nullable JSON column.
pub(crate) fn opt_json<T: Serialize>(v: Option<&T>) -> StoreResult<Option<Value>> {
    v.map(to_json).transpose()
}

fn parse_enum<T: FromStr<Err = String>>(col: &str, s: &str) -> StoreResult<T> {
    s.parse().map_err(|e: String| decode_err(col, e))
}

fn decode_err(col: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Decode(format!("column {col}: {e}"))
}

/// A column that must not be NULL.
fn required<T>(col: &str, v: Option<T>) -> StoreResult<T> {
    v.ok_or_else(|| decode_err(col, "unexpected NULL"))
}

/// A value both backends decode natively (text, integers, booleans, floats).
trait Native:
    for<'r> sqlx::Decode<'r, Postgres>
    + sqlx::Type<Postgres>
    + for<'r> sqlx::Decode<'r, Sqlite>
    + sqlx::Type<Sqlite>
{
}

impl<T> Native for T where
    T: for<'r> sqlx::Decode<'r, Postgres>
        + sqlx::Type<Postgres>
        + for<'r> sqlx::Decode<'r, Sqlite>
        + sqlx::Type<Sqlite>
{
}

/// Reading one column of a row, once for both backends: where they store a value alike (text,
/// integers, booleans) one read serves both; where they differ (Postgres has native `UUID`,
/// `TIMESTAMPTZ` and `JSONB`; SQLite keeps them as text) the nullable reader says how each
/// decodes it, and the required reader is that plus "not NULL". The `*_from_row` functions below
/// build the domain types from these. Bad stored data becomes [`StoreError::Decode`].
impl Row {
    fn native<T: Native>(&self, col: &str) -> StoreResult<T> {
        match self {
            Row::Pg(r) => r.try_get(col),
            Row::Lite(r) => r.try_get(col),
        }
        .map_err(|e| decode_err(col, e))
    }

    /// A nullable column SQLite keeps as text, parsed by `parse`; Postgres decodes it natively.
    fn parsed<T, E>(
        &self,
        col: &str,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> StoreResult<Option<T>>
    where
        T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
        E: std::fmt::Display,
    {
        match self {
            Row::Pg(r) => r.try_get(col).map_err(|e| decode_err(col, e)),
            Row::Lite(_) => self
                .opt_text(col)?
                .map(|s| parse(&s).map_err(|e| decode_err(col, e)))
                .transpose(),
        }
    }

    pub(crate) fn text(&self, col: &str) -> StoreResult<String> {
        self.native(col)
    }
    pub(crate) fn opt_text(&self, col: &str) -> StoreResult<Option<String>> {
        self.native(col)
    }
    pub(crate) fn int(&self, col: &str) -> StoreResult<i64> {
        self.native(col)
    }
    pub(crate) fn opt_int(&self, col: &str) -> StoreResult<Option<i64>> {
        self.native(col)
    }
    pub(crate) fn boolean(&self, col: &str) -> StoreResult<bool> {
        self.native(col)
    }
    /// A nullable float column (only computed columns are floats).
    pub(crate) fn opt_float(&self, col: &str) -> StoreResult<Option<f64>> {
        self.native(col)
    }
    /// A nullable bytes column (`BYTEA` / `BLOB`).
    pub(crate) fn opt_bytes(&self, col: &str) -> StoreResult<Option<Vec<u8>>> {
        self.native(col)
    }
    pub(crate) fn opt_uuid(&self, col: &str) -> StoreResult<Option<Uuid>> {
        self.parsed(col, Uuid::parse_str)
    }
    pub(crate) fn uuid(&self, col: &str) -> StoreResult<Uuid> {
        required(col, self.opt_uuid(col)?)
    }
    pub(crate) fn opt_ts(&self, col: &str) -> StoreResult<Option<DateTime<Utc>>> {
        self.parsed(col, parse_ts_text)
    }
    pub(crate) fn ts(&self, col: &str) -> StoreResult<DateTime<Utc>> {
        required(col, self.opt_ts(col)?)
    }
    pub(crate) fn opt_json(&self, col: &str) -> StoreResult<Option<Value>> {
        self.parsed(col, |s| serde_json::from_str(s))
    }
    pub(crate) fn json(&self, col: &str) -> StoreResult<Value> {
        required(col, self.opt_json(col)?)
    }
    /// A JSON column decoded into a type.
    pub(crate) fn typed<T: DeserializeOwned>(&self, col: &str) -> StoreResult<T> {
        required(col, self.opt_typed(col)?)
    }
    /// A nullable JSON column decoded into a type, straight from the column's text (not through
    /// a `Value`, which allocates a map for every object only to take it apart again: on a
    /// state of a thousand items, half the time of reading it).
    pub(crate) fn opt_typed<T: DeserializeOwned>(&self, col: &str) -> StoreResult<Option<T>> {
        match self {
            Row::Pg(r) => r
                .try_get::<Option<sqlx::types::Json<T>>, _>(col)
                .map(|v| v.map(|j| j.0))
                .map_err(|e| decode_err(col, e)),
            Row::Lite(_) => self
                .opt_text(col)?
                .map(|s| serde_json::from_str(&s).map_err(|e| decode_err(col, e)))
                .transpose(),
        }
    }
    /// A text column holding one of a string enum's values.
    pub(crate) fn enumeration<T: FromStr<Err = String>>(&self, col: &str) -> StoreResult<T> {
        parse_enum(col, &self.text(col)?)
    }
}

/// A `threads` row plus a derived `status` column.
pub(crate) fn thread_from_row(r: &Row) -> StoreResult<Thread> {
    Ok(Thread {
        thread_id: ThreadId::from_stored(r.text("thread_id")?),
        tenant: r.text("tenant")?,
        status: r.enumeration("status")?,
        metadata: r.json("metadata")?,
        config: r.typed("config")?,
        assistant_id: r.opt_text("assistant_id")?.map(AssistantId::from_stored),
        assistant_version: r.opt_int("assistant_version")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

/// An `agent_state` row.
pub(crate) fn agent_state_from_row(r: &Row) -> StoreResult<AgentStateRow> {
    Ok(AgentStateRow {
        intent: r.opt_text("intent")?,
        title: r.opt_text("title")?,
        plan: r.opt_text("plan")?,
        current_step_id: r.opt_text("current_step_id")?,
        version: r.int("version")?,
    })
}

/// A `todo_items` row.
pub(crate) fn item_from_row(r: &Row) -> StoreResult<TodoItem> {
    let attempts = r.int("attempts")?;
    Ok(TodoItem {
        id: ItemId::from_stored(r.text("item_id")?),
        position: r.int("position")?,
        description: r.text("description")?,
        status: r.enumeration("status")?,
        dependencies: r.typed("dependencies")?,
        step_type: r.enumeration("step_type")?,
        required_tools: r.typed("required_tools")?,
        tool_validation_mode: r.enumeration("tool_validation_mode")?,
        validation_status: r.enumeration("validation_status")?,
        expected_outcome: r.opt_text("expected_outcome")?,
        tool_calls: r.typed("tool_calls")?,
        actual_tool_calls: r.typed("actual_tool_calls")?,
        tool_results: r.typed("tool_results")?,
        thoughts: r.typed("thoughts")?,
        result: r.opt_text("result")?,
        error: r.opt_typed("error")?,
        attempts: u32::try_from(attempts).map_err(|e| decode_err("attempts", e))?,
        usage: r.typed("usage")?,
        conversation: r.typed("conversation")?,
        run_id: r.opt_uuid("run_id")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
        started_at: r.opt_ts("started_at")?,
        completed_at: r.opt_ts("completed_at")?,
        kind: r.enumeration("kind")?,
        parent_item_id: r.opt_text("parent_item_id")?.map(ItemId::from_stored),
        role: r.opt_text("role")?,
        tool_allowlist: r.opt_typed("tool_allowlist")?,
        compacted_output: r.opt_text("compacted_output")?,
    })
}

/// A `runs` row; `suspension` is left empty (`runs::attach_suspensions` fills it).
pub(crate) fn run_from_row(r: &Row) -> StoreResult<Run> {
    Ok(Run {
        run_id: r.uuid("run_id")?,
        thread_id: ThreadId::from_stored(r.text("thread_id")?),
        tenant: r.text("tenant")?,
        status: r.enumeration("status")?,
        kind: r.enumeration("kind")?,
        query: r.text("query")?,
        flowchart: r.opt_typed("flowchart")?,
        config: r.typed("config")?,
        assistant: match (r.opt_text("assistant_id")?, r.opt_int("assistant_version")?) {
            (Some(id), Some(version)) => Some(AssistantRef {
                assistant_id: AssistantId::from_stored(id),
                version,
            }),
            _ => None,
        },
        multitask_strategy: r.enumeration("multitask_strategy")?,
        idempotency_key: r.opt_text("idempotency_key")?,
        created_at: r.ts("created_at")?,
        started_at: r.opt_ts("started_at")?,
        ended_at: r.opt_ts("ended_at")?,
        usage: r.typed("usage")?,
        error: r.opt_typed("error")?,
        final_response: r.opt_json("final_response")?,
        suspension: None,
        attempt: r.int("attempt")?,
        cron_id: r
            .opt_text("cron_id")?
            .map(|id| Uuid::parse_str(&id).map_err(|e| decode_err("cron_id", e)))
            .transpose()?,
        phase: r.enumeration("phase")?,
        cancel_requested: r.boolean("cancel_requested")?,
        start_seq: r.int("start_seq")?,
        trace_context: r.opt_text("trace_context")?,
    })
}

/// A `messages` row.
pub(crate) fn message_from_row(r: &Row) -> StoreResult<Message> {
    Ok(Message {
        id: r.uuid("id")?,
        thread_id: ThreadId::from_stored(r.text("thread_id")?),
        run_id: r.opt_uuid("run_id")?,
        role: r.enumeration("role")?,
        content: r.text("content")?,
        item_id: r.opt_text("item_id")?,
        tool_call_id: r.opt_text("tool_call_id")?,
        name: r.opt_text("name")?,
        tool_calls: r.opt_typed("tool_calls")?.unwrap_or_default(),
        created_at: r.ts("created_at")?,
    })
}

/// An `observations` row.
pub(crate) fn observation_from_row(r: &Row) -> StoreResult<Observation> {
    Ok(Observation {
        id: r.uuid("id")?,
        seq: r.int("seq")?,
        thread_id: ThreadId::from_stored(r.text("thread_id")?),
        tenant: r.text("tenant")?,
        run_id: r.opt_uuid("run_id")?,
        parent_id: r.opt_text("parent_id")?,
        kind: r.enumeration("type")?,
        title: r.text("title")?,
        content: r.json("content")?,
        created_at: r.ts("created_at")?,
    })
}

/// A `suspensions` row.
pub(crate) fn suspension_from_row(r: &Row) -> StoreResult<Suspension> {
    Ok(Suspension {
        suspension_id: r.uuid("suspension_id")?,
        thread_id: ThreadId::from_stored(r.text("thread_id")?),
        tenant: r.text("tenant")?,
        run_id: r.uuid("run_id")?,
        item_id: ItemId::from_stored(r.text("item_id")?),
        kind: r.enumeration("kind")?,
        tool_call: r.typed("tool_call")?,
        allowed_decisions: r.typed("allowed_decisions")?,
        question: r.opt_text("question")?,
        input_schema: r.opt_json("input_schema")?,
        iteration_state: r.json("iteration_state")?,
        partial_tool_results: r.typed("partial_tool_results")?,
        status: r.enumeration("status")?,
        decision: r.opt_typed("decision")?,
        created_at: r.ts("created_at")?,
        resolved_at: r.opt_ts("resolved_at")?,
        expires_at: r.opt_ts("expires_at")?,
    })
}

/// Does moving a run to `status` end its lease? (Terminal statuses and `suspended`.)
pub(crate) fn clears_lease(status: RunStatus) -> bool {
    status.is_terminal() || status == RunStatus::Suspended
}

/// The `RUN_CANCELLED` observation the store writes when it cancels a queued or suspended run
/// itself (a running run is cancelled by its worker, which writes its own).
pub(crate) fn run_cancelled(run_id: Uuid, interrupted_by: Option<Uuid>) -> NewObservation {
    let reason = match interrupted_by {
        Some(_) => CancelReason::Interrupted,
        None => CancelReason::Cancelled,
    };
    let content = RunCancelledContent {
        reason,
        by_run_id: interrupted_by,
        usage: None,
    };
    NewObservation::of(run_id, None, "Run cancelled", &content)
}

/// The `AGENT_RESUMED` observation committed with a suspension's resolution: item-level (its
/// parent is the suspended item), content `{suspensionId, decision, reason, expired}` taken from
/// the decision as given (`reason` null when none was given).
pub(crate) fn agent_resumed(
    s: &Suspension,
    decision: &ResumeDecision,
    expired: bool,
) -> NewObservation {
    let chosen = decision.kind();
    let reason = decision.reason();
    let title = if expired {
        "Suspension expired".to_owned()
    } else {
        format!("Resumed: {chosen}")
    };
    let content = AgentResumedContent {
        suspension_id: s.suspension_id,
        decision: chosen,
        reason: reason.map(str::to_owned),
        expired,
    };
    // A budget suspension is the run's, not an item's: its resumption is run-level.
    let parent =
        (s.kind != crate::model::SuspensionKind::Budget).then(|| s.item_id.as_str().to_owned());
    NewObservation::of(s.run_id, parent, title, &content)
}

/// The `AGENT_SUSPENDED` observation of a pending suspension (as the engine makes it when it
/// suspends a call): for a question asked again outside the engine (a fork, see `forks.rs`).
pub(crate) fn agent_suspended(s: &Suspension) -> NewObservation {
    let content = crate::model::payloads::AgentSuspendedContent {
        suspension_id: s.suspension_id,
        item_id: s.item_id.clone(),
        kind: s.kind,
        tool_call: s.tool_call.clone(),
        allowed_decisions: s.allowed_decisions.clone(),
        question: s.question.clone(),
        input_schema: s.input_schema.clone(),
        expires_at: s.expires_at,
    };
    let parent =
        (s.kind != crate::model::SuspensionKind::Budget).then(|| s.item_id.as_str().to_owned());
    let title = format!("Waiting for a person: {}", s.tool_call.name);
    NewObservation::of(s.run_id, parent, title, &content)
}

/// The `RUN_SUSPENDED` observation of a run that waits on `suspension_ids`.
pub(crate) fn run_suspended(
    run_id: Uuid,
    suspension_ids: Vec<Uuid>,
    usage: crate::model::Usage,
) -> NewObservation {
    let title = format!("Waiting for {} decision(s)", suspension_ids.len());
    let content = crate::model::payloads::RunSuspendedContent {
        suspension_ids,
        usage,
    };
    NewObservation::of(run_id, None, title, &content)
}

/// Whether a resolution to `status` is an expiry (`Expired`) rather than a person's decision
/// (`Resolved`); any other target status is a [`StoreError::Conflict`].
pub(crate) fn resolution_is_expiry(status: SuspensionStatus) -> StoreResult<bool> {
    match status {
        SuspensionStatus::Resolved => Ok(false),
        SuspensionStatus::Expired => Ok(true),
        other => Err(StoreError::Conflict(format!(
            "a suspension cannot be resolved as {other}"
        ))),
    }
}

/// Observations as committed: `seqs` run from `first_seq` upward in batch order.
pub(crate) fn committed(
    tenant: &str,
    thread_id: &ThreadId,
    first_seq: i64,
    created_at: DateTime<Utc>,
    new: Vec<NewObservation>,
) -> Vec<Observation> {
    new.into_iter()
        .zip(first_seq..)
        .map(|(o, seq)| Observation {
            id: o.id,
            seq,
            thread_id: thread_id.clone(),
            tenant: tenant.to_owned(),
            run_id: o.run_id,
            parent_id: o.parent_id,
            kind: o.kind,
            title: o.title,
            content: o.content,
            created_at,
        })
        .collect()
}

/// Turn a cursor id that must be a UUID (runs, messages) into one.
pub(crate) fn cursor_uuid(id: &str) -> StoreResult<Uuid> {
    Uuid::parse_str(id).map_err(|e| StoreError::Decode(format!("bad page cursor id `{id}`: {e}")))
}

/// `limit` as SQL `LIMIT`: 0 means "no limit".
pub(crate) fn sql_limit(limit: u32) -> i64 {
    if limit == 0 {
        i64::MAX
    } else {
        i64::from(limit)
    }
}

/// Is this database error a unique violation (optionally of one named constraint/index)?
pub(crate) fn is_unique_violation(e: &sqlx::Error, constraint: Option<&str>) -> bool {
    match e {
        sqlx::Error::Database(db) if db.is_unique_violation() => match constraint {
            None => true,
            // Postgres reports the constraint name; SQLite only names the columns in the message.
            Some(name) => db.constraint() == Some(name) || db.constraint().is_none(),
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_timestamps_are_fixed_width_and_round_trip() {
        let t = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.123456789Z")
            .unwrap()
            .with_timezone(&Utc);
        let s = ts_text(t);
        assert_eq!(s, "2026-01-02T03:04:05.123456Z");
        assert_eq!(parse_ts_text(&s).unwrap(), micros(t));
        let whole = DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(ts_text(whole).len(), s.len());
        assert!(ts_text(whole) < s);
        assert!(parse_ts_text("yesterday").is_err());
    }

    #[test]
    fn zero_limit_means_unbounded() {
        assert_eq!(sql_limit(0), i64::MAX);
        assert_eq!(sql_limit(7), 7);
    }
}
