//! A thread's observation log: gap-free seqs per thread under concurrent and mixed writers, a
//! stale commit failing alone, and the log's filters.

use super::*;

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

crate::conformance!(
    apply_assigns_gap_free_seqs_per_thread,
    concurrent_commits_of_many_runs_fail_only_the_stale_one,
    concurrent_applies_never_leave_gaps_or_duplicates,
    observations_filter_by_after_limit_type_parent_and_run,
    mixed_writers_of_one_thread_neither_deadlock_nor_leave_gaps,
);
