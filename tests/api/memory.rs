//! The memory store over HTTP, on both stores: items stored, read, replaced and deleted; namespaces
//! listed by prefix, suffix and depth; filters and pages; full-text ranking; TTLs (invisible at
//! once, swept later); tenants that never see each other's items; and every bad request a clear
//! problem. Semantic search and the agent's memory tools are in `memory_agent`.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{
    Backend, TestApp, assert_problem, database_url, send, spawn, spawn_config, test_config,
};

/// Store an item (as `key`'s tenant); asserts 204.
pub async fn put(app: &TestApp, key: Option<&str>, body: Value) {
    let got = send(app, Method::PUT, "/v1/store/items", key, Some(body.clone())).await;
    assert_eq!(got.0, 204, "{body}: {}", got.1);
}

/// Search (as `key`'s tenant); the items found.
pub async fn search(app: &TestApp, key: Option<&str>, body: Value) -> Vec<Value> {
    let (s, r) = send(app, Method::POST, "/v1/store/items/search", key, Some(body)).await;
    assert_eq!(s, 200, "{r}");
    r["items"].as_array().unwrap().clone()
}

/// The keys of found items, in order.
pub fn keys(items: &[Value]) -> Vec<&str> {
    items.iter().map(|i| i["key"].as_str().unwrap()).collect()
}

async fn namespaces(app: &TestApp, body: Value) -> Value {
    let (s, r) = send(app, Method::POST, "/v1/store/namespaces", None, Some(body)).await;
    assert_eq!(s, 200, "{r}");
    r["namespaces"].clone()
}

async fn get(app: &TestApp, key: Option<&str>, ns: &str, k: &str) -> (u16, Value) {
    let path = format!("/v1/store/items?namespace={ns}&key={k}");
    send(app, Method::GET, &path, key, None).await
}

async fn items_are_stored_read_replaced_and_deleted(backend: Backend) {
    let app = spawn(backend, None).await;
    put(
        &app,
        None,
        json!({"namespace": ["users", "42"], "key": "drink", "value": {"fact": "likes tea"}}),
    )
    .await;
    let (s, first) = get(&app, None, "users.42", "drink").await;
    assert_eq!(s, 200, "{first}");
    assert_eq!(first["namespace"], json!(["users", "42"]));
    assert_eq!(first["value"], json!({"fact": "likes tea"}));
    assert_eq!(first["createdAt"], first["updatedAt"]);
    assert!(first.get("score").is_none() && first.get("expiresAt").is_none());

    put(
        &app,
        None,
        json!({"namespace": ["users", "42"], "key": "drink", "value": {"fact": "likes coffee"}}),
    )
    .await;
    let (_, second) = get(&app, None, "users.42", "drink").await;
    assert_eq!(second["value"], json!({"fact": "likes coffee"}), "replaced");
    assert_eq!(second["createdAt"], first["createdAt"]);
    assert_ne!(second["updatedAt"], first["updatedAt"]);
    // A namespace is exact: the parent holds nothing under that key.
    assert_problem(
        &get(&app, None, "users", "drink").await,
        404,
        "item_not_found",
    );

    let body = json!({"namespace": ["users", "42"], "key": "drink"});
    let del = send(
        &app,
        Method::DELETE,
        "/v1/store/items",
        None,
        Some(body.clone()),
    )
    .await;
    assert_eq!(del.0, 204, "{}", del.1);
    assert_problem(
        &get(&app, None, "users.42", "drink").await,
        404,
        "item_not_found",
    );
    let again = send(&app, Method::DELETE, "/v1/store/items", None, Some(body)).await;
    assert_eq!(again.0, 204, "deleting what is gone is no error");
    assert!(search(&app, None, json!({})).await.is_empty());
    app.stop().await;
}
both_stores!(crud, items_are_stored_read_replaced_and_deleted);

async fn namespaces_are_listed_by_prefix_suffix_and_depth(backend: Backend) {
    let app = spawn(backend, None).await;
    for ns in [
        json!(["users", "1", "prefs"]),
        json!(["users", "1", "facts"]),
        json!(["users", "2", "prefs"]),
        json!(["users", "1"]),
        json!(["users-old", "9"]),
        json!(["threads", "t1"]),
    ] {
        for k in ["a", "b"] {
            put(
                &app,
                None,
                json!({"namespace": ns, "key": k, "value": {"x": 1}}),
            )
            .await;
        }
    }
    assert_eq!(
        namespaces(&app, json!({})).await,
        json!([
            ["threads", "t1"],
            ["users", "1"],
            ["users", "1", "facts"],
            ["users", "1", "prefs"],
            ["users", "2", "prefs"],
            ["users-old", "9"]
        ]),
        "every namespace once, in label order (`users` before `users-old`)"
    );
    assert_eq!(
        namespaces(&app, json!({"prefix": ["users"]})).await,
        json!([
            ["users", "1"],
            ["users", "1", "facts"],
            ["users", "1", "prefs"],
            ["users", "2", "prefs"]
        ])
    );
    assert_eq!(
        namespaces(&app, json!({"prefix": ["users"], "maxDepth": 2})).await,
        json!([["users", "1"], ["users", "2"]])
    );
    assert_eq!(
        namespaces(&app, json!({"maxDepth": 1})).await,
        json!([["threads"], ["users"], ["users-old"]])
    );
    assert_eq!(
        namespaces(&app, json!({"suffix": ["prefs"]})).await,
        json!([["users", "1", "prefs"], ["users", "2", "prefs"]])
    );
    assert_eq!(
        namespaces(&app, json!({"suffix": ["1", "prefs"], "prefix": ["users"]})).await,
        json!([["users", "1", "prefs"]])
    );
    assert_eq!(
        namespaces(&app, json!({"prefix": ["users"], "limit": 2, "offset": 1})).await,
        json!([["users", "1", "facts"], ["users", "1", "prefs"]])
    );
    assert_eq!(
        namespaces(&app, json!({"prefix": ["nobody"]})).await,
        json!([])
    );
    app.stop().await;
}
both_stores!(
    namespaces_listed,
    namespaces_are_listed_by_prefix_suffix_and_depth
);

async fn searches_filter_by_fields_and_page_newest_first(backend: Backend) {
    let app = spawn(backend, None).await;
    for (i, kind) in ["pet", "food", "pet", "pet", "food"].iter().enumerate() {
        put(
            &app,
            None,
            json!({"namespace": ["u", "1"], "key": format!("k{i}"),
                   "value": {"kind": kind, "n": i, "ok": i % 2 == 0, "meta": {"v": i}}}),
        )
        .await;
    }
    put(
        &app,
        None,
        json!({"namespace": ["u", "2"], "key": "other", "value": {"kind": "pet"}}),
    )
    .await;
    let all = search(&app, None, json!({"namespacePrefix": ["u", "1"]})).await;
    assert_eq!(keys(&all), ["k4", "k3", "k2", "k1", "k0"], "newest first");
    let pets = search(
        &app,
        None,
        json!({"namespacePrefix": ["u"], "filter": {"kind": "pet"}}),
    )
    .await;
    assert_eq!(keys(&pets), ["other", "k3", "k2", "k0"]);
    let filtered = search(
        &app,
        None,
        json!({"namespacePrefix": ["u", "1"], "filter": {"kind": "pet", "ok": true}}),
    )
    .await;
    assert_eq!(keys(&filtered), ["k2", "k0"]);
    let by_number = search(&app, None, json!({"filter": {"n": 3}})).await;
    assert_eq!(keys(&by_number), ["k3"]);
    let by_object = search(&app, None, json!({"filter": {"meta": {"v": 4}}})).await;
    assert_eq!(keys(&by_object), ["k4"]);
    let none = search(&app, None, json!({"filter": {"kind": "car"}})).await;
    assert!(none.is_empty());
    let page1 = search(
        &app,
        None,
        json!({"namespacePrefix": ["u", "1"], "limit": 2}),
    )
    .await;
    let page2 = search(
        &app,
        None,
        json!({"namespacePrefix": ["u", "1"], "limit": 2, "offset": 2}),
    )
    .await;
    let page3 = search(
        &app,
        None,
        json!({"namespacePrefix": ["u", "1"], "limit": 2, "offset": 4}),
    )
    .await;
    assert_eq!(
        (keys(&page1), keys(&page2), keys(&page3)),
        (vec!["k4", "k3"], vec!["k2", "k1"], vec!["k0"])
    );
    app.stop().await;
}
both_stores!(
    filters_and_pages,
    searches_filter_by_fields_and_page_newest_first
);

async fn full_text_ranks_the_item_that_matches_first(backend: Backend) {
    let app = spawn(backend, None).await;
    let facts = [
        ("weather", "It rained in Lisbon on Tuesday"),
        (
            "colour",
            "The user's favourite colour is green, like the sea",
        ),
        ("green-tea", "The user drinks green tea every morning"),
        ("car", "The user drives an old blue van"),
        ("meeting", "Weekly meeting moved to Thursdays"),
    ];
    for (k, fact) in facts {
        put(
            &app,
            None,
            json!({"namespace": ["users", "7"], "key": k, "value": {"fact": fact}}),
        )
        .await;
    }
    let found = search(
        &app,
        None,
        json!({"namespacePrefix": ["users"], "query": "what is the user's favourite colour?"}),
    )
    .await;
    assert_eq!(found[0]["key"], "colour", "{found:#?}");
    assert!(
        !keys(&found).contains(&"weather") && !keys(&found).contains(&"meeting"),
        "items holding none of the words are not found: {found:#?}"
    );
    let scores: Vec<f64> = found.iter().map(|i| i["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    // Stemming: "drinking" finds "drinks".
    let tea = search(&app, None, json!({"query": "drinking", "limit": 1})).await;
    assert_eq!(keys(&tea), ["green-tea"]);
    // The query ranks within the prefix only.
    let elsewhere = search(
        &app,
        None,
        json!({"namespacePrefix": ["other"], "query": "green"}),
    )
    .await;
    assert!(elsewhere.is_empty());
    // A filter narrows a ranked search too.
    put(
        &app,
        None,
        json!({"namespace": ["users", "8"], "key": "colour",
                           "value": {"fact": "favourite colour: red", "tag": "x"}}),
    )
    .await;
    let tagged = search(
        &app,
        None,
        json!({"query": "favourite colour", "filter": {"tag": "x"}}),
    )
    .await;
    assert_eq!(tagged.len(), 1);
    assert_eq!(tagged[0]["namespace"], json!(["users", "8"]));
    app.stop().await;
}
both_stores!(
    full_text_ranking,
    full_text_ranks_the_item_that_matches_first
);

/// An item past its TTL is gone for every read at once, while it still counts (the sweeper has
/// not run); a later app whose sweeper runs deletes it, which frees the quota.
async fn expired_items_vanish_at_once_and_are_swept(backend: Backend) {
    let url = database_url(backend).await;
    let mut config = test_config(&url, None);
    config.store_sweep_ms = 3_600_000;
    config.tenant_max_store_items = 2;
    let app = spawn_config(config.clone()).await;
    put(
        &app,
        None,
        json!({"namespace": ["t"], "key": "brief", "value": {"x": "soon gone"}, "ttlSeconds": 1}),
    )
    .await;
    put(
        &app,
        None,
        json!({"namespace": ["t"], "key": "kept", "value": {"x": "stays"}}),
    )
    .await;
    let (s, item) = get(&app, None, "t", "brief").await;
    assert_eq!(s, 200, "{item}");
    assert!(item["expiresAt"].is_string(), "{item}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while get(&app, None, "t", "brief").await.0 == 200 {
        assert!(tokio::time::Instant::now() < deadline, "never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(keys(&search(&app, None, json!({})).await), ["kept"]);
    assert_eq!(
        keys(&search(&app, None, json!({"query": "soon gone"})).await),
        Vec::<&str>::new()
    );
    let new = json!({"namespace": ["u"], "key": "new", "value": {"x": 1}});
    let refused = send(&app, Method::PUT, "/v1/store/items", None, Some(new)).await;
    assert_problem(&refused, 429, "quota_exceeded");
    app.stop().await;

    config.store_sweep_ms = 20;
    let app = spawn_config(config).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = send(
            &app,
            Method::PUT,
            "/v1/store/items",
            None,
            Some(json!({"namespace": ["u"], "key": "new", "value": {"x": 1}})),
        )
        .await;
        if got.0 == 204 {
            break;
        }
        assert_problem(&got, 429, "quota_exceeded");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sweeper never deleted it"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(namespaces(&app, json!({})).await, json!([["t"], ["u"]]));
    app.stop().await;
}
both_stores!(ttl, expired_items_vanish_at_once_and_are_swept);

async fn tenants_never_see_each_others_items(backend: Backend) {
    let url = database_url(backend).await;
    let mut config = test_config(&url, None);
    config.api_keys = Some("ka:alpha,kb:beta".into());
    let app = spawn_config(config).await;
    let (a, b) = (Some("ka"), Some("kb"));
    put(
        &app,
        a,
        json!({"namespace": ["users", "1"], "key": "secret", "value": {"fact": "alpha's plan"}}),
    )
    .await;
    assert_problem(
        &get(&app, b, "users.1", "secret").await,
        404,
        "item_not_found",
    );
    assert!(search(&app, b, json!({"query": "plan"})).await.is_empty());
    assert!(search(&app, b, json!({})).await.is_empty());
    let (_, ns) = send(
        &app,
        Method::POST,
        "/v1/store/namespaces",
        b,
        Some(json!({})),
    )
    .await;
    assert_eq!(ns["namespaces"], json!([]));
    // The same namespace and key are another item for beta; deleting it leaves alpha's.
    put(
        &app,
        b,
        json!({"namespace": ["users", "1"], "key": "secret", "value": {"fact": "beta's"}}),
    )
    .await;
    let body = json!({"namespace": ["users", "1"], "key": "secret"});
    assert_eq!(
        send(&app, Method::DELETE, "/v1/store/items", b, Some(body))
            .await
            .0,
        204
    );
    let (s, item) = get(&app, a, "users.1", "secret").await;
    assert_eq!((s, &item["value"]["fact"]), (200, &json!("alpha's plan")));
    assert_eq!(get(&app, None, "users.1", "secret").await.0, 401);
    app.stop().await;
}
both_stores!(tenant_isolation, tenants_never_see_each_others_items);

async fn bad_requests_are_clear_problems(backend: Backend) {
    let url = database_url(backend).await;
    let mut config = test_config(&url, None);
    config.store_max_value_bytes = 100;
    config.store_max_namespace_depth = 3;
    config.tenant_max_store_items = 1;
    let app = spawn_config(config).await;
    let item =
        |ns: Value, key: Value, value: Value| json!({"namespace": ns, "key": key, "value": value});
    for (body, field) in [
        (item(json!([]), json!("k"), json!({})), "/namespace"),
        (item(json!(["a.b"]), json!("k"), json!({})), "/namespace"),
        (item(json!(["a", ""]), json!("k"), json!({})), "/namespace"),
        (item(json!(["a\u{1}"]), json!("k"), json!({})), "/namespace"),
        (
            item(json!(["a", "b", "c", "d"]), json!("k"), json!({})),
            "/namespace",
        ),
        (item(json!(["a"]), json!(""), json!({})), "/key"),
        (
            item(json!(["a"]), json!("k".repeat(513)), json!({})),
            "/key",
        ),
        (item(json!(["a"]), json!("k"), json!([1, 2])), "/value"),
        (item(json!(["a"]), json!("k"), json!("text")), "/value"),
        (
            json!({"namespace": ["a"], "key": "k", "value": {}, "ttlSeconds": 0}),
            "/ttlSeconds",
        ),
    ] {
        let got = send(
            &app,
            Method::PUT,
            "/v1/store/items",
            None,
            Some(body.clone()),
        )
        .await;
        assert_problem(&got, 422, "validation_failed");
        assert_eq!(got.1["errors"][0]["path"], field, "{body}: {}", got.1);
    }
    let big = item(json!(["a"]), json!("k"), json!({"text": "x".repeat(200)}));
    let got = send(&app, Method::PUT, "/v1/store/items", None, Some(big)).await;
    assert_problem(&got, 422, "value_too_large");
    assert!(
        got.1["detail"]
            .as_str()
            .unwrap()
            .contains("PES_STORE_MAX_VALUE_BYTES")
    );
    let unknown = json!({"namespace": ["a"], "key": "k", "value": {}, "ttl": 5});
    let got = send(&app, Method::PUT, "/v1/store/items", None, Some(unknown)).await;
    assert_eq!(got.0, 422, "{}", got.1);
    put(&app, None, item(json!(["a"]), json!("k"), json!({}))).await;
    // Replacing an item is no new item; a second one is past the quota of 1.
    put(&app, None, item(json!(["a"]), json!("k"), json!({"v": 2}))).await;
    let got = send(
        &app,
        Method::PUT,
        "/v1/store/items",
        None,
        Some(item(json!(["a"]), json!("k2"), json!({}))),
    )
    .await;
    assert_problem(&got, 429, "quota_exceeded");
    assert!(
        got.1["detail"]
            .as_str()
            .unwrap()
            .contains("PES_TENANT_MAX_STORE_ITEMS")
    );

    for path in [
        "/v1/store/items",
        "/v1/store/items?namespace=a",
        "/v1/store/items?key=k",
        "/v1/store/items?namespace=a..b&key=k",
        "/v1/store/items?namespace=a&key=k&extra=1",
    ] {
        let got = send(&app, Method::GET, path, None, None).await;
        assert_eq!(got.0, 422, "{path}: {}", got.1);
    }
    for (body, field) in [
        (json!({"limit": 0}), "/limit"),
        (json!({"limit": 101}), "/limit"),
        (json!({"offset": 1001}), "/offset"),
        (json!({"query": "q".repeat(2001)}), "/query"),
        (json!({"namespacePrefix": ["a.b"]}), "/namespacePrefix"),
        (json!({"filter": {"": 1}}), "/filter"),
    ] {
        let got = send(
            &app,
            Method::POST,
            "/v1/store/items/search",
            None,
            Some(body.clone()),
        )
        .await;
        assert_problem(&got, 422, "validation_failed");
        assert_eq!(got.1["errors"][0]["path"], field, "{body}: {}", got.1);
    }
    for (body, field) in [
        (json!({"limit": 0}), "/limit"),
        (json!({"maxDepth": 0}), "/maxDepth"),
        (json!({"offset": 5000}), "/offset"),
        (json!({"suffix": [""]}), "/suffix"),
    ] {
        let got = send(
            &app,
            Method::POST,
            "/v1/store/namespaces",
            None,
            Some(body.clone()),
        )
        .await;
        assert_problem(&got, 422, "validation_failed");
        assert_eq!(got.1["errors"][0]["path"], field, "{body}: {}", got.1);
    }
    let bad_delete = json!({"namespace": [], "key": "k"});
    let got = send(
        &app,
        Method::DELETE,
        "/v1/store/items",
        None,
        Some(bad_delete),
    )
    .await;
    assert_problem(&got, 422, "validation_failed");
    // The thread config's namespace is checked like the store's.
    let (s, body) = app
        .post(
            "/v1/threads",
            json!({"config": {"memoryNamespace": ["a.b"]}}),
        )
        .await;
    assert_eq!(s, 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("memoryNamespace"),
        "{body}"
    );
    let (s, body) = app
        .post(
            "/v1/threads",
            json!({"config": {"memoryNamespace": ["a", "b", "c", "d"]}}),
        )
        .await;
    assert_eq!(s, 422, "{body}");
    app.stop().await;
}
both_stores!(bad_input, bad_requests_are_clear_problems);
