//! Per-tenant quotas on what a tenant creates (threads, runs queued or running, flowcharts,
//! assistants, crons), counted exactly across replicas. Each creation takes a per-tenant lock on
//! what it counts before counting, in the transaction that creates: on Postgres a
//! transaction-scoped advisory lock, so two replicas creating for one tenant at once count one
//! after the other and the second sees the first's row; on SQLite the one writer already runs
//! one write transaction at a time (`BEGIN IMMEDIATE`), across processes too. A count stops at
//! the quota (`LIMIT`), so it costs no more than the quota however many rows a table holds.
//!
//! Lock order, to stay free of deadlocks: the `threads` key before a new thread's row; a
//! thread's row before the `runs` key; nothing waits for the `threads` key while holding the
//! `runs` key.
//!
//! A run's creation counts in its own insert (see `runs.rs`). A tenant with more room left than
//! the database has transactions in flight (Postgres's `max_connections`, every replica's
//! together) is inserted without the lock: even if every other transaction in flight added a run
//! of the same tenant at that moment, the quota would hold. So the common run, far below its
//! quota, pays no lock and no round trip; near the quota the lock is taken and the insert counts
//! again.

use super::StoreResult;
use super::sql::{Conn, q};

/// Whether the tenant has room for `adding` more of what `counted` selects (a `FROM … WHERE`
/// clause over `$1`, the tenant; rows this transaction inserted count) under `max`, holding the tenant's `kind` lock until the
/// transaction ends: a `false` leaves nothing to undo, a `true` holds the room for this
/// transaction's inserts.
pub(crate) async fn room(
    conn: &mut Conn,
    kind: &str,
    counted: &str,
    tenant: &str,
    max: u64,
    adding: u64,
) -> StoreResult<bool> {
    if max == u64::MAX {
        return Ok(true);
    }
    conn.lock_key(&lock_name(kind, tenant)).await?;
    let n = conn
        .one(
            q(format!(
                "SELECT COUNT(*) AS n FROM (SELECT 1 {counted} LIMIT $2) x"
            ))
            .bind(tenant)
            // One past the quota: a count taken after this transaction's own inserts still
            // tells a full quota from a passed one.
            .bind(i64::try_from(max.saturating_add(1)).unwrap_or(i64::MAX)),
        )
        .await?
        .int("n")?;
    Ok(u64::try_from(n).unwrap_or(0) + adding <= max)
}

/// The runs a tenant may have queued or running (`PES_TENANT_MAX_ACTIVE_RUNS`): room for
/// `adding` more, or [`super::StoreError::OverQuota`].
pub(crate) async fn active_runs(
    conn: &mut Conn,
    tenant: &str,
    max: u64,
    adding: u64,
) -> StoreResult<()> {
    let counted = "FROM runs WHERE tenant = $1 AND status IN ('queued', 'running')";
    if room(conn, "runs", counted, tenant, max, adding).await? {
        return Ok(());
    }
    Err(over_active_runs(max))
}

/// The refusal of a run past `PES_TENANT_MAX_ACTIVE_RUNS` (`max`).
pub(crate) fn over_active_runs(max: u64) -> super::StoreError {
    super::StoreError::OverQuota {
        what: "runs queued or running",
        setting: "PES_TENANT_MAX_ACTIVE_RUNS",
        max,
        hint: "post again when some have ended",
        retry_after_seconds: 5,
    }
}

/// The name of the tenant's lock on what `kind` counts (see [`super::sql::Conn::lock_key`]).
pub(crate) fn lock_name(kind: &str, tenant: &str) -> String {
    format!("quota\u{1f}{kind}\u{1f}{tenant}")
}
