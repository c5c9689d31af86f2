//! The `http_request` tool in real runs: the fake model asks for requests to a local server, and
//! the SSRF guard decides. Loopback is refused by default and reachable only when the operator
//! allows it (by CIDR or by host name), a redirect to a refused address is refused on the
//! redirect, an endless body is cut at the byte limit, only http and https are spoken, and with
//! the tool off it is neither offered nor accepted in a thread's config.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{AppendHeaders, IntoResponse, Response};
use axum::routing::{any, get};
use bytes::Bytes;
use futures::StreamExt;
use pes_server::config::Config;
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, TestApp, spawn_with};

/// What the local server saw.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    /// Fired when the endless body's stream is dropped: the client stopped reading.
    endless_dropped: Notify,
}

/// A local HTTP server on 127.0.0.1: `/hello`, `/echo`, `/redirect?to=`, `/endless`, `/stall`,
/// `/loop` (redirects to itself).
struct Target {
    port: u16,
    seen: Arc<Seen>,
}

impl Target {
    async fn start() -> Target {
        let seen = Arc::new(Seen::default());
        let app = Router::new()
            .route("/hello", get(hello))
            .route("/echo", any(echo))
            .route("/redirect", get(redirect))
            .route("/endless", get(endless))
            .route("/stall", get(stall))
            .route("/loop", get(redirect_loop))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Target { port, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn hits(&self) -> usize {
        self.seen.requests.load(Ordering::SeqCst)
    }
}

async fn hello(State(seen): State<Arc<Seen>>) -> Response {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::OK,
        AppendHeaders([("X-Test", "yes"), ("x-multi", "one"), ("x-multi", "two")]),
        "hello from the test server",
    )
        .into_response()
}

async fn echo(
    State(seen): State<Arc<Seen>>,
    method: axum::http::Method,
    headers: HeaderMap,
    body: String,
) -> Response {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    let token = headers
        .get("x-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    (StatusCode::CREATED, format!("{method} {token} {body}")).into_response()
}

async fn redirect(
    State(seen): State<Arc<Seen>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    let to = q.get("to").cloned().unwrap_or_default();
    (StatusCode::FOUND, [(header::LOCATION, to)]).into_response()
}

async fn redirect_loop(State(seen): State<Arc<Seen>>) -> Response {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    (StatusCode::FOUND, [(header::LOCATION, "/loop")]).into_response()
}

/// Sets the flag when the body stream is dropped.
struct DropSignal(Arc<Seen>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        self.0.endless_dropped.notify_one();
    }
}

/// A body that never ends: 16 KiB chunks of `a` for as long as the client reads.
async fn endless(State(seen): State<Arc<Seen>>) -> Response {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    let signal = DropSignal(seen.clone());
    let chunk = Bytes::from(vec![b'a'; 16 * 1024]);
    let stream = futures::stream::repeat_with(move || {
        let _keep = &signal;
        Ok::<_, std::io::Error>(chunk.clone())
    });
    Body::from_stream(stream).into_response()
}

/// Headers and a first chunk at once, then a body that never goes on.
async fn stall(State(seen): State<Arc<Seen>>) -> Response {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    let first = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from("partial")) });
    Body::from_stream(first.chain(futures::stream::pending())).into_response()
}

/// Spawn the app with the tool on and `allow` as `PES_HTTP_TOOL_ALLOW`.
async fn app_with(
    backend: Backend,
    llm: &FakeLlm,
    allow: Option<&str>,
    tweak: impl FnOnce(&mut Config),
) -> TestApp {
    let allow = allow.map(str::to_owned);
    spawn_with(backend, Some(llm), |c| {
        c.http_tool = true;
        c.http_tool_allow = allow;
        tweak(c);
    })
    .await
}

/// One run whose only item makes these `http_request` calls in one model turn; returns the
/// `TOOL_EXECUTION` contents in call order, and the fake model's log.
async fn run_calls(app: &TestApp, llm: &FakeLlm, calls: Vec<Value>) -> Vec<Value> {
    llm.push("plan", plan(&[("h", "Fetch it", &["http_request"], &[])]));
    llm.push_item(
        "h",
        Reply::ToolCalls(
            calls
                .into_iter()
                .map(|a| ("http_request".to_owned(), a))
                .collect(),
        ),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "fetch it").await;
    assert_eq!(run["status"], "completed", "{run}");
    app.observations(&t)
        .await
        .into_iter()
        .filter(|o| o["type"] == "TOOL_EXECUTION")
        .map(|o| o["content"].clone())
        .collect()
}

fn get_call(url: &str) -> Value {
    json!({"method": "GET", "url": url})
}

/// The message of a failed call, after checking it failed.
fn error_of(exec: &Value) -> String {
    assert_eq!(exec["status"], "error", "{exec}");
    assert_eq!(
        exec["output"]["error"], exec["error"],
        "the model reads the reason"
    );
    exec["error"].as_str().unwrap().to_owned()
}

/// The tool results the model was sent back, parsed.
fn tool_messages(llm: &FakeLlm) -> Vec<Value> {
    llm.requests_of("execute")
        .iter()
        .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .map(|m| serde_json::from_str(m["content"].as_str().unwrap()).unwrap())
        .collect()
}

async fn loopback_is_refused_by_default_with_the_reason(backend: Backend) {
    let target = Target::start().await;
    let llm = FakeLlm::start().await;
    let app = app_with(backend, &llm, None, |_| {}).await;
    let by_name = format!("http://localhost:{}/hello", target.port);
    let execs = run_calls(
        &app,
        &llm,
        vec![get_call(&target.url("/hello")), get_call(&by_name)],
    )
    .await;
    assert_eq!(execs.len(), 2);
    assert_eq!(
        error_of(&execs[0]),
        "refused: 127.0.0.1 is not an allowed address (a loopback address); the operator can \
         allow it in PES_HTTP_TOOL_ALLOW"
    );
    let msg = error_of(&execs[1]);
    assert!(
        msg.starts_with("refused: `localhost` is not an allowed address"),
        "a name is judged by what it resolves to: {msg}"
    );
    assert!(
        !msg.contains("127.0.0.1") && !msg.contains("loopback"),
        "the refusal never says what a name resolved to: {msg}"
    );
    assert!(
        msg.ends_with("the operator can allow it in PES_HTTP_TOOL_ALLOW"),
        "{msg}"
    );
    assert_eq!(target.hits(), 0, "no request reached the server");
    app.stop().await;
}
both_stores!(
    refused_by_default,
    loopback_is_refused_by_default_with_the_reason
);

async fn an_allowed_cidr_reaches_the_server_and_the_model_reads_the_response(backend: Backend) {
    let target = Target::start().await;
    let llm = FakeLlm::start().await;
    let app = app_with(backend, &llm, Some("127.0.0.1/32"), |_| {}).await;
    let execs = run_calls(
        &app,
        &llm,
        vec![
            get_call(&target.url("/hello")),
            json!({"method": "POST", "url": target.url("/echo"),
                   "headers": {"X-Token": "t0k"}, "body": "ping"}),
            get_call(&target.url("/redirect?to=/hello")),
        ],
    )
    .await;
    assert_eq!(execs.len(), 3);
    let hello = &execs[0];
    assert_eq!(hello["status"], "success", "{hello}");
    assert_eq!(hello["output"]["status"], 200);
    assert_eq!(hello["output"]["body"], "hello from the test server");
    assert_eq!(hello["output"]["headers"]["x-test"], "yes");
    assert_eq!(hello["output"]["headers"]["x-multi"], "one, two");
    assert_eq!(
        hello["output"]["headers"]["content-type"],
        "text/plain; charset=utf-8"
    );
    assert_eq!(execs[1]["output"]["status"], 201);
    assert_eq!(execs[1]["output"]["body"], "POST t0k ping");
    assert_eq!(
        execs[2]["output"]["body"], "hello from the test server",
        "a redirect to an allowed address is followed"
    );
    assert_eq!(target.hits(), 4);

    let seen = tool_messages(&llm);
    assert_eq!(seen.len(), 3, "every result went back to the model");
    assert_eq!(seen[0], hello["output"]);
    // The tool is offered to the model with its schema.
    let offered = &llm.requests_of("execute")[0]["tools"];
    let spec = offered
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "http_request")
        .expect("http_request is offered");
    assert_eq!(
        spec["function"]["parameters"]["additionalProperties"],
        false
    );
    app.stop().await;
}
both_stores!(
    allowed_by_cidr,
    an_allowed_cidr_reaches_the_server_and_the_model_reads_the_response
);

async fn an_allowed_host_name_reaches_the_server(backend: Backend) {
    let target = Target::start().await;
    let llm = FakeLlm::start().await;
    let app = app_with(backend, &llm, Some("localhost"), |_| {}).await;
    let execs = run_calls(
        &app,
        &llm,
        vec![
            get_call(&format!("http://localhost:{}/hello", target.port)),
            // The name is allowed, not the address: the literal stays refused.
            get_call(&target.url("/hello")),
        ],
    )
    .await;
    assert_eq!(execs[0]["status"], "success", "{}", execs[0]);
    assert_eq!(execs[0]["output"]["body"], "hello from the test server");
    assert!(
        error_of(&execs[1]).contains("127.0.0.1 is not an allowed address (a loopback address)")
    );
    assert_eq!(target.hits(), 1);
    app.stop().await;
}
both_stores!(allowed_by_host, an_allowed_host_name_reaches_the_server);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_a_refused_address_is_refused_on_the_redirect() {
    let target = Target::start().await;
    let llm = FakeLlm::start().await;
    let app = app_with(Backend::Sqlite, &llm, Some("127.0.0.1/32"), |_| {}).await;
    let metadata = "http://169.254.169.254/latest/meta-data";
    let mapped = "http://[::ffff:10.0.0.1]/";
    let execs = run_calls(
        &app,
        &llm,
        vec![
            get_call(&target.url(&format!("/redirect?to={metadata}"))),
            get_call(&target.url(&format!("/redirect?to={mapped}"))),
            get_call(&target.url("/redirect?to=ftp://127.0.0.1/x")),
            get_call(&target.url("/loop")),
        ],
    )
    .await;
    let msg = error_of(&execs[0]);
    assert!(
        msg.starts_with(&format!(
            "the redirect to `{metadata}` was not followed: refused: "
        )),
        "{msg}"
    );
    assert!(
        msg.contains("169.254.169.254 is not an allowed address (a cloud metadata address)"),
        "{msg}"
    );
    let msg = error_of(&execs[1]);
    assert!(
        msg.contains("::ffff:10.0.0.1 is not an allowed address (an IPv4-mapped form of 10.0.0.1, a private address)"),
        "{msg}"
    );
    let msg = error_of(&execs[2]);
    assert!(msg.contains("only http and https"), "{msg}");
    assert!(error_of(&execs[3]).contains("refused: more than 5 redirects"));
    assert_eq!(
        target.hits(),
        3 + 6,
        "the refused hops never reached a server; the loop was followed 5 times"
    );
    app.stop().await;

    // Allowed by name, the server redirects to its own address literal: that hop is judged on
    // its own and refused.
    let llm = FakeLlm::start().await;
    let app = app_with(Backend::Sqlite, &llm, Some("localhost"), |_| {}).await;
    let execs = run_calls(
        &app,
        &llm,
        vec![get_call(&format!(
            "http://localhost:{}/redirect?to={}",
            target.port,
            target.url("/hello")
        ))],
    )
    .await;
    let msg = error_of(&execs[0]);
    assert!(
        msg.contains("127.0.0.1 is not an allowed address (a loopback address)"),
        "{msg}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_body_is_cut_at_the_byte_limit() {
    let target = Target::start().await;
    let llm = FakeLlm::start().await;
    let app = app_with(Backend::Sqlite, &llm, Some("127.0.0.1"), |c| {
        c.http_tool_max_bytes = 1000;
    })
    .await;
    let dropped = target.seen.endless_dropped.notified();
    let execs = run_calls(&app, &llm, vec![get_call(&target.url("/endless"))]).await;
    let out = &execs[0]["output"];
    assert_eq!(out["status"], 200, "{}", execs[0]);
    let body = out["body"].as_str().unwrap();
    let (kept, marker) = body.split_once('\n').expect("a marker follows the body");
    assert_eq!(kept, "a".repeat(1000));
    assert_eq!(marker, "…[truncated: response exceeded 1000 bytes]");
    // The body never ends, so the run finishing shows the tool stopped reading; the server sees
    // its stream dropped.
    tokio::time::timeout(Duration::from_secs(10), dropped)
        .await
        .expect("the client hung up on the endless body");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_http_and_https_urls_are_requested() {
    let llm = FakeLlm::start().await;
    let app = app_with(Backend::Sqlite, &llm, None, |_| {}).await;
    let execs = run_calls(
        &app,
        &llm,
        vec![
            get_call("ftp://example.com/file"),
            get_call("not a url"),
            get_call("file:///etc/passwd"),
        ],
    )
    .await;
    assert_eq!(
        error_of(&execs[0]),
        "refused: only http and https URLs are allowed, not `ftp:`"
    );
    let msg = error_of(&execs[1]);
    assert!(
        msg.starts_with("refused: `not a url` is not a valid absolute URL"),
        "{msg}"
    );
    assert!(error_of(&execs[2]).contains("not `file:`"));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_tool_off_it_is_neither_offered_nor_accepted() {
    let llm = FakeLlm::start().await;
    let app = spawn_with(Backend::Sqlite, Some(&llm), |c| {
        c.http_tool_allow = Some("127.0.0.1/32".into());
    })
    .await;
    let (status, body) = app
        .post(
            "/v1/threads",
            json!({"config": {"tools": ["http_request"]}}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.to_string().contains("unknown tool `http_request`"),
        "{body}"
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");
    let offered = llm.requests_of("execute")[0]["tools"].to_string();
    assert!(offered.contains("calculator"), "{offered}");
    assert!(!offered.contains("http_request"), "{offered}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_allow_entry_stops_the_start_naming_it() {
    let url = crate::helpers::database_url(Backend::Sqlite).await;
    let mut config = crate::helpers::test_config(&url, None);
    config.http_tool = true;
    config.http_tool_allow = Some("localhost, 10.0.0.0/33".into());
    let err = match pes_server::App::build(config).await {
        Ok(_) => panic!("the app must not start with a bad allow entry"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("PES_HTTP_TOOL_ALLOW: `10.0.0.0/33`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_is_abandoned_at_the_time_limit() {
    let target = Target::start().await;
    let llm = FakeLlm::start().await;
    let app = app_with(Backend::Sqlite, &llm, Some("127.0.0.1"), |c| {
        c.http_tool_timeout_seconds = 1;
    })
    .await;
    let started = std::time::Instant::now();
    let execs = run_calls(&app, &llm, vec![get_call(&target.url("/stall"))]).await;
    let msg = error_of(&execs[0]);
    assert_eq!(
        msg,
        format!(
            "the request to `{}` took longer than 1 s (PES_HTTP_TOOL_TIMEOUT_SECONDS) and was \
             abandoned",
            target.url("/stall")
        )
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the limit covers the body, not only the headers"
    );
    app.stop().await;
}
