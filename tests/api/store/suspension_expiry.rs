//! Suspension expiry and listing: an expired suspension resumes its run as expired, which ones
//! are due, and a thread's suspensions in every status.

use super::*;

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

crate::conformance!(
    an_expired_suspension_resumes_its_run_as_expired,
    due_suspensions_are_pending_and_past_their_expiry,
    a_threads_suspensions_list_every_status_oldest_first,
);
