//! Human in the loop: runs suspend before a tool call that needs approval and at every `ask_user`,
//! persist the suspension, and resume exactly once by `suspensionId`, crash or no crash.

use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, SseReader, TestApp, of_type, resume, spawn, spawn_with};
use crate::process::{Proc, env_for};

/// A thread whose calculator calls need approval; returns (thread, suspended run).
async fn suspended_on_calculator(app: &TestApp) -> (String, Value) {
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    (t, run)
}

async fn approval_suspends_before_the_tool_runs_and_approve_runs_it_once(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let (t, run) = suspended_on_calculator(&app).await;
    let sid = run["suspension"]["suspensionId"]
        .as_str()
        .expect("the run carries its suspension")
        .to_owned();
    let obs = app.observations(&t).await;
    assert!(
        of_type(&obs, "TOOL_EXECUTION").is_empty(),
        "nothing ran before the decision"
    );
    let susp = of_type(&obs, "AGENT_SUSPENDED");
    assert_eq!(susp.len(), 1);
    let c = &susp[0]["content"];
    assert_eq!(susp[0]["parentId"], "s1");
    assert_eq!(c["suspensionId"], sid);
    assert_eq!(c["itemId"], "s1");
    assert_eq!(c["kind"], "approval");
    assert_eq!(c["toolCall"]["name"], "calculator");
    assert_eq!(c["toolCall"]["arguments"], json!({"expression": "2+2"}));
    assert_eq!(
        c["allowedDecisions"],
        json!(["approve", "edit", "reject", "respond"])
    );
    // The run waits once nothing else can proceed: RUN_SUSPENDED names what it waits on.
    let last = obs.last().unwrap();
    assert_eq!(last["type"], "RUN_SUSPENDED");
    assert_eq!(last["parentId"], Value::Null);
    assert_eq!(last["content"]["suspensionIds"], json!([sid]));
    assert_eq!(obs[obs.len() - 2]["type"], "AGENT_SUSPENDED");

    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(state["isPaused"], true);
    assert_eq!(state["suspension"]["suspensionId"], sid);
    assert_eq!(state["suspension"]["toolCall"]["name"], "calculator");
    assert!(state["suspension"]["iterationState"].is_array());
    assert_eq!(state["todoList"][0]["status"], "waiting");
    let (_, thread) = app.get(&format!("/v1/threads/{t}")).await;
    assert_eq!(thread["status"], "suspended");
    let (_, list) = app.get(&format!("/v1/threads/{t}/suspensions")).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_eq!(list["items"][0]["status"], "pending");
    let (s, one) = app.get(&format!("/v1/suspensions/{sid}")).await;
    assert_eq!(s, 200);
    assert_eq!(one["runId"], run["runId"]);

    let (s, resumed) = resume(
        &app,
        &sid,
        json!({"decision": "approve", "reason": "looks right"}),
    )
    .await;
    assert_eq!(s, 202, "{resumed}");
    assert_eq!(
        resumed["runId"], run["runId"],
        "resuming continues the same run"
    );
    let rid = run["runId"].as_str().unwrap();
    let done = app.wait_run(&t, rid, |r| r["status"] == "completed").await;
    assert_eq!(done["finalResponse"]["response"], "final answer");

    let obs = app.observations(&t).await;
    let execs = of_type(&obs, "TOOL_EXECUTION");
    assert_eq!(execs.len(), 1, "the approved call ran exactly once");
    assert_eq!(execs[0]["content"]["status"], "success");
    assert_eq!(execs[0]["content"]["output"]["result"], 4);
    let resumed_obs = of_type(&obs, "AGENT_RESUMED");
    assert_eq!(resumed_obs.len(), 1);
    assert_eq!(resumed_obs[0]["content"]["decision"], "approve");
    assert_eq!(resumed_obs[0]["parentId"], "s1");
    assert_eq!(of_type(&obs, "PLAN").len(), 1, "no re-plan on resume");
    assert_eq!(of_type(&obs, "RUN_STARTED").len(), 1);
    let seqs: Vec<i64> = obs.iter().map(|o| o["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=obs.len() as i64).collect::<Vec<_>>());
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(state["isPaused"], false);
    assert!(state["suspension"].is_null());
    let (_, list) = app.get(&format!("/v1/threads/{t}/suspensions")).await;
    assert!(list["items"].as_array().unwrap().is_empty());
    let (_, all) = app
        .get(&format!("/v1/threads/{t}/suspensions?status=all"))
        .await;
    assert_eq!(all["items"][0]["status"], "resolved");
    // The decision's name, with what came with it beside it.
    assert_eq!(all["items"][0]["decision"], "approve");
    assert_eq!(all["items"][0]["reason"], "looks right");
    let (_, one) = app.get(&format!("/v1/suspensions/{sid}")).await;
    assert_eq!(one["decision"], "approve", "{one}");
    assert_eq!(one["reason"], "looks right", "{one}");

    let (s, b) = resume(&app, &sid, json!({"decision": "approve"})).await;
    assert_eq!(s, 409, "{b}");
    assert_eq!(b["code"], "suspension_resolved");
    app.stop().await;
}
both_stores!(
    approve,
    approval_suspends_before_the_tool_runs_and_approve_runs_it_once
);

async fn edit_reject_and_respond_become_the_tool_result(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;

    // edit: arguments are validated against the tool's schema.
    let (t, run) = suspended_on_calculator(&app).await;
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (s, b) = resume(
        &app,
        sid,
        json!({"decision": "edit", "modifiedArgs": {"expression": 5}}),
    )
    .await;
    assert_eq!(s, 422, "{b}");
    let (s, b) = resume(&app, sid, json!({"decision": "edit"})).await;
    assert_eq!(s, 422, "{b}");
    let (s, _) = resume(
        &app,
        sid,
        json!({"decision": "edit", "modifiedArgs": {"expression": "3*3"}}),
    )
    .await;
    assert_eq!(s, 202);
    app.wait_run(&t, run["runId"].as_str().unwrap(), |r| {
        r["status"] == "completed"
    })
    .await;
    let obs = app.observations(&t).await;
    let exec = of_type(&obs, "TOOL_EXECUTION");
    assert_eq!(exec.len(), 1);
    assert_eq!(exec[0]["content"]["output"]["result"], 9);

    // reject: the tool does not run; the model is told it was rejected and why.
    let (t, run) = suspended_on_calculator(&app).await;
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (s, _) = resume(
        &app,
        sid,
        json!({"decision": "reject", "reason": "too expensive"}),
    )
    .await;
    assert_eq!(s, 202);
    app.wait_run(&t, run["runId"].as_str().unwrap(), |r| {
        r["status"] == "completed"
    })
    .await;
    let obs = app.observations(&t).await;
    let exec = of_type(&obs, "TOOL_EXECUTION");
    assert_eq!(exec[0]["content"]["status"], "rejected");
    let told = llm.requests_of("execute").iter().any(|r| {
        r["messages"].as_array().unwrap().iter().any(|m| {
            m["role"] == "tool"
                && m["content"]
                    .as_str()
                    .unwrap_or("")
                    .contains("too expensive")
        })
    });
    assert!(
        told,
        "the model got a tool result saying it was rejected and why"
    );

    // respond: the response is the tool's result.
    let (t, run) = suspended_on_calculator(&app).await;
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (s, b) = resume(&app, sid, json!({"decision": "respond"})).await;
    assert_eq!(s, 422, "respond needs a response: {b}");
    let (s, _) = resume(
        &app,
        sid,
        json!({"decision": "respond", "response": {"result": 5}}),
    )
    .await;
    assert_eq!(s, 202);
    app.wait_run(&t, run["runId"].as_str().unwrap(), |r| {
        r["status"] == "completed"
    })
    .await;
    let obs = app.observations(&t).await;
    let exec = of_type(&obs, "TOOL_EXECUTION");
    assert_eq!(exec[0]["content"]["status"], "responded");
    assert_eq!(exec[0]["content"]["output"], json!({"result": 5}));
    // Unknown decisions are 422 too.
    let (t2, run2) = suspended_on_calculator(&app).await;
    let _ = t2;
    let (s, _) = resume(
        &app,
        run2["suspension"]["suspensionId"].as_str().unwrap(),
        json!({"decision": "maybe"}),
    )
    .await;
    assert_eq!(s, 422);
    app.stop().await;
}
both_stores!(decisions, edit_reject_and_respond_become_the_tool_result);

async fn ask_user_waits_for_an_answer_that_fits_its_schema(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan(&[("s1", "Ask the user's name", &["ask_user"], &[])]),
    );
    let schema =
        json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}});
    llm.push(
        "execute",
        Reply::ToolCalls(vec![(
            "ask_user".into(),
            json!({"question": "What is your name?", "inputSchema": schema}),
        )]),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "greet me").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let s = &run["suspension"];
    assert_eq!(s["kind"], "input");
    assert_eq!(s["question"], "What is your name?");
    assert_eq!(s["inputSchema"], schema);
    assert_eq!(s["allowedDecisions"], json!(["respond", "reject"]));
    let sid = s["suspensionId"].as_str().unwrap();
    let (st, b) = resume(&app, sid, json!({"decision": "approve"})).await;
    assert_eq!(st, 422);
    assert_eq!(b["code"], "decision_not_allowed");
    let (st, b) = resume(
        &app,
        sid,
        json!({"decision": "respond", "response": {"nom": "Ada"}}),
    )
    .await;
    assert_eq!(st, 422, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("name"), "{b}");
    let (st, _) = resume(
        &app,
        sid,
        json!({"decision": "respond", "response": {"name": "Ada"}}),
    )
    .await;
    assert_eq!(st, 202);
    let done = app
        .wait_run(&t, run["runId"].as_str().unwrap(), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "completed");
    let last_exec = llm.requests_of("execute").last().unwrap().to_string();
    assert!(
        last_exec.contains("Ada"),
        "the answer reached the model as the tool result"
    );
    app.stop().await;
}
both_stores!(ask_user, ask_user_waits_for_an_answer_that_fits_its_schema);

async fn twenty_concurrent_resumes_give_one_202_and_nineteen_409s(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let (t, run) = suspended_on_calculator(&app).await;
    let sid = run["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = app.url(&format!("/v1/suspensions/{sid}/resume"));
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (client, url, barrier) = (app.client.clone(), url.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let body = json!({"decision": "reject", "reason": format!("caller {i}")});
            client
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    let mut codes = Vec::new();
    for task in tasks {
        codes.push(task.await.unwrap());
    }
    assert_eq!(codes.iter().filter(|c| **c == 202).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 409).count(), 19, "{codes:?}");
    app.wait_run(&t, run["runId"].as_str().unwrap(), |r| {
        r["status"] == "completed"
    })
    .await;
    let obs = app.observations(&t).await;
    assert_eq!(of_type(&obs, "AGENT_RESUMED").len(), 1);
    assert_eq!(of_type(&obs, "TOOL_EXECUTION").len(), 1);
    app.stop().await;
}
both_stores!(
    exactly_once,
    twenty_concurrent_resumes_give_one_202_and_nineteen_409s
);

async fn other_tenants_and_unknown_ids_are_not_found(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.api_keys = Some("ka:a,kb:b".into())
    })
    .await;
    let r = app.client.post(app.url("/v1/threads/t/runs/wait")).bearer_auth("ka")
        .json(&json!({"query": "2+2", "ifNotExists": "create", "config": {"requireApproval": ["calculator"]}}))
        .send().await.unwrap();
    let (_, run) = crate::helpers::read(r).await;
    assert_eq!(run["status"], "suspended", "{run}");
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    for (key, path) in [
        ("kb", format!("/v1/suspensions/{sid}")),
        (
            "ka",
            "/v1/suspensions/01934b5e-0000-7000-8000-000000000000".to_owned(),
        ),
        ("ka", "/v1/suspensions/nope".to_owned()),
    ] {
        let r = app
            .client
            .get(app.url(&path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let r = app
            .client
            .post(app.url(&format!("{path}/resume")))
            .bearer_auth(key)
            .json(&json!({"decision": "approve"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
    let r = app
        .client
        .post(app.url(&format!("/v1/suspensions/{sid}/resume")))
        .bearer_auth("ka")
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    app.stop().await;
}
both_stores!(tenants, other_tenants_and_unknown_ids_are_not_found);

async fn calls_of_one_turn_suspend_one_after_another_and_completed_ones_never_rerun(
    backend: Backend,
) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan(&[("s1", "Compute things", &["calculator"], &[])]),
    );
    llm.push(
        "execute",
        Reply::ToolCalls(vec![
            ("calculator".into(), json!({"expression": "1+1"})),
            ("current_time".into(), json!({})),
            ("calculator".into(), json!({"expression": "2+2"})),
        ]),
    );
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&t, "q").await;
    let rid = run["runId"].as_str().unwrap().to_owned();
    let first = run["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        run["suspension"]["toolCall"]["arguments"]["expression"],
        "1+1"
    );
    assert_eq!(run["suspension"]["partialToolResults"], json!([]));
    let (s, _) = resume(&app, &first, json!({"decision": "approve"})).await;
    assert_eq!(s, 202);
    let run = app
        .wait_run(&t, &rid, |r| {
            r["status"] == "suspended" && r["suspension"]["suspensionId"] != first.as_str()
        })
        .await;
    let second = run["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        run["suspension"]["toolCall"]["arguments"]["expression"],
        "2+2"
    );
    let partial = run["suspension"]["partialToolResults"].as_array().unwrap();
    assert_eq!(
        partial.len(),
        2,
        "the two calls of the turn that already ran: {partial:?}"
    );
    assert_eq!(partial[0]["output"]["result"], 2);
    assert_eq!(partial[1]["name"], "current_time");
    let (s, _) = resume(&app, &second, json!({"decision": "approve"})).await;
    assert_eq!(s, 202);
    app.wait_run(&t, &rid, |r| r["status"] == "completed").await;
    let obs = app.observations(&t).await;
    let execs: Vec<_> = of_type(&obs, "TOOL_EXECUTION")
        .iter()
        .map(|o| o["content"]["toolCallId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(execs.len(), 3, "each call ran once: {execs:?}");
    let mut dedup = execs.clone();
    dedup.dedup();
    assert_eq!(dedup.len(), 3);
    // The model saw all three results before answering.
    let last = llm.requests_of("execute").last().unwrap().clone();
    let tools = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .count();
    assert_eq!(tools, 3);
    app.stop().await;
}
both_stores!(
    one_turn,
    calls_of_one_turn_suspend_one_after_another_and_completed_ones_never_rerun
);

async fn expired_suspensions_are_rejected_and_the_run_goes_on(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| c.suspension_sweep_ms = 50).await;
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"], "suspensionTtlSeconds": 1}}))
        .await;
    let run = app.run_wait(&t, "q").await;
    assert_eq!(run["status"], "suspended");
    assert!(run["suspension"]["expiresAt"].is_string());
    let done = app
        .wait_run(&t, run["runId"].as_str().unwrap(), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "completed");
    let obs = app.observations(&t).await;
    let resumed = of_type(&obs, "AGENT_RESUMED");
    assert_eq!(resumed[0]["content"]["expired"], true);
    assert_eq!(resumed[0]["content"]["reason"], "expired");
    assert_eq!(
        of_type(&obs, "TOOL_EXECUTION")[0]["content"]["status"],
        "rejected"
    );
    let (_, all) = app
        .get(&format!("/v1/threads/{t}/suspensions?status=all"))
        .await;
    assert_eq!(all["items"][0]["status"], "expired");
    app.stop().await;
}
both_stores!(ttl, expired_suspensions_are_rejected_and_the_run_goes_on);

async fn cancelling_a_suspended_run_cancels_its_suspension(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let (t, run) = suspended_on_calculator(&app).await;
    let rid = run["runId"].as_str().unwrap();
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (s, c) = app
        .post(&format!("/v1/threads/{t}/runs/{rid}/cancel"), json!({}))
        .await;
    assert_eq!(s, 202);
    assert_eq!(c["status"], "cancelled");
    let (_, one) = app.get(&format!("/v1/suspensions/{sid}")).await;
    assert_eq!(one["status"], "cancelled");
    let (s, b) = resume(&app, sid, json!({"decision": "approve"})).await;
    assert_eq!(s, 409, "{b}");
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(state["isPaused"], false);
    // The thread is free again: a new run goes through, and the interrupted call is not run.
    llm.push("plan", plan(&[("s9", "something else", &[], &[])]));
    let next = app.run_wait(&t, "something else").await;
    assert_eq!(next["status"], "completed", "{next}");
    let obs = app.observations(&t).await;
    assert!(
        of_type(&obs, "TOOL_EXECUTION")
            .iter()
            .all(|o| o["content"]["status"] != "success")
    );
    app.stop().await;
}
both_stores!(
    cancel_suspended,
    cancelling_a_suspended_run_cancels_its_suspension
);

async fn streams_end_at_a_suspension_and_resume_can_stream(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let r = app
        .client
        .post(app.url(&format!("/v1/threads/{t}/runs")))
        .header("accept", "text/event-stream")
        .json(&json!({"query": "q"}))
        .send()
        .await
        .unwrap();
    let mut sse = SseReader::new(r);
    let got = sse.until("RUN_SUSPENDED").await;
    let sid = got[got.len() - 2]["content"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(got[got.len() - 2]["type"], "AGENT_SUSPENDED");
    assert!(
        sse.next(Duration::from_secs(5)).await.is_none(),
        "the stream ends when the run suspends"
    );
    // A UI that reconnects finds the suspension in the replay.
    let r = app
        .client
        .get(app.url(&format!("/v1/threads/{t}/events?types=AGENT_SUSPENDED")))
        .send()
        .await
        .unwrap();
    let replay = SseReader::new(r).until("AGENT_SUSPENDED").await;
    assert_eq!(replay[0]["content"]["suspensionId"], sid.as_str());
    let r = app
        .client
        .post(app.url(&format!("/v1/suspensions/{sid}/resume")))
        .header("accept", "text/event-stream")
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .unwrap();
    let mut sse = SseReader::new(r);
    let rest = sse.until("RUN_COMPLETED").await;
    assert!(rest.iter().any(|o| o["type"] == "TOOL_EXECUTION"));
    assert!(
        rest.iter().all(|o| o["type"] != "AGENT_RESUMED"),
        "the stream starts after the resume"
    );
    app.stop().await;
}
both_stores!(streams, streams_end_at_a_suspension_and_resume_can_stream);

async fn a_suspension_survives_kill_9(backend: Backend) {
    let llm = FakeLlm::start().await;
    let db = crate::helpers::database_url(backend).await;
    let p = Proc::start(&env_for(&db, &llm.url)).await;
    let (s, run) = p.post("/v1/threads/crash/runs/wait", json!({
        "query": "2+2", "ifNotExists": "create", "config": {"requireApproval": ["calculator"]}
    })).await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["status"], "suspended");
    let sid = run["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let rid = run["runId"].as_str().unwrap().to_owned();
    p.kill9().await;

    let p = Proc::start(&env_for(&db, &llm.url)).await;
    let (_, list) = p.get("/v1/threads/crash/suspensions").await;
    assert_eq!(list["items"][0]["suspensionId"], sid.as_str());
    let (s, _) = p
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202);
    let done = p
        .wait_for(&format!("/v1/threads/crash/runs/{rid}"), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["finalResponse"]["response"], "final answer");
    let (_, obs) = p.get("/v1/threads/crash/observations?limit=1000").await;
    let obs = obs["items"].as_array().unwrap().clone();
    assert_eq!(of_type(&obs, "TOOL_EXECUTION").len(), 1);
    let seqs: Vec<i64> = obs.iter().map(|o| o["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=obs.len() as i64).collect::<Vec<_>>());
    p.kill9().await;
}
both_stores!(kill_9, a_suspension_survives_kill_9);
