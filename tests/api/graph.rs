//! The plan as a graph: ready items run at once under `maxParallelItems`, a failed item cancels its
//! dependents while independent branches go on, suspensions of parallel items, compaction of long
//! results, what an item's brief holds (`contextMode`, roles), tool allowlists, and a crash with
//! two items in flight.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::durability::assert_gap_free;
use crate::fake_llm::{FakeLlm, Reply, item_of, phase_of, plan};
use crate::helpers::{
    Backend, SseReader, TestApp, of_type, resume, spawn, spawn_config, spawn_with, test_config,
};

use crate::fake_llm::plan_item as item;

/// A plan reply with these items.
fn plan_of(items: Vec<Value>) -> Reply {
    Reply::Json(json!({
        "title": "Graph plan",
        "intent": "Test the graph",
        "plan": "Run the items as a graph",
        "todoList": items,
    }))
}

/// Poll `cond` until it holds (deadline 30 s); `what` says what never happened.
async fn wait_until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} never happened"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The execute requests of item `id`, in order.
fn executes_of(llm: &FakeLlm, id: &str) -> Vec<Value> {
    llm.requests()
        .into_iter()
        .filter(|r| item_of(r).as_deref() == Some(id))
        .collect()
}

/// An execute request's brief (its first user message).
fn brief(req: &Value) -> String {
    req["messages"][1]["content"].as_str().unwrap().to_owned()
}

/// The names of the tools a request offered the model.
fn offered(req: &Value) -> BTreeSet<String> {
    req["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The seq of the `ITEM_STATUS_CHANGE` that moved `id` to `status` (the first such).
fn seq_of_status(obs: &[Value], id: &str, status: &str) -> i64 {
    obs.iter()
        .find(|o| {
            o["type"] == "ITEM_STATUS_CHANGE"
                && o["content"]["itemId"] == id
                && o["content"]["status"] == status
        })
        .unwrap_or_else(|| panic!("{id} never became {status}"))["seq"]
        .as_i64()
        .unwrap()
}

/// The most items in progress at once, replayed from the status changes.
fn most_in_progress(obs: &[Value]) -> usize {
    let mut now: BTreeSet<String> = BTreeSet::new();
    let mut most = 0;
    for o in of_type(obs, "ITEM_STATUS_CHANGE") {
        let id = o["content"]["itemId"].as_str().unwrap().to_owned();
        if o["content"]["status"] == "in_progress" {
            now.insert(id);
        } else {
            now.remove(&id);
        }
        most = most.max(now.len());
    }
    most
}

/// The order in which items started.
fn start_order(obs: &[Value]) -> Vec<String> {
    of_type(obs, "ITEM_STATUS_CHANGE")
        .into_iter()
        .filter(|o| {
            o["content"]["status"] == "in_progress" && o["content"]["previousStatus"] == "pending"
        })
        .map(|o| o["content"]["itemId"].as_str().unwrap().to_owned())
        .collect()
}

async fn state(app: &TestApp, t: &str) -> Value {
    let (s, st) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(s, 200, "{st}");
    st
}

/// The item `id` of a state's todo list.
fn item_in<'a>(state: &'a Value, id: &str) -> &'a Value {
    state["todoList"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == id)
        .unwrap_or_else(|| panic!("no item {id} in {state}"))
}

fn in_progress_ids(state: &Value) -> BTreeSet<String> {
    state["inProgressItemIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| (*s).to_owned()).collect()
}

fn three_and_a_join() -> Reply {
    plan(&[
        ("a", "part a", &[], &[]),
        ("b", "part b", &[], &[]),
        ("c", "part c", &[], &[]),
        ("d", "join the parts", &[], &["a", "b", "c"]),
    ])
}

/// Three independent items are all at the model at once (their requests are held there, so
/// none was answered when the third arrived); the item that needs all three starts only after
/// they completed and reads their results. `maxParallelItems: 1` runs them one at a time, and
/// `2` never has more than two in progress.
async fn ready_items_run_together_under_the_parallel_limit(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;

    llm.push("plan", three_and_a_join());
    llm.hold_if(|r| phase_of(r) == "execute");
    let t = app.thread(json!({})).await;
    let rid = app.start_run(&t, json!({"query": "graph please"})).await;
    wait_until("three execute requests at the model at once", async || {
        llm.requests_of("execute").len() >= 3
    })
    .await;
    let first: BTreeSet<String> = llm
        .requests_of("execute")
        .iter()
        .map(|r| item_of(r).unwrap())
        .collect();
    assert_eq!(
        first,
        set(&["a", "b", "c"]),
        "the three ready items, none answered yet"
    );
    let st = state(&app, &t).await;
    assert_eq!(in_progress_ids(&st), set(&["a", "b", "c"]), "{st}");
    assert!(
        first.contains(st["currentStepId"].as_str().unwrap()),
        "currentStepId is one of the items in progress: {st}"
    );
    assert_eq!(item_in(&st, "d")["status"], "pending");
    llm.release();
    let run = app.wait_run(&t, &rid, |r| r["status"] == "completed").await;
    assert_eq!(run["finalResponse"]["response"], "final answer", "{run}");

    let obs = app.observations(&t).await;
    assert_gap_free(&obs);
    assert_eq!(most_in_progress(&obs), 3);
    let d_started = seq_of_status(&obs, "d", "in_progress");
    for id in ["a", "b", "c"] {
        assert!(
            seq_of_status(&obs, id, "completed") < d_started,
            "d started before {id} completed"
        );
    }
    let timed = llm.requests_timed();
    let arrival = |id: &str| {
        timed
            .iter()
            .find(|(_, r)| item_of(r).as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no request for {id}"))
            .0
    };
    for id in ["a", "b", "c"] {
        assert!(arrival(id) < arrival("d"), "d asked before {id}");
    }
    let d = executes_of(&llm, "d");
    assert_eq!(d.len(), 1);
    let d_brief = brief(&d[0]);
    for id in ["a", "b", "c"] {
        assert!(
            d_brief.contains(&format!("- [{id}] part {id}: done")),
            "d reads {id}'s result: {d_brief}"
        );
    }
    let (_, s) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert!(in_progress_ids(&s).is_empty(), "{s}");

    // One at a time (thread config): each item starts after the one before it ended.
    llm.push("plan", three_and_a_join());
    let t1 = app.thread(json!({"config": {"maxParallelItems": 1}})).await;
    let rid = app.start_run(&t1, json!({"query": "graph please"})).await;
    app.wait_run(&t1, &rid, |r| r["status"] == "completed")
        .await;
    let obs = app.observations(&t1).await;
    assert_eq!(most_in_progress(&obs), 1, "strictly one at a time");
    assert_eq!(start_order(&obs), ["a", "b", "c", "d"], "in plan order");
    for (prev, next) in [("a", "b"), ("b", "c"), ("c", "d")] {
        assert!(seq_of_status(&obs, prev, "completed") < seq_of_status(&obs, next, "in_progress"));
    }

    // Two at a time (run config over the thread's default): two start together, never three.
    llm.push("plan", three_and_a_join());
    llm.hold_if(|r| phase_of(r) == "execute");
    let t2 = app.thread(json!({})).await;
    let rid = app
        .start_run(
            &t2,
            json!({"query": "graph please", "config": {"maxParallelItems": 2}}),
        )
        .await;
    let before = llm.requests_of("execute").len();
    wait_until("two execute requests at the model at once", async || {
        llm.requests_of("execute").len() >= before + 2
    })
    .await;
    let st = state(&app, &t2).await;
    assert_eq!(in_progress_ids(&st).len(), 2, "{st}");
    assert_eq!(
        item_in(&st, "c")["status"],
        "pending",
        "the third waits for room: {st}"
    );
    llm.release();
    app.wait_run(&t2, &rid, |r| r["status"] == "completed")
        .await;
    let obs = app.observations(&t2).await;
    assert_eq!(
        most_in_progress(&obs),
        2,
        "at most two at once, and two did run together"
    );
    assert_eq!(start_order(&obs)[..2], ["a", "b"]);
    app.stop().await;
}
both_stores!(
    parallel_limit,
    ready_items_run_together_under_the_parallel_limit
);

/// An item that uses up its model calls fails; what depends on it, directly or not, is
/// cancelled with a reason naming it, and never reaches the model; the independent branch
/// completes, and the synthesis is told which items failed and which were cancelled.
async fn a_failed_item_cancels_its_dependents_and_the_rest_goes_on(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan(&[
            ("f", "keeps calling tools", &["calculator"], &[]),
            ("g", "needs f", &[], &["f"]),
            ("h", "needs g", &[], &["g"]),
            ("i", "independent", &[], &[]),
            ("j", "needs i", &[], &["i"]),
            ("k", "needs j and g", &[], &["j", "g"]),
        ]),
    );
    // f never answers: every turn is another tool call.
    llm.set_item_default(
        "f",
        Reply::ToolCalls(vec![("calculator".into(), json!({"expression": "1+1"}))]),
    );
    let t = app.thread(json!({"config": {"maxIterations": 2}})).await;
    let run = app.run_wait(&t, "go").await;
    assert_eq!(
        run["status"], "completed",
        "the run itself completes: {run}"
    );

    let st = state(&app, &t).await;
    let f = item_in(&st, "f");
    assert_eq!(f["status"], "failed", "{f}");
    assert_eq!(f["error"]["code"], "max_iterations_exceeded", "{f}");
    assert_eq!(
        executes_of(&llm, "f").len(),
        2,
        "maxIterations model calls, no more"
    );
    for id in ["g", "h", "k"] {
        let it = item_in(&st, id);
        assert_eq!(it["status"], "cancelled", "{it}");
        assert_eq!(it["error"]["code"], "dependency_failed", "{it}");
        let msg = it["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("`f`"),
            "the reason names the failed item: {msg}"
        );
        assert!(executes_of(&llm, id).is_empty(), "{id} never ran");
    }
    assert!(
        item_in(&st, "h")["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`g`"),
        "and the dependency it waited on"
    );
    for id in ["i", "j"] {
        assert_eq!(item_in(&st, id)["status"], "completed", "{st}");
    }

    let obs = app.observations(&t).await;
    assert_gap_free(&obs);
    let err = of_type(&obs, "ERROR");
    assert_eq!(err.len(), 1, "{err:?}");
    assert_eq!(err[0]["parentId"], "f");
    assert_eq!(err[0]["content"]["code"], "max_iterations_exceeded");
    let failed_at = seq_of_status(&obs, "f", "failed");
    let synthesis_at = of_type(&obs, "SYNTHESIS")[0]["seq"].as_i64().unwrap();
    for id in ["g", "h", "k"] {
        let o = obs
            .iter()
            .find(|o| o["type"] == "ITEM_STATUS_CHANGE" && o["content"]["itemId"] == id)
            .unwrap();
        assert_eq!(
            o["content"],
            json!({"itemId": id, "status": "cancelled", "previousStatus": "pending"}),
            "{id} went from pending straight to cancelled"
        );
        let at = o["seq"].as_i64().unwrap();
        assert!(
            failed_at < at && at < synthesis_at,
            "{id} is cancelled when f fails, not at the end"
        );
    }

    let synth = llm.requests_of("synthesis");
    let user = synth.last().unwrap()["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        user.contains("- [f] keeps calling tools: FAILED ("),
        "{user}"
    );
    for (id, desc) in [("g", "needs f"), ("h", "needs g"), ("k", "needs j and g")] {
        assert!(
            user.contains(&format!("- [{id}] {desc}: CANCELLED (")),
            "{user}"
        );
    }
    assert!(user.contains("- [j] needs i: done"), "{user}");
    app.stop().await;
}
both_stores!(
    failure_propagation,
    a_failed_item_cancels_its_dependents_and_the_rest_goes_on
);

/// The suspension ids of `AGENT_SUSPENDED` observations, by item.
fn suspensions_by_item(obs: &[Value]) -> HashMap<String, String> {
    of_type(obs, "AGENT_SUSPENDED")
        .into_iter()
        .map(|o| {
            (
                o["parentId"].as_str().unwrap().to_owned(),
                o["content"]["suspensionId"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn id_set(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// Two items each wait for an approval: the run suspends once, naming both; approving one runs
/// that item and suspends again on the other; approving the other completes the run.
async fn two_waiting_items_suspend_the_run_once_and_resume_one_by_one(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan(&[
            ("a", "compute a", &["calculator"], &[]),
            ("b", "compute b", &["calculator"], &[]),
            ("c", "combine", &[], &["a", "b"]),
        ]),
    );
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&t, "compute both").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let rid = run["runId"].as_str().unwrap().to_owned();

    let obs = app.observations(&t).await;
    let by_item = suspensions_by_item(&obs);
    assert_eq!(by_item.len(), 2, "both items suspended: {by_item:?}");
    let (sa, sb) = (by_item["a"].clone(), by_item["b"].clone());
    let run_susp = of_type(&obs, "RUN_SUSPENDED");
    assert_eq!(
        run_susp.len(),
        1,
        "the run suspends once, when nothing can proceed"
    );
    assert!(run_susp[0]["parentId"].is_null());
    assert_eq!(
        id_set(&run_susp[0]["content"]["suspensionIds"]),
        set(&[&sa, &sb]),
        "{}",
        run_susp[0]
    );
    assert!(run_susp[0]["content"]["usage"].is_object());
    assert_eq!(obs.last().unwrap()["type"], "RUN_SUSPENDED");
    assert!(of_type(&obs, "TOOL_EXECUTION").is_empty());
    let (_, list) = app.get(&format!("/v1/threads/{t}/suspensions")).await;
    let pending: BTreeSet<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .inspect(|s| assert_eq!(s["status"], "pending", "{s}"))
        .map(|s| s["suspensionId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(pending, set(&[&sa, &sb]));
    let st = state(&app, &t).await;
    assert_eq!(item_in(&st, "a")["status"], "waiting");
    assert_eq!(item_in(&st, "b")["status"], "waiting");
    assert_eq!(item_in(&st, "c")["status"], "pending");
    assert!(in_progress_ids(&st).is_empty(), "{st}");
    let (_, thread) = app.get(&format!("/v1/threads/{t}")).await;
    assert_eq!(thread["status"], "suspended");

    let (s, resumed) = resume(&app, &sa, json!({"decision": "approve"})).await;
    assert_eq!(s, 202, "{resumed}");
    assert_eq!(resumed["runId"], rid.as_str());
    let again = app.wait_run(&t, &rid, |r| r["status"] == "suspended").await;
    assert_eq!(again["status"], "suspended");
    let obs = app.observations(&t).await;
    let run_susp = of_type(&obs, "RUN_SUSPENDED");
    assert_eq!(run_susp.len(), 2, "suspended again, on the other item");
    assert_eq!(run_susp[1]["content"]["suspensionIds"], json!([sb]));
    let execs = of_type(&obs, "TOOL_EXECUTION");
    assert_eq!(execs.len(), 1, "only a's approved call ran");
    assert_eq!(execs[0]["parentId"], "a");
    let st = state(&app, &t).await;
    assert_eq!(item_in(&st, "a")["status"], "completed", "{st}");
    assert_eq!(item_in(&st, "b")["status"], "waiting");
    assert_eq!(item_in(&st, "c")["status"], "pending");
    let (_, list) = app.get(&format!("/v1/threads/{t}/suspensions")).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_eq!(list["items"][0]["suspensionId"], sb.as_str());

    let (s, _) = resume(&app, &sb, json!({"decision": "approve"})).await;
    assert_eq!(s, 202);
    let done = app.wait_run(&t, &rid, |r| r["status"] == "completed").await;
    assert_eq!(done["finalResponse"]["response"], "final answer");
    let obs = app.observations(&t).await;
    assert_gap_free(&obs);
    let execs = of_type(&obs, "TOOL_EXECUTION");
    assert_eq!(execs.len(), 2, "each approved call ran once");
    assert_eq!(of_type(&obs, "RUN_SUSPENDED").len(), 2);
    assert_eq!(of_type(&obs, "AGENT_RESUMED").len(), 2);
    assert_eq!(of_type(&obs, "PLAN").len(), 1);
    let st = state(&app, &t).await;
    for id in ["a", "b", "c"] {
        assert_eq!(item_in(&st, id)["status"], "completed", "{st}");
    }
    app.stop().await;
}
both_stores!(
    two_suspensions,
    two_waiting_items_suspend_the_run_once_and_resume_one_by_one
);

/// Item `a` waits for an approval while `s` works on: `s` completes meanwhile and `u` (which
/// needs `s`) starts and is held at the model, so the run is still `running`. Returns the thread,
/// the run and `a`'s suspension.
async fn approval_pending_while_others_run(
    app: &TestApp,
    llm: &FakeLlm,
) -> (String, String, String) {
    llm.push(
        "plan",
        plan(&[
            ("a", "compute a", &["calculator"], &[]),
            ("s", "slow work", &[], &[]),
            ("u", "after the slow work", &[], &["s"]),
        ]),
    );
    llm.push_item("s", Reply::Text("slow result".into()));
    llm.hold_if(|r| matches!(item_of(r).as_deref(), Some("s" | "u")));
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let rid = app.start_run(&t, json!({"query": "graph please"})).await;
    wait_until("a suspended while s is at the model", async || {
        let obs = app.observations(&t).await;
        !of_type(&obs, "AGENT_SUSPENDED").is_empty() && !executes_of(llm, "s").is_empty()
    })
    .await;
    let (_, r) = app.get(&format!("/v1/threads/{t}/runs/{rid}")).await;
    assert_eq!(r["status"], "running", "s is still working: {r}");
    let st = state(app, &t).await;
    assert_eq!(item_in(&st, "a")["status"], "waiting");
    assert_eq!(in_progress_ids(&st), set(&["s"]), "{st}");

    // s answers and completes while a waits; u starts (and is held at the model).
    llm.hold_if(|r| item_of(r).as_deref() == Some("u"));
    wait_until("u at the model", async || !executes_of(llm, "u").is_empty()).await;
    let st = state(app, &t).await;
    assert_eq!(item_in(&st, "s")["status"], "completed", "{st}");
    assert_eq!(item_in(&st, "a")["status"], "waiting", "{st}");
    assert_eq!(in_progress_ids(&st), set(&["u"]), "{st}");
    let (_, r) = app.get(&format!("/v1/threads/{t}/runs/{rid}")).await;
    assert_eq!(r["status"], "running", "{r}");
    let obs = app.observations(&t).await;
    assert!(
        of_type(&obs, "RUN_SUSPENDED").is_empty(),
        "the run is not waiting yet"
    );
    let sid = suspensions_by_item(&obs)["a"].clone();
    (t, rid, sid)
}

/// One item waits for an approval while another works on: the other item completes meanwhile,
/// the run stays `running`, a decision taken then is accepted (202, not 409), and the run
/// completes without being resumed again.
async fn a_waiting_item_does_not_stop_the_others(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let (t, rid, sid) = approval_pending_while_others_run(&app, &llm).await;
    let (s, resumed) = resume(&app, &sid, json!({"decision": "approve"})).await;
    assert_eq!(s, 202, "a decision is taken while the run runs: {resumed}");
    assert_eq!(resumed["runId"], rid.as_str());
    assert_eq!(resumed["status"], "running", "{resumed}");
    llm.release();
    let done = app
        .wait_run(&t, &rid, |r| {
            matches!(
                r["status"].as_str(),
                Some("completed" | "failed" | "suspended")
            )
        })
        .await;
    assert_eq!(
        done["status"], "completed",
        "no second resume needed: {done}"
    );

    let obs = app.observations(&t).await;
    assert_gap_free(&obs);
    let execs = of_type(&obs, "TOOL_EXECUTION");
    assert_eq!(execs.len(), 1, "{execs:?}");
    assert_eq!(execs[0]["parentId"], "a");
    assert_eq!(execs[0]["content"]["status"], "success");
    assert_eq!(of_type(&obs, "AGENT_RESUMED").len(), 1);
    let s_done = seq_of_status(&obs, "s", "completed");
    let a_suspended = of_type(&obs, "AGENT_SUSPENDED")[0]["seq"].as_i64().unwrap();
    let a_resumed = of_type(&obs, "AGENT_RESUMED")[0]["seq"].as_i64().unwrap();
    assert!(
        a_suspended < s_done && s_done < a_resumed,
        "s completed while a waited"
    );
    let st = state(&app, &t).await;
    for id in ["a", "s", "u"] {
        assert_eq!(item_in(&st, id)["status"], "completed", "{st}");
    }
    let (_, list) = app.get(&format!("/v1/threads/{t}/suspensions")).await;
    assert!(list["items"].as_array().unwrap().is_empty(), "{list}");
    app.stop().await;
}
both_stores!(
    waiting_does_not_block,
    a_waiting_item_does_not_stop_the_others
);

/// A person who decides while the run is busy with other items, and follows the resumed run
/// (`Accept: text/event-stream` on resume), sees it through to `RUN_COMPLETED`: the run never
/// waited for people, so its log never says `RUN_SUSPENDED` (which ends such a stream).
async fn a_decision_taken_while_running_is_followed_to_the_end(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let (t, rid, sid) = approval_pending_while_others_run(&app, &llm).await;
    let r = app
        .client
        .post(app.url(&format!("/v1/suspensions/{sid}/resume")))
        .header("accept", "text/event-stream")
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .unwrap();
    let mut sse = SseReader::new(r);
    llm.release();
    let mut seen = Vec::new();
    while let Some(f) = sse.next(Duration::from_secs(30)).await {
        if !f.comment {
            seen.push(serde_json::from_str::<Value>(&f.data).unwrap());
        }
    }
    let types: Vec<&str> = seen.iter().map(|o| o["type"].as_str().unwrap()).collect();
    app.wait_run(&t, &rid, |r| r["status"] == "completed").await;
    assert_eq!(
        types.last(),
        Some(&"RUN_COMPLETED"),
        "the stream of the resumed run ends when it completes: {types:?}"
    );
    let obs = app.observations(&t).await;
    let run_susp = of_type(&obs, "RUN_SUSPENDED");
    assert!(
        run_susp.is_empty(),
        "RUN_SUSPENDED committed though the decision was in and the run went on: {run_susp:?}"
    );
    app.stop().await;
}
both_stores!(
    decided_while_running,
    a_decision_taken_while_running_is_followed_to_the_end
);

/// A decision taken while other items work is used while they still work: the approved call
/// runs (and its item completes) while `u` is still held at the model, without waiting for the run
/// to run out of other work.
async fn a_decision_is_used_while_other_items_still_work(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let (t, rid, sid) = approval_pending_while_others_run(&app, &llm).await;
    let (status, _) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(status, 202);
    wait_until("a completes while u is held", async || {
        let st = state(&app, &t).await;
        item_in(&st, "a")["status"] == "completed"
    })
    .await;
    let st = state(&app, &t).await;
    assert_eq!(
        item_in(&st, "u")["status"],
        "in_progress",
        "u is still at the model: {st}"
    );
    let obs = app.observations(&t).await;
    assert_eq!(
        of_type(&obs, "TOOL_EXECUTION").len(),
        1,
        "the approved call ran once"
    );
    llm.release();
    app.wait_run(&t, &rid, |r| r["status"] == "completed").await;
    app.stop().await;
}
both_stores!(
    decided_mid_run,
    a_decision_is_used_while_other_items_still_work
);

/// A fallback look at the suspensions a day away: a decision that reaches a busy run in these
/// tests was pushed to it.
const NO_FALLBACK_MS: u64 = 86_400_000;

/// Once a decision on `a`'s suspension is in while `u` is held at the model: `a`'s work goes on
/// (its call was decided and it asks the model again) before `u` finishes, which it cannot do
/// until the test releases it. Then everything completes, `a` before `u`.
async fn a_goes_on_while_u_is_held(app: &TestApp, llm: &FakeLlm, t: &str, rid: &str) {
    wait_until("a asks the model again after the decision", async || {
        executes_of(llm, "a").len() >= 2
    })
    .await;
    let st = state(app, t).await;
    assert_eq!(
        item_in(&st, "u")["status"],
        "in_progress",
        "u is held: {st}"
    );
    let obs = app.observations(t).await;
    assert_eq!(of_type(&obs, "AGENT_RESUMED").len(), 1, "{obs:?}");
    llm.release();
    app.wait_run(t, rid, |r| r["status"] == "completed").await;
    let obs = app.observations(t).await;
    assert_gap_free(&obs);
    assert!(
        seq_of_status(&obs, "a", "completed") < seq_of_status(&obs, "u", "completed"),
        "a completed while u was held"
    );
    assert!(
        of_type(&obs, "RUN_SUSPENDED").is_empty(),
        "the run never waited"
    );
}

/// A decision taken while other items work reaches the run at once: it is pushed to the run
/// (not found at the run's next look at its suspensions, which is a day away here), so the
/// decided item goes on while the other item is still held at the model.
async fn a_decision_reaches_a_busy_run_at_once(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| c.decision_poll_ms = NO_FALLBACK_MS).await;
    let (t, rid, sid) = approval_pending_while_others_run(&app, &llm).await;
    let (status, resumed) = resume(&app, &sid, json!({"decision": "approve"})).await;
    assert_eq!(status, 202, "{resumed}");
    a_goes_on_while_u_is_held(&app, &llm, &t, &rid).await;
    let obs = app.observations(&t).await;
    assert_eq!(
        of_type(&obs, "TOOL_EXECUTION").len(),
        1,
        "the approved call ran once"
    );
    app.stop().await;
}
both_stores!(decision_pushed, a_decision_reaches_a_busy_run_at_once);

/// Two replicas on one Postgres: A drives the run, B (which runs no agents) takes the decision;
/// the decision reaches the run on A at once, through the store's signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_taken_on_another_replica_reaches_the_busy_run_at_once() {
    let llm = FakeLlm::start().await;
    let url = crate::helpers::database_url(Backend::Postgres).await;
    let mut on_a = test_config(&url, Some(&llm));
    on_a.decision_poll_ms = NO_FALLBACK_MS;
    let a = spawn_config(on_a).await;
    let mut on_b = test_config(&url, Some(&llm));
    on_b.worker_concurrency = 0;
    let b = spawn_config(on_b).await;
    let (t, rid, sid) = approval_pending_while_others_run(&a, &llm).await;
    let (status, resumed) = resume(&b, &sid, json!({"decision": "approve"})).await;
    assert_eq!(status, 202, "{resumed}");
    assert_eq!(resumed["status"], "running", "A still drives it: {resumed}");
    a_goes_on_while_u_is_held(&a, &llm, &t, &rid).await;
    a.stop().await;
    b.stop().await;
}

/// An expiry is a decision too: a suspension that expires while other items work reaches the
/// busy run at once (the sweeper resolves it through the same command as a person), so the
/// item goes on, told its call was rejected, while the other item is still held at the model.
async fn an_expiry_reaches_a_busy_run_at_once(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn_with(backend, Some(&llm), |c| {
        c.decision_poll_ms = NO_FALLBACK_MS;
        c.suspension_sweep_ms = 50;
    })
    .await;
    llm.push(
        "plan",
        plan(&[
            ("a", "compute a", &["calculator"], &[]),
            ("s", "slow work", &[], &[]),
        ]),
    );
    llm.hold_if(|r| item_of(r).as_deref() == Some("s"));
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"], "suspensionTtlSeconds": 1}}))
        .await;
    let rid = app.start_run(&t, json!({"query": "graph please"})).await;
    wait_until(
        "a asks the model again after its suspension expired",
        async || executes_of(&llm, "a").len() >= 2,
    )
    .await;
    let st = state(&app, &t).await;
    assert_eq!(
        item_in(&st, "s")["status"],
        "in_progress",
        "s is held: {st}"
    );
    let obs = app.observations(&t).await;
    let resumed = of_type(&obs, "AGENT_RESUMED");
    assert_eq!(resumed.len(), 1, "{obs:?}");
    assert_eq!(resumed[0]["content"]["expired"], true, "{resumed:?}");
    let execs = of_type(&obs, "TOOL_EXECUTION");
    assert_eq!(execs.len(), 1, "{execs:?}");
    assert_eq!(
        execs[0]["content"]["status"], "rejected",
        "the call never ran"
    );
    llm.release();
    app.wait_run(&t, &rid, |r| r["status"] == "completed").await;
    let obs = app.observations(&t).await;
    assert!(
        seq_of_status(&obs, "a", "completed") < seq_of_status(&obs, "s", "completed"),
        "a completed while s was held"
    );
    app.stop().await;
}
both_stores!(expiry_pushed, an_expiry_reaches_a_busy_run_at_once);

/// A result longer than `compactionThresholdChars` is summarized once (`COMPACTION` with the
/// lengths in characters) and only the summary reaches the items that read it and the
/// synthesis; a short result is its own compacted output, with no model call.
async fn long_results_are_compacted_before_others_read_them(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    llm.push(
        "plan",
        plan(&[
            ("long", "write a lot", &[], &[]),
            ("short", "write a little", &[], &[]),
            ("next", "use both", &[], &["long", "short"]),
        ]),
    );
    // Multi-byte characters: the counts are characters, not bytes.
    let long_text = format!("LONG-START {} LONG-END", "données ".repeat(60));
    let summary = "Résumé: the long item found données.";
    llm.push_item("long", Reply::Text(long_text.clone()));
    llm.push_item("short", Reply::Text("short result".into()));
    llm.push("compaction", Reply::Json(json!({"summary": summary})));
    let t = app
        .thread(json!({"config": {"compactionThresholdChars": 200}}))
        .await;
    let run = app.run_wait(&t, "go").await;
    assert_eq!(run["status"], "completed", "{run}");

    let compactions = llm.requests_of("compaction");
    assert_eq!(compactions.len(), 1, "only the long result is compacted");
    assert!(
        compactions[0].to_string().contains("LONG-END"),
        "the whole result is sent"
    );
    let obs = app.observations(&t).await;
    let comp = of_type(&obs, "COMPACTION");
    assert_eq!(comp.len(), 1, "{comp:?}");
    assert_eq!(comp[0]["parentId"], "long");
    assert_eq!(
        comp[0]["content"],
        json!({
            "itemId": "long",
            "summary": summary,
            "inputChars": long_text.chars().count(),
            "outputChars": summary.chars().count(),
        })
    );
    assert!(
        comp[0]["seq"].as_i64().unwrap() < seq_of_status(&obs, "next", "in_progress"),
        "the dependent starts once the summary exists"
    );
    let st = state(&app, &t).await;
    let long = item_in(&st, "long");
    assert_eq!(long["result"], long_text.as_str());
    assert_eq!(long["compactedOutput"], summary);
    let short = item_in(&st, "short");
    assert_eq!(short["compactedOutput"], short["result"]);
    assert_eq!(short["compactedOutput"], "short result");

    let next = brief(&executes_of(&llm, "next")[0]);
    assert!(
        next.contains(&format!("- [long] write a lot: {summary}")),
        "{next}"
    );
    assert!(
        next.contains("- [short] write a little: short result"),
        "{next}"
    );
    assert!(
        !next.contains("LONG-START"),
        "the long text stays out: {next}"
    );
    let synth = llm.requests_of("synthesis")[0].to_string();
    assert!(synth.contains("Résumé"), "{synth}");
    assert!(!synth.contains("LONG-START"), "{synth}");
    app.stop().await;
}
both_stores!(
    compaction,
    long_results_are_compacted_before_others_read_them
);

/// With `contextMode` `dependencies` (the default) an item reads only its dependencies'
/// results, not those of other completed items; with `all` it reads every completed one.
async fn context_mode_decides_which_results_an_item_reads(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let the_plan = || {
        plan(&[
            ("x", "unrelated", &[], &[]),
            ("a", "upstream", &[], &[]),
            ("c", "downstream", &[], &["a"]),
        ])
    };
    // One at a time, in plan order: x and a have completed when c starts.
    for (mode, sees_x) in [(None, false), (Some("all"), true)] {
        llm.push("plan", the_plan());
        llm.push_item("x", Reply::Text("OUTPUT-OF-X".into()));
        llm.push_item("a", Reply::Text("OUTPUT-OF-A".into()));
        let mut cfg = json!({"maxParallelItems": 1});
        if let Some(m) = mode {
            cfg["contextMode"] = json!(m);
        }
        let t = app.thread(json!({"config": cfg})).await;
        let run = app.run_wait(&t, "go").await;
        assert_eq!(run["status"], "completed", "{run}");
        let obs = app.observations(&t).await;
        assert_eq!(start_order(&obs), ["x", "a", "c"]);
        let c = brief(executes_of(&llm, "c").last().unwrap());
        assert!(c.contains("Results of earlier items:"), "{c}");
        assert!(c.contains("- [a] upstream: OUTPUT-OF-A"), "{mode:?}: {c}");
        assert_eq!(c.contains("OUTPUT-OF-X"), sees_x, "{mode:?}: {c}");
        let a = brief(executes_of(&llm, "a").last().unwrap());
        assert_eq!(a.contains("OUTPUT-OF-X"), sees_x, "{mode:?}: {a}");
    }
    app.stop().await;
}
both_stores!(
    context_mode,
    context_mode_decides_which_results_an_item_reads
);

/// Roles: the planner sees them, an unknown one gets one repair request, the role's fragment
/// leads the item's goal and its tools narrow the item's. `toolAllowlist` narrows the tools an
/// item is offered, and a call outside it is a tool error, not a run; `requiredTools` outside
/// the allowlist is a plan error the model repairs.
async fn roles_and_allowlists_shape_an_item(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let roles = json!({
        "analyst": {
            "name": "Analyst",
            "systemPromptFragment": "FRAGMENT-ANALYST: think in numbers.",
            "tools": ["calculator"]
        }
    });
    let mut bad = item("r", "analyse", &[], &[]);
    bad["role"] = json!("poet");
    llm.push("plan", plan_of(vec![bad]));
    let mut r = item("r", "analyse", &[], &[]);
    r["role"] = json!("analyst");
    r["stepType"] = json!("tool");
    let mut narrow = item("n", "use the allowed tool", &[], &[]);
    narrow["stepType"] = json!("tool");
    narrow["toolAllowlist"] = json!(["calculator"]);
    let free = item("w", "any tool", &["current_time"], &[]);
    llm.push("plan", plan_of(vec![r, narrow, free]));
    llm.push_item(
        "n",
        Reply::ToolCalls(vec![("current_time".into(), json!({}))]),
    );
    llm.push_item(
        "n",
        Reply::ToolCalls(vec![("calculator".into(), json!({"expression": "6*7"}))]),
    );
    llm.push_item(
        "w",
        Reply::ToolCalls(vec![("current_time".into(), json!({}))]),
    );
    let t = app.thread(json!({"config": {"roles": roles}})).await;
    let run = app.run_wait(&t, "go").await;
    assert_eq!(run["status"], "completed", "{run}");

    let plans = llm.requests_of("plan");
    assert_eq!(plans.len(), 2, "one repair request");
    let system = plans[0]["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("- analyst: Analyst, FRAGMENT-ANALYST"),
        "{system}"
    );
    let repair = plans[1]["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        repair.contains("unknown role `poet` (roles: analyst)"),
        "{repair}"
    );

    let st = state(&app, &t).await;
    assert_eq!(item_in(&st, "r")["role"], "analyst");
    assert_eq!(item_in(&st, "n")["toolAllowlist"], json!(["calculator"]));
    let r_req = &executes_of(&llm, "r")[0];
    let rb = brief(r_req);
    let role_at = rb
        .find("Role: Analyst\nFRAGMENT-ANALYST: think in numbers.")
        .expect(&rb);
    assert!(
        role_at < rb.find("Your item [r]").unwrap(),
        "the fragment comes first: {rb}"
    );
    assert_eq!(
        offered(r_req),
        set(&["calculator", "update_plan"]),
        "the role's tools"
    );

    let n_reqs = executes_of(&llm, "n");
    assert_eq!(n_reqs.len(), 3);
    for req in &n_reqs {
        assert_eq!(
            offered(req),
            set(&["calculator", "update_plan"]),
            "only the allowlist"
        );
    }
    assert!(!brief(&n_reqs[0]).contains("Role:"));
    let w_tools = offered(&executes_of(&llm, "w")[0]);
    assert!(
        w_tools.contains("current_time") && w_tools.contains("calculator"),
        "{w_tools:?}"
    );
    let obs = app.observations(&t).await;
    let n_execs: Vec<&Value> = of_type(&obs, "TOOL_EXECUTION")
        .into_iter()
        .filter(|o| o["parentId"] == "n")
        .collect();
    assert_eq!(n_execs.len(), 2);
    assert_eq!(n_execs[0]["content"]["name"], "current_time");
    assert_eq!(n_execs[0]["content"]["status"], "error");
    assert!(
        n_execs[0]["content"]["error"]
            .as_str()
            .unwrap()
            .contains("not available for this item"),
        "{}",
        n_execs[0]
    );
    assert!(n_execs[0]["content"]["output"].is_null(), "it did not run");
    assert_eq!(n_execs[1]["content"]["status"], "success");
    assert_eq!(n_execs[1]["content"]["output"]["result"], 42);
    let w_exec = of_type(&obs, "TOOL_EXECUTION")
        .into_iter()
        .find(|o| o["parentId"] == "w")
        .unwrap();
    assert_eq!(w_exec["content"]["status"], "success", "{w_exec}");

    // requiredTools must be within toolAllowlist: one repair request says so.
    let mut outside = item("o", "x", &["current_time"], &[]);
    outside["toolAllowlist"] = json!(["calculator"]);
    llm.push("plan", plan_of(vec![outside]));
    llm.push("plan", plan_of(vec![item("o", "x", &[], &[])]));
    let t2 = app.thread(json!({})).await;
    let run = app.run_wait(&t2, "go").await;
    assert_eq!(run["status"], "completed", "{run}");
    let plans = llm.requests_of("plan");
    let repair = plans.last().unwrap()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        repair.contains("requires tool `current_time` that its toolAllowlist does not allow"),
        "{repair}"
    );
    app.stop().await;
}
both_stores!(roles_and_allowlists, roles_and_allowlists_shape_an_item);

/// kill -9 while two items are each inside a `debug_sleep` call: after a restart both calls
/// run again from the journal (the model is not asked again for them), the call that had
/// completed before the crash never runs again, and the run completes with a gap-free log.
async fn kill_9_with_two_items_in_flight(backend: Backend) {
    use crate::durability::{all_observations, completed_calls, env, temp_log};
    use crate::process::Proc;

    let llm = FakeLlm::start().await;
    let log = temp_log();
    let db = crate::helpers::database_url(backend).await;
    llm.push(
        "plan",
        plan(&[
            ("a", "sleep a", &["debug_sleep"], &[]),
            ("b", "sleep b", &["debug_sleep"], &[]),
            ("c", "after both", &[], &["a", "b"]),
        ]),
    );
    let sleep = |ms: u64, tag: &str| {
        Reply::ToolCalls(vec![("debug_sleep".into(), json!({"ms": ms, "tag": tag}))])
    };
    llm.push_item("a", sleep(20, "a1"));
    llm.push_item("a", sleep(4000, "a2"));
    llm.push_item("b", sleep(4000, "b1"));
    let p1 = Proc::start(&env(&db, &llm, &log, "3")).await;
    let (s, run) = p1
        .post(
            "/v1/threads/t/runs",
            json!({"query": "go", "ifNotExists": "create"}),
        )
        .await;
    assert_eq!(s, 202, "{run}");
    let rid = run["runId"].as_str().unwrap().to_owned();
    // Each slow call is journaled (TOOL_CALL) before it runs.
    p1.wait_for("/v1/threads/t/observations?type=TOOL_CALL", |p| {
        let tags: BTreeSet<String> = p["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                o["content"]["arguments"]["tag"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        tags.contains("a2") && tags.contains("b1")
    })
    .await;
    let (_, st) = p1.get("/v1/threads/t/state").await;
    assert_eq!(in_progress_ids(&st), set(&["a", "b"]), "{st}");
    p1.kill9().await;
    let calls = completed_calls(&log);
    assert_eq!(calls.get("a1"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("a2"), None, "a2 was in flight: {calls:?}");
    assert_eq!(calls.get("b1"), None, "b1 was in flight: {calls:?}");

    let p2 = Proc::start(&env(&db, &llm, &log, "3")).await;
    let done = p2
        .wait_for(&format!("/v1/threads/t/runs/{rid}"), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["attempt"], 2, "re-claimed once");
    let calls = completed_calls(&log);
    assert_eq!(
        calls.get("a1"),
        Some(&1),
        "a completed call never runs again: {calls:?}"
    );
    assert_eq!(calls.get("a2"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("b1"), Some(&1), "{calls:?}");
    // The calls in flight ran again under their first idempotency keys (run id + call id).
    let lines = std::fs::read_to_string(&log).unwrap();
    assert!(lines.lines().all(|l| l.contains(&rid)), "{lines}");

    let obs = all_observations(&p2, "t").await;
    assert_gap_free(&obs);
    for tag in ["a1", "a2", "b1"] {
        let n = |ty: &str| {
            obs.iter()
                .filter(|o| o["type"] == ty)
                .filter(|o| {
                    let args = &o["content"]["arguments"];
                    args["tag"] == tag || o["content"]["output"]["tag"] == tag
                })
                .count()
        };
        assert_eq!(n("TOOL_CALL"), 1, "{tag} was asked for once");
        assert_eq!(n("TOOL_EXECUTION"), 1, "{tag} has one result");
    }
    assert_eq!(executes_of(&llm, "a").len(), 3, "a1, a2, then the answer");
    assert_eq!(executes_of(&llm, "b").len(), 2, "b1, then the answer");
    assert_eq!(obs.iter().filter(|o| o["type"] == "RUN_STARTED").count(), 1);
    let (_, st) = p2.get("/v1/threads/t/state").await;
    for id in ["a", "b", "c"] {
        assert_eq!(item_in(&st, id)["status"], "completed", "{st}");
    }
    p2.kill9().await;
    let _ = std::fs::remove_file(&log);
}
both_stores!(kill_9_two_in_flight, kill_9_with_two_items_in_flight);
