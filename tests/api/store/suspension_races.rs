//! Suspensions under races: concurrent resolvers, a decision arriving while the run commits its
//! suspension, and a resolution racing a cancel.

use super::*;

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

crate::conformance!(
    concurrent_resolvers_of_one_suspension_get_one_success,
    a_suspend_commit_queues_the_run_when_a_decision_came_meanwhile,
    resolving_while_cancelling_neither_deadlocks_nor_loses_a_change,
);
