//! Store conformance suite: every case is written once against `Arc<SqlStore>` and runs on
//! Postgres and on SQLite (`<concept>::postgres::<case>` and `<concept>::sqlite::<case>`, through
//! `crate::conformance!`), each on a fresh database. This module holds the cases' shared helpers;
//! one submodule per concept holds the cases.

mod backends;
mod cancels;
mod leases;
mod observations;
mod runs;
mod state;
mod suspension_expiry;
mod suspension_races;
mod suspensions;
mod threads;

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

// ----- suspensions ----------------------------------------------------------------------------

/// A resolution by a person, the decision written as its stored JSON.
fn resolution(decision: serde_json::Value) -> Resolution {
    Resolution {
        status: SuspensionStatus::Resolved,
        decision: serde_json::from_value(decision).expect("a decision in its stored shape"),
        trace_context: None,
    }
}

/// The resolution the expiry sweeper writes.
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

/// The observations of one type, in order.
fn of_type(
    list: &[pes_server::model::Observation],
    kind: ObservationType,
) -> Vec<pes_server::model::Observation> {
    list.iter().filter(|o| o.kind == kind).cloned().collect()
}
