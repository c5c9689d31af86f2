//! A fake OpenAI-compatible Chat Completions server over real HTTP: scripted replies per phase
//! (plan, execute, synthesis, compaction) and per item, holds that keep chosen requests in flight,
//! a sensible default for anything unscripted, and a log of every request for assertions.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

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

type Pred = Arc<dyn Fn(&Value) -> bool + Send + Sync>;

/// Bumped whenever what is held changes, so held requests look again.
#[derive(Default)]
struct Gate(tokio::sync::watch::Sender<u64>);

#[derive(Default)]
struct Inner {
    /// Held requests wait here (they are recorded on arrival).
    gate: Gate,
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
    /// Scripted execute replies by item id (they come before the phase's queue): with items
    /// running in parallel, the order of execute requests across items is not fixed.
    item_replies: std::collections::HashMap<String, VecDeque<Reply>>,
    /// Replies for an item's unscripted execute requests, by item id.
    item_defaults: std::collections::HashMap<String, Reply>,
    /// Replies for unscripted requests of a phase, instead of the built-in default.
    defaults: std::collections::HashMap<&'static str, Reply>,
    requests: Vec<Value>,
    /// When each request of `requests` arrived.
    arrivals: Vec<Instant>,
    calls: u64,
}

/// The fake server; cheap to clone.
#[derive(Clone)]
pub struct FakeLlm {
    pub url: String,
    inner: Arc<Mutex<Inner>>,
}

/// Phase of a request, from its `response_format`.
pub fn phase_of(req: &Value) -> &'static str {
    match req["response_format"]["json_schema"]["name"].as_str() {
        Some("pes_plan") => "plan",
        Some("pes_synthesis") => "synthesis",
        Some("pes_compaction") => "compaction",
        _ => {
            // A provider fallback without response_format still carries the schema in the prompt.
            let text = req["messages"].to_string();
            if req["tools"].is_null() && text.contains("todoList") && text.contains("JSON Schema") {
                "plan"
            } else if req["tools"].is_null() && text.contains("JSON Schema") {
                "synthesis"
            } else {
                "execute"
            }
        }
    }
}

impl FakeLlm {
    pub async fn start() -> FakeLlm {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            .with_state(inner.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeLlm {
            url: format!("http://{addr}/v1"),
            inner,
        }
    }

    /// Queue a reply for the next request of `phase` (`plan`, `execute`, `synthesis`).
    pub fn push(&self, phase: &str, reply: Reply) -> &Self {
        let mut g = self.inner.lock().unwrap();
        match phase {
            "plan" => g.plan.push_back(reply),
            "execute" => g.execute.push_back(reply),
            "synthesis" => g.synthesis.push_back(reply),
            "compaction" => g.compaction.push_back(reply),
            other => panic!("unknown phase {other}"),
        }
        self
    }

    /// Answer every unscripted request of `phase` with `reply` (instead of the built-in default).
    pub fn set_default(&self, phase: &'static str, reply: Reply) {
        self.inner.lock().unwrap().defaults.insert(phase, reply);
    }

    /// Delay the first request for which `pred` holds by `delay` (once).
    pub fn slow_once(
        &self,
        pred: impl Fn(&Value) -> bool + Send + Sync + 'static,
        delay: Duration,
    ) {
        self.inner.lock().unwrap().slow_once = Some((Arc::new(pred), delay));
    }

    /// Delay every execute-phase request.
    pub fn delay_execute(&self, delay: Duration) {
        self.inner.lock().unwrap().execute_delay = Some(delay);
    }

    /// Hold every request from now on (recorded on arrival, answered only after [`Self::release`]):
    /// model calls stay in flight for as long as a test needs.
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
        let mut g = self.inner.lock().unwrap();
        g.hold = hold;
        g.gate.0.send_modify(|n| *n += 1);
    }

    /// Queue a reply for the next execute request of item `id` (its brief's `Your item [id]`);
    /// it comes before the execute queue and the defaults.
    pub fn push_item(&self, id: &str, reply: Reply) -> &Self {
        self.inner
            .lock()
            .unwrap()
            .item_replies
            .entry(id.to_owned())
            .or_default()
            .push_back(reply);
        self
    }

    /// Answer every unscripted execute request of item `id` with `reply`.
    pub fn set_item_default(&self, id: &str, reply: Reply) {
        self.inner
            .lock()
            .unwrap()
            .item_defaults
            .insert(id.to_owned(), reply);
    }

    /// Wait (deadline 30 s) until a request matching `pred` has arrived.
    pub async fn wait_for_request(&self, pred: impl Fn(&Value) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !self.requests().iter().any(&pred) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the expected model request never came"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// Every request received, in order, with the instant it arrived.
    pub fn requests_timed(&self) -> Vec<(Instant, Value)> {
        let g = self.inner.lock().unwrap();
        g.arrivals.iter().copied().zip(g.requests.clone()).collect()
    }

    /// Requests of one phase.
    pub fn requests_of(&self, phase: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| phase_of(r) == phase)
            .collect()
    }
}

/// The item an execute request is for: the id in its brief's `Your item [<id>]`.
pub fn item_of(req: &Value) -> Option<String> {
    if phase_of(req) != "execute" {
        return None;
    }
    let brief = req["messages"][1]["content"].as_str()?;
    let rest = brief.split("Your item [").nth(1)?;
    Some(rest.split(']').next()?.to_owned())
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
/// `toolAllowlist` null: a test sets them on the value when it needs them).
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

fn default_reply(phase: &str, req: &Value) -> Reply {
    match phase {
        "plan" => plan(&[
            ("s1", "Compute 2+2", &["calculator"], &[]),
            ("s2", "Explain the result", &[], &["s1"]),
        ]),
        "synthesis" => Reply::Json(
            json!({"response": "final answer", "sources": [], "suggestions": ["ask again"]}),
        ),
        // The first 200 characters of the result to compact (after its first line).
        "compaction" => {
            let text = req["messages"][1]["content"].as_str().unwrap_or("");
            let body = text.split_once('\n').map_or(text, |(_, b)| b);
            Reply::Json(json!({"summary": body.chars().take(200).collect::<String>()}))
        }
        _ => {
            let messages = req["messages"].as_array().cloned().unwrap_or_default();
            let last = messages.last().cloned().unwrap_or(Value::Null);
            if last["role"] == "tool" {
                return Reply::Text(format!(
                    "tool said {}",
                    last["content"].as_str().unwrap_or("")
                ));
            }
            let brief = messages
                .get(1)
                .map(|m| m["content"].as_str().unwrap_or("").to_owned())
                .unwrap_or_default();
            if brief.contains("Required tools: debug_sleep") {
                let item = brief
                    .split("Your item [")
                    .nth(1)
                    .and_then(|s| s.split(']').next())
                    .unwrap_or("x");
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

fn completion(content: Option<String>, tool_calls: Vec<Value>) -> Value {
    let finish = if tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
}

async fn handle(State(inner): State<Arc<Mutex<Inner>>>, Json(req): Json<Value>) -> Response {
    let phase = phase_of(&req);
    let item = item_of(&req);
    let (reply, n, delay) = {
        let mut g = inner.lock().unwrap();
        g.requests.push(req.clone());
        g.arrivals.push(Instant::now());
        g.calls += 1;
        let mut delay = if phase == "execute" {
            g.execute_delay
        } else {
            None
        };
        if let Some((pred, d)) = g.slow_once.clone()
            && pred(&req)
        {
            g.slow_once = None;
            delay = Some(d);
        }
        let calls = g.calls;
        let for_item = item.as_ref().and_then(|id| {
            g.item_replies
                .get_mut(id)
                .and_then(VecDeque::pop_front)
                .or_else(|| g.item_defaults.get(id).cloned())
        });
        let fallback = g.defaults.get(phase).cloned();
        let q = match phase {
            "plan" => &mut g.plan,
            "synthesis" => &mut g.synthesis,
            "compaction" => &mut g.compaction,
            _ => &mut g.execute,
        };
        let reply = match for_item {
            Some(r) => r,
            None => q
                .pop_front()
                .or(fallback)
                .unwrap_or_else(|| default_reply(phase, &req)),
        };
        (reply, calls, delay)
    };
    loop {
        // Subscribed before looking, so a change made in between is not missed.
        let mut changed = inner.lock().unwrap().gate.0.subscribe();
        if !held(&inner, &req) {
            break;
        }
        let _ = changed.changed().await;
    }
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    render(reply, n).await
}

fn held(inner: &Mutex<Inner>, req: &Value) -> bool {
    inner.lock().unwrap().hold.as_ref().is_some_and(|p| p(req))
}

async fn render(reply: Reply, n: u64) -> Response {
    let mut reply = reply;
    while let Reply::Delay(d, inner) = reply {
        tokio::time::sleep(d).await;
        reply = *inner;
    }
    match reply {
        Reply::Json(v) => Json(completion(Some(v.to_string()), vec![])).into_response(),
        Reply::Text(t) => Json(completion(Some(t), vec![])).into_response(),
        Reply::ToolCalls(calls) => {
            let calls = calls
                .into_iter()
                .enumerate()
                .map(|(i, (name, args))| {
                    json!({
                        "id": format!("call_{n}_{i}"),
                        "type": "function",
                        "function": {"name": name, "arguments": args.to_string()}
                    })
                })
                .collect();
            Json(completion(None, calls)).into_response()
        }
        Reply::Status(code, body, retry_after) => {
            let mut headers = HeaderMap::new();
            if let Some(ra) = retry_after {
                headers.insert("retry-after", HeaderValue::from_str(&ra).unwrap());
            }
            (StatusCode::from_u16(code).unwrap(), headers, body).into_response()
        }
        Reply::Delay(..) => unreachable!(),
    }
}
