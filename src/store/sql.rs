//! The dialect layer: what differs between Postgres and SQLite below the store's logic, and
//! nothing else. The logic (`threads.rs`, `runs.rs`, `leases.rs`, `apply.rs`,
//! `suspensions.rs`) is written once against these types:
//!
//! - [`Arg`]: a bind value in the domain's terms; each dialect encodes it natively (Postgres has
//!   `UUID`, `JSONB`, `TIMESTAMPTZ` and arrays; SQLite keeps them as text, lists as JSON arrays).
//! - [`Row`]: a result row of either backend; its column readers are in `rows.rs`.
//! - [`Conn`]: a connection or transaction of either backend that runs a [`Q`].
//! - SQL templates: the shared SQL text, with a few tokens each dialect renders its own way —
//!   `{now}` (the time, from the database's clock on Postgres), `{clock}` (the time even inside a
//!   transaction), `{later N}` (now plus `$N` seconds), `{in COL N}` (`COL` is one of the list
//!   `$N`), `{served COL N}` (where `,COL,` is in the text `$N`, 0 when absent), `{lock}`
//!   (`FOR UPDATE`, a no-op where writers are serialized), `{lock of T}` (`FOR UPDATE OF T`) and
//!   `{share of T}` (`FOR KEY SHARE OF T`: the row may not be deleted until commit, while others
//!   may share it; a no-op on SQLite too).
//!
//! The two backends are a closed set, so they are an enum rather than a trait: no generic
//! bounds over sqlx's database traits, one compiled copy of the logic.

use std::borrow::Cow;
use std::sync::Arc;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::Value;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnection, PgRow};
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqliteRow};
use sqlx::{Postgres, Sqlite, Transaction};
use uuid::Uuid;

use super::{Signal, StoreError, StoreResult};

/// SQLite timestamp format: fixed width, UTC, microseconds, so text order is time order.
pub(crate) const SQLITE_TS_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.6fZ";

/// Format a timestamp for a SQLite TEXT column.
pub(crate) fn ts_text(t: DateTime<Utc>) -> String {
    t.format(SQLITE_TS_FORMAT).to_string()
}

/// Parse a timestamp written by [`ts_text`] (RFC 3339 is accepted too).
pub(crate) fn parse_ts_text(s: &str) -> StoreResult<DateTime<Utc>> {
    NaiveDateTime::parse_from_str(s, SQLITE_TS_FORMAT)
        .map(|n| n.and_utc())
        .or_else(|_| DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&Utc)))
        .map_err(|e| StoreError::Decode(format!("bad timestamp `{s}`: {e}")))
}

/// Which SQL the store speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    Sqlite,
}

/// A bind value. `None` binds a typed NULL.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    Text(Option<String>),
    Int(Option<i64>),
    Float(f64),
    Bool(bool),
    Uuid(Option<Uuid>),
    /// A JSON document (`JSONB` / JSON text).
    Json(Option<Value>),
    /// A timestamp (`TIMESTAMPTZ` / fixed-width text, see [`ts_text`]).
    Ts(Option<DateTime<Utc>>),
    /// A list for `{in COL N}` (`UUID[]` / a JSON array of text).
    Uuids(Vec<Uuid>),
    /// A list for `{in COL N}` (`TEXT[]` / a JSON array).
    Texts(Vec<String>),
    /// Raw bytes (`BYTEA` / `BLOB`).
    Bytes(Option<Vec<u8>>),
}

impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::Text(Some(v.to_owned()))
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::Text(Some(v))
    }
}
impl From<&String> for Arg {
    fn from(v: &String) -> Self {
        Arg::Text(Some(v.clone()))
    }
}
impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Self {
        Arg::Text(v.map(str::to_owned))
    }
}
impl From<&Option<String>> for Arg {
    fn from(v: &Option<String>) -> Self {
        Arg::Text(v.clone())
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::Int(Some(v))
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Arg::Bool(v)
    }
}
impl From<Uuid> for Arg {
    fn from(v: Uuid) -> Self {
        Arg::Uuid(Some(v))
    }
}
impl From<Option<Uuid>> for Arg {
    fn from(v: Option<Uuid>) -> Self {
        Arg::Uuid(v)
    }
}
impl From<Value> for Arg {
    fn from(v: Value) -> Self {
        Arg::Json(Some(v))
    }
}
impl From<Option<Value>> for Arg {
    fn from(v: Option<Value>) -> Self {
        Arg::Json(v)
    }
}
impl From<DateTime<Utc>> for Arg {
    fn from(v: DateTime<Utc>) -> Self {
        Arg::Ts(Some(v))
    }
}
impl From<Option<DateTime<Utc>>> for Arg {
    fn from(v: Option<DateTime<Utc>>) -> Self {
        Arg::Ts(v)
    }
}
impl From<Vec<Uuid>> for Arg {
    fn from(v: Vec<Uuid>) -> Self {
        Arg::Uuids(v)
    }
}
impl From<Vec<String>> for Arg {
    fn from(v: Vec<String>) -> Self {
        Arg::Texts(v)
    }
}

impl Arg {
    /// The value as JSON, the way Postgres' `jsonb_populate_recordset` reads it into a column of
    /// the matching type (timestamps as ISO text, ids as text, documents as they are).
    pub(crate) fn to_json(&self) -> Value {
        match self {
            Arg::Text(v) => v.clone().map_or(Value::Null, Value::from),
            Arg::Int(v) => v.map_or(Value::Null, Value::from),
            Arg::Float(v) => Value::from(*v),
            Arg::Bool(v) => Value::from(*v),
            Arg::Uuid(v) => v.map_or(Value::Null, |v| Value::from(id_text(v))),
            Arg::Json(v) => v.clone().unwrap_or(Value::Null),
            Arg::Ts(v) => v.map_or(Value::Null, |v| Value::from(ts_text(v))),
            Arg::Uuids(v) => Value::from(v.iter().map(|v| id_text(*v)).collect::<Vec<_>>()),
            Arg::Texts(v) => Value::from(v.clone()),
            // Postgres reads bytea from its hex text form.
            Arg::Bytes(v) => v.as_ref().map_or(Value::Null, |b| {
                Value::from(format!(
                    "\\x{}",
                    b.iter().map(|x| format!("{x:02x}")).collect::<String>()
                ))
            }),
        }
    }
}

/// A statement: SQL template plus its arguments, in `$N` order.
#[derive(Debug, Clone)]
pub(crate) struct Q {
    sql: Cow<'static, str>,
    args: Vec<Arg>,
}

/// Start a statement from a template.
pub(crate) fn q(sql: impl Into<Cow<'static, str>>) -> Q {
    Q {
        sql: sql.into(),
        args: Vec::new(),
    }
}

impl Q {
    /// Bind the next `$N`.
    pub(crate) fn bind(mut self, arg: impl Into<Arg>) -> Self {
        self.args.push(arg.into());
        self
    }
}

/// Debug builds check that a statement's text always comes with the same number of bind
/// values: a connection's statement cache is keyed by the text, so a text bound with another
/// count than the one it was prepared with fails on Postgres ("bind message supplies N
/// parameters, but prepared statement requires M") once the connection is reused. Every test
/// run checks every statement it makes.
#[cfg(debug_assertions)]
fn check_arity(sql: &str, args: usize) {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock, PoisonError};
    static SEEN: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if seen.len() > 100_000 {
        seen.clear();
    }
    let first = *seen.entry(sql.to_owned()).or_insert(args);
    assert_eq!(
        first, args,
        "a statement was bound with {args} values after {first}: {sql}"
    );
}

#[cfg(not(debug_assertions))]
fn check_arity(_: &str, _: usize) {}

/// Render a template's tokens for a dialect (templates without tokens are borrowed as they are).
pub(crate) fn render(d: Dialect, tpl: &str) -> Cow<'_, str> {
    if !tpl.contains('{') {
        return Cow::Borrowed(tpl);
    }
    let mut out = String::with_capacity(tpl.len() + 64);
    let mut rest = tpl;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find('}')
            .map(|e| start + e)
            .unwrap_or_else(|| panic!("unclosed token in SQL template: {tpl}"));
        let token: Vec<&str> = rest[start + 1..end].split_whitespace().collect();
        out.push_str(&token_sql(d, &token, tpl));
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// SQLite's clock as the store's fixed-width timestamp text (SQLite keeps milliseconds).
const SQLITE_NOW: &str = "(strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z')";

fn token_sql(d: Dialect, token: &[&str], tpl: &str) -> String {
    match (d, token) {
        (Dialect::Postgres, ["now"]) => "now()".into(),
        (Dialect::Postgres, ["clock"]) => "clock_timestamp()".into(),
        (Dialect::Sqlite, ["now" | "clock"]) => SQLITE_NOW.into(),
        (Dialect::Postgres, ["later", n]) => format!("(now() + make_interval(secs => ${n}))"),
        (Dialect::Sqlite, ["later", n]) => {
            format!("(strftime('%Y-%m-%dT%H:%M:%f', 'now', ${n} || ' seconds') || '000Z')")
        }
        (Dialect::Postgres, ["in", col, n]) => format!("{col} = ANY(${n})"),
        (Dialect::Sqlite, ["in", col, n]) => {
            format!("{col} IN (SELECT value FROM json_each(${n}))")
        }
        (Dialect::Postgres, ["served", col, n]) => format!("strpos(${n}, ',' || {col} || ',')"),
        (Dialect::Sqlite, ["served", col, n]) => format!("instr(${n}, ',' || {col} || ',')"),
        (Dialect::Postgres, ["lock"]) => "FOR UPDATE".into(),
        (Dialect::Sqlite, ["lock"] | ["lock" | "share", "of", _]) => String::new(),
        (Dialect::Postgres, ["lock", "of", table]) => format!("FOR UPDATE OF {table}"),
        (Dialect::Postgres, ["share", "of", table]) => format!("FOR KEY SHARE OF {table}"),
        _ => panic!("unknown token {token:?} in SQL template: {tpl}"),
    }
}

fn bind_pg<'q>(q: Query<'q, Postgres, PgArguments>, arg: Arg) -> Query<'q, Postgres, PgArguments> {
    match arg {
        Arg::Text(v) => q.bind(v),
        Arg::Int(v) => q.bind(v),
        Arg::Float(v) => q.bind(v),
        Arg::Bool(v) => q.bind(v),
        Arg::Uuid(v) => q.bind(v),
        Arg::Json(v) => q.bind(v),
        Arg::Ts(v) => q.bind(v),
        Arg::Uuids(v) => q.bind(v),
        Arg::Texts(v) => q.bind(v),
        Arg::Bytes(v) => q.bind(v),
    }
}

fn bind_lite<'q>(
    q: Query<'q, Sqlite, SqliteArguments<'q>>,
    arg: Arg,
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    match arg {
        Arg::Text(v) => q.bind(v),
        Arg::Int(v) => q.bind(v),
        Arg::Float(v) => q.bind(v),
        Arg::Bool(v) => q.bind(v),
        Arg::Uuid(v) => q.bind(v.map(id_text)),
        Arg::Json(v) => q.bind(v.map(|v| v.to_string())),
        Arg::Ts(v) => q.bind(v.map(ts_text)),
        Arg::Uuids(v) => {
            q.bind(Value::from(v.into_iter().map(id_text).collect::<Vec<_>>()).to_string())
        }
        Arg::Texts(v) => q.bind(Value::from(v).to_string()),
        Arg::Bytes(v) => q.bind(v),
    }
}

/// A UUID as SQLite stores it.
pub(crate) fn id_text(id: Uuid) -> String {
    id.hyphenated().to_string()
}

/// A result row of either backend.
pub(crate) enum Row {
    Pg(PgRow),
    Lite(SqliteRow),
}

/// A connection of either backend: a pooled one (each statement commits on its own) or a
/// transaction (dropping it rolls back), with the store's `origin` that its signals carry.
pub(crate) struct Conn {
    link: Link,
    origin: Arc<str>,
}

/// The connection itself.
pub(crate) enum Link {
    Pg(PoolConnection<Postgres>),
    PgTx(Transaction<'static, Postgres>),
    Lite(PoolConnection<Sqlite>),
    LiteTx(Transaction<'static, Sqlite>),
}

/// The raw connection under a [`Conn`], for the few statements only one dialect has.
pub(crate) enum Raw<'a> {
    Pg(&'a mut PgConnection),
    Lite(&'a mut SqliteConnection),
}

impl Conn {
    pub(crate) fn new(link: Link, origin: &Arc<str>) -> Self {
        Conn {
            link,
            origin: origin.clone(),
        }
    }

    pub(crate) fn dialect(&self) -> Dialect {
        match self.link {
            Link::Pg(_) | Link::PgTx(_) => Dialect::Postgres,
            Link::Lite(_) | Link::LiteTx(_) => Dialect::Sqlite,
        }
    }

    /// The store's id on the signals it sends (see [`signal_payload`]).
    pub(crate) fn origin(&self) -> &str {
        &self.origin
    }

    /// The raw connection.
    pub(crate) fn raw(&mut self) -> Raw<'_> {
        match &mut self.link {
            Link::Pg(c) => Raw::Pg(&mut *c),
            Link::PgTx(t) => Raw::Pg(&mut *t),
            Link::Lite(c) => Raw::Lite(&mut *c),
            Link::LiteTx(t) => Raw::Lite(&mut *t),
        }
    }

    /// Every row the statement returns.
    pub(crate) async fn all(&mut self, q: Q) -> StoreResult<Vec<Row>> {
        let d = self.dialect();
        let sql = render(d, &q.sql);
        check_arity(&sql, q.args.len());
        Ok(match self.raw() {
            Raw::Pg(c) => {
                let query = q.args.into_iter().fold(sqlx::query(&sql), bind_pg);
                query.fetch_all(c).await?.into_iter().map(Row::Pg).collect()
            }
            Raw::Lite(c) => {
                let query = q.args.into_iter().fold(sqlx::query(&sql), bind_lite);
                query
                    .fetch_all(c)
                    .await?
                    .into_iter()
                    .map(Row::Lite)
                    .collect()
            }
        })
    }

    /// The first row, if any.
    pub(crate) async fn opt(&mut self, q: Q) -> StoreResult<Option<Row>> {
        let d = self.dialect();
        let sql = render(d, &q.sql);
        check_arity(&sql, q.args.len());
        Ok(match self.raw() {
            Raw::Pg(c) => {
                let query = q.args.into_iter().fold(sqlx::query(&sql), bind_pg);
                query.fetch_optional(c).await?.map(Row::Pg)
            }
            Raw::Lite(c) => {
                let query = q.args.into_iter().fold(sqlx::query(&sql), bind_lite);
                query.fetch_optional(c).await?.map(Row::Lite)
            }
        })
    }

    /// Exactly one row (no row is a [`sqlx::Error::RowNotFound`]).
    pub(crate) async fn one(&mut self, q: Q) -> StoreResult<Row> {
        self.opt(q)
            .await?
            .ok_or(StoreError::Database(sqlx::Error::RowNotFound))
    }

    /// Run the statement; how many rows it changed.
    pub(crate) async fn exec(&mut self, q: Q) -> StoreResult<u64> {
        let d = self.dialect();
        let sql = render(d, &q.sql);
        check_arity(&sql, q.args.len());
        Ok(match self.raw() {
            Raw::Pg(c) => {
                let query = q.args.into_iter().fold(sqlx::query(&sql), bind_pg);
                query.execute(c).await?.rows_affected()
            }
            Raw::Lite(c) => {
                let query = q.args.into_iter().fold(sqlx::query(&sql), bind_lite);
                query.execute(c).await?.rows_affected()
            }
        })
    }

    /// Tell other replicas, at commit, that something happened (Postgres `NOTIFY`; SQLite has
    /// one process, whose own code wakes itself).
    pub(crate) async fn notify(&mut self, s: &Signal) -> StoreResult<()> {
        let payload = signal_payload(s, &self.origin);
        if let Raw::Pg(c) = self.raw() {
            sqlx::query("SELECT pg_notify('pes', $1)")
                .bind(payload)
                .execute(c)
                .await?;
        }
        Ok(())
    }

    /// Hold back every other transaction that locks the same `key` until this one ends
    /// (Postgres: a transaction-scoped advisory lock on the key's hash; SQLite needs none, its
    /// one writer runs one write transaction at a time). For read-then-write rules no row
    /// lock covers, such as numbering the first version of a new name.
    pub(crate) async fn lock_key(&mut self, key: &str) -> StoreResult<()> {
        if let Raw::Pg(c) = self.raw() {
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                .bind(key)
                .execute(c)
                .await?;
        }
        Ok(())
    }

    /// Commit a transaction (a pooled connection has nothing to commit).
    pub(crate) async fn commit(self) -> StoreResult<()> {
        match self.link {
            Link::PgTx(t) => t.commit().await?,
            Link::LiteTx(t) => t.commit().await?,
            Link::Pg(_) | Link::Lite(_) => {}
        }
        Ok(())
    }
}

/// The `NOTIFY` payload of a signal: the signal's JSON plus `from`, the sending store's origin,
/// so a process skips its own signals (it already acted on them locally, and reacting again
/// would only re-read what it just wrote).
pub(crate) fn signal_payload(s: &Signal, origin: &str) -> String {
    let mut v = serde_json::to_value(s).unwrap_or_default();
    if let Value::Object(m) = &mut v {
        m.insert("from".into(), Value::from(origin));
    }
    v.to_string()
}
