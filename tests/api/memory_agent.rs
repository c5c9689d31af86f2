//! Memory beyond full text, on both stores: semantic search with the fake model's deterministic
//! embeddings, an embeddings outage that loses nothing (the item is embedded later), the agent's
//! `memory_put` and `memory_search` carrying a fact from one thread to another, and a write
//! repeated under its idempotency key that changes nothing.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, TestApp, send, spawn_with};
use crate::memory::{keys, put, search};

/// An app whose memory ranks by meaning through the fake model's embeddings.
async fn semantic_app(backend: Backend, llm: &FakeLlm) -> TestApp {
    spawn_with(backend, Some(llm), |c| {
        c.embeddings_model = Some("fake-embed".into());
        c.embeddings_pass_ms = 20;
    })
    .await
}

async fn facts(app: &TestApp) {
    for (k, fact) in [
        ("pet", "The user has a dog called Rex"),
        ("neighbour", "The neighbour owns a grey cat"),
        ("drink", "Mornings start with an espresso"),
    ] {
        put(
            app,
            None,
            json!({"namespace": ["users", "ann"], "key": k, "value": {"fact": fact}}),
        )
        .await;
    }
}

async fn semantic_search_ranks_by_meaning(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = semantic_app(backend, &llm).await;
    facts(&app).await;
    assert!(llm.embedding_calls() >= 3, "each write was embedded");
    // No item holds "puppy" or "beverage": full text finds nothing, meaning finds them.
    let found = search(&app, None, json!({"query": "Does she have a puppy?"})).await;
    assert_eq!(found[0]["key"], "pet", "{found:#?}");
    let s0 = found[0]["score"].as_f64().unwrap();
    let s1 = found[1]["score"].as_f64().unwrap();
    assert!(
        s0 > s1 && s0 <= 1.0,
        "cosine scores, best first: {found:#?}"
    );
    let drink = search(
        &app,
        None,
        json!({"query": "favourite beverage", "limit": 1}),
    )
    .await;
    assert_eq!(keys(&drink), ["drink"]);
    // A filter and a prefix narrow the candidates as in full text.
    let none = search(
        &app,
        None,
        json!({"namespacePrefix": ["users", "bob"], "query": "puppy"}),
    )
    .await;
    assert!(none.is_empty());
    app.stop().await;
}
both_stores!(semantic_ranking, semantic_search_ranks_by_meaning);

async fn an_embeddings_outage_loses_no_item_and_it_is_embedded_later(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = semantic_app(backend, &llm).await;
    llm.embeddings_down(true);
    put(
        &app,
        None,
        json!({"namespace": ["users", "ann"], "key": "pet",
                           "value": {"fact": "The user has a dog called Rex"}}),
    )
    .await;
    let (s, item) = send(
        &app,
        Method::GET,
        "/v1/store/items?namespace=users.ann&key=pet",
        None,
        None,
    )
    .await;
    assert_eq!(s, 200, "stored while the provider is down: {item}");
    // The query cannot be embedded either: it ranks by full text, so words still find it.
    let by_words = search(&app, None, json!({"query": "dog"})).await;
    assert_eq!(keys(&by_words), ["pet"]);
    let by_meaning = search(&app, None, json!({"query": "puppy"})).await;
    assert!(by_meaning.is_empty(), "no embeddings yet: {by_meaning:#?}");
    llm.embeddings_down(false);
    // The background pass embeds it: then meaning finds it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let found = search(&app, None, json!({"query": "puppy"})).await;
        if keys(&found) == ["pet"] {
            assert!(found[0]["score"].as_f64().unwrap() > 0.3, "{found:#?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never embedded: {found:#?}"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    app.stop().await;
}
both_stores!(
    embeddings_outage,
    an_embeddings_outage_loses_no_item_and_it_is_embedded_later
);

/// The `TOOL_EXECUTION` output of the thread's first call of `tool`.
async fn tool_output(app: &TestApp, thread: &str, tool: &str) -> Value {
    let obs = app
        .wait_observation(thread, |o| {
            o["type"] == "TOOL_EXECUTION" && o["content"]["name"] == tool
        })
        .await;
    assert_eq!(obs["content"]["status"], "success", "{obs}");
    obs["content"]["output"].clone()
}

/// One thread remembers with `memory_put`; another, using the same assistant (whose config
/// sets `memoryNamespace`), finds it with `memory_search`. A thread with no namespace of its own
/// remembers in `["threads", <id>]`.
async fn an_agent_carries_a_fact_from_one_thread_to_another(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    let (s, tools) = app.get("/v1/tools").await;
    assert_eq!(s, 200);
    let names: Vec<&str> = tools["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"memory_put") && names.contains(&"memory_search"),
        "{names:?}"
    );

    let (s, assistant) = app
        .post(
            "/v1/assistants",
            json!({"name": "Ann's helper",
               "config": {"memoryNamespace": ["users", "ann"]}}),
        )
        .await;
    assert_eq!(s, 201, "{assistant}");
    let id = assistant["assistantId"].as_str().unwrap();

    let first = app.thread(json!({"assistantId": id})).await;
    llm.push(
        "plan",
        plan(&[("remember", "Remember what Ann drinks", &["memory_put"], &[])]),
    );
    llm.push_item(
        "remember",
        Reply::ToolCalls(vec![(
            "memory_put".into(),
            json!({
        "key": "drink", "value": {"fact": "Ann drinks green tea, never coffee"}}),
        )]),
    );
    let run = app.run_wait(&first, "I only drink green tea").await;
    assert_eq!(run["status"], "completed", "{run}");
    let out = tool_output(&app, &first, "memory_put").await;
    assert_eq!(
        out,
        json!({"stored": true, "namespace": ["users", "ann"], "key": "drink"})
    );

    let second = app.thread(json!({"assistantId": id})).await;
    llm.push(
        "plan",
        plan(&[("recall", "Recall what Ann drinks", &["memory_search"], &[])]),
    );
    llm.push_item(
        "recall",
        Reply::ToolCalls(vec![(
            "memory_search".into(),
            json!({"query": "what does Ann drink?"}),
        )]),
    );
    let run = app.run_wait(&second, "What should I offer her?").await;
    assert_eq!(run["status"], "completed", "{run}");
    let out = tool_output(&app, &second, "memory_search").await;
    assert_eq!(out["namespace"], json!(["users", "ann"]));
    assert_eq!(out["items"][0]["key"], "drink", "{out}");
    assert_eq!(
        out["items"][0]["value"]["fact"],
        "Ann drinks green tea, never coffee"
    );
    // The model read it back: the tool message of its next call holds the fact.
    let asked = llm.requests_of("execute");
    let last = asked
        .iter()
        .rev()
        .find(|r| r["messages"].to_string().contains("memory_search"))
        .unwrap();
    assert!(
        last["messages"]
            .to_string()
            .contains("Ann drinks green tea"),
        "{last}"
    );

    // A thread without a namespace remembers on its own.
    let own = app.thread(json!({})).await;
    llm.push("plan", plan(&[("note", "Note it", &["memory_put"], &[])]));
    llm.push_item(
        "note",
        Reply::ToolCalls(vec![(
            "memory_put".into(),
            json!({"key": "k", "value": {"fact": "thread-local"}}),
        )]),
    );
    assert_eq!(app.run_wait(&own, "note").await["status"], "completed");
    let path = format!("/v1/store/items?namespace=threads.{own}&key=k");
    let (s, item) = send(&app, Method::GET, &path, None, None).await;
    assert_eq!(
        (s, &item["value"]["fact"]),
        (200, &json!("thread-local")),
        "{item}"
    );
    app.stop().await;
}
both_stores!(
    agent_memory,
    an_agent_carries_a_fact_from_one_thread_to_another
);

/// A write repeated under the idempotency key of its first (a tool call run again after a
/// crash) changes nothing, even when another write came in between.
async fn a_write_repeated_under_its_idempotency_key_changes_nothing(backend: Backend) {
    use pes_server::model::Namespace;
    use pes_server::store::{MemoryPut, PutMemory};
    let (store, _dir) = match backend {
        Backend::Postgres => (crate::db::postgres_store().await, None),
        Backend::Sqlite => {
            let (s, d) = crate::db::sqlite_store().await;
            (s, Some(d))
        }
    };
    let ns = Namespace::parse(vec!["u".into()], 10, false).unwrap();
    let write = |value: &'static Value, key: Option<&'static str>| MemoryPut {
        tenant: "t",
        namespace: &ns,
        key: "k",
        value,
        content: "x",
        embedding: None,
        embed_pending: false,
        ttl_seconds: None,
        idempotency_key: key,
    };
    static V1: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| json!({"v": 1}));
    static V2: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| json!({"v": 2}));
    assert_eq!(
        store
            .put_memory(&write(&V1, Some("run:call_1")), 10)
            .await
            .unwrap(),
        PutMemory::Stored { created: true }
    );
    assert_eq!(
        store.put_memory(&write(&V2, None), 10).await.unwrap(),
        PutMemory::Stored { created: false }
    );
    assert_eq!(
        store
            .put_memory(&write(&V1, Some("run:call_1")), 10)
            .await
            .unwrap(),
        PutMemory::Repeated
    );
    let item = store.get_memory("t", &ns, "k").await.unwrap().unwrap();
    assert_eq!(
        Value::Object(item.value),
        json!({"v": 2}),
        "the later write stands"
    );
}
both_stores!(
    idempotent_put,
    a_write_repeated_under_its_idempotency_key_changes_nothing
);
