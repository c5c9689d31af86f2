//! The memory store: items per tenant under a namespace and a key, found by
//! key, by namespace prefix and filter, by full text (each database's own engine: Postgres
//! `tsvector` with a GIN index ranked by `ts_rank`, SQLite FTS5 ranked by `bm25`), or as the
//! candidates a semantic search ranks by cosine. Written once for both dialects, except the
//! full-text and filter clauses and the sweeper's claim.
//!
//! Invariants:
//! - an expired item is invisible to every read from the instant it expires (each read filters
//!   on `expires_at`); the sweeper deletes it later, at most a batch a pass, and replicas
//!   sweeping at once never delete the same rows (`FOR UPDATE SKIP LOCKED`);
//! - `memory_counts` holds each tenant's item rows, changed in the transaction of every insert
//!   and delete: the quota is exact across replicas, and no write counts the table. Locks are
//!   taken item rows first, counters last (sorted), so writers and sweepers never deadlock;
//! - a write under an idempotency key is applied once: its key is recorded in the same
//!   transaction, and a retry finds it and changes nothing.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::sql::{Arg, Conn, Dialect, Row, q};
use super::sql_store::SqlStore;
use super::{StoreError, StoreResult};
use crate::model::memory::{
    MemoryItem, Namespace, STORED_SEPARATOR, embedding_bytes, embedding_from_bytes, scope_token,
    scope_tokens,
};

/// What [`SqlStore::put_memory`] writes.
#[derive(Debug, Clone)]
pub struct MemoryPut<'a> {
    pub tenant: &'a str,
    pub namespace: &'a Namespace,
    pub key: &'a str,
    /// A JSON object.
    pub value: &'a Value,
    /// The text full-text search reads ([`crate::model::memory::searchable_text`]).
    pub content: &'a str,
    /// The embedding of `content` and the model that made it.
    pub embedding: Option<(&'a [f32], &'a str)>,
    /// Embeddings are on but this write could not be embedded: the background pass will.
    pub embed_pending: bool,
    /// The item expires this long after the write; `None`: never.
    pub ttl_seconds: Option<u64>,
    /// A retry of a write under the same key changes nothing.
    pub idempotency_key: Option<&'a str>,
}

/// What [`SqlStore::put_memory`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMemory {
    /// Stored: a new item (`created`) or a new value of an existing one.
    Stored { created: bool },
    /// A write under this idempotency key was applied before; nothing changed.
    Repeated,
    /// A new item would take the tenant past its quota; nothing changed.
    OverQuota,
}

/// Which items a search or a listing reads.
#[derive(Debug, Clone, Default)]
pub struct MemoryScope<'a> {
    pub tenant: &'a str,
    /// Items in this namespace or under it (every namespace when empty).
    pub prefix: Option<&'a Namespace>,
    /// Top-level fields of the value that must equal these values.
    pub filter: &'a [(String, Value)],
}

/// An item waiting for its embedding.
#[derive(Debug, Clone)]
pub struct PendingEmbedding {
    pub tenant: String,
    pub namespace: String,
    pub key: String,
    pub content: String,
    /// The write it is for: a later write makes the embedding stale, and it is not stored.
    pub updated_at: DateTime<Utc>,
}

/// The columns an item is read from.
const ITEM_COLUMNS: &str = "m.namespace, m.key, m.value, m.created_at, m.updated_at, m.expires_at";

/// Visible: not expired.
const VISIBLE: &str = "(m.expires_at IS NULL OR m.expires_at > {now})";

/// How long idempotency keys of writes are kept, in seconds.
pub(super) const WRITE_KEYS_KEPT_SECONDS: i64 = 86_400;

fn item_from_row(r: &Row, score: Option<f64>) -> StoreResult<MemoryItem> {
    let value = match r.json("value")? {
        Value::Object(m) => m,
        other => {
            return Err(StoreError::Decode(format!(
                "memory value is not an object: {other}"
            )));
        }
    };
    Ok(MemoryItem {
        namespace: Namespace::from_stored(&r.text("namespace")?),
        key: r.text("key")?,
        value,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
        expires_at: r.opt_ts("expires_at")?,
        score,
    })
}

/// A statement built clause by clause: its SQL and its arguments, numbered as they are added.
pub(super) struct Builder {
    sql: String,
    args: Vec<Arg>,
}

impl Builder {
    pub(super) fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            args: Vec::new(),
        }
    }

    /// Add an argument; its placeholder (`$N`).
    pub(super) fn arg(&mut self, a: impl Into<Arg>) -> String {
        self.args.push(a.into());
        format!("${}", self.args.len())
    }

    pub(super) fn push(&mut self, sql: &str) {
        self.sql.push_str(sql);
    }

    /// ` AND <the items of scope>`: tenant, prefix, visibility and the filter.
    pub(super) fn scope(&mut self, d: Dialect, scope: &MemoryScope<'_>) {
        let t = self.arg(scope.tenant);
        self.push(&format!(" AND m.tenant = {t} AND {VISIBLE}"));
        if let Some(p) = scope.prefix.filter(|p| p.depth() > 0) {
            let stored = p.stored();
            let eq = self.arg(stored.clone());
            let lo = self.arg(format!("{stored}{STORED_SEPARATOR}"));
            let hi = self.arg(format!("{stored}\u{20}"));
            self.push(&format!(
                " AND (m.namespace = {eq} OR (m.namespace >= {lo} AND m.namespace < {hi}))"
            ));
        }
        for (field, want) in scope.filter {
            let clause = self.field_equals(d, field, want);
            self.push(&format!(" AND {clause}"));
        }
    }

    /// The value's top-level `field` equals `want` (JSON equality).
    fn field_equals(&mut self, d: Dialect, field: &str, want: &Value) -> String {
        let name = self.arg(field);
        match d {
            Dialect::Postgres => {
                let v = self.arg(want.clone());
                format!("m.value -> {name} = {v}")
            }
            // json_each's row of the field: its type, and its value as SQL.
            Dialect::Sqlite => {
                let test = match want {
                    Value::Null => "j.type = 'null'".to_owned(),
                    Value::Bool(true) => "j.type = 'true'".to_owned(),
                    Value::Bool(false) => "j.type = 'false'".to_owned(),
                    Value::String(s) => format!("j.type = 'text' AND j.value = {}", self.arg(s)),
                    Value::Number(n) => {
                        let v = match n.as_i64() {
                            Some(i) => self.arg(i),
                            None => self.arg(Arg::Float(n.as_f64().unwrap_or(f64::NAN))),
                        };
                        format!("j.type IN ('integer', 'real') AND j.value = {v}")
                    }
                    Value::Array(_) => {
                        format!(
                            "j.type = 'array' AND j.value = {}",
                            self.arg(want.to_string())
                        )
                    }
                    Value::Object(_) => {
                        format!(
                            "j.type = 'object' AND j.value = {}",
                            self.arg(want.to_string())
                        )
                    }
                };
                format!(
                    "EXISTS (SELECT 1 FROM json_each(m.value) j WHERE j.key = {name} AND {test})"
                )
            }
        }
    }

    pub(super) fn build(self) -> super::sql::Q {
        self.args
            .into_iter()
            .fold(q(self.sql), |stmt, a| stmt.bind(a))
    }
}

/// A page's `limit` and `offset` as SQL integers.
fn limits(limit: u32, offset: u32) -> (i64, i64) {
    (i64::from(limit), i64::from(offset))
}

impl SqlStore {
    /// Write an item (insert or replace), counting a new one against `max_items`.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn put_memory(&self, put: &MemoryPut<'_>, max_items: u64) -> StoreResult<PutMemory> {
        let mut tx = self.write().await?;
        let ns = put.namespace.stored();
        if let Some(k) = put.idempotency_key {
            let fresh = tx
                .opt(
                    q(
                        "INSERT INTO memory_writes (tenant, idempotency_key, namespace, key, \
                       created_at) VALUES ($1, $2, $3, $4, {now}) \
                       ON CONFLICT (tenant, idempotency_key) DO NOTHING RETURNING 1 AS one",
                    )
                    .bind(put.tenant)
                    .bind(k)
                    .bind(ns.clone())
                    .bind(put.key),
                )
                .await?;
            if fresh.is_none() {
                return Ok(PutMemory::Repeated);
            }
        }
        let ttl = put.ttl_seconds.map_or(0.0, |s| s as f64);
        let (embedding, model) = match put.embedding {
            Some((v, m)) => (Some(embedding_bytes(v)), Some(m.to_owned())),
            None => (None, None),
        };
        let depth = i64::try_from(put.namespace.depth()).unwrap_or(i64::MAX);
        // SQLite's full-text index also holds where the item is (`scope_tokens`).
        let (scope_col, scope_val) = match self.dialect() {
            Dialect::Sqlite => (", scope", ", $12"),
            Dialect::Postgres => ("", ""),
        };
        let mut insert = q(format!(
            "INSERT INTO memory_items (tenant, namespace, key, depth, value, content, \
             embedding, embedding_model, embed_pending, created_at, updated_at, expires_at\
             {scope_col}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, {{now}}, {{now}}, \
             CASE WHEN $10 THEN {{later 11}} ELSE NULL END{scope_val}) \
             ON CONFLICT (tenant, namespace, key) DO NOTHING RETURNING 1 AS one"
        ))
        .bind(put.tenant)
        .bind(ns.clone())
        .bind(put.key)
        .bind(depth)
        .bind(put.value.clone())
        .bind(put.content)
        .bind(Arg::Bytes(embedding.clone()))
        .bind(&model)
        .bind(put.embed_pending)
        .bind(put.ttl_seconds.is_some())
        .bind(Arg::Float(ttl));
        if self.dialect() == Dialect::Sqlite {
            insert = insert.bind(scope_tokens(put.tenant, put.namespace));
        }
        let inserted = tx.opt(insert).await?.is_some();
        if inserted {
            let counted = tx
                .opt(
                    q("INSERT INTO memory_counts (tenant, items) VALUES ($1, 1) \
                       ON CONFLICT (tenant) DO UPDATE SET items = memory_counts.items + 1 \
                       WHERE memory_counts.items < $2 RETURNING items")
                    .bind(put.tenant)
                    .bind(i64::try_from(max_items).unwrap_or(i64::MAX)),
                )
                .await?;
            if counted.is_none() {
                // Dropping the transaction rolls the insert back.
                return Ok(PutMemory::OverQuota);
            }
        } else {
            tx.exec(
                q(
                    "UPDATE memory_items SET value = $4, content = $5, embedding = $6, \
                   embedding_model = $7, embed_pending = $8, updated_at = {now}, \
                   expires_at = CASE WHEN $9 THEN {later 10} ELSE NULL END \
                   WHERE tenant = $1 AND namespace = $2 AND key = $3",
                )
                .bind(put.tenant)
                .bind(ns)
                .bind(put.key)
                .bind(put.value.clone())
                .bind(put.content)
                .bind(Arg::Bytes(embedding))
                .bind(&model)
                .bind(put.embed_pending)
                .bind(put.ttl_seconds.is_some())
                .bind(Arg::Float(ttl)),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(PutMemory::Stored { created: inserted })
    }

    /// The item, unless it does not exist or has expired.
    pub async fn get_memory(
        &self,
        tenant: &str,
        namespace: &Namespace,
        key: &str,
    ) -> StoreResult<Option<MemoryItem>> {
        self.read()
            .await?
            .opt(
                q(format!(
                    "SELECT {ITEM_COLUMNS} FROM memory_items m \
                     WHERE m.tenant = $1 AND m.namespace = $2 AND m.key = $3 AND {VISIBLE}"
                ))
                .bind(tenant)
                .bind(namespace.stored())
                .bind(key),
            )
            .await?
            .as_ref()
            .map(|r| item_from_row(r, None))
            .transpose()
    }

    /// Delete the item; false when there was none.
    pub async fn delete_memory(
        &self,
        tenant: &str,
        namespace: &Namespace,
        key: &str,
    ) -> StoreResult<bool> {
        let mut tx = self.write().await?;
        let gone = tx
            .exec(
                q("DELETE FROM memory_items WHERE tenant = $1 AND namespace = $2 AND key = $3")
                    .bind(tenant)
                    .bind(namespace.stored())
                    .bind(key),
            )
            .await?;
        if gone > 0 {
            uncount(&mut tx, tenant, 1).await?;
        }
        tx.commit().await?;
        Ok(gone > 0)
    }

    /// Items of `scope` that match any of `terms`, most relevant first (the database's
    /// full-text rank as `score`, then the newest): the full-text index finds them, only those
    /// are ranked.
    pub async fn search_memory_text(
        &self,
        scope: &MemoryScope<'_>,
        terms: &[String],
        limit: u32,
        offset: u32,
    ) -> StoreResult<Vec<MemoryItem>> {
        if terms.is_empty() {
            return Ok(vec![]);
        }
        let d = self.dialect();
        // Terms are runs of letters and digits (`query_terms`): nothing in them is an operator.
        let mut b = match d {
            Dialect::Postgres => {
                let mut b = Builder::new("");
                let query = b.arg(terms.join(" | "));
                b.push(&format!(
                    "SELECT {ITEM_COLUMNS}, ts_rank(m.search, fq)::float8 AS score \
                     FROM memory_items m, to_tsquery('english', {query}) fq \
                     WHERE m.search @@ fq"
                ));
                b
            }
            Dialect::Sqlite => {
                let mut b = Builder::new("");
                // The words in the text, and the scope's token in where the item is: the engine
                // intersects the two (only the text counts in the rank).
                let quoted: Vec<String> = terms.iter().map(|t| format!("\"{t}\"")).collect();
                let scope_token = scope_token(scope.tenant, scope.prefix);
                let query = b.arg(format!(
                    "content : ({}) AND scope : \"{scope_token}\"",
                    quoted.join(" OR ")
                ));
                b.push(&format!(
                    "SELECT {ITEM_COLUMNS}, -bm25(memory_fts, 1.0, 0.0) AS score \
                     FROM memory_fts JOIN memory_items m ON m.id = memory_fts.rowid \
                     WHERE memory_fts MATCH {query}"
                ));
                b
            }
        };
        b.scope(d, scope);
        let (limit, offset) = limits(limit, offset);
        let (l, o) = (b.arg(limit), b.arg(offset));
        b.push(&format!(
            " ORDER BY score DESC, m.updated_at DESC, m.namespace, m.key LIMIT {l} OFFSET {o}"
        ));
        let rows = self.read().await?.all(b.build()).await?;
        rows.iter()
            .map(|r| {
                let score = r.opt_float("score")?;
                item_from_row(r, score)
            })
            .collect()
    }

    /// Items of `scope`, newest first (no ranking).
    pub async fn list_memory(
        &self,
        scope: &MemoryScope<'_>,
        limit: u32,
        offset: u32,
    ) -> StoreResult<Vec<MemoryItem>> {
        let d = self.dialect();
        let mut b = Builder::new(format!(
            "SELECT {ITEM_COLUMNS} FROM memory_items m WHERE 1 = 1"
        ));
        b.scope(d, scope);
        let (limit, offset) = limits(limit, offset);
        let (l, o) = (b.arg(limit), b.arg(offset));
        b.push(&format!(
            " ORDER BY m.updated_at DESC, m.namespace, m.key LIMIT {l} OFFSET {o}"
        ));
        let rows = self.read().await?.all(b.build()).await?;
        rows.iter().map(|r| item_from_row(r, None)).collect()
    }

    /// What a semantic search ranks: the newest `max` items of `scope` embedded by `model`,
    /// each with its embedding.
    pub async fn memory_candidates(
        &self,
        scope: &MemoryScope<'_>,
        model: &str,
        max: u32,
    ) -> StoreResult<Vec<(MemoryItem, Vec<f32>)>> {
        let d = self.dialect();
        let mut b = Builder::new(format!(
            "SELECT {ITEM_COLUMNS}, m.embedding FROM memory_items m WHERE 1 = 1"
        ));
        let m = b.arg(model);
        b.push(&format!(" AND m.embedding_model = {m}"));
        b.scope(d, scope);
        let l = b.arg(i64::from(max));
        b.push(&format!(" ORDER BY m.updated_at DESC LIMIT {l}"));
        let rows = self.read().await?.all(b.build()).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let Some(vector) = r
                .opt_bytes("embedding")?
                .and_then(|b| embedding_from_bytes(&b))
            else {
                continue;
            };
            out.push((item_from_row(r, None)?, vector));
        }
        Ok(out)
    }
}

/// Take `n` items off the tenant's count (never below zero).
pub(super) async fn uncount(tx: &mut Conn, tenant: &str, n: i64) -> StoreResult<()> {
    tx.exec(
        q(
            "UPDATE memory_counts SET items = CASE WHEN items > $2 THEN items - $2 ELSE 0 END \
           WHERE tenant = $1",
        )
        .bind(tenant)
        .bind(n),
    )
    .await?;
    Ok(())
}
