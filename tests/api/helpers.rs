//! Spawning the app on port 0 against a fresh database, and small HTTP and SSE clients.

use std::time::Duration;

use clap::Parser;
use futures::StreamExt;
use pes_server::App;
use pes_server::cli::Cli;
use pes_server::config::{Config, ProviderKind};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::db::{self, TempDir};
use crate::fake_llm::FakeLlm;

/// Which store a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// A running app.
pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub token: CancellationToken,
    pub handle: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// A config for tests: port 0, the fake LLM (or offline), fast polling.
pub fn test_config(database_url: &str, llm: Option<&FakeLlm>) -> Config {
    let mut c = Cli::parse_from(["pes-server"]).config;
    c.bind = "127.0.0.1:0".parse().unwrap();
    c.database_url = database_url.to_owned();
    c.database_max_connections = 5;
    c.api_keys = None;
    // Tests name models of their own freely; `models.rs` checks the default (the configured
    // and priced models only).
    c.allowed_models = Some("*".into());
    c.poll_interval_ms = 50;
    c.shutdown_grace_seconds = 5;
    // A developer's own keys configure nothing here.
    c.openai_api_key = None;
    c.openai_base_url = None;
    c.anthropic_api_key = None;
    c.anthropic_base_url = None;
    match llm {
        Some(f) => {
            c.llm_provider = Some(ProviderKind::Openai);
            c.llm_base_url = Some(f.url.clone());
            c.llm_api_key = Some("test-key".into());
            c.llm_model = Some("fake-model".into());
            c.llm_max_retries = 3;
            c.llm_timeout_seconds = 10;
        }
        None => {
            c.llm_provider = Some(ProviderKind::Offline);
            c.llm_base_url = None;
            c.llm_api_key = None;
        }
    }
    c
}

/// Make `fake` (started with `FakeLlm::start_anthropic`) the default provider, `anthropic`.
pub fn use_anthropic(c: &mut Config, fake: &FakeLlm) {
    c.llm_provider = Some(ProviderKind::Anthropic);
    c.llm_base_url = Some(fake.url.clone());
    c.llm_api_key = Some("test-key".into());
    c.llm_model = Some("claude-fake".into());
    c.llm_max_retries = 3;
    c.llm_timeout_seconds = 10;
}

pub async fn database_url(backend: Backend) -> String {
    match backend {
        Backend::Postgres => db::fresh_postgres_url().await,
        Backend::Sqlite => db::fresh_sqlite_url(),
    }
}

/// Spawn the app on a fresh database of `backend`.
pub async fn spawn(backend: Backend, llm: Option<&FakeLlm>) -> TestApp {
    spawn_with(backend, llm, |_| {}).await
}

pub async fn spawn_with(
    backend: Backend,
    llm: Option<&FakeLlm>,
    tweak: impl FnOnce(&mut Config),
) -> TestApp {
    let url = database_url(backend).await;
    let mut config = test_config(&url, llm);
    tweak(&mut config);
    spawn_config(config).await
}

pub async fn spawn_config(config: Config) -> TestApp {
    let app = App::build(config).await.expect("app builds");
    let base = format!("http://127.0.0.1:{}", app.port());
    let token = app.shutdown_token();
    let handle = tokio::spawn(app.run_until_stopped());
    TestApp {
        base,
        client: pes_server::net::client_builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        token,
        handle,
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        read(r).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        read(r).await
    }

    /// `GET path` with `key` as the bearer (a tenant's view).
    pub async fn get_as(&self, key: &str, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        read(r).await
    }

    /// `POST path` with a JSON body as `key`'s tenant.
    pub async fn post_as(&self, key: &str, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        read(r).await
    }

    /// `DELETE path` as `key`'s tenant.
    pub async fn delete_as(&self, key: &str, path: &str) -> (u16, Value) {
        let r = self
            .client
            .delete(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        read(r).await
    }

    /// Create a thread and return its id.
    pub async fn thread(&self, body: Value) -> String {
        let (status, t) = self.post("/v1/threads", body).await;
        assert_eq!(status, 201, "{t}");
        t["threadId"].as_str().unwrap().to_owned()
    }

    /// Post a query and wait for the run to end or suspend.
    pub async fn run_wait(&self, thread: &str, query: &str) -> Value {
        self.run_wait_with(thread, serde_json::json!({"query": query}))
            .await
    }

    /// Post a run (any body: query, config, …) and wait for it to end or suspend (200).
    pub async fn run_wait_with(&self, thread: &str, body: Value) -> Value {
        let (status, run) = self
            .post(&format!("/v1/threads/{thread}/runs/wait"), body)
            .await;
        assert_eq!(status, 200, "{run}");
        run
    }

    /// Start a run (any body) without waiting for it (202); its id.
    pub async fn start_run(&self, thread: &str, body: Value) -> String {
        let (status, run) = self.post(&format!("/v1/threads/{thread}/runs"), body).await;
        assert_eq!(status, 202, "{run}");
        run["runId"].as_str().unwrap().to_owned()
    }

    /// Every observation of a thread, in order.
    pub async fn observations(&self, thread: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let (status, page) = self
                .get(&format!(
                    "/v1/threads/{thread}/observations?after={after}&limit=1000"
                ))
                .await;
            assert_eq!(status, 200, "{page}");
            let items = page["items"].as_array().unwrap().clone();
            out.extend(items);
            match page["nextCursor"].as_str() {
                Some(c) => after = c.parse().unwrap(),
                None => break,
            }
        }
        out
    }

    /// Poll a run until `pred` holds, with a deadline (never a bare sleep).
    pub async fn wait_run(
        &self,
        thread: &str,
        run_id: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        self.poll_run(None, thread, run_id, pred).await
    }

    /// [`Self::wait_run`] as `key`'s tenant.
    pub async fn wait_run_as(
        &self,
        key: &str,
        thread: &str,
        run_id: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        self.poll_run(Some(key), thread, run_id, pred).await
    }

    /// `run` (as a run's JSON: its `threadId` and `runId`) once it has ended or suspended.
    pub async fn settled(&self, run: &Value) -> Value {
        let thread = run["threadId"].as_str().expect("a run's threadId");
        let run_id = run["runId"].as_str().expect("a run's runId");
        self.wait_run(thread, run_id, settled).await
    }

    async fn poll_run(
        &self,
        key: Option<&str>,
        thread: &str,
        run_id: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let path = format!("/v1/threads/{thread}/runs/{run_id}");
        loop {
            let (_, run) = match key {
                Some(k) => self.get_as(k, &path).await,
                None => self.get(&path).await,
            };
            if pred(&run) {
                return run;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "run never reached the condition: {run}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Poll a thread's log until an observation matches `pred` (with a deadline); that one.
    pub async fn wait_observation(&self, thread: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(o) = self.observations(thread).await.into_iter().find(&pred) {
                return o;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no observation of {thread} ever matched"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) {
        self.token.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.handle).await;
    }
}

/// Whether a run has ended or suspended (it is neither queued nor running).
pub fn settled(run: &Value) -> bool {
    !matches!(run["status"].as_str(), Some("queued" | "running"))
}

/// Whether a run has completed or failed.
pub fn completed_or_failed(run: &Value) -> bool {
    run["status"] == "completed" || run["status"] == "failed"
}

/// A run's total tokens (`usage.totalTokens`).
pub fn total_tokens(run: &Value) -> u64 {
    run["usage"]["totalTokens"].as_u64().unwrap()
}

/// The observations of type `t`, in order.
pub fn of_type<'a>(obs: &'a [Value], t: &str) -> Vec<&'a Value> {
    obs.iter().filter(|o| o["type"] == t).collect()
}

/// Assert a problem+json answer: its status (of the response and in the body), its `code`, and
/// a `title`, `detail` and `type`.
#[track_caller]
pub fn assert_problem(got: &(u16, Value), status: u16, code: &str) {
    let (got_status, body) = got;
    assert_eq!(
        (*got_status, body["code"].as_str()),
        (status, Some(code)),
        "{body}"
    );
    assert_eq!(body["status"], status, "{body}");
    assert!(
        body["title"].is_string() && body["detail"].is_string() && body["type"].is_string(),
        "{body}"
    );
}

/// `method path` with an optional JSON body, as the tenant of `key` (or with no key).
pub async fn send(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = app.client.request(method, app.url(path));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    read(req.send().await.unwrap()).await
}

/// `POST /v1/suspensions/{id}/resume` with `body` (the decision).
pub async fn resume(app: &TestApp, id: &str, body: Value) -> (u16, Value) {
    app.post(&format!("/v1/suspensions/{id}/resume"), body)
        .await
}

/// Every item's status in the thread's present state (as `key`'s tenant, or with no key), by id.
pub async fn statuses(app: &TestApp, key: Option<&str>, thread: &str) -> Vec<(String, String)> {
    let path = format!("/v1/threads/{thread}/state");
    let (s, state) = match key {
        Some(k) => app.get_as(k, &path).await,
        None => app.get(&path).await,
    };
    assert_eq!(s, 200, "{state}");
    item_statuses(&state)
}

/// The statuses of a thread state's todo list, by item id.
pub fn item_statuses(state: &Value) -> Vec<(String, String)> {
    state["todoList"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["id"].as_str().unwrap().to_owned(),
                i["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// `PUT /v1/flowcharts/{name}` (as `key`'s tenant, or with no key).
pub async fn put_flowchart(
    app: &TestApp,
    key: Option<&str>,
    name: &str,
    spec: Value,
) -> (u16, Value) {
    let mut req = app
        .client
        .put(app.url(&format!("/v1/flowcharts/{name}")))
        .json(&spec);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    read(req.send().await.unwrap()).await
}

/// Define a flowchart (a new version: 201, or 200 for the same definition); the status.
pub async fn define_flowchart(app: &TestApp, key: Option<&str>, name: &str, spec: Value) -> u16 {
    let (status, body) = put_flowchart(app, key, name, spec).await;
    assert!(
        status == 201 || status == 200,
        "PUT {name}: {status} {body}"
    );
    status
}

/// A fake model whose every call reports 1,000 prompt and 500 completion tokens (1,500).
pub async fn metered_llm() -> FakeLlm {
    let llm = FakeLlm::start().await;
    llm.set_usage(1000, 500);
    llm
}

/// A fresh folder under the system temp dir (`<prefix>-<uuid>`), removed when the guard drops.
pub fn scratch(prefix: &str) -> (std::path::PathBuf, TempDir) {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    (dir.clone(), TempDir(dir))
}

/// A file of the repository (relative to its root), as a path string for a child process.
pub fn repo_file(rel: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(rel)
        .to_string_lossy()
        .into_owned()
}

pub async fn read(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

/// One SSE frame.
#[derive(Debug, Clone, Default)]
pub struct Frame {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
    pub comment: bool,
}

/// A minimal SSE reader over a streaming response.
pub struct SseReader {
    stream: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: String,
}

impl SseReader {
    pub fn new(r: reqwest::Response) -> Self {
        assert_eq!(r.status().as_u16(), 200);
        let ct = r
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        Self {
            stream: r.bytes_stream().boxed(),
            buf: String::new(),
        }
    }

    /// The next frame, or None when the stream ends or breaks (the server died).
    pub async fn next_or_end(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = self.take_frame() {
                return Some(f);
            }
            match self.stream.next().await {
                None | Some(Err(_)) => return None,
                Some(Ok(chunk)) => self.buf.push_str(&String::from_utf8_lossy(&chunk)),
            }
        }
    }

    fn take_frame(&mut self) -> Option<Frame> {
        let pos = self.buf.find("\n\n")?;
        let raw: String = self.buf.drain(..pos + 2).collect();
        let mut f = Frame::default();
        for line in raw.lines() {
            if line.starts_with(':') {
                f.comment = true;
            } else if let Some(v) = line.strip_prefix("id:") {
                f.id = Some(v.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("event:") {
                f.event = Some(v.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("data:") {
                if !f.data.is_empty() {
                    f.data.push('\n');
                }
                f.data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        Some(f)
    }

    /// The next frame, or None at the end of the stream; panics after `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Frame> {
        loop {
            if let Some(f) = self.take_frame() {
                return Some(f);
            }
            match tokio::time::timeout(timeout, self.stream.next()).await {
                Err(_) => panic!("no SSE frame within {timeout:?}; buffer: {}", self.buf),
                Ok(None) => return None,
                Ok(Some(chunk)) => self.buf.push_str(&String::from_utf8_lossy(&chunk.unwrap())),
            }
        }
    }

    /// Observations (data frames) until one of type `until` arrives (inclusive).
    pub async fn until(&mut self, until: &str) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let f = self
                .next(Duration::from_secs(30))
                .await
                .unwrap_or_else(|| panic!("stream ended before {until}"));
            if f.comment {
                continue;
            }
            let v: Value = serde_json::from_str(&f.data).unwrap();
            assert_eq!(f.id.as_deref(), Some(v["seq"].to_string().as_str()));
            assert_eq!(f.event.as_deref(), v["type"].as_str());
            let done = v["type"] == until;
            out.push(v);
            if done {
                return out;
            }
        }
    }
}

/// Run a test body on both stores.
#[macro_export]
macro_rules! both_stores {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$body($crate::helpers::Backend::Postgres).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$body($crate::helpers::Backend::Sqlite).await
            }
        }
    };
}

/// Run store cases (each `async fn(Arc<SqlStore>)`) on a fresh Postgres database and a
/// fresh SQLite file: `postgres::<case>` and `sqlite::<case>`. Used by every module whose tests
/// take a store directly.
#[macro_export]
macro_rules! conformance {
    ($($case:ident),+ $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let store = $crate::db::postgres_store().await;
                    super::$case(std::sync::Arc::new(store)).await;
                }
            )+
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let (store, _dir) = $crate::db::sqlite_store().await;
                    super::$case(std::sync::Arc::new(store)).await;
                }
            )+
        }
    };
}

/// The test venv's Python (`PES_PYVENV`, else `target/pyvenv`) when it can import `module`, or
/// `None` after a loud SKIPPED message when there is none and none is required; where
/// `PES_PYVENV` or `CI` is set a missing module fails the test (`scripts/pyvenv` makes the venv).
pub fn venv_python(module: &str, what: &str) -> Option<std::path::PathBuf> {
    let explicit = std::env::var_os("PES_PYVENV").filter(|v| !v.is_empty());
    let dir = explicit
        .clone()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("target")
                .join("pyvenv")
        });
    let python = dir.join("bin").join("python");
    let found = std::process::Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(python);
    }
    assert!(
        explicit.is_none() && std::env::var_os("CI").is_none(),
        "{what} is missing from {}: run `scripts/pyvenv`",
        dir.display()
    );
    eprintln!(
        "\n!!! SKIPPED: no Python venv with {what} at {}.\n!!! Run `scripts/pyvenv` (CI does).\n",
        dir.display()
    );
    None
}
