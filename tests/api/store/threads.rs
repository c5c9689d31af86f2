//! Threads: create, read, update and delete, tenant isolation, listing, deleting everything a
//! thread owns, and the thread status its runs imply.

use super::*;

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

crate::conformance!(
    thread_round_trips_through_create_get_update_delete,
    duplicate_thread_id_is_rejected,
    threads_of_one_tenant_are_invisible_to_another,
    threads_list_newest_first_with_a_cursor,
    deleting_a_thread_removes_everything_it_owns,
    thread_status_follows_its_runs,
);
