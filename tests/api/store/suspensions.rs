//! Resolving suspensions: a decision requeues its run, trace context across a resume, the backlog
//! `/metrics` reads, and resolutions of unknown, foreign or no-longer-pending suspensions.

use super::*;

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

crate::conformance!(
    resolving_a_suspension_requeues_its_run_with_an_observation,
    a_run_keeps_its_trace_context_unless_a_resume_brings_one,
    the_backlog_counts_queued_runs_and_pending_suspensions,
    resolving_an_unknown_or_foreign_suspension_is_not_found,
    resolving_a_suspension_that_is_no_longer_pending_conflicts,
);
