//! The thread's conversation history over HTTP: user queries, each tool-using model turn with its
//! tool calls, the tool results, and the final answers, in order; and the planner's context,
//! which stays the thread-level conversation.

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, plan};
use crate::helpers::{Backend, spawn};

async fn all_messages(app: &crate::helpers::TestApp, t: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/threads/{t}/messages?limit=2&cursor={c}"),
            None => format!("/v1/threads/{t}/messages?limit=2"),
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

async fn history_holds_tool_calls_and_tool_results_in_order(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    // The fake model's default plan: s1 calls the calculator, s2 answers by reasoning.
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");

    let msgs = all_messages(&app, &t).await;
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "assistant"],
        "{msgs:#?}"
    );
    let (user, turn, tool, answer) = (&msgs[0], &msgs[1], &msgs[2], &msgs[3]);
    assert_eq!(user["content"], "what is 2+2?");
    assert_eq!(user["itemId"], Value::Null);

    // The model's tool-call turn, then the result of that call.
    let obs = app.observations(&t).await;
    let call = obs.iter().find(|o| o["type"] == "TOOL_CALL").unwrap();
    let exec = obs.iter().find(|o| o["type"] == "TOOL_EXECUTION").unwrap();
    let call_id = call["content"]["toolCallId"].as_str().unwrap();
    assert_eq!(turn["itemId"], "s1");
    assert_eq!(
        turn["toolCalls"],
        json!([{"id": call_id, "name": "calculator", "arguments": {"expression": "2+2"}}])
    );
    assert_eq!(tool["toolCallId"], call_id);
    assert_eq!(tool["name"], "calculator");
    assert_eq!(tool["itemId"], "s1");
    assert_eq!(tool["toolCalls"], json!([]));
    let content: Value = serde_json::from_str(tool["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        content, exec["content"]["output"],
        "the result text the model read"
    );
    assert_eq!(content["result"], 4);

    // The run's final answer stays the last message.
    assert_eq!(answer["content"], "final answer");
    assert_eq!(answer["itemId"], Value::Null);
    assert_eq!(answer["toolCalls"], json!([]));
    for m in &msgs {
        assert_eq!(m["runId"], run["runId"], "{m}");
    }

    // A follow-up with a new tool item: the planner sees the conversation (queries and
    // answers), not the tool use.
    llm.push(
        "plan",
        plan(&[
            ("s1", "Compute 2+2", &["calculator"], &[]),
            ("s2", "Explain the result", &[], &["s1"]),
            ("s3", "Compute 3+3", &["calculator"], &[]),
        ]),
    );
    let run2 = app.run_wait(&t, "and 3+3?").await;
    assert_eq!(run2["status"], "completed", "{run2}");
    let refine = &llm.requests_of("plan")[1];
    let context = refine["messages"].as_array().unwrap();
    assert!(
        context
            .iter()
            .all(|m| m["role"] != "tool" && m.get("tool_calls").is_none()),
        "{context:#?}"
    );
    assert!(context.iter().any(|m| m["content"] == "what is 2+2?"));
    assert!(
        context
            .iter()
            .any(|m| m["role"] == "assistant" && m["content"] == "final answer")
    );

    // Every tool result reported in the log is in the history, once, and nothing else is.
    let msgs = all_messages(&app, &t).await;
    let obs = app.observations(&t).await;
    let mut executed: Vec<&str> = obs
        .iter()
        .filter(|o| o["type"] == "TOOL_EXECUTION")
        .map(|o| o["content"]["toolCallId"].as_str().unwrap())
        .collect();
    let mut answered: Vec<&str> = msgs
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["toolCallId"].as_str().unwrap())
        .collect();
    executed.sort();
    answered.sort();
    assert_eq!(executed, answered);
    assert_eq!(executed.len(), 2);
    app.stop().await;
}
both_stores!(
    tool_messages,
    history_holds_tool_calls_and_tool_results_in_order
);
