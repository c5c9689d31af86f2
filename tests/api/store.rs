//! Store conformance suite: every case is written once against `Arc<SqlStore>` and runs on
//! Postgres and on SQLite (modules `postgres` and `sqlite` below), each on a fresh database.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{SubsecRound, Utc};
use pes_server::model::{
    AgentConfig, AgentStateRow, ConversationMessage, Decision, ErrorInfo, ItemId, ItemKind,
    ItemStatus, Message, MessageRole, MultitaskStrategy, NewObservation, ObservationType,
    ResumeDecision, Run, RunPhase, RunStatus, StepType, Suspension, SuspensionKind,
    SuspensionStatus, Thread, ThreadId, ThreadStatus, TodoItem, ToolCallRecord, ToolResultRecord,
    ToolResultStatus, ToolValidationMode, Usage, ValidationStatus, new_id,
};
use pes_server::store::{
    Backlog, Batch, Fence, NewRun, ObservationQuery, Op, PageCursor, Resolution, RunFilter,
    RunUpdate, SqlStore, StoreError, ThreadPatch,
};
use serde_json::json;
use tokio::time::Instant;
use uuid::Uuid;

type S = Arc<SqlStore>;

const LEASE: Duration = Duration::from_secs(30);
const A: &str = "tenant-a";
const B: &str = "tenant-b";

// ----- helpers ---------------------------------------------------------------------------------

fn tid(s: &str) -> ThreadId {
    ThreadId::parse(s).unwrap()
}

fn iid(s: &str) -> ItemId {
    ItemId::parse(s).unwrap()
}

fn now() -> chrono::DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

async fn thread(store: &S, tenant: &str, id: &str) -> Thread {
    store
        .create_thread(tenant, &tid(id), json!({}), AgentConfig::default())
        .await
        .unwrap()
}

fn new_run(tenant: &str, thread: &str, query: &str) -> NewRun {
    NewRun {
        tenant: tenant.into(),
        thread_id: tid(thread),
        query: query.into(),
        config: AgentConfig::default(),
        strategy: MultitaskStrategy::Enqueue,
        idempotency_key: None,
        create_thread: true,
        trace_context: None,
        assistant: None,
        cron_id: None,
        flowchart: None,
    }
}

async fn enqueue(store: &S, tenant: &str, thread: &str) -> Run {
    store
        .create_run(new_run(tenant, thread, "q"))
        .await
        .unwrap()
        .run
}

fn fence(run: &Run) -> Fence {
    Fence {
        run_id: run.run_id,
        attempt: run.attempt,
    }
}

async fn claim(store: &S) -> Run {
    store
        .claim_run("worker-1", LEASE)
        .await
        .unwrap()
        .expect("a run to claim")
}

/// Enqueue a run on `thread` (creating the thread) and claim it.
async fn running(store: &S, tenant: &str, thread: &str) -> (Run, Fence) {
    let queued = enqueue(store, tenant, thread).await;
    let run = claim(store).await;
    assert_eq!(run.run_id, queued.run_id);
    let f = fence(&run);
    (run, f)
}

fn obs(run_id: Uuid, kind: ObservationType, parent: Option<&str>) -> NewObservation {
    NewObservation::new(
        run_id,
        parent.map(str::to_owned),
        kind,
        kind.as_str().to_lowercase(),
        json!({ "kind": kind.as_str() }),
    )
}

fn batch(tenant: &str, thread: &str) -> Batch {
    Batch::new(tenant, tid(thread))
}

async fn apply(store: &S, f: Fence, b: Batch) -> pes_server::store::Applied {
    store.apply(f, LEASE, b).await.unwrap()
}

fn item(id: &str, position: i64, run_id: Uuid) -> TodoItem {
    let t = now();
    TodoItem {
        id: iid(id),
        position,
        description: format!("do {id}"),
        status: ItemStatus::Pending,
        dependencies: vec![],
        step_type: StepType::Tool,
        required_tools: vec!["calculator".into()],
        tool_validation_mode: ToolValidationMode::Strict,
        validation_status: ValidationStatus::Pending,
        expected_outcome: Some("a number".into()),
        tool_calls: vec![],
        actual_tool_calls: vec![],
        tool_results: vec![],
        thoughts: vec![],
        result: None,
        error: None,
        attempts: 0,
        usage: Usage::default(),
        conversation: vec![],
        run_id: Some(run_id),
        created_at: t,
        updated_at: t,
        started_at: None,
        completed_at: None,
        kind: ItemKind::Leaf,
        parent_item_id: None,
        role: None,
        tool_allowlist: None,
        compacted_output: None,
    }
}

fn message(thread: &str, run_id: Uuid, role: MessageRole, content: &str) -> Message {
    Message {
        id: new_id(),
        thread_id: tid(thread),
        run_id: Some(run_id),
        role,
        content: content.into(),
        item_id: None,
        tool_call_id: None,
        name: None,
        tool_calls: vec![],
        created_at: now(),
    }
}

fn suspension(tenant: &str, thread: &str, run_id: Uuid, item: &str) -> Suspension {
    Suspension {
        suspension_id: new_id(),
        thread_id: tid(thread),
        tenant: tenant.into(),
        run_id,
        item_id: iid(item),
        kind: SuspensionKind::Approval,
        tool_call: ToolCallRecord {
            id: "call-1".into(),
            name: "calculator".into(),
            arguments: json!({ "expression": "1+1" }),
        },
        allowed_decisions: vec![
            Decision::Approve,
            Decision::Edit,
            Decision::Reject,
            Decision::Respond,
        ],
        question: None,
        input_schema: Some(json!({ "type": "object" })),
        iteration_state: json!([{ "role": "user", "content": "hi" }]),
        partial_tool_results: vec![ToolResultRecord {
            tool_call_id: "call-0".into(),
            name: "current_time".into(),
            status: ToolResultStatus::Success,
            output: json!("12:00"),
            error: None,
        }],
        status: SuspensionStatus::Pending,
        decision: None,
        created_at: now(),
        resolved_at: None,
        expires_at: Some(now() + chrono::Duration::hours(1)),
    }
}

/// Suspend the fenced run on `item` with a pending suspension; returns the suspension.
async fn suspend(store: &S, tenant: &str, thread: &str, f: Fence) -> Suspension {
    let s = suspension(tenant, thread, f.run_id, "step-1");
    suspend_on(store, tenant, thread, f, s).await
}

/// Suspend the fenced run with a suspension expiring at `expires_at`.
async fn suspend_until(
    store: &S,
    tenant: &str,
    thread: &str,
    f: Fence,
    expires_at: Option<chrono::DateTime<Utc>>,
) -> Suspension {
    let mut s = suspension(tenant, thread, f.run_id, "step-1");
    s.expires_at = expires_at;
    suspend_on(store, tenant, thread, f, s).await
}

/// Suspend the fenced run with the given pending suspension.
async fn suspend_on(store: &S, tenant: &str, thread: &str, f: Fence, s: Suspension) -> Suspension {
    let mut b = batch(tenant, thread);
    b.op(Op::InsertSuspension(Box::new(s.clone())))
        .op(Op::UpdateRun(RunUpdate {
            status: Some(RunStatus::Suspended),
            ..Default::default()
        }))
        .observe(obs(
            f.run_id,
            ObservationType::AgentSuspended,
            Some("step-1"),
        ));
    apply(store, f, b).await;
    s
}

async fn finish(store: &S, tenant: &str, thread: &str, f: Fence, status: RunStatus) {
    let mut b = batch(tenant, thread);
    b.op(Op::UpdateRun(RunUpdate {
        status: Some(status),
        ended: true,
        ..Default::default()
    }));
    apply(store, f, b).await;
}

async fn observations(
    store: &S,
    tenant: &str,
    thread: &str,
) -> Vec<pes_server::model::Observation> {
    store
        .list_observations(tenant, &tid(thread), &ObservationQuery::default())
        .await
        .unwrap()
        .expect("thread exists")
}

async fn status_of(store: &S, tenant: &str, thread: &str) -> ThreadStatus {
    store
        .get_thread(tenant, &tid(thread))
        .await
        .unwrap()
        .expect("thread exists")
        .status
}

fn seqs(list: &[pes_server::model::Observation]) -> Vec<i64> {
    list.iter().map(|o| o.seq).collect()
}

// ----- threads ---------------------------------------------------------------------------------

async fn thread_round_trips_through_create_get_update_delete(store: S) {
    let config = AgentConfig {
        model: Some("m".into()),
        max_iterations: Some(3),
        ..Default::default()
    };
    let created = store
        .create_thread(A, &tid("t1"), json!({ "owner": "ann" }), config.clone())
        .await
        .unwrap();
    assert_eq!(created.thread_id, tid("t1"));
    assert_eq!(created.tenant, A);
    assert_eq!(created.status, ThreadStatus::Idle);
    assert_eq!(created.metadata, json!({ "owner": "ann" }));
    assert_eq!(created.config, config);

    let got = store.get_thread(A, &tid("t1")).await.unwrap().unwrap();
    assert_eq!(got, created);

    let patched = store
        .update_thread(
            A,
            &tid("t1"),
            ThreadPatch {
                metadata: Some(json!({ "owner": "bob" })),
                config: None,
                assistant: None,
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(patched.metadata, json!({ "owner": "bob" }));
    assert_eq!(patched.config, config, "an absent field is left as it is");
    assert!(patched.updated_at >= created.updated_at);
    assert_eq!(patched.created_at, created.created_at);

    let new_config = AgentConfig {
        model: Some("other".into()),
        ..Default::default()
    };
    let patched = store
        .update_thread(
            A,
            &tid("t1"),
            ThreadPatch {
                metadata: None,
                config: Some(new_config.clone()),
                assistant: None,
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(patched.config, new_config);
    assert_eq!(patched.metadata, json!({ "owner": "bob" }));
    assert_eq!(
        store.get_thread(A, &tid("t1")).await.unwrap().unwrap(),
        patched
    );

    assert!(
        store
            .update_thread(A, &tid("nope"), ThreadPatch::default())
            .await
            .unwrap()
            .is_none()
    );
    assert!(store.delete_thread(A, &tid("t1")).await.unwrap());
    assert!(store.get_thread(A, &tid("t1")).await.unwrap().is_none());
    assert!(!store.delete_thread(A, &tid("t1")).await.unwrap());
}

async fn duplicate_thread_id_is_rejected(store: S) {
    thread(&store, A, "dup").await;
    let err = store
        .create_thread(A, &tid("dup"), json!({ "x": 1 }), AgentConfig::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::ThreadExists), "{err:?}");
    // The first thread is untouched and has its agent state.
    let t = store.get_thread(A, &tid("dup")).await.unwrap().unwrap();
    assert_eq!(t.metadata, json!({}));
    let snap = store.agent_snapshot(A, &tid("dup")).await.unwrap().unwrap();
    assert_eq!(snap.state.version, 0);
    assert!(snap.items.is_empty());
}

async fn threads_of_one_tenant_are_invisible_to_another(store: S) {
    store
        .create_thread(
            A,
            &tid("shared"),
            json!({ "of": "a" }),
            AgentConfig::default(),
        )
        .await
        .unwrap();
    let run_a = enqueue(&store, A, "shared").await;
    let t = tid("shared");

    assert!(store.get_thread(B, &t).await.unwrap().is_none());
    assert!(store.list_threads(B, 10, None).await.unwrap().is_empty());
    assert!(
        store
            .update_thread(B, &t, ThreadPatch::default())
            .await
            .unwrap()
            .is_none()
    );
    assert!(store.agent_snapshot(B, &t).await.unwrap().is_none());
    assert!(store.list_runs(B, &t, 10, None).await.unwrap().is_none());
    assert!(
        store
            .list_messages(B, &t, 10, None)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .list_observations(B, &t, &ObservationQuery::default())
            .await
            .unwrap()
            .is_none()
    );
    assert!(store.list_suspensions(B, &t, true).await.unwrap().is_none());
    assert!(store.get_run(B, &t, run_a.run_id).await.unwrap().is_none());
    let err = store.cancel_run(B, &t, run_a.run_id).await.unwrap_err();
    assert!(matches!(err, StoreError::RunNotFound), "{err:?}");
    let mut nr = new_run(B, "shared", "q");
    nr.create_thread = false;
    let err = store.create_run(nr).await.unwrap_err();
    assert!(matches!(err, StoreError::ThreadNotFound), "{err:?}");
    assert!(!store.delete_thread(B, &t).await.unwrap());

    // B may use the same id; the two threads stay apart.
    store
        .create_thread(B, &t, json!({ "of": "b" }), AgentConfig::default())
        .await
        .unwrap();
    assert_eq!(
        store.get_thread(A, &t).await.unwrap().unwrap().metadata,
        json!({ "of": "a" })
    );
    assert_eq!(
        store.get_thread(B, &t).await.unwrap().unwrap().metadata,
        json!({ "of": "b" })
    );
    assert_eq!(
        store.get_thread(A, &t).await.unwrap().unwrap().status,
        ThreadStatus::Busy
    );
    assert_eq!(
        store.get_thread(B, &t).await.unwrap().unwrap().status,
        ThreadStatus::Idle
    );
    assert!(
        store
            .list_runs(B, &t, 10, None)
            .await
            .unwrap()
            .unwrap()
            .is_empty()
    );
    assert!(store.delete_thread(B, &t).await.unwrap());
    assert!(store.get_thread(A, &t).await.unwrap().is_some());
}

async fn threads_list_newest_first_with_a_cursor(store: S) {
    for i in 1..=5 {
        thread(&store, A, &format!("t{i}")).await;
    }
    thread(&store, B, "other").await;
    let all = store.list_threads(A, 0, None).await.unwrap();
    let ids: Vec<&str> = all.iter().map(|t| t.thread.thread_id.as_str()).collect();
    assert_eq!(ids, ["t5", "t4", "t3", "t2", "t1"]);

    let mut pages = Vec::new();
    let mut cursor: Option<PageCursor> = None;
    loop {
        let page = store.list_threads(A, 2, cursor.as_ref()).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 2);
        let last = page.last().unwrap();
        cursor = Some(PageCursor {
            created_at: last.thread.created_at,
            id: last.thread.thread_id.to_string(),
        });
        pages.push(
            page.iter()
                .map(|t| t.thread.thread_id.to_string())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(pages, vec![vec!["t5", "t4"], vec!["t3", "t2"], vec!["t1"]]);
}

// ----- runs: creation --------------------------------------------------------------------------

async fn same_idempotency_key_returns_the_same_run(store: S) {
    thread(&store, A, "t").await;
    let mut nr = new_run(A, "t", "first");
    nr.idempotency_key = Some("key-1".into());
    let first = store.create_run(nr.clone()).await.unwrap();
    assert!(first.created);
    assert_eq!(first.run.status, RunStatus::Queued);
    assert_eq!(first.run.idempotency_key.as_deref(), Some("key-1"));
    assert_eq!(first.run.attempt, 0);
    assert_eq!(first.run.phase, RunPhase::New);

    nr.query = "second".into();
    let again = store.create_run(nr.clone()).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.run.run_id, first.run.run_id);
    assert_eq!(again.run.query, "first");

    // The key also wins over `reject` while the run is active.
    nr.strategy = MultitaskStrategy::Reject;
    let again = store.create_run(nr.clone()).await.unwrap();
    assert_eq!(again.run.run_id, first.run.run_id);

    nr.idempotency_key = Some("key-2".into());
    nr.strategy = MultitaskStrategy::Enqueue;
    let other = store.create_run(nr.clone()).await.unwrap();
    assert!(other.created);
    assert_ne!(other.run.run_id, first.run.run_id);

    // Keys are per thread.
    let mut elsewhere = new_run(A, "t2", "q");
    elsewhere.idempotency_key = Some("key-1".into());
    let elsewhere = store.create_run(elsewhere).await.unwrap();
    assert!(elsewhere.created);
    assert_ne!(elsewhere.run.run_id, first.run.run_id);
    assert_eq!(
        store
            .list_runs(A, &tid("t"), 0, None)
            .await
            .unwrap()
            .unwrap()
            .len(),
        2
    );
}

async fn reject_strategy_refuses_a_busy_thread(store: S) {
    let first = enqueue(&store, A, "t").await;
    let mut nr = new_run(A, "t", "again");
    nr.strategy = MultitaskStrategy::Reject;
    match store.create_run(nr.clone()).await {
        Err(StoreError::ThreadBusy { active_run }) => assert_eq!(active_run, first.run_id),
        other => panic!("expected ThreadBusy, got {other:?}"),
    }
    assert_eq!(
        store
            .list_runs(A, &tid("t"), 0, None)
            .await
            .unwrap()
            .unwrap()
            .len(),
        1
    );

    let run = claim(&store).await;
    finish(&store, A, "t", fence(&run), RunStatus::Completed).await;
    let created = store.create_run(nr).await.unwrap();
    assert!(created.created);
    assert_eq!(created.run.multitask_strategy, MultitaskStrategy::Reject);
}

async fn enqueued_runs_wait_for_the_active_one(store: S) {
    let r1 = enqueue(&store, A, "t").await;
    let r2 = enqueue(&store, A, "t").await;
    assert_ne!(r1.run_id, r2.run_id);
    let listed = store
        .list_runs(A, &tid("t"), 0, None)
        .await
        .unwrap()
        .unwrap();
    let ids: Vec<Uuid> = listed.iter().map(|r| r.run_id).collect();
    assert_eq!(ids, [r2.run_id, r1.run_id], "newest first");

    let claimed = claim(&store).await;
    assert_eq!(claimed.run_id, r1.run_id);
    assert!(store.claim_run("w", LEASE).await.unwrap().is_none());
    finish(&store, A, "t", fence(&claimed), RunStatus::Completed).await;
    let next = claim(&store).await;
    assert_eq!(next.run_id, r2.run_id);
}

async fn create_run_creates_a_missing_thread_only_when_asked(store: S) {
    let mut nr = new_run(A, "fresh", "q");
    nr.create_thread = false;
    let err = store.create_run(nr.clone()).await.unwrap_err();
    assert!(matches!(err, StoreError::ThreadNotFound), "{err:?}");
    assert!(store.get_thread(A, &tid("fresh")).await.unwrap().is_none());

    nr.create_thread = true;
    let created = store.create_run(nr).await.unwrap();
    assert!(created.created);
    assert_eq!(created.run.start_seq, 0);
    let t = store.get_thread(A, &tid("fresh")).await.unwrap().unwrap();
    assert_eq!(t.status, ThreadStatus::Busy);
    assert_eq!(t.metadata, json!({}));
    let snap = store
        .agent_snapshot(A, &tid("fresh"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(snap.state.version, 0);
}

async fn interrupt_cancels_queued_and_flags_running_runs(store: S) {
    let (r1, f1) = running(&store, A, "t").await;
    let r2 = enqueue(&store, A, "t").await;
    // Something already in the log: start_seq must account for it.
    let mut b = batch(A, "t");
    b.observe(obs(r1.run_id, ObservationType::RunStarted, None));
    apply(&store, f1, b).await;

    let mut nr = new_run(A, "t", "now this");
    nr.strategy = MultitaskStrategy::Interrupt;
    let r3 = store.create_run(nr).await.unwrap();
    assert!(r3.created);
    assert_eq!(r3.run.status, RunStatus::Queued);
    assert_eq!(r3.observations.len(), 1);
    let o = &r3.observations[0];
    assert_eq!(o.kind, ObservationType::RunCancelled);
    assert_eq!(o.run_id, Some(r2.run_id));
    assert_eq!(o.parent_id, None);
    assert_eq!(o.title, "Run cancelled");
    assert_eq!(
        o.content,
        json!({ "reason": "interrupted", "byRunId": r3.run.run_id })
    );
    assert_eq!(o.seq, 2);
    assert_eq!(r3.run.start_seq, 2);
    let stored = observations(&store, A, "t").await;
    assert_eq!(seqs(&stored), [1, 2]);
    assert_eq!(stored[1], r3.observations[0]);

    let r2 = store
        .get_run(A, &tid("t"), r2.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r2.status, RunStatus::Cancelled);
    assert!(r2.ended_at.is_some());
    let r1 = store
        .get_run(A, &tid("t"), r1.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        r1.status,
        RunStatus::Running,
        "the worker cancels at a safe point"
    );
    assert!(r1.cancel_requested);
    assert!(store.heartbeat(f1, LEASE).await.unwrap());

    // The new run waits for the interrupted one to stop.
    assert!(store.claim_run("w", LEASE).await.unwrap().is_none());
    finish(&store, A, "t", f1, RunStatus::Cancelled).await;
    assert_eq!(claim(&store).await.run_id, r3.run.run_id);
}

async fn interrupt_cancels_a_suspended_run_and_its_suspension(store: S) {
    let (r1, f1) = running(&store, A, "t").await;
    let s = suspend(&store, A, "t", f1).await;
    let mut nr = new_run(A, "t", "instead");
    nr.strategy = MultitaskStrategy::Interrupt;
    let r2 = store.create_run(nr).await.unwrap();
    assert_eq!(r2.observations.len(), 1);
    assert_eq!(r2.observations[0].run_id, Some(r1.run_id));
    assert_eq!(r2.observations[0].content["reason"], "interrupted");
    let r1 = store
        .get_run(A, &tid("t"), r1.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r1.status, RunStatus::Cancelled);
    assert_eq!(r1.suspension, None);
    let s = store
        .get_suspension(A, s.suspension_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.status, SuspensionStatus::Cancelled);
    assert!(s.resolved_at.is_some());
    assert_eq!(claim(&store).await.run_id, r2.run.run_id);
}

// ----- runs: claiming and leases ---------------------------------------------------------------

async fn claim_takes_the_oldest_queued_run_of_each_thread(store: S) {
    let a1 = enqueue(&store, A, "a").await;
    let _a2 = enqueue(&store, A, "a").await;
    let b1 = enqueue(&store, A, "b").await;
    let first = claim(&store).await;
    let second = claim(&store).await;
    assert_eq!(
        HashSet::from([first.run_id, second.run_id]),
        HashSet::from([a1.run_id, b1.run_id])
    );
    for r in [&first, &second] {
        assert_eq!(r.status, RunStatus::Running);
        assert_eq!(r.attempt, 1);
        assert!(r.started_at.is_some());
    }
    assert!(store.claim_run("w", LEASE).await.unwrap().is_none());
    let stored = store
        .get_run(A, &tid("a"), a1.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, RunStatus::Running);
}

async fn concurrent_claimers_never_run_two_runs_of_one_thread(store: S) {
    for t in ["x", "y", "z"] {
        for _ in 0..3 {
            enqueue(&store, A, t).await;
        }
    }
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(run) = store.claim_run(&format!("w{i}"), LEASE).await.unwrap() {
                got.push(run);
            }
            got
        }));
    }
    let mut claimed = Vec::new();
    for t in tasks {
        claimed.extend(t.await.unwrap());
    }
    assert_eq!(claimed.len(), 3, "one run per thread: {claimed:?}");
    let threads: HashSet<String> = claimed.iter().map(|r| r.thread_id.to_string()).collect();
    assert_eq!(threads.len(), 3);
}

async fn a_suspended_run_blocks_its_thread(store: S) {
    let (r1, f1) = running(&store, A, "t").await;
    let s = suspend(&store, A, "t", f1).await;
    let r2 = enqueue(&store, A, "t").await;
    assert!(store.claim_run("w", LEASE).await.unwrap().is_none());

    let r1 = store
        .get_run(A, &tid("t"), r1.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r1.status, RunStatus::Suspended);
    let shown = r1.suspension.expect("a suspended run shows its suspension");
    assert_eq!(shown, serde_json::to_value(&s).unwrap());
    assert_eq!(shown["suspensionId"], json!(s.suspension_id));
    let listed = store
        .list_runs(A, &tid("t"), 0, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(listed[1].run_id, r1.run_id);
    assert!(listed[1].suspension.is_some());
    assert!(listed[0].suspension.is_none());
    assert_eq!(listed[0].run_id, r2.run_id);

    // The suspended run's lease is gone: the worker's fence is dead.
    assert!(matches!(
        store.heartbeat(f1, LEASE).await.unwrap_err(),
        StoreError::LeaseLost
    ));
    let stored = store
        .get_suspension(A, s.suspension_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, s);
    assert!(
        store
            .get_suspension(B, s.suspension_id)
            .await
            .unwrap()
            .is_none()
    );
    let pending = store
        .list_suspensions(A, &tid("t"), false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pending, vec![s.clone()]);
    let snap = store.agent_snapshot(A, &tid("t")).await.unwrap().unwrap();
    assert_eq!(snap.pending_suspension, Some(s));
}

async fn an_expired_lease_is_reclaimed_with_the_next_attempt(store: S) {
    enqueue(&store, A, "t").await;
    let first = store
        .claim_run("dead-worker", Duration::from_millis(50))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.attempt, 1);
    // Not before the lease runs out.
    let deadline = Instant::now() + Duration::from_secs(10);
    let second = loop {
        if let Some(run) = store.claim_run("worker-2", LEASE).await.unwrap() {
            break run;
        }
        assert!(
            Instant::now() < deadline,
            "the expired lease was never reclaimed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(second.run_id, first.run_id);
    assert_eq!(second.attempt, 2);
    assert_eq!(second.status, RunStatus::Running);
    assert_eq!(second.started_at, first.started_at, "started_at is kept");

    let old = fence(&first);
    assert!(matches!(
        store.heartbeat(old, LEASE).await.unwrap_err(),
        StoreError::LeaseLost
    ));
    let mut b = batch(A, "t");
    b.observe(obs(first.run_id, ObservationType::Thoughts, None));
    assert!(matches!(
        store.apply(old, LEASE, b).await.unwrap_err(),
        StoreError::LeaseLost
    ));
    assert!(!store.heartbeat(fence(&second), LEASE).await.unwrap());
    // The live lease is not reclaimed.
    assert!(store.claim_run("w3", LEASE).await.unwrap().is_none());
}

async fn one_heartbeat_renews_many_leases_and_reports_lost_ones(store: S) {
    let (one, f1) = running(&store, A, "one").await;
    let (two, f2) = running(&store, A, "two").await;
    let (three, f3) = running(&store, A, "three").await;
    store.cancel_run(A, &tid("two"), two.run_id).await.unwrap();
    // Three's lease moves on: a release and a claim under a newer attempt.
    store.release_run(f3).await.unwrap();
    let again = claim(&store).await;
    assert_eq!((again.run_id, again.attempt), (three.run_id, 2));
    let stranger = Fence {
        run_id: Uuid::now_v7(),
        attempt: 1,
    };
    let before = store
        .get_run(A, &tid("one"), one.run_id)
        .await
        .unwrap()
        .unwrap();
    let mut alive = store
        .heartbeat_many(&[f1, f2, f3, stranger], LEASE * 2)
        .await
        .unwrap();
    alive.sort();
    let mut want = vec![(one.run_id, false), (two.run_id, true)];
    want.sort();
    assert_eq!(alive, want, "the stale and unknown fences are not renewed");
    assert!(store.heartbeat_many(&[], LEASE).await.unwrap().is_empty());
    // The stale fence extended nothing: the newer attempt's lease is its own.
    assert!(!store.heartbeat(fence(&again), LEASE).await.unwrap());
    let after = store
        .get_run(A, &tid("one"), one.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.status, RunStatus::Running);
    assert_eq!(after.attempt, before.attempt);
}

async fn a_released_run_goes_back_to_the_queue(store: S) {
    let (run, f) = running(&store, A, "t").await;
    store.release_run(f).await.unwrap();
    let stored = store
        .get_run(A, &tid("t"), run.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, RunStatus::Queued);
    assert_eq!(stored.attempt, 1);
    assert!(matches!(
        store.release_run(f).await.unwrap_err(),
        StoreError::LeaseLost
    ));
    let again = claim(&store).await;
    assert_eq!(again.run_id, run.run_id);
    assert_eq!(again.attempt, 2);
    assert!(matches!(
        store.heartbeat(f, LEASE).await.unwrap_err(),
        StoreError::LeaseLost
    ));
}

async fn a_stale_fence_writes_nothing(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let stale = Fence {
        run_id: f.run_id,
        attempt: f.attempt + 1,
    };
    let mut b = batch(A, "t");
    b.op(Op::SetAgentState(AgentStateRow {
        intent: Some("x".into()),
        ..Default::default()
    }))
    .op(Op::UpsertItem(Box::new(item("step-1", 0, run.run_id))))
    .op(Op::AppendMessage(message(
        "t",
        run.run_id,
        MessageRole::User,
        "hi",
    )))
    .op(Op::InsertSuspension(Box::new(suspension(
        A, "t", run.run_id, "step-1",
    ))))
    .op(Op::UpdateRun(RunUpdate {
        status: Some(RunStatus::Completed),
        ended: true,
        ..Default::default()
    }))
    .observe(obs(run.run_id, ObservationType::RunCompleted, None));
    let err = store.apply(stale, LEASE, b.clone()).await.unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost), "{err:?}");
    // A batch for another tenant's thread does not match the fence either.
    let mut wrong_thread = b.clone();
    wrong_thread.tenant = B.into();
    let err = store.apply(f, LEASE, wrong_thread).await.unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost), "{err:?}");
    assert!(matches!(
        store.heartbeat(stale, LEASE).await.unwrap_err(),
        StoreError::LeaseLost
    ));
    assert!(matches!(
        store.release_run(stale).await.unwrap_err(),
        StoreError::LeaseLost
    ));

    let snap = store.agent_snapshot(A, &tid("t")).await.unwrap().unwrap();
    assert_eq!(snap.state, AgentStateRow::default());
    assert!(snap.items.is_empty());
    assert!(snap.pending_suspension.is_none());
    assert!(
        store
            .list_messages(A, &tid("t"), 0, None)
            .await
            .unwrap()
            .unwrap()
            .is_empty()
    );
    assert!(observations(&store, A, "t").await.is_empty());
    let stored = store
        .get_run(A, &tid("t"), run.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, RunStatus::Running);
    assert!(stored.ended_at.is_none());

    // The rolled-back seqs are handed out again: no gap.
    let mut ok = batch(A, "t");
    ok.observe(obs(run.run_id, ObservationType::RunStarted, None));
    assert_eq!(seqs(&apply(&store, f, ok).await.observations), [1]);
}

async fn an_ended_run_refuses_further_writes(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let mut b = batch(A, "t");
    b.op(Op::UpdateRun(RunUpdate {
        status: Some(RunStatus::Completed),
        phase: Some(RunPhase::Done),
        usage: Some(Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
            total_tokens: 15,
            llm_calls: 2,
            ..Usage::default()
        }),
        final_response: Some(json!({ "response": "42" })),
        ended: true,
        ..Default::default()
    }))
    .observe(obs(run.run_id, ObservationType::RunCompleted, None));
    apply(&store, f, b).await;
    let stored = store
        .get_run(A, &tid("t"), run.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, RunStatus::Completed);
    assert_eq!(stored.phase, RunPhase::Done);
    assert_eq!(stored.usage.total_tokens, 15);
    assert_eq!(stored.final_response, Some(json!({ "response": "42" })));
    assert!(stored.ended_at.is_some());
    assert!(matches!(
        store.heartbeat(f, LEASE).await.unwrap_err(),
        StoreError::LeaseLost
    ));
    assert!(matches!(
        store.apply(f, LEASE, batch(A, "t")).await.unwrap_err(),
        StoreError::LeaseLost
    ));

    // A failure keeps its error.
    let (run, f) = running(&store, A, "t").await;
    let mut b = batch(A, "t");
    b.op(Op::UpdateRun(RunUpdate {
        status: Some(RunStatus::Failed),
        error: Some(ErrorInfo {
            code: "llm_error".into(),
            message: "boom".into(),
        }),
        ended: true,
        ..Default::default()
    }));
    apply(&store, f, b).await;
    let stored = store
        .get_run(A, &tid("t"), run.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, RunStatus::Failed);
    assert_eq!(stored.error.unwrap().code, "llm_error");
}

// ----- observations ----------------------------------------------------------------------------

async fn apply_assigns_gap_free_seqs_per_thread(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let mut b = batch(A, "t");
    for kind in [
        ObservationType::RunStarted,
        ObservationType::Intent,
        ObservationType::Plan,
    ] {
        b.observe(obs(run.run_id, kind, None));
    }
    let applied = apply(&store, f, b.clone()).await;
    assert_eq!(seqs(&applied.observations), [1, 2, 3]);
    assert!(!applied.cancel_requested);
    for (o, n) in applied.observations.iter().zip(&b.observations) {
        assert_eq!(o.id, n.id);
        assert_eq!(o.kind, n.kind);
        assert_eq!(o.content, n.content);
        assert_eq!(o.thread_id, tid("t"));
    }
    let mut b = batch(A, "t");
    b.observe(obs(run.run_id, ObservationType::Thoughts, Some("step-1")))
        .observe(obs(run.run_id, ObservationType::ToolCall, Some("step-1")));
    let applied2 = apply(&store, f, b).await;
    assert_eq!(seqs(&applied2.observations), [4, 5]);
    // Ops without observations do not consume seqs.
    apply(&store, f, batch(A, "t")).await;

    let stored = observations(&store, A, "t").await;
    assert_eq!(seqs(&stored), [1, 2, 3, 4, 5]);
    let returned: Vec<_> = applied
        .observations
        .into_iter()
        .chain(applied2.observations)
        .collect();
    assert_eq!(stored, returned, "what apply returns is what is stored");

    // Another thread counts on its own.
    let (other, g) = running(&store, A, "u").await;
    let mut b = batch(A, "u");
    b.observe(obs(other.run_id, ObservationType::RunStarted, None));
    assert_eq!(seqs(&apply(&store, g, b).await.observations), [1]);
    let next = enqueue(&store, A, "t").await;
    assert_eq!(next.start_seq, 5);
}

/// Runs on many threads commit at once (on SQLite their batches share transactions); one of them
/// commits under a lease it lost: only that one fails, and writes nothing, while every other
/// batch commits whole with gap-free seqs on its own thread.
async fn concurrent_commits_of_many_runs_fail_only_the_stale_one(store: S) {
    const RUNS: usize = 8;
    let mut fences = Vec::new();
    for r in 0..RUNS {
        let (run, f) = running(&store, A, &format!("g{r}")).await;
        fences.push((run, f));
    }
    // Run 0's lease moves on (released and claimed again): its old fence is stale.
    store.release_run(fences[0].1).await.unwrap();
    let again = claim(&store).await;
    assert_eq!(again.run_id, fences[0].0.run_id);
    let mut tasks = Vec::new();
    for (r, (run, f)) in fences.into_iter().enumerate() {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut results = Vec::new();
            for i in 0..4 {
                let mut b = batch(A, &format!("g{r}"));
                b.op(Op::UpsertItem(Box::new(item(
                    &format!("i{i}"),
                    i,
                    run.run_id,
                ))));
                b.observe(obs(run.run_id, ObservationType::Thoughts, None));
                b.observe(obs(run.run_id, ObservationType::Thoughts, None));
                results.push(
                    store
                        .apply(f, LEASE, b)
                        .await
                        .map(|a| seqs(&a.observations)),
                );
            }
            (r, results)
        }));
    }
    for t in tasks {
        let (r, results) = t.await.unwrap();
        let thread = format!("g{r}");
        if r == 0 {
            assert!(
                results
                    .iter()
                    .all(|x| matches!(x, Err(StoreError::LeaseLost))),
                "the stale fence never commits: {results:?}"
            );
            assert!(observations(&store, A, &thread).await.is_empty());
            let snap = store
                .agent_snapshot(A, &tid(&thread))
                .await
                .unwrap()
                .unwrap();
            assert!(snap.items.is_empty(), "nothing of a stale batch is written");
        } else {
            let got: Vec<i64> = results.into_iter().flat_map(|x| x.unwrap()).collect();
            assert_eq!(got, (1..=8).collect::<Vec<_>>(), "thread {thread}");
            assert_eq!(observations(&store, A, &thread).await.len(), 8);
            let snap = store
                .agent_snapshot(A, &tid(&thread))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(snap.items.len(), 4);
        }
    }
}

async fn concurrent_applies_never_leave_gaps_or_duplicates(store: S) {
    let (run, f) = running(&store, A, "t").await;
    const WRITERS: usize = 8;
    const BATCHES: usize = 5;
    const PER_BATCH: usize = 3;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..BATCHES {
                let mut b = batch(A, "t");
                b.op(Op::UpsertItem(Box::new(item(
                    &format!("w{w}"),
                    i64::try_from(w).unwrap(),
                    run.run_id,
                ))));
                for _ in 0..PER_BATCH {
                    b.observe(obs(run.run_id, ObservationType::Thoughts, None));
                }
                let applied = store.apply(f, LEASE, b).await.unwrap();
                let s = seqs(&applied.observations);
                // One batch's seqs are contiguous.
                assert_eq!(
                    s.last().unwrap() - s[0],
                    i64::try_from(PER_BATCH - 1).unwrap()
                );
                got.extend(s);
                let _ = i;
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    let n = i64::try_from(WRITERS * BATCHES * PER_BATCH).unwrap();
    assert_eq!(all, (1..=n).collect::<Vec<_>>());
    let stored = observations(&store, A, "t").await;
    assert_eq!(seqs(&stored), (1..=n).collect::<Vec<_>>());
    let ids: HashSet<Uuid> = stored.iter().map(|o| o.id).collect();
    assert_eq!(ids.len(), stored.len());
    let snap = store.agent_snapshot(A, &tid("t")).await.unwrap().unwrap();
    assert_eq!(snap.items.len(), WRITERS);
}

async fn observations_filter_by_after_limit_type_parent_and_run(store: S) {
    let (r1, f1) = running(&store, A, "t").await;
    let mut b = batch(A, "t");
    b.observe(obs(r1.run_id, ObservationType::RunStarted, None)) // 1
        .observe(obs(
            r1.run_id,
            ObservationType::ItemStatusChange,
            Some("s1"),
        )) // 2
        .observe(obs(r1.run_id, ObservationType::ToolCall, Some("s1"))) // 3
        .observe(obs(r1.run_id, ObservationType::ToolCall, Some("s2"))) // 4
        .observe(obs(r1.run_id, ObservationType::RunCompleted, None)); // 5
    b.op(Op::UpdateRun(RunUpdate {
        status: Some(RunStatus::Completed),
        ended: true,
        ..Default::default()
    }));
    apply(&store, f1, b).await;
    let (r2, f2) = running(&store, A, "t").await;
    let mut b = batch(A, "t");
    b.observe(obs(r2.run_id, ObservationType::RunStarted, None)) // 6
        .observe(obs(r2.run_id, ObservationType::ToolCall, Some("s1"))); // 7
    apply(&store, f2, b).await;

    let q = |f: fn(&mut ObservationQuery)| {
        let mut q = ObservationQuery::default();
        f(&mut q);
        q
    };
    let list = |q: ObservationQuery| {
        let store = store.clone();
        async move {
            seqs(
                &store
                    .list_observations(A, &tid("t"), &q)
                    .await
                    .unwrap()
                    .unwrap(),
            )
        }
    };
    assert_eq!(list(q(|_| {})).await, [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(list(q(|q| q.after = 4)).await, [5, 6, 7]);
    assert_eq!(list(q(|q| q.limit = 2)).await, [1, 2]);
    assert_eq!(
        list(q(|q| {
            q.after = 2;
            q.limit = 3;
        }))
        .await,
        [3, 4, 5]
    );
    assert_eq!(
        list(q(|q| q.types = Some(vec![ObservationType::ToolCall]))).await,
        [3, 4, 7]
    );
    assert_eq!(
        list(q(|q| q.types = Some(vec![
            ObservationType::RunStarted,
            ObservationType::RunCompleted
        ])))
        .await,
        [1, 5, 6]
    );
    assert_eq!(
        list(q(|q| q.parent_id = Some("s1".into()))).await,
        [2, 3, 7]
    );
    let mut by_run = ObservationQuery {
        run_id: Some(r2.run_id),
        ..Default::default()
    };
    assert_eq!(list(by_run.clone()).await, [6, 7]);
    by_run.types = Some(vec![ObservationType::ToolCall]);
    by_run.parent_id = Some("s1".into());
    assert_eq!(list(by_run).await, [7]);
    assert_eq!(list(q(|q| q.after = 7)).await, Vec::<i64>::new());
    assert!(
        store
            .list_observations(A, &tid("missing"), &ObservationQuery::default())
            .await
            .unwrap()
            .is_none()
    );
    let stored = observations(&store, A, "t").await;
    assert_eq!(stored[1].parent_id.as_deref(), Some("s1"));
    assert_eq!(stored[0].run_id, Some(r1.run_id));
    assert_eq!(stored[0].title, "run_started");
}

// ----- cancel ----------------------------------------------------------------------------------

async fn cancelling_a_queued_run_ends_it_with_an_observation(store: S) {
    let run = enqueue(&store, A, "t").await;
    let cancelled = store.cancel_run(A, &tid("t"), run.run_id).await.unwrap();
    assert_eq!(cancelled.run.status, RunStatus::Cancelled);
    assert!(cancelled.run.ended_at.is_some());
    assert_eq!(cancelled.observations.len(), 1);
    let o = &cancelled.observations[0];
    assert_eq!(o.kind, ObservationType::RunCancelled);
    assert_eq!(o.content, json!({ "reason": "cancelled" }));
    assert_eq!(o.title, "Run cancelled");
    assert_eq!(o.run_id, Some(run.run_id));
    assert_eq!(o.parent_id, None);
    assert_eq!(o.seq, 1);
    assert_eq!(observations(&store, A, "t").await, cancelled.observations);
    assert_eq!(
        store
            .get_run(A, &tid("t"), run.run_id)
            .await
            .unwrap()
            .unwrap(),
        cancelled.run
    );
    assert!(store.claim_run("w", LEASE).await.unwrap().is_none());
    match store.cancel_run(A, &tid("t"), run.run_id).await {
        Err(StoreError::Conflict(msg)) => assert!(msg.contains("cancelled"), "{msg}"),
        other => panic!("expected Conflict, got {other:?}"),
    }
}

async fn cancelling_a_running_run_flags_it_for_the_worker(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let cancelled = store.cancel_run(A, &tid("t"), run.run_id).await.unwrap();
    assert_eq!(cancelled.run.status, RunStatus::Running);
    assert!(cancelled.run.cancel_requested);
    assert!(cancelled.observations.is_empty());
    assert!(store.heartbeat(f, LEASE).await.unwrap());
    let applied = apply(&store, f, batch(A, "t")).await;
    assert!(applied.cancel_requested);
    // Asking twice is fine while it still runs.
    assert!(store.cancel_run(A, &tid("t"), run.run_id).await.is_ok());
    finish(&store, A, "t", f, RunStatus::Cancelled).await;
    assert!(matches!(
        store
            .cancel_run(A, &tid("t"), run.run_id)
            .await
            .unwrap_err(),
        StoreError::Conflict(_)
    ));
}

async fn cancelling_a_suspended_run_cancels_its_suspension(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let s = suspend(&store, A, "t", f).await;
    let cancelled = store.cancel_run(A, &tid("t"), run.run_id).await.unwrap();
    assert_eq!(cancelled.run.status, RunStatus::Cancelled);
    assert_eq!(cancelled.run.suspension, None);
    assert_eq!(cancelled.observations.len(), 1);
    assert_eq!(cancelled.observations[0].seq, 2);
    let s = store
        .get_suspension(A, s.suspension_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.status, SuspensionStatus::Cancelled);
    assert!(
        store
            .list_suspensions(A, &tid("t"), false)
            .await
            .unwrap()
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .list_suspensions(A, &tid("t"), true)
            .await
            .unwrap()
            .unwrap(),
        vec![s]
    );
    assert!(
        store
            .agent_snapshot(A, &tid("t"))
            .await
            .unwrap()
            .unwrap()
            .pending_suspension
            .is_none()
    );
}

async fn cancelling_unknown_or_finished_runs_fails(store: S) {
    let (run, f) = running(&store, A, "t").await;
    finish(&store, A, "t", f, RunStatus::Completed).await;
    match store.cancel_run(A, &tid("t"), run.run_id).await {
        Err(StoreError::Conflict(msg)) => assert_eq!(msg, "run already completed"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    let err = store.cancel_run(A, &tid("t"), new_id()).await.unwrap_err();
    assert!(matches!(err, StoreError::RunNotFound), "{err:?}");
    let err = store
        .cancel_run(A, &tid("other"), run.run_id)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::RunNotFound), "{err:?}");
    assert!(observations(&store, A, "t").await.is_empty());
}

// ----- agent state, messages -------------------------------------------------------------------

async fn agent_snapshot_reflects_items_and_state(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let mut b = batch(A, "t");
    let built: Vec<TodoItem> = [("c", 2), ("a", 0), ("b", 1)]
        .into_iter()
        .map(|(id, pos)| item(id, pos, run.run_id))
        .collect();
    for it in &built {
        b.op(Op::UpsertItem(Box::new(it.clone())));
    }
    b.op(Op::SetAgentState(AgentStateRow {
        intent: Some("intent".into()),
        title: Some("title".into()),
        plan: Some("plan".into()),
        current_step_id: None,
        version: 0,
    }));
    apply(&store, f, b).await;
    let snap = store.agent_snapshot(A, &tid("t")).await.unwrap().unwrap();
    let ids: Vec<&str> = snap.items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(snap.items[0], built[1]);
    assert_eq!(snap.state.version, 1);
    assert_eq!(snap.state.intent.as_deref(), Some("intent"));

    // Every field survives the round trip.
    let t = now();
    let mut full = item("b", 1, run.run_id);
    full.status = ItemStatus::Completed;
    full.dependencies = vec![iid("a")];
    full.step_type = StepType::Reasoning;
    full.tool_validation_mode = ToolValidationMode::Advisory;
    full.validation_status = ValidationStatus::Passed;
    full.tool_calls = vec![ToolCallRecord {
        id: "c1".into(),
        name: "calculator".into(),
        arguments: json!({ "expression": "2*3" }),
    }];
    full.actual_tool_calls = full.tool_calls.clone();
    full.tool_results = vec![ToolResultRecord {
        tool_call_id: "c1".into(),
        name: "calculator".into(),
        status: ToolResultStatus::Success,
        output: json!(6),
        error: None,
    }];
    full.thoughts = vec!["multiply".into()];
    full.result = Some("6".into());
    full.error = Some(ErrorInfo {
        code: "none".into(),
        message: "fine".into(),
    });
    full.attempts = 2;
    full.usage = Usage {
        prompt_tokens: 1,
        completion_tokens: 2,
        total_tokens: 3,
        llm_calls: 1,
        ..Usage::default()
    };
    full.conversation = vec![ConversationMessage {
        role: MessageRole::Assistant,
        content: None,
        tool_calls: full.tool_calls.clone(),
        tool_call_id: None,
    }];
    full.started_at = Some(t);
    full.completed_at = Some(t);
    let mut b = batch(A, "t");
    b.op(Op::UpsertItem(Box::new(full.clone())))
        .op(Op::DeleteItem(iid("c")))
        .op(Op::SetAgentState(AgentStateRow {
            current_step_id: Some("b".into()),
            ..Default::default()
        }));
    apply(&store, f, b).await;
    let snap = store.agent_snapshot(A, &tid("t")).await.unwrap().unwrap();
    assert_eq!(snap.items.len(), 2);
    assert_eq!(snap.items[1], full);
    assert_eq!(snap.state.version, 2);
    assert_eq!(snap.state.intent, None, "the state row is replaced");
    assert_eq!(snap.state.current_step_id.as_deref(), Some("b"));
    assert!(
        store
            .agent_snapshot(A, &tid("nope"))
            .await
            .unwrap()
            .is_none()
    );
}

async fn messages_list_oldest_first_with_a_cursor(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let mut written = Vec::new();
    for i in 0..5 {
        let role = if i % 2 == 0 {
            MessageRole::User
        } else {
            MessageRole::Assistant
        };
        let mut m = message("t", run.run_id, role, &format!("m{i}"));
        if i == 2 {
            // An item's tool-call turn: an assistant message with its calls.
            m.item_id = Some("step-1".into());
            m.role = MessageRole::Assistant;
            m.content = String::new();
            m.tool_calls = vec![ToolCallRecord {
                id: "call-1".into(),
                name: "calculator".into(),
                arguments: json!({"expression": "1+1"}),
            }];
        }
        if i == 3 {
            m.item_id = Some("step-1".into());
            m.tool_call_id = Some("call-1".into());
            m.name = Some("calculator".into());
            m.role = MessageRole::Tool;
        }
        written.push(m.clone());
        let mut b = batch(A, "t");
        b.op(Op::AppendMessage(m));
        apply(&store, f, b).await;
    }
    let all = store
        .list_messages(A, &tid("t"), 0, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(all, written);
    let first = store
        .list_messages(A, &tid("t"), 2, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, written[..2]);
    let cursor = PageCursor {
        created_at: first[1].created_at,
        id: first[1].id.to_string(),
    };
    let second = store
        .list_messages(A, &tid("t"), 2, Some(&cursor))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second, written[2..4]);
    // The planner's context: the newest messages of the thread-level conversation (no item's
    // tool-call turn or tool result), oldest first.
    let recent = store.recent_messages(A, &tid("t"), 2).await.unwrap();
    assert_eq!(recent, vec![written[1].clone(), written[4].clone()]);
    let recent = store.recent_messages(A, &tid("t"), 10).await.unwrap();
    assert_eq!(
        recent,
        vec![written[0].clone(), written[1].clone(), written[4].clone()]
    );
}

// ----- runs list, deletion, status -------------------------------------------------------------

async fn runs_list_newest_first_with_a_cursor(store: S) {
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(enqueue(&store, A, "t").await.run_id);
    }
    ids.reverse();
    let mut seen = Vec::new();
    let mut cursor: Option<PageCursor> = None;
    loop {
        let page = store
            .list_runs(A, &tid("t"), 2, cursor.as_ref())
            .await
            .unwrap()
            .unwrap();
        let Some(last) = page.last() else { break };
        cursor = Some(PageCursor {
            created_at: last.created_at,
            id: last.run_id.to_string(),
        });
        seen.extend(page.iter().map(|r| r.run_id));
    }
    assert_eq!(seen, ids);
}

/// A run found by id alone (an A2A task id), and a tenant's runs across threads (`ListTasks`):
/// tenant-scoped, newest first, filtered, paged, counted.
async fn tenant_runs_are_found_by_id_and_listed_across_threads(store: S) {
    let mut ids = Vec::new();
    for thread in ["t1", "t2", "t1"] {
        ids.push(enqueue(&store, A, thread).await.run_id);
    }
    let foreign = enqueue(&store, B, "t1").await;
    let found = store.find_run(A, ids[1]).await.unwrap().unwrap();
    assert_eq!((found.run_id, found.thread_id.as_str()), (ids[1], "t2"));
    assert!(store.find_run(A, foreign.run_id).await.unwrap().is_none());
    assert!(store.find_run(B, ids[0]).await.unwrap().is_none());

    let all = RunFilter::default();
    let (page, total) = store.list_tenant_runs(A, &all, 2, None).await.unwrap();
    assert_eq!(total, 3);
    assert_eq!(
        page.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        [ids[2], ids[1]]
    );
    let cursor = PageCursor {
        created_at: page[1].created_at,
        id: page[1].run_id.to_string(),
    };
    let (rest, _) = store
        .list_tenant_runs(A, &all, 2, Some(&cursor))
        .await
        .unwrap();
    assert_eq!(rest.iter().map(|r| r.run_id).collect::<Vec<_>>(), [ids[0]]);

    let of_t1 = RunFilter {
        thread_id: Some(tid("t1")),
        ..Default::default()
    };
    let (page, total) = store.list_tenant_runs(A, &of_t1, 0, None).await.unwrap();
    assert_eq!((page.len(), total), (2, 2));

    // The oldest run of each thread starts; t1's second run stays queued, never started.
    let claimed = store.claim_runs("w", LEASE, 10).await.unwrap().runs;
    assert_eq!(claimed.len(), 3, "one run per thread and tenant");
    let filter = |statuses: Vec<RunStatus>, queued_started: Option<bool>| RunFilter {
        statuses: Some(statuses),
        queued_started,
        ..Default::default()
    };
    let ids_of = |runs: Vec<Run>| runs.into_iter().map(|r| r.run_id).collect::<HashSet<_>>();
    let (fresh, n) = store
        .list_tenant_runs(A, &filter(vec![RunStatus::Queued], Some(false)), 0, None)
        .await
        .unwrap();
    assert_eq!((ids_of(fresh), n), ([ids[2]].into(), 1));
    let (working, n) = store
        .list_tenant_runs(
            A,
            &filter(vec![RunStatus::Running, RunStatus::Queued], Some(true)),
            0,
            None,
        )
        .await
        .unwrap();
    assert_eq!((ids_of(working), n), ([ids[0], ids[1]].into(), 2));
    let later = RunFilter {
        updated_after: Some(Utc::now() + chrono::Duration::hours(1)),
        ..Default::default()
    };
    let (none, n) = store.list_tenant_runs(A, &later, 0, None).await.unwrap();
    assert_eq!((none.len(), n), (0, 0));
}

async fn deleting_a_thread_removes_everything_it_owns(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let s = suspension(A, "t", run.run_id, "step-1");
    let mut b = batch(A, "t");
    b.op(Op::UpsertItem(Box::new(item("step-1", 0, run.run_id))))
        .op(Op::AppendMessage(message(
            "t",
            run.run_id,
            MessageRole::User,
            "hi",
        )))
        .op(Op::InsertSuspension(Box::new(s.clone())))
        .op(Op::UpdateRun(RunUpdate {
            status: Some(RunStatus::Suspended),
            ..Default::default()
        }))
        .observe(obs(
            run.run_id,
            ObservationType::AgentSuspended,
            Some("step-1"),
        ));
    apply(&store, f, b).await;
    enqueue(&store, A, "t").await;
    let keep = enqueue(&store, A, "keep").await;

    assert!(store.delete_thread(A, &tid("t")).await.unwrap());
    assert!(store.get_thread(A, &tid("t")).await.unwrap().is_none());
    assert!(
        store
            .get_run(A, &tid("t"), run.run_id)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .get_suspension(A, s.suspension_id)
            .await
            .unwrap()
            .is_none()
    );
    assert!(store.agent_snapshot(A, &tid("t")).await.unwrap().is_none());
    assert!(
        store
            .list_runs(A, &tid("t"), 0, None)
            .await
            .unwrap()
            .is_none()
    );

    // A new thread with the same id starts from nothing.
    let again = enqueue(&store, A, "t").await;
    assert_eq!(again.start_seq, 0);
    assert!(observations(&store, A, "t").await.is_empty());
    assert_eq!(
        store
            .list_runs(A, &tid("t"), 0, None)
            .await
            .unwrap()
            .unwrap()
            .len(),
        1
    );
    assert!(
        store
            .list_messages(A, &tid("t"), 0, None)
            .await
            .unwrap()
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .agent_snapshot(A, &tid("t"))
            .await
            .unwrap()
            .unwrap()
            .items
            .is_empty()
    );
    // Other threads are untouched; the old runs are not claimable any more.
    let first = claim(&store).await;
    let second = claim(&store).await;
    assert_eq!(
        HashSet::from([first.run_id, second.run_id]),
        HashSet::from([keep.run_id, again.run_id])
    );
}

async fn thread_status_follows_its_runs(store: S) {
    thread(&store, A, "t").await;
    assert_eq!(status_of(&store, A, "t").await, ThreadStatus::Idle);
    let (run, f) = running(&store, A, "t").await;
    assert_eq!(status_of(&store, A, "t").await, ThreadStatus::Busy);
    suspend(&store, A, "t", f).await;
    assert_eq!(status_of(&store, A, "t").await, ThreadStatus::Suspended);
    let queued = enqueue(&store, A, "t").await;
    assert_eq!(
        status_of(&store, A, "t").await,
        ThreadStatus::Busy,
        "queued work outranks a suspension"
    );
    store.cancel_run(A, &tid("t"), queued.run_id).await.unwrap();
    assert_eq!(status_of(&store, A, "t").await, ThreadStatus::Suspended);
    store.cancel_run(A, &tid("t"), run.run_id).await.unwrap();
    assert_eq!(status_of(&store, A, "t").await, ThreadStatus::Idle);

    let (_, f) = running(&store, A, "t").await;
    finish(&store, A, "t", f, RunStatus::Failed).await;
    assert_eq!(status_of(&store, A, "t").await, ThreadStatus::Error);
    let listed = store.list_threads(A, 0, None).await.unwrap();
    assert_eq!(listed[0].thread.status, ThreadStatus::Error);
    let patched = store
        .update_thread(A, &tid("t"), ThreadPatch::default())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(patched.status, ThreadStatus::Error);

    let (_, f) = running(&store, A, "t").await;
    assert_eq!(status_of(&store, A, "t").await, ThreadStatus::Busy);
    finish(&store, A, "t", f, RunStatus::Completed).await;
    assert_eq!(
        status_of(&store, A, "t").await,
        ThreadStatus::Idle,
        "the newest run decides"
    );
}

async fn mixed_writers_of_one_thread_neither_deadlock_nor_leave_gaps(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let mut b = batch(A, "t");
                b.op(Op::SetAgentState(AgentStateRow::default()))
                    .observe(obs(run.run_id, ObservationType::Thoughts, None));
                store.apply(f, LEASE, b).await.unwrap();
            }
        }));
    }
    for i in 0..2 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let queued = store
                    .create_run(new_run(A, "t", "later"))
                    .await
                    .unwrap()
                    .run;
                let mut nr = new_run(A, "t", "now");
                nr.strategy = MultitaskStrategy::Interrupt;
                store.create_run(nr).await.unwrap();
                // Either already cancelled by an interrupt (Conflict) or cancelled here.
                match store.cancel_run(A, &tid("t"), queued.run_id).await {
                    Ok(_) | Err(StoreError::Conflict(_)) => {}
                    Err(e) => panic!("cancel {i}: {e:?}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stored = observations(&store, A, "t").await;
    let n = i64::try_from(stored.len()).unwrap();
    assert!(
        n >= 40 + 10,
        "every apply and every displaced run was reported: {n}"
    );
    assert_eq!(seqs(&stored), (1..=n).collect::<Vec<_>>());
    assert!(
        store.heartbeat(f, LEASE).await.unwrap(),
        "the interrupts flagged the running run"
    );
    assert_eq!(
        store
            .agent_snapshot(A, &tid("t"))
            .await
            .unwrap()
            .unwrap()
            .state
            .version,
        40
    );
}

// ----- suspensions: resolution, expiry ---------------------------------------------------------

/// A resolution by a person, the decision written as its stored JSON.
fn resolution(decision: serde_json::Value) -> Resolution {
    Resolution {
        status: SuspensionStatus::Resolved,
        decision: serde_json::from_value(decision).expect("a decision in its stored shape"),
        trace_context: None,
    }
}

fn expiry() -> Resolution {
    Resolution {
        status: SuspensionStatus::Expired,
        decision: ResumeDecision::Reject {
            reason: Some("expired".into()),
        },
        trace_context: None,
    }
}

/// A stored decision as the JSON the API shows.
fn decision_json(d: &Option<ResumeDecision>) -> Option<serde_json::Value> {
    d.as_ref().map(|d| serde_json::to_value(d).unwrap())
}

fn of_type(
    list: &[pes_server::model::Observation],
    kind: ObservationType,
) -> Vec<pes_server::model::Observation> {
    list.iter().filter(|o| o.kind == kind).cloned().collect()
}

async fn resolving_a_suspension_requeues_its_run_with_an_observation(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let s = suspend(&store, A, "t", f).await;
    let later = enqueue(&store, A, "t").await;
    let decision = json!({ "decision": "approve", "reason": "looks fine" });
    let done = store
        .resolve_suspension(A, s.suspension_id, resolution(decision.clone()))
        .await
        .unwrap();

    assert_eq!(done.suspension.suspension_id, s.suspension_id);
    assert_eq!(done.suspension.status, SuspensionStatus::Resolved);
    assert_eq!(
        decision_json(&done.suspension.decision),
        Some(decision.clone())
    );
    assert!(done.suspension.resolved_at.is_some());
    let stored = store
        .get_suspension(A, s.suspension_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, done.suspension);

    assert_eq!(done.run.run_id, run.run_id);
    assert_eq!(done.run.status, RunStatus::Queued);
    assert_eq!(done.run.attempt, f.attempt, "the next claim bumps it");
    assert_eq!(done.run.suspension, None);
    assert_eq!(done.run.ended_at, None);
    let got = store
        .get_run(A, &tid("t"), run.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.status, RunStatus::Queued);

    assert_eq!(done.observations.len(), 1);
    let o = &done.observations[0];
    assert_eq!(o.kind, ObservationType::AgentResumed);
    assert_eq!(o.seq, 2, "after AGENT_SUSPENDED");
    assert_eq!(o.run_id, Some(run.run_id));
    assert_eq!(o.parent_id.as_deref(), Some("step-1"));
    assert_eq!(o.title, "Resumed: approve");
    assert_eq!(
        o.content,
        json!({
            "suspensionId": s.suspension_id,
            "decision": "approve",
            "reason": "looks fine",
            "expired": false,
        })
    );
    let stored = observations(&store, A, "t").await;
    assert_eq!(seqs(&stored), [1, 2]);
    assert_eq!(&stored[1], o);

    assert_eq!(status_of(&store, A, "t").await, ThreadStatus::Busy);
    assert!(
        store
            .agent_snapshot(A, &tid("t"))
            .await
            .unwrap()
            .unwrap()
            .pending_suspension
            .is_none()
    );
    // The resumed run goes before the one enqueued while it waited, with the next attempt.
    let again = claim(&store).await;
    assert_eq!(again.run_id, run.run_id);
    assert_eq!(again.attempt, f.attempt + 1);
    assert_ne!(again.run_id, later.run_id);
}

/// A run keeps the trace context it was created with across claims and a resume without one;
/// a resume that brings one replaces it.
async fn a_run_keeps_its_trace_context_unless_a_resume_brings_one(store: S) {
    let first = r#"{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#;
    let created = store
        .create_run(NewRun {
            trace_context: Some(first.into()),
            ..new_run(A, "t", "q")
        })
        .await
        .unwrap()
        .run;
    assert_eq!(created.trace_context.as_deref(), Some(first));
    let run = claim(&store).await;
    assert_eq!(run.trace_context.as_deref(), Some(first));
    let s = suspend(&store, A, "t", fence(&run)).await;
    let done = store
        .resolve_suspension(
            A,
            s.suspension_id,
            resolution(json!({"decision": "approve"})),
        )
        .await
        .unwrap();
    assert_eq!(done.run.trace_context.as_deref(), Some(first), "kept");
    let run = claim(&store).await;
    assert_eq!(run.trace_context.as_deref(), Some(first));
    let s = suspend(&store, A, "t", fence(&run)).await;
    let second = r#"{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"}"#;
    let r = Resolution {
        trace_context: Some(second.into()),
        ..resolution(json!({"decision": "approve"}))
    };
    store
        .resolve_suspension(A, s.suspension_id, r)
        .await
        .unwrap();
    assert_eq!(claim(&store).await.trace_context.as_deref(), Some(second));
}

/// `/metrics` reads what waits from the store: queued runs and pending suspensions, over every
/// tenant.
async fn the_backlog_counts_queued_runs_and_pending_suspensions(store: S) {
    assert_eq!(store.backlog().await.unwrap(), Backlog::default());
    let (_, f) = running(&store, A, "t").await;
    suspend(&store, A, "t", f).await;
    enqueue(&store, A, "t").await;
    enqueue(&store, B, "u").await;
    let b = store.backlog().await.unwrap();
    assert_eq!((b.queued_runs, b.pending_suspensions), (2, 1));
}

async fn concurrent_resolvers_of_one_suspension_get_one_success(store: S) {
    const CALLERS: usize = 20;
    let (run, f) = running(&store, A, "t").await;
    let s = suspend(&store, A, "t", f).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(CALLERS));
    let mut tasks = Vec::new();
    for i in 0..CALLERS {
        let store = store.clone();
        let barrier = barrier.clone();
        let id = s.suspension_id;
        tasks.push(tokio::spawn(async move {
            let decision = json!({ "decision": "approve", "reason": format!("caller {i}") });
            barrier.wait().await;
            (
                decision.clone(),
                store.resolve_suspension(A, id, resolution(decision)).await,
            )
        }));
    }
    let mut winners = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        match t.await.unwrap() {
            (decision, Ok(done)) => winners.push((decision, done)),
            (_, Err(StoreError::Conflict(msg))) => {
                assert_eq!(msg, "suspension already resolved");
                conflicts += 1;
            }
            (_, Err(e)) => panic!("expected Ok or Conflict, got {e:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one resolver wins");
    assert_eq!(conflicts, CALLERS - 1);
    let (decision, done) = winners.pop().unwrap();

    let stored = store
        .get_suspension(A, s.suspension_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, SuspensionStatus::Resolved);
    assert_eq!(decision_json(&stored.decision), Some(decision.clone()));
    assert_eq!(stored, done.suspension);
    let got = store
        .get_run(A, &tid("t"), run.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.status, RunStatus::Queued);

    let stored = observations(&store, A, "t").await;
    assert_eq!(seqs(&stored), [1, 2], "gap-free, nothing from the losers");
    let resumed = of_type(&stored, ObservationType::AgentResumed);
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0].content["reason"], decision["reason"]);
    assert_eq!(resumed, done.observations);
}

async fn resolving_an_unknown_or_foreign_suspension_is_not_found(store: S) {
    let (_, f) = running(&store, A, "t").await;
    let s = suspend(&store, A, "t", f).await;
    let approve = || resolution(json!({ "decision": "approve" }));
    let err = store
        .resolve_suspension(A, new_id(), approve())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::SuspensionNotFound), "{err:?}");
    let err = store
        .resolve_suspension(B, s.suspension_id, approve())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::SuspensionNotFound), "{err:?}");
    let stored = store
        .get_suspension(A, s.suspension_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, SuspensionStatus::Pending);
    assert_eq!(seqs(&observations(&store, A, "t").await), [1]);
    assert!(
        store
            .list_suspensions(B, &tid("t"), true)
            .await
            .unwrap()
            .is_none()
    );
}

async fn resolving_a_suspension_that_is_no_longer_pending_conflicts(store: S) {
    // Suspend all three first: a resumed run would be claimed before a later thread's.
    let (_, f) = running(&store, A, "t").await;
    let resolved = suspend(&store, A, "t", f).await;
    let (run, g) = running(&store, A, "u").await;
    let cancelled = suspend(&store, A, "u", g).await;
    let (_, h) = running(&store, A, "v").await;
    let pending = suspend(&store, A, "v", h).await;
    // A pending suspension whose run never moved to `suspended` (its run stays running).
    let (orphan_run, w) = running(&store, A, "w").await;
    let orphan = suspension(A, "w", orphan_run.run_id, "step-1");
    let mut b = batch(A, "w");
    b.op(Op::InsertSuspension(Box::new(orphan.clone())));
    apply(&store, w, b).await;

    // Already resolved.
    store
        .resolve_suspension(
            A,
            resolved.suspension_id,
            resolution(json!({ "decision": "reject" })),
        )
        .await
        .unwrap();
    for again in [resolution(json!({ "decision": "approve" })), expiry()] {
        match store
            .resolve_suspension(A, resolved.suspension_id, again)
            .await
        {
            Err(StoreError::Conflict(msg)) => assert_eq!(msg, "suspension already resolved"),
            other => panic!("expected Conflict, got {other:?}"),
        }
    }
    let stored = store
        .get_suspension(A, resolved.suspension_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        decision_json(&stored.decision),
        Some(json!({ "decision": "reject" }))
    );
    assert_eq!(seqs(&observations(&store, A, "t").await), [1, 2]);

    // Cancelled with its run.
    store.cancel_run(A, &tid("u"), run.run_id).await.unwrap();
    match store
        .resolve_suspension(
            A,
            cancelled.suspension_id,
            resolution(json!({ "decision": "approve" })),
        )
        .await
    {
        Err(StoreError::Conflict(msg)) => assert_eq!(msg, "suspension already cancelled"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    let got = store
        .get_run(A, &tid("u"), run.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.status, RunStatus::Cancelled);
    assert_eq!(seqs(&observations(&store, A, "u").await), [1, 2]);

    // Neither pending nor cancelled are resolutions.
    for status in [SuspensionStatus::Pending, SuspensionStatus::Cancelled] {
        let r = Resolution {
            status,
            decision: ResumeDecision::Approve {
                reason: None,
                raise_by: None,
            },
            trace_context: None,
        };
        let err = store
            .resolve_suspension(A, pending.suspension_id, r)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    }
    let stored = store
        .get_suspension(A, pending.suspension_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, SuspensionStatus::Pending);
    assert_eq!(seqs(&observations(&store, A, "v").await), [1]);

    // Its run is still running (busy with other items): the decision is recorded, the run stays
    // as it is and reads it when it next looks.
    let resolved = store
        .resolve_suspension(
            A,
            orphan.suspension_id,
            resolution(json!({ "decision": "approve" })),
        )
        .await
        .unwrap();
    assert_eq!(resolved.run.status, RunStatus::Running);
    assert_eq!(resolved.suspension.status, SuspensionStatus::Resolved);
    assert_eq!(observations(&store, A, "w").await.len(), 1);
}

/// Parallel items: one item's suspension is decided while the run still works on another; when
/// the run then has nothing else to do, its suspend commit must not strand that decision.
async fn a_suspend_commit_queues_the_run_when_a_decision_came_meanwhile(store: S) {
    let (run, f) = running(&store, A, "p").await;
    // Item 1 waits for a person (the run goes on with other items).
    let s1 = suspension(A, "p", run.run_id, "step-1");
    let mut b = batch(A, "p");
    b.op(Op::InsertSuspension(Box::new(s1.clone())));
    apply(&store, f, b).await;
    // The person answers while the run is still running.
    let resolved = store
        .resolve_suspension(
            A,
            s1.suspension_id,
            resolution(json!({"decision": "approve"})),
        )
        .await
        .unwrap();
    assert_eq!(resolved.run.status, RunStatus::Running);
    // Item 2 waits too, and nothing else can proceed: the run believes both are pending.
    let s2 = suspension(A, "p", run.run_id, "step-2");
    let mut b = batch(A, "p");
    b.op(Op::InsertSuspension(Box::new(s2.clone())))
        .op(Op::UpdateRun(RunUpdate {
            status: Some(RunStatus::Suspended),
            unless_decided: vec![s1.suspension_id, s2.suspension_id],
            ..Default::default()
        }));
    apply(&store, f, b).await;
    let got = store
        .get_run(A, &tid("p"), run.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        got.status,
        RunStatus::Queued,
        "the decision must be read, not stranded"
    );
    // Claimed again, it finds s2 still pending and suspends for real.
    let again = claim(&store).await;
    assert_eq!(again.run_id, run.run_id);
    let f2 = fence(&again);
    let mut b = batch(A, "p");
    b.op(Op::UpdateRun(RunUpdate {
        status: Some(RunStatus::Suspended),
        unless_decided: vec![s2.suspension_id],
        ..Default::default()
    }));
    apply(&store, f2, b).await;
    let got = store
        .get_run(A, &tid("p"), run.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.status, RunStatus::Suspended);
}

async fn resolving_while_cancelling_neither_deadlocks_nor_loses_a_change(store: S) {
    for i in 0..10 {
        let thread = format!("t{i}");
        let (run, f) = running(&store, A, &thread).await;
        let s = suspend(&store, A, &thread, f).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let resolver = {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .resolve_suspension(
                        A,
                        s.suspension_id,
                        resolution(json!({ "decision": "approve" })),
                    )
                    .await
            })
        };
        let canceller = {
            let (store, thread) = (store.clone(), thread.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.cancel_run(A, &tid(&thread), run.run_id).await
            })
        };
        let resolved = resolver.await.unwrap();
        let cancelled = canceller
            .await
            .unwrap()
            .expect("a suspended or queued run cancels");
        assert_eq!(cancelled.run.status, RunStatus::Cancelled);
        let stored = store
            .get_suspension(A, s.suspension_id)
            .await
            .unwrap()
            .unwrap();
        let all = observations(&store, A, &thread).await;
        match resolved {
            // Resolved first, then the queued run was cancelled.
            Ok(_) => {
                assert_eq!(stored.status, SuspensionStatus::Resolved);
                assert_eq!(of_type(&all, ObservationType::AgentResumed).len(), 1);
            }
            Err(StoreError::Conflict(msg)) => {
                assert_eq!(msg, "suspension already cancelled");
                assert_eq!(stored.status, SuspensionStatus::Cancelled);
                assert!(of_type(&all, ObservationType::AgentResumed).is_empty());
            }
            Err(e) => panic!("expected Ok or Conflict, got {e:?}"),
        }
        assert_eq!(of_type(&all, ObservationType::RunCancelled).len(), 1);
        assert_eq!(
            seqs(&all),
            (1..=i64::try_from(all.len()).unwrap()).collect::<Vec<_>>()
        );
    }
}

async fn an_expired_suspension_resumes_its_run_as_expired(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let s = suspend(&store, A, "t", f).await;
    let done = store
        .resolve_suspension(A, s.suspension_id, expiry())
        .await
        .unwrap();
    assert_eq!(done.suspension.status, SuspensionStatus::Expired);
    assert_eq!(done.suspension.decision, Some(expiry().decision));
    assert_eq!(done.run.status, RunStatus::Queued);
    let o = &done.observations[0];
    assert_eq!(o.kind, ObservationType::AgentResumed);
    assert_eq!(o.title, "Suspension expired");
    assert_eq!(o.run_id, Some(run.run_id));
    assert_eq!(o.parent_id.as_deref(), Some("step-1"));
    assert_eq!(
        o.content,
        json!({
            "suspensionId": s.suspension_id,
            "decision": "reject",
            "reason": "expired",
            "expired": true,
        })
    );
    let stored = store
        .get_suspension(A, s.suspension_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, SuspensionStatus::Expired);

    // No reason given: null.
    let again = claim(&store).await;
    let s2 = suspend(&store, A, "t", fence(&again)).await;
    let done = store
        .resolve_suspension(
            A,
            s2.suspension_id,
            resolution(json!({ "decision": "respond", "response": "an answer" })),
        )
        .await
        .unwrap();
    assert_eq!(done.observations[0].title, "Resumed: respond");
    assert_eq!(done.observations[0].content["reason"], json!(null));
    assert_eq!(done.observations[0].content["expired"], json!(false));
}

async fn due_suspensions_are_pending_and_past_their_expiry(store: S) {
    let t = now();
    let ago = |mins: i64| Some(t - chrono::Duration::minutes(mins));
    let (_, f) = running(&store, A, "recent").await;
    let recent = suspend_until(&store, A, "recent", f, ago(10)).await;
    let (_, f) = running(&store, A, "oldest").await;
    let oldest = suspend_until(&store, A, "oldest", f, ago(60)).await;
    let (_, f) = running(&store, A, "future").await;
    suspend_until(&store, A, "future", f, Some(t + chrono::Duration::hours(1))).await;
    let (_, f) = running(&store, A, "never").await;
    suspend_until(&store, A, "never", f, None).await;
    let (_, f) = running(&store, B, "other").await;
    let other = suspend_until(&store, B, "other", f, ago(30)).await;
    let (_, f) = running(&store, A, "resolved").await;
    let resolved = suspend_until(&store, A, "resolved", f, ago(90)).await;
    let (cancelled_run, f) = running(&store, A, "cancelled").await;
    suspend_until(&store, A, "cancelled", f, ago(120)).await;
    store
        .resolve_suspension(A, resolved.suspension_id, expiry())
        .await
        .unwrap();
    store
        .cancel_run(A, &tid("cancelled"), cancelled_run.run_id)
        .await
        .unwrap();

    let due = store.due_suspensions(0).await.unwrap();
    assert_eq!(
        due,
        vec![
            (A.to_owned(), oldest.suspension_id),
            (B.to_owned(), other.suspension_id),
            (A.to_owned(), recent.suspension_id),
        ],
        "oldest expiry first, every tenant"
    );
    assert_eq!(store.due_suspensions(2).await.unwrap(), due[..2].to_vec());
    assert_eq!(store.due_suspensions(1).await.unwrap(), due[..1].to_vec());

    store
        .resolve_suspension(A, oldest.suspension_id, expiry())
        .await
        .unwrap();
    assert_eq!(store.due_suspensions(0).await.unwrap(), due[1..].to_vec());
}

async fn a_threads_suspensions_list_every_status_oldest_first(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let s1 = suspend(&store, A, "t", f).await;
    store
        .resolve_suspension(
            A,
            s1.suspension_id,
            resolution(json!({ "decision": "approve" })),
        )
        .await
        .unwrap();
    let again = claim(&store).await;
    let s2 = suspend(&store, A, "t", fence(&again)).await;
    store
        .resolve_suspension(A, s2.suspension_id, expiry())
        .await
        .unwrap();
    let again = claim(&store).await;
    let s3 = suspend(&store, A, "t", fence(&again)).await;
    // Another run's suspension on another thread stays out.
    let (_, g) = running(&store, A, "u").await;
    suspend(&store, A, "u", g).await;

    let list = store
        .list_suspensions(A, &tid("t"), true)
        .await
        .unwrap()
        .unwrap();
    let got: Vec<(Uuid, SuspensionStatus)> =
        list.iter().map(|s| (s.suspension_id, s.status)).collect();
    assert_eq!(
        got,
        vec![
            (s1.suspension_id, SuspensionStatus::Resolved),
            (s2.suspension_id, SuspensionStatus::Expired),
            (s3.suspension_id, SuspensionStatus::Pending),
        ]
    );
    assert_eq!(
        decision_json(&list[0].decision),
        Some(json!({ "decision": "approve" }))
    );
    assert_eq!(list[2], s3);

    store.cancel_run(A, &tid("t"), run.run_id).await.unwrap();
    let list = store
        .list_suspensions(A, &tid("t"), true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(list.len(), 3);
    assert_eq!(list[2].status, SuspensionStatus::Cancelled);
    assert!(
        store
            .list_suspensions(B, &tid("t"), true)
            .await
            .unwrap()
            .is_none()
    );

    let all = observations(&store, A, "t").await;
    assert_eq!(of_type(&all, ObservationType::AgentResumed).len(), 2);
    assert_eq!(
        seqs(&all),
        (1..=i64::try_from(all.len()).unwrap()).collect::<Vec<_>>()
    );
}

async fn ready_after_migrate_and_migrate_is_idempotent(store: S) {
    store.ready().await.unwrap();
    store.migrate().await.unwrap();
    store.ready().await.unwrap();
}

// ----- the two backends ------------------------------------------------------------------------

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

conformance!(
    thread_round_trips_through_create_get_update_delete,
    one_heartbeat_renews_many_leases_and_reports_lost_ones,
    concurrent_commits_of_many_runs_fail_only_the_stale_one,
    duplicate_thread_id_is_rejected,
    threads_of_one_tenant_are_invisible_to_another,
    threads_list_newest_first_with_a_cursor,
    same_idempotency_key_returns_the_same_run,
    reject_strategy_refuses_a_busy_thread,
    enqueued_runs_wait_for_the_active_one,
    create_run_creates_a_missing_thread_only_when_asked,
    interrupt_cancels_queued_and_flags_running_runs,
    interrupt_cancels_a_suspended_run_and_its_suspension,
    claim_takes_the_oldest_queued_run_of_each_thread,
    concurrent_claimers_never_run_two_runs_of_one_thread,
    a_suspended_run_blocks_its_thread,
    an_expired_lease_is_reclaimed_with_the_next_attempt,
    a_released_run_goes_back_to_the_queue,
    a_stale_fence_writes_nothing,
    an_ended_run_refuses_further_writes,
    apply_assigns_gap_free_seqs_per_thread,
    concurrent_applies_never_leave_gaps_or_duplicates,
    observations_filter_by_after_limit_type_parent_and_run,
    cancelling_a_queued_run_ends_it_with_an_observation,
    cancelling_a_running_run_flags_it_for_the_worker,
    cancelling_a_suspended_run_cancels_its_suspension,
    cancelling_unknown_or_finished_runs_fails,
    agent_snapshot_reflects_items_and_state,
    messages_list_oldest_first_with_a_cursor,
    runs_list_newest_first_with_a_cursor,
    tenant_runs_are_found_by_id_and_listed_across_threads,
    deleting_a_thread_removes_everything_it_owns,
    thread_status_follows_its_runs,
    mixed_writers_of_one_thread_neither_deadlock_nor_leave_gaps,
    resolving_a_suspension_requeues_its_run_with_an_observation,
    a_run_keeps_its_trace_context_unless_a_resume_brings_one,
    the_backlog_counts_queued_runs_and_pending_suspensions,
    concurrent_resolvers_of_one_suspension_get_one_success,
    resolving_an_unknown_or_foreign_suspension_is_not_found,
    resolving_a_suspension_that_is_no_longer_pending_conflicts,
    a_suspend_commit_queues_the_run_when_a_decision_came_meanwhile,
    resolving_while_cancelling_neither_deadlocks_nor_loses_a_change,
    an_expired_suspension_resumes_its_run_as_expired,
    due_suspensions_are_pending_and_past_their_expiry,
    a_threads_suspensions_list_every_status_oldest_first,
    ready_after_migrate_and_migrate_is_idempotent,
);

// ----- backend-specific ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_replicas_migrating_at_once_both_succeed() {
    use pes_server::store::postgres::PgStore;
    let url = crate::db::fresh_postgres_url().await;
    let one = PgStore::connect(&url, 2).await.unwrap();
    let two = PgStore::connect(&url, 2).await.unwrap();
    assert!(one.ready().await.is_err(), "not ready before migrating");
    let (a, b) = tokio::join!(one.migrate(), two.migrate());
    a.unwrap();
    b.unwrap();
    one.ready().await.unwrap();
    two.ready().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_claim_never_jumps_a_locked_older_run_of_the_thread() {
    let pg = crate::db::postgres_store().await;
    let pool = pg.pg_pool().expect("a Postgres store").clone();
    let store: S = Arc::new(pg);
    let r1 = enqueue(&store, A, "t").await;
    let r2 = enqueue(&store, A, "t").await;
    // Someone (a cancel, an interrupt) holds the oldest run's row lock.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE")
        .bind(r1.run_id)
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(
        store.claim_run("w", LEASE).await.unwrap().is_none(),
        "the newer run must not be claimed while the older one is locked"
    );
    tx.rollback().await.unwrap();
    assert_eq!(claim(&store).await.run_id, r1.run_id);
    let _ = r2;
}

#[tokio::test]
async fn sqlite_creates_the_file_and_its_folder() {
    use pes_server::store::sqlite::SqliteStore;
    let (url, dir) = crate::db::fresh_sqlite_location();
    assert!(!dir.0.exists());
    let store = SqliteStore::connect(&url).await.unwrap();
    assert!(store.ready().await.is_err(), "not ready before migrating");
    store.migrate().await.unwrap();
    store.ready().await.unwrap();
    assert!(dir.0.join("data").join("pes.db").exists());
    // Data survives reopening.
    let store: S = Arc::new(store);
    thread(&store, A, "kept").await;
    drop(store);
    let reopened = SqliteStore::connect(&url).await.unwrap();
    reopened.migrate().await.unwrap();
    assert!(
        reopened
            .get_thread(A, &tid("kept"))
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn sqlite_accepts_relative_and_in_memory_urls() {
    use pes_server::store::sqlite::SqliteStore;
    let memory: S = Arc::new(SqliteStore::connect("sqlite::memory:").await.unwrap());
    memory.migrate().await.unwrap();
    let (_, f) = running(&memory, A, "t").await;
    let mut b = batch(A, "t");
    b.observe(obs(f.run_id, ObservationType::RunStarted, None));
    assert_eq!(
        seqs(&memory.apply(f, LEASE, b).await.unwrap().observations),
        [1]
    );
    assert_eq!(observations(&memory, A, "t").await.len(), 1);

    // A relative path is relative to the working directory (the package root under cargo).
    let rel = format!("target/pes-test-{}/nested/rel.db", Uuid::new_v4().simple());
    let store = SqliteStore::connect(&format!("sqlite://{rel}"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    assert!(std::path::Path::new(&rel).exists());
    drop(store);
    let top = std::path::Path::new(&rel)
        .parent()
        .unwrap()
        .parent()
        .unwrap();
    let _ = std::fs::remove_dir_all(top);
}
