//! The memory tools: `memory_search {query, limit?}` and `memory_put {key,
//! value}`, over the memory store, in the namespace of the calling thread's config
//! (`memoryNamespace`, default `["threads", <threadId>]`, carried by [`ToolContext`]). The store
//! is reached through [`MemoryAccess`], which the use-case layer implements (sizes, quota,
//! embeddings), so these tools know nothing of SQL.
//!
//! `memory_put` has side effects: the engine commits the model turn that asked for it before it
//! runs, and the call's idempotency key (`<runId>:<toolCallId>`) goes with the write, so a call
//! repeated after a crash stores nothing twice and answers the same.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use super::{Tool, ToolContext, ToolError};
use crate::model::memory::{MAX_KEY_CHARS, MemoryItem, Namespace};

/// How many items `memory_search` returns at most.
pub const MAX_SEARCH_LIMIT: u64 = 20;
/// How many it returns when the call does not say.
pub const DEFAULT_SEARCH_LIMIT: u64 = 5;

/// The memory store as the tools use it.
#[async_trait]
pub trait MemoryAccess: Send + Sync + 'static {
    /// The items in `namespace` and under it most relevant to `query`, at most `limit`.
    ///
    /// # Errors
    /// A message the model can read.
    // Text by design: the tool hands it to the model as its error (as for `put`).
    async fn search(
        &self,
        tenant: &str,
        namespace: &Namespace,
        query: &str,
        limit: u32,
    ) -> Result<Vec<MemoryItem>, String>;

    /// Store `value` under `key` in `namespace`; a write repeated under the same
    /// `idempotency_key` changes nothing.
    ///
    /// # Errors
    /// A message the model can read (a value too large, the tenant's quota reached).
    async fn put(
        &self,
        tenant: &str,
        namespace: &Namespace,
        key: &str,
        value: Map<String, Value>,
        idempotency_key: &str,
    ) -> Result<(), String>;
}

/// The namespace a call works in: the thread config's, else the thread's own.
fn namespace_of(ctx: &ToolContext) -> Result<Namespace, ToolError> {
    match &ctx.memory_namespace {
        Some(labels) => Namespace::parse(labels.clone(), usize::MAX, false)
            .map_err(|e| ToolError::Failed(format!("config.memoryNamespace {e}"))),
        None => Namespace::for_thread(&ctx.thread_id).map_err(|e| ToolError::Failed(e.to_string())),
    }
}

/// `memory_search`: what the agent remembers that is relevant to a query.
pub struct MemorySearchTool(Arc<dyn MemoryAccess>);

impl MemorySearchTool {
    pub fn new(memory: Arc<dyn MemoryAccess>) -> Self {
        Self(memory)
    }
}

#[async_trait]
impl Tool for MemorySearchTool {
    fn name(&self) -> &str {
        "memory_search"
    }

    fn description(&self) -> &str {
        "Search long-term memory (facts stored with memory_put, in this or earlier \
         conversations) for what is relevant to `query`. Returns the best matches first, each \
         with its key, value and score."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 2000,
                          "description": "What to look for, in words"},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_LIMIT,
                          "description": format!("How many items at most (default {DEFAULT_SEARCH_LIMIT})")}
            },
            "required": ["query"],
            "additionalProperties": false
        })
    }

    fn side_effects(&self) -> bool {
        false
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let ns = namespace_of(ctx)?;
        let query = args["query"].as_str().unwrap_or_default();
        let limit = args["limit"]
            .as_u64()
            .unwrap_or(DEFAULT_SEARCH_LIMIT)
            .clamp(1, MAX_SEARCH_LIMIT);
        let items = self
            .0
            .search(&ctx.tenant, &ns, query, u32::try_from(limit).unwrap_or(5))
            .await
            .map_err(ToolError::Failed)?;
        let items: Vec<Value> = items
            .into_iter()
            .map(|i| {
                let mut v = json!({"namespace": i.namespace, "key": i.key, "value": i.value});
                if let Some(s) = i.score {
                    v["score"] = json!(s);
                }
                v
            })
            .collect();
        Ok(json!({"namespace": ns, "items": items}))
    }
}

/// `memory_put`: remember a fact for later conversations.
pub struct MemoryPutTool(Arc<dyn MemoryAccess>);

impl MemoryPutTool {
    pub fn new(memory: Arc<dyn MemoryAccess>) -> Self {
        Self(memory)
    }
}

#[async_trait]
impl Tool for MemoryPutTool {
    fn name(&self) -> &str {
        "memory_put"
    }

    fn description(&self) -> &str {
        "Remember something for later conversations: store `value` (a JSON object, e.g. \
         {\"fact\": \"The user prefers tea\"}) under `key` in long-term memory. A key already \
         used is replaced. memory_search finds it again."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "key": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_CHARS,
                        "description": "A short name for what is remembered (e.g. `favourite-drink`)"},
                "value": {"type": "object", "description": "What to remember, as a JSON object"}
            },
            "required": ["key", "value"],
            "additionalProperties": false
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let ns = namespace_of(ctx)?;
        let key = args["key"].as_str().unwrap_or_default().to_owned();
        crate::model::memory::check_key(&key)
            .map_err(|e| ToolError::InvalidArguments(format!("/key {e}")))?;
        let Value::Object(value) = args["value"].clone() else {
            return Err(ToolError::InvalidArguments(
                "/value must be a JSON object".into(),
            ));
        };
        self.0
            .put(&ctx.tenant, &ns, &key, value, &ctx.idempotency_key)
            .await
            .map_err(ToolError::Failed)?;
        Ok(json!({"stored": true, "namespace": ns, "key": key}))
    }
}
