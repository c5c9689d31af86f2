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

use super::fragments::{ANNOUNCED, Commit, RUN_UPDATE, bind_fence, flag, outbox_insert};
use super::fragments::{CLAIM, EXPIRED_CANDIDATES, lease_secs, queued_candidates};
use super::rows;
use super::signals::Signal;
use super::sql::{Arg, Conn, Q, Row, q, signal_payload};
use super::tables::{
    AGENT_STATE, ITEM_COLUMNS, MESSAGES, RowCols, STATE_COLUMNS, TODO_ITEMS, Table, item_cols,
    message_cols_at, state_cols,
};
use super::{Claim, Fence, Op, StoreError, StoreResult};
use crate::model::{NewObservation, ThreadId, TodoItem};

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

/// The whole batch as one statement, so a commit costs one round trip and no `BEGIN`/`COMMIT`
/// (the statement is its own transaction: a failure anywhere in it changes nothing). `None` when
/// the batch needs the statement-by-statement transaction: a suspend that must see decisions
/// taken meanwhile (it locks the thread first, see `RunUpdate::unless_decided`), a new
/// suspension, or an item both deleted and upserted (one statement cannot touch a row twice).
///
/// The order of locks is the transaction's: `l` locks the thread row before `f` (the fence and
/// the run's update) locks the run's; every other part reads `f`, so a lost lease (`f` empty)
/// writes nothing, the seq counter included, and returns no row.
pub(crate) fn one_statement(
    origin: &str,
    fence: Fence,
    lease: Duration,
    c: &Commit<'_>,
) -> StoreResult<Option<Q>> {
    if !c.update.unless_decided.is_empty() {
        return Ok(None);
    }
    let mut items: Vec<(&str, &TodoItem)> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    let mut messages = Vec::new();
    let mut state: Option<(&crate::model::AgentStateRow, i64)> = None;
    for op in c.ops {
        match op {
            Op::UpsertItem(item) => {
                // Later upserts of an item replace earlier ones (each writes the whole row).
                items.retain(|(id, _)| *id != item.id.as_str());
                items.push((item.id.as_str(), item));
            }
            Op::DeleteItem(id) => deleted.push(id.as_str().to_owned()),
            Op::AppendMessage(m) => messages.push(message_cols_at(m, None)?),
            Op::SetAgentState(s) => state = Some((s, state.map_or(1, |(_, k)| k + 1))),
            Op::UpdateRun(_) => {}
            Op::InsertSuspension(_) | Op::CancelSuspensions => return Ok(None),
        }
    }
    if items.iter().any(|(id, _)| deleted.iter().any(|d| d == id)) {
        return Ok(None);
    }
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
    // Write `rows` to `table`; `computed` replaces a column's bound value by an SQL expression;
    // `versions` names the CTE that copies the written rows into their versions (the rows the
    // write returns: an upsert's result, not what was sent).
    let rows_of = |sql: &mut String,
                   extra: &mut Vec<Arg>,
                   table: &Table,
                   rows: Vec<RowCols>,
                   computed: &[(&str, &str)],
                   versions: Option<&str>| {
        let Some(first) = rows.first() else { return };
        let cols: Vec<&'static str> = first.iter().map(|(c, _)| *c).collect();
        let json: Vec<Value> = rows
            .into_iter()
            .map(|r| {
                Value::Object(
                    r.into_iter()
                        .map(|(c, a)| (c.to_owned(), a.to_json()))
                        .collect(),
                )
            })
            .collect();
        let p = param(extra, Arg::Json(Some(Value::Array(json))));
        let picked: Vec<String> = cols
            .iter()
            .map(|c| match computed.iter().find(|(k, _)| k == c) {
                Some((_, expr)) => (*expr).to_owned(),
                None => format!("x.{c}"),
            })
            .collect();
        let returning = if versions.is_some() {
            " RETURNING *"
        } else {
            ""
        };
        sql.push_str(&format!(
            ", w_{name} AS (INSERT INTO {name} (tenant, thread_id, {cols}) \
               SELECT $12, $13, {picked} FROM jsonb_populate_recordset(NULL::{name}, {p}) x \
               WHERE EXISTS (SELECT 1 FROM f){conflict}{returning})",
            name = table.name,
            cols = cols.join(", "),
            picked = picked.join(", "),
            conflict = table.on_conflict(&cols),
        ));
        if let Some(copy) = versions {
            sql.push_str(&format!(", h_{name} AS ({copy})", name = table.name));
        }
    };
    let shares_seq = usize::from(c.n == 0);
    let state_copy = &COPIES.state[shares_seq];
    if let Some((s, sets)) = state {
        let mut cols = state_cols(s);
        cols.retain(|(c, _)| *c != "version");
        cols.push(("version", sets.into()));
        rows_of(
            &mut sql,
            &mut extra,
            &AGENT_STATE,
            vec![cols],
            &[],
            Some(state_copy),
        );
    }
    let items = items
        .into_iter()
        .map(|(_, item)| item_cols(item))
        .collect::<StoreResult<Vec<_>>>()?;
    let item_copy = &COPIES.items[shares_seq];
    rows_of(
        &mut sql,
        &mut extra,
        &TODO_ITEMS,
        items,
        &[],
        Some(item_copy),
    );
    rows_of(
        &mut sql,
        &mut extra,
        &MESSAGES,
        messages,
        &[("seq", SEQ)],
        None,
    );
    if !deleted.is_empty() {
        let p = param(&mut extra, Arg::Texts(deleted));
        sql.push_str(&format!(
            ", w_deleted AS (DELETE FROM todo_items WHERE tenant = $12 AND thread_id = $13 \
               AND item_id = ANY({p}) AND EXISTS (SELECT 1 FROM f) RETURNING *), \
             h_deleted AS ({})",
            COPIES.tombstones[shares_seq]
        ));
    }
    let mut notify_observations = String::from("NULL");
    if !c.observations.is_empty() {
        let obs = c.observations;
        let ids = param(&mut extra, Arg::Uuids(obs.iter().map(|o| o.id).collect()));
        let run_ids = param(
            &mut extra,
            Arg::Uuids(obs.iter().filter_map(|o| o.run_id).collect()),
        );
        if obs.iter().any(|o| o.run_id.is_none()) {
            // Every observation the engine commits belongs to the fenced run; anything else
            // takes the general path, which binds NULLs.
            return Ok(None);
        }
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
               SELECT $12, $13, (SELECT last_seq FROM t) - $14 + u.ord, u.id, u.run_id, \
                 CASE WHEN u.has_parent = 'y' THEN u.parent_id END, u.type, u.title, \
                 {contents}::jsonb -> (u.ord::int - 1), now(), \
                 CASE WHEN u.ord = $14 THEN {changed} END, \
                 CASE WHEN u.ord = $14 THEN (SELECT phase FROM f) END, \
                 CASE WHEN u.ord = $14 THEN (SELECT usage FROM f) END \
               FROM UNNEST({ids}::uuid[], {run_ids}::uuid[], {parents}::text[], \
                 {has_parent}::text[], {types}::text[], {titles}::text[]) WITH ORDINALITY \
                 AS u(id, run_id, parent_id, has_parent, type, title, ord) \
               WHERE EXISTS (SELECT 1 FROM f))",
            changed = flag(c.changed)
        ));
        let from = param(&mut extra, origin.into());
        notify_observations = format!(
            "pg_notify('pes', json_build_object('k', 'o', 'tenant', $12::text, \
             'thread', $13::text, 'seq', (SELECT last_seq FROM t), 'from', {from}::text)::text)"
        );
    }
    if c.announces {
        sql.push_str(&format!(
            ", w_hook AS ({})",
            outbox_insert(super::sql::Dialect::Postgres, "f", ANNOUNCED)
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
    let stmt = bind_fence(q(sql), fence, lease, c);
    Ok(Some(extra.into_iter().fold(stmt, Q::bind)))
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
