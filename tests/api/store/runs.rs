//! Creating runs (idempotency keys, multitask strategies, creating a missing thread) and listing
//! them, per thread and across a tenant's threads.

use super::*;

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

crate::conformance!(
    same_idempotency_key_returns_the_same_run,
    reject_strategy_refuses_a_busy_thread,
    enqueued_runs_wait_for_the_active_one,
    create_run_creates_a_missing_thread_only_when_asked,
    interrupt_cancels_queued_and_flags_running_runs,
    interrupt_cancels_a_suspended_run_and_its_suspension,
    runs_list_newest_first_with_a_cursor,
    tenant_runs_are_found_by_id_and_listed_across_threads,
);
