//! SQL the shared logic and both dialects build on: the run's fenced update, how a batch's
//! fence is bound, and the claim's candidate rules. Kept below both, so `apply`/`leases` and
//! `postgres`/`sqlite` depend on it and not on each other.

use std::time::Duration;

use serde_json::Value;

use super::sql::{Arg, Q};
use super::{Fence, Op, RunUpdate};
use crate::model::{NewObservation, RunPhase, RunStatus, ThreadId};

/// The run's part of a commit, under the fence (`$1` run, `$2` attempt, `$12`/`$13` its
/// thread): extend the lease (`$3` seconds) or clear it (`$10`), and apply the run's update. A
/// run that would suspend while one of the suspensions `$11` was already decided is queued
/// instead (see `RunUpdate::unless_decided`).
pub(crate) const RUN_UPDATE: &str = "UPDATE runs SET \
      lease_expires_at = CASE WHEN $10 THEN NULL ELSE {later 3} END, \
      lease_owner = CASE WHEN $10 THEN NULL ELSE lease_owner END, \
      status = CASE WHEN $4 = 'suspended' AND EXISTS (SELECT 1 FROM suspensions s \
                 WHERE {in s.suspension_id 11} AND s.status <> 'pending') \
               THEN 'queued' ELSE COALESCE($4, status) END, \
      phase = COALESCE($5, phase), \
      usage = COALESCE($6, usage), error = COALESCE($7, error), \
      final_response = COALESCE($8, final_response), \
      ended_at = CASE WHEN $9 THEN {now} ELSE ended_at END \
    WHERE run_id = $1 AND attempt = $2 AND status = 'running' \
      AND tenant = $12 AND thread_id = $13";

/// The statuses a webhook announces (`webhooks::outbox_insert`'s callers keep to them).
pub(crate) const ANNOUNCED: &str = "w.status IN ('completed', 'failed', 'cancelled', 'suspended')";

/// Running runs whose lease expired (`$3` is how many), earliest expiry first.
pub(crate) const EXPIRED_CANDIDATES: &str = "SELECT run_id FROM runs \
    WHERE status = 'running' AND lease_expires_at < {now} ORDER BY lease_expires_at LIMIT $3";

/// The queued runs to claim next, tenants served in turn; `$3` is how many, less `taken` (SQL:
/// the slots already filled), and `$4` the tenants this process served, least recent first
/// (`,a,b,`: see `leases::ServedTenants`).
///
/// A candidate is the oldest queued run of a thread with no running or suspended run (so never
/// two of one thread). Candidates are ordered by their tenant's *turn*: the tenant's running runs
/// plus the candidate's place among the tenant's candidates (1 for its oldest); among equal
/// turns, the tenant this process served longest ago (or never) goes first; then by age. A
/// tenant with 2,000 runs queued and 64 running puts its next run at turn 65 while another
/// tenant's first run is at turn 1, and when both are at turn 1 (one slot that just freed) the
/// tenant served last waits: tenants take turns, and one tenant's backlog never holds back
/// another's work. With one tenant the order is plain oldest first.
///
/// The statement selects `r.run_id` from `runs r` so that Postgres can lock `r` (`FOR UPDATE OF r
/// SKIP LOCKED`, which re-checks `r.status` on the row's latest version, so a run another claimer
/// took meanwhile is passed over); the window function sits in the subquery `f`, which is not
/// locked. Its cost grows with the number of queued candidates (an index probe each), not with
/// the table, and it needs no index of its own: an index the claim alone reads would be written
/// at every one of a run's commits.
pub(crate) fn queued_candidates(taken: &str) -> String {
    format!(
        "SELECT r.run_id FROM runs r JOIN ( \
           SELECT q.run_id, q.created_at, {{served q.tenant 4}} AS served, \
             row_number() OVER (PARTITION BY q.tenant ORDER BY q.created_at, q.run_id) \
               + COALESCE(load.running, 0) AS turn \
           FROM runs q \
           LEFT JOIN (SELECT tenant, count(*) AS running FROM runs WHERE status = 'running' \
                      GROUP BY tenant) load ON load.tenant = q.tenant \
           WHERE q.status = 'queued' AND NOT EXISTS ( \
             SELECT 1 FROM runs o WHERE o.tenant = q.tenant AND o.thread_id = q.thread_id \
               AND (o.status IN ('running', 'suspended') \
                    OR (o.status = 'queued' \
                        AND (o.created_at, o.run_id) < (q.created_at, q.run_id))))) f \
         ON f.run_id = r.run_id WHERE r.status = 'queued' \
         ORDER BY f.turn, f.served, f.created_at, f.run_id \
         LIMIT $3 - {taken}"
    )
}

/// Claim the runs a candidate query picked: `$1` the owner, `$2` the lease in seconds.
pub(crate) const CLAIM: &str = "UPDATE runs SET status = 'running', attempt = attempt + 1, \
    lease_owner = $1, lease_expires_at = {later 2}, started_at = COALESCE(started_at, {now})";

/// The lease in seconds, as a bind value.
pub(crate) fn lease_secs(lease: Duration) -> Arg {
    Arg::Float(lease.as_secs_f64())
}

/// Bind `$1`–`$14` of a fenced commit: the fence, the lease, the run's update ([`RUN_UPDATE`]),
/// the thread and `n`, how many seqs to reserve.
pub(crate) fn bind_fence(stmt: Q, fence: Fence, lease: Duration, c: &Commit<'_>) -> Q {
    let u = c.update;
    stmt.bind(fence.run_id)
        .bind(fence.attempt)
        .bind(lease_secs(lease))
        .bind(u.status.map(RunStatus::as_str))
        .bind(u.phase.map(RunPhase::as_str))
        .bind(c.usage.clone())
        .bind(c.error.clone())
        .bind(u.final_response.clone())
        .bind(u.ended)
        .bind(c.clear_lease)
        .bind(u.unless_decided.clone())
        .bind(c.tenant)
        .bind(c.thread_id.as_str())
        .bind(c.n)
}

/// A batch, taken apart for committing.
pub(crate) struct Commit<'a> {
    pub tenant: &'a str,
    pub thread_id: &'a ThreadId,
    pub update: &'a RunUpdate,
    pub usage: Option<Value>,
    pub error: Option<Value>,
    /// The run stops holding a lease (it ended or waits for a person).
    pub clear_lease: bool,
    /// The update moves the run to a status a webhook announces: the commit writes the outbox
    /// row (when the run has a webhook that wants it) with the run's change.
    pub announces: bool,
    /// The batch changes §2's state: its commit is a point of the thread's history.
    pub changed: bool,
    /// How many observations, hence seqs.
    pub n: i64,
    pub ops: &'a [Op],
    pub observations: &'a [NewObservation],
}
