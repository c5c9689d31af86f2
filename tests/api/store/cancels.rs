//! Cancelling runs: queued ones end at once, running ones are flagged for their worker, suspended
//! ones take their suspension with them, and unknown or finished ones refuse.

use super::*;

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

crate::conformance!(
    cancelling_a_queued_run_ends_it_with_an_observation,
    cancelling_a_running_run_flags_it_for_the_worker,
    cancelling_a_suspended_run_cancels_its_suspension,
    cancelling_unknown_or_finished_runs_fails,
);
