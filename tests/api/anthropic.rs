//! The `anthropic` provider end to end, against the fake model behind the Messages API: a run
//! with tool calls and structured phases, requests the API would accept (the wire checked turn by
//! turn), retries of an overloaded API, and a thread on Anthropic while the default is OpenAI.

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply};
use crate::helpers::{Backend, spawn_with, use_anthropic};

/// Check one Messages request as the API would: a separate string `system`, turns that
/// alternate starting with the user's, every `tool_result` answering a `tool_use` of the turn
/// before it, and a structured request forcing its one schema tool.
fn assert_well_formed(body: &Value) {
    assert!(body["max_tokens"].as_u64().is_some_and(|n| n > 0), "{body}");
    assert!(body["system"].is_string(), "{body}");
    assert_eq!(body["stream"], true, "{body}");
    let turns = body["messages"].as_array().unwrap();
    assert!(!turns.is_empty());
    for (i, turn) in turns.iter().enumerate() {
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        assert_eq!(turn["role"], expected, "turn {i} of {body}");
        let blocks = turn["content"].as_array().unwrap();
        assert!(!blocks.is_empty(), "{body}");
        for b in blocks {
            if b["type"] == "text" {
                assert!(!b["text"].as_str().unwrap().trim().is_empty(), "{body}");
            }
            if b["type"] == "tool_result" {
                let asked: Vec<&Value> = turns[i - 1]["content"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|u| u["type"] == "tool_use")
                    .map(|u| &u["id"])
                    .collect();
                assert!(asked.contains(&&b["tool_use_id"]), "{body}");
            }
        }
        // Tool results lead their turn.
        let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
        if let Some(last_result) = kinds.iter().rposition(|k| *k == "tool_result") {
            assert!(
                kinds[..last_result].iter().all(|k| *k == "tool_result"),
                "{body}"
            );
        }
    }
    // Every tool_use is answered in the next turn.
    for (i, turn) in turns
        .iter()
        .enumerate()
        .filter(|(_, t)| t["role"] == "assistant")
    {
        for u in turn["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["type"] == "tool_use")
        {
            let answered = turns.get(i + 1).is_some_and(|next| {
                next["content"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|b| b["type"] == "tool_result" && b["tool_use_id"] == u["id"])
            });
            assert!(answered, "tool_use {} unanswered in {body}", u["id"]);
        }
    }
    if let Some(forced) = body["tool_choice"]["name"].as_str() {
        assert_eq!(body["tool_choice"]["type"], "tool");
        let tools = body["tools"].as_array().unwrap();
        assert_eq!(
            tools.len(),
            1,
            "a structured request offers its schema tool only"
        );
        assert_eq!(tools[0]["name"], forced);
        assert_eq!(tools[0]["input_schema"]["type"], "object");
    }
}

async fn a_run_on_anthropic_completes_with_tool_calls_and_structured_phases(backend: Backend) {
    let llm = FakeLlm::start_anthropic().await;
    // Two calls in one turn: their two results must share the next user turn.
    llm.push_item(
        "s1",
        Reply::ToolCalls(vec![
            ("calculator".into(), json!({"expression": "2+2"})),
            ("calculator".into(), json!({"expression": "3*3"})),
        ]),
    );
    let app = spawn_with(backend, Some(&llm), |c| use_anthropic(c, &llm)).await;
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["finalResponse"]["response"], "final answer");
    // plan, s1 (tool calls, then its answer), s2, synthesis: each 10 tokens in (7 + 3 read
    // from the cache) and 5 out.
    assert_eq!(run["usage"]["llmCalls"], 5, "{run}");
    assert_eq!(run["usage"]["promptTokens"], 50, "{run}");
    assert_eq!(run["usage"]["totalTokens"], 75, "{run}");

    let obs = app.observations(&t).await;
    let started = obs.iter().find(|o| o["type"] == "RUN_STARTED").unwrap();
    assert_eq!(started["content"]["provider"], "anthropic");
    assert_eq!(started["content"]["model"], "claude-fake");
    let calls: Vec<&Value> = obs.iter().filter(|o| o["type"] == "TOOL_CALL").collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[1]["content"]["arguments"],
        json!({"expression": "3*3"})
    );
    let results: Vec<&Value> = obs
        .iter()
        .filter(|o| o["type"] == "TOOL_EXECUTION")
        .map(|o| &o["content"]["output"]["result"])
        .collect();
    assert_eq!(results, [&json!(4), &json!(9)]);
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_eq!(
        state["stepOutputs"]["s1"],
        "tool said {\"expression\":\"3*3\",\"result\":9}"
    );

    let wire = llm.wire_requests();
    assert_eq!(wire.len(), 5);
    let forced: Vec<Option<&str>> = wire
        .iter()
        .map(|r| r.body["tool_choice"]["name"].as_str())
        .collect();
    assert_eq!(forced.iter().filter(|f| **f == Some("pes_plan")).count(), 1);
    assert_eq!(
        forced
            .iter()
            .filter(|f| **f == Some("pes_synthesis"))
            .count(),
        1
    );
    // Execute requests offer the item's tools and force none.
    let executes: Vec<&Value> = wire
        .iter()
        .map(|r| &r.body)
        .filter(|b| b["tool_choice"].is_null())
        .collect();
    assert_eq!(executes.len(), 3);
    // The turn after the tool calls: both results in one user turn, answering the calls' ids.
    let answered = executes
        .iter()
        .find(|b| b["messages"].as_array().unwrap().len() == 3)
        .expect("s1's second turn");
    let uses = answered["messages"][1]["content"].as_array().unwrap();
    let results = answered["messages"][2]["content"].as_array().unwrap();
    assert_eq!(uses.len(), 2);
    assert_eq!(results.len(), 2);
    for (u, r) in uses.iter().zip(results) {
        assert_eq!(
            (&u["type"], &r["type"]),
            (&json!("tool_use"), &json!("tool_result"))
        );
        assert_eq!(r["tool_use_id"], u["id"]);
    }

    // A follow-up query: the planner's history and notes are user messages in a row, which go
    // in one turn.
    let run = app.run_wait(&t, "and 3+3?").await;
    assert_eq!(run["status"], "completed", "{run}");
    let wire = llm.wire_requests();
    let refine = wire
        .iter()
        .filter(|r| r.body["tool_choice"]["name"] == "pes_plan")
        .nth(1)
        .expect("the second plan request");
    assert!(
        refine.body["messages"].as_array().unwrap().len() >= 3,
        "{}",
        refine.body
    );
    for r in &wire {
        assert_eq!(r.headers["x-api-key"], "test-key");
        assert_eq!(r.headers["anthropic-version"], "2023-06-01");
        assert_eq!(r.body["model"], "claude-fake");
        assert_well_formed(&r.body);
    }
    app.stop().await;
}
both_stores!(
    full_run,
    a_run_on_anthropic_completes_with_tool_calls_and_structured_phases
);

async fn an_overloaded_api_is_retried_after_its_retry_after(backend: Backend) {
    let llm = FakeLlm::start_anthropic().await;
    let overloaded =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    llm.push(
        "plan",
        Reply::Status(529, overloaded.to_string(), Some("1".into())),
    );
    let app = spawn_with(backend, Some(&llm), |c| use_anthropic(c, &llm)).await;
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");
    let plans = llm.requests_timed();
    let plan_times: Vec<_> = plans
        .iter()
        .filter(|(_, r)| crate::fake_llm::phase_of(r) == "plan")
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(
        plan_times.len(),
        2,
        "the overloaded plan request was sent again"
    );
    // `retry-after: 1` was honoured (the backoff alone would be far shorter).
    assert!(
        plan_times[1] - plan_times[0] >= std::time::Duration::from_millis(900),
        "{:?}",
        plan_times[1] - plan_times[0]
    );
    // The failed attempt returned a reply: it is counted.
    assert_eq!(run["usage"]["llmCalls"], 6, "{run}");
    app.stop().await;
}
both_stores!(
    overloaded,
    an_overloaded_api_is_retried_after_its_retry_after
);

async fn a_thread_runs_on_anthropic_while_the_default_is_openai(backend: Backend) {
    let openai = FakeLlm::start().await;
    let anthropic = FakeLlm::start_anthropic().await;
    let app = spawn_with(backend, Some(&openai), |c| {
        c.anthropic_api_key = Some("ak-2".into());
        c.anthropic_base_url = Some(anthropic.url.clone());
    })
    .await;
    let on_anthropic = app
        .thread(json!({"config": {"provider": "anthropic", "model": "claude-other"}}))
        .await;
    let run = app.run_wait(&on_anthropic, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");
    assert!(openai.requests().is_empty(), "nothing went to the default");
    let wire = anthropic.wire_requests();
    assert_eq!(wire.len(), 5);
    assert!(
        wire.iter()
            .all(|r| r.body["model"] == "claude-other" && r.headers["x-api-key"] == "ak-2")
    );

    let on_default = app.thread(json!({})).await;
    let run = app.run_wait(&on_default, "what is 2+2?").await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(openai.requests().len(), 5);
    assert_eq!(anthropic.requests().len(), 5);
    let obs = app.observations(&on_default).await;
    assert_eq!(obs[0]["content"]["provider"], "openai");
    app.stop().await;
}
both_stores!(
    beside_openai,
    a_thread_runs_on_anthropic_while_the_default_is_openai
);

#[tokio::test]
async fn a_thread_naming_a_provider_that_is_not_configured_is_refused() {
    let openai = FakeLlm::start().await;
    let app = spawn_with(Backend::Sqlite, Some(&openai), |_| {}).await;
    let (status, body) = app
        .post("/v1/threads", json!({"config": {"provider": "anthropic"}}))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        body["detail"],
        "config.provider `anthropic` is not configured (available: offline, openai)"
    );
    app.stop().await;
}
