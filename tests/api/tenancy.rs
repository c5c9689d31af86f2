//! What keeps one tenant from hurting another or the process: JSON-only writes, per-tenant quotas
//! (429 `quota_exceeded` with `Retry-After`), claims that serve tenants in turn, approval and tool
//! floors a run cannot loosen, `/metrics` without tenant data and behind its own key, and a cap on
//! every stored tool result.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, TestApp, database_url, read, spawn_config, spawn_with, test_config};

/// POST `body` as `tenant`'s key.
async fn post_as(app: &TestApp, key: &str, path: &str, body: Value) -> reqwest::Response {
    app.client
        .post(app.url(path))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn assert_quota(r: &reqwest::Response) {
    assert_eq!(r.status().as_u16(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1, "Retry-After: {retry}");
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
}

async fn a_write_that_is_not_json_is_refused_before_it_starts_anything(backend: Backend) {
    let app = spawn_with(backend, None, |_| {}).await;
    let t = app.thread(json!({})).await;
    // What a cross-site form or `text/plain` fetch can send without a preflight.
    let query = r#"{"query": "What is 2+2?"}"#;
    for (path, content_type) in [
        (format!("/v1/threads/{t}/runs"), "text/plain"),
        (
            format!("/v1/threads/{t}/runs"),
            "application/x-www-form-urlencoded",
        ),
        (
            format!("/v1/threads/{t}/runs/wait"),
            "multipart/form-data; boundary=x",
        ),
        ("/a2a".to_owned(), "text/plain"),
        ("/v1/threads".to_owned(), "text/plain;charset=UTF-8"),
    ] {
        let r = app
            .client
            .post(app.url(&path))
            .header("content-type", content_type)
            .body(query)
            .send()
            .await
            .unwrap();
        let (status, body) = read(r).await;
        assert_eq!(status, 415, "{path} {content_type}: {body}");
        assert_eq!(body["code"], "unsupported_media_type", "{body}");
    }
    // A body with no Content-Type at all is refused too.
    let r = app
        .client
        .post(app.url("/a2a"))
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    // Nothing started: the thread has no run.
    let (_, runs) = app.get(&format!("/v1/threads/{t}/runs")).await;
    assert_eq!(runs["items"], json!([]), "{runs}");
    // JSON (and `application/*+json`) goes through.
    let r = app
        .client
        .post(app.url(&format!("/v1/threads/{t}/runs/wait")))
        .header("content-type", "application/json; charset=utf-8")
        .body(query)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = app
        .client
        .post(app.url("/a2a"))
        .header("content-type", "application/a2a+json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"nope"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    app.stop().await;
}
both_stores!(
    json_only,
    a_write_that_is_not_json_is_refused_before_it_starts_anything
);

async fn quotas_refuse_one_tenant_and_leave_the_other_alone(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.api_keys = Some("ka:acme,kb:globex".into());
        // No worker: runs stay queued, so the count is exact.
        c.worker_concurrency = 0;
        c.tenant_max_active_runs = 3;
        c.tenant_max_streams = 2;
        c.tenant_max_flowcharts = 1;
        c.sse_keepalive_seconds = 1;
    })
    .await;
    // Runs: three queued, the fourth refused; another tenant is not affected.
    let body = json!({"query": "What is 2+2?", "ifNotExists": "create"});
    for i in 0..3 {
        let r = post_as(&app, "ka", &format!("/v1/threads/a{i}/runs"), body.clone()).await;
        assert_eq!(r.status().as_u16(), 202);
    }
    let r = post_as(&app, "ka", "/v1/threads/a9/runs", body.clone()).await;
    assert_quota(&r);
    let (_, problem) = read(r).await;
    assert_eq!(problem["code"], "quota_exceeded");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("PES_TENANT_MAX_ACTIVE_RUNS"),
        "{problem}"
    );
    // The refused run created nothing, not even its thread.
    let (s, _) = app.get_as("ka", "/v1/threads/a9").await;
    assert_eq!(s, 404);
    let r = post_as(&app, "kb", "/v1/threads/b0/runs", body.clone()).await;
    assert_eq!(r.status().as_u16(), 202);
    // Cancelling one frees its place.
    let (_, runs) = app.get_as("ka", "/v1/threads/a0/runs").await;
    let run_id = runs["items"][0]["runId"].as_str().unwrap().to_owned();
    let r = post_as(
        &app,
        "ka",
        &format!("/v1/threads/a0/runs/{run_id}/cancel"),
        json!({}),
    )
    .await;
    assert_eq!(r.status().as_u16(), 202);
    let r = post_as(&app, "ka", "/v1/threads/a9/runs", body.clone()).await;
    assert_eq!(r.status().as_u16(), 202);

    // Streams: two open, the third refused; the other tenant streams; a closed one comes back.
    let stream = |key: &'static str, thread: &'static str| {
        app.client
            .get(app.url(&format!("/v1/threads/{thread}/events")))
            .bearer_auth(key)
            .send()
    };
    let s1 = stream("ka", "a1").await.unwrap();
    let s2 = stream("ka", "a2").await.unwrap();
    assert_eq!((s1.status().as_u16(), s2.status().as_u16()), (200, 200));
    let refused = stream("ka", "a1").await.unwrap();
    assert_quota(&refused);
    let other = stream("kb", "b0").await.unwrap();
    assert_eq!(other.status().as_u16(), 200);
    drop(s1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        // The server notices the closed connection at its next keep-alive at the latest.
        let again = stream("ka", "a1").await.unwrap();
        if again.status().as_u16() == 200 {
            break;
        }
        assert_quota(&again);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Flowcharts: one per tenant here; a new version of it is fine, a second name is not.
    let chart = json!({
        "description": "Echo the input",
        "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        "flowchart": {"start": "out", "stages": {
            "out": {"kind": "end", "result": {"echo": {"var": "args.x"}}}
        }}
    });
    let put = |key: &'static str, name: &'static str| {
        app.client
            .put(app.url(&format!("/v1/flowcharts/{name}")))
            .bearer_auth(key)
            .json(&chart)
            .send()
    };
    let r = put("ka", "echo_one").await.unwrap();
    assert_eq!(r.status().as_u16(), 201, "{:?}", r.text().await);
    let r = put("ka", "echo_one").await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = put("ka", "echo_two").await.unwrap();
    assert_quota(&r);
    let r = put("kb", "echo_two").await.unwrap();
    assert_eq!(r.status().as_u16(), 201);
    app.stop().await;
}
both_stores!(quotas, quotas_refuse_one_tenant_and_leave_the_other_alone);

/// `PES_TENANT_MAX_THREADS`: every way of making a thread counts (create, a run that creates its
/// thread, a fork, which copies its source's log), a refused one makes nothing, another tenant
/// is not affected, and a deleted thread frees its place.
async fn the_thread_quota_counts_forks_and_every_way_of_making_a_thread(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.api_keys = Some("ka:acme,kb:globex".into());
        c.worker_concurrency = 0;
        c.tenant_max_threads = 2;
    })
    .await;
    let r = post_as(&app, "ka", "/v1/threads", json!({"threadId": "t1"})).await;
    assert_eq!(r.status().as_u16(), 201);
    let run = json!({"query": "What is 2+2?", "ifNotExists": "create"});
    let r = post_as(&app, "ka", "/v1/threads/t2/runs", run.clone()).await;
    assert_eq!(r.status().as_u16(), 202);
    // The third thread, made any way, is refused and made nothing.
    let refused = [
        post_as(&app, "ka", "/v1/threads", json!({"threadId": "t3"})).await,
        post_as(&app, "ka", "/v1/threads/t3/runs", run.clone()).await,
        post_as(&app, "ka", "/v1/threads/t1/fork", json!({"threadId": "t3"})).await,
    ];
    for r in refused {
        assert_quota(&r);
        let (_, problem) = read(r).await;
        assert_eq!(problem["code"], "quota_exceeded", "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("PES_TENANT_MAX_THREADS"), "{problem}");
    }
    let (s, _) = app.get_as("ka", "/v1/threads/t3").await;
    assert_eq!(s, 404);
    // A run on a thread that exists is not a new thread.
    let r = post_as(&app, "ka", "/v1/threads/t1/runs", run.clone()).await;
    assert_eq!(r.status().as_u16(), 202);
    // Another tenant has its own.
    let r = post_as(&app, "kb", "/v1/threads", json!({"threadId": "t3"})).await;
    assert_eq!(r.status().as_u16(), 201);
    // A deleted thread frees its place: the fork goes through.
    let (s, _) = app.delete_as("ka", "/v1/threads/t2").await;
    assert_eq!(s, 204);
    let r = post_as(&app, "ka", "/v1/threads/t1/fork", json!({"threadId": "t3"})).await;
    assert_eq!(r.status().as_u16(), 201, "{:?}", r.text().await);
    app.stop().await;
}
both_stores!(
    thread_quota,
    the_thread_quota_counts_forks_and_every_way_of_making_a_thread
);

fn ts(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

async fn another_tenants_run_is_not_held_behind_a_backlog(backend: Backend) {
    // Every model call takes 20 ms, so acme's backlog is still there when globex posts.
    let llm = FakeLlm::start_with(fake_openai::Options {
        latency: Duration::from_millis(20),
        ..Default::default()
    })
    .await
    .unwrap();
    let app = spawn_with(backend, Some(&llm), |c| {
        c.api_keys = Some("ka:acme,kb:globex".into());
        c.worker_concurrency = 1;
    })
    .await;
    let body = json!({"query": "What is 2+2?", "ifNotExists": "create"});
    let mut a_runs = Vec::new();
    for i in 0..40 {
        let r = post_as(&app, "ka", &format!("/v1/threads/a{i}/runs"), body.clone()).await;
        let (s, run) = read(r).await;
        assert_eq!(s, 202, "{run}");
        a_runs.push((format!("a{i}"), run["runId"].as_str().unwrap().to_owned()));
    }
    let r = post_as(&app, "kb", "/v1/threads/b/runs", body.clone()).await;
    let (_, b) = read(r).await;
    let b_id = b["runId"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let b = loop {
        let (_, run) = app
            .get_as("kb", &format!("/v1/threads/b/runs/{b_id}"))
            .await;
        if run["status"] == "completed" {
            break run;
        }
        assert!(tokio::time::Instant::now() < deadline, "{run}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (b_created, b_started) = (ts(&b["createdAt"]), ts(&b["startedAt"]));
    // Wait for the backlog, then see when each of its runs started relative to b.
    let mut started_between = 0;
    let mut started_after = 0;
    for (thread, id) in &a_runs {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let run = loop {
            let (_, run) = app
                .get_as("ka", &format!("/v1/threads/{thread}/runs/{id}"))
                .await;
            if run["status"] == "completed" {
                break run;
            }
            assert!(tokio::time::Instant::now() < deadline, "{run}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let started = ts(&run["startedAt"]);
        if started > b_created && started < b_started {
            started_between += 1;
        }
        if started > b_started {
            started_after += 1;
        }
    }
    assert!(
        started_after >= 5,
        "the backlog must still be there when b arrives for this test to mean anything \
         ({started_after} of acme's runs started after b's)"
    );
    // One slot: at most the run that held it when b arrived finishes first (and one claim
    // round that was already under way).
    assert!(
        started_between <= 2,
        "{started_between} of acme's queued runs started before globex's run"
    );
    app.stop().await;
}
both_stores!(
    fair_claims,
    another_tenants_run_is_not_held_behind_a_backlog
);

async fn a_run_may_tighten_the_tool_policy_but_never_loosen_it(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.require_approval = vec!["current_time".into()];
    })
    .await;
    let t = app
        .thread(json!({"config": {
            "tools": ["calculator", "current_time"],
            "requireApproval": ["calculator"]
        }}))
        .await;
    let runs = format!("/v1/threads/{t}/runs");
    let run = |config: Value| app.post(&runs, json!({"query": "q", "config": config}));
    let (s, p) = run(json!({"requireApproval": []})).await;
    assert_eq!((s, p["code"].as_str()), (422, Some("policy_floor")), "{p}");
    assert!(
        p["detail"].as_str().unwrap().contains("`calculator`"),
        "{p}"
    );
    let (s, p) = run(json!({"tools": ["calculator", "ask_user"]})).await;
    assert_eq!((s, p["code"].as_str()), (422, Some("policy_floor")), "{p}");
    let (s, p) =
        run(json!({"tools": ["calculator"], "requireApproval": ["calculator", "current_time"]}))
            .await;
    assert_eq!(s, 202, "{p}");
    let rid = p["runId"].as_str().unwrap().to_owned();
    // The fake model's default plan calls the calculator: the thread's approval holds.
    let waiting = app.wait_run(&t, &rid, |r| r["status"] == "suspended").await;
    assert_eq!(waiting["suspension"]["toolCall"]["name"], "calculator");
    let (s, _) = app
        .post(&format!("/v1/threads/{t}/runs/{rid}/cancel"), json!({}))
        .await;
    assert_eq!(s, 202);
    app.wait_run(&t, &rid, |r| r["status"] == "cancelled").await;

    // The server-wide floor: `current_time` waits for a person though no config names it.
    llm.push(
        "plan",
        plan(&[("s1", "Read the clock", &["current_time"], &[])]),
    );
    llm.push(
        "execute",
        Reply::ToolCalls(vec![("current_time".into(), json!({}))]),
    );
    let t2 = app.thread(json!({})).await;
    let (s, run) = app
        .post(
            &format!("/v1/threads/{t2}/runs/wait"),
            json!({"query": "what time is it?", "config": {"requireApproval": []}}),
        )
        .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["status"], "suspended", "{run}");
    assert_eq!(run["suspension"]["toolCall"]["name"], "current_time");
    assert_eq!(run["suspension"]["kind"], "approval");
    app.stop().await;
}
both_stores!(
    policy_floor,
    a_run_may_tighten_the_tool_policy_but_never_loosen_it
);

async fn metrics_name_no_tenant_data_and_may_need_a_key(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.metrics_key = Some("scrape-me".into());
    })
    .await;
    let chart = json!({
        "description": "Echo the input",
        "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        "flowchart": {"start": "out", "stages": {
            "out": {"kind": "end", "result": {"echo": {"var": "args.x"}}}
        }}
    });
    let r = app
        .client
        .put(app.url("/v1/flowcharts/acme_secret_pricing"))
        .json(&chart)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    llm.push(
        "plan",
        plan(&[("s1", "Use the chart", &["acme_secret_pricing"], &[])]),
    );
    llm.push(
        "execute",
        Reply::ToolCalls(vec![
            ("acme_secret_pricing".into(), json!({"x": "hi"})),
            ("acme_made_up_tool".into(), json!({})),
        ]),
    );
    let t = app.thread(json!({})).await;
    let (_, run) = app
        .post(
            &format!("/v1/threads/{t}/runs/wait"),
            json!({"query": "use it", "config": {"model": "acme-private-model"}}),
        )
        .await;
    assert_eq!(run["status"], "completed", "{run}");

    let r = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = app
        .client
        .get(app.url("/metrics"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = app
        .client
        .get(app.url("/metrics"))
        .bearer_auth("scrape-me")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let page = r.text().await.unwrap();
    for secret in [
        "acme_secret_pricing",
        "acme_made_up_tool",
        "acme-private-model",
    ] {
        assert!(!page.contains(secret), "{secret} leaked into /metrics");
    }
    assert!(
        page.contains(r#"pes_tool_calls_total{tool="flowchart",outcome="ok"} 1"#),
        "{page}"
    );
    assert!(page.contains(r#"model="other""#), "{page}");
    app.stop().await;
}
both_stores!(
    metrics_labels,
    metrics_name_no_tenant_data_and_may_need_a_key
);

async fn every_stored_tool_result_is_cut_to_the_limit(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.tool_result_max_bytes = 1024;
    })
    .await;
    llm.push("plan", plan(&[("s1", "Ask the user", &["ask_user"], &[])]));
    llm.push(
        "execute",
        Reply::ToolCalls(vec![(
            "ask_user".into(),
            json!({"question": "Paste the log"}),
        )]),
    );
    let t = app.thread(json!({})).await;
    let (_, run) = app
        .post(
            &format!("/v1/threads/{t}/runs/wait"),
            json!({"query": "read my log"}),
        )
        .await;
    assert_eq!(run["status"], "suspended", "{run}");
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let log = "x".repeat(10_000);
    let (s, _) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "respond", "response": log}),
        )
        .await;
    assert_eq!(s, 202);
    let rid = run["runId"].as_str().unwrap();
    app.wait_run(&t, rid, |r| r["status"] == "completed").await;
    let exec = app
        .wait_observation(&t, |o| o["type"] == "TOOL_EXECUTION")
        .await;
    let output = exec["content"]["output"].as_str().unwrap();
    assert!(output.len() < 1200, "{} bytes stored", output.len());
    assert!(
        output.contains("truncated: 8976 of 10000 bytes cut"),
        "{output}"
    );
    // The model read the cut result too.
    let tool_messages: Vec<String> = llm
        .requests()
        .iter()
        .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(!tool_messages.is_empty());
    assert!(
        tool_messages.iter().all(|m| m.len() < 1500),
        "{tool_messages:?}"
    );
    app.stop().await;
}
both_stores!(
    tool_result_cap,
    every_stored_tool_result_is_cut_to_the_limit
);

async fn a_plan_that_leaves_out_nullable_fields_is_read_as_null(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |_| {}).await;
    // What Anthropic's tool input and local servers send: no `kind`, `role`, `toolAllowlist`.
    llm.push(
        "plan",
        Reply::Json(json!({
            "title": "Short plan",
            "intent": "Answer",
            "plan": "One step",
            "todoList": [{
                "id": "s1",
                "description": "Answer the question",
                "stepType": "reasoning",
                "requiredTools": [],
                "expectedOutcome": "an answer",
                "dependencies": []
            }]
        })),
    );
    let t = app.thread(json!({})).await;
    let (_, run) = app
        .post(
            &format!("/v1/threads/{t}/runs/wait"),
            json!({"query": "hello"}),
        )
        .await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        llm.requests_of("plan").len(),
        1,
        "read as it is, with no repair request"
    );
    app.stop().await;
}
both_stores!(
    omitted_nullables,
    a_plan_that_leaves_out_nullable_fields_is_read_as_null
);

/// Send `(method, path, body)` to `app` as tenant key `key`; the status.
async fn status_of(
    app: &TestApp,
    key: &str,
    method: reqwest::Method,
    path: String,
    body: Value,
) -> u16 {
    let r = app
        .client
        .request(method, app.url(&path))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    if status != 429 {
        let (_, body) = read(r).await;
        assert!(status < 300, "{path}: {status} {body}");
    } else {
        assert_quota(&r);
    }
    status
}

/// Fire every request at once, alternating between the replicas; how many succeeded.
async fn at_once(replicas: &[&TestApp], requests: Vec<(reqwest::Method, String, Value)>) -> usize {
    let sent = requests
        .into_iter()
        .enumerate()
        .map(|(k, (method, path, body))| {
            status_of(replicas[k % replicas.len()], "ka", method, path, body)
        });
    futures::future::join_all(sent)
        .await
        .into_iter()
        .filter(|s| *s < 300)
        .count()
}

/// Creations of one tenant fired at once on two replicas of one Postgres (one service on
/// SQLite) never pass a quota: threads, runs queued or running, flowcharts, assistants and crons
/// each end exactly at their quota, however many were asked for in parallel.
async fn concurrent_creations_never_pass_a_quota(backend: Backend) {
    let url = database_url(backend).await;
    let config = || {
        let mut c = test_config(&url, None);
        c.api_keys = Some("ka:acme".into());
        // No worker: runs stay queued, so the count of active runs is exact.
        c.worker_concurrency = 0;
        c.tenant_max_threads = 10;
        c.tenant_max_active_runs = 4;
        c.tenant_max_flowcharts = 3;
        c.tenant_max_assistants = 3;
        c.tenant_max_crons = 3;
        c.database_max_connections = 16;
        c
    };
    let a = spawn_config(config()).await;
    let b = match backend {
        Backend::Postgres => Some(spawn_config(config()).await),
        Backend::Sqlite => None,
    };
    let replicas: Vec<&TestApp> = std::iter::once(&a).chain(b.as_ref()).collect();
    let post = reqwest::Method::POST;

    // Threads: 9 held, 12 asked for at once: one more, and the tenant holds exactly 10.
    for i in 0..9 {
        let body = json!({"threadId": format!("held{i}")});
        assert_eq!(
            status_of(&a, "ka", post.clone(), "/v1/threads".into(), body).await,
            201
        );
    }
    let asked = (0..12)
        .map(|i| {
            (
                post.clone(),
                "/v1/threads".to_owned(),
                json!({"threadId": format!("new{i}")}),
            )
        })
        .collect();
    assert_eq!(at_once(&replicas, asked).await, 1, "threads past the quota");
    let r = a
        .client
        .get(a.url("/v1/threads?limit=100"))
        .bearer_auth("ka")
        .send()
        .await
        .unwrap();
    let (_, threads) = read(r).await;
    assert_eq!(threads["items"].as_array().unwrap().len(), 10, "{threads}");

    // Runs: 12 posted at once on the tenant's threads, 4 queued.
    let asked = (0..12)
        .map(|i| {
            let path = format!("/v1/threads/held{}/runs", i % 9);
            (post.clone(), path, json!({"query": "What is 2+2?"}))
        })
        .collect();
    assert_eq!(at_once(&replicas, asked).await, 4, "runs past the quota");

    // Flowcharts, assistants and crons: 8 asked for at once, 3 made.
    let chart = json!({
        "description": "Echo the input",
        "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        "flowchart": {"start": "out", "stages": {
            "out": {"kind": "end", "result": {"echo": {"var": "args.x"}}}
        }}
    });
    let asked = (0..8)
        .map(|i| {
            (
                reqwest::Method::PUT,
                format!("/v1/flowcharts/echo_{i}"),
                chart.clone(),
            )
        })
        .collect();
    assert_eq!(
        at_once(&replicas, asked).await,
        3,
        "flowcharts past the quota"
    );
    let asked = (0..8)
        .map(|i| {
            (
                post.clone(),
                "/v1/assistants".to_owned(),
                json!({"name": format!("a{i}"), "config": {}}),
            )
        })
        .collect();
    assert_eq!(
        at_once(&replicas, asked).await,
        3,
        "assistants past the quota"
    );
    let asked = (0..8)
        .map(|_| {
            let body = json!({"schedule": "0 0 * * *", "query": "What is 2+2?"});
            (post.clone(), "/v1/crons".to_owned(), body)
        })
        .collect();
    assert_eq!(at_once(&replicas, asked).await, 3, "crons past the quota");
    if let Some(b) = b {
        b.stop().await;
    }
    a.stop().await;
}
both_stores!(exact_quotas, concurrent_creations_never_pass_a_quota);

/// `PES_TENANT_MAX_STORAGE_BYTES`: past it, every write that grows the tenant's bytes (a thread,
/// a run, a fork, a steering message, a store put) is 429 naming the setting; reads and deletes
/// go on, another tenant is not affected, and deleting makes room again.
async fn a_tenant_past_its_bytes_grows_nothing_but_reads_and_deletes(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.api_keys = Some("ka:acme,kb:globex".into());
        // An empty tenant has room; one thread (its id's two bytes) fills it.
        c.tenant_max_storage_bytes = 1;
        c.tenant_storage_recount_seconds = 0;
    })
    .await;
    let post = reqwest::Method::POST;
    let thread = json!({"threadId": "t1"});
    assert_eq!(
        status_of(
            &app,
            "ka",
            post.clone(),
            "/v1/threads".into(),
            thread.clone()
        )
        .await,
        201
    );
    let run = format!("/v1/threads/t1/runs/{}/steer", uuid::Uuid::new_v4());
    for (method, path, body) in [
        (
            post.clone(),
            "/v1/threads".to_owned(),
            json!({"threadId": "t2"}),
        ),
        (
            post.clone(),
            "/v1/threads/t1/runs".to_owned(),
            json!({"query": "What is 2+2?"}),
        ),
        (post.clone(), "/v1/threads/t1/fork".to_owned(), json!({})),
        (post.clone(), run, json!({"message": "faster"})),
        (
            reqwest::Method::PUT,
            "/v1/store/items".to_owned(),
            json!({"namespace": ["n"], "key": "k", "value": {"a": 1}}),
        ),
    ] {
        let r = app
            .client
            .request(method, app.url(&path))
            .bearer_auth("ka")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_quota(&r);
        let (_, problem) = read(r).await;
        assert_eq!(problem["code"], "quota_exceeded", "{path}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains("PES_TENANT_MAX_STORAGE_BYTES"),
            "{path}: {problem}"
        );
    }
    // Reads go on; the other tenant has its own bytes.
    let (s, _) = app.get_as("ka", "/v1/threads/t1").await;
    assert_eq!(s, 200);
    assert_eq!(
        status_of(
            &app,
            "kb",
            post.clone(),
            "/v1/threads".into(),
            thread.clone()
        )
        .await,
        201
    );
    // A delete goes on, and frees the room.
    let r = app
        .client
        .delete(app.url("/v1/threads/t1"))
        .bearer_auth("ka")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert_eq!(
        status_of(&app, "ka", post, "/v1/threads".into(), thread).await,
        201
    );
    app.stop().await;
}
both_stores!(
    storage_quota,
    a_tenant_past_its_bytes_grows_nothing_but_reads_and_deletes
);
