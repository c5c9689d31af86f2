//! A tool call with side effects never runs again under a new idempotency key.
//!
//! The engine starts such a tool only once the model turn that names it is committed, so when a
//! later commit fails (the store went away) the re-claimed run finds the very same call (same
//! `toolCallId`, same key `runId:toolCallId`) instead of asking the model again. Pure tools keep
//! the fast path: their turn is committed with their result in one write.
//!
//! Two levels: the engine driven directly with a journal whose commit fails once (both stores),
//! and real processes on Postgres behind a TCP proxy that the test cuts while runs are in flight.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pes_server::agent::{Engine, EngineError, EngineSettings, Journal, RunEnd, RunInput, Signals};
use pes_server::llm::{ChatRequest, ChatResponse, LlmError, LlmProvider, Phase, Role, ToolCall};
use pes_server::model::{AgentConfig, MultitaskStrategy, ObservationType, ThreadId, Usage};
use pes_server::store::{Batch, Fence, NewRun, ObservationQuery, SqlStore, StoreError};
use pes_server::tools::{Tool, ToolContext, ToolError, ToolRegistry};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use crate::fake_llm::{FakeLlm, plan};
use crate::process::{Proc, env_for};

const LEASE: Duration = Duration::from_secs(30);
const TENANT: &str = "default";

// ----- the engine with a journal that fails once ------------------------------------------------

/// A model that plans one tool item, calls `tool` (with a fresh call id every time it is asked,
/// as a real model does), answers once it has the tool's result, and synthesizes.
struct Model {
    tool: &'static str,
    calls: AtomicU64,
}

#[async_trait]
impl LlmProvider for Model {
    fn name(&self) -> &'static str {
        "scripted"
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let usage = Usage {
            llm_calls: 1,
            ..Usage::default()
        };
        let text = |v: Value| ChatResponse {
            content: Some(v.to_string()),
            usage,
            ..ChatResponse::default()
        };
        Ok(match request.phase {
            Phase::Plan => text(json!({
                "title": "t", "intent": "i", "plan": "p",
                "todoList": [{"id": "x", "description": "use the tool", "stepType": "tool",
                              "requiredTools": [self.tool], "expectedOutcome": "",
                              "dependencies": [], "kind": null, "role": null,
                              "toolAllowlist": null}],
            })),
            Phase::Execute
                if request
                    .messages
                    .last()
                    .is_some_and(|m| m.role == Role::Tool) =>
            {
                ChatResponse {
                    content: Some("done".into()),
                    usage,
                    ..ChatResponse::default()
                }
            }
            Phase::Execute => ChatResponse {
                tool_calls: vec![ToolCall {
                    id: format!("call_{n}"),
                    name: self.tool.into(),
                    arguments: json!({}),
                }],
                usage,
                ..ChatResponse::default()
            },
            _ => text(json!({"response": "ok", "sources": [], "suggestions": []})),
        })
    }
}

/// A tool that records the idempotency key of every invocation.
struct Recorder {
    name: &'static str,
    side_effects: bool,
    keys: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl Tool for Recorder {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "records its calls"
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    fn side_effects(&self) -> bool {
        self.side_effects
    }
    async fn call(&self, _args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        self.keys.lock().unwrap().push(ctx.idempotency_key.clone());
        Ok(json!({"ok": true}))
    }
}

/// Which commit the journal fails (once).
#[derive(Clone, Copy, PartialEq, Eq)]
enum FailOn {
    /// The first commit that holds a `TOOL_CALL` (the model's tool-call turn).
    Turn,
    /// The first commit that holds a `TOOL_EXECUTION` (the tool's result).
    Result,
}

/// The worker's journal (the store, fenced) with one injected failure.
struct FlakyJournal {
    store: Arc<SqlStore>,
    fence: Fence,
    fail: Mutex<Option<FailOn>>,
    keys: Arc<Mutex<Vec<String>>>,
    /// Tool invocations made before the failing commit was attempted.
    runs_at_failure: Mutex<Option<usize>>,
    /// The observation types of each commit that went through.
    commits: Mutex<Vec<Vec<ObservationType>>>,
}

#[async_trait]
impl Journal for FlakyJournal {
    async fn commit(&self, batch: Batch) -> Result<(), EngineError> {
        let kinds: Vec<ObservationType> = batch.observations.iter().map(|o| o.kind).collect();
        {
            let mut fail = self.fail.lock().unwrap();
            let hit = match *fail {
                Some(FailOn::Turn) => kinds.contains(&ObservationType::ToolCall),
                Some(FailOn::Result) => kinds.contains(&ObservationType::ToolExecution),
                None => false,
            };
            if hit {
                *fail = None;
                *self.runs_at_failure.lock().unwrap() = Some(self.keys.lock().unwrap().len());
                return Err(EngineError::Store(anyhow::anyhow!(
                    "injected: the store went away"
                )));
            }
        }
        self.commits.lock().unwrap().push(kinds);
        match self.store.apply(self.fence, LEASE, batch).await {
            Ok(_) => Ok(()),
            Err(StoreError::LeaseLost) => Err(EngineError::LeaseLost),
            Err(e) => Err(EngineError::Store(e.into())),
        }
    }
}

struct Harness {
    store: Arc<SqlStore>,
    engine: Engine,
    keys: Arc<Mutex<Vec<String>>>,
    thread: ThreadId,
}

impl Harness {
    fn new(store: Arc<SqlStore>, side_effects: bool) -> Harness {
        let keys = Arc::new(Mutex::new(Vec::new()));
        let tools = ToolRegistry::new();
        tools.register(Arc::new(Recorder {
            name: "effect",
            side_effects,
            keys: keys.clone(),
        }));
        let mut providers: HashMap<String, Arc<dyn LlmProvider>> = HashMap::new();
        providers.insert(
            "scripted".into(),
            Arc::new(Model {
                tool: "effect",
                calls: AtomicU64::new(0),
            }),
        );
        let engine = Engine::new(
            providers,
            tools,
            EngineSettings {
                default_provider: "scripted".into(),
                ..EngineSettings::default()
            },
        );
        Harness {
            store,
            engine,
            keys,
            thread: ThreadId::parse("t").unwrap(),
        }
    }

    async fn enqueue(&self) {
        self.store
            .create_run(NewRun {
                tenant: TENANT.into(),
                thread_id: self.thread.clone(),
                query: "use the tool".into(),
                config: AgentConfig::default(),
                strategy: MultitaskStrategy::Enqueue,
                idempotency_key: None,
                create_thread: true,
                trace_context: None,
                assistant: None,
                cron_id: None,
                flowchart: None,
            })
            .await
            .unwrap();
    }

    /// Claim the run and drive it once (as a worker does), failing the commit `fail` names.
    async fn drive(&self, fail: Option<FailOn>) -> (Result<RunEnd, EngineError>, FlakyJournal) {
        let run = self
            .store
            .claim_run("test", LEASE)
            .await
            .unwrap()
            .expect("a runnable run");
        let fence = Fence {
            run_id: run.run_id,
            attempt: run.attempt,
        };
        let input = RunInput {
            thread: self
                .store
                .get_thread(TENANT, &self.thread)
                .await
                .unwrap()
                .unwrap(),
            snapshot: self
                .store
                .agent_snapshot(TENANT, &self.thread)
                .await
                .unwrap()
                .unwrap(),
            history: vec![],
            own_messages: vec![],
            suspensions: self
                .store
                .list_suspensions(TENANT, &self.thread, true)
                .await
                .unwrap()
                .unwrap(),
            run,
        };
        let journal = FlakyJournal {
            store: self.store.clone(),
            fence,
            fail: Mutex::new(fail),
            keys: self.keys.clone(),
            runs_at_failure: Mutex::new(None),
            commits: Mutex::new(Vec::new()),
        };
        let end = self
            .engine
            .drive(input, &journal, &Signals::default())
            .await;
        if end.is_err() {
            // What a worker does when the run stops without ending: it gives the run back (or its
            // lease expires), and the next claim resumes from what was committed.
            let _ = self.store.release_run(fence).await;
        }
        (end, journal)
    }

    fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }

    async fn logged(&self, kind: ObservationType) -> Vec<Value> {
        self.store
            .list_observations(
                TENANT,
                &self.thread,
                &ObservationQuery {
                    types: Some(vec![kind]),
                    ..ObservationQuery::default()
                },
            )
            .await
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|o| o.content)
            .collect()
    }
}

async fn a_failed_commit_after_the_model_named_a_tool_call_means_the_tool_never_ran(
    store: Arc<SqlStore>,
) {
    let h = Harness::new(store, true);
    h.enqueue().await;
    let (end, journal) = h.drive(Some(FailOn::Turn)).await;
    assert!(matches!(end, Err(EngineError::Store(_))), "{end:?}");
    assert_eq!(
        *journal.runs_at_failure.lock().unwrap(),
        Some(0),
        "the tool had not started when its tool-call turn failed to commit"
    );
    assert!(h.keys().is_empty(), "{:?}", h.keys());

    let (end, _) = h.drive(None).await;
    assert_eq!(end.unwrap(), RunEnd::Completed);
    let calls = h.logged(ObservationType::ToolCall).await;
    assert_eq!(calls.len(), 1, "only the committed turn is in the log");
    let run = h
        .store
        .list_runs(TENANT, &h.thread, 0, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        h.keys(),
        [format!(
            "{}:{}",
            run[0].run_id,
            calls[0]["toolCallId"].as_str().unwrap()
        )],
        "the tool ran once, for the call in the log"
    );
}

async fn a_failed_result_commit_repeats_the_call_under_the_same_key(store: Arc<SqlStore>) {
    let h = Harness::new(store, true);
    h.enqueue().await;
    let (end, journal) = h.drive(Some(FailOn::Result)).await;
    assert!(matches!(end, Err(EngineError::Store(_))), "{end:?}");
    assert_eq!(*journal.runs_at_failure.lock().unwrap(), Some(1));
    // The tool-call turn was committed before the tool started, on its own.
    let first = journal.commits.lock().unwrap().clone();
    let turn = first
        .iter()
        .find(|k| k.contains(&ObservationType::ToolCall))
        .expect("the turn was committed");
    assert!(!turn.contains(&ObservationType::ToolExecution), "{first:?}");

    let (end, _) = h.drive(None).await;
    assert_eq!(end.unwrap(), RunEnd::Completed);
    let calls = h.logged(ObservationType::ToolCall).await;
    assert_eq!(
        calls.len(),
        1,
        "the model was not asked to name the call again"
    );
    let keys = h.keys();
    assert_eq!(
        keys.len(),
        2,
        "the call whose result was lost ran again: {keys:?}"
    );
    assert_eq!(keys[0], keys[1], "…under the same idempotency key");
    assert!(keys[0].ends_with(&format!(":{}", calls[0]["toolCallId"].as_str().unwrap())));
    assert_eq!(h.logged(ObservationType::ToolExecution).await.len(), 1);
}

async fn a_pure_tool_call_commits_its_turn_with_its_result(store: Arc<SqlStore>) {
    let h = Harness::new(store, false);
    h.enqueue().await;
    let (end, journal) = h.drive(None).await;
    assert_eq!(end.unwrap(), RunEnd::Completed);
    let commits = journal.commits.lock().unwrap().clone();
    let with_call: Vec<_> = commits
        .iter()
        .filter(|k| k.contains(&ObservationType::ToolCall))
        .collect();
    assert_eq!(with_call.len(), 1, "{commits:?}");
    assert!(
        with_call[0].contains(&ObservationType::ToolExecution),
        "one write for the turn and the result of a pure tool: {commits:?}"
    );
    assert_eq!(h.keys().len(), 1);
}

crate::conformance!(
    a_failed_commit_after_the_model_named_a_tool_call_means_the_tool_never_ran,
    a_failed_result_commit_repeats_the_call_under_the_same_key,
    a_pure_tool_call_commits_its_turn_with_its_result,
);

// ----- real processes and a Postgres outage -----------------------------------------------------

/// A TCP proxy in front of Postgres that the test can cut: every proxied connection closed and
/// new ones refused until it is restored. The Postgres server itself is never touched.
struct Proxy {
    addr: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ProxyState {
    down: bool,
    conns: Vec<AbortHandle>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if st.lock().unwrap().down {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                let mut s = st.lock().unwrap();
                s.conns.retain(|c| !c.is_finished());
                s.conns.push(task.abort_handle());
            }
        });
        Proxy {
            addr,
            state,
            accept,
        }
    }

    /// Close every proxied connection and refuse new ones.
    fn cut(&self) {
        let mut s = self.state.lock().unwrap();
        s.down = true;
        for c in s.conns.drain(..) {
            c.abort();
        }
    }

    fn restore(&self) {
        self.state.lock().unwrap().down = false;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// `debug_sleep` invocations from its log: (run id, tag) → the keys it ran under, in order.
fn invocations(log: &Path) -> HashMap<(String, String), Vec<String>> {
    let mut out: HashMap<(String, String), Vec<String>> = HashMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let (tag, key) = line.split_once(' ').expect("`tag key` lines");
        let run = key.split(':').next().unwrap().to_owned();
        out.entry((run, tag.to_owned()))
            .or_default()
            .push(key.to_owned());
    }
    out
}

fn temp_log() -> PathBuf {
    std::env::temp_dir().join(format!("pes-outage-{}.log", uuid::Uuid::now_v7().simple()))
}

/// GET through `p`, or None while the service cannot answer (its database is cut off).
async fn try_get(p: &Proc, path: &str) -> Option<Value> {
    let r = p.client.get(p.url(path)).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

const ITEMS: [&str; 4] = ["a", "b", "c", "d"];
const RUNS_PER_ROUND: usize = 8;
const MAX_ROUNDS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_never_repeats_a_tool_call_under_a_new_key() {
    let db = crate::helpers::database_url(crate::helpers::Backend::Postgres).await;
    let mut url = reqwest::Url::parse(&db).unwrap();
    let upstream = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432));
    let proxy = Proxy::start(upstream).await;
    url.set_host(Some("127.0.0.1")).unwrap();
    url.set_port(Some(proxy.addr.port())).unwrap();

    let llm = FakeLlm::start().await;
    // Every run plans four items, each one short `debug_sleep` call (tagged with the item id).
    let items: Vec<(String, String)> = ITEMS
        .iter()
        .map(|id| (id.to_string(), format!("sleep {id}")))
        .collect();
    let planned: Vec<(&str, &str, &[&str], &[&str])> = items
        .iter()
        .map(|(id, d)| (id.as_str(), d.as_str(), &["debug_sleep"][..], &[][..]))
        .collect();
    llm.set_default("plan", plan(&planned));
    let log = temp_log();
    let mut env = env_for(url.as_str(), &llm.url);
    env.extend([
        ("PES_DEBUG_TOOLS", "true".to_owned()),
        ("PES_DEBUG_TOOL_LOG", log.display().to_string()),
        ("PES_LEASE_SECONDS", "1".to_owned()),
        ("PES_HEARTBEAT_MS", "200".to_owned()),
        ("PES_STREAM_POLL_MS", "200".to_owned()),
    ]);
    let p = Proc::start(&env).await;

    let mut threads: Vec<(String, String)> = Vec::new();
    let mut rounds_that_hit = 0;
    for round in 0..MAX_ROUNDS {
        let before: usize = invocations(&log).values().map(Vec::len).sum();
        for i in 0..RUNS_PER_ROUND {
            let t = format!("r{round}-{i}");
            let (s, run) = p
                .post(
                    &format!("/v1/threads/{t}/runs"),
                    json!({"query": "sleep", "ifNotExists": "create"}),
                )
                .await;
            assert_eq!(s, 202, "{run}");
            threads.push((t, run["runId"].as_str().unwrap().to_owned()));
        }
        // Cut the database off once tools are running.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while invocations(&log).values().map(Vec::len).sum::<usize>() < before + 2 {
            assert!(tokio::time::Instant::now() < deadline, "no tool ever ran");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        proxy.cut();
        // The outage lasts 3 s (this sleep is the outage, not a wait for a condition).
        tokio::time::sleep(Duration::from_secs(3)).await;
        proxy.restore();

        // Every run of the round completes.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        for (t, run) in &threads[round * RUNS_PER_ROUND..] {
            loop {
                let r = try_get(&p, &format!("/v1/threads/{t}/runs/{run}")).await;
                if r.as_ref().is_some_and(|r| r["status"] == "completed") {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "run {run} on {t} never completed after the outage: {r:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // Did the outage catch a tool call between its start and the commit of its result?
        let round_runs: HashSet<&str> = threads[round * RUNS_PER_ROUND..]
            .iter()
            .map(|(_, r)| r.as_str())
            .collect();
        let repeated = invocations(&log)
            .iter()
            .filter(|((run, _), keys)| round_runs.contains(run.as_str()) && keys.len() > 1)
            .count();
        if repeated > 0 {
            rounds_that_hit += 1;
            break;
        }
    }
    assert!(
        rounds_that_hit > 0,
        "no outage caught a tool call in flight in {MAX_ROUNDS} rounds: the test proved nothing"
    );

    // Each logical call (run, item) ran once, or again only under the same key.
    let calls = invocations(&log);
    for ((run, tag), keys) in &calls {
        let distinct: HashSet<&String> = keys.iter().collect();
        assert_eq!(
            distinct.len(),
            1,
            "run {run}, item {tag} ran under different keys: {keys:?}"
        );
    }
    for (t, run) in &threads {
        for item in ITEMS {
            assert!(
                calls.contains_key(&(run.clone(), item.to_owned())),
                "run {run} item {item} never ran its tool"
            );
        }
        let (_, page) = p
            .get(&format!("/v1/threads/{t}/observations?limit=1000"))
            .await;
        let obs = page["items"].as_array().unwrap();
        let seqs: Vec<i64> = obs.iter().map(|o| o["seq"].as_i64().unwrap()).collect();
        assert_eq!(
            seqs,
            (1..=obs.len() as i64).collect::<Vec<_>>(),
            "{t}: gap-free"
        );
        let executed: Vec<&Value> = obs
            .iter()
            .filter(|o| o["type"] == "TOOL_EXECUTION")
            .collect();
        assert_eq!(executed.len(), ITEMS.len(), "{t}: one result per item");
        // The history's tool messages were committed with the results they report.
        let (_, msgs) = p.get(&format!("/v1/threads/{t}/messages?limit=200")).await;
        let tool_msgs = msgs["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .count();
        assert_eq!(tool_msgs, ITEMS.len(), "{t}: {msgs}");
    }
    p.kill9().await;
    drop(proxy);
    let _ = std::fs::remove_file(&log);
}
