//! What the MCP server's transport refuses before any JSON-RPC, said as problems like every
//! other refusal of the server: a body over `PES_MCP_MAX_BODY_BYTES`, an `Accept` without both
//! media types, a body that is not JSON or not a JSON-RPC message, another method than POST, and
//! a `Host` outside `PES_MCP_ALLOWED_HOSTS`.

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, spawn_with};
use crate::mcp_server::{message, raw};

async fn what_the_transport_refuses_is_a_problem(backend: Backend) {
    let app = spawn_with(backend, None, |c| c.mcp_max_body_bytes = 2048).await;
    let big = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"x": "y".repeat(4096)}});
    let (st, ct, body) = raw(&app, &big, &[]).await;
    assert_eq!(
        (st, ct.as_str()),
        (413, "application/problem+json"),
        "{body}"
    );
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["code"], "payload_too_large");

    let r = app
        .client
        .post(app.url("/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 406);
    let problem: Value = r.json().await.unwrap();
    assert_eq!(problem["code"], "not_acceptable");

    let r = app
        .client
        .post(app.url("/mcp"))
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    let r = app.client.get(app.url("/mcp")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 405);
    let problem: Value = r.json().await.unwrap();
    assert_eq!(problem["code"], "method_not_allowed");

    // JSON, but not a JSON-RPC message: a problem that says so.
    let (st, ct, body) = raw(&app, &json!({"hello": 1}), &[]).await;
    assert_eq!(
        (st, ct.as_str()),
        (400, "application/problem+json"),
        "{body}"
    );
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["code"], "invalid_message", "{problem}");
    // An unknown tool is invalid params.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "nope", "arguments": {}}});
    let (_, _, body) = raw(&app, &init, &[("mcp-protocol-version", "2025-06-18")]).await;
    assert_eq!(message(&body)["error"]["code"], -32602, "{body}");
}
both_stores!(transport_refusals, what_the_transport_refuses_is_a_problem);

async fn only_the_allowed_hosts_are_answered(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.mcp_allowed_hosts = Some("agents.example.com, localhost".into());
    })
    .await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    // Reached as 127.0.0.1 (a rebinding page would use its own name): refused.
    let (st, ct, body) = raw(&app, &list, &[]).await;
    assert_eq!(
        (st, ct.as_str()),
        (403, "application/problem+json"),
        "{body}"
    );
    // Reached under an allowed name: answered.
    let (st, _, body) = raw(&app, &list, &[("host", "agents.example.com")]).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(message(&body)["result"]["protocolVersion"], "2025-06-18");
}
both_stores!(allowed_hosts, only_the_allowed_hosts_are_answered);
