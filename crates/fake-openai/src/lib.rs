//! A fake OpenAI-compatible Chat Completions server over real HTTP, shared by pes-server's
//! black-box tests and by `pes-bench`, so both talk to one model double instead of two copies.
//! It also serves deterministic embeddings (`POST /v1/embeddings`, see [`embeddings`]).
//! The same double speaks Anthropic's Messages API ([`FakeLlm::start_anthropic`], see
//! `anthropic`); both answer a `stream: true` request with a streamed reply, at the pace a test
//! sets ([`FakeLlm::stream_slowly`]).
//!
//! A request's phase (plan, execute, synthesis, compaction) comes from its `response_format`; an
//! execute request's item from its brief (`Your item [<id>]`). A request gets, in this order: a
//! reply scripted for its item, the next reply queued for its phase, a default set for its phase,
//! or else the reply of the server's [`Workload`]:
//!
//! - [`Workload::Tests`] (what [`FakeLlm::start`] serves): a 2-item plan (a calculator item, then
//!   a reasoning item), items that call the tool their brief requires and then answer, a fixed
//!   synthesis. Tests script what they need on top, hold requests in flight
//!   ([`FakeLlm::hold_if`]), and read the log of every request.
//! - [`Workload::Calculator3`] (what [`FakeLlm::bench`] serves): the benchmark's 3 independent
//!   `calculator` items per plan (fresh ids when the thread already has a plan), one tool call
//!   then an answer per item, then a synthesis: 8 model calls per run. Every reply waits the
//!   configured latency, and the server keeps no request log, so it answers hundreds of thousands
//!   of calls in constant memory.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

mod anthropic;
pub mod embeddings;
pub mod openai;

/// How a streamed reply is written: its text (or structured JSON) in `chunks` pieces, with
/// `delay` before each event after the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    pub chunks: usize,
    pub delay: Duration,
}

impl Default for Pace {
    /// The whole text in one piece, at once.
    fn default() -> Self {
        Pace {
            chunks: 1,
            delay: Duration::ZERO,
        }
    }
}

/// A request as it came over the wire.
#[derive(Clone, Debug)]
pub struct WireRequest {
    /// Header names (lower case) and values.
    pub headers: HashMap<String, String>,
    pub body: Value,
}

/// One scripted reply.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Assistant content that is this JSON (serialized to a string).
    Json(Value),
    /// Plain assistant text.
    Text(String),
    /// Tool calls: (name, arguments).
    ToolCalls(Vec<(String, Value)>),
    /// An HTTP error status with a body and an optional Retry-After.
    Status(u16, String, Option<String>),
    /// Wait, then reply.
    Delay(Duration, Box<Reply>),
}

/// What the server answers to a request nothing was scripted for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Workload {
    /// The tests' defaults: a 2-item plan (`s1` computes 2+2 with `calculator`, `s2` explains it),
    /// an execute request calls the tool its brief requires (`calculator`, or `debug_sleep` for
    /// 20 ms, 3 s when the item says `(slow)`) and then answers with what the tool said, a fixed
    /// synthesis, and a compaction that keeps the first 200 characters.
    #[default]
    Tests,
    /// The benchmark's workload (the peers' one): a plan of 3 independent `calculator` items
    /// (`a`, `b`, `c`; suffixed with the call number on a refinement, so every follow-up run
    /// executes 3 new items), each item makes one `calculator` call then answers `ok`, and the
    /// synthesis answers `done`.
    Calculator3,
}

/// How a [`FakeLlm`] behaves.
#[derive(Clone, Debug)]
pub struct Options {
    /// The replies of unscripted requests.
    pub workload: Workload,
    /// How long every request waits before its reply (after any hold); zero answers at once.
    pub latency: Duration,
    /// Keep every request for [`FakeLlm::requests`] and [`FakeLlm::wait_for_request`]. A load
    /// generator turns it off: the log grows with every call.
    pub record_requests: bool,
}

impl Default for Options {
    /// The tests' server: [`Workload::Tests`], no latency, every request recorded.
    fn default() -> Self {
        Options {
            workload: Workload::Tests,
            latency: Duration::ZERO,
            record_requests: true,
        }
    }
}

type Pred = Arc<dyn Fn(&Value) -> bool + Send + Sync>;

/// What tests script, and what the server saw.
#[derive(Default)]
struct Script {
    /// The requests held before they are answered (none when unset).
    hold: Option<Pred>,
    /// Delay the first request that matches, once.
    slow_once: Option<(Pred, Duration)>,
    /// Delay every execute request.
    execute_delay: Option<Duration>,
    plan: VecDeque<Reply>,
    execute: VecDeque<Reply>,
    synthesis: VecDeque<Reply>,
    compaction: VecDeque<Reply>,
    flowchart: VecDeque<Reply>,
    /// Scripted execute replies by item id (they come before the phase's queue): with items
    /// running in parallel, the order of execute requests across items is not fixed.
    item_replies: HashMap<String, VecDeque<Reply>>,
    /// Replies for an item's unscripted execute requests, by item id.
    item_defaults: HashMap<String, Reply>,
    /// Replies for unscripted requests of a phase, instead of the workload's.
    defaults: HashMap<&'static str, Reply>,
    /// Every request received, with the instant it arrived (when recording), in the Chat
    /// Completions shape.
    requests: Vec<(Instant, Value)>,
    /// Every request as it came over the wire (when recording).
    wire: Vec<WireRequest>,
    /// How streamed replies are written.
    pace: Pace,
    /// The usage every OpenAI-style reply reports (prompt, completion tokens); unset: 10 and 5.
    usage: Option<(u64, u64)>,
}

/// State shared by the handle and the server's requests.
struct Shared {
    options: Options,
    script: Mutex<Script>,
    /// Bumped whenever what is held changes, so held requests look again.
    gate: watch::Sender<u64>,
    /// Woken when a request arrives or one ends.
    traffic: Notify,
    calls: AtomicU64,
    in_flight: AtomicUsize,
    peak_in_flight: AtomicUsize,
    /// `POST /v1/embeddings` answers 503 while set.
    embeddings_down: AtomicBool,
    /// Embeddings requests received.
    embedding_calls: AtomicU64,
}

impl Shared {
    fn script(&self) -> MutexGuard<'_, Script> {
        // A test's predicate that panicked poisons nothing worth refusing to read.
        self.script.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The fake server; cheap to clone. It serves `POST {url}/chat/completions` (or, started with
/// [`FakeLlm::start_anthropic`], `POST {url}/v1/messages`) until the runtime that started it
/// ends.
#[derive(Clone)]
pub struct FakeLlm {
    /// The base URL to give a provider (`http://127.0.0.1:<port>/v1`, or
    /// `http://127.0.0.1:<port>` for Anthropic's API).
    pub url: String,
    shared: Arc<Shared>,
}

/// Phase of a request, from its `response_format`: `plan`, `synthesis`, `compaction` or
/// `execute`.
pub fn phase_of(req: &Value) -> &'static str {
    match req["response_format"]["json_schema"]["name"].as_str() {
        Some("pes_plan") => "plan",
        Some("pes_synthesis") => "synthesis",
        Some("pes_compaction") => "compaction",
        Some("pes_flowchart") => "flowchart",
        // A flowchart's `llm` stage without a schema: no tools, its own system prompt.
        _ if req["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.starts_with("You are one stage of a flowchart")) =>
        {
            "flowchart"
        }
        // Only an execute request offers tools.
        _ if !req["tools"].is_null() => "execute",
        _ => {
            // A provider fallback without response_format still carries the schema in the prompt.
            let text = req["messages"].to_string();
            if text.contains("todoList") && text.contains("JSON Schema") {
                "plan"
            } else if text.contains("JSON Schema") {
                "synthesis"
            } else {
                "execute"
            }
        }
    }
}

/// The item an execute request is for: the id in its brief's `Your item [<id>]`.
pub fn item_of(req: &Value) -> Option<String> {
    if phase_of(req) != "execute" {
        return None;
    }
    brief_item(req["messages"][1]["content"].as_str()?).map(str::to_owned)
}

fn brief_item(brief: &str) -> Option<&str> {
    brief.split("Your item [").nth(1)?.split(']').next()
}

/// A plan reply with the given items: (id, description, requiredTools, dependencies).
pub fn plan(items: &[(&str, &str, &[&str], &[&str])]) -> Reply {
    Reply::Json(json!({
        "title": "Test plan",
        "intent": "Answer the test query",
        "plan": "Do the items in order",
        "todoList": items
            .iter()
            .map(|(id, desc, tools, deps)| plan_item(id, desc, tools, deps))
            .collect::<Vec<_>>(),
    }))
}

/// One item of a plan reply, with every field of the `pes_plan` schema (`kind`, `role` and
/// `toolAllowlist` null: a caller sets them on the value when it needs them).
pub fn plan_item(id: &str, desc: &str, tools: &[&str], deps: &[&str]) -> Value {
    json!({
        "id": id,
        "description": desc,
        "stepType": if tools.is_empty() { "reasoning" } else { "tool" },
        "requiredTools": tools,
        "expectedOutcome": "a result",
        "dependencies": deps,
        "kind": null,
        "role": null,
        "toolAllowlist": null,
    })
}

impl FakeLlm {
    /// The tests' server ([`Options::default`]) on a free loopback port.
    ///
    /// # Panics
    /// When no loopback port can be bound: a test cannot go on without its model.
    pub async fn start() -> FakeLlm {
        FakeLlm::start_with(Options::default())
            .await
            .expect("the fake model could not bind a loopback port")
    }

    /// The benchmark's server: [`Workload::Calculator3`], every reply after `latency`, no
    /// request log.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn bench(latency: Duration) -> io::Result<FakeLlm> {
        FakeLlm::start_with(Options {
            workload: Workload::Calculator3,
            latency,
            record_requests: false,
        })
        .await
    }

    /// A server with these options on a free loopback port, served by a task of the current
    /// runtime.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start_with(options: Options) -> io::Result<FakeLlm> {
        FakeLlm::serve(options, false).await
    }

    /// The tests' server ([`Options::default`]) behind Anthropic's Messages API, on a free
    /// loopback port. Requests are scripted, held and read back ([`FakeLlm::requests`]) in the
    /// Chat Completions shape, like those of [`FakeLlm::start`]; [`FakeLlm::wire_requests`] has
    /// them as they came.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start_anthropic() -> FakeLlm {
        FakeLlm::serve(Options::default(), true)
            .await
            .expect("the fake model could not bind a loopback port")
    }

    async fn serve(options: Options, anthropic: bool) -> io::Result<FakeLlm> {
        let shared = Arc::new(Shared {
            options,
            script: Mutex::default(),
            gate: watch::Sender::new(0),
            traffic: Notify::new(),
            calls: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            peak_in_flight: AtomicUsize::new(0),
            embeddings_down: AtomicBool::new(false),
            embedding_calls: AtomicU64::new(0),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = if anthropic {
            Router::new().route("/v1/messages", post(handle_anthropic))
        } else {
            Router::new()
                .route("/v1/chat/completions", post(handle))
                .route("/v1/embeddings", post(embeddings::handle))
        }
        .with_state(shared.clone());
        // The server lives as long as the test or bench that started it: it ends with the runtime.
        #[allow(clippy::disallowed_methods)]
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("the fake model stopped: {e}");
            }
        });
        let url = if anthropic {
            format!("http://{addr}")
        } else {
            format!("http://{addr}/v1")
        };
        Ok(FakeLlm { url, shared })
    }

    /// Make `POST /v1/embeddings` answer 503 (`true`, a provider outage) or embed again.
    pub fn embeddings_down(&self, down: bool) {
        self.shared.embeddings_down.store(down, Ordering::Relaxed);
    }

    /// Embeddings requests received so far (answered or refused).
    pub fn embedding_calls(&self) -> u64 {
        self.shared.embedding_calls.load(Ordering::Relaxed)
    }

    /// Write streamed replies' text (and structured JSON) in `chunks` pieces, waiting `delay`
    /// before each event after the first: a model that streams slowly.
    pub fn stream_slowly(&self, chunks: usize, delay: Duration) {
        self.shared.script().pace = Pace {
            chunks: chunks.max(1),
            delay,
        };
    }

    /// Report `prompt` and `completion` tokens in the usage of every reply from now on (OpenAI's
    /// format; 10 and 5 until set): what a budget counts.
    pub fn set_usage(&self, prompt: u64, completion: u64) {
        self.shared.script().usage = Some((prompt, completion));
    }

    /// Queue a reply for the next request of `phase` (`plan`, `execute`, `synthesis`,
    /// `compaction`).
    ///
    /// # Panics
    /// On any other phase.
    pub fn push(&self, phase: &str, reply: Reply) -> &Self {
        let mut s = self.shared.script();
        match phase {
            "plan" => s.plan.push_back(reply),
            "execute" => s.execute.push_back(reply),
            "synthesis" => s.synthesis.push_back(reply),
            "compaction" => s.compaction.push_back(reply),
            "flowchart" => s.flowchart.push_back(reply),
            other => panic!("unknown phase {other}"),
        }
        self
    }

    /// Answer every unscripted request of `phase` with `reply` (instead of the workload's).
    pub fn set_default(&self, phase: &'static str, reply: Reply) {
        self.shared.script().defaults.insert(phase, reply);
    }

    /// Delay the first request for which `pred` holds by `delay` (once).
    pub fn slow_once(
        &self,
        pred: impl Fn(&Value) -> bool + Send + Sync + 'static,
        delay: Duration,
    ) {
        self.shared.script().slow_once = Some((Arc::new(pred), delay));
    }

    /// Delay every execute-phase request.
    pub fn delay_execute(&self, delay: Duration) {
        self.shared.script().execute_delay = Some(delay);
    }

    /// Hold every request from now on (recorded on arrival, answered only after
    /// [`Self::release`]): model calls stay in flight for as long as the caller needs.
    pub fn hold(&self) {
        self.set_hold(Some(Arc::new(|_: &Value| true)));
    }

    /// Hold only the requests for which `pred` holds (until [`Self::release`] or another hold);
    /// the others are answered as usual. Requests held already are looked at again: one that
    /// `pred` does not match is answered now, so a test can let items go one by one.
    pub fn hold_if(&self, pred: impl Fn(&Value) -> bool + Send + Sync + 'static) {
        self.set_hold(Some(Arc::new(pred)));
    }

    /// Answer the held requests and stop holding.
    pub fn release(&self) {
        self.set_hold(None);
    }

    fn set_hold(&self, hold: Option<Pred>) {
        self.shared.script().hold = hold;
        self.shared.gate.send_modify(|n| *n += 1);
    }

    /// Queue a reply for the next execute request of item `id` (its brief's `Your item [id]`);
    /// it comes before the execute queue and the defaults.
    pub fn push_item(&self, id: &str, reply: Reply) -> &Self {
        self.shared
            .script()
            .item_replies
            .entry(id.to_owned())
            .or_default()
            .push_back(reply);
        self
    }

    /// Answer every unscripted execute request of item `id` with `reply`.
    pub fn set_item_default(&self, id: &str, reply: Reply) {
        self.shared
            .script()
            .item_defaults
            .insert(id.to_owned(), reply);
    }

    /// Wait (deadline 30 s) until a request matching `pred` has arrived.
    ///
    /// # Panics
    /// When the deadline passes, or when the server keeps no request log.
    pub async fn wait_for_request(&self, pred: impl Fn(&Value) -> bool) {
        assert!(
            self.shared.options.record_requests,
            "wait_for_request needs a server that records its requests"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let arrived = self.shared.traffic.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if self.shared.script().requests.iter().any(|(_, r)| pred(r)) {
                return;
            }
            assert!(
                tokio::time::timeout_at(deadline, arrived).await.is_ok(),
                "the expected model request never came"
            );
        }
    }

    /// Every request received, in order (empty when the server keeps no log).
    pub fn requests(&self) -> Vec<Value> {
        let s = self.shared.script();
        s.requests.iter().map(|(_, r)| r.clone()).collect()
    }

    /// Every request received, in order, with the instant it arrived.
    pub fn requests_timed(&self) -> Vec<(Instant, Value)> {
        self.shared.script().requests.clone()
    }

    /// Every request as it came over the wire (headers and body), in order.
    pub fn wire_requests(&self) -> Vec<WireRequest> {
        self.shared.script().wire.clone()
    }

    /// Requests of one phase.
    pub fn requests_of(&self, phase: &str) -> Vec<Value> {
        let s = self.shared.script();
        s.requests
            .iter()
            .filter(|(_, r)| phase_of(r) == phase)
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Requests received so far (also when no log is kept).
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::Relaxed)
    }

    /// Requests received and not answered yet (held, waiting their latency, or being written).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// The most requests that were in flight at once.
    pub fn peak_in_flight(&self) -> usize {
        self.shared.peak_in_flight.load(Ordering::Relaxed)
    }

    /// Wait until at least `n` requests are in flight at once (with [`Self::hold`], until `n`
    /// model calls are waiting here).
    pub async fn wait_in_flight(&self, n: usize) {
        loop {
            let changed = self.shared.traffic.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.in_flight() >= n {
                return;
            }
            changed.await;
        }
    }
}

/// Counts a request in flight for as long as its handler lives (also when the client goes away).
struct InFlight(Arc<Shared>);

impl InFlight {
    fn enter(shared: &Arc<Shared>) -> InFlight {
        let now = shared.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        shared.peak_in_flight.fetch_max(now, Ordering::Relaxed);
        InFlight(shared.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.traffic.notify_waiters();
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(req): Json<Value>,
) -> Response {
    let _in_flight = InFlight::enter(&shared);
    let stream = req["stream"] == true;
    let (reply, n) = answer(&shared, &req, &req, &headers).await;
    let (pace, usage) = {
        let script = shared.script();
        (script.pace, script.usage.unwrap_or((10, 5)))
    };
    openai::render(reply, n, stream, pace, usage).await
}

async fn handle_anthropic(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(raw): Json<Value>,
) -> Response {
    let _in_flight = InFlight::enter(&shared);
    let chat = anthropic::to_chat(&raw);
    let (reply, n) = answer(&shared, &chat, &raw, &headers).await;
    let pace = shared.script().pace;
    anthropic::render(reply, n, &raw, pace).await
}

/// Record a request (`chat`: its Chat Completions shape; `wire`: as it came), choose its reply,
/// hold it while a hold matches it, wait its delays; the reply, with the request's number.
async fn answer(
    shared: &Arc<Shared>,
    chat: &Value,
    wire: &Value,
    headers: &HeaderMap,
) -> (Reply, u64) {
    let n = shared.calls.fetch_add(1, Ordering::Relaxed) + 1;
    let phase = phase_of(chat);
    if shared.options.record_requests {
        let headers = headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        shared.script().wire.push(WireRequest {
            headers,
            body: wire.clone(),
        });
    }
    let (mut reply, delay) = pick_reply(shared, phase, chat, n);
    shared.traffic.notify_waiters();
    loop {
        // Subscribed before looking, so a change made in between is not missed.
        let mut changed = shared.gate.subscribe();
        if !shared.script().hold.as_ref().is_some_and(|p| p(chat)) {
            break;
        }
        let _ = changed.changed().await;
    }
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    if !shared.options.latency.is_zero() {
        tokio::time::sleep(shared.options.latency).await;
    }
    while let Reply::Delay(d, inner) = reply {
        tokio::time::sleep(d).await;
        reply = *inner;
    }
    (reply, n)
}

/// `text` in `n` pieces of (nearly) equal length in characters, none empty.
pub(crate) fn pieces(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return vec![];
    }
    let size = chars.len().div_ceil(n.max(1));
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// An error reply: the status, the body as scripted, and its `retry-after`.
pub(crate) fn error_response(code: u16, body: String, retry_after: Option<String>) -> Response {
    let mut headers = HeaderMap::new();
    if let Some(ra) = retry_after.and_then(|ra| HeaderValue::from_str(&ra).ok()) {
        headers.insert("retry-after", ra);
    }
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, headers, body).into_response()
}

/// A `text/event-stream` reply of these frames, `delay` before each frame after the first.
pub(crate) fn sse_response(frames: Vec<String>, delay: Duration) -> Response {
    let body = if delay.is_zero() {
        Body::from(frames.concat())
    } else {
        let frames =
            futures::stream::iter(frames.into_iter().enumerate()).then(move |(i, f)| async move {
                if i > 0 {
                    tokio::time::sleep(delay).await;
                }
                Ok::<_, std::convert::Infallible>(f)
            });
        Body::from_stream(frames)
    };
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    resp
}

/// Record the request (when logging) and choose its reply and any scripted delay.
fn pick_reply(
    shared: &Shared,
    phase: &'static str,
    req: &Value,
    n: u64,
) -> (Reply, Option<Duration>) {
    let item = if phase == "execute" {
        item_of(req)
    } else {
        None
    };
    let mut s = shared.script();
    if shared.options.record_requests {
        s.requests.push((Instant::now(), req.clone()));
    }
    let mut delay = if phase == "execute" {
        s.execute_delay
    } else {
        None
    };
    if let Some((pred, d)) = s.slow_once.clone()
        && pred(req)
    {
        s.slow_once = None;
        delay = Some(d);
    }
    let for_item = item.as_ref().and_then(|id| {
        s.item_replies
            .get_mut(id)
            .and_then(VecDeque::pop_front)
            .or_else(|| s.item_defaults.get(id).cloned())
    });
    if let Some(reply) = for_item {
        return (reply, delay);
    }
    let fallback = s.defaults.get(phase).cloned();
    let queue = match phase {
        "plan" => &mut s.plan,
        "synthesis" => &mut s.synthesis,
        "compaction" => &mut s.compaction,
        "flowchart" => &mut s.flowchart,
        _ => &mut s.execute,
    };
    let reply = queue.pop_front().or(fallback);
    drop(s);
    let reply = reply.unwrap_or_else(|| match shared.options.workload {
        Workload::Tests => tests_reply(phase, req),
        Workload::Calculator3 => calculator3_reply(phase, req, n),
    });
    (reply, delay)
}

/// The last message of a request, when it is a tool result.
fn tool_result(req: &Value) -> Option<&Value> {
    let last = req["messages"].as_array()?.last()?;
    (last["role"] == "tool").then_some(last)
}

/// A flowchart `llm` stage: `{"answer": <the prompt>}` for a schema, else `model: <prompt>`.
fn flowchart_reply(req: &Value) -> Reply {
    let prompt = req["messages"][1]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    if req["response_format"].is_null() {
        Reply::Text(format!("model: {prompt}"))
    } else {
        Reply::Json(json!({"answer": prompt}))
    }
}

/// The first 200 characters of the result to compact (after its first line).
fn compaction_reply(req: &Value) -> Reply {
    let text = req["messages"][1]["content"].as_str().unwrap_or("");
    let body = text.split_once('\n').map_or(text, |(_, b)| b);
    Reply::Json(json!({"summary": body.chars().take(200).collect::<String>()}))
}

fn tests_reply(phase: &str, req: &Value) -> Reply {
    match phase {
        "plan" => plan(&[
            ("s1", "Compute 2+2", &["calculator"], &[]),
            ("s2", "Explain the result", &[], &["s1"]),
        ]),
        "synthesis" => Reply::Json(
            json!({"response": "final answer", "sources": [], "suggestions": ["ask again"]}),
        ),
        "compaction" => compaction_reply(req),
        "flowchart" => flowchart_reply(req),
        _ => {
            if let Some(last) = tool_result(req) {
                return Reply::Text(format!(
                    "tool said {}",
                    last["content"].as_str().unwrap_or("")
                ));
            }
            let brief = req["messages"][1]["content"].as_str().unwrap_or("");
            if brief.contains("Required tools: debug_sleep") {
                let item = brief_item(brief).unwrap_or("x");
                let ms = if brief.contains("(slow)") { 3000 } else { 20 };
                return Reply::ToolCalls(vec![(
                    "debug_sleep".into(),
                    json!({"ms": ms, "tag": item}),
                )]);
            }
            let has_calc = req["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "calculator"));
            if has_calc && brief.contains("Required tools: calculator") {
                Reply::ToolCalls(vec![("calculator".into(), json!({"expression": "2+2"}))])
            } else {
                Reply::Text("done".into())
            }
        }
    }
}

/// The planner's note that a thread already has a plan (see `prompts::refinement_note`).
const REFINEMENT_MARK: &str = "This thread already has a plan";

fn calculator3_reply(phase: &str, req: &Value, n: u64) -> Reply {
    match phase {
        "plan" => {
            let refining = req["messages"].as_array().is_some_and(|ms| {
                ms.iter().any(|m| {
                    m["role"] == "user"
                        && m["content"]
                            .as_str()
                            .is_some_and(|c| c.contains(REFINEMENT_MARK))
                })
            });
            let suffix = if refining {
                format!("-{n}")
            } else {
                String::new()
            };
            let item = |id: &str, expr: &str| {
                let mut item = plan_item(
                    &format!("{id}{suffix}"),
                    &format!("compute {expr}"),
                    &["calculator"],
                    &[],
                );
                item["kind"] = json!("leaf");
                item
            };
            Reply::Json(json!({
                "title": "t", "intent": "i", "plan": "p",
                "todoList": [item("a", "1+1"), item("b", "2+2"), item("c", "3+3")],
            }))
        }
        "synthesis" => Reply::Json(json!({"response": "done", "sources": [], "suggestions": []})),
        "compaction" => compaction_reply(req),
        _ if tool_result(req).is_some() => Reply::Text("ok".into()),
        _ => Reply::ToolCalls(vec![("calculator".into(), json!({"expression": "1+1"}))]),
    }
}
