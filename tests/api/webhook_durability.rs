//! Webhooks across crashes: kill -9 of the real binary between a run's end and its delivery, and
//! the store's side on both stores: the outbox row commits with the run's end and only then, and a
//! claimed delivery is one replica's until its outcome.

use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::FakeLlm;
use crate::helpers::Backend;
use crate::process::{Proc, env_for};
use crate::webhooks::{Receiver, SECRET, python, wait_received};

/// kill -9 after a run ended and before its webhook got through (the receiver was down): the
/// next process delivers it, once, with the outbox row the run's end committed; a run killed
/// before it ended has no delivery.
async fn kill_9_between_a_runs_end_and_its_delivery(backend: Backend) {
    let Some(py) = python() else { return };
    let llm = FakeLlm::start().await;
    llm.hold_if(|r| r.to_string().contains("never ends"));
    let db = crate::helpers::database_url(backend).await;
    // A port nothing listens on yet: the first process's attempts are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let hook = json!({"url": format!("http://127.0.0.1:{port}/hook")});
    let mut env = env_for(&db, &llm.url);
    env.extend([
        ("PES_WEBHOOK_SECRET", SECRET.to_owned()),
        ("PES_WEBHOOK_ALLOW", "127.0.0.1".to_owned()),
        ("PES_WEBHOOK_RETRY_BASE_MS", "100".to_owned()),
        ("PES_WEBHOOK_POLL_MS", "50".to_owned()),
        ("PES_WEBHOOK_MAX_ATTEMPTS", "100".to_owned()),
    ]);
    let p1 = Proc::start(&env).await;
    let (st, ended) = p1
        .post(
            "/v1/threads/a/runs/wait",
            json!({"query": "What is 2+2?", "ifNotExists": "create", "webhook": hook}),
        )
        .await;
    assert_eq!(st, 200, "{ended}");
    assert_eq!(ended["status"], "completed");
    let ended_id = ended["runId"].as_str().unwrap().to_owned();
    let (st, running) = p1
        .post(
            "/v1/threads/b/runs",
            json!({"query": "this never ends", "ifNotExists": "create", "webhook": hook}),
        )
        .await;
    assert_eq!(st, 202, "{running}");
    let running_id = running["runId"].as_str().unwrap().to_owned();
    llm.wait_for_request(|r| r.to_string().contains("never ends"))
        .await;
    // The ended run's delivery was tried and refused: it has not been delivered.
    let pending = p1
        .wait_for(&format!("/v1/webhook-deliveries?runId={ended_id}"), |p| {
            p["items"][0]["attempts"].as_i64().unwrap_or(0) >= 1
        })
        .await;
    assert_eq!(pending["items"][0]["status"], "pending", "{pending}");
    p1.kill9().await;

    let rx = Receiver::start(&py, "200", port).await;
    env.push(("PES_WORKER_CONCURRENCY", "0".to_owned()));
    let p2 = Proc::start(&env).await;
    let done = p2
        .wait_for(&format!("/v1/webhook-deliveries?runId={ended_id}"), |p| {
            p["items"][0]["status"] == "delivered"
        })
        .await;
    let id = done["items"][0]["deliveryId"].as_str().unwrap();
    let got = wait_received(&rx, |s| !s.is_empty()).await;
    assert_eq!(got.len(), 1, "delivered once: {got:?}");
    assert_eq!(got[0]["id"], id);
    assert_eq!(got[0]["verified"], true);
    assert_eq!(got[0]["runId"], ended_id.as_str());
    let (_, none) = p2
        .get(&format!("/v1/webhook-deliveries?runId={running_id}"))
        .await;
    assert!(
        none["items"].as_array().unwrap().is_empty(),
        "a run that did not end has no delivery: {none}"
    );
    let (_, run) = p2.get(&format!("/v1/threads/b/runs/{running_id}")).await;
    assert_eq!(run["status"], "running", "{run}");
    p2.kill9().await;
    llm.release();
}
both_stores!(kill_9_delivery, kill_9_between_a_runs_end_and_its_delivery);

/// The store's side, on both stores: the outbox row commits with the run's end and only then —
/// not under a lost lease, not for a commit that does not end the run, not for an event the
/// webhook does not want — and a claimed delivery is one replica's until its outcome.
async fn the_outbox_row_commits_with_the_runs_end_only(backend: Backend) {
    use pes_server::model::{AgentConfig, MultitaskStrategy, RunPhase, RunStatus, ThreadId};
    use pes_server::store::{
        Batch, DeliveryFilter, DeliveryOutcome, Fence, NewRun, Op, RunUpdate, StoreError,
    };
    let url = crate::helpers::database_url(backend).await;
    let store = pes_server::app::connect_store(&url, 5).await.unwrap();
    store.migrate().await.unwrap();
    let lease = Duration::from_secs(30);
    let enqueue = |thread: &'static str, hook: Value| {
        let store = store.clone();
        async move {
            let config: AgentConfig = serde_json::from_value(json!({"webhook": hook})).unwrap();
            store
                .create_run(NewRun {
                    tenant: "t".into(),
                    thread_id: ThreadId::parse(thread).unwrap(),
                    query: "q".into(),
                    config,
                    strategy: MultitaskStrategy::Enqueue,
                    idempotency_key: None,
                    create_thread: true,
                    assistant: None,
                    trace_context: None,
                    cron_id: None,
                    flowchart: None,
                })
                .await
                .unwrap()
                .run
        }
    };
    let end = |thread: &str, status: RunStatus| {
        let mut b = Batch::new("t", ThreadId::parse(thread).unwrap());
        b.op(Op::UpdateRun(RunUpdate {
            status: Some(status),
            phase: Some(RunPhase::Done),
            ended: true,
            ..RunUpdate::default()
        }));
        b
    };
    let all = || {
        let store = store.clone();
        async move {
            store
                .list_deliveries("t", &DeliveryFilter::default(), 0, None)
                .await
                .unwrap()
        }
    };

    let run = enqueue("a", json!({"url": "https://example.com/h"})).await;
    let claimed = store.claim_run("w", lease).await.unwrap().unwrap();
    assert_eq!(claimed.run_id, run.run_id);
    let f = Fence {
        run_id: run.run_id,
        attempt: claimed.attempt,
    };
    let mut not_yet = Batch::new("t", ThreadId::parse("a").unwrap());
    not_yet.op(Op::UpdateRun(RunUpdate {
        phase: Some(RunPhase::Planning),
        ..RunUpdate::default()
    }));
    store.apply(f, lease, not_yet).await.unwrap();
    let stale = Fence {
        attempt: f.attempt + 1,
        ..f
    };
    let lost = store
        .apply(stale, lease, end("a", RunStatus::Completed))
        .await;
    assert!(matches!(lost, Err(StoreError::LeaseLost)), "{lost:?}");
    assert!(all().await.is_empty(), "no row without the run's end");
    store
        .apply(f, lease, end("a", RunStatus::Completed))
        .await
        .unwrap();
    let rows = all().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].run_id, run.run_id);
    assert_eq!(rows[0].event.as_str(), "run.completed");
    assert_eq!(rows[0].url, "https://example.com/h");

    // A webhook that wants failures only: a completion writes nothing.
    let picky = enqueue(
        "b",
        json!({"url": "https://example.com/h", "events": ["run.failed"]}),
    )
    .await;
    let c = store.claim_run("w", lease).await.unwrap().unwrap();
    assert_eq!(c.run_id, picky.run_id);
    let fb = Fence {
        run_id: c.run_id,
        attempt: c.attempt,
    };
    store
        .apply(fb, lease, end("b", RunStatus::Completed))
        .await
        .unwrap();
    assert_eq!(all().await.len(), 1);

    // One claimer at a time; the outcome is fenced by the claim.
    let mine = store.claim_deliveries("r1", lease, 10).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(
        mine[0].run.status,
        RunStatus::Completed,
        "the run as its end left it"
    );
    assert_eq!(mine[0].run.run_id, run.run_id);
    assert_eq!(mine[0].delivery.attempts, 1);
    assert!(
        store
            .claim_deliveries("r2", lease, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let ok = DeliveryOutcome::Delivered { status_code: 204 };
    assert!(
        !store
            .finish_delivery(&mine[0], "r2", "{}", &ok)
            .await
            .unwrap()
    );
    assert!(
        store
            .finish_delivery(&mine[0], "r1", "{}", &ok)
            .await
            .unwrap()
    );
    assert!(
        !store
            .finish_delivery(&mine[0], "r1", "{}", &ok)
            .await
            .unwrap()
    );
    let rows = all().await;
    assert_eq!(rows[0].status.as_str(), "delivered");
    assert_eq!(rows[0].last_status_code, Some(204));
}
both_stores!(
    outbox_commits_with_the_end,
    the_outbox_row_commits_with_the_runs_end_only
);
