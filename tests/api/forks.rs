//! Thread history and forks over HTTP: every past state readable and exact, the points it can be
//! read at, and forks that continue a run on a new thread, where a person can decide differently,
//! while the source stays as it was.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::FakeLlm;
use crate::helpers::{Backend, TestApp, spawn, spawn_config, spawn_with, test_config};

fn seq(o: &Value) -> i64 {
    o["seq"].as_i64().unwrap()
}

async fn state_at(app: &TestApp, t: &str, at: i64) -> Value {
    let (s, st) = app.get(&format!("/v1/threads/{t}/state?atSeq={at}")).await;
    assert_eq!(s, 200, "{st}");
    st
}

/// Every history point, newest first, read two at a time.
async fn history(app: &TestApp, t: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/threads/{t}/history?limit=2&cursor={c}"),
            None => format!("/v1/threads/{t}/history?limit=2"),
        };
        let (s, page) = app.get(&path).await;
        assert_eq!(s, 200, "{page}");
        out.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return out,
        }
    }
}

/// Each item's status right after `at`, as the log reports it: its last `ITEM_STATUS_CHANGE`
/// at or before `at`, or `pending` for an item planned but not yet moved.
fn statuses_from_log(obs: &[Value], at: i64) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for o in obs.iter().filter(|o| seq(o) <= at) {
        match o["type"].as_str().unwrap() {
            "PLAN" | "PLAN_UPDATE" => {
                for item in o["content"]["todoList"].as_array().into_iter().flatten() {
                    out.entry(item["id"].as_str().unwrap().to_owned())
                        .or_insert_with(|| item["status"].as_str().unwrap().to_owned());
                }
            }
            "ITEM_STATUS_CHANGE" => {
                out.insert(
                    o["content"]["itemId"].as_str().unwrap().to_owned(),
                    o["content"]["status"].as_str().unwrap().to_owned(),
                );
            }
            _ => {}
        }
    }
    out
}

async fn past_states_are_exact_at_every_seq(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");
    let obs = app.observations(&t).await;
    let last = seq(obs.last().unwrap());
    let (_, now) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert!(
        now.get("atSeq").is_none(),
        "the present has no atSeq: {now}"
    );

    // Before the first observation: nothing yet.
    let empty = state_at(&app, &t, 0).await;
    assert_eq!(empty["todoList"], json!([]));
    assert_eq!(empty["version"], 0);
    assert!(empty["intent"].is_null());

    let mut versions = Vec::new();
    for o in &obs {
        let at = seq(o);
        let st = state_at(&app, &t, at).await;
        let read_at = st["atSeq"].as_i64().unwrap();
        assert!(read_at >= at, "a seq reads the state after its commit");
        let items: BTreeMap<String, String> = st["todoList"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                (
                    i["id"].as_str().unwrap().to_owned(),
                    i["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            items,
            statuses_from_log(&obs, read_at),
            "item statuses at seq {at} ({})",
            o["type"]
        );
        if o["type"] == "PLAN" {
            assert!(st["plan"].is_string(), "the plan is there at PLAN: {st}");
        }
        versions.push(st["version"].as_i64().unwrap());
    }
    assert!(
        versions.windows(2).all(|w| w[0] <= w[1]),
        "the state's version never goes back: {versions:?}"
    );
    // The last point is the present, field for field.
    let mut at_last = state_at(&app, &t, last).await;
    at_last.as_object_mut().unwrap().remove("atSeq");
    assert_eq!(at_last, now);

    // The points, newest first, each a commit that changed the state, paged without loss.
    let points = history(&app, &t).await;
    assert!(points.len() >= 3, "{points:?}");
    let seqs: Vec<i64> = points.iter().map(seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "{seqs:?}");
    for p in &points {
        let o = obs
            .iter()
            .find(|o| seq(o) == seq(p))
            .expect("a point is a seq");
        assert_eq!(p["type"], o["type"]);
        assert_eq!(p["runId"], run["runId"]);
        assert!(p["createdAt"].is_string());
    }
    let types: Vec<&str> = points.iter().map(|p| p["type"].as_str().unwrap()).collect();
    assert!(
        types
            .iter()
            .any(|t| *t == "PLAN" || *t == "ITEM_STATUS_CHANGE"),
        "{types:?}"
    );

    // Bad input.
    let (s, p) = app
        .get(&format!("/v1/threads/{t}/state?atSeq={}", last + 1))
        .await;
    assert_eq!(s, 422, "{p}");
    assert_eq!(p["code"], "seq_out_of_range");
    let (s, p) = app.get(&format!("/v1/threads/{t}/state?atSeq=-1")).await;
    assert_eq!((s, p["code"].as_str()), (422, Some("seq_out_of_range")));
    let (s, _) = app.get(&format!("/v1/threads/{t}/state?atSeq=x")).await;
    assert_eq!(s, 422);
    let (s, _) = app.get(&format!("/v1/threads/{t}/history?cursor=zz")).await;
    assert_eq!(s, 422);
    let (s, _) = app.get("/v1/threads/nope/state?atSeq=1").await;
    assert_eq!(s, 404);
    let (s, _) = app.get("/v1/threads/nope/history").await;
    assert_eq!(s, 404);
    app.stop().await;
}
both_stores!(past_states, past_states_are_exact_at_every_seq);

/// A thread whose calculator calls need approval, suspended; (thread, run, suspension id).
async fn suspended(app: &TestApp) -> (String, Value, String) {
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}, "metadata": {"who": "src"}}))
        .await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let sid = run["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    (t, run, sid)
}

fn executions(obs: &[Value]) -> Vec<&Value> {
    obs.iter()
        .filter(|o| o["type"] == "TOOL_EXECUTION")
        .collect()
}

async fn fork_of(app: &TestApp, t: &str, body: Value) -> Value {
    let (s, fork) = app.post(&format!("/v1/threads/{t}/fork"), body).await;
    assert_eq!(s, 201, "{fork}");
    fork
}

/// The "what if": approve on the source, reject on a fork cut at the `AGENT_SUSPENDED`; both
/// answers stand, and the source is not touched by the fork.
async fn a_fork_decides_differently(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let (t, run, sid) = suspended(&app).await;
    let before = app.observations(&t).await;
    let suspended_at = seq(before
        .iter()
        .find(|o| o["type"] == "AGENT_SUSPENDED")
        .unwrap());

    // Approve on the source; it completes with the tool's result.
    let (s, b) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let rid = run["runId"].as_str().unwrap();
    app.wait_run(&t, rid, |r| r["status"] == "completed").await;
    let source_log = app.observations(&t).await;
    assert_eq!(executions(&source_log).len(), 1);
    assert_eq!(executions(&source_log)[0]["content"]["status"], "success");

    // Fork at the suspension: the run is under way there, waiting for a person.
    let fork = fork_of(
        &app,
        &t,
        json!({"atSeq": suspended_at, "threadId": "what-if"}),
    )
    .await;
    assert_eq!(fork["threadId"], "what-if");
    assert_eq!(
        fork["metadata"],
        json!({"who": "src", "forkedFrom": {"threadId": t, "atSeq": suspended_at}})
    );
    let f = "what-if";
    let forked_log = app.observations(f).await;
    let prefix: Vec<&Value> = source_log
        .iter()
        .filter(|o| seq(o) <= suspended_at)
        .collect();
    assert_eq!(forked_log.len(), prefix.len(), "the log is the prefix");
    for (a, b) in forked_log.iter().zip(&prefix) {
        assert_eq!(
            (&a["seq"], &a["id"], &a["type"]),
            (&b["seq"], &b["id"], &b["type"])
        );
    }
    let (_, st) = app.get(&format!("/v1/threads/{f}/state")).await;
    assert_eq!(st["isPaused"], true, "{st}");
    let fsid = st["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(fsid, sid, "a new suspension id on the fork");
    assert_eq!(st["suspension"]["toolCall"]["name"], "calculator");
    let (_, runs) = app.get(&format!("/v1/threads/{f}/runs")).await;
    let frun = &runs["items"][0];
    assert_eq!(frun["status"], "suspended", "{runs}");
    assert_ne!(frun["runId"], run["runId"]);
    let frid = frun["runId"].as_str().unwrap().to_owned();
    // The fork's log names the fork's run and suspension, not the source's.
    let suspended_obs = forked_log
        .iter()
        .find(|o| o["type"] == "AGENT_SUSPENDED")
        .unwrap();
    assert_eq!(suspended_obs["content"]["suspensionId"], fsid.as_str());
    assert_eq!(suspended_obs["runId"], frid.as_str());

    // Reject there: the fork's run goes on without the tool and completes.
    let (s, b) = app
        .post(
            &format!("/v1/suspensions/{fsid}/resume"),
            json!({"decision": "reject", "reason": "what if not"}),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let done = app.wait_run(f, &frid, |r| r["status"] == "completed").await;
    assert!(done["finalResponse"].is_object(), "{done}");
    let forked_log = app.observations(f).await;
    assert!(
        executions(&forked_log)
            .iter()
            .all(|e| e["content"]["status"] != "success"),
        "the rejected call never ran on the fork"
    );
    let resumed: Vec<&Value> = forked_log
        .iter()
        .filter(|o| o["type"] == "AGENT_RESUMED")
        .collect();
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0]["content"]["decision"], "reject");
    let seqs: Vec<i64> = forked_log.iter().map(seq).collect();
    assert_eq!(seqs, (1..=forked_log.len() as i64).collect::<Vec<_>>());

    // Both answers stand: the source is as it was.
    assert_eq!(app.observations(&t).await, source_log);
    let (_, src_run) = app.get(&format!("/v1/threads/{t}/runs/{rid}")).await;
    assert_eq!(src_run["status"], "completed");
    let (_, src) = app.get(&format!("/v1/suspensions/{sid}")).await;
    assert_eq!(src["decision"], "approve");
    app.stop().await;
}
both_stores!(what_if, a_fork_decides_differently);

async fn forks_of_finished_threads_and_bad_input(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.api_keys = Some("ka:acme,kb:globex".into());
    })
    .await;
    let post = |key: &'static str, path: String, body: Value| {
        let app = &app;
        async move {
            let r = app
                .client
                .post(app.url(&path))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap();
            crate::helpers::read(r).await
        }
    };
    let (s, t) = post("ka", "/v1/threads".into(), json!({"metadata": {"a": 1}})).await;
    assert_eq!(s, 201);
    let t = t["threadId"].as_str().unwrap().to_owned();
    let (s, run) = post(
        "ka",
        format!("/v1/threads/{t}/runs/wait"),
        json!({"query": "hi"}),
    )
    .await;
    assert_eq!(
        (s, run["status"].as_str()),
        (200, Some("completed")),
        "{run}"
    );
    let (_, log) = app
        .get_as("ka", &format!("/v1/threads/{t}/observations?limit=1000"))
        .await;
    let last = log["items"].as_array().unwrap().len() as i64;

    // Whole: the same log and state, no run continues, metadata given replaces the source's.
    let (s, whole) = post(
        "ka",
        format!("/v1/threads/{t}/fork"),
        json!({"metadata": {"b": 2}}),
    )
    .await;
    assert_eq!(s, 201, "{whole}");
    let w = whole["threadId"].as_str().unwrap().to_owned();
    assert_eq!(
        whole["metadata"],
        json!({"b": 2, "forkedFrom": {"threadId": t, "atSeq": last}})
    );
    assert_eq!(whole["status"], "idle");
    let (_, flog) = app
        .get_as("ka", &format!("/v1/threads/{w}/observations?limit=1000"))
        .await;
    let strip = |v: &Value| -> Vec<Value> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let mut o = o.clone();
                o.as_object_mut().unwrap().remove("threadId");
                o
            })
            .collect()
    };
    assert_eq!(strip(&flog), strip(&log), "the same log, ids and all");
    let (_, s1) = app.get_as("ka", &format!("/v1/threads/{t}/state")).await;
    let (_, s2) = app.get_as("ka", &format!("/v1/threads/{w}/state")).await;
    assert_eq!(s1["todoList"], s2["todoList"]);
    assert_eq!(s1["plan"], s2["plan"]);
    let (_, runs) = app.get_as("ka", &format!("/v1/threads/{w}/runs")).await;
    assert_eq!(runs["items"], json!([]));
    let (_, m1) = app.get_as("ka", &format!("/v1/threads/{t}/messages")).await;
    let (_, m2) = app.get_as("ka", &format!("/v1/threads/{w}/messages")).await;
    assert_eq!(strip(&m1), strip(&m2), "messages keep their ids");
    // Its history is the source's too, and it goes on: a new run on the fork.
    let (_, h) = app.get_as("ka", &format!("/v1/threads/{w}/history")).await;
    assert!(!h["items"].as_array().unwrap().is_empty());
    let (s, again) = post(
        "ka",
        format!("/v1/threads/{w}/runs/wait"),
        json!({"query": "more"}),
    )
    .await;
    assert_eq!(
        (s, again["status"].as_str()),
        (200, Some("completed")),
        "{again}"
    );

    // At 0: an empty thread.
    let (s, zero) = post("ka", format!("/v1/threads/{t}/fork"), json!({"atSeq": 0})).await;
    assert_eq!(s, 201);
    let z = zero["threadId"].as_str().unwrap();
    let (_, zlog) = app
        .get_as("ka", &format!("/v1/threads/{z}/observations"))
        .await;
    assert_eq!(zlog["items"], json!([]));
    let (_, zst) = app.get_as("ka", &format!("/v1/threads/{z}/state")).await;
    assert_eq!(zst["todoList"], json!([]));

    // Bad input, and the other tenant.
    let fork = format!("/v1/threads/{t}/fork");
    let (s, p) = post("ka", fork.clone(), json!({"atSeq": last + 1})).await;
    assert_eq!(
        (s, p["code"].as_str()),
        (422, Some("seq_out_of_range")),
        "{p}"
    );
    let (s, p) = post("ka", fork.clone(), json!({"atSeq": -3})).await;
    assert_eq!(
        (s, p["code"].as_str()),
        (422, Some("seq_out_of_range")),
        "{p}"
    );
    let (s, _) = post("ka", fork.clone(), json!({"metadata": [1]})).await;
    assert_eq!(s, 422);
    let (s, _) = post("ka", fork.clone(), json!({"threadId": "bad id!"})).await;
    assert_eq!(s, 422);
    let (s, _) = post("ka", fork.clone(), json!({"nope": 1})).await;
    assert_eq!(s, 422);
    let (s, p) = post("ka", fork.clone(), json!({"threadId": w})).await;
    assert_eq!((s, p["code"].as_str()), (409, Some("thread_exists")), "{p}");
    let (s, _) = post("kb", fork.clone(), json!({})).await;
    assert_eq!(s, 404, "another tenant's thread is not found");
    let (s, _) = app
        .get_as("kb", &format!("/v1/threads/{t}/state?atSeq=1"))
        .await;
    assert_eq!(s, 404);
    let (s, _) = app.get_as("kb", &format!("/v1/threads/{t}/history")).await;
    assert_eq!(s, 404);
    // The source is untouched, and deleting it leaves the fork whole.
    let (_, log_after) = app
        .get_as("ka", &format!("/v1/threads/{t}/observations?limit=1000"))
        .await;
    assert_eq!(log_after["items"], log["items"]);
    let (s, _) = app.delete_as("ka", &format!("/v1/threads/{t}")).await;
    assert_eq!(s, 204);
    let (s, _) = app
        .get_as("ka", &format!("/v1/threads/{w}/state?atSeq=1"))
        .await;
    assert_eq!(s, 200);
    app.stop().await;
}
both_stores!(whole_forks, forks_of_finished_threads_and_bad_input);

/// A fork made on one replica, whose run the other replica (the only one with workers) picks
/// up and finishes after a decision taken through the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_is_continued_by_the_other_replica() {
    let llm = FakeLlm::start().await;
    let url = crate::helpers::database_url(Backend::Postgres).await;
    let a = spawn_config(test_config(&url, Some(&llm))).await;
    let (t, _, _) = suspended(&a).await;
    let obs = a.observations(&t).await;
    let at = seq(obs.iter().find(|o| o["type"] == "AGENT_SUSPENDED").unwrap());
    a.stop().await;
    let mut only_http = test_config(&url, Some(&llm));
    only_http.worker_concurrency = 0;
    let a = spawn_config(only_http).await;
    let b = spawn_config(test_config(&url, Some(&llm))).await;
    let fork = fork_of(&a, &t, json!({"atSeq": at})).await;
    let f = fork["threadId"].as_str().unwrap();
    let (_, st) = a.get(&format!("/v1/threads/{f}/state")).await;
    let fsid = st["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let (s, b2) = a
        .post(
            &format!("/v1/suspensions/{fsid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202, "{b2}");
    let (_, runs) = a.get(&format!("/v1/threads/{f}/runs")).await;
    let frid = runs["items"][0]["runId"].as_str().unwrap().to_owned();
    let done = b.wait_run(f, &frid, |r| r["status"] == "completed").await;
    assert_eq!(done["finalResponse"]["response"], "final answer");
    let log = b.observations(f).await;
    assert_eq!(
        executions(&log).len(),
        1,
        "the approved call ran once, on the fork"
    );
    a.stop().await;
    b.stop().await;
}

/// A local receiver of POSTs that counts them: a side effect the tests can count.
async fn receiver() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = hits.clone();
    let app = axum::Router::new().route(
        "/pay",
        axum::routing::post(move || {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                "paid"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://127.0.0.1:{}/pay",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, hits)
}

/// A decision is for one execution: forks cut after an approval but before the call's result
/// ask again (under a new id, the run suspended on it), so forking twice and deciding nothing
/// makes no request; a fork cut after the result keeps the decision and runs nothing again; an
/// approval on a fork executes there once.
async fn a_fork_asks_again_for_a_decision_its_call_did_not_use(backend: Backend) {
    use crate::fake_llm::{Reply, plan};
    use std::sync::atomic::Ordering;
    let (url, hits) = receiver().await;
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.http_tool = true;
        c.http_tool_allow = Some("127.0.0.1/32".into());
    })
    .await;
    llm.push("plan", plan(&[("p", "Pay it", &["http_request"], &[])]));
    llm.push_item(
        "p",
        Reply::ToolCalls(vec![(
            "http_request".into(),
            json!({"method": "POST", "url": url, "body": "one payment"}),
        )]),
    );
    let t = app
        .thread(json!({"config": {"requireApproval": ["http_request"]}}))
        .await;
    let run = app.run_wait(&t, "pay the bill").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let rid = run["runId"].as_str().unwrap();
    let (s, b) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    app.wait_run(&t, rid, |r| r["status"] == "completed").await;
    assert_eq!(hits.load(Ordering::SeqCst), 1, "approved once, paid once");
    let log = app.observations(&t).await;
    let approved_at = seq(log.iter().find(|o| o["type"] == "AGENT_RESUMED").unwrap());
    let executed_at = seq(log.iter().find(|o| o["type"] == "TOOL_EXECUTION").unwrap());
    assert!(approved_at < executed_at);

    // Two forks at the approval: each asks again, and nothing is paid.
    let mut forks = Vec::new();
    for n in 0..2 {
        let fork = fork_of(
            &app,
            &t,
            json!({"atSeq": approved_at, "threadId": format!("again-{n}")}),
        )
        .await;
        let f = fork["threadId"].as_str().unwrap().to_owned();
        let (_, st) = app.get(&format!("/v1/threads/{f}/state")).await;
        assert_eq!(st["isPaused"], true, "{st}");
        let fsid = st["suspension"]["suspensionId"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_ne!(fsid, sid, "asked again under a new id");
        let (_, pending) = app.get(&format!("/v1/suspensions/{fsid}")).await;
        assert_eq!(pending["status"], "pending", "{pending}");
        assert!(pending.get("decision").is_none(), "{pending}");
        let (_, runs) = app.get(&format!("/v1/threads/{f}/runs")).await;
        assert_eq!(runs["items"][0]["status"], "suspended", "{runs}");
        // The fork's log says so after the prefix it copied.
        let flog = app.observations(&f).await;
        let tail: Vec<&str> = flog
            .iter()
            .filter(|o| seq(o) > approved_at)
            .map(|o| o["type"].as_str().unwrap())
            .collect();
        assert_eq!(tail, ["AGENT_SUSPENDED", "RUN_SUSPENDED"], "{flog:?}");
        let asked = flog.iter().find(|o| seq(o) > approved_at).unwrap();
        assert_eq!(asked["content"]["suspensionId"], fsid.as_str());
        forks.push((
            f,
            fsid,
            runs["items"][0]["runId"].as_str().unwrap().to_owned(),
        ));
    }
    // A fork after the result keeps the decision: the call ran on the source, and not again.
    let after = fork_of(&app, &t, json!({"atSeq": executed_at, "threadId": "after"})).await;
    let (_, st) = app.get("/v1/threads/after/state").await;
    assert_eq!(st["isPaused"], false, "{st}");
    let (_, runs) = app.get("/v1/threads/after/runs").await;
    let arid = runs["items"][0]["runId"].as_str().unwrap().to_owned();
    app.wait_run("after", &arid, |r| r["status"] == "completed")
        .await;
    assert_eq!(after["threadId"], "after");
    // Deciding nothing on the first fork; approving on the second pays once, there.
    let (f, fsid, frid) = &forks[1];
    let (s, b) = app
        .post(
            &format!("/v1/suspensions/{fsid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    app.wait_run(f, frid, |r| r["status"] == "completed").await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "one more payment: the one approved on the fork"
    );
    let (_, first) = app.get(&format!("/v1/threads/{}/runs", forks[0].0)).await;
    assert_eq!(first["items"][0]["status"], "suspended", "{first}");
    app.stop().await;
}
both_stores!(
    decisions_once,
    a_fork_asks_again_for_a_decision_its_call_did_not_use
);

/// Forks on one long-lived service whose few connections have served other work before: at every
/// point of a thread (runs under way with and without suspensions, none at all) and with 409s
/// between them, never a 500 (a connection's cached statements once mismatched a fork's).
async fn forks_on_a_long_lived_service_never_fail(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| c.database_max_connections = 2).await;
    // Other work first, so the connections hold prepared statements.
    for _ in 0..3 {
        let t = app.thread(json!({})).await;
        assert_eq!(
            app.run_wait(&t, "what is 2+2?").await["status"],
            "completed"
        );
    }
    let (t, run, sid) = suspended(&app).await;
    let (s, b) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    app.wait_run(&t, run["runId"].as_str().unwrap(), |r| {
        r["status"] == "completed"
    })
    .await;
    let last = seq(app.observations(&t).await.last().unwrap());
    for at in (1..=last).rev().chain(1..=last) {
        let (s, b) = app
            .post(&format!("/v1/threads/{t}/fork"), json!({"atSeq": at}))
            .await;
        assert_eq!(s, 201, "a fork at {at}: {b}");
        let id = b["threadId"].as_str().unwrap();
        let (s, b) = app
            .post(
                &format!("/v1/threads/{t}/fork"),
                json!({"atSeq": at, "threadId": id}),
            )
            .await;
        assert_eq!(s, 409, "the same id again at {at}: {b}");
    }
    app.stop().await;
}
both_stores!(
    forks_reused_connections,
    forks_on_a_long_lived_service_never_fail
);

/// Open the app's database directly (what only a test does): to plant a fork whose copy stopped.
async fn exec_sql(url: &str, sql: &str) {
    if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        sqlx::query(sql).execute(&pool).await.unwrap();
        pool.close().await;
    } else {
        let pool = sqlx::SqlitePool::connect(url).await.unwrap();
        sqlx::query(sql).execute(&pool).await.unwrap();
        pool.close().await;
    }
}

/// A fork of a thread longer than one copy batch is its source's prefix exactly (log, state,
/// messages), batch boundaries included; a fork whose copy stopped (its process died) is
/// invisible, holds its id, and is deleted by the sweeper.
async fn a_long_fork_is_copied_whole_in_batches(backend: Backend) {
    let url = crate::helpers::database_url(backend).await;
    let mut c = test_config(&url, None);
    c.retention_interval_seconds = 1;
    let app = spawn_config(c).await;
    let t = app.thread(json!({})).await;
    let mut n = 0;
    // Past the first batch (256 seqs) and into the second.
    while seq(app
        .observations(&t)
        .await
        .last()
        .unwrap_or(&json!({"seq": 0})))
        < 700
    {
        n += 1;
        assert!(n < 200, "the thread never grew");
        let run = app
            .run_wait(&t, &format!("What is 2+{n}? And 3*{n}?"))
            .await;
        assert_eq!(run["status"], "completed", "{run}");
    }
    let source = app.observations(&t).await;
    let last = seq(source.last().unwrap());
    let middle = last / 2 + 17;
    for at in [middle, last] {
        let fork = fork_of(&app, &t, json!({"atSeq": at})).await;
        let f = fork["threadId"].as_str().unwrap();
        let copied = app.observations(f).await;
        let prefix: Vec<&Value> = source.iter().filter(|o| seq(o) <= at).collect();
        assert_eq!(copied.len(), prefix.len(), "every observation up to {at}");
        for (a, b) in copied.iter().zip(prefix) {
            for field in ["seq", "id", "type", "content", "parentId"] {
                assert_eq!(a[field], b[field], "{field} at seq {}", b["seq"]);
            }
        }
        // The fork goes on from there (a run under way continues): compare at the cut.
        let (past, copied) = (state_at(&app, &t, at).await, state_at(&app, f, at).await);
        assert!(
            past["todoList"] == copied["todoList"] && past["plan"] == copied["plan"],
            "the fork's state at {at} is the source's"
        );
        let (_, a) = app
            .get(&format!("/v1/threads/{t}/messages?limit=200"))
            .await;
        let (_, b) = app
            .get(&format!("/v1/threads/{f}/messages?limit=200"))
            .await;
        if at == last {
            // Each message as it is, but for the thread it is on.
            let strip = |page: &Value| -> Vec<Value> {
                let mut items = page["items"].as_array().unwrap().clone();
                for m in &mut items {
                    m.as_object_mut().unwrap().remove("threadId");
                }
                items
            };
            let (a, b) = (strip(&a), strip(&b));
            let differ = a.iter().zip(&b).find(|(x, y)| x != y);
            assert!(
                a.len() == b.len() && differ.is_none(),
                "every message: {} vs {}, first differing {:.600}",
                a.len(),
                b.len(),
                format!("{differ:?}")
            );
        }
    }

    // A copy that stopped half-way: hidden, its id taken, then swept.
    exec_sql(
        &url,
        "INSERT INTO threads (tenant, thread_id, metadata, config, created_at, updated_at, \
         last_seq, copying) VALUES ('default', 'stalled', '{}', '{}', \
         '2000-01-01T00:00:00.000000Z', '2000-01-01T00:00:00.000000Z', 0, TRUE)",
    )
    .await;
    let (s, _) = app.get("/v1/threads/stalled").await;
    assert_eq!(s, 404, "a fork being copied is not a thread yet");
    let (_, list) = app.get("/v1/threads?limit=200").await;
    assert!(
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["threadId"] != "stalled"),
        "{list}"
    );
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (s, b) = app
            .post("/v1/threads", json!({"threadId": "stalled"}))
            .await;
        if s == 201 {
            break;
        }
        assert_eq!(s, 409, "{b}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled copy was never swept"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    app.stop().await;
}
both_stores!(long_forks, a_long_fork_is_copied_whole_in_batches);
