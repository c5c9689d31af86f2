//! The memory store's use cases, for the REST routes and the agent's memory
//! tools alike: [`Memory`] checks what a request asks (namespaces, keys, value sizes, pages,
//! TTLs), embeds what is written when embeddings are on, and picks how a search ranks: by
//! meaning (cosine of embeddings) when `PES_EMBEDDINGS_MODEL` is set, else by full text (the
//! database's own engine); without a query, newest first.
//!
//! A write never waits on the embeddings provider being up: when it cannot embed, the item is
//! stored all the same, marked pending, and [`embed_periodically`] embeds it later. A search
//! whose query cannot be embedded ranks by full text instead. Expired items are deleted by
//! [`sweep_periodically`]; reads never show them in the meantime.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::llm::embeddings::Embedder;
use crate::model::memory::{
    MemoryItem, Namespace, check_key, cosine, query_terms, searchable_text,
};
use crate::problem::{FieldError, Refusal};
use crate::store::{MemoryPut, MemoryScope, PutMemory, SqlStore};
use crate::tools::memory::MemoryAccess;

/// The longest `ttlSeconds`: ten years.
pub const MAX_TTL_SECONDS: u64 = 315_360_000;
/// The most items one search page holds (LangGraph's default page is 10).
pub const MAX_SEARCH_LIMIT: u32 = 100;
/// The most namespaces one listing page holds.
pub const MAX_NAMESPACES_LIMIT: u32 = 1000;
/// The most fields a search `filter` may test.
pub const MAX_FILTER_FIELDS: usize = 32;
/// The most characters of a search `query`.
pub const MAX_QUERY_CHARS: usize = 2000;
/// The most characters of an item's text sent to be embedded (embedding models take a few
/// thousand tokens).
const MAX_EMBED_CHARS: usize = 8000;
/// Items embedded per request of the background pass.
const EMBED_BATCH: u32 = 64;

/// The limits of the memory store (settings).
#[derive(Debug, Clone)]
pub struct MemorySettings {
    /// `PES_STORE_MAX_VALUE_BYTES`.
    pub max_value_bytes: u64,
    /// `PES_STORE_MAX_NAMESPACE_DEPTH`.
    pub max_depth: usize,
    /// `PES_STORE_MAX_OFFSET`.
    pub max_offset: u64,
    /// `PES_TENANT_MAX_STORE_ITEMS`.
    pub max_items: u64,
    /// `PES_STORE_SEMANTIC_CANDIDATES`.
    pub semantic_candidates: u32,
}

/// A write, as a door asks for it.
#[derive(Debug, Clone)]
pub struct PutItem {
    pub namespace: Vec<String>,
    pub key: String,
    pub value: Value,
    pub ttl_seconds: Option<u64>,
}

/// A search, as a door asks for it.
#[derive(Debug, Clone, Default)]
pub struct SearchItems {
    pub namespace_prefix: Vec<String>,
    pub query: Option<String>,
    pub filter: Option<Map<String, Value>>,
    pub limit: Option<u32>,
    pub offset: Option<u32>,
}

/// A namespace listing, as a door asks for it.
#[derive(Debug, Clone, Default)]
pub struct ListNamespaces {
    pub prefix: Option<Vec<String>>,
    pub suffix: Option<Vec<String>>,
    pub max_depth: Option<u32>,
    pub limit: Option<u32>,
    pub offset: Option<u32>,
}

/// The memory store's use cases; cheap to clone.
#[derive(Clone)]
pub struct Memory {
    store: Arc<SqlStore>,
    embedder: Option<Arc<dyn Embedder>>,
    settings: Arc<MemorySettings>,
}

/// A `/path: message` problem.
fn field(path: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError {
        path: path.into(),
        message: message.into(),
    }
}

/// The problem that lists `errors`, when there are any.
fn invalid(errors: Vec<FieldError>) -> Result<(), Refusal> {
    if errors.is_empty() {
        return Ok(());
    }
    let detail = errors
        .iter()
        .map(|e| format!("{}: {}", e.path, e.message))
        .collect::<Vec<_>>()
        .join("; ");
    Err(Refusal::InvalidFields { detail, errors })
}

impl Memory {
    /// The use cases over `store`; `embedder` when embeddings are on.
    pub fn new(
        store: Arc<SqlStore>,
        embedder: Option<Arc<dyn Embedder>>,
        settings: MemorySettings,
    ) -> Self {
        Self {
            store,
            embedder,
            settings: Arc::new(settings),
        }
    }

    /// The embeddings model, when embeddings are on.
    pub fn embeddings_model(&self) -> Option<&str> {
        self.embedder.as_deref().map(Embedder::model)
    }

    /// `labels` as a namespace, or a problem at `path`.
    fn namespace(
        &self,
        labels: Vec<String>,
        path: &str,
        allow_empty: bool,
        errors: &mut Vec<FieldError>,
    ) -> Option<Namespace> {
        Namespace::parse(labels, self.settings.max_depth, allow_empty)
            .map_err(|e| errors.push(field(path, e)))
            .ok()
    }

    fn check_offset(&self, offset: Option<u32>, errors: &mut Vec<FieldError>) -> u32 {
        let offset = offset.unwrap_or(0);
        if u64::from(offset) > self.settings.max_offset {
            errors.push(field(
                "/offset",
                format!(
                    "must be at most {} (PES_STORE_MAX_OFFSET)",
                    self.settings.max_offset
                ),
            ));
        }
        offset
    }

    /// Write an item: insert it, or replace the value (and the TTL) of the one under the same
    /// namespace and key. With `idempotency_key`, a repeated write changes nothing.
    ///
    /// # Errors
    /// 422 naming every invalid field, 422 `value_too_large`, 429 `quota_exceeded`.
    pub async fn put(
        &self,
        tenant: &str,
        item: PutItem,
        idempotency_key: Option<&str>,
    ) -> Result<(), Refusal> {
        let mut errors = Vec::new();
        let ns = self.namespace(item.namespace, "/namespace", false, &mut errors);
        if let Err(e) = check_key(&item.key) {
            errors.push(field("/key", e));
        }
        if !item.value.is_object() {
            errors.push(field("/value", "must be a JSON object"));
        }
        if let Some(ttl) = item.ttl_seconds
            && !(1..=MAX_TTL_SECONDS).contains(&ttl)
        {
            errors.push(field(
                "/ttlSeconds",
                format!("must be between 1 and {MAX_TTL_SECONDS} (ten years)"),
            ));
        }
        invalid(errors)?;
        let Some(ns) = ns else {
            return Err(Refusal::Validation("invalid namespace".into()));
        };
        let size = serde_json::to_vec(&item.value).map_or(0, |b| b.len()) as u64;
        if size > self.settings.max_value_bytes {
            return Err(Refusal::Unprocessable {
                code: "value_too_large",
                detail: format!(
                    "the value is {size} bytes as JSON; at most {} are stored \
                     (PES_STORE_MAX_VALUE_BYTES)",
                    self.settings.max_value_bytes
                ),
            });
        }
        let content = searchable_text(&item.value);
        let model = self.embeddings_model().map(str::to_owned);
        let embedding = match &self.embedder {
            Some(e) => match e.embed(&[embed_text(&content)]).await {
                Ok(mut v) if v.len() == 1 => v.pop(),
                Ok(_) => None,
                Err(err) => {
                    warn!(error = %err, "could not embed a memory item; it is stored and \
                          will be embedded later");
                    None
                }
            },
            None => None,
        };
        let put = MemoryPut {
            tenant,
            namespace: &ns,
            key: &item.key,
            value: &item.value,
            content: &content,
            embedding: embedding.as_deref().zip(model.as_deref()),
            embed_pending: model.is_some() && embedding.is_none(),
            ttl_seconds: item.ttl_seconds,
            idempotency_key,
        };
        match self.store.put_memory(&put, self.settings.max_items).await? {
            PutMemory::Stored { .. } | PutMemory::Repeated => Ok(()),
            PutMemory::OverQuota => Err(Refusal::QuotaExceeded {
                detail: format!(
                    "the tenant keeps {} memory items, its quota (PES_TENANT_MAX_STORE_ITEMS): \
                     delete some (or let them expire) to store new ones",
                    self.settings.max_items
                ),
                retry_after_seconds: 60,
            }),
        }
    }

    /// Read an item by its namespace in the dotted query form (`a.b`) and key.
    ///
    /// # Errors
    /// 422 for a bad namespace or key; 404 `item_not_found` (never stored, deleted, expired).
    pub async fn get(&self, tenant: &str, dotted: &str, key: &str) -> Result<MemoryItem, Refusal> {
        let mut errors = Vec::new();
        let ns = Namespace::from_dotted(dotted, self.settings.max_depth)
            .map_err(|e| errors.push(field("namespace", e)))
            .ok();
        if let Err(e) = check_key(key) {
            errors.push(field("key", e));
        }
        invalid(errors)?;
        let Some(ns) = ns else {
            return Err(Refusal::Validation("invalid namespace".into()));
        };
        self.store
            .get_memory(tenant, &ns, key)
            .await?
            .ok_or_else(|| Refusal::NotFound {
                code: "item_not_found",
                detail: format!("no item `{key}` in namespace `{}`", ns.dotted()),
            })
    }

    /// Delete an item (deleting one that is not there is no error).
    ///
    /// # Errors
    /// 422 for a bad namespace or key.
    pub async fn delete(
        &self,
        tenant: &str,
        namespace: Vec<String>,
        key: &str,
    ) -> Result<(), Refusal> {
        let mut errors = Vec::new();
        let ns = self.namespace(namespace, "/namespace", false, &mut errors);
        if let Err(e) = check_key(key) {
            errors.push(field("/key", e));
        }
        invalid(errors)?;
        if let Some(ns) = ns {
            self.store.delete_memory(tenant, &ns, key).await?;
        }
        Ok(())
    }

    /// Search the items under a namespace prefix: by meaning or full text when there is a
    /// query (most relevant first, with `score`), else newest first; `filter` keeps the items
    /// whose top-level fields equal its values.
    ///
    /// # Errors
    /// 422 naming every invalid field.
    pub async fn search(&self, tenant: &str, req: SearchItems) -> Result<Vec<MemoryItem>, Refusal> {
        let mut errors = Vec::new();
        let prefix = self.namespace(req.namespace_prefix, "/namespacePrefix", true, &mut errors);
        let limit = req.limit.unwrap_or(10);
        if !(1..=MAX_SEARCH_LIMIT).contains(&limit) {
            errors.push(field(
                "/limit",
                format!("must be between 1 and {MAX_SEARCH_LIMIT}"),
            ));
        }
        let offset = self.check_offset(req.offset, &mut errors);
        let query = req.query.filter(|q| !q.trim().is_empty());
        if let Some(q) = &query
            && q.chars().count() > MAX_QUERY_CHARS
        {
            errors.push(field(
                "/query",
                format!("must be at most {MAX_QUERY_CHARS} characters"),
            ));
        }
        let filter: Vec<(String, Value)> = req.filter.unwrap_or_default().into_iter().collect();
        if filter.len() > MAX_FILTER_FIELDS {
            errors.push(field(
                "/filter",
                format!("may test at most {MAX_FILTER_FIELDS} fields"),
            ));
        }
        for (name, _) in &filter {
            if name.is_empty() || name.chars().any(char::is_control) {
                errors.push(field(
                    "/filter",
                    format!("field name {name:?} is empty or holds a control character"),
                ));
            }
        }
        invalid(errors)?;
        let scope = MemoryScope {
            tenant,
            prefix: prefix.as_ref(),
            filter: &filter,
        };
        let Some(query) = query else {
            return Ok(self.store.list_memory(&scope, limit, offset).await?);
        };
        if let Some(embedder) = &self.embedder {
            match embedder.embed(&[embed_text(&query)]).await {
                Ok(v) if v.len() == 1 => {
                    return self
                        .rank_by_meaning(&scope, embedder.model(), &v[0], limit, offset)
                        .await;
                }
                Ok(_) => warn!("the embeddings provider answered no vector; ranking by full text"),
                Err(e) => warn!(error = %e, "could not embed a search query; ranking by full text"),
            }
        }
        let terms = query_terms(&query);
        Ok(self
            .store
            .search_memory_text(&scope, &terms, limit, offset)
            .await?)
    }

    /// The newest candidates of `scope`, ranked by cosine similarity to `query`.
    async fn rank_by_meaning(
        &self,
        scope: &MemoryScope<'_>,
        model: &str,
        query: &[f32],
        limit: u32,
        offset: u32,
    ) -> Result<Vec<MemoryItem>, Refusal> {
        let candidates = self
            .store
            .memory_candidates(scope, model, self.settings.semantic_candidates)
            .await?;
        let mut ranked: Vec<MemoryItem> = candidates
            .into_iter()
            .map(|(mut item, v)| {
                item.score = Some(cosine(query, &v));
                item
            })
            .collect();
        ranked.sort_by(|a, b| {
            b.score
                .partial_cmp(&a.score)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(b.updated_at.cmp(&a.updated_at))
        });
        Ok(ranked
            .into_iter()
            .skip(offset as usize)
            .take(limit as usize)
            .collect())
    }

    /// The tenant's namespaces (LangGraph's `list_namespaces`): those under `prefix` and ending
    /// with `suffix`, cut to `maxDepth` labels, each once, in label order.
    ///
    /// # Errors
    /// 422 naming every invalid field.
    pub async fn namespaces(
        &self,
        tenant: &str,
        req: ListNamespaces,
    ) -> Result<Vec<Namespace>, Refusal> {
        let mut errors = Vec::new();
        let prefix = req
            .prefix
            .and_then(|p| self.namespace(p, "/prefix", true, &mut errors));
        let suffix = req
            .suffix
            .and_then(|s| self.namespace(s, "/suffix", true, &mut errors));
        let limit = req.limit.unwrap_or(100);
        if !(1..=MAX_NAMESPACES_LIMIT).contains(&limit) {
            errors.push(field(
                "/limit",
                format!("must be between 1 and {MAX_NAMESPACES_LIMIT}"),
            ));
        }
        if req.max_depth.is_some_and(|d| !(1..=100).contains(&d)) {
            errors.push(field("/maxDepth", "must be between 1 and 100"));
        }
        let offset = self.check_offset(req.offset, &mut errors);
        invalid(errors)?;
        Ok(self
            .store
            .list_memory_namespaces(
                tenant,
                prefix.as_ref(),
                suffix.as_ref(),
                req.max_depth.map(|d| d as usize),
                limit,
                offset,
            )
            .await?)
    }

    /// One pass of the embedding backfill: embed up to a batch of pending items; how many were
    /// stored.
    ///
    /// # Errors
    /// The provider or the store failed (the items stay pending).
    pub async fn embed_pending(&self) -> anyhow::Result<usize> {
        let Some(embedder) = &self.embedder else {
            return Ok(0);
        };
        let pending = self.store.pending_embeddings(EMBED_BATCH).await?;
        if pending.is_empty() {
            return Ok(0);
        }
        let texts: Vec<String> = pending.iter().map(|p| embed_text(&p.content)).collect();
        let vectors = embedder.embed(&texts).await?;
        let mut stored = 0;
        for (item, v) in pending.iter().zip(&vectors) {
            if self
                .store
                .store_embedding(item, v, embedder.model())
                .await?
            {
                stored += 1;
            }
        }
        Ok(stored)
    }
}

/// The text sent to be embedded: the item's searchable text, cut to what models take.
fn embed_text(content: &str) -> String {
    content.chars().take(MAX_EMBED_CHARS).collect()
}

#[async_trait]
impl MemoryAccess for Memory {
    async fn search(
        &self,
        tenant: &str,
        namespace: &Namespace,
        query: &str,
        limit: u32,
    ) -> Result<Vec<MemoryItem>, String> {
        let req = SearchItems {
            namespace_prefix: namespace.labels().to_vec(),
            query: Some(query.to_owned()),
            limit: Some(limit),
            ..SearchItems::default()
        };
        Memory::search(self, tenant, req)
            .await
            .map_err(|e| e.to_string())
    }

    async fn put(
        &self,
        tenant: &str,
        namespace: &Namespace,
        key: &str,
        value: Map<String, Value>,
        idempotency_key: &str,
    ) -> Result<(), String> {
        // A model may write what no store holds (a NUL); the REST doors refuse it earlier.
        let mut value = Value::Object(value);
        crate::model::scrub_nul(&mut value);
        let item = PutItem {
            namespace: namespace.labels().to_vec(),
            key: key.to_owned(),
            value,
            ttl_seconds: None,
        };
        Memory::put(self, tenant, item, Some(idempotency_key))
            .await
            .map_err(|e| e.to_string())
    }
}

/// Delete expired items every `every`, at most `batch` a pass (a full batch goes on at once),
/// until `stop` fires. Safe on every replica at once.
pub async fn sweep_periodically(
    store: Arc<SqlStore>,
    every: Duration,
    batch: u64,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        loop {
            match store.sweep_memory(batch).await {
                Ok(n) if n >= batch && !stop.is_cancelled() => {
                    debug!(deleted = n, "expired memory items deleted; more wait");
                }
                Ok(n) => {
                    if n > 0 {
                        debug!(deleted = n, "expired memory items deleted");
                    }
                    break;
                }
                Err(e) => {
                    warn!(error = %e, "the memory sweeper failed; it tries again");
                    break;
                }
            }
        }
    }
}

/// Embed the items that wait for it (written while the provider was unreachable, or before
/// embeddings were on, or under another model) every `every`, until `stop` fires. Marks the
/// items of other models once at start. Does nothing without embeddings.
pub async fn embed_periodically(memory: Memory, every: Duration, stop: CancellationToken) {
    let Some(model) = memory.embeddings_model().map(str::to_owned) else {
        return;
    };
    match memory.store.mark_unembedded(&model).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(items = n, %model, "memory items to embed with the model"),
        Err(e) => warn!(error = %e, "could not look for memory items to embed"),
    }
    loop {
        match memory.embed_pending().await {
            // A full batch: more may wait.
            Ok(n) if n as u32 >= EMBED_BATCH && !stop.is_cancelled() => continue,
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, "embedding pending memory items failed; trying again later")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
