//! Crons over real HTTP: their routes and checks per tenant, ticks on a thread and on a new thread
//! each (with `cronId` on the run and in `RUN_STARTED`), exactly one run per tick with two replicas
//! on one Postgres (each webhook delivered once), and ticks missed while no replica ran
//! (`run_once`: one run at start; `skip`: none).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use chrono::{DateTime, Datelike, Timelike, Utc};
use pes_server::config::Config;
use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{
    Backend, TestApp, database_url, read, send, spawn_config, spawn_with, test_config,
};
use crate::webhooks::{Receiver, hooks_on, python, wait_get, wait_received};

/// Ticks every second are allowed and looked for often.
fn fast_ticks(c: &mut Config) {
    c.cron_seconds = true;
    c.cron_poll_ms = 50;
}

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

/// Every run of a thread, oldest first.
async fn runs_of(app: &TestApp, thread: &str) -> Vec<Value> {
    let (st, page) = app
        .get(&format!("/v1/threads/{thread}/runs?limit=200"))
        .await;
    assert_eq!(st, 200, "{page}");
    let mut runs = page["items"].as_array().unwrap().clone();
    runs.reverse();
    runs
}

/// The tick a run was made for, from its idempotency key `cron:<id>:<tick>`.
fn tick_of(run: &Value, cron_id: &str) -> DateTime<Utc> {
    let key = run["idempotencyKey"]
        .as_str()
        .expect("a cron run has a key");
    let tick = key
        .strip_prefix(&format!("cron:{cron_id}:"))
        .unwrap_or_else(|| panic!("{key} names the cron"));
    at(tick)
}

/// Create, read, list, change and delete crons; bad schedules and time zones say what is wrong;
/// another tenant sees none of it.
async fn crons_are_checked_and_kept_per_tenant(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        c.api_keys = Some("ka:acme,kb:globex".into());
    })
    .await;
    let as_ = |key: &'static str, method: reqwest::Method, path: String, body: Option<Value>| {
        let app = &app;
        async move {
            let mut r = app.client.request(method, app.url(&path)).bearer_auth(key);
            if let Some(b) = body {
                r = r.json(&b);
            }
            read(r.send().await.unwrap()).await
        }
    };
    let post = |body: Value| as_("ka", reqwest::Method::POST, "/v1/crons".into(), Some(body));

    for (body, says) in [
        (
            json!({"schedule": "61 * * * *", "query": "q"}),
            "minute field `61`",
        ),
        (
            json!({"schedule": "0 25 * * *", "query": "q"}),
            "hour field `25`",
        ),
        (
            json!({"schedule": "0 9 * 13 *", "query": "q"}),
            "month field `13`",
        ),
        (json!({"schedule": "0 9 * *", "query": "q"}), "has 4 fields"),
        (
            json!({"schedule": "* * * * * *", "query": "q"}),
            "PES_CRON_SECONDS",
        ),
        (
            json!({"schedule": "0 9 * * *", "timezone": "Mars/Base", "query": "q"}),
            "timezone `Mars/Base`",
        ),
        (json!({"schedule": "0 9 * * *", "query": "  "}), "query"),
        (
            json!({"schedule": "0 9 * * *", "query": "q", "config": {"maxItems": 0}}),
            "config.maxItems",
        ),
        (
            json!({"schedule": "0 9 * * *", "query": "q", "onMissed": "sometimes"}),
            "onMissed",
        ),
    ] {
        let (st, p) = post(body.clone()).await;
        assert_eq!(st, 422, "{body}: {p}");
        assert!(p["detail"].as_str().unwrap().contains(says), "{body}: {p}");
    }
    let (st, p) = post(json!({"schedule": "0 9 * * *", "query": "q", "threadId": "nope"})).await;
    assert_eq!(
        (st, p["code"].as_str()),
        (422, Some("thread_not_found")),
        "{p}"
    );
    let (st, p) = post(json!({"schedule": "0 9 * * *", "query": "q", "assistantId": "nope"})).await;
    assert_eq!(
        (st, p["code"].as_str()),
        (422, Some("assistant_not_found")),
        "{p}"
    );

    let (st, _) = as_(
        "ka",
        reqwest::Method::POST,
        "/v1/threads".into(),
        Some(json!({"threadId": "daily"})),
    )
    .await;
    assert_eq!(st, 201);
    let before = Utc::now();
    let (st, cron) = post(json!({"threadId": "daily", "schedule": "0 9 * * *",
        "timezone": "Asia/Tokyo", "query": "Summarize the day"}))
    .await;
    assert_eq!(st, 201, "{cron}");
    let id = cron["cronId"].as_str().unwrap().to_owned();
    assert_eq!(cron["enabled"], true);
    assert_eq!(cron["onMissed"], "run_once");
    assert_eq!(cron["timezone"], "Asia/Tokyo");
    // 09:00 in Tokyo is 00:00 UTC: the next one after now.
    let next = at(cron["nextRunAt"].as_str().unwrap());
    assert_eq!(
        (next.hour(), next.minute(), next.second()),
        (0, 0, 0),
        "{cron}"
    );
    assert!(
        next > before && next - before <= chrono::Duration::days(1),
        "{cron}"
    );
    let (_, other) = post(json!({"schedule": "*/5 * * * *", "query": "q"})).await;
    let other_id = other["cronId"].as_str().unwrap().to_owned();

    let (st, got) = as_("ka", reqwest::Method::GET, format!("/v1/crons/{id}"), None).await;
    assert_eq!((st, got["cronId"].as_str()), (200, Some(id.as_str())));
    let (_, all) = as_("ka", reqwest::Method::GET, "/v1/crons".into(), None).await;
    let ids: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cronId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [other_id.as_str(), id.as_str()], "newest first");
    let (_, page) = as_("ka", reqwest::Method::GET, "/v1/crons?limit=1".into(), None).await;
    let cursor = page["nextCursor"].as_str().unwrap();
    let (_, page2) = as_(
        "ka",
        reqwest::Method::GET,
        format!("/v1/crons?limit=1&cursor={cursor}"),
        None,
    )
    .await;
    assert_eq!(page2["items"][0]["cronId"], id.as_str());
    let (_, daily) = as_(
        "ka",
        reqwest::Method::GET,
        "/v1/crons?threadId=daily".into(),
        None,
    )
    .await;
    assert_eq!(daily["items"].as_array().unwrap().len(), 1);

    // Another tenant: nothing to see, read, change or delete.
    let (_, theirs) = as_("kb", reqwest::Method::GET, "/v1/crons".into(), None).await;
    assert!(theirs["items"].as_array().unwrap().is_empty(), "{theirs}");
    for (m, body) in [
        (reqwest::Method::GET, None),
        (reqwest::Method::PATCH, Some(json!({"enabled": false}))),
        (reqwest::Method::DELETE, None),
    ] {
        let (st, p) = as_("kb", m.clone(), format!("/v1/crons/{id}"), body).await;
        assert_eq!(
            (st, p["code"].as_str()),
            (404, Some("cron_not_found")),
            "{m}: {p}"
        );
    }

    // Changes: disabled keeps its tick; a new schedule moves it; bad ones say why.
    let (st, off) = as_(
        "ka",
        reqwest::Method::PATCH,
        format!("/v1/crons/{id}"),
        Some(json!({"enabled": false})),
    )
    .await;
    assert_eq!(st, 200, "{off}");
    assert_eq!(off["enabled"], false);
    let (_, moved) = as_(
        "ka",
        reqwest::Method::PATCH,
        format!("/v1/crons/{id}"),
        Some(json!({"schedule": "30 6 * * *", "timezone": "UTC", "onMissed": "skip"})),
    )
    .await;
    let next = at(moved["nextRunAt"].as_str().unwrap());
    assert_eq!((next.hour(), next.minute()), (6, 30), "{moved}");
    assert_eq!(moved["onMissed"], "skip");
    let (st, p) = as_(
        "ka",
        reqwest::Method::PATCH,
        format!("/v1/crons/{id}"),
        Some(json!({"schedule": "* * *"})),
    )
    .await;
    assert_eq!(st, 422, "{p}");
    let (st, p) = as_(
        "ka",
        reqwest::Method::PATCH,
        format!("/v1/crons/{id}"),
        Some(json!({"threadId": "x"})),
    )
    .await;
    assert_eq!(st, 422, "a cron's thread does not change: {p}");

    let (st, _) = as_(
        "ka",
        reqwest::Method::DELETE,
        format!("/v1/crons/{id}"),
        None,
    )
    .await;
    assert_eq!(st, 204);
    let (st, _) = as_("ka", reqwest::Method::GET, format!("/v1/crons/{id}"), None).await;
    assert_eq!(st, 404);
    // A cron on a thread goes with its thread.
    let (_, c2) = post(json!({"threadId": "daily", "schedule": "0 9 * * *", "query": "q"})).await;
    let (st, _) = as_(
        "ka",
        reqwest::Method::DELETE,
        "/v1/threads/daily".into(),
        None,
    )
    .await;
    assert_eq!(st, 204);
    let (st, _) = as_(
        "ka",
        reqwest::Method::GET,
        format!("/v1/crons/{}", c2["cronId"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(st, 404);
    app.stop().await;
}
both_stores!(
    checked_and_per_tenant,
    crons_are_checked_and_kept_per_tenant
);

/// Without a thread each tick runs on a new thread; the run and its `RUN_STARTED` name the cron;
/// a disabled cron does not tick.
async fn each_tick_without_a_thread_runs_on_a_new_thread(backend: Backend) {
    let app = spawn_with(backend, None, fast_ticks).await;
    let (st, cron) = app
        .post(
            "/v1/crons",
            json!({"schedule": "* * * * * *", "query": "What is 2+3?"}),
        )
        .await;
    assert_eq!(st, 201, "{cron}");
    let id = cron["cronId"].as_str().unwrap().to_owned();
    let prefix = format!("cron:{id}:");
    let cron_threads = |page: &Value| -> Vec<String> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["threadId"].as_str())
            .filter(|t| t.starts_with(&prefix))
            .map(str::to_owned)
            .collect()
    };
    wait_get(&app, "/v1/threads?limit=200", |p| {
        cron_threads(p).len() >= 2
    })
    .await;
    let (st, off) = send(
        &app,
        reqwest::Method::PATCH,
        &format!("/v1/crons/{id}"),
        None,
        Some(json!({"enabled": false})),
    )
    .await;
    assert_eq!(st, 200, "{off}");
    let (_, page) = app.get("/v1/threads?limit=200").await;
    let threads = cron_threads(&page);
    let mut ticks = BTreeSet::new();
    for t in &threads {
        let runs = runs_of(&app, t).await;
        assert_eq!(runs.len(), 1, "one run per tick's thread: {runs:?}");
        let run = &runs[0];
        assert_eq!(run["cronId"], id.as_str());
        let tick = tick_of(run, &id);
        assert_eq!(t, &format!("{prefix}{}", tick.timestamp()));
        assert!(ticks.insert(tick), "one thread per tick");
        let run = app
            .wait_run(t, run["runId"].as_str().unwrap(), |r| {
                r["status"] == "completed"
            })
            .await;
        assert_eq!(run["status"], "completed");
        let started = app
            .wait_observation(t, |o| o["type"] == "RUN_STARTED")
            .await;
        assert_eq!(started["content"]["cronId"], id.as_str(), "{started}");
    }
    let (_, c) = app.get(&format!("/v1/crons/{id}")).await;
    let last = at(c["lastTickAt"].as_str().unwrap());
    assert_eq!(Some(&last), ticks.last(), "{c}");
    assert!(
        c["lastRunId"].is_string() && c["lastError"].is_null(),
        "{c}"
    );
    // Disabled: two more seconds pass and no tick comes.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (_, page) = app.get("/v1/threads?limit=200").await;
    assert_eq!(
        cron_threads(&page).len(),
        threads.len(),
        "a disabled cron does not tick"
    );
    app.stop().await;
}
both_stores!(
    new_thread_per_tick,
    each_tick_without_a_thread_runs_on_a_new_thread
);

/// Two replicas on one Postgres: every tick of an every-second cron on a thread is exactly one
/// run (no tick twice, none skipped), and each run's webhook reaches the receiver once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_make_exactly_one_run_per_tick() {
    let Some(py) = python() else { return };
    let rx = Receiver::start(&py, "200", 0).await;
    let url = database_url(Backend::Postgres).await;
    let replica = || {
        let mut c = test_config(&url, None);
        fast_ticks(&mut c);
        hooks_on(&mut c);
        spawn_config(c)
    };
    let a = replica().await;
    let b = replica().await;
    let (st, _) = a.post("/v1/threads", json!({"threadId": "tick"})).await;
    assert_eq!(st, 201);
    let (st, cron) = b
        .post(
            "/v1/crons",
            json!({"threadId": "tick", "schedule": "* * * * * *", "query": "What is 2+3?",
                   "config": {"webhook": {"url": format!("{}/tick", rx.base)}}}),
        )
        .await;
    assert_eq!(st, 201, "{cron}");
    let id = cron["cronId"].as_str().unwrap().to_owned();
    wait_get(&a, "/v1/threads/tick/runs?limit=200", |p| {
        p["items"].as_array().unwrap().len() >= 4
    })
    .await;
    let (st, _) = send(
        &a,
        reqwest::Method::PATCH,
        &format!("/v1/crons/{id}"),
        None,
        Some(json!({"enabled": false})),
    )
    .await;
    assert_eq!(st, 200);
    // Let a tick claimed just before the change finish, then count.
    wait_get(&b, "/v1/threads/tick/runs?limit=200", |p| {
        p["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["status"] == "completed")
    })
    .await;
    let runs = runs_of(&a, "tick").await;
    let ticks: Vec<DateTime<Utc>> = runs.iter().map(|r| tick_of(r, &id)).collect();
    let unique: BTreeSet<_> = ticks.iter().copied().collect();
    assert_eq!(
        unique.len(),
        ticks.len(),
        "no tick made two runs: {ticks:?}"
    );
    let (first, last) = (*unique.first().unwrap(), *unique.last().unwrap());
    assert_eq!(
        (last - first).num_seconds() + 1,
        i64::try_from(ticks.len()).unwrap(),
        "no tick between the first and the last was skipped: {ticks:?}"
    );
    assert!(runs.iter().all(|r| r["cronId"] == id.as_str()));

    // Each run's webhook, once.
    let run_ids: BTreeSet<String> = runs
        .iter()
        .map(|r| r["runId"].as_str().unwrap().to_owned())
        .collect();
    let seen = wait_received(&rx, |s| {
        let got: BTreeSet<&str> = s.iter().filter_map(|r| r["runId"].as_str()).collect();
        run_ids.iter().all(|r| got.contains(r.as_str()))
    })
    .await;
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for r in &seen {
        assert_eq!(r["verified"], true, "{r}");
        *per_id.entry(r["id"].as_str().unwrap()).or_default() += 1;
    }
    assert!(
        per_id.values().all(|n| *n == 1),
        "each delivery once: {per_id:?}"
    );
    assert_eq!(per_id.len(), run_ids.len(), "one delivery per run");
    a.stop().await;
    b.stop().await;
}

/// The schedule (with seconds) whose only ticks are `ticks`, all within one minute.
fn only_at(ticks: &[DateTime<Utc>]) -> String {
    let t = ticks[0];
    let seconds: Vec<String> = ticks.iter().map(|t| t.second().to_string()).collect();
    format!(
        "{} {} {} {} {} *",
        seconds.join(","),
        t.minute(),
        t.hour(),
        t.day(),
        t.month()
    )
}

/// Ticks that passed while no replica ran: `run_once` makes one run, for the latest of them, when
/// the service starts again; `skip` makes none and waits for the next tick.
async fn missed_ticks_run_once_at_start_or_are_skipped(backend: Backend) {
    let url = database_url(backend).await;
    // Two ticks a few seconds ahead, in one minute.
    let mut now = Utc::now();
    if now.second() > 50 {
        tokio::time::sleep(Duration::from_secs(u64::from(61 - now.second()))).await;
        now = Utc::now();
    }
    let t1 = now.with_nanosecond(0).unwrap() + chrono::Duration::seconds(3);
    let t2 = t1 + chrono::Duration::seconds(1);
    let schedule = only_at(&[t1, t2]);

    let mut c = test_config(&url, None);
    fast_ticks(&mut c);
    let first = spawn_config(c).await;
    for t in ["once", "skipped"] {
        let (st, _) = first.post("/v1/threads", json!({"threadId": t})).await;
        assert_eq!(st, 201);
    }
    let (_, once) = first
        .post(
            "/v1/crons",
            json!({"threadId": "once", "schedule": schedule, "query": "What is 2+3?"}),
        )
        .await;
    let (_, skipped) = first
        .post(
            "/v1/crons",
            json!({"threadId": "skipped", "schedule": schedule,
            "query": "What is 2+3?", "onMissed": "skip"}),
        )
        .await;
    assert_eq!(at(once["nextRunAt"].as_str().unwrap()), t1, "{once}");
    first.stop().await;
    assert!(Utc::now() < t1, "the service stopped before the first tick");

    // Both ticks pass while no replica runs.
    let wake = t2 + chrono::Duration::milliseconds(1500);
    tokio::time::sleep((wake - Utc::now()).to_std().unwrap_or_default()).await;
    let mut c = test_config(&url, None);
    fast_ticks(&mut c);
    c.cron_missed_after_seconds = 1;
    let second = spawn_config(c).await;
    let once_id = once["cronId"].as_str().unwrap();
    let skipped_id = skipped["cronId"].as_str().unwrap();
    let done = wait_get(&second, &format!("/v1/crons/{once_id}"), |c| {
        c["lastRunId"].is_string()
    })
    .await;
    let after = wait_get(&second, &format!("/v1/crons/{skipped_id}"), |c| {
        c["nextRunAt"].as_str().is_some_and(|n| at(n) > t2)
    })
    .await;
    let runs = runs_of(&second, "once").await;
    assert_eq!(
        runs.len(),
        1,
        "one catch-up run, not one per missed tick: {runs:?}"
    );
    assert_eq!(tick_of(&runs[0], once_id), t2, "for the latest missed tick");
    assert_eq!(done["lastTickAt"].as_str().map(at), Some(t2), "{done}");
    assert!(runs_of(&second, "skipped").await.is_empty(), "skip: no run");
    assert!(after["lastTickAt"].is_null(), "{after}");
    assert!(
        at(done["nextRunAt"].as_str().unwrap()) > Utc::now(),
        "it waits for its next tick: {done}"
    );
    second.stop().await;
}
both_stores!(missed_ticks, missed_ticks_run_once_at_start_or_are_skipped);
