//! OpenTelemetry: the real binary exports its spans over OTLP/HTTP (protobuf) to a small
//! collector this test runs; the spans of a run form one tree in the caller's trace
//! (`traceparent`), with the GenAI attributes, and the trace goes on across a suspension and
//! across a crash recovery by another process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use prost::Message;
use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, phase_of};
use crate::helpers::Backend;
use crate::process::{Proc, env_for};

/// One exported span, as the collector received it.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace: String,
    pub id: String,
    /// Empty for a root span.
    pub parent: String,
    pub name: String,
    pub kind: i32,
    pub service: String,
    pub attrs: HashMap<String, Value>,
}

/// OTLP span kinds.
const SERVER: i32 = 2;
const CLIENT: i32 = 3;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn json_of(v: &AnyValue) -> Value {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => json!(s),
        Some(any_value::Value::BoolValue(b)) => json!(b),
        Some(any_value::Value::IntValue(i)) => json!(i),
        Some(any_value::Value::DoubleValue(d)) => json!(d),
        Some(any_value::Value::ArrayValue(a)) => a.values.iter().map(json_of).collect(),
        _ => Value::Null,
    }
}

/// An OTLP/HTTP trace receiver on 127.0.0.1 (port 0) that keeps every span it is sent.
pub struct Collector {
    pub url: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

async fn receive(
    State(spans): State<Arc<Mutex<Vec<Span>>>>,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    if headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        != Some("application/x-protobuf")
    {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, Vec::new()).into_response();
    }
    let Ok(req) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new()).into_response();
    };
    let mut got = Vec::new();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref())
            .map(json_of)
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                got.push(Span {
                    trace: hex(&s.trace_id),
                    id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    name: s.name,
                    kind: s.kind,
                    service: service.clone(),
                    attrs: s
                        .attributes
                        .iter()
                        .map(|kv| {
                            (
                                kv.key.clone(),
                                kv.value.as_ref().map_or(Value::Null, json_of),
                            )
                        })
                        .collect(),
                });
            }
        }
    }
    spans.lock().unwrap().extend(got);
    (
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}

impl Collector {
    pub async fn start() -> Collector {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Collector { url, spans }
    }

    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans received once `pred` holds of them (deadline 30 s).
    pub async fn wait_for(&self, pred: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.spans();
            if pred(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the collector never got them: {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// A process environment that exports here, every `delay_ms`.
    fn env(&self, db: &str, llm: &FakeLlm, delay_ms: u64) -> Vec<(&'static str, String)> {
        let mut env = env_for(db, &llm.url);
        env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", self.url.clone()));
        env.push(("OTEL_SERVICE_NAME", "pes-under-test".into()));
        env.push(("OTEL_BSP_SCHEDULE_DELAY", delay_ms.to_string()));
        env
    }
}

/// The one span that matches.
fn one<'a>(spans: &'a [Span], what: &str, pred: impl Fn(&Span) -> bool) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| pred(s)).collect();
    assert_eq!(found.len(), 1, "one {what}: {spans:#?}");
    found[0]
}

fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.parent == parent.id).collect()
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// The spans as an indented tree (children by start order is not kept: by name), for messages.
fn tree(spans: &[Span]) -> String {
    fn walk(spans: &[Span], parent: &str, depth: usize, out: &mut String) {
        let mut kids: Vec<&Span> = spans.iter().filter(|s| s.parent == parent).collect();
        kids.sort_by(|a, b| a.name.cmp(&b.name));
        for s in kids {
            let extra = ["item_id", "gen_ai.tool.call.id", "attempt"]
                .iter()
                .filter_map(|k| Some(format!(" {k}={}", s.attrs.get(*k)?)))
                .collect::<String>();
            out.push_str(&format!("{}{}{extra}\n", "  ".repeat(depth), s.name));
            walk(spans, &s.id, depth + 1, out);
        }
    }
    let ids: std::collections::HashSet<&str> = spans.iter().map(|s| s.id.as_str()).collect();
    let mut out = String::new();
    let mut roots: Vec<&str> = spans
        .iter()
        .filter(|s| !ids.contains(s.parent.as_str()))
        .map(|s| s.parent.as_str())
        .collect();
    roots.sort_unstable();
    roots.dedup();
    for r in roots {
        out.push_str(&format!(
            "(parent {})\n",
            if r.is_empty() { "none" } else { r }
        ));
        walk(spans, r, 1, &mut out);
    }
    out
}

fn traceparent(trace: &str, span: &str) -> String {
    format!("00-{trace}-{span}-01")
}

/// The GenAI attributes of a model call on the fake model.
fn assert_chat(s: &Span) {
    assert_eq!(s.name, "chat fake-model");
    assert_eq!(s.kind, CLIENT, "{s:?}");
    assert_eq!(s.attrs["gen_ai.operation.name"], "chat", "{s:?}");
    assert_eq!(s.attrs["gen_ai.provider.name"], "openai");
    assert_eq!(s.attrs["gen_ai.system"], "openai");
    assert_eq!(s.attrs["gen_ai.request.model"], "fake-model");
    assert_eq!(
        s.attrs["gen_ai.response.model"],
        fake_openai::openai::ANSWERING_MODEL
    );
    assert_eq!(s.attrs["gen_ai.usage.input_tokens"], 10);
    assert_eq!(s.attrs["gen_ai.usage.output_tokens"], 5);
    let reasons = s.attrs["gen_ai.response.finish_reasons"].as_array();
    assert!(reasons.is_some_and(|r| !r.is_empty()), "{s:?}");
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

async fn a_runs_spans_form_one_tree_in_the_callers_trace(backend: Backend) {
    let collector = Collector::start().await;
    let llm = FakeLlm::start().await;
    let db = crate::helpers::database_url(backend).await;
    // Batches leave every ten minutes: what arrives below was sent by the flush at shutdown.
    let p = Proc::start(&collector.env(&db, &llm, 600_000)).await;
    let r = p
        .client
        .post(p.url("/v1/threads/t/runs/wait"))
        .header("traceparent", traceparent(TRACE, CALLER))
        .json(&json!({"query": "what is 2+2?", "ifNotExists": "create"}))
        .send()
        .await
        .unwrap();
    let (s, run) = crate::helpers::read(r).await;
    assert_eq!((s, &run["status"]), (200, &json!("completed")), "{run}");
    assert!(
        collector.spans().is_empty(),
        "spans are batched, not sent one by one"
    );
    assert!(p.terminate().await.success());
    let spans = collector
        .wait_for(|s| s.iter().any(|x| x.name == "invoke_agent pes"))
        .await;
    // The tree, for the reader of a failure (`--no-capture` shows it).
    println!("{}", tree(&spans));
    assert!(
        spans.iter().all(|s| s.trace == TRACE),
        "one trace: {spans:#?}"
    );
    assert!(spans.iter().all(|s| s.service == "pes-under-test"));
    let http = one(&spans, "request span", |s| {
        s.name == "POST /v1/threads/{threadId}/runs/wait"
    });
    assert_eq!(http.parent, CALLER, "the caller's span is the parent");
    assert_eq!(http.kind, SERVER);
    assert_eq!(http.attrs["http.response.status_code"], 200);
    assert_eq!(http.attrs["http.route"], "/v1/threads/{threadId}/runs/wait");

    let agent = one(&spans, "invoke_agent", |s| s.name == "invoke_agent pes");
    assert_eq!(agent.parent, http.id);
    assert_eq!(agent.attrs["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(agent.attrs["gen_ai.conversation.id"], "t");
    assert_eq!(agent.attrs["attempt"], 1);

    let plan = one(&spans, "plan", |s| s.name == "plan");
    assert_eq!(plan.parent, agent.id);
    let planning = children(&spans, plan);
    assert_eq!(planning.len(), 1, "{planning:#?}");
    assert_chat(planning[0]);

    let items = named(&spans, "item");
    let mut ids: Vec<&str> = items
        .iter()
        .map(|i| i.attrs["item_id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["s1", "s2"]);
    for item in &items {
        assert_eq!(item.parent, agent.id);
        let chats: Vec<_> = children(&spans, item)
            .into_iter()
            .filter(|c| c.name.starts_with("chat "))
            .collect();
        assert!(!chats.is_empty(), "the item asked the model: {item:?}");
        chats.into_iter().for_each(assert_chat);
    }
    let s1 = items.iter().find(|i| i.attrs["item_id"] == "s1").unwrap();
    let tool = one(&spans, "tool call", |s| s.name == "execute_tool calculator");
    assert_eq!(tool.parent, s1.id, "the tool call is under its item");
    assert_eq!(tool.attrs["gen_ai.operation.name"], "execute_tool");
    assert_eq!(tool.attrs["gen_ai.tool.name"], "calculator");
    assert!(
        tool.attrs["gen_ai.tool.call.id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{tool:?}"
    );

    let synth = one(&spans, "synthesize", |s| s.name == "synthesize");
    assert_eq!(synth.parent, agent.id);
    assert_eq!(children(&spans, synth).len(), 1);
    assert_eq!(
        named(&spans, "chat fake-model").len(),
        llm.requests().len(),
        "a span per model call"
    );
}
both_stores!(span_tree, a_runs_spans_form_one_tree_in_the_callers_trace);

async fn suspended_in(p: &Proc, thread: &str, trace: &str, span: &str) -> (String, String) {
    let (s, _) = p
        .post(
            "/v1/threads",
            json!({"threadId": thread, "config": {"requireApproval": ["calculator"]}}),
        )
        .await;
    assert_eq!(s, 201);
    let r = p
        .client
        .post(p.url(&format!("/v1/threads/{thread}/runs/wait")))
        .header("traceparent", traceparent(trace, span))
        .json(&json!({"query": "what is 2+2?"}))
        .send()
        .await
        .unwrap();
    let (_, run) = crate::helpers::read(r).await;
    assert_eq!(run["status"], "suspended", "{run}");
    (
        run["runId"].as_str().unwrap().to_owned(),
        run["suspension"]["suspensionId"]
            .as_str()
            .unwrap()
            .to_owned(),
    )
}

/// The two attempts of a run that suspended once, in `trace`, by attempt.
fn attempts<'a>(spans: &'a [Span], trace: &str) -> Vec<&'a Span> {
    let mut a: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace == trace && s.name == "invoke_agent pes")
        .collect();
    a.sort_by_key(|s| s.attrs["attempt"].as_i64());
    a
}

fn has_tool_call_under(spans: &[Span], root: &Span) -> bool {
    let mut frontier = vec![root.id.clone()];
    while let Some(id) = frontier.pop() {
        for s in spans.iter().filter(|s| s.parent == id) {
            if s.name == "execute_tool calculator" {
                return true;
            }
            frontier.push(s.id.clone());
        }
    }
    false
}

async fn a_resumed_run_continues_its_trace(backend: Backend) {
    let collector = Collector::start().await;
    let llm = FakeLlm::start().await;
    let db = crate::helpers::database_url(backend).await;
    let p = Proc::start(&collector.env(&db, &llm, 50)).await;
    let other = "0af7651916cd43dd8448eb211c80319c";
    let (run_a, sid_a) = suspended_in(&p, "a", TRACE, CALLER).await;
    let (run_b, sid_b) = suspended_in(&p, "b", other, "b7ad6b7169203331").await;
    // `a` is resumed without a trace context: it keeps its own. `b` is resumed by a caller in
    // the same trace (another span of it): the rest of the run is under that call.
    let (s, _) = p
        .post(
            &format!("/v1/suspensions/{sid_a}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202);
    let r = p
        .client
        .post(p.url(&format!("/v1/suspensions/{sid_b}/resume")))
        .header("traceparent", traceparent(other, "c3ce929d0e0e4736"))
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    for (thread, run) in [("a", &run_a), ("b", &run_b)] {
        p.wait_for(&format!("/v1/threads/{thread}/runs/{run}"), |r| {
            r["status"] == "completed"
        })
        .await;
    }
    let spans = collector
        .wait_for(|s| attempts(s, TRACE).len() == 2 && attempts(s, other).len() == 2)
        .await;

    let post_a = one(&spans, "POST of a", |s| {
        s.trace == TRACE && s.name == "POST /v1/threads/{threadId}/runs/wait"
    });
    let a = attempts(&spans, TRACE);
    assert_eq!(a[0].parent, post_a.id);
    assert_eq!(
        a[1].parent, post_a.id,
        "after the resume, the run's own trace"
    );
    assert!(has_tool_call_under(&spans, a[1]), "the approved call ran");
    let resume_a = one(&spans, "resume of a", |s| {
        s.name == "POST /v1/suspensions/{suspensionId}/resume" && s.trace != other
    });
    assert_ne!(
        resume_a.trace, TRACE,
        "a resume without traceparent starts its own trace"
    );

    let b = attempts(&spans, other);
    let post_b = one(&spans, "POST of b", |s| {
        s.trace == other && s.name == "POST /v1/threads/{threadId}/runs/wait"
    });
    assert_eq!(b[0].parent, post_b.id);
    let resume_b = one(&spans, "resume of b", |s| {
        s.trace == other && s.name == "POST /v1/suspensions/{suspensionId}/resume"
    });
    assert_eq!(resume_b.parent, "c3ce929d0e0e4736");
    assert_eq!(
        b[1].parent, resume_b.id,
        "the resumer's call continues the run"
    );
    assert!(has_tool_call_under(&spans, b[1]));
    p.kill9().await;
}
both_stores!(resumed, a_resumed_run_continues_its_trace);

async fn a_run_recovered_after_kill_9_continues_its_trace(backend: Backend) {
    let collector = Collector::start().await;
    let llm = FakeLlm::start().await;
    let db = crate::helpers::database_url(backend).await;
    let mut env = collector.env(&db, &llm, 50);
    env.push(("PES_LEASE_SECONDS", "3".into()));
    env.push(("PES_HEARTBEAT_MS", "200".into()));
    let synthesis = |r: &Value| phase_of(r) == "synthesis";
    llm.slow_once(synthesis, Duration::from_secs(60));
    let p1 = Proc::start(&env).await;
    let r = p1
        .client
        .post(p1.url("/v1/threads/k/runs"))
        .header("traceparent", traceparent(TRACE, CALLER))
        .json(&json!({"query": "what is 2+2?", "ifNotExists": "create"}))
        .send()
        .await
        .unwrap();
    let (s, run) = crate::helpers::read(r).await;
    assert_eq!(s, 202, "{run}");
    llm.wait_for_request(synthesis).await;
    let spans = collector
        .wait_for(|s| {
            s.iter()
                .any(|x| x.name == "POST /v1/threads/{threadId}/runs")
        })
        .await;
    let post = one(&spans, "POST", |s| {
        s.name == "POST /v1/threads/{threadId}/runs"
    })
    .clone();
    assert_eq!((post.trace.as_str(), post.parent.as_str()), (TRACE, CALLER));
    p1.kill9().await;

    let p2 = Proc::start(&env).await;
    let rid = run["runId"].as_str().unwrap();
    let done = p2
        .wait_for(&format!("/v1/threads/k/runs/{rid}"), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["attempt"], 2, "taken over once");
    let spans = collector
        .wait_for(|s| attempts(s, TRACE).iter().any(|a| a.attrs["attempt"] == 2))
        .await;
    let second = one(&spans, "the second attempt", |s| {
        s.name == "invoke_agent pes" && s.attrs["attempt"] == 2
    });
    assert_eq!(second.trace, TRACE);
    assert_eq!(
        second.parent, post.id,
        "the recovered attempt continues the request's trace"
    );
    let synth = one(&spans, "synthesize", |s| {
        s.name == "synthesize" && s.parent == second.id
    });
    assert_eq!(children(&spans, synth).len(), 1);
    let metrics = p2
        .client
        .get(p2.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let page = crate::prom::parse(&metrics);
    assert_eq!(
        page.value("pes_lease_takeovers_total", &[]),
        1.0,
        "{metrics}"
    );
    p2.kill9().await;
}
both_stores!(recovered, a_run_recovered_after_kill_9_continues_its_trace);

/// A collector that takes connections and never answers: runs go at their usual pace (spans
/// leave from the SDK's own thread), and a SIGTERM still ends the process, its last export cut
/// off by the export timeout.
async fn a_stalled_collector_never_slows_a_run(backend: Backend) {
    let stalled = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", stalled.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = stalled.accept().await {
            open.push(socket);
        }
    });
    let llm = FakeLlm::start().await;
    let db = crate::helpers::database_url(backend).await;
    let mut env = env_for(&db, &llm.url);
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", url));
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "10".into()));
    env.push(("OTEL_EXPORTER_OTLP_TIMEOUT", "1000".into()));
    let p = Proc::start(&env).await;
    let started = tokio::time::Instant::now();
    for i in 0..3 {
        let (s, run) = p
            .post(
                &format!("/v1/threads/s{i}/runs/wait"),
                json!({"query": "what is 2+2?", "ifNotExists": "create"}),
            )
            .await;
        assert_eq!((s, &run["status"]), (200, &json!("completed")), "{run}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "three runs took {:?}",
        started.elapsed()
    );
    let stopping = tokio::time::Instant::now();
    assert!(p.terminate().await.success());
    assert!(
        stopping.elapsed() < Duration::from_secs(15),
        "shutdown waited {:?} for the collector",
        stopping.elapsed()
    );
    held.abort();
}
both_stores!(stalled_collector, a_stalled_collector_never_slows_a_run);
