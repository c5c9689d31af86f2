//! SQL text the shared logic and both dialects build on, below both and knowing nothing of
//! [`super::SqlStore`]: the run's fenced update and the cancel of its suspensions; the history
//! copies a commit makes of the rows it writes ([`copy_items`], [`copy_state`]); the webhook
//! outbox row a run's ending commit writes ([`outbox_insert`]); the claim's candidate rules and
//! the memory of tenants served that orders them ([`ServedTenants`]). So `apply`, `leases`,
//! `runs` and `postgres`/`sqlite` depend on it and not on each other.

use std::time::Duration;

use super::sql::{Arg, Dialect};
use super::tables::{ITEM_COLUMNS, STATE_COLUMNS};

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

/// Resolve run `$1`'s pending suspensions as cancelled by the commit whose seq is `seq` (an SQL
/// expression); `gate` is appended to the `WHERE` (the fence, as the dialect checks it).
pub(crate) fn cancel_suspensions(seq: &str, gate: &str) -> String {
    format!(
        "UPDATE suspensions SET status = 'cancelled', resolved_at = {{now}}, resolved_seq = {seq} \
         WHERE run_id = $1 AND status = 'pending'{gate}"
    )
}

/// The statuses a webhook announces (`webhooks::outbox_insert`'s callers keep to them).
pub(crate) const ANNOUNCED: &str = "w.status IN ('completed', 'failed', 'cancelled', 'suspended')";

/// Running runs whose lease expired (`$3` is how many), earliest expiry first.
pub(crate) const EXPIRED_CANDIDATES: &str = "SELECT run_id FROM runs \
    WHERE status = 'running' AND lease_expires_at < {now} ORDER BY lease_expires_at LIMIT $3";

/// The queued runs to claim next, tenants served in turn; `$3` is how many, less `taken` (SQL:
/// the slots already filled), and `$4` the tenants this process served, least recent first
/// (`,a,b,`: see [`ServedTenants`]).
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

/// The tenants this process's claims served, the most recent last (at most
/// [`ServedTenants::KEPT`]): what breaks a tie between tenants whose turns are equal, so tenants
/// with backlogs take turns. Kept in memory, not in the database: it costs no write, and each
/// replica's own order is enough to keep any one tenant from being passed over.
#[derive(Debug, Default)]
pub struct ServedTenants {
    recent: std::collections::VecDeque<String>,
}

impl ServedTenants {
    /// Tenants remembered at most.
    pub const KEPT: usize = 256;

    /// `tenant` was just served.
    pub(crate) fn note(&mut self, tenant: &str) {
        if self.recent.back().is_some_and(|t| t == tenant) {
            return;
        }
        self.recent.retain(|t| t != tenant);
        self.recent.push_back(tenant.to_owned());
        if self.recent.len() > Self::KEPT {
            self.recent.pop_front();
        }
    }

    /// The claim's parameter: `,a,b,c,` (least recent first), so the position of `,<tenant>,`
    /// orders tenants from never or long ago served to just served. Tenant names hold no comma
    /// (they come from the comma-separated `PES_API_KEYS`).
    pub(crate) fn param(&self) -> String {
        let mut s = String::from(",");
        for t in &self.recent {
            s.push_str(t);
            s.push(',');
        }
        s
    }
}

/// Copy the live `todo_items` rows picked by `filter` into their versions at `seq` (an SQL
/// expression), as tombstones when `deleted`. `tenant` and `thread` are the placeholders of the
/// statement the copy belongs to; `gate` is appended to the `WHERE` (the fence, where the
/// dialect needs it). A second write of an item in one commit replaces the first's version.
pub(crate) fn copy_items(
    tenant: &str,
    thread: &str,
    filter: &str,
    seq: &str,
    deleted: bool,
    gate: &str,
) -> String {
    let cols = ITEM_COLUMNS.join(", ");
    let set: Vec<String> = ITEM_COLUMNS
        .iter()
        .filter(|c| **c != "item_id")
        .map(|c| format!("{c} = EXCLUDED.{c}"))
        .chain(std::iter::once("deleted = EXCLUDED.deleted".to_owned()))
        .collect();
    format!(
        "INSERT INTO todo_item_versions (tenant, thread_id, {cols}, seq, deleted) \
         SELECT tenant, thread_id, {cols}, {seq}, {deleted} FROM todo_items \
         WHERE tenant = {tenant} AND thread_id = {thread} AND {filter}{gate} \
         ON CONFLICT (tenant, thread_id, item_id, seq) DO UPDATE SET {set}",
        deleted = if deleted { "TRUE" } else { "FALSE" },
        set = set.join(", ")
    )
}

/// Copy the live `agent_state` row into its version at `seq` (see [`copy_items`]).
pub(crate) fn copy_state(tenant: &str, thread: &str, seq: &str, gate: &str) -> String {
    let cols = STATE_COLUMNS.join(", ");
    let set: Vec<String> = STATE_COLUMNS
        .iter()
        .map(|c| format!("{c} = EXCLUDED.{c}"))
        .collect();
    format!(
        "INSERT INTO agent_state_versions (tenant, thread_id, seq, {cols}) \
         SELECT tenant, thread_id, {seq}, {cols} FROM agent_state \
         WHERE tenant = {tenant} AND thread_id = {thread}{gate} \
         ON CONFLICT (tenant, thread_id, seq) DO UPDATE SET {set}",
        set = set.join(", ")
    )
}

/// The bare `TRUE`/`FALSE` of a flag, for SQL both dialects read.
pub(crate) fn flag(b: bool) -> &'static str {
    if b { "TRUE" } else { "FALSE" }
}

/// The run columns a snapshot keeps, and whether each holds JSON (SQLite keeps JSON as text,
/// which `json()` turns back into JSON inside the snapshot).
const SNAPSHOT_COLUMNS: [(&str, bool); 23] = [
    ("run_id", false),
    ("tenant", false),
    ("thread_id", false),
    ("status", false),
    ("kind", false),
    ("query", false),
    ("config", true),
    ("assistant_id", false),
    ("assistant_version", false),
    ("multitask_strategy", false),
    ("idempotency_key", false),
    ("created_at", false),
    ("started_at", false),
    ("ended_at", false),
    ("usage", true),
    ("error", true),
    ("final_response", true),
    ("attempt", false),
    ("phase", false),
    ("cancel_requested", false),
    ("start_seq", false),
    ("trace_context", false),
    ("cron_id", false),
];

/// SQLite has no UUID function: a version 4 UUID from `randomblob`.
const SQLITE_UUID: &str = "lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || \
    substr(hex(randomblob(2)), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) || \
    substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6)))";

/// The `INSERT … SELECT` that writes one outbox row per run of `source` (aliased `w`: the
/// `runs` table, or a CTE of updated runs rows) matching `cond`, whose webhook wants the event of
/// its status. Only statuses with an event may reach it (the callers' `cond` says which). A
/// `run.suspended` event names the run's newest pending suspension, looked up in `suspensions`
/// (the table, or a relation that adds the ones the same statement inserts, which the table
/// does not show it yet). No parameters of its own, so it fits into any statement's numbering.
pub(crate) fn outbox_insert(d: Dialect, source: &str, cond: &str, suspensions: &str) -> String {
    let (id, url, snapshot, wants) = match d {
        Dialect::Postgres => (
            "gen_random_uuid()".to_owned(),
            "w.webhook ->> 'url'".to_owned(),
            "to_jsonb(w)".to_owned(),
            "(NOT (w.webhook ? 'events') OR w.webhook -> 'events' ? ('run.' || w.status))"
                .to_owned(),
        ),
        Dialect::Sqlite => {
            let cols: Vec<String> = SNAPSHOT_COLUMNS
                .iter()
                .map(|(c, json)| {
                    if *json {
                        format!("'{c}', json(w.{c})")
                    } else {
                        format!("'{c}', w.{c}")
                    }
                })
                .collect();
            (
                SQLITE_UUID.to_owned(),
                "json_extract(w.webhook, '$.url')".to_owned(),
                format!("json_object({})", cols.join(", ")),
                "(json_type(w.webhook, '$.events') IS NULL OR EXISTS (SELECT 1 FROM \
                 json_each(w.webhook, '$.events') e WHERE e.value = 'run.' || w.status))"
                    .to_owned(),
            )
        }
    };
    format!(
        "INSERT INTO webhook_deliveries (delivery_id, tenant, thread_id, run_id, event, url, \
           run_snapshot, suspension_id, status, attempts, next_attempt_at, created_at) \
         SELECT {id}, w.tenant, w.thread_id, w.run_id, 'run.' || w.status, {url}, {snapshot}, \
           CASE WHEN w.status = 'suspended' THEN (SELECT s.suspension_id FROM {suspensions} s \
             WHERE s.run_id = w.run_id AND s.status = 'pending' \
             ORDER BY s.created_at DESC LIMIT 1) END, \
           'pending', 0, {{now}}, {{now}} \
         FROM {source} w WHERE ({cond}) AND w.webhook IS NOT NULL AND {wants}"
    )
}

#[cfg(test)]
mod tests {
    use super::ServedTenants;

    #[test]
    fn the_tenant_served_last_comes_last() {
        let mut s = ServedTenants::default();
        s.note("a");
        s.note("b");
        s.note("a");
        assert_eq!(s.param(), ",b,a,");
        s.note("a");
        assert_eq!(s.param(), ",b,a,");
    }
}
