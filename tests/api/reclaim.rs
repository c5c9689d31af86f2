//! Taking back abandoned runs: after a `kill -9` with many runs in flight, every run is claimed
//! again as soon as its lease expires — all of them at once, not one per poll — on both stores;
//! and the multi-run claim underneath ([`SqlStore::claim_runs`]), store by store.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pes_server::model::{AgentConfig, MultitaskStrategy, Run, RunStatus, ThreadId};
use pes_server::store::{NewRun, SqlStore};
use serde_json::json;

use crate::both_stores;
use crate::fake_llm::FakeLlm;
use crate::helpers::Backend;
use crate::process::{Proc, env_for};

/// Runs in flight when the process dies.
const RUNS: usize = 8;
/// The lease, in seconds.
const LEASE: u64 = 2;
/// The worker's poll, far longer than the lease: a poll must not be what finds abandoned runs.
const POLL_MS: u64 = 10_000;
/// How long after its lease may run out a run may wait to be claimed again.
const SLACK: Duration = Duration::from_millis(1500);

/// The query of run `i`, which its model requests carry.
fn marker(i: usize) -> String {
    format!("reclaim-run-{i}-of-{RUNS}")
}

/// 8 runs in flight (each held in its plan call by the fake model), `kill -9`, restart: every
/// run is taken back (its model call is made again) within the lease + 1.5 s of the kill, and
/// every run completes on its second attempt. The worker polls only every 10 s (five leases), so
/// the runs come back only if the worker wakes for the lease expiry itself.
async fn every_abandoned_run_is_reclaimed_within_a_lease(backend: Backend) {
    let llm = FakeLlm::start().await;
    llm.hold();
    let db = crate::helpers::database_url(backend).await;
    let mut env = env_for(&db, &llm.url);
    env.push(("PES_LEASE_SECONDS", LEASE.to_string()));
    env.push(("PES_POLL_INTERVAL_MS", POLL_MS.to_string()));
    let p1 = Proc::start(&env).await;
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let (s, run) = p1
            .post(
                &format!("/v1/threads/t{i}/runs"),
                json!({"query": marker(i), "ifNotExists": "create"}),
            )
            .await;
        assert_eq!(s, 202, "{run}");
        let path = format!("/v1/threads/t{i}/runs/{}", run["runId"].as_str().unwrap());
        runs.push(path);
    }
    // Every run is running, in its (held) plan call.
    let deadline = Instant::now() + Duration::from_secs(30);
    while llm.requests().len() < RUNS {
        assert!(
            Instant::now() < deadline,
            "the runs never all reached the model"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for path in &runs {
        let (_, r) = p1.get(path).await;
        assert_eq!(r["status"], "running", "{r}");
        assert_eq!(r["attempt"], 1, "{r}");
    }
    p1.kill9().await;
    let killed = Instant::now();
    llm.release();

    let p2 = Proc::start(&env).await;
    // A run has been taken back once its model call reaches the fake model again.
    let deadline = killed + Duration::from_secs(60);
    let reclaimed = loop {
        let again: Vec<Option<Duration>> = (0..RUNS)
            .map(|i| {
                llm.requests_timed()
                    .into_iter()
                    .find(|(at, r)| *at > killed && r.to_string().contains(&marker(i)))
                    .map(|(at, _)| at - killed)
            })
            .collect();
        if again.iter().all(Option::is_some) {
            break again;
        }
        assert!(
            Instant::now() < deadline,
            "runs never taken back: {again:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let mut times: Vec<Duration> = reclaimed.into_iter().flatten().collect();
    times.sort();
    let shown: Vec<String> = times
        .iter()
        .map(|d| format!("{:.2}", d.as_secs_f64()))
        .collect();
    eprintln!(
        "{backend:?}: re-claimed at {} s after the kill",
        shown.join(", ")
    );
    let bound = Duration::from_secs(LEASE) + SLACK;
    assert!(
        times.iter().all(|t| *t <= bound),
        "every run is re-claimed within the lease + {SLACK:?} of the kill; \
         re-claimed at {shown:?} s"
    );
    for path in &runs {
        let done = p2.wait_for(path, |r| r["status"] == "completed").await;
        assert_eq!(
            done["attempt"], 2,
            "claimed once more, then completed: {done}"
        );
    }
    p2.kill9().await;
}
both_stores!(
    reclaim_after_kill_9,
    every_abandoned_run_is_reclaimed_within_a_lease
);

/// Three runs wait on the model for two and a half leases: the worker's one heartbeat for all its runs
/// keeps every lease, so no run is taken back or repeated (each completes on attempt 1, and the
/// service counts no lost lease).
async fn runs_waiting_longer_than_their_lease_keep_it(backend: Backend) {
    let llm = FakeLlm::start().await;
    llm.hold();
    let mut config =
        crate::helpers::test_config(&crate::helpers::database_url(backend).await, Some(&llm));
    // A 2 s lease renewed every 250 ms: a beat may come 1.75 s late (a loaded CI machine) and
    // still keep it.
    config.lease_seconds = 2;
    config.heartbeat_ms = Some(250);
    config.llm_timeout_seconds = 30;
    let app = crate::helpers::spawn_config(config).await;
    let runs = post_runs(&app, "w", 3).await;
    llm.wait_in_flight(3).await;
    // Two and a half leases pass while every run waits on its (held) plan call.
    tokio::time::sleep(Duration::from_secs(5)).await;
    llm.release();
    for (thread, run_id) in &runs {
        let done = app
            .wait_run(thread, run_id, |r| r["status"] == "completed")
            .await;
        assert_eq!(done["attempt"], 1, "the lease was kept: {done}");
    }
    let (_, metrics) = app.get("/metrics").await;
    let text = metrics
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| metrics.to_string());
    assert!(
        text.contains("pes_leases_lost_total 0"),
        "no lease was lost: {text}"
    );
    app.stop().await;
}
both_stores!(heartbeats, runs_waiting_longer_than_their_lease_keep_it);

// ----- the claim, store by store -----------------------------------------------------------------

type S = Arc<SqlStore>;

async fn enqueue(store: &S, thread: &str) -> Run {
    store
        .create_run(NewRun {
            tenant: "a".into(),
            thread_id: ThreadId::parse(thread).unwrap(),
            query: "q".into(),
            config: AgentConfig::default(),
            strategy: MultitaskStrategy::Enqueue,
            idempotency_key: None,
            create_thread: true,
            trace_context: None,
            assistant: None,
            cron_id: None,
            flowchart: None,
        })
        .await
        .unwrap()
        .run
}

/// Runs (one per thread) claimed by a worker that then died: their leases have run out already.
/// Call it before anything else is queued.
async fn abandoned(store: &S, threads: &[&str]) -> Vec<Run> {
    let mut queued = Vec::new();
    for t in threads {
        queued.push(enqueue(store, t).await.run_id);
    }
    let claim = store
        .claim_runs("dead", Duration::ZERO, threads.len())
        .await
        .unwrap();
    let mut claimed: Vec<_> = claim.runs.iter().map(|r| r.run_id).collect();
    claimed.sort();
    queued.sort();
    assert_eq!(claimed, queued);
    claim.runs
}

/// One claim fills every free slot: expired leases first (earliest first), then the oldest queued
/// run of each free thread; it says when the next lease runs out, so an idle worker knows when to
/// look again; and it never takes a live lease or a second run of a busy thread.
async fn one_claim_takes_expired_then_queued_runs_up_to_max(store: S) {
    let empty = store.claim_runs("w", LEASE_30, 8).await.unwrap();
    assert!(empty.runs.is_empty());
    assert_eq!(
        empty.next_expiry, None,
        "no run is running: nothing to wake for"
    );

    let live = enqueue(&store, "live").await;
    assert_eq!(
        store.claim_runs("live", LEASE_30, 1).await.unwrap().runs[0].run_id,
        live.run_id
    );
    let dead = abandoned(&store, &["e1", "e2"]).await;
    let q1 = enqueue(&store, "q1").await;
    let q1_next = enqueue(&store, "q1").await;
    let q2 = enqueue(&store, "q2").await;
    let q3 = enqueue(&store, "q3").await;

    let first = store.claim_runs("w", LEASE_30, 3).await.unwrap();
    let ids: Vec<_> = first.runs.iter().map(|r| r.run_id).collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(
        ids[..2].iter().collect::<HashSet<_>>(),
        dead.iter().map(|r| &r.run_id).collect(),
        "expired leases first"
    );
    assert_eq!(ids[2], q1.run_id, "then the oldest queued run");
    for run in &first.runs {
        assert_eq!(run.status, RunStatus::Running);
    }
    assert_eq!(
        first.taken_over, 2,
        "two leases were taken over (pes_lease_takeovers_total)"
    );
    assert_eq!(first.runs[0].attempt, 2, "a re-claim bumps the attempt");
    assert_eq!(first.runs[2].attempt, 1);
    let next = first
        .next_expiry
        .expect("the live run's lease runs out later");
    assert!(
        next <= LEASE_30 && next > LEASE_30 - Duration::from_secs(10),
        "{next:?}"
    );

    // Fewer than asked: q1's next run waits for q1, and the live lease is not taken.
    let second = store.claim_runs("w", LEASE_30, 8).await.unwrap();
    let ids: HashSet<_> = second.runs.iter().map(|r| r.run_id).collect();
    assert_eq!(ids, [q2.run_id, q3.run_id].into_iter().collect());
    assert_eq!(second.taken_over, 0, "queued runs are not take-overs");
    assert!(second.next_expiry.is_some_and(|d| d <= LEASE_30));
    let third = store.claim_runs("w", LEASE_30, 8).await.unwrap();
    assert!(third.runs.is_empty(), "{:?}", third.runs);
    let _ = q1_next;
}

/// Claimers taking several runs each, all at once, still never run two runs of one thread and
/// never claim one run twice.
async fn concurrent_multi_claims_never_run_two_runs_of_one_thread(store: S) {
    abandoned(&store, &["x0", "x1", "x2", "x3"]).await;
    for t in 0..6 {
        for _ in 0..3 {
            enqueue(&store, &format!("t{t}")).await;
        }
    }
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let claim = store
                    .claim_runs(&format!("w{i}"), LEASE_30, 3)
                    .await
                    .unwrap();
                if claim.runs.is_empty() && claim.next_expiry != Some(Duration::ZERO) {
                    return got;
                }
                got.extend(claim.runs);
            }
        }));
    }
    let mut claimed = Vec::new();
    for t in tasks {
        claimed.extend(t.await.unwrap());
    }
    let threads: HashSet<String> = claimed.iter().map(|r| r.thread_id.to_string()).collect();
    assert_eq!(claimed.len(), 10, "one run per thread: {claimed:?}");
    assert_eq!(threads.len(), 10);
}

const LEASE_30: Duration = Duration::from_secs(30);

crate::conformance!(
    one_claim_takes_expired_then_queued_runs_up_to_max,
    concurrent_multi_claims_never_run_two_runs_of_one_thread,
);

/// With `PES_LLM_MAX_IN_FLIGHT=2`, four runs that all want the model at once send it two calls
/// at a time: the others wait their turn (they do not fail), and every run completes.
async fn model_calls_in_flight_are_capped(backend: Backend) {
    let llm = FakeLlm::start().await;
    llm.hold();
    let mut config =
        crate::helpers::test_config(&crate::helpers::database_url(backend).await, Some(&llm));
    config.llm_max_in_flight = 2;
    let app = crate::helpers::spawn_config(config).await;
    let runs = post_runs(&app, "c", 4).await;
    llm.wait_in_flight(2).await;
    for (thread, run_id) in &runs {
        app.wait_run(thread, run_id, |r| r["status"] == "running")
            .await;
    }
    // Every run is running and wants its plan; uncapped, all four calls would arrive now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(llm.in_flight(), 2, "two calls at a time");
    llm.release();
    for (thread, run_id) in &runs {
        app.wait_run(thread, run_id, |r| r["status"] == "completed")
            .await;
    }
    assert_eq!(llm.peak_in_flight(), 2, "never more than two at once");
    app.stop().await;
}
both_stores!(capped, model_calls_in_flight_are_capped);

/// Post one run on each of `n` new threads `{prefix}0`, `{prefix}1`, …: their (thread, run id).
async fn post_runs(app: &crate::helpers::TestApp, prefix: &str, n: usize) -> Vec<(String, String)> {
    let mut runs = Vec::new();
    for i in 0..n {
        let thread = format!("{prefix}{i}");
        let (s, run) = app
            .post(
                &format!("/v1/threads/{thread}/runs"),
                json!({"query": format!("{thread} query"), "ifNotExists": "create"}),
            )
            .await;
        assert_eq!(s, 202, "{run}");
        runs.push((thread, run["runId"].as_str().unwrap().to_owned()));
    }
    runs
}
