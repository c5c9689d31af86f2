use serde_json::json;

use super::*;
use crate::model::{ItemId, SuspensionStatus, ThreadId, ToolCallRecord};

const THREAD: &str = "t-1";

fn obs(run: Uuid, seq: i64, kind: ObservationType, content: Value) -> Observation {
    Observation {
        id: Uuid::now_v7(),
        seq,
        thread_id: ThreadId::parse(THREAD).unwrap(),
        tenant: "default".into(),
        run_id: Some(run),
        parent_id: None,
        kind,
        title: String::new(),
        content,
        created_at: chrono::Utc::now(),
    }
}

fn item(id: &str, status: &str) -> Value {
    json!({"id": id, "description": id, "status": status, "dependencies": [], "stepType": "tool",
           "requiredTools": [], "kind": "leaf", "parentItemId": null, "role": null})
}

fn status(run: Uuid, seq: i64, id: &str, to: &str, from: &str) -> Observation {
    obs(
        run,
        seq,
        ObservationType::ItemStatusChange,
        json!({"itemId": id, "status": to, "previousStatus": from}),
    )
}

fn usage(prompt: u64, completion: u64) -> Value {
    json!({"promptTokens": prompt, "completionTokens": completion,
           "totalTokens": prompt + completion, "llmCalls": 1})
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(Event::kind).collect()
}

fn suspension(run: Uuid) -> Suspension {
    Suspension {
        suspension_id: Uuid::now_v7(),
        thread_id: ThreadId::parse(THREAD).unwrap(),
        tenant: "default".into(),
        run_id: run,
        item_id: ItemId::parse("a").unwrap(),
        kind: SuspensionKind::Approval,
        tool_call: ToolCallRecord {
            id: "call-1".into(),
            name: "calculator".into(),
            arguments: json!({"expression": "2+2"}),
        },
        allowed_decisions: vec![
            crate::model::Decision::Approve,
            crate::model::Decision::Reject,
        ],
        question: None,
        input_schema: None,
        iteration_state: json!({}),
        partial_tool_results: vec![],
        status: SuspensionStatus::Pending,
        decision: None,
        created_at: chrono::Utc::now(),
        resolved_at: None,
        expires_at: None,
    }
}

#[test]
fn a_run_with_a_tool_reads_as_one_balanced_agui_run() {
    let run = Uuid::now_v7();
    let mut fold = Fold::new(THREAD.into(), "r-1".into(), run, Base::default());
    let mut all = fold.open(false, 0, 1);
    assert_eq!(kinds(&all), ["RUN_STARTED", "STATE_SNAPSHOT"]);
    let plan = obs(
        run,
        1,
        ObservationType::Plan,
        json!({"plan": "p", "todoList": [item("a", "pending")]}),
    );
    all.extend(fold.observation(&plan, &[]));
    all.extend(fold.observation(&status(run, 2, "a", "in_progress", "pending"), &[]));
    let call = obs(
        run,
        3,
        ObservationType::ToolCall,
        json!({"toolCallId": "c1", "name": "calculator", "arguments": {"expression": "2+2"}}),
    );
    all.extend(fold.observation(&call, &[]));
    let exec = obs(
        run,
        4,
        ObservationType::ToolExecution,
        json!({"toolCallId": "c1", "name": "calculator", "status": "success", "output": {"result": 4}, "error": null}),
    );
    all.extend(fold.observation(&exec, &[]));
    all.extend(fold.observation(&status(run, 5, "a", "completed", "in_progress"), &[]));
    let answer = obs(
        run,
        6,
        ObservationType::FinalResponse,
        json!({"response": "4", "sources": [], "suggestions": []}),
    );
    all.extend(fold.observation(&answer, &[]));
    let done = obs(
        run,
        7,
        ObservationType::RunCompleted,
        json!({"usage": usage(10, 5), "durationMs": 3}),
    );
    all.extend(fold.observation(&done, &[]));
    assert_eq!(
        kinds(&all),
        [
            "RUN_STARTED",
            "STATE_SNAPSHOT",
            "STATE_DELTA",
            "STATE_DELTA",
            "STEP_STARTED",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT",
            "STATE_DELTA",
            "STEP_FINISHED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED"
        ]
    );
    assert!(fold.finished());
    let last = serde_json::to_value(all.last().unwrap()).unwrap();
    assert_eq!(last["outcome"], json!({"type": "success"}));
    assert_eq!(last["result"]["response"], "4");
    assert_eq!(
        last["usage"],
        json!([{"inputTokens": 10, "outputTokens": 5, "totalTokens": 15}])
    );
    let args = serde_json::to_value(&all[6]).unwrap();
    assert_eq!(args["delta"], r#"{"expression":"2+2"}"#);
    let result = serde_json::to_value(&all[8]).unwrap();
    assert_eq!(result["content"], r#"{"result":4}"#);
    // Nothing after the end.
    assert!(fold.observation(&done, &[]).is_empty());
    assert!(fold.cut("x", "y", 9).is_empty());
}

#[test]
fn the_deltas_turn_the_snapshot_into_the_final_list() {
    let run = Uuid::now_v7();
    let mut base = Base::default();
    base.apply(
        &obs(
            Uuid::now_v7(),
            1,
            ObservationType::Plan,
            json!({"plan": "old", "todoList": [item("x", "completed")]}),
        ),
        run,
    );
    let mut fold = Fold::new(THREAD.into(), "r".into(), run, base);
    let head = fold.open(false, 1, 0);
    let Body::StateSnapshot { snapshot } = &head[1].body else {
        panic!("{head:?}")
    };
    let mut state = snapshot.clone();
    let steps = [
        obs(
            run,
            2,
            ObservationType::PlanUpdate,
            json!({"added": [], "changed": [], "removed": [],
                   "todoList": [item("x", "completed"), item("t", "pending"), item("b", "pending")]}),
        ),
        obs(
            run,
            3,
            ObservationType::Plan,
            json!({"plan": "team", "teamId": "t", "todoList": [item("t.c", "pending")]}),
        ),
        status(run, 4, "t.c", "in_progress", "pending"),
        status(run, 5, "t.c", "failed", "in_progress"),
        status(run, 6, "b", "cancelled", "pending"),
    ];
    for o in &steps {
        for e in fold.observation(o, &[]) {
            if let Body::StateDelta { delta } = e.body {
                json_patch::patch(&mut state, &delta).unwrap();
            }
        }
    }
    let ids: Vec<(&str, &str)> = state["todoList"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["id"].as_str().unwrap(), i["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        ids,
        [
            ("x", "completed"),
            ("t", "pending"),
            ("b", "cancelled"),
            ("t.c", "failed")
        ]
    );
    assert_eq!(state["todoList"][3]["parentItemId"], "t");
}

#[test]
fn a_suspended_run_closes_its_steps_and_ends_with_interrupts_then_resumes_as_a_new_run() {
    let run = Uuid::now_v7();
    let mut fold = Fold::new(THREAD.into(), "r-1".into(), run, Base::default());
    let mut all = fold.open(false, 0, 0);
    let plan = obs(
        run,
        1,
        ObservationType::Plan,
        json!({"plan": "p", "todoList": [item("a", "pending")]}),
    );
    all.extend(fold.observation(&plan, &[]));
    all.extend(fold.observation(&status(run, 2, "a", "in_progress", "pending"), &[]));
    all.extend(fold.observation(&status(run, 3, "a", "waiting", "in_progress"), &[]));
    let s = suspension(run);
    let suspended = obs(
        run,
        4,
        ObservationType::RunSuspended,
        json!({"suspensionIds": [s.suspension_id], "usage": usage(7, 3)}),
    );
    all.extend(fold.observation(&suspended, std::slice::from_ref(&s)));
    assert_eq!(
        &kinds(&all)[5..],
        ["STATE_DELTA", "STEP_FINISHED", "RUN_FINISHED"]
    );
    let end = serde_json::to_value(all.last().unwrap()).unwrap();
    let interrupt = &end["outcome"]["interrupts"][0];
    assert_eq!(end["outcome"]["type"], "interrupt");
    assert_eq!(interrupt["id"], s.suspension_id.to_string());
    assert_eq!(interrupt["reason"], "tool_approval");
    assert_eq!(interrupt["toolCallId"], "call-1");
    assert_eq!(
        interrupt["responseSchema"]["properties"]["decision"]["enum"],
        json!(["approve", "reject"])
    );
    assert_eq!(interrupt["metadata"]["pes"]["kind"], "approval");

    // The resumed run: the waiting item's step opens at once, usage counts from the suspension.
    let mut base = Base::default();
    for o in [&plan, &status(run, 2, "a", "in_progress", "pending")] {
        base.apply(o, run);
    }
    base.apply(&status(run, 3, "a", "waiting", "in_progress"), run);
    base.apply(&suspended, run);
    let mut next = Fold::new(THREAD.into(), "r-2".into(), run, base);
    let head = next.open(true, 5, 0);
    assert_eq!(
        kinds(&head),
        ["RUN_STARTED", "STATE_SNAPSHOT", "STEP_STARTED"]
    );
    let mut rest = next.observation(&status(run, 6, "a", "in_progress", "waiting"), &[]);
    rest.extend(next.observation(&status(run, 7, "a", "completed", "in_progress"), &[]));
    let done = obs(
        run,
        8,
        ObservationType::RunCompleted,
        json!({"usage": usage(10, 5), "durationMs": 1}),
    );
    rest.extend(next.observation(&done, &[]));
    assert_eq!(
        kinds(&rest),
        [
            "STATE_DELTA",
            "STATE_DELTA",
            "STEP_FINISHED",
            "RUN_FINISHED"
        ]
    );
    let end = serde_json::to_value(rest.last().unwrap()).unwrap();
    assert_eq!(
        end["usage"][0],
        json!({"inputTokens": 3, "outputTokens": 2, "totalTokens": 5})
    );
}

#[test]
fn the_answer_streams_as_it_is_written_and_the_stored_answer_completes_it() {
    let run = Uuid::now_v7();
    let mut fold = Fold::new(THREAD.into(), "r".into(), run, Base::default());
    fold.open(false, 0, 0);
    let delta = |d: &str| TokenDelta {
        run_id: run,
        item_id: None,
        phase: Phase::Synthesize,
        delta: d.into(),
        after_seq: 0,
    };
    assert!(fold.token(&delta("{\"respo"), 0).is_empty());
    let first = fold.token(&delta("nse\": \"Hel"), 0);
    assert_eq!(
        kinds(&first),
        ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"]
    );
    let more = fold.token(&delta("lo"), 0);
    assert_eq!(kinds(&more), ["TEXT_MESSAGE_CONTENT"]);
    let answer = obs(
        run,
        1,
        ObservationType::FinalResponse,
        json!({"response": "Hello world", "sources": [], "suggestions": []}),
    );
    let end = fold.observation(&answer, &[]);
    assert_eq!(kinds(&end), ["TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]);
    let rest = serde_json::to_value(&end[0]).unwrap();
    assert_eq!(rest["delta"], " world");
    assert_eq!(rest["messageId"], format!("{run}:answer"));

    // A streamed text the answer does not continue is closed, and the answer sent whole.
    let mut fold = Fold::new(THREAD.into(), "r".into(), run, Base::default());
    fold.open(false, 0, 0);
    fold.token(&delta("{\"response\": \"Draft"), 0);
    let end = fold.observation(&answer, &[]);
    assert_eq!(
        kinds(&end),
        [
            "TEXT_MESSAGE_END",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END"
        ]
    );
    assert_eq!(
        serde_json::to_value(&end[2]).unwrap()["delta"],
        "Hello world"
    );
    // Deltas of other phases or runs are not the answer.
    let mut other = delta("{\"response\": \"x\"}");
    other.phase = Phase::Plan;
    assert!(fold.token(&other, 0).is_empty());
}

#[test]
fn failures_cancellations_and_cut_streams_end_the_run_once() {
    let run = Uuid::now_v7();
    let mut fold = Fold::new(THREAD.into(), "r".into(), run, Base::default());
    fold.open(false, 0, 0);
    let failed = obs(
        run,
        1,
        ObservationType::RunFailed,
        json!({"error": {"code": "llm_error", "message": "the model is down"}, "usage": usage(1, 0)}),
    );
    let end = fold.observation(&failed, &[]);
    let end = serde_json::to_value(&end[0]).unwrap();
    assert_eq!(end["type"], "RUN_ERROR");
    assert_eq!(end["code"], "llm_error");
    assert_eq!(end["message"], "the model is down");

    let mut fold = Fold::new(THREAD.into(), "r".into(), run, Base::default());
    fold.open(false, 0, 0);
    fold.observation(&status(run, 1, "a", "in_progress", "pending"), &[]);
    let cancelled = obs(
        run,
        2,
        ObservationType::RunCancelled,
        json!({"reason": "cancelled"}),
    );
    let end = fold.observation(&cancelled, &[]);
    let last = serde_json::to_value(end.last().unwrap()).unwrap();
    assert_eq!(last["outcome"], json!({"type": "cancelled"}));
    assert!(last.get("usage").is_none());

    let mut fold = Fold::new(THREAD.into(), "r".into(), run, Base::default());
    fold.open(false, 0, 0);
    let cut = fold.cut("gone", "thread_deleted", 0);
    assert_eq!(kinds(&cut), ["RUN_ERROR"]);
    assert!(fold.finished());
}
