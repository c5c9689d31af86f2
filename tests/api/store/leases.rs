//! Claiming runs and their leases: one run per thread at a time, expiry and reclaim, heartbeats,
//! release, and fences that keep a stale or ended run from writing.

use super::*;

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

crate::conformance!(
    claim_takes_the_oldest_queued_run_of_each_thread,
    concurrent_claimers_never_run_two_runs_of_one_thread,
    a_suspended_run_blocks_its_thread,
    an_expired_lease_is_reclaimed_with_the_next_attempt,
    one_heartbeat_renews_many_leases_and_reports_lost_ones,
    a_released_run_goes_back_to_the_queue,
    a_stale_fence_writes_nothing,
    an_ended_run_refuses_further_writes,
);
