//! Long threads stay bounded: a thread used like a conversation answers its 30th follow-up like its
//! first. `maxItems` bounds what one run plans, never the thread's history; the planner and the
//! synthesis see earlier runs' items only as a bounded summary; the answer is the answer to the
//! current query; prompt tokens per run stay flat.

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, plan};
use crate::helpers::{Backend, spawn};

/// Earlier items the planning prompt shows (`prompts::EARLIER_ITEMS_SHOWN`).
const EARLIER_SHOWN: usize = 8;
/// Earlier items the synthesis shows (`prompts::EARLIER_ITEMS_IN_SYNTHESIS`).
const EARLIER_IN_SYNTHESIS: usize = 4;

fn prompt_tokens(run: &Value) -> u64 {
    run["usage"]["promptTokens"].as_u64().unwrap()
}

/// With the offline model, every one of 30 follow-ups (`What is 2+N?`) completes with its own
/// answer, never only the first runs' results, the thread keeps every run's items, and the last
/// run costs about what the second did.
async fn thirty_follow_ups_are_each_answered_for_themselves(backend: Backend) {
    let app = spawn(backend, None).await;
    // A cap far below what the thread accumulates: it bounds one run, not the thread.
    let t = app.thread(json!({"config": {"maxItems": 4}})).await;
    let mut tokens = Vec::new();
    for n in 1..=30u64 {
        let run = app.run_wait(&t, &format!("What is 2+{n}?")).await;
        assert_eq!(run["status"], "completed", "run {n}: {run}");
        let answer = run["finalResponse"]["response"].as_str().unwrap();
        assert!(
            answer.contains(&format!("2+{n} = {}", n + 2)),
            "run {n} does not answer its own query: {answer}"
        );
        if n > 1 {
            assert!(
                !answer.contains("2+1 = 3"),
                "run {n} answers the first query: {answer}"
            );
        }
        tokens.push(prompt_tokens(&run));
    }
    let (second, last) = (tokens[1], tokens[29]);
    assert!(
        last * 2 <= second * 3,
        "prompt tokens grew with the thread: run 2 {second}, run 30 {last} ({tokens:?})"
    );
    // Earlier runs' items stay in the thread, completed.
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    let items = state["todoList"].as_array().unwrap();
    assert_eq!(items.len(), 60, "two items a run: {state}");
    assert!(items.iter().all(|i| i["status"] == "completed"), "{state}");
    app.stop().await;
}
both_stores!(
    offline_follow_ups,
    thirty_follow_ups_are_each_answered_for_themselves
);

/// The plan of the fake model's follow-up `n`: a calculation and an answer built on it, with ids
/// of its own.
fn follow_up_plan(n: usize) -> crate::fake_llm::Reply {
    let (a, b) = (format!("calc-{n}"), format!("answer-{n}"));
    plan(&[
        (
            a.as_str(),
            &format!("Compute step {n}"),
            &["calculator"],
            &[],
        ),
        (
            b.as_str(),
            &format!("Answer follow-up {n}"),
            &[],
            &[a.as_str()],
        ),
    ])
}

/// The text of a request's messages.
fn texts(req: &Value) -> Vec<String> {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// With a real (fake) model: a late follow-up's planner sees at most the latest earlier items,
/// one line each, and says how many it leaves out; its synthesis reads this run's results, with
/// earlier items as a bounded context; the requests stop growing.
async fn a_late_follow_up_sees_a_bounded_summary_of_earlier_runs(backend: Backend) {
    let llm = FakeLlm::start().await;
    let app = spawn(backend, Some(&llm)).await;
    let t = app.thread(json!({})).await;
    const RUNS: usize = 16;
    for n in 1..=RUNS {
        llm.push("plan", follow_up_plan(n));
        let run = app.run_wait(&t, &format!("follow-up {n}")).await;
        assert_eq!(run["status"], "completed", "run {n}: {run}");
    }
    let plans = llm.requests_of("plan");
    assert_eq!(plans.len(), RUNS);
    let last = &plans[RUNS - 1];
    let note = texts(last)
        .into_iter()
        .find(|t| t.starts_with("This thread already has a plan."))
        .expect("the follow-up's planner gets the refinement note");
    let earlier_lines: Vec<&str> = note.lines().filter(|l| l.starts_with("- ")).collect();
    assert_eq!(earlier_lines.len(), EARLIER_SHOWN, "{note}");
    let total = 2 * (RUNS - 1);
    assert!(
        note.contains(&format!(
            "{total} in all, the last {EARLIER_SHOWN} below ({} older ones not shown)",
            total - EARLIER_SHOWN
        )),
        "{note}"
    );
    // The latest earlier items, with their results; not the first run's.
    assert!(
        note.contains(&format!(
            "- answer-{} [completed]: Answer follow-up",
            RUNS - 1
        )),
        "{note}"
    );
    assert!(note.contains("(result: tool said"), "{note}");
    assert!(!note.contains("calc-1 "), "{note}");
    // The request stops growing: the last is the size of one a few runs earlier (the history
    // holds its most messages by then), but for the ids' digits.
    let size = |r: &Value| r.to_string().len();
    let earlier_size = size(&plans[RUNS - 4]);
    assert!(
        size(last) * 100 <= earlier_size * 103,
        "the planning request grew: {} then {}",
        earlier_size,
        size(last)
    );

    // The synthesis answers this run: its results are this run's items, earlier ones are context.
    let synth = &llm.requests_of("synthesis")[RUNS - 1];
    let brief = texts(synth).into_iter().nth(1).unwrap();
    let (context, results) = brief
        .split_once("Results of the plan's items:")
        .expect("a results section");
    let result_ids: Vec<&str> = results
        .lines()
        .filter_map(|l| l.strip_prefix("- [")?.split_once(']').map(|(id, _)| id))
        .collect();
    assert_eq!(
        result_ids,
        [format!("calc-{RUNS}"), format!("answer-{RUNS}")],
        "{brief}"
    );
    assert!(
        context.contains(&format!(
            "{total} in all, the last {EARLIER_IN_SYNTHESIS} below"
        )),
        "{brief}"
    );
    assert_eq!(
        context.lines().filter(|l| l.starts_with("- [")).count(),
        EARLIER_IN_SYNTHESIS,
        "{brief}"
    );
    app.stop().await;
}
both_stores!(
    bounded_prompts,
    a_late_follow_up_sees_a_bounded_summary_of_earlier_runs
);
