//! What walks the memory store rather than reading one item: the namespace
//! listing (one index probe per namespace found), the sweeper of expired items, and the
//! embedding pass's reads and writes. Same invariants as `memory`: expired items are invisible,
//! counters follow every delete, and sweepers on several replicas never take the same rows.

use chrono::Utc;

use super::StoreResult;
use super::memory::{Builder, MemoryScope, PendingEmbedding, WRITE_KEYS_KEPT_SECONDS, uncount};
use super::sql::{Arg, Conn, Dialect, q};
use super::sql_store::SqlStore;
use crate::model::memory::{Namespace, STORED_SEPARATOR, embedding_bytes};

impl SqlStore {
    /// The tenant's namespaces (with visible items) under `prefix` and ending with `suffix`,
    /// each cut to `max_depth` labels, once each, in label order: `limit` after skipping
    /// `offset`. Each one found is one index probe (the next namespace after the last), so the
    /// cost follows the page, not the items.
    #[allow(clippy::too_many_arguments)]
    pub async fn list_memory_namespaces(
        &self,
        tenant: &str,
        prefix: Option<&Namespace>,
        suffix: Option<&Namespace>,
        max_depth: Option<usize>,
        limit: u32,
        offset: u32,
    ) -> StoreResult<Vec<Namespace>> {
        let mut conn = self.read().await?;
        let want = (limit as usize) + (offset as usize);
        let mut found: Vec<Namespace> = Vec::new();
        let mut from = prefix.map(Namespace::stored).unwrap_or_default();
        while found.len() < want {
            let Some(ns) = next_namespace(&mut conn, tenant, prefix, suffix, &from).await? else {
                break;
            };
            let full = Namespace::from_stored(&ns);
            match max_depth {
                Some(depth) if full.depth() > depth => {
                    let cut = Namespace::parse(full.labels()[..depth].to_vec(), usize::MAX, true)
                        .unwrap_or(full);
                    // Past everything under the cut namespace.
                    from = format!("{}\u{20}", cut.stored());
                    if found.last() != Some(&cut) {
                        found.push(cut);
                    }
                }
                _ => {
                    from = format!("{ns}{STORED_SEPARATOR}");
                    found.push(full);
                }
            }
        }
        Ok(found.into_iter().skip(offset as usize).collect())
    }

    /// Delete at most `batch` expired items (and idempotency keys older than a day); how many
    /// items. Safe with several replicas sweeping at once: each takes rows the others do not
    /// hold.
    pub async fn sweep_memory(&self, batch: u64) -> StoreResult<u64> {
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let mut tx = self.write().await?;
        let claim = match self.dialect() {
            Dialect::Postgres => {
                "DELETE FROM memory_items WHERE (tenant, namespace, key) IN (SELECT tenant, \
                   namespace, key FROM memory_items WHERE expires_at <= {now} \
                   ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING tenant"
            }
            Dialect::Sqlite => {
                "DELETE FROM memory_items WHERE id IN (SELECT id FROM memory_items \
                   WHERE expires_at <= {now} ORDER BY expires_at LIMIT $1) RETURNING tenant"
            }
        };
        let rows = tx.all(q(claim).bind(batch)).await?;
        let mut per_tenant = std::collections::BTreeMap::<String, i64>::new();
        for r in &rows {
            *per_tenant.entry(r.text("tenant")?).or_default() += 1;
        }
        for (tenant, n) in &per_tenant {
            uncount(&mut tx, tenant, *n).await?;
        }
        let keys = match self.dialect() {
            Dialect::Postgres => {
                "DELETE FROM memory_writes WHERE ctid IN (SELECT ctid FROM memory_writes \
                   WHERE created_at < $2 LIMIT $1 FOR UPDATE SKIP LOCKED)"
            }
            Dialect::Sqlite => {
                "DELETE FROM memory_writes WHERE rowid IN (SELECT rowid FROM memory_writes \
                   WHERE created_at < $2 LIMIT $1)"
            }
        };
        let cutoff = Utc::now() - chrono::Duration::seconds(WRITE_KEYS_KEPT_SECONDS);
        tx.exec(q(keys).bind(batch).bind(cutoff)).await?;
        tx.commit().await?;
        Ok(rows.len() as u64)
    }

    /// At most `batch` items waiting for an embedding, oldest write first.
    pub async fn pending_embeddings(&self, batch: u32) -> StoreResult<Vec<PendingEmbedding>> {
        let rows = self
            .read()
            .await?
            .all(
                q(
                    "SELECT tenant, namespace, key, content, updated_at FROM memory_items \
                   WHERE embed_pending ORDER BY updated_at LIMIT $1",
                )
                .bind(i64::from(batch)),
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(PendingEmbedding {
                    tenant: r.text("tenant")?,
                    namespace: r.text("namespace")?,
                    key: r.text("key")?,
                    content: r.text("content")?,
                    updated_at: r.ts("updated_at")?,
                })
            })
            .collect()
    }

    /// Store the embedding of a pending item, unless it was written again since (then the newer
    /// write's own embedding, or the next pass, counts); whether it was stored.
    pub async fn store_embedding(
        &self,
        item: &PendingEmbedding,
        vector: &[f32],
        model: &str,
    ) -> StoreResult<bool> {
        let n = self
            .write_one()
            .await?
            .exec(
                q(
                    "UPDATE memory_items SET embedding = $5, embedding_model = $6, \
                   embed_pending = false \
                   WHERE tenant = $1 AND namespace = $2 AND key = $3 AND updated_at = $4",
                )
                .bind(item.tenant.as_str())
                .bind(item.namespace.as_str())
                .bind(item.key.as_str())
                .bind(item.updated_at)
                .bind(Arg::Bytes(Some(embedding_bytes(vector))))
                .bind(model),
            )
            .await?;
        Ok(n > 0)
    }

    /// Mark for the embedding pass every item not embedded by `model` (written while embeddings
    /// were off, or under another model); how many. One statement, run once at start.
    pub async fn mark_unembedded(&self, model: &str) -> StoreResult<u64> {
        let stale = match self.dialect() {
            Dialect::Postgres => "embedding_model IS DISTINCT FROM $1",
            Dialect::Sqlite => "embedding_model IS NOT $1",
        };
        self.write_one()
            .await?
            .exec(
                q(format!(
                    "UPDATE memory_items SET embed_pending = true \
                     WHERE NOT embed_pending AND {stale}"
                ))
                .bind(model),
            )
            .await
    }
}

/// The first stored namespace at or after `from` with a visible item, under `prefix` and ending
/// with `suffix`.
async fn next_namespace(
    conn: &mut Conn,
    tenant: &str,
    prefix: Option<&Namespace>,
    suffix: Option<&Namespace>,
    from: &str,
) -> StoreResult<Option<String>> {
    let mut b = Builder::new("SELECT m.namespace FROM memory_items m WHERE 1 = 1");
    let scope = MemoryScope {
        tenant,
        prefix,
        filter: &[],
    };
    b.scope(conn.dialect(), &scope);
    let f = b.arg(from);
    b.push(&format!(" AND m.namespace >= {f}"));
    if let Some(s) = suffix.filter(|s| s.depth() > 0) {
        let whole = s.stored();
        let tail = format!("{STORED_SEPARATOR}{whole}");
        let n = i64::try_from(tail.chars().count()).unwrap_or(i64::MAX);
        let (w, t, n) = (b.arg(whole), b.arg(tail), b.arg(n));
        b.push(&format!(
            " AND (m.namespace = {w} OR substr(m.namespace, \
               CAST(length(m.namespace) - {n} + 1 AS INTEGER)) = {t})"
        ));
    }
    b.push(" ORDER BY m.namespace LIMIT 1");
    conn.opt(b.build())
        .await?
        .map(|r| r.text("namespace"))
        .transpose()
}
