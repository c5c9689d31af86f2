//! Hosts and origins: every door refuses a `Host` the service does not answer (403
//! `host_refused`; while bound to loopback, only the loopback names), and a write from another
//! site's `Origin` (403 `origin_refused`), so that a page that rebinds its name to 127.0.0.1
//! cannot drive a keyless local service. The probes answer any `Host`; the origins of
//! `PES_ALLOWED_ORIGINS` get CORS answers.

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, TestApp, read, spawn, spawn_with};

const ATTACKER: &str = "attacker.example";

/// `method path` with extra headers (`Host` among them), a JSON body for writes.
async fn send(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = app.client.request(method, app.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(b.to_string());
    }
    let r = req.send().await.unwrap();
    let headers = r.headers().clone();
    let (status, body) = read(r).await;
    (status, headers, body)
}

fn assert_refused(got: &(u16, reqwest::header::HeaderMap, Value), code: &str, what: &str) {
    assert_eq!(
        (got.0, got.2["code"].as_str()),
        (403, Some(code)),
        "{what}: {}",
        got.2
    );
    assert_eq!(got.1["content-type"], "application/problem+json", "{what}");
}

/// The probe: a keyless service on loopback answered `Host: attacker.example` on `/v1`, made a
/// run for the attacker's `Host` and `Origin`, and ran `ask` over `/mcp`. Every door refuses
/// that host now, and nothing is made.
async fn a_rebound_name_reaches_no_door(backend: Backend) {
    let app = spawn(backend, None).await;
    let evil = [("host", ATTACKER), ("origin", "http://attacker.example")];
    let get = reqwest::Method::GET;
    let post = reqwest::Method::POST;
    let got = send(&app, get.clone(), "/v1/threads", &evil[..1], None).await;
    assert_refused(&got, "host_refused", "GET /v1/threads");
    let got = send(
        &app,
        post.clone(),
        "/v1/threads/rebound/runs",
        &evil,
        Some(json!({"query": "2+2?", "ifNotExists": "create"})),
    )
    .await;
    assert_refused(&got, "host_refused", "POST a run");
    let ask = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "ask", "arguments": {"query": "what is 2+2?"}}});
    let mut mcp_headers = evil.to_vec();
    mcp_headers.push(("mcp-protocol-version", "2025-06-18"));
    let got = send(&app, post.clone(), "/mcp", &mcp_headers, Some(ask.clone())).await;
    assert_refused(&got, "host_refused", "/mcp");
    let send_message = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "2+2?"}]}}});
    let got = send(&app, post.clone(), "/a2a", &evil, Some(send_message)).await;
    assert_refused(&got, "host_refused", "/a2a");
    for path in [
        "/console",
        "/docs/",
        "/openapi.json",
        "/.well-known/agent-card.json",
        "/v1/nothing-here",
    ] {
        let got = send(&app, get.clone(), path, &evil[..1], None).await;
        assert_refused(&got, "host_refused", path);
    }
    // An AG-UI front end under the rebound name: refused too.
    let input =
        json!({"threadId": "t", "messages": [{"id": "u1", "role": "user", "content": "hi"}]});
    let got = send(&app, post.clone(), "/v1/ag-ui", &evil, Some(input)).await;
    assert_refused(&got, "host_refused", "/v1/ag-ui");
    // Nothing was made.
    let (s, threads) = app.get("/v1/threads").await;
    assert_eq!(s, 200, "{threads}");
    assert_eq!(threads["items"], json!([]), "{threads}");

    // The loopback names are the service's own, any port.
    for host in ["localhost", "127.0.0.1:1", "[::1]:8080", "LocalHost."] {
        let got = send(&app, get.clone(), "/v1/threads", &[("host", host)], None).await;
        assert_eq!(got.0, 200, "{host}: {}", got.2);
    }
    // The probes answer a container probe that names the pod's address.
    for probe in ["/healthz", "/readyz", "/metrics"] {
        let got = send(&app, get.clone(), probe, &[("host", "10.1.2.3:8080")], None).await;
        assert_eq!(got.0, 200, "{probe}");
    }
    app.stop().await;
}
both_stores!(rebinding, a_rebound_name_reaches_no_door);

/// A write from another site's page is refused (even under an allowed `Host`); the service's own
/// origin writes; a read from another origin is answered without CORS headers (the browser keeps
/// it from the page).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_from_another_origin_is_refused() {
    let app = spawn(Backend::Sqlite, None).await;
    let own = app.base.clone();
    let post = reqwest::Method::POST;
    let body = || Some(json!({"threadId": "o1"}));
    for origin in [
        "http://evil.example",
        "null",
        "http://localhost:1",
        "https://127.0.0.1",
    ] {
        let got = send(
            &app,
            post.clone(),
            "/v1/threads",
            &[("origin", origin)],
            body(),
        )
        .await;
        assert_refused(&got, "origin_refused", origin);
    }
    let got = send(
        &app,
        reqwest::Method::DELETE,
        "/v1/threads/o1",
        &[("origin", "http://evil.example")],
        None,
    )
    .await;
    assert_refused(&got, "origin_refused", "DELETE");
    let got = send(
        &app,
        post.clone(),
        "/v1/threads",
        &[("origin", own.as_str())],
        body(),
    )
    .await;
    assert_eq!(got.0, 201, "{}", got.2);
    let got = send(
        &app,
        reqwest::Method::GET,
        "/v1/threads",
        &[("origin", "http://evil.example")],
        None,
    )
    .await;
    assert_eq!(got.0, 200);
    assert!(got.1.get("access-control-allow-origin").is_none());
    // A preflight from another site is refused.
    let got = send(
        &app,
        reqwest::Method::OPTIONS,
        "/v1/threads",
        &[
            ("origin", "http://evil.example"),
            ("access-control-request-method", "POST"),
        ],
        None,
    )
    .await;
    assert_refused(&got, "origin_refused", "preflight");
    app.stop().await;
}

/// `PES_ALLOWED_ORIGINS`: a web front end elsewhere gets its preflight answered and CORS headers
/// on its answers, and may write; `PES_ALLOWED_HOSTS` names the hosts answered (and
/// `PES_MCP_ALLOWED_HOSTS` is still read as its former name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_origins_get_cors_and_allowed_hosts_are_answered() {
    let front = "http://app.example:5173";
    let app = spawn_with(Backend::Sqlite, None, |c| {
        c.allowed_origins = Some(format!("{front}, https://other.example"));
        c.allowed_hosts = Some("api.example, 127.0.0.1".into());
    })
    .await;
    let got = send(
        &app,
        reqwest::Method::OPTIONS,
        "/v1/ag-ui",
        &[
            ("origin", front),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "authorization, content-type, last-event-id",
            ),
        ],
        None,
    )
    .await;
    assert_eq!(got.0, 204, "{}", got.2);
    let h = &got.1;
    assert_eq!(h["access-control-allow-origin"], front);
    let methods = h["access-control-allow-methods"].to_str().unwrap();
    assert!(
        methods.contains("POST") && methods.contains("DELETE"),
        "{methods}"
    );
    let allowed = h["access-control-allow-headers"].to_str().unwrap();
    for name in ["authorization", "content-type", "last-event-id"] {
        assert!(allowed.contains(name), "{allowed}");
    }
    let got = send(
        &app,
        reqwest::Method::POST,
        "/v1/threads",
        &[("origin", front)],
        Some(json!({})),
    )
    .await;
    assert_eq!(got.0, 201, "{}", got.2);
    assert_eq!(got.1["access-control-allow-origin"], front);
    assert!(
        got.1["access-control-expose-headers"]
            .to_str()
            .unwrap()
            .contains("x-request-id")
    );
    let got = send(
        &app,
        reqwest::Method::GET,
        "/v1/threads",
        &[("host", "api.example:443"), ("origin", front)],
        None,
    )
    .await;
    assert_eq!(got.0, 200, "{}", got.2);
    assert_eq!(got.1["access-control-allow-origin"], front);
    let got = send(
        &app,
        reqwest::Method::GET,
        "/v1/threads",
        &[("host", "localhost")],
        None,
    )
    .await;
    assert_refused(&got, "host_refused", "a name not listed");
    app.stop().await;

    let app = spawn_with(Backend::Sqlite, None, |c| {
        c.mcp_allowed_hosts = Some("agents.example".into());
    })
    .await;
    let got = send(&app, reqwest::Method::GET, "/v1/threads", &[], None).await;
    assert_refused(
        &got,
        "host_refused",
        "127.0.0.1 when only agents.example is allowed",
    );
    let got = send(
        &app,
        reqwest::Method::GET,
        "/v1/threads",
        &[("host", "agents.example")],
        None,
    )
    .await;
    assert_eq!(got.0, 200, "{}", got.2);
    app.stop().await;
}

/// Bound beyond loopback (with keys), any `Host` is answered unless `PES_ALLOWED_HOSTS` says
/// otherwise: a public service is reached under names it cannot guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_service_answers_any_host_by_default() {
    let app = spawn_with(Backend::Sqlite, None, |c| {
        c.bind = "0.0.0.0:0".parse().unwrap();
        c.api_keys = Some("k1".into());
    })
    .await;
    let got = send(
        &app,
        reqwest::Method::GET,
        "/v1/threads",
        &[("host", "api.example.com"), ("authorization", "Bearer k1")],
        None,
    )
    .await;
    assert_eq!(got.0, 200, "{}", got.2);
    app.stop().await;
}
