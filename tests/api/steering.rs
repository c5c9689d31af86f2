//! Steering: `POST …/runs/{runId}/steer` commits a person's message (`STEERING` and a user
//! message); a running run's next model call of every item reads it, the planner gets one
//! refinement turn before the next item starts, a queued or suspended run keeps it, and a finished
//! run answers 409. `multitaskStrategy: "steer"` does the same with a new query.

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, item_of, phase_of, plan};
use crate::helpers::{Backend, TestApp, spawn};

const STEER: &str = "Answer in French from now on";

fn mentions(req: &Value, text: &str) -> bool {
    req["messages"].as_array().is_some_and(|ms| {
        ms.iter()
            .any(|m| m["content"].as_str().is_some_and(|c| c.contains(text)))
    })
}

async fn steer(app: &TestApp, thread: &str, run: &str, message: &str) -> (u16, Value) {
    app.post(
        &format!("/v1/threads/{thread}/runs/{run}/steer"),
        json!({"message": message}),
    )
    .await
}

async fn start(app: &TestApp, thread: &str, query: &str) -> String {
    let (s, run) = app
        .post(
            &format!("/v1/threads/{thread}/runs"),
            json!({"query": query}),
        )
        .await;
    assert_eq!(s, 202, "{run}");
    run["runId"].as_str().unwrap().to_owned()
}

async fn finished(app: &TestApp, thread: &str, run: &str) -> Value {
    app.wait_run(thread, run, |r| {
        ["completed", "failed", "cancelled", "suspended"]
            .contains(&r["status"].as_str().unwrap_or(""))
    })
    .await
}

async fn steering_reaches_the_next_call_and_the_planner_first(backend: Backend) {
    let llm = FakeLlm::start().await;
    llm.push(
        "plan",
        plan(&[
            ("a", "compute 2+2", &["calculator"], &[]),
            ("b", "explain it", &[], &["a"]),
        ]),
    );
    // The refinement turn keeps `a` and rewrites `b`.
    llm.push(
        "plan",
        plan(&[
            ("a", "compute 2+2", &["calculator"], &[]),
            ("b", "explain it in French", &[], &["a"]),
        ]),
    );
    llm.push_item(
        "a",
        Reply::ToolCalls(vec![("calculator".into(), json!({"expression": "2+2"}))]),
    );
    llm.push_item("a", Reply::Text("4".into()));
    llm.push_item("b", Reply::Text("quatre".into()));
    llm.hold_if(|r| item_of(r).as_deref() == Some("a"));
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    let rid = start(&app, &t, "what is 2+2?").await;
    llm.wait_for_request(|r| item_of(r).as_deref() == Some("a"))
        .await;

    let (s, body) = steer(&app, &t, &rid, STEER).await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(body["status"], "running");
    llm.release();
    let run = finished(&app, &t, &rid).await;
    assert_eq!(run["status"], "completed", "{run}");

    let reqs = llm.requests();
    let a: Vec<&Value> = reqs
        .iter()
        .filter(|r| item_of(r).as_deref() == Some("a"))
        .collect();
    assert_eq!(a.len(), 2);
    assert!(
        !mentions(a[0], STEER),
        "the first call went out before the steering"
    );
    assert!(
        mentions(a[1], STEER),
        "the in-flight item's next call reads it"
    );
    // The planner's refinement turn comes before b's first call, and b reads the steering too.
    let refine = reqs
        .iter()
        .position(|r| phase_of(r) == "plan" && mentions(r, STEER))
        .expect("a refinement turn with the steering");
    let b = reqs
        .iter()
        .position(|r| item_of(r).as_deref() == Some("b"))
        .expect("b ran");
    assert!(refine < b, "refined at {refine}, b at {b}");
    assert!(mentions(&reqs[b], STEER));
    assert!(
        mentions(&reqs[b], "explain it in French"),
        "b runs as the refined plan says"
    );

    let obs = app.observations(&t).await;
    let st: Vec<&Value> = obs.iter().filter(|o| o["type"] == "STEERING").collect();
    assert_eq!(st.len(), 1);
    assert_eq!(st[0]["content"]["message"], STEER);
    assert_eq!(st[0]["parentId"], Value::Null);
    assert_eq!(st[0]["content"]["messageId"], body["messageId"]);
    let upd = obs
        .iter()
        .find(|o| o["type"] == "PLAN_UPDATE")
        .expect("the refinement's PLAN_UPDATE");
    assert_eq!(
        upd["content"]["steeringMessageIds"],
        json!([body["messageId"]])
    );
    let (_, msgs) = app.get(&format!("/v1/threads/{t}/messages")).await;
    let items = msgs["items"].as_array().unwrap();
    assert!(
        items
            .iter()
            .any(|m| m["role"] == "user" && m["content"] == STEER),
        "the steering is a user message of the conversation: {msgs}"
    );
    app.stop().await;
}
both_stores!(
    running,
    steering_reaches_the_next_call_and_the_planner_first
);

async fn suspended_and_queued_runs_keep_the_message(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    // Suspended: the calculator waits for approval.
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended");
    let rid = run["runId"].as_str().unwrap();
    let (s, body) = steer(&app, &t, rid, STEER).await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(body["status"], "suspended");
    let before = llm.requests().len();
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (s, _) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202);
    // The run goes on (the fake model, reading a user message last, calls its tool again and
    // waits for approval once more): what matters is what its next call read.
    llm.wait_for_request(|_| true).await;
    let done = app
        .wait_run(&t, rid, |r| {
            r["usage"]["llmCalls"].as_u64() > run["usage"]["llmCalls"].as_u64()
                && r["status"] != "running"
                && r["status"] != "queued"
        })
        .await;
    assert_ne!(done["status"], "failed", "{done}");
    let after = &llm.requests()[before..];
    let first = after.first().expect("the run went on");
    assert!(
        mentions(first, STEER),
        "the next call after the pause reads it: {after:#?}"
    );

    // Queued: behind a run that is held.
    llm.push("plan", plan(&[("h", "hold me", &[], &[])]));
    llm.hold_if(|r| item_of(r).as_deref() == Some("h"));
    let t = app.thread(json!({})).await;
    let first = start(&app, &t, "first").await;
    llm.wait_for_request(|r| item_of(r).as_deref() == Some("h"))
        .await;
    // The second run's plan, and its refinement.
    for _ in 0..2 {
        llm.push(
            "plan",
            plan(&[("c", "think c", &[], &[]), ("d", "think d", &[], &["c"])]),
        );
    }
    let queued = start(&app, &t, "second").await;
    let (s, body) = steer(&app, &t, &queued, STEER).await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(body["status"], "queued");
    let n = llm.requests().len();
    llm.release();
    finished(&app, &t, &first).await;
    finished(&app, &t, &queued).await;
    let later = &llm.requests()[n..];
    assert!(
        later
            .iter()
            .any(|r| phase_of(r) == "plan" && mentions(r, STEER)),
        "the queued run's planner took it in"
    );
    assert!(
        later
            .iter()
            .any(|r| phase_of(r) == "execute" && mentions(r, STEER))
    );
    app.stop().await;
}
both_stores!(kept, suspended_and_queued_runs_keep_the_message);

async fn finished_runs_refuse_and_bad_bodies_are_422(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    let rid = run["runId"].as_str().unwrap();
    let (s, p) = steer(&app, &t, rid, STEER).await;
    assert_eq!(s, 409, "{p}");
    let (s, _) = steer(&app, &t, "01a2171c-8a07-723d-adf1-a02263e8e4af", STEER).await;
    assert_eq!(s, 404);
    let (s, _) = steer(&app, &t, rid, "   ").await;
    assert_eq!(s, 422);
    let (s, _) = steer(&app, &t, rid, &"x".repeat(8001)).await;
    assert_eq!(s, 422);
    let (s, _) = app
        .post(
            &format!("/v1/threads/{t}/runs/{rid}/steer"),
            json!({"msg": "x"}),
        )
        .await;
    assert_eq!(s, 422);
    app.stop().await;
}
both_stores!(refusals, finished_runs_refuse_and_bad_bodies_are_422);

async fn the_steer_strategy_steers_the_busy_thread(backend: Backend) {
    let llm = FakeLlm::start().await;
    llm.hold_if(|r| item_of(r).as_deref() == Some("s1"));
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    let rid = start(&app, &t, "what is 2+2?").await;
    llm.wait_for_request(|r| item_of(r).as_deref() == Some("s1"))
        .await;
    let (s, run) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": STEER, "multitaskStrategy": "steer"}),
        )
        .await;
    assert!(s == 200 || s == 202, "{s}: {run}");
    assert_eq!(
        run["runId"],
        rid.as_str(),
        "no new run: the active one was steered"
    );
    llm.release();
    let done = finished(&app, &t, &rid).await;
    assert_eq!(done["status"], "completed");
    let (_, runs) = app.get(&format!("/v1/threads/{t}/runs")).await;
    assert_eq!(runs["items"].as_array().unwrap().len(), 1);
    let obs = app.observations(&t).await;
    assert!(
        obs.iter()
            .any(|o| o["type"] == "STEERING" && o["content"]["message"] == STEER)
    );
    // On an idle thread the query runs on its own.
    let (s, run) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "and 3+3?", "multitaskStrategy": "steer"}),
        )
        .await;
    assert_eq!(s, 202, "{run}");
    assert_ne!(run["runId"], rid.as_str());
    app.stop().await;
}
both_stores!(strategy, the_steer_strategy_steers_the_busy_thread);

/// Two replicas on one Postgres: A drives the run, the steering is posted to B (which runs no
/// agents); it reaches A through the store's signal while A's item waits on the model: A's
/// planner refines at once (the other item is ready) and the item's next model call reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_posted_on_another_replica_reaches_the_run() {
    let llm = FakeLlm::start().await;
    let both = plan(&[
        ("a", "compute 2+2", &["calculator"], &[]),
        ("b", "explain it", &[], &[]),
    ]);
    llm.push("plan", both.clone());
    llm.push("plan", both);
    llm.push_item(
        "a",
        Reply::ToolCalls(vec![("calculator".into(), json!({"expression": "2+2"}))]),
    );
    llm.push_item("a", Reply::Text("4".into()));
    llm.push_item("b", Reply::Text("four".into()));
    llm.hold_if(|r| item_of(r).as_deref() == Some("a"));
    let url = crate::helpers::database_url(Backend::Postgres).await;
    let a = crate::helpers::spawn_config(crate::helpers::test_config(&url, Some(&llm))).await;
    let mut on_b = crate::helpers::test_config(&url, Some(&llm));
    on_b.worker_concurrency = 0;
    let b = crate::helpers::spawn_config(on_b).await;

    // One item at a time: `b` is ready while `a` waits on the model.
    let t = a.thread(json!({"config": {"maxParallelItems": 1}})).await;
    let rid = start(&a, &t, "what is 2+2?").await;
    llm.wait_for_request(|r| item_of(r).as_deref() == Some("a"))
        .await;
    let (s, body) = steer(&b, &t, &rid, STEER).await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(body["status"], "running", "A drives it: {body}");
    // A took it in while `a` was still held: its planner's refinement turn reads it.
    llm.wait_for_request(|r| phase_of(r) == "plan" && mentions(r, STEER))
        .await;
    llm.release();
    let run = finished(&a, &t, &rid).await;
    assert_eq!(run["status"], "completed", "{run}");
    let reqs = llm.requests();
    let of_a: Vec<&Value> = reqs
        .iter()
        .filter(|r| item_of(r).as_deref() == Some("a"))
        .collect();
    assert_eq!(of_a.len(), 2);
    assert!(!mentions(of_a[0], STEER));
    assert!(
        mentions(of_a[1], STEER),
        "a's next model call on A reads it"
    );
    a.stop().await;
    b.stop().await;
}

/// Steering is bounded: one run takes `PES_MAX_STEERS_PER_RUN` messages (429 past it, counted
/// exactly under concurrency), `…/steer` and `multitaskStrategy: "steer"` share one size limit,
/// and a model call reads the latest ten messages at most.
async fn steering_is_bounded_per_run_in_size_and_in_the_prompt(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = crate::helpers::spawn_with(backend, Some(&llm), |c| c.max_steers_per_run = 12).await;
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let rid = run["runId"].as_str().unwrap().to_owned();
    // Twenty at once, through both doors: exactly twelve are taken.
    let mut tasks = Vec::new();
    for n in 0..20 {
        let (app_base, client, t, rid) =
            (app.base.clone(), app.client.clone(), t.clone(), rid.clone());
        tasks.push(tokio::spawn(async move {
            let r = if n % 2 == 0 {
                client
                    .post(format!("{app_base}/v1/threads/{t}/runs/{rid}/steer"))
                    .json(&json!({"message": format!("steer number {n:02}")}))
                    .send()
                    .await
            } else {
                client
                    .post(format!("{app_base}/v1/threads/{t}/runs"))
                    .json(&json!({"query": format!("steer number {n:02}"),
                                  "multitaskStrategy": "steer"}))
                    .send()
                    .await
            };
            let r = r.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }));
    }
    let mut taken = 0;
    for task in tasks {
        let (s, body) = task.await.unwrap();
        match s {
            202 | 200 => taken += 1,
            429 => {
                assert_eq!(body["code"], "quota_exceeded", "{body}");
                assert!(
                    body["detail"]
                        .as_str()
                        .unwrap()
                        .contains("PES_MAX_STEERS_PER_RUN"),
                    "{body}"
                );
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(taken, 12, "exactly the limit");
    let log = app.observations(&t).await;
    let steers: Vec<&str> = log
        .iter()
        .filter(|o| o["type"] == "STEERING")
        .map(|o| o["content"]["message"].as_str().unwrap())
        .collect();
    assert_eq!(steers.len(), 12);

    // One size limit for both doors.
    let long = "x".repeat(8001);
    let (s, b) = steer(&app, &t, &rid, &long).await;
    assert_eq!(s, 422, "{b}");
    let (s, b) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": long, "multitaskStrategy": "steer"}),
        )
        .await;
    assert_eq!(s, 422, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("8000"), "{b}");

    // The run goes on (approving every call it asks for): its next model calls read the
    // latest ten, not the two oldest.
    let mut sid = run["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    loop {
        let (s, b) = app
            .post(
                &format!("/v1/suspensions/{sid}/resume"),
                json!({"decision": "approve"}),
            )
            .await;
        assert_eq!(s, 202, "{b}");
        let r = app
            .wait_run(&t, &rid, |r| {
                r["status"] == "completed"
                    || (r["status"] == "suspended"
                        && r["suspension"]["suspensionId"] != sid.as_str())
            })
            .await;
        if r["status"] == "completed" {
            break;
        }
        sid = r["suspension"]["suspensionId"].as_str().unwrap().to_owned();
    }
    let after: Vec<Value> = llm
        .requests()
        .into_iter()
        .filter(|r| mentions(r, "steered the run"))
        .collect();
    assert!(!after.is_empty(), "a model call read the steering");
    for r in &after {
        for (k, text) in steers.iter().enumerate() {
            assert_eq!(
                mentions(r, &format!("- {text}")),
                k >= 2,
                "message {k} ({text}) in a prompt: {}",
                phase_of(r)
            );
        }
    }
    app.stop().await;
}
both_stores!(
    bounded,
    steering_is_bounded_per_run_in_size_and_in_the_prompt
);
