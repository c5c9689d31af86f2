//! Unit tests of the engine with doubles: no database, no HTTP. An in-memory [`Journal`] applies
//! each committed [`Batch`] to a model of the run's rows (the way the stores do) and can be told
//! to fail one commit, which is a simulated crash: the test then rebuilds a [`RunInput`] from what
//! was committed and drives again, as a worker that re-claims the run would. A scripted
//! [`LlmProvider`] answers by phase and by the item its brief names, and can hold every request
//! until the engine has sent all it can, so a test sees how many items it has in flight at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore};

use super::changes::{AgentSnapshot, Batch, Op};
use super::prompts::labels;
use super::{Engine, EngineError, EngineSettings, Journal, RunEnd, RunInput, Signals};
use crate::llm::{ChatRequest, ChatResponse, LlmError, LlmProvider, Phase, Role, ToolCall};
use crate::model::{
    AgentConfig, AgentRole, AgentStateRow, ItemStatus, Message, MultitaskStrategy, Observation,
    ObservationType, ResumeDecision, Run, RunPhase, RunStatus, Suspension, SuspensionStatus,
    Thread, ThreadId, ThreadStatus, TodoItem, ToolResultStatus, Usage, new_id,
};
use crate::tools::{Tool, ToolContext, ToolError, ToolRegistry};

/// No test here waits on anything slow: a drive that takes longer is stuck (waiting for a reply
/// that never comes, say), and fails with this deadline instead of hanging.
const STUCK: Duration = Duration::from_secs(20);

// ----- the in-memory journal ---------------------------------------------------------------------

/// What the store holds for the one thread and run under test, changed only by committed batches
/// (and by the test, for what happens outside the engine: a claim, a person's decision).
struct Rows {
    thread: Thread,
    run: Run,
    state: AgentStateRow,
    /// In plan order (by `position`), as the store's snapshot returns them.
    items: Vec<TodoItem>,
    suspensions: Vec<Suspension>,
    messages: Vec<Message>,
    /// With their `seq`: 1, 2, 3… in commit order.
    observations: Vec<Observation>,
}

impl Rows {
    /// Apply one batch as the stores do (see `store::sqlite::apply`).
    fn apply(&mut self, batch: Batch) {
        let now = Utc::now();
        for op in batch.ops {
            match op {
                Op::SetAgentState(s) => {
                    let version = self.state.version + 1;
                    self.state = s;
                    self.state.version = version;
                }
                Op::UpsertItem(item) => {
                    match self.items.iter_mut().find(|i| i.id == item.id) {
                        Some(slot) => *slot = *item,
                        None => self.items.push(*item),
                    }
                    self.items.sort_by_key(|i| i.position);
                }
                Op::DeleteItem(id) => self.items.retain(|i| i.id != id),
                Op::AppendMessage(m) => self.messages.push(m),
                Op::InsertSuspension(s) => self.suspensions.push(*s),
                Op::CancelSuspensions => {
                    let run = self.run.run_id;
                    for s in self.suspensions.iter_mut() {
                        if s.run_id == run && s.status == SuspensionStatus::Pending {
                            s.status = SuspensionStatus::Cancelled;
                            s.resolved_at = Some(now);
                        }
                    }
                }
                Op::UpdateRun(u) => {
                    if let Some(status) = u.status {
                        // A decision that came while the run was busy queues it again instead
                        // of leaving it suspended (`RunUpdate::unless_decided`).
                        let decided = status == RunStatus::Suspended
                            && u.unless_decided.iter().any(|id| {
                                self.suspensions.iter().any(|s| {
                                    s.suspension_id == *id && s.status != SuspensionStatus::Pending
                                })
                            });
                        self.run.status = if decided { RunStatus::Queued } else { status };
                    }
                    if let Some(p) = u.phase {
                        self.run.phase = p;
                    }
                    if let Some(usage) = u.usage {
                        self.run.usage = usage;
                    }
                    if u.error.is_some() {
                        self.run.error = u.error;
                    }
                    if u.final_response.is_some() {
                        self.run.final_response = u.final_response;
                    }
                    if u.ended {
                        self.run.ended_at = Some(now);
                    }
                }
            }
        }
        for o in batch.observations {
            let seq = self.observations.len() as i64 + 1;
            self.observations.push(Observation {
                id: o.id,
                seq,
                thread_id: self.thread.thread_id.clone(),
                tenant: self.thread.tenant.clone(),
                run_id: o.run_id,
                parent_id: o.parent_id,
                kind: o.kind,
                title: o.title,
                content: o.content,
                created_at: now,
            });
        }
    }
}

/// How a commit told to fail fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    /// Another worker took the run.
    LeaseLost,
    /// The store went away.
    Store,
}

/// The [`Journal`] double: commits apply to [`Rows`], unless this is the commit told to fail.
struct MemJournal {
    rows: Arc<Mutex<Rows>>,
    /// Commits attempted so far (failed ones included).
    attempts: AtomicUsize,
    /// Commits that went through.
    committed: AtomicUsize,
    /// The attempt number that fails, and how.
    fail_at: Mutex<Option<(usize, Crash)>>,
}

#[async_trait]
impl Journal for MemJournal {
    async fn commit(&self, batch: Batch) -> Result<(), EngineError> {
        let n = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        let crash = {
            let mut fail = self.fail_at.lock().unwrap();
            match *fail {
                Some((at, crash)) if at == n => {
                    *fail = None;
                    Some(crash)
                }
                _ => None,
            }
        };
        match crash {
            Some(Crash::LeaseLost) => return Err(EngineError::LeaseLost),
            Some(Crash::Store) => {
                return Err(EngineError::Store(anyhow::anyhow!("injected crash")));
            }
            None => {}
        }
        let mut rows = self.rows.lock().unwrap();
        // The store fences every write on a running run: nothing commits after the run ended or
        // suspended (until it is claimed again).
        if rows.run.status != RunStatus::Running {
            return Err(EngineError::LeaseLost);
        }
        rows.apply(batch);
        self.committed.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl MemJournal {
    fn new(config: AgentConfig, query: &str) -> Self {
        let now = Utc::now();
        let thread_id = ThreadId::parse("t").unwrap();
        let thread = Thread {
            thread_id: thread_id.clone(),
            tenant: "default".into(),
            status: ThreadStatus::Busy,
            metadata: json!({}),
            config,
            assistant_id: None,
            assistant_version: None,
            created_at: now,
            updated_at: now,
        };
        let run = Run {
            run_id: new_id(),
            thread_id,
            tenant: "default".into(),
            status: RunStatus::Queued,
            kind: crate::model::RunKind::Agent,
            query: query.into(),
            config: AgentConfig::default(),
            assistant: None,
            multitask_strategy: MultitaskStrategy::Enqueue,
            idempotency_key: None,
            created_at: now,
            started_at: None,
            ended_at: None,
            usage: Usage::default(),
            error: None,
            final_response: None,
            suspension: None,
            attempt: 0,
            cron_id: None,
            phase: RunPhase::New,
            cancel_requested: false,
            start_seq: 0,
            trace_context: None,
            flowchart: None,
        };
        Self {
            rows: Arc::new(Mutex::new(Rows {
                thread,
                run,
                state: AgentStateRow::default(),
                items: vec![],
                suspensions: vec![],
                messages: vec![],
                observations: vec![],
            })),
            attempts: AtomicUsize::new(0),
            committed: AtomicUsize::new(0),
            fail_at: Mutex::new(None),
        }
    }

    /// Fail the `n`-th commit from now (1 = the next one).
    fn fail_nth(&self, n: usize, crash: Crash) {
        let at = self.attempts.load(Ordering::SeqCst) + n;
        *self.fail_at.lock().unwrap() = Some((at, crash));
    }

    /// Claim the run as a worker does and load what it drives from, from committed rows only.
    fn claim(&self) -> RunInput {
        let mut rows = self.rows.lock().unwrap();
        assert!(
            matches!(rows.run.status, RunStatus::Queued | RunStatus::Running),
            "only a queued run, or a running one whose worker died, is claimed; this one is {}",
            rows.run.status
        );
        rows.run.status = RunStatus::Running;
        rows.run.attempt += 1;
        rows.run.started_at.get_or_insert_with(Utc::now);
        let run_id = rows.run.run_id;
        RunInput {
            run: rows.run.clone(),
            thread: rows.thread.clone(),
            snapshot: AgentSnapshot {
                state: rows.state.clone(),
                items: rows.items.clone(),
                pending_suspension: rows
                    .suspensions
                    .iter()
                    .find(|s| s.status == SuspensionStatus::Pending)
                    .cloned(),
            },
            history: rows
                .messages
                .iter()
                .filter(|m| m.run_id != Some(run_id) && m.item_id.is_none())
                .cloned()
                .collect(),
            suspensions: rows.suspensions.clone(),
            own_messages: rows
                .messages
                .iter()
                .filter(|m| m.run_id == Some(run_id) && m.item_id.is_none())
                .cloned()
                .collect(),
        }
    }

    /// A person decides on the item's pending suspension; the run goes back to the queue (what
    /// `SqlStore::resolve_suspension` does).
    fn resolve(&self, item: &str, decision: ResumeDecision) {
        let mut rows = self.rows.lock().unwrap();
        let s = rows
            .suspensions
            .iter_mut()
            .find(|s| s.item_id.as_str() == item && s.status == SuspensionStatus::Pending)
            .unwrap_or_else(|| panic!("no pending suspension for `{item}`"));
        s.status = SuspensionStatus::Resolved;
        s.decision = Some(decision);
        s.resolved_at = Some(Utc::now());
        if rows.run.status == RunStatus::Suspended {
            rows.run.status = RunStatus::Queued;
        }
    }

    fn run(&self) -> Run {
        self.rows.lock().unwrap().run.clone()
    }

    fn item(&self, id: &str) -> TodoItem {
        self.rows
            .lock()
            .unwrap()
            .items
            .iter()
            .find(|i| i.id.as_str() == id)
            .cloned()
            .unwrap_or_else(|| panic!("no item `{id}`"))
    }

    fn items(&self) -> Vec<TodoItem> {
        self.rows.lock().unwrap().items.clone()
    }

    fn suspensions(&self) -> Vec<Suspension> {
        self.rows.lock().unwrap().suspensions.clone()
    }

    /// Contents of the committed observations of one type, in `seq` order.
    fn logged(&self, kind: ObservationType) -> Vec<Value> {
        self.rows
            .lock()
            .unwrap()
            .observations
            .iter()
            .filter(|o| o.kind == kind)
            .map(|o| o.content.clone())
            .collect()
    }

    /// Item results by id.
    fn results(&self) -> BTreeMap<String, Option<String>> {
        self.items()
            .into_iter()
            .map(|i| (i.id.to_string(), i.result))
            .collect()
    }
}

// ----- the scripted model ------------------------------------------------------------------------

/// What the script sees of one request.
struct Ask<'a> {
    phase: Phase,
    /// The item the request is for: from the brief's `Your item [<id>]` line, or a compaction's
    /// `Result of item [<id>]`.
    item: Option<String>,
    req: &'a ChatRequest,
    /// The request's number (0, 1, …): fresh tool-call ids, as a real model makes.
    n: u64,
}

impl Ask<'_> {
    /// The tool messages of the item's conversation so far.
    fn tool_results(&self) -> Vec<&str> {
        self.req
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .map(|m| m.content.as_deref().unwrap_or(""))
            .collect()
    }
}

/// The names of the tools a request offers.
fn offered(req: &ChatRequest) -> Vec<&str> {
    req.tools.iter().map(|t| t.name.as_str()).collect()
}

type Script = dyn Fn(&Ask<'_>) -> ChatResponse + Send + Sync;

/// Requests wait at a gate that opens only once the engine is parked: everything it can send
/// at that moment has been sent, so the requests waiting are all that it has in flight.
struct Hold {
    gate: Semaphore,
    /// Requests waiting at the gate.
    waiting: AtomicUsize,
    arrived: Notify,
    /// The most requests ever waiting together.
    max_waiting: AtomicUsize,
}

/// One request as the model got it, in arrival order.
#[derive(Clone)]
struct Seen {
    phase: Phase,
    item: Option<String>,
    req: ChatRequest,
}

/// The scripted [`LlmProvider`]: the script picks each reply; requests are recorded.
struct Scripted {
    script: Box<Script>,
    hold: Option<Hold>,
    n: AtomicU64,
    seen: Mutex<Vec<Seen>>,
    /// `(true, item)` when an Execute request arrives, `(false, item)` when it is answered.
    execute_log: Mutex<Vec<(bool, String)>>,
}

impl Scripted {
    fn new(script: impl Fn(&Ask<'_>) -> ChatResponse + Send + Sync + 'static) -> Self {
        Self {
            script: Box::new(script),
            hold: None,
            n: AtomicU64::new(0),
            seen: Mutex::new(vec![]),
            execute_log: Mutex::new(vec![]),
        }
    }

    /// Hold every request until the engine is parked (see [`Hold`], [`Scripted::open_gate`]).
    fn holding(mut self) -> Self {
        self.hold = Some(Hold {
            gate: Semaphore::new(0),
            waiting: AtomicUsize::new(0),
            arrived: Notify::new(),
            max_waiting: AtomicUsize::new(0),
        });
        self
    }

    /// Each time the engine is parked, note how many requests wait and let them all through.
    /// Polled in the engine's own task after it (see [`Harness::drive`]): it runs only once the
    /// engine has nothing more to do without a reply.
    async fn open_gate(&self) {
        let Some(h) = &self.hold else {
            return std::future::pending::<()>().await;
        };
        loop {
            h.arrived.notified().await;
            let n = h.waiting.swap(0, Ordering::SeqCst);
            h.max_waiting.fetch_max(n, Ordering::SeqCst);
            h.gate.add_permits(n);
        }
    }

    /// The most requests that were in flight together while the engine waited for replies.
    fn max_concurrent(&self) -> usize {
        self.hold
            .as_ref()
            .expect("a holding model")
            .max_waiting
            .load(Ordering::SeqCst)
    }

    fn seen(&self, phase: Phase) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.phase == phase)
            .cloned()
            .collect()
    }

    /// The Execute requests of one item.
    fn asked(&self, item: &str) -> Vec<ChatRequest> {
        self.seen(Phase::Execute)
            .into_iter()
            .filter(|s| s.item.as_deref() == Some(item))
            .map(|s| s.req)
            .collect()
    }
}

#[async_trait]
impl LlmProvider for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }

    async fn complete(&self, req: ChatRequest) -> Result<ChatResponse, LlmError> {
        let n = self.n.fetch_add(1, Ordering::SeqCst);
        let item = item_of(&req);
        self.seen.lock().unwrap().push(Seen {
            phase: req.phase,
            item: item.clone(),
            req: req.clone(),
        });
        let executing = req.phase == Phase::Execute;
        let label = item.clone().unwrap_or_default();
        if executing {
            self.execute_log.lock().unwrap().push((true, label.clone()));
        }
        if let Some(h) = &self.hold {
            h.waiting.fetch_add(1, Ordering::SeqCst);
            h.arrived.notify_one();
            h.gate.acquire().await.expect("never closed").forget();
        }
        let mut resp = (self.script)(&Ask {
            phase: req.phase,
            item,
            req: &req,
            n,
        });
        resp.usage = Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
            total_tokens: 15,
            llm_calls: 1,
            ..Default::default()
        };
        if executing {
            self.execute_log.lock().unwrap().push((false, label));
        }
        Ok(resp)
    }
}

/// The item a request is for, read from the labelled lines of its user messages.
fn item_of(req: &ChatRequest) -> Option<String> {
    req.messages
        .iter()
        .filter(|m| m.role == Role::User)
        .filter_map(|m| m.content.as_deref())
        .flat_map(str::lines)
        .find_map(|line| {
            let rest = line
                .strip_prefix(labels::ITEM)
                .or_else(|| line.strip_prefix(labels::TO_COMPACT))?;
            Some(rest.split(']').next()?.to_owned())
        })
}

fn text(s: impl Into<String>) -> ChatResponse {
    ChatResponse {
        content: Some(s.into()),
        ..ChatResponse::default()
    }
}

fn call(n: u64, name: &str, arguments: Value) -> ChatResponse {
    ChatResponse {
        tool_calls: vec![ToolCall {
            id: format!("call_{n}"),
            name: name.into(),
            arguments,
        }],
        ..ChatResponse::default()
    }
}

/// A `pes_plan` reply.
fn plan(items: Vec<Value>) -> ChatResponse {
    text(
        json!({"title": "Test", "intent": "test", "plan": "the test plan", "todoList": items})
            .to_string(),
    )
}

/// One planned item with every field the schema requires.
fn item(id: &str, step_type: &str, deps: &[&str]) -> Value {
    json!({
        "id": id, "description": format!("do {id}"), "stepType": step_type,
        "requiredTools": [], "expectedOutcome": "", "dependencies": deps,
        "kind": null, "role": null, "toolAllowlist": null,
    })
}

fn synthesis() -> ChatResponse {
    text(json!({"response": "final answer", "sources": [], "suggestions": []}).to_string())
}

// ----- a tool with side effects that counts its runs ---------------------------------------------

/// One run of [`Effect`].
#[derive(Debug, Clone)]
struct Invocation {
    key: String,
    /// Its result was already committed when it ran: a second run of a call that had finished.
    result_committed: bool,
}

/// `effect {x}` → `{done: x}`: a tool with side effects that records every run with its
/// idempotency key, and whether that call's result was already in the journal.
struct Effect {
    rows: Arc<Mutex<Rows>>,
    runs: Arc<Mutex<Vec<Invocation>>>,
}

#[async_trait]
impl Tool for Effect {
    fn name(&self) -> &str {
        "effect"
    }
    fn description(&self) -> &str {
        "does something outside the service"
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"x": {"type": "integer"}},
               "required": ["x"], "additionalProperties": false})
    }
    fn side_effects(&self) -> bool {
        true
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let call_id = ctx
            .idempotency_key
            .split_once(':')
            .map(|(_, c)| c.to_owned())
            .unwrap_or_default();
        let result_committed = self.rows.lock().unwrap().observations.iter().any(|o| {
            o.kind == ObservationType::ToolExecution && o.content["toolCallId"] == call_id.as_str()
        });
        self.runs.lock().unwrap().push(Invocation {
            key: ctx.idempotency_key.clone(),
            result_committed,
        });
        Ok(json!({"done": args["x"]}))
    }
}

// ----- the harness -------------------------------------------------------------------------------

struct Harness {
    engine: Engine,
    journal: MemJournal,
    llm: Arc<Scripted>,
    effect_runs: Arc<Mutex<Vec<Invocation>>>,
}

impl Harness {
    /// An engine with the built-in tools and `effect`, the scripted model, and a fresh journal.
    fn new(config: AgentConfig, llm: Scripted) -> Self {
        let journal = MemJournal::new(config, "the user's query");
        let effect_runs = Arc::new(Mutex::new(vec![]));
        let tools = ToolRegistry::with_builtins();
        tools.register(Arc::new(Effect {
            rows: journal.rows.clone(),
            runs: effect_runs.clone(),
        }));
        let llm = Arc::new(llm);
        let mut providers: HashMap<String, Arc<dyn LlmProvider>> = HashMap::new();
        providers.insert("scripted".into(), llm.clone());
        let engine = Engine::new(
            providers,
            tools,
            EngineSettings {
                default_provider: "scripted".into(),
                ..EngineSettings::default()
            },
        );
        Self {
            engine,
            journal,
            llm,
            effect_runs,
        }
    }

    /// Claim the run and drive it from what is committed, as a worker does.
    async fn drive(&self) -> Result<RunEnd, EngineError> {
        let input = self.journal.claim();
        let signals = Signals::default();
        let drive = async {
            // One task: the gate is polled only after the engine, when the engine is parked.
            tokio::select! {
                biased;
                end = self.engine.drive(input, &self.journal, &signals) => end,
                () = self.llm.open_gate() => unreachable!("the gate never closes"),
            }
        };
        tokio::time::timeout(STUCK, drive)
            .await
            .expect("the drive is stuck")
    }

    fn effect_runs(&self) -> Vec<Invocation> {
        self.effect_runs.lock().unwrap().clone()
    }
}

/// A crashed drive may leave a tool it started running in its own task (as a real process keeps
/// running a tool whose run it lost); let such tasks finish before the next drive.
async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

// ----- 1. parallel scheduling --------------------------------------------------------------------

/// Four independent reasoning items `a`..`d` and `e`, which needs all four; each answers at once.
fn fan_in_model() -> Scripted {
    Scripted::new(|ask| match ask.phase {
        Phase::Plan => plan(vec![
            item("a", "reasoning", &[]),
            item("b", "reasoning", &[]),
            item("c", "reasoning", &[]),
            item("d", "reasoning", &[]),
            item("e", "reasoning", &["a", "b", "c", "d"]),
        ]),
        Phase::Execute => text(format!("result of {}", ask.item.as_deref().unwrap_or("?"))),
        _ => synthesis(),
    })
}

async fn fan_in(limit: u32) -> Harness {
    let h = Harness::new(
        AgentConfig {
            max_parallel_items: Some(limit),
            ..AgentConfig::default()
        },
        fan_in_model().holding(),
    );
    assert_eq!(h.drive().await.unwrap(), RunEnd::Completed);
    h
}

#[tokio::test]
async fn ready_items_run_together_up_to_max_parallel_items() {
    let h = fan_in(2).await;
    assert_eq!(h.llm.max_concurrent(), 2);

    let h = fan_in(4).await;
    assert_eq!(h.llm.max_concurrent(), 4);
    let log = h.llm.execute_log.lock().unwrap().clone();
    let e_asked = log
        .iter()
        .position(|(start, i)| *start && i == "e")
        .expect("e ran");
    for dep in ["a", "b", "c", "d"] {
        let answered = log
            .iter()
            .position(|(start, i)| !*start && i == dep)
            .unwrap_or_else(|| panic!("{dep} ran"));
        assert!(
            answered < e_asked,
            "{dep} finished before e started: {log:?}"
        );
    }
    // The dependent reads every result it depends on.
    let brief = h.llm.asked("e")[0].messages[1].content.clone().unwrap();
    for dep in ["a", "b", "c", "d"] {
        assert!(
            brief.contains(&format!("[{dep}] do {dep}: result of {dep}")),
            "{brief}"
        );
    }
    assert_eq!(h.journal.run().status, RunStatus::Completed);
}

#[tokio::test]
async fn one_parallel_item_at_a_time_when_the_limit_is_one() {
    let h = Harness::new(
        AgentConfig {
            max_parallel_items: Some(1),
            ..AgentConfig::default()
        },
        fan_in_model().holding(),
    );
    assert_eq!(h.drive().await.unwrap(), RunEnd::Completed);
    assert_eq!(h.llm.max_concurrent(), 1);
    let order: Vec<String> = h
        .llm
        .seen(Phase::Execute)
        .into_iter()
        .filter_map(|s| s.item)
        .collect();
    assert_eq!(order, ["a", "b", "c", "d", "e"], "plan order");
}

// ----- 2. failure propagation --------------------------------------------------------------------

#[tokio::test]
async fn a_failed_item_cancels_its_dependents_and_independent_items_go_on() {
    let h = Harness::new(
        AgentConfig {
            max_iterations: Some(2),
            ..AgentConfig::default()
        },
        Scripted::new(|ask| match ask.phase {
            Phase::Plan => plan(vec![
                item("bad", "tool", &[]),
                item("dep1", "reasoning", &["bad"]),
                item("dep2", "reasoning", &["dep1"]),
                item("ok", "reasoning", &[]),
            ]),
            // `bad` never answers: every turn is another tool call.
            Phase::Execute if ask.item.as_deref() == Some("bad") => {
                call(ask.n, "calculator", json!({"expression": "1+1"}))
            }
            Phase::Execute => text("fine"),
            _ => synthesis(),
        }),
    );
    assert_eq!(h.drive().await.unwrap(), RunEnd::Completed);

    let bad = h.journal.item("bad");
    assert_eq!(bad.status, ItemStatus::Failed);
    assert_eq!(bad.error.unwrap().code, "max_iterations_exceeded");
    assert_eq!(h.llm.asked("bad").len(), 2, "maxIterations model calls");
    for id in ["dep1", "dep2"] {
        let it = h.journal.item(id);
        assert_eq!(it.status, ItemStatus::Cancelled, "{id}");
        let err = it.error.unwrap();
        assert_eq!(err.code, "dependency_failed", "{id}");
        assert!(
            err.message.contains("`bad` failed"),
            "{id}: {}",
            err.message
        );
        assert!(h.llm.asked(id).is_empty(), "{id} never ran");
    }
    assert_eq!(h.journal.item("ok").status, ItemStatus::Completed);
    assert_eq!(h.journal.item("ok").result.as_deref(), Some("fine"));

    let errors = h.journal.logged(ObservationType::Error);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["itemId"], "bad");
    // The synthesis is told what failed and what was cancelled.
    let synth = h.llm.seen(Phase::Synthesize);
    let brief = synth[0].req.messages[1].content.clone().unwrap();
    assert!(brief.contains("- [bad] do bad: FAILED ("), "{brief}");
    assert!(brief.contains("- [dep1] do dep1: CANCELLED ("), "{brief}");
    assert!(brief.contains("- [dep2] do dep2: CANCELLED ("), "{brief}");
    assert!(brief.contains("- [ok] do ok: fine"), "{brief}");
    assert_eq!(h.journal.run().status, RunStatus::Completed);
}

// ----- 3. compaction -----------------------------------------------------------------------------

#[tokio::test]
async fn a_long_result_is_compacted_and_dependents_read_the_summary() {
    const LONG: &str = "long fact ";
    let h = Harness::new(
        AgentConfig {
            compaction_threshold_chars: Some(100),
            ..AgentConfig::default()
        },
        Scripted::new(|ask| match (ask.phase, ask.item.as_deref()) {
            (Phase::Plan, _) => plan(vec![
                item("long", "reasoning", &[]),
                item("short", "reasoning", &[]),
                item("reader", "reasoning", &["long", "short"]),
            ]),
            (Phase::Execute, Some("long")) => text(LONG.repeat(50)),
            (Phase::Execute, Some("short")) => text("short fact"),
            (Phase::Execute, _) => text("read"),
            (Phase::Compact, _) => text(json!({"summary": "the gist of long"}).to_string()),
            _ => synthesis(),
        }),
    );
    assert_eq!(h.drive().await.unwrap(), RunEnd::Completed);

    let compactions = h.llm.seen(Phase::Compact);
    assert_eq!(compactions.len(), 1, "only the long result is compacted");
    assert_eq!(compactions[0].item.as_deref(), Some("long"));
    let logged = h.journal.logged(ObservationType::Compaction);
    assert_eq!(
        logged,
        [json!({"itemId": "long", "summary": "the gist of long",
                "inputChars": 500, "outputChars": 16})]
    );
    assert_eq!(
        h.journal.item("long").compacted_output.as_deref(),
        Some("the gist of long")
    );
    assert_eq!(
        h.journal.item("long").result,
        Some(LONG.repeat(50)),
        "the item keeps its whole result"
    );
    assert_eq!(
        h.journal.item("short").compacted_output.as_deref(),
        Some("short fact")
    );

    let brief = h.llm.asked("reader")[0].messages[1]
        .content
        .clone()
        .unwrap();
    assert!(
        brief.contains("[long] do long: the gist of long"),
        "{brief}"
    );
    assert!(brief.contains("[short] do short: short fact"), "{brief}");
    assert!(
        !brief.contains(LONG),
        "the reader never sees the long text: {brief}"
    );
    let synth = h.llm.seen(Phase::Synthesize)[0].req.messages[1]
        .content
        .clone()
        .unwrap();
    assert!(
        synth.contains("the gist of long") && !synth.contains(LONG),
        "{synth}"
    );
}

// ----- 4. roles ----------------------------------------------------------------------------------

#[tokio::test]
async fn roles_are_repaired_put_in_the_brief_and_narrow_the_tools() {
    let roles = BTreeMap::from([(
        "analyst".to_owned(),
        AgentRole {
            name: "Analyst".into(),
            system_prompt_fragment: "You are careful with numbers.".into(),
            tools: Some(vec!["calculator".into()]),
        },
    )]);
    let plans = AtomicUsize::new(0);
    let h = Harness::new(
        AgentConfig {
            roles: Some(roles),
            ..AgentConfig::default()
        },
        Scripted::new(move |ask| match (ask.phase, ask.item.as_deref()) {
            (Phase::Plan, _) => {
                let role = if plans.fetch_add(1, Ordering::SeqCst) == 0 {
                    "ghost"
                } else {
                    "analyst"
                };
                let mut calc = item("calc", "tool", &[]);
                calc["role"] = json!(role);
                calc["requiredTools"] = json!(["calculator"]);
                let mut clock = item("clock", "tool", &[]);
                clock["toolAllowlist"] = json!(["current_time"]);
                plan(vec![calc, clock])
            }
            (Phase::Execute, Some("calc")) => match ask.tool_results().len() {
                // First a tool the role does not allow, then the one it does.
                0 => call(ask.n, "current_time", json!({})),
                1 => call(ask.n, "calculator", json!({"expression": "6*7"})),
                _ => text(format!("computed {}", ask.tool_results()[1])),
            },
            (Phase::Execute, _) => text("no tools needed"),
            _ => synthesis(),
        }),
    );
    assert_eq!(h.drive().await.unwrap(), RunEnd::Completed);

    let plans = h.llm.seen(Phase::Plan);
    assert_eq!(plans.len(), 2, "one repair request");
    let system = plans[0].req.messages[0].content.clone().unwrap();
    assert!(
        system.contains("- analyst: Analyst, You are careful with numbers. (tools: calculator)"),
        "the planner sees the roles: {system}"
    );
    let repair = plans[1]
        .req
        .messages
        .last()
        .unwrap()
        .content
        .clone()
        .unwrap();
    assert!(
        repair.contains("item `calc` has unknown role `ghost` (roles: analyst)"),
        "{repair}"
    );

    let asked = h.llm.asked("calc");
    let brief = asked[0].messages[1].content.clone().unwrap();
    let role_at = brief
        .find("Role: Analyst\nYou are careful with numbers.\n")
        .unwrap_or_else(|| panic!("the role's fragment is in the brief: {brief}"));
    assert!(role_at < brief.find("Your item [calc]").unwrap(), "{brief}");
    assert_eq!(
        offered(&asked[0]),
        ["calculator", "update_plan"],
        "the role's tools only"
    );

    let calc = h.journal.item("calc");
    assert_eq!(calc.role.as_deref(), Some("analyst"));
    assert_eq!(calc.tool_results[0].status, ToolResultStatus::Error);
    assert_eq!(
        calc.tool_results[0].error.as_deref(),
        Some("tool `current_time` is not available for this item")
    );
    assert_eq!(calc.tool_results[1].status, ToolResultStatus::Success);
    assert_eq!(calc.status, ItemStatus::Completed);
    assert!(calc.result.unwrap().contains("42"));

    let clock = h.llm.asked("clock");
    let brief = clock[0].messages[1].content.clone().unwrap();
    assert!(
        !brief.contains(labels::ROLE),
        "no role, no role line: {brief}"
    );
    assert_eq!(
        offered(&clock[0]),
        ["current_time", "update_plan"],
        "toolAllowlist"
    );
}

// ----- 5. resume after a crash at each commit point ----------------------------------------------

/// Two parallel items, each calling the side-effect tool once and answering with its output.
fn two_effects() -> Scripted {
    Scripted::new(|ask| match (ask.phase, ask.item.as_deref()) {
        (Phase::Plan, _) => {
            let mut a = item("a", "tool", &[]);
            a["requiredTools"] = json!(["effect"]);
            let mut b = item("b", "tool", &[]);
            b["requiredTools"] = json!(["effect"]);
            plan(vec![a, b])
        }
        (Phase::Execute, Some(id)) => match ask.tool_results().first() {
            None => call(ask.n, "effect", json!({"x": if id == "a" { 1 } else { 2 }})),
            Some(out) => text(format!("{id} saw {out}")),
        },
        _ => synthesis(),
    })
}

#[tokio::test]
async fn a_run_resumed_after_a_crash_at_any_commit_ends_as_a_clean_run_does() {
    let clean = Harness::new(AgentConfig::default(), two_effects());
    assert_eq!(clean.drive().await.unwrap(), RunEnd::Completed);
    let commits = clean.journal.committed.load(Ordering::SeqCst);
    let results = clean.journal.results();
    assert_eq!(
        results,
        BTreeMap::from([
            ("a".to_owned(), Some(r#"a saw {"done":1}"#.to_owned())),
            ("b".to_owned(), Some(r#"b saw {"done":2}"#.to_owned())),
        ])
    );
    assert!(commits >= 4, "{commits} commits");

    for k in 1..=commits {
        let crash = if k % 2 == 0 {
            Crash::Store
        } else {
            Crash::LeaseLost
        };
        let h = Harness::new(AgentConfig::default(), two_effects());
        h.journal.fail_nth(k, crash);
        let first = h.drive().await;
        match (crash, &first) {
            (Crash::LeaseLost, Err(EngineError::LeaseLost))
            | (Crash::Store, Err(EngineError::Store(_))) => {}
            _ => panic!("crash at commit {k}: the drive stops with it, got {first:?}"),
        }
        settle().await;
        assert_eq!(
            h.drive().await.unwrap(),
            RunEnd::Completed,
            "crash at commit {k}"
        );

        let run = h.journal.run();
        assert_eq!(run.status, RunStatus::Completed, "crash at commit {k}");
        assert_eq!(h.journal.results(), results, "crash at commit {k}");
        assert_eq!(
            run.final_response,
            clean.journal.run().final_response,
            "crash at commit {k}"
        );
        // Nothing that was committed happened twice.
        for (kind, n) in [
            (ObservationType::RunStarted, 1),
            (ObservationType::Plan, 1),
            (ObservationType::ToolCall, 2),
            (ObservationType::ToolExecution, 2),
            (ObservationType::RunCompleted, 1),
        ] {
            assert_eq!(
                h.journal.logged(kind).len(),
                n,
                "crash at commit {k}: {kind}"
            );
        }
        // A side effect ran only for a call whose turn was committed, never again once its result
        // was, and under the committed call's key.
        let committed_calls: Vec<String> = h
            .journal
            .logged(ObservationType::ToolCall)
            .iter()
            .map(|c| format!("{}:{}", run.run_id, c["toolCallId"].as_str().unwrap()))
            .collect();
        let runs = h.effect_runs();
        assert!(!runs.is_empty());
        for r in &runs {
            assert!(
                !r.result_committed,
                "crash at commit {k}: {} ran again after its result was committed: {runs:?}",
                r.key
            );
            assert!(
                committed_calls.contains(&r.key),
                "crash at commit {k}: {} ran for a call that was never committed: {runs:?}",
                r.key
            );
        }
        for key in &committed_calls {
            assert!(
                runs.iter().any(|r| &r.key == key),
                "crash at commit {k}: {key} never ran"
            );
        }
    }
}

// ----- 6. suspensions ----------------------------------------------------------------------------

#[tokio::test]
async fn two_items_waiting_for_approval_suspend_the_run_once_and_resume_one_by_one() {
    let h = Harness::new(
        AgentConfig {
            require_approval: Some(vec!["effect".into()]),
            ..AgentConfig::default()
        },
        two_effects(),
    );
    assert_eq!(h.drive().await.unwrap(), RunEnd::Suspended);
    let pending: Vec<Suspension> = h.journal.suspensions();
    assert_eq!(pending.len(), 2);
    assert!(
        pending
            .iter()
            .all(|s| s.status == SuspensionStatus::Pending)
    );
    let suspended = h.journal.logged(ObservationType::RunSuspended);
    assert_eq!(suspended.len(), 1);
    let mut ids: Vec<String> = pending
        .iter()
        .map(|s| s.suspension_id.to_string())
        .collect();
    let mut listed: Vec<String> = suspended[0]["suspensionIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    listed.sort();
    assert_eq!(listed, ids);
    assert_eq!(h.journal.run().status, RunStatus::Suspended);
    assert_eq!(h.journal.item("a").status, ItemStatus::Waiting);
    assert_eq!(h.journal.item("b").status, ItemStatus::Waiting);
    assert!(h.effect_runs().is_empty(), "nothing ran without approval");

    // Approve `a`: it runs and completes; `b` still waits, and the run suspends again.
    h.journal.resolve(
        "a",
        ResumeDecision::Approve {
            reason: None,
            raise_by: None,
        },
    );
    assert_eq!(h.drive().await.unwrap(), RunEnd::Suspended);
    let a = h.journal.item("a");
    assert_eq!(a.status, ItemStatus::Completed);
    assert_eq!(a.result.as_deref(), Some(r#"a saw {"done":1}"#));
    assert_eq!(h.journal.item("b").status, ItemStatus::Waiting);
    let a_call = &pending.iter().find(|s| s.item_id.as_str() == "a").unwrap();
    let runs = h.effect_runs();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        runs[0].key,
        format!("{}:{}", h.journal.run().run_id, a_call.tool_call.id)
    );
    assert_eq!(h.journal.suspensions().len(), 2, "b is not asked again");
    assert_eq!(h.journal.logged(ObservationType::AgentSuspended).len(), 2);
    let suspended = h.journal.logged(ObservationType::RunSuspended);
    assert_eq!(suspended.len(), 2);
    let b_call = pending.iter().find(|s| s.item_id.as_str() == "b").unwrap();
    assert_eq!(
        suspended[1]["suspensionIds"],
        json!([b_call.suspension_id.to_string()])
    );

    // Reject `b`: the run completes without running it.
    h.journal.resolve(
        "b",
        ResumeDecision::Reject {
            reason: Some("not now".into()),
        },
    );
    assert_eq!(h.drive().await.unwrap(), RunEnd::Completed);
    let b = h.journal.item("b");
    assert_eq!(b.status, ItemStatus::Completed);
    assert_eq!(b.tool_results[0].status, ToolResultStatus::Rejected);
    assert_eq!(h.effect_runs().len(), 1, "a rejected call never runs");
    assert_eq!(h.journal.run().status, RunStatus::Completed);
}

// ----- teams (kind `team`) -----------------------------------------------------------------------

/// `t` is a team (planned into `a` and `b`, which needs `a`); `x` needs the team. A team's
/// planning request is told from the run's by its `sub-goal [t]` line.
fn team_model() -> Scripted {
    Scripted::new(|ask| {
        let team_request = ask.req.messages.iter().any(|m| {
            m.content
                .as_deref()
                .is_some_and(|c| c.contains("sub-goal [t]"))
        });
        match ask.phase {
            Phase::Plan if team_request => plan(vec![
                item("a", "reasoning", &[]),
                item("b", "reasoning", &["a"]),
            ]),
            Phase::Plan => {
                let mut team = item("t", "reasoning", &[]);
                team["kind"] = json!("team");
                plan(vec![team, item("x", "reasoning", &["t"])])
            }
            Phase::Execute => text(format!("result of {}", ask.item.as_deref().unwrap_or("?"))),
            _ => synthesis(),
        }
    })
}

#[tokio::test]
async fn a_team_is_planned_when_ready_and_resumes_after_a_crash_at_any_commit() {
    let clean = Harness::new(AgentConfig::default(), team_model());
    assert_eq!(clean.drive().await.unwrap(), RunEnd::Completed);
    let results = clean.journal.results();
    for id in ["t.a", "t.b", "x"] {
        assert_eq!(
            results.get(id).cloned().flatten().as_deref(),
            Some(format!("result of {id}").as_str()),
            "{results:?}"
        );
    }
    let team_result = results["t"].clone().unwrap();
    assert!(
        team_result.contains("[t.a]") && team_result.contains("[t.b]"),
        "{team_result}"
    );
    // The team's child `b` read its sibling `a`, and `x` read the team's output.
    let b_brief = clean.llm.asked("t.b")[0].messages[1]
        .content
        .clone()
        .unwrap();
    assert!(b_brief.contains("[t.a] do a: result of t.a"), "{b_brief}");
    let x_brief = clean.llm.asked("x")[0].messages[1].content.clone().unwrap();
    assert!(x_brief.contains("[t] do t:"), "{x_brief}");
    let plans = clean.journal.logged(ObservationType::Plan);
    assert_eq!(plans.len(), 2);
    assert_eq!(plans[1]["teamId"], "t");
    let commits = clean.journal.committed.load(Ordering::SeqCst);

    for k in 1..=commits {
        let h = Harness::new(AgentConfig::default(), team_model());
        h.journal.fail_nth(k, Crash::LeaseLost);
        assert!(h.drive().await.is_err(), "crash at commit {k}");
        settle().await;
        assert_eq!(
            h.drive().await.unwrap(),
            RunEnd::Completed,
            "crash at commit {k}"
        );
        assert_eq!(h.journal.results(), results, "crash at commit {k}");
        assert_eq!(
            h.journal.logged(ObservationType::Plan).len(),
            2,
            "crash at commit {k}: the team is planned once its plan is committed"
        );
    }
}
