//! What only Postgres does: its pool, the one-round-trip claim, the commit as one statement, the
//! list insert of observations (with its `NOTIFY`), and the signals between replicas (LISTEN,
//! and the poll of watched threads that covers a lost notification). A layer below
//! [`super::SqlStore`] that knows nothing of it: functions over a pool or a [`Conn`], which the
//! store's methods call; everything else is the store's shared logic.
//!
//! How Postgres keeps the store's invariants (see [`super`]):
//! - **Gap-free seqs.** `threads.last_seq` is bumped by the transaction that inserts the
//!   observations, so the row lock serializes appenders of one thread and a rollback takes the
//!   counter back with it.
//! - **Fences.** Every worker write matches `run_id` *and* `attempt` of a `running` run; zero rows
//!   means [`StoreError::LeaseLost`] and the transaction is rolled back.
//! - **One run per thread.** Claims pick rows with `FOR UPDATE SKIP LOCKED`; a partial unique
//!   index (`runs_one_running_per_thread_idx`) backs the rule up.
//! - **Lock order thread → run → suspension** in every multi-row transaction, so they never
//!   deadlock each other; claims lock run rows and nothing else, and never wait for one.
//! - **One clock.** Every timestamp the store makes, and every lease comparison, uses the
//!   database's `now()`.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use futures::stream::BoxStream;
use sqlx::Connection;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions};

use serde_json::Value;

use super::commit::{AtCommit, Commit, Versions, bind_fence};
use super::fragments::{ANNOUNCED, RUN_UPDATE, cancel_suspensions, flag, outbox_insert};
use super::fragments::{CLAIM, EXPIRED_CANDIDATES, lease_secs, queued_candidates};
use super::rows;
use super::signals::Signal;
use super::sql::{Arg, Conn, Dialect, Q, Row, q, signal_payload};
use super::tables::{ITEM_COLUMNS, STATE_COLUMNS, SUSPENSIONS};
use super::{Claim, StoreError, StoreResult};
use crate::model::{NewObservation, ThreadId};

/// The embedded Postgres migrations (`migrations/postgres`).
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

/// Opens the store on Postgres: [`PgStore::connect`] and [`PgStore::from_pool`] build the
/// [`super::SqlStore`] (in `sql_store.rs`, above this file); [`PgStore::probe`] only asks
/// whether the server answers.
#[derive(Debug, Clone, Copy)]
pub struct PgStore;

impl PgStore {
    /// Open and close one connection to `url`: whether the server answers and lets us in,
    /// without a pool's own retries (start-up waits for the database with this, so each attempt
    /// is seen, and the pool is built once it answers).
    ///
    /// # Errors
    /// [`StoreError::Database`] with sqlx's error; [`is_transient_connect_error`] tells the ones
    /// worth waiting out.
    pub async fn probe(url: &str) -> StoreResult<()> {
        let conn = PgConnection::connect(url).await?;
        conn.close().await.ok();
        Ok(())
    }
}

/// A pool of at most `max_connections` to `url` (`postgres://…`), and the most transactions of
/// every replica together that can be in flight (the server's `max_connections`; `u64::MAX`
/// when unreadable): what [`PgStore::connect`] builds the store on. Does not migrate.
pub(crate) async fn pool(url: &str, max_connections: u32) -> StoreResult<(PgPool, u64)> {
    let pool = PgPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
        .after_connect(|conn, _| {
            Box::pin(async move {
                // Every statement is prepared once per connection and its parameters are
                // keys and values, never selectivity-changing ranges: a generic plan fits,
                // and planning each execution again (the default for the first five, and
                // whenever a custom plan looks cheaper) was a fifth of a commit's cost.
                sqlx::query("SET plan_cache_mode = force_generic_plan")
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .connect(url)
        .await?;
    // No more transactions of all replicas together are ever in flight than the server
    // takes connections: what lets a tenant far below a quota skip its lock (`quotas`).
    let most: String = sqlx::query_scalar("SHOW max_connections")
        .fetch_one(&pool)
        .await?;
    Ok((pool, most.trim().parse().unwrap_or(u64::MAX)))
}

/// Whether connecting failed for a reason that passes by itself: the server is not up yet (refused,
/// reset, unresolvable name while a compose network comes up, a timeout), is starting or
/// restarting (`57P03` cannot_connect_now, `57P01` admin_shutdown), or has no connection slot
/// free (`53300`). A bad URL, TLS setup, a refused login or a missing database are not: waiting
/// would not fix them.
pub fn is_transient_connect_error(error: &StoreError) -> bool {
    match error {
        StoreError::Database(sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut) => true,
        StoreError::Database(sqlx::Error::Database(e)) => {
            matches!(e.code().as_deref(), Some("57P03" | "57P01" | "53300"))
        }
        _ => false,
    }
}

/// Runs the embedded migrations. sqlx's migrator holds a session advisory lock
/// (`pg_advisory_lock`) while it works, so replicas starting together apply them once.
pub(crate) async fn migrate(pool: &PgPool) -> StoreResult<()> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// Insert observations whose seqs were reserved, and wake the other replicas, in one statement
/// (`UNNEST` of one array per column). NOTIFY is delivered at commit, so a listener never reads
/// before the rows are visible.
pub(crate) async fn insert_observations(
    conn: &mut PgConnection,
    origin: &str,
    tenant: &str,
    thread_id: &ThreadId,
    first_seq: i64,
    created_at: DateTime<Utc>,
    new: &[NewObservation],
) -> StoreResult<()> {
    let n = new.len();
    let mut seqs = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    let mut run_ids = Vec::with_capacity(n);
    let mut parents = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    let mut titles = Vec::with_capacity(n);
    let mut contents = Vec::with_capacity(n);
    for (o, seq) in new.iter().zip(first_seq..) {
        seqs.push(seq);
        ids.push(o.id);
        run_ids.push(o.run_id);
        parents.push(o.parent_id.as_deref());
        types.push(o.kind.as_str());
        titles.push(o.title.as_str());
        contents.push(&o.content);
    }
    let signal = signal_payload(
        &Signal::Observations {
            tenant: tenant.to_owned(),
            thread: thread_id.to_string(),
            seq: first_seq + n as i64 - 1,
        },
        origin,
    );
    sqlx::query(
        "WITH ins AS (INSERT INTO observations \
           (tenant, thread_id, seq, id, run_id, parent_id, type, title, content, created_at) \
         SELECT $1, $2, u.seq, u.id, u.run_id, u.parent_id, u.type, u.title, u.content, $10 \
         FROM UNNEST($3::bigint[], $4::uuid[], $5::uuid[], $6::text[], $7::text[], $8::text[], \
                     $9::jsonb[]) AS u(seq, id, run_id, parent_id, type, title, content)) \
         SELECT pg_notify('pes', $11)",
    )
    .bind(tenant)
    .bind(thread_id.as_str())
    .bind(&seqs)
    .bind(&ids)
    .bind(&run_ids)
    .bind(&parents)
    .bind(&types)
    .bind(&titles)
    .bind(&contents)
    .bind(created_at)
    .bind(signal)
    .execute(conn)
    .await?;
    Ok(())
}

/// One round trip claims up to `$3` runs: running runs whose lease expired (earliest first),
/// then, for the slots left, queued runs by [`queued_candidates`]. Both picks lock with
/// `SKIP LOCKED`, so concurrent claimers take different runs.
///
/// It returns a row per claimed run, or one row of NULL run columns when none was claimed; every
/// row carries `next_expiry`, the seconds until the earliest lease still in the future runs out
/// (read from the statement's snapshot: the expired leases claimed here do not count, and an
/// expired one that another claimer has locked is that claimer's to take).
fn claim_sql() -> String {
    let queued = queued_candidates("(SELECT count(*) FROM expired)");
    format!(
        "WITH expired AS ({EXPIRED_CANDIDATES} FOR UPDATE SKIP LOCKED), \
         queued AS ({queued} FOR UPDATE OF r SKIP LOCKED), \
         claimed AS ({CLAIM} \
           WHERE run_id IN (SELECT run_id FROM expired UNION ALL SELECT run_id FROM queued) \
           RETURNING *) \
         SELECT c.*, n.next_expiry, \
           COALESCE(c.run_id IN (SELECT run_id FROM expired), FALSE) AS taken_over FROM ( \
           SELECT EXTRACT(EPOCH FROM min(lease_expires_at) - now())::float8 AS next_expiry \
           FROM runs WHERE status = 'running' AND lease_expires_at >= now()) n \
         LEFT JOIN claimed c ON true \
         ORDER BY c.created_at, c.run_id"
    )
}

pub(crate) async fn claim_runs(
    mut conn: Conn,
    owner: &str,
    lease: Duration,
    max: usize,
    served: &str,
) -> StoreResult<Claim> {
    let max = i64::try_from(max).unwrap_or(i64::MAX);
    let found = conn
        .all(
            q(claim_sql())
                .bind(owner)
                .bind(lease_secs(lease))
                .bind(max)
                .bind(served),
        )
        .await;
    let found = match found {
        Ok(found) => found,
        // Another claimer won a thread in a race the candidate query cannot see: nothing was
        // claimed (the statement is atomic); look again at once.
        Err(StoreError::Database(e))
            if rows::is_unique_violation(&e, Some("runs_one_running_per_thread_idx")) =>
        {
            return Ok(Claim {
                runs: Vec::new(),
                next_expiry: Some(Duration::ZERO),
                taken_over: 0,
            });
        }
        Err(e) => return Err(e),
    };
    let mut claim = Claim::default();
    for row in &found {
        let next = row.opt_float("next_expiry")?;
        claim.next_expiry = next.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok());
        if row.opt_uuid("run_id")?.is_some() {
            claim.taken_over += usize::from(row.boolean("taken_over")?);
            claim.runs.push(rows::run_from_row(row)?);
        }
    }
    Ok(claim)
}

/// Wake-ups from the other replicas: one LISTEN connection. `into_stream` reconnects after a
/// lost connection (notifications sent meanwhile are lost: the callers' polls cover that);
/// errors in between are skipped.
pub(crate) async fn signals(
    pool: &PgPool,
    origin: Arc<str>,
) -> StoreResult<BoxStream<'static, Signal>> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen("pes").await?;
    Ok(listener
        .into_stream()
        .filter_map(move |n| {
            let origin = origin.clone();
            async move {
                match n {
                    Ok(n) => {
                        let v: Value = serde_json::from_str(n.payload()).ok()?;
                        // Our own signals: this process acted on them already.
                        if v.get("from").and_then(Value::as_str) == Some(&origin) {
                            return None;
                        }
                        serde_json::from_value::<Signal>(v).ok()
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection error; reconnecting");
                        None
                    }
                }
            }
        })
        .boxed())
}

/// Send `signals` in order, one NOTIFY each, in one statement (so one transaction: they are
/// delivered together, in array order).
pub(crate) async fn send_signals(
    mut conn: Conn,
    origin: &str,
    signals: &[Signal],
) -> StoreResult<()> {
    let payloads: Vec<String> = signals.iter().map(|s| signal_payload(s, origin)).collect();
    conn.exec(
        q("SELECT count(pg_notify('pes', p)) FROM UNNEST($1::text[]) AS p")
            .bind(Arg::Texts(payloads)),
    )
    .await?;
    Ok(())
}

/// The current `last_seq` of each of these threads (the poll that covers a lost signal).
pub(crate) async fn thread_seqs(
    mut conn: Conn,
    threads: &[(String, ThreadId)],
) -> StoreResult<Vec<(String, ThreadId, i64)>> {
    if threads.is_empty() {
        return Ok(Vec::new());
    }
    let tenants: Vec<String> = threads.iter().map(|(t, _)| t.clone()).collect();
    let ids: Vec<String> = threads
        .iter()
        .map(|(_, id)| id.as_str().to_owned())
        .collect();
    let found: Vec<Row> = conn
        .all(
            q("SELECT t.tenant, t.thread_id, t.last_seq FROM threads t \
               JOIN UNNEST($1::text[], $2::text[]) AS k(tenant, thread_id) \
                 ON t.tenant = k.tenant AND t.thread_id = k.thread_id")
            .bind(tenants)
            .bind(ids),
        )
        .await?;
    found
        .iter()
        .map(|r| {
            Ok((
                r.text("tenant")?,
                ThreadId::from_stored(r.text("thread_id")?),
                r.int("last_seq")?,
            ))
        })
        .collect()
}

/// A [`Commit`] as one statement, so a commit costs one round trip and no `BEGIN`/`COMMIT` (the
/// statement is its own transaction: a failure anywhere in it changes nothing). `apply.rs` runs
/// it alone, or, for a suspend that must see decisions taken meanwhile
/// ([`Commit::waits_for_decisions`]), in a transaction right after locking the thread: inside one
/// statement that waited for the lock, the run's update would still read the snapshot from
/// before the wait.
///
/// The order of locks is the commit's: `l` locks the thread row before `f` (the fence and the
/// run's update) locks the run's, and the suspensions come after; every other part reads `f`, so
/// a lost lease (`f` empty) writes nothing, the seq counter included, and returns no row. The
/// parts of one statement see the database as it was when the statement started, not each
/// other's writes: the versions copy the rows the writes return, and the outbox row looks for
/// the event's suspension among the ones this statement inserts too.
pub(crate) fn commit_statement(origin: &str, c: &Commit<'_>) -> Q {
    // A run that ends or suspends: `f` returns its whole row, from which `w_hook` writes the
    // webhook outbox row in this same statement.
    let returning = if c.announces {
        "*"
    } else {
        "cancel_requested, phase, usage"
    };
    let mut sql = format!(
        "WITH l AS (SELECT 1 FROM threads WHERE tenant = $12 AND thread_id = $13 FOR UPDATE), \
         f AS ({RUN_UPDATE} AND EXISTS (SELECT 1 FROM l) RETURNING {returning}), \
         t AS (UPDATE threads SET last_seq = last_seq + $14, \
                 updated_at = CASE WHEN $14 > 0 THEN now() ELSE updated_at END \
               WHERE tenant = $12 AND thread_id = $13 AND EXISTS (SELECT 1 FROM f) \
               RETURNING last_seq)"
    );
    let mut extra: Vec<Arg> = Vec::new();
    let param = |extra: &mut Vec<Arg>, a: Arg| {
        extra.push(a);
        format!("${}", 14 + extra.len())
    };
    // The seq every history row of this commit carries: the commit's last observation.
    const SEQ: &str = "(SELECT last_seq FROM t)";
    const HELD: &str = "EXISTS (SELECT 1 FROM f)";
    let shares_seq = usize::from(c.n == 0);
    let mut suspensions_made: Vec<String> = Vec::new();
    for (i, w) in c.writes.iter().enumerate() {
        let Some(first) = w.rows.first() else {
            continue;
        };
        // One write per table but for suspensions (pending, and inserted cancelled).
        let name = match c.writes[..i]
            .iter()
            .filter(|p| p.table.name == w.table.name)
            .count()
        {
            0 => format!("w_{}", w.table.name),
            k => format!("w_{}_{k}", w.table.name),
        };
        let cols: Vec<&'static str> = first.iter().map(|(c, _)| *c).collect();
        let computed = |col: &str| {
            w.at_commit
                .iter()
                .find(|(k, _)| *k == col)
                .map(|(_, v)| match v {
                    AtCommit::Seq => SEQ,
                    AtCommit::Now => "now()",
                })
        };
        let returns = w.versions != Versions::None || w.table.name == SUSPENSIONS.name;
        let returning = if returns { " RETURNING *" } else { "" };
        let source = if w.table.name == SUSPENSIONS.name {
            // Bound value by value: `jsonb_populate_recordset` would read a JSON `null` document
            // (a budget suspension's `iteration_state`) as SQL NULL. A suspend is rare.
            let rows: Vec<String> = w
                .rows
                .iter()
                .map(|row| {
                    let values: Vec<String> = row
                        .iter()
                        .map(|(c, a)| match computed(c) {
                            Some(expr) => expr.to_owned(),
                            None => param(&mut extra, a.clone()),
                        })
                        .collect();
                    format!("SELECT $12, $13, {} WHERE {HELD}", values.join(", "))
                })
                .collect();
            rows.join(" UNION ALL ")
        } else {
            // One JSON document of every row, read back into the table's row type.
            let json: Vec<Value> = w
                .rows
                .iter()
                .map(|r| {
                    Value::Object(
                        r.iter()
                            .map(|(c, a)| ((*c).to_owned(), a.to_json()))
                            .collect(),
                    )
                })
                .collect();
            let p = param(&mut extra, Arg::Json(Some(Value::Array(json))));
            let picked: Vec<String> = cols
                .iter()
                .map(|c| computed(c).map_or_else(|| format!("x.{c}"), str::to_owned))
                .collect();
            format!(
                "SELECT $12, $13, {} FROM jsonb_populate_recordset(NULL::{}, {p}) x WHERE {HELD}",
                picked.join(", "),
                w.table.name
            )
        };
        sql.push_str(&format!(
            ", {name} AS (INSERT INTO {table} (tenant, thread_id, {cols}) {source}{conflict}\
             {returning})",
            table = w.table.name,
            cols = cols.join(", "),
            conflict = w.table.on_conflict(&cols),
        ));
        // The versions of the rows the write returns (an upsert's result, not what was sent).
        // (`COPIES` reads `w_agent_state` and `w_todo_items`: one write each.)
        match w.versions {
            Versions::None => {}
            Versions::State => {
                sql.push_str(&format!(", h_{name} AS ({})", COPIES.state[shares_seq]));
            }
            Versions::Items => {
                sql.push_str(&format!(", h_{name} AS ({})", COPIES.items[shares_seq]));
            }
        }
        if w.table.name == SUSPENSIONS.name {
            suspensions_made.push(name);
        }
    }
    if !c.deleted.is_empty() {
        let p = param(&mut extra, Arg::Texts(c.deleted.clone()));
        sql.push_str(&format!(
            ", w_deleted AS (DELETE FROM todo_items WHERE tenant = $12 AND thread_id = $13 \
               AND item_id = ANY({p}) AND {HELD} RETURNING *), \
             h_deleted AS ({})",
            COPIES.tombstones[shares_seq]
        ));
    }
    if c.cancel_suspensions {
        sql.push_str(&format!(
            ", w_cancelled AS ({})",
            cancel_suspensions(SEQ, &format!(" AND {HELD}"))
        ));
    }
    let mut notify_observations = String::from("NULL");
    if !c.observations.is_empty() {
        let obs = c.observations;
        let ids = param(&mut extra, Arg::Uuids(obs.iter().map(|o| o.id).collect()));
        // An observation of no run (none the engine commits) as the nil UUID, read back as NULL.
        let run_ids = param(
            &mut extra,
            Arg::Uuids(
                obs.iter()
                    .map(|o| o.run_id.unwrap_or_else(uuid::Uuid::nil))
                    .collect(),
            ),
        );
        let parents = param(
            &mut extra,
            Arg::Texts(
                obs.iter()
                    .map(|o| o.parent_id.clone().unwrap_or_default())
                    .collect(),
            ),
        );
        let has_parent = param(
            &mut extra,
            Arg::Texts(
                obs.iter()
                    .map(|o| if o.parent_id.is_some() { "y" } else { "" }.to_owned())
                    .collect(),
            ),
        );
        let types = param(
            &mut extra,
            Arg::Texts(obs.iter().map(|o| o.kind.as_str().to_owned()).collect()),
        );
        let titles = param(
            &mut extra,
            Arg::Texts(obs.iter().map(|o| o.title.clone()).collect()),
        );
        let contents = param(
            &mut extra,
            Arg::Json(Some(Value::Array(
                obs.iter().map(|o| o.content.clone()).collect(),
            ))),
        );
        // The commit's last observation marks its end (see `history.rs`).
        sql.push_str(&format!(
            ", w_observations AS (INSERT INTO observations \
               (tenant, thread_id, seq, id, run_id, parent_id, type, title, content, created_at, \
                commit_changed, commit_phase, commit_usage) \
               SELECT $12, $13, (SELECT last_seq FROM t) - $14 + u.ord, u.id, \
                 NULLIF(u.run_id, '00000000-0000-0000-0000-000000000000'::uuid), \
                 CASE WHEN u.has_parent = 'y' THEN u.parent_id END, u.type, u.title, \
                 {contents}::jsonb -> (u.ord::int - 1), now(), \
                 CASE WHEN u.ord = $14 THEN {changed} END, \
                 CASE WHEN u.ord = $14 THEN (SELECT phase FROM f) END, \
                 CASE WHEN u.ord = $14 THEN (SELECT usage FROM f) END \
               FROM UNNEST({ids}::uuid[], {run_ids}::uuid[], {parents}::text[], \
                 {has_parent}::text[], {types}::text[], {titles}::text[]) WITH ORDINALITY \
                 AS u(id, run_id, parent_id, has_parent, type, title, ord) \
               WHERE {HELD})",
            changed = flag(c.changed)
        ));
        let from = param(&mut extra, origin.into());
        notify_observations = format!(
            "pg_notify('pes', json_build_object('k', 'o', 'tenant', $12::text, \
             'thread', $13::text, 'seq', (SELECT last_seq FROM t), 'from', {from}::text)::text)"
        );
    }
    if c.announces {
        // The event's suspension may be one this statement inserts, which its other parts
        // cannot read in the table.
        let mut pending: Vec<String> = suspensions_made
            .iter()
            .map(|w| format!("SELECT suspension_id, run_id, status, created_at FROM {w}"))
            .collect();
        let suspensions = if pending.is_empty() {
            "suspensions".to_owned()
        } else {
            pending
                .push("SELECT suspension_id, run_id, status, created_at FROM suspensions".into());
            format!("({})", pending.join(" UNION ALL "))
        };
        sql.push_str(&format!(
            ", w_hook AS ({})",
            outbox_insert(Dialect::Postgres, "f", ANNOUNCED, &suspensions)
        ));
    }
    let ready = signal_payload(&Signal::RunReady, origin);
    let ready = param(&mut extra, ready.into());
    sql.push_str(&format!(
        " SELECT f.cancel_requested, (SELECT last_seq FROM t) AS last_seq, now() AS now, \
           CASE WHEN $10 THEN pg_notify('pes', {ready}) END AS ready, \
           {notify_observations} AS observed \
         FROM f"
    ));
    let stmt = bind_fence(q(sql), c);
    extra.into_iter().fold(stmt, Q::bind)
}

/// The CTE bodies that copy a commit's written rows into their versions, built once: indexed by
/// whether the commit shares the previous commit's seq (see [`versions_from`]).
struct Copies {
    state: [String; 2],
    items: [String; 2],
    tombstones: [String; 2],
}

static COPIES: std::sync::LazyLock<Copies> = std::sync::LazyLock::new(|| {
    let both = |table, columns, from, deleted| {
        [false, true].map(|shares| versions_from(table, columns, from, deleted, shares))
    };
    Copies {
        state: both("agent_state_versions", STATE_COLUMNS, "w_agent_state", ""),
        items: both("todo_item_versions", ITEM_COLUMNS, "w_todo_items", "FALSE"),
        tombstones: both("todo_item_versions", ITEM_COLUMNS, "w_deleted", "TRUE"),
    }
});

/// A CTE body that copies the rows a write CTE `from` returned into their versions table at the
/// commit's seq (`deleted`: `TRUE` for tombstones, empty for the state, which has none). The
/// batch merges repeated writes of a row, so each is copied once, and a commit with
/// observations has a seq of its own: a plain insert. A commit without observations
/// (`shares_seq`) shares the previous commit's seq and replaces its versions (an upsert, which
/// costs a speculative insertion: not paid on the common path).
fn versions_from(
    table: &str,
    columns: &[&str],
    from: &str,
    deleted: &str,
    shares_seq: bool,
) -> String {
    let cols = columns.join(", ");
    let (dcol, dval, key): (String, String, &[&str]) = if deleted.is_empty() {
        (String::new(), String::new(), &["seq"])
    } else {
        (
            ", deleted".to_owned(),
            format!(", {deleted}"),
            &["item_id", "seq"],
        )
    };
    let set: Vec<String> = columns
        .iter()
        .chain(if deleted.is_empty() {
            &[][..]
        } else {
            &["deleted"][..]
        })
        .filter(|c| !key.contains(*c))
        .map(|c| format!("{c} = EXCLUDED.{c}"))
        .collect();
    let key = format!("tenant, thread_id, {}", key.join(", "));
    let conflict = if shares_seq {
        format!(" ON CONFLICT ({key}) DO UPDATE SET {}", set.join(", "))
    } else {
        String::new()
    };
    format!(
        "INSERT INTO {table} (tenant, thread_id, seq, {cols}{dcol}) \
         SELECT $12, $13, (SELECT last_seq FROM t), {cols}{dval} FROM {from}{conflict}"
    )
}
