//! The memory store, per tenant, in the shape of LangGraph's store:
//! `PUT/GET/DELETE /v1/store/items`, `POST /v1/store/items/search` and
//! `POST /v1/store/namespaces`. The handlers parse the request and call
//! [`crate::commands::memory::Memory`]; the rules (sizes, namespaces, ranking) are there.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, AppJson, AppQuery, AppState, Problem, Tenant};
use crate::commands::memory::{ListNamespaces, PutItem, SearchItems};
use crate::model::MemoryItem;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(put_item, get_item, delete_item))
        .routes(routes!(search_items))
        .routes(routes!(list_namespaces))
}

/// Body of `PUT /v1/store/items`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"namespace": ["users", "42"], "key": "favourite-colour", "value": {"fact": "The user's favourite colour is green"}, "ttlSeconds": 2592000}))]
pub struct PutItemRequest {
    /// The namespace's labels: 1 to `PES_STORE_MAX_NAMESPACE_DEPTH` (10), each 1–128
    /// characters with no `.` and no control character.
    #[schema(min_items = 1)]
    pub namespace: Vec<String>,
    /// 1–512 characters, no control character.
    #[schema(min_length = 1, max_length = 512)]
    pub key: String,
    /// A JSON object of at most `PES_STORE_MAX_VALUE_BYTES` (64 KiB) of JSON. An item with
    /// the same namespace and key is replaced.
    #[schema(value_type = Object)]
    pub value: Value,
    /// The item expires this many seconds after this write (1 to ten years): invisible at once,
    /// then deleted by the sweeper. Absent: it never expires.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 315_360_000)]
    pub ttl_seconds: Option<u64>,
}

/// Body of `DELETE /v1/store/items`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"namespace": ["users", "42"], "key": "favourite-colour"}))]
pub struct DeleteItemRequest {
    #[schema(min_items = 1)]
    pub namespace: Vec<String>,
    #[schema(min_length = 1, max_length = 512)]
    pub key: String,
}

/// Which item to read (query string). Unknown parameters are refused (422).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GetItemParams {
    /// The namespace's labels joined by dots (`users.42`); required.
    #[param(min_length = 1, nullable = false)]
    pub namespace: Option<String>,
    /// The item's key; required.
    #[param(min_length = 1, max_length = 512, nullable = false)]
    pub key: Option<String>,
}

/// Body of `POST /v1/store/items/search`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"namespacePrefix": ["users", "42"], "query": "what colour does the user like", "limit": 5}))]
pub struct SearchItemsRequest {
    /// Items in this namespace or under it; `[]` (the default) searches every namespace.
    #[serde(default)]
    pub namespace_prefix: Vec<String>,
    /// Rank by relevance to this text (by meaning when `PES_EMBEDDINGS_MODEL` is set, else by
    /// full text: an item matches when it holds any of the query's words); each item gets a
    /// `score`. Absent: newest first.
    #[serde(default)]
    #[schema(max_length = 2000)]
    pub query: Option<String>,
    /// Keep the items whose top-level fields equal these values (JSON equality), at most 32.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub filter: Option<Map<String, Value>>,
    /// Items per page: 1–100, default 10.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    /// Items to skip: 0 to `PES_STORE_MAX_OFFSET` (1,000).
    #[serde(default)]
    #[schema(minimum = 0)]
    pub offset: Option<u32>,
}

/// Items found by a search.
#[derive(Debug, Serialize, ToSchema)]
pub struct SearchItemsResponse {
    pub items: Vec<MemoryItem>,
}

/// Body of `POST /v1/store/namespaces`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"prefix": ["users"], "maxDepth": 2}))]
pub struct ListNamespacesRequest {
    /// Only namespaces that start with these labels.
    #[serde(default)]
    pub prefix: Option<Vec<String>>,
    /// Only namespaces that end with these labels.
    #[serde(default)]
    pub suffix: Option<Vec<String>>,
    /// Cut each namespace to this many labels, 1–100 (then each appears once).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100)]
    pub max_depth: Option<u32>,
    /// Namespaces per page: 1–1,000, default 100.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// Namespaces to skip: 0 to `PES_STORE_MAX_OFFSET` (1,000).
    #[serde(default)]
    #[schema(minimum = 0)]
    pub offset: Option<u32>,
}

/// Namespaces found, in label order.
#[derive(Debug, Serialize, ToSchema)]
pub struct ListNamespacesResponse {
    #[schema(value_type = Vec<Vec<String>>)]
    pub namespaces: Vec<crate::model::Namespace>,
}

/// Store an item (or replace the one under the same namespace and key).
#[utoipa::path(put, path = "/v1/store/items", tag = "store", request_body = PutItemRequest,
    responses(
        (status = 204, description = "Stored"),
        (status = 422, description = "The item is not valid (`validation_failed`, naming every bad field), or its value is too large (`value_too_large`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn put_item(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppJson(body): AppJson<PutItemRequest>,
) -> Result<StatusCode, ApiError> {
    let item = PutItem {
        namespace: body.namespace,
        key: body.key,
        value: body.value,
        ttl_seconds: body.ttl_seconds,
    };
    state.cases.storage_room(&tenant).await?;
    state.cases.memory.put(&tenant, item, None).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Read an item.
#[utoipa::path(get, path = "/v1/store/items", tag = "store", params(GetItemParams),
    responses(
        (status = 200, description = "The item", body = MemoryItem),
        (status = 404, description = "No such item, or it expired (`item_not_found`)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn get_item(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppQuery(params): AppQuery<GetItemParams>,
) -> Result<AppJson<MemoryItem>, ApiError> {
    let (Some(namespace), Some(key)) = (params.namespace, params.key) else {
        return Err(ApiError::validation(
            "`namespace` (labels joined by dots) and `key` are required".into(),
        ));
    };
    Ok(AppJson(
        state.cases.memory.get(&tenant, &namespace, &key).await?,
    ))
}

/// Delete an item (one that is not there is no error).
#[utoipa::path(delete, path = "/v1/store/items", tag = "store", request_body = DeleteItemRequest,
    responses((status = 204, description = "Deleted, or there was no such item")))]
pub async fn delete_item(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppJson(body): AppJson<DeleteItemRequest>,
) -> Result<StatusCode, ApiError> {
    state
        .cases
        .memory
        .delete(&tenant, body.namespace, &body.key)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Search the items under a namespace prefix: most relevant to `query` first, or newest first.
#[utoipa::path(post, path = "/v1/store/items/search", tag = "store", request_body = SearchItemsRequest,
    responses((status = 200, description = "The items found", body = SearchItemsResponse)))]
pub async fn search_items(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppJson(body): AppJson<SearchItemsRequest>,
) -> Result<AppJson<SearchItemsResponse>, ApiError> {
    let req = SearchItems {
        namespace_prefix: body.namespace_prefix,
        query: body.query,
        filter: body.filter,
        limit: body.limit,
        offset: body.offset,
    };
    let items = state.cases.memory.search(&tenant, req).await?;
    Ok(AppJson(SearchItemsResponse { items }))
}

/// List the tenant's namespaces (those holding items), in label order.
#[utoipa::path(post, path = "/v1/store/namespaces", tag = "store", request_body = ListNamespacesRequest,
    responses((status = 200, description = "The namespaces", body = ListNamespacesResponse)))]
pub async fn list_namespaces(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    AppJson(body): AppJson<ListNamespacesRequest>,
) -> Result<AppJson<ListNamespacesResponse>, ApiError> {
    let req = ListNamespaces {
        prefix: body.prefix,
        suffix: body.suffix,
        max_depth: body.max_depth,
        limit: body.limit,
        offset: body.offset,
    };
    let namespaces = state.cases.memory.namespaces(&tenant, req).await?;
    Ok(AppJson(ListNamespacesResponse { namespaces }))
}
