//! Webhooks over real HTTP on both stores, received by a Python receiver that verifies every
//! signature with the official Standard Webhooks library (`tests/webhooks/receiver.py`): signed
//! deliveries, one `webhook-id` across retries, 410 stops, thread and assistant webhooks and their
//! events, the SSRF guard and tenants (crashes: `webhook_durability`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pes_server::config::Config;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::both_stores;
use crate::helpers::{Backend, TestApp, read, spawn_with};

/// The secret the services sign with and the receiver verifies with (the Standard Webhooks
/// libraries' own example secret).
pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The venv's Python with the Standard Webhooks library (see [`crate::helpers::venv_python`]).
pub(crate) fn python() -> Option<PathBuf> {
    crate::helpers::venv_python("standardwebhooks", "the Standard Webhooks library")
}

/// A webhook receiver as a child process: every request it got, as its JSON line.
pub(crate) struct Receiver {
    _child: Child,
    pub(crate) base: String,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    /// Start the receiver answering each delivery's attempts with `answers` (`"500,200"`), on
    /// `port` (0: a free one).
    pub(crate) async fn start(python: &Path, answers: &str, port: u16) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/webhooks/receiver.py");
        let mut child = Command::new(python)
            .arg(script)
            .args(["--secret", SECRET, "--answers", answers, "--port"])
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the receiver starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("READY in time")
            .unwrap()
            .expect("a READY line");
        let base = ready
            .strip_prefix("READY ")
            .expect("READY <url>")
            .to_owned();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        Self {
            _child: child,
            base,
            seen,
        }
    }

    /// Every request received so far.
    pub(crate) fn seen(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }

    /// The requests of one delivery (`webhook-id`).
    pub(crate) fn of(&self, delivery_id: &str) -> Vec<Value> {
        self.seen()
            .into_iter()
            .filter(|r| r["id"] == delivery_id)
            .collect()
    }
}

/// Settings that sign webhooks, let them reach loopback receivers, and retry fast.
pub(crate) fn hooks_on(c: &mut Config) {
    c.webhook_secret = Some(SECRET.into());
    c.webhook_allow = Some("127.0.0.1".into());
    c.webhook_retry_base_ms = 50;
    c.webhook_poll_ms = 50;
}

/// Poll `GET path` until `pred` holds (deadline 30 s); the last answer.
pub(crate) async fn wait_get(app: &TestApp, path: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, v) = app.get(path).await;
        if pred(&v) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} never matched: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until the receiver got a request matching `pred`.
pub(crate) async fn wait_received(rx: &Receiver, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let seen = rx.seen();
        if pred(&seen) {
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the receiver never got what was awaited: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The run's one delivery, once it is `status`.
async fn delivery_when(app: &TestApp, run_id: &str, status: &str) -> Value {
    let page = wait_get(
        app,
        &format!("/v1/webhook-deliveries?runId={run_id}"),
        |p| p["items"][0]["status"] == status,
    )
    .await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "one delivery per event: {page}");
    items[0].clone()
}

fn problem(v: &Value, status: u16, code: &str) {
    assert_eq!(v["status"], status, "{v}");
    assert_eq!(v["code"], code, "{v}");
}

/// A run's end reaches a Standard Webhooks receiver, signed; the receiver's 500 is retried with
/// the same `webhook-id` and the same body, and the delivery says what happened.
async fn signed_deliveries_retry_with_one_webhook_id(backend: Backend) {
    let Some(py) = python() else { return };
    let rx = Receiver::start(&py, "500,200", 0).await;
    let app = spawn_with(backend, None, hooks_on).await;
    let url = format!("{}/hook", rx.base);
    let (st, run) = app
        .post(
            "/v1/threads/t1/runs/wait",
            json!({"query": "What is 2+3?", "ifNotExists": "create", "webhook": {"url": url}}),
        )
        .await;
    assert_eq!(st, 200, "{run}");
    assert_eq!(run["status"], "completed");
    assert_eq!(run["config"]["webhook"]["url"], url.as_str());
    let rid = run["runId"].as_str().unwrap();
    let d = delivery_when(&app, rid, "delivered").await;
    let id = d["deliveryId"].as_str().unwrap();
    assert_eq!(d["event"], "run.completed");
    assert_eq!(d["attempts"], 2);
    assert_eq!(d["lastStatusCode"], 200);
    assert!(
        d["lastError"].as_str().unwrap().contains("500"),
        "the failed attempt is remembered: {d}"
    );
    assert!(d["deliveredAt"].is_string() && d["nextAttemptAt"].is_null());
    let got = rx.of(id);
    assert_eq!(got.len(), 2, "two attempts, one webhook-id: {got:?}");
    for r in &got {
        assert_eq!(r["verified"], true, "the library verified it: {r}");
        assert_eq!(r["type"], "run.completed");
        assert_eq!(r["runId"], rid);
        assert_eq!(r["status"], "completed");
    }
    assert_eq!(
        got.iter()
            .map(|r| r["answered"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        vec![500, 200]
    );
    assert_eq!(
        got[0]["bodySha256"], got[1]["bodySha256"],
        "the same body both times"
    );
    assert_eq!(rx.seen().len(), 2, "nothing else was sent");

    // Filters.
    let (_, page) = app.get("/v1/webhook-deliveries?status=delivered").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let (_, page) = app.get("/v1/webhook-deliveries?status=pending").await;
    assert!(page["items"].as_array().unwrap().is_empty(), "{page}");
    let (st, p) = app.get("/v1/webhook-deliveries?status=lost").await;
    assert_eq!(st, 422, "{p}");
    let (st, p) = app.get("/v1/webhook-deliveries?runId=nope").await;
    assert_eq!(st, 422, "{p}");
    // A delivered delivery is not sent again; an unknown one is not found.
    let (st, p) = app
        .post(&format!("/v1/webhook-deliveries/{id}/retry"), json!(null))
        .await;
    problem(&p, 409, "delivery_not_failed");
    assert_eq!(st, 409);
    let (st, p) = app
        .post(
            &format!("/v1/webhook-deliveries/{}/retry", uuid::Uuid::now_v7()),
            json!(null),
        )
        .await;
    assert_eq!(st, 404, "{p}");
    app.stop().await;
}
both_stores!(
    signed_retries_one_id,
    signed_deliveries_retry_with_one_webhook_id
);

/// 410 Gone stops the retries at once; `…/retry` sends the failed delivery again, same id, and
/// its `attempts` count every attempt of its life.
async fn gone_stops_retries_and_a_failed_delivery_is_sent_again(backend: Backend) {
    let Some(py) = python() else { return };
    let rx = Receiver::start(&py, "410", 0).await;
    let app = spawn_with(backend, None, hooks_on).await;
    let run = app_run(&app, "t", json!({"url": format!("{}/gone", rx.base)})).await;
    let rid = run["runId"].as_str().unwrap();
    let d = delivery_when(&app, rid, "failed").await;
    assert_eq!(d["attempts"], 1, "no attempt after a 410: {d}");
    assert_eq!(d["lastStatusCode"], 410);
    assert!(d["lastError"].as_str().unwrap().contains("410"), "{d}");
    let id = d["deliveryId"].as_str().unwrap().to_owned();
    assert_eq!(rx.of(&id).len(), 1);

    let (st, again) = app
        .post(&format!("/v1/webhook-deliveries/{id}/retry"), json!(null))
        .await;
    assert_eq!(st, 200, "{again}");
    assert_eq!(again["status"], "pending");
    assert_eq!(
        again["attempts"], 1,
        "attempts count over the delivery's life"
    );
    wait_received(&rx, |s| {
        s.iter().filter(|r| r["id"] == id.as_str()).count() == 2
    })
    .await;
    let d = delivery_when(&app, rid, "failed").await;
    assert_eq!(
        d["attempts"], 2,
        "the first attempt and the retried one: {d}"
    );
    let got = rx.of(&id);
    assert!(got.iter().all(|r| r["verified"] == true), "{got:?}");
    app.stop().await;
}
both_stores!(
    gone_stops_retries,
    gone_stops_retries_and_a_failed_delivery_is_sent_again
);

/// Post a query with a run webhook and wait for the run to end.
async fn app_run(app: &TestApp, thread: &str, webhook: Value) -> Value {
    let (st, run) = app
        .post(
            &format!("/v1/threads/{thread}/runs/wait"),
            json!({"query": "What is 2+3?", "ifNotExists": "create", "webhook": webhook}),
        )
        .await;
    assert_eq!(st, 200, "{run}");
    run
}

/// A thread's and an assistant's `config.webhook` announce their runs' events, the ones they
/// ask for only: a suspension (with the suspension it waits on), then a cancel.
async fn thread_and_assistant_webhooks_announce_their_events(backend: Backend) {
    let Some(py) = python() else { return };
    let rx = Receiver::start(&py, "200", 0).await;
    let app = spawn_with(backend, None, hooks_on).await;

    // The assistant's webhook, only for completions.
    let (st, a) = app
        .post(
            "/v1/assistants",
            json!({"assistantId": "hooked", "name": "Hooked", "config": {
                "webhook": {"url": format!("{}/assistant", rx.base), "events": ["run.completed"]}}}),
        )
        .await;
    assert_eq!(st, 201, "{a}");
    let (st, _) = app
        .post(
            "/v1/threads",
            json!({"threadId": "ta", "assistantId": "hooked"}),
        )
        .await;
    assert_eq!(st, 201);
    let run = app.run_wait("ta", "What is 2+3?").await;
    assert_eq!(run["status"], "completed");
    let d = delivery_when(&app, run["runId"].as_str().unwrap(), "delivered").await;
    assert_eq!(d["url"], format!("{}/assistant", rx.base));

    // The thread's webhook, for suspensions and cancels; the run waits for an approval.
    let (st, _) = app
        .post(
            "/v1/threads",
            json!({"threadId": "tt", "config": {"requireApproval": ["calculator"],
                "webhook": {"url": format!("{}/thread", rx.base),
                            "events": ["run.suspended", "run.cancelled"]}}}),
        )
        .await;
    assert_eq!(st, 201);
    let run = app.run_wait("tt", "What is 6*7?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let rid = run["runId"].as_str().unwrap();
    let d = delivery_when(&app, rid, "delivered").await;
    assert_eq!(d["event"], "run.suspended");
    let got = rx.of(d["deliveryId"].as_str().unwrap());
    assert_eq!(got[0]["type"], "run.suspended");
    assert_eq!(got[0]["status"], "suspended");
    assert_eq!(
        got[0]["suspension"], true,
        "data carries the suspension: {got:?}"
    );

    let r = app
        .client
        .post(app.url(&format!("/v1/threads/tt/runs/{rid}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let page = wait_get(&app, &format!("/v1/webhook-deliveries?runId={rid}"), |p| {
        p["items"].as_array().unwrap().len() == 2
            && p["items"]
                .as_array()
                .unwrap()
                .iter()
                .all(|d| d["status"] == "delivered")
    })
    .await;
    let events: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["run.cancelled", "run.suspended"], "newest first");
    let cancelled = rx
        .seen()
        .into_iter()
        .find(|r| r["type"] == "run.cancelled")
        .unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["verified"], true);
    // Nothing for events nobody asked for: the assistant's thread saw one completion, this one
    // no completion at all.
    assert_eq!(rx.seen().len(), 3, "{:?}", rx.seen());
    app.stop().await;
}
both_stores!(
    thread_and_assistant_hooks,
    thread_and_assistant_webhooks_announce_their_events
);

/// A webhook is checked where it is set: its form, a private address without
/// `PES_WEBHOOK_ALLOW`, a service that signs none; a name that resolves to a private address is
/// refused when it is sent, and nothing reaches it.
async fn webhook_targets_are_guarded(backend: Backend) {
    let Some(py) = python() else { return };
    let rx = Receiver::start(&py, "200", 0).await;
    let port = rx.base.rsplit(':').next().unwrap().to_owned();
    let app = spawn_with(backend, None, |c| {
        hooks_on(c);
        c.webhook_allow = None;
    })
    .await;
    let post = |body: Value| {
        let app = &app;
        async move { app.post("/v1/threads/g/runs", body).await }
    };
    let run = |hook: Value| json!({"query": "q", "ifNotExists": "create", "webhook": hook});
    let (st, p) = post(run(json!({"url": rx.base.clone()}))).await;
    assert_eq!(st, 422, "{p}");
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("webhook.url")
            && detail.contains("loopback")
            && detail.contains("PES_WEBHOOK_ALLOW"),
        "{detail}"
    );
    let (st, p) = app
        .post(
            "/v1/threads",
            json!({"config": {"webhook": {"url": "http://169.254.169.254/latest"}}}),
        )
        .await;
    assert_eq!(st, 422, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("metadata"), "{p}");
    for (bad, says) in [
        (json!({"url": "ftp://example.com/"}), "http or https"),
        (
            json!({"url": "https://example.com/", "events": []}),
            "webhook.events",
        ),
        (
            json!({"url": "https://example.com/", "events": ["run.exploded"]}),
            "run.exploded",
        ),
        (
            json!({"url": "https://example.com/", "secret": "x"}),
            "secret",
        ),
    ] {
        let (st, p) = post(run(bad.clone())).await;
        assert_eq!(st, 422, "{bad}: {p}");
        assert!(p["detail"].as_str().unwrap().contains(says), "{bad}: {p}");
    }
    let (st, p) = post(json!({"query": "q", "ifNotExists": "create",
        "webhook": {"url": "https://example.com/a"},
        "config": {"webhook": {"url": "https://example.com/b"}}}))
    .await;
    assert_eq!(st, 422, "{p}");

    // A name is judged when it is resolved: accepted here, refused at delivery.
    let run = app_run(
        &app,
        "named",
        json!({"url": format!("http://localhost:{port}/x")}),
    )
    .await;
    let d = delivery_when(&app, run["runId"].as_str().unwrap(), "failed").await;
    let error = d["lastError"].as_str().unwrap();
    assert!(
        error.contains("`localhost` is not an allowed address")
            && error.contains("PES_WEBHOOK_ALLOW"),
        "{error}"
    );
    assert!(
        !error.contains("127.0.0.1") && !error.contains("loopback"),
        "the refusal never says what the name resolved to: {error}"
    );
    assert_eq!(d["attempts"], 1, "a refusal is not retried");
    assert!(rx.seen().is_empty(), "nothing reached the private target");
    app.stop().await;

    // Without PES_WEBHOOK_SECRET nothing is signed, so no webhook is accepted.
    let bare = spawn_with(backend, None, |_| {}).await;
    let (st, p) = bare
        .post(
            "/v1/threads/x/runs",
            json!({"query": "q", "ifNotExists": "create", "webhook": {"url": "https://example.com/"}}),
        )
        .await;
    problem(&p, 422, "webhooks_not_configured");
    assert_eq!(st, 422);
    bare.stop().await;
}
both_stores!(targets_guarded, webhook_targets_are_guarded);

/// `GET` and `POST …/retry` as another tenant with `key`.
async fn as_tenant(app: &TestApp, key: &str, method: reqwest::Method, path: &str) -> (u16, Value) {
    read(
        app.client
            .request(method, app.url(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// A tenant sees and retries only its own deliveries; the list pages.
async fn deliveries_are_per_tenant_and_paged(backend: Backend) {
    let Some(py) = python() else { return };
    let rx = Receiver::start(&py, "410", 0).await;
    let app = spawn_with(backend, None, |c| {
        hooks_on(c);
        c.api_keys = Some("ka:acme,kb:globex".into());
    })
    .await;
    let mut ids = Vec::new();
    for t in ["p1", "p2", "p3"] {
        let r = app
            .client
            .post(app.url(&format!("/v1/threads/{t}/runs/wait")))
            .bearer_auth("ka")
            .json(&json!({"query": "What is 2+3?", "ifNotExists": "create",
                          "webhook": {"url": format!("{}/{t}", rx.base)}}))
            .send()
            .await
            .unwrap();
        let (st, run) = read(r).await;
        assert_eq!(st, 200, "{run}");
        ids.push(run["runId"].as_str().unwrap().to_owned());
    }
    wait_received(&rx, |s| s.len() == 3).await;
    let (_, acme) = as_tenant(
        &app,
        "ka",
        reqwest::Method::GET,
        "/v1/webhook-deliveries?limit=2",
    )
    .await;
    let first = acme["items"].as_array().unwrap();
    assert_eq!(first.len(), 2, "{acme}");
    let cursor = acme["nextCursor"].as_str().expect("a next page");
    let (_, rest) = as_tenant(
        &app,
        "ka",
        reqwest::Method::GET,
        &format!("/v1/webhook-deliveries?limit=2&cursor={cursor}"),
    )
    .await;
    let rest = rest["items"].as_array().unwrap();
    assert_eq!(rest.len(), 1);
    let listed: Vec<&str> = first
        .iter()
        .chain(rest)
        .map(|d| d["runId"].as_str().unwrap())
        .collect();
    let newest_first: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    assert_eq!(listed, newest_first);

    let (_, globex) = as_tenant(&app, "kb", reqwest::Method::GET, "/v1/webhook-deliveries").await;
    assert!(globex["items"].as_array().unwrap().is_empty(), "{globex}");
    let (_, globex) = as_tenant(
        &app,
        "kb",
        reqwest::Method::GET,
        &format!("/v1/webhook-deliveries?runId={}", ids[0]),
    )
    .await;
    assert!(globex["items"].as_array().unwrap().is_empty(), "{globex}");
    let (st, _) = app.get("/v1/webhook-deliveries").await;
    assert_eq!(st, 401, "the list needs a key");
    let id = first[0]["deliveryId"].as_str().unwrap();
    let (st, p) = as_tenant(
        &app,
        "kb",
        reqwest::Method::POST,
        &format!("/v1/webhook-deliveries/{id}/retry"),
    )
    .await;
    assert_eq!(st, 404, "another tenant's delivery is not found: {p}");
    app.stop().await;
}
both_stores!(per_tenant, deliveries_are_per_tenant_and_paged);
