//! The web console: served by the binary, public while its data calls carry the API key, under a
//! strict Content-Security-Policy; and, in a real headless Chromium, a person's whole path:
//! create a thread, post a query, watch the tree fill, approve a suspension, read the answer; a
//! decision someone else made first (409); a server restart in the middle (nothing shown twice);
//! the API key prompt; the model's text as it is written, until it is committed; the run's spend
//! and the steering box.

use std::time::Duration;

use serde_json::{Value, json};

use crate::browser::Browser;
use crate::fake_llm::{FakeLlm, Reply, phase_of, plan_item};
use crate::helpers::{
    Backend, TestApp, database_url, metered_llm, spawn_config, spawn_with, test_config,
};

/// Every `seq` the page's tree shows, in document order.
const TREE_SEQS: &str =
    "[...document.querySelectorAll('ul.tree li.obs')].map(li => Number(li.dataset.seq))";

async fn get_raw(app: &TestApp, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = app.client.get(app.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn console_page_and_assets_are_public_with_a_strict_policy_while_the_api_needs_a_key() {
    let app = spawn_with(Backend::Sqlite, None, |c| c.api_keys = Some("k1".into())).await;
    let page = get_raw(&app, "/console", &[]).await;
    assert_eq!(page.status(), 200);
    let h = page.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    let csp = h["content-security-policy"].to_str().unwrap();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(h["x-content-type-options"], "nosniff");
    let etag = h["etag"].to_str().unwrap().to_owned();
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"<script type="module" src="console/assets/main.js">"#));
    assert!(!html.contains("<script>"), "no inline script");

    // The browser's copy is current: 304, no body.
    let again = get_raw(&app, "/console", &[("if-none-match", &etag)]).await;
    assert_eq!(again.status(), 304);

    for (asset, media) in [
        ("main.js", "text/javascript; charset=utf-8"),
        ("events.js", "text/javascript; charset=utf-8"),
        ("console.css", "text/css; charset=utf-8"),
        ("icon.svg", "image/svg+xml"),
    ] {
        let r = get_raw(&app, &format!("/console/assets/{asset}"), &[]).await;
        assert_eq!(r.status(), 200, "{asset}");
        assert_eq!(r.headers()["content-type"], media, "{asset}");
        assert!(r.headers().contains_key("content-security-policy"));
    }
    let missing = get_raw(&app, "/console/assets/nope.js", &[]).await;
    assert_eq!(missing.status(), 404);
    assert_eq!(
        missing.headers()["content-type"],
        "application/problem+json"
    );
    let slash = app.client.get(app.url("/console/")).send().await.unwrap();
    // reqwest follows the redirect to the page itself.
    assert_eq!(slash.status(), 200);
    assert_eq!(slash.url().path(), "/console");

    // The data the page reads is behind the key.
    assert_eq!(get_raw(&app, "/v1/threads", &[]).await.status(), 401);
    app.stop().await;
}

/// A thread whose calculator calls wait for a person, with a run that reached that point.
async fn suspended_thread(app: &TestApp, thread: &str) -> (String, String) {
    app.thread(json!({"threadId": thread, "config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app
        .run_wait(thread, "What is 6*7 and what time is it in Tokyo?")
        .await;
    assert_eq!(run["status"], "suspended", "{run}");
    (
        run["runId"].as_str().unwrap().to_owned(),
        run["suspension"]["suspensionId"]
            .as_str()
            .unwrap()
            .to_owned(),
    )
}

/// Every observation is in the tree once, and only once.
async fn assert_tree_matches_log(browser: &Browser, app: &TestApp, thread: &str) {
    let log: Vec<i64> = app
        .observations(thread)
        .await
        .iter()
        .map(|o| o["seq"].as_i64().unwrap())
        .collect();
    let shown = browser
        .script(&format!("return {TREE_SEQS};"), json!([]))
        .await;
    let mut shown: Vec<i64> = shown
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let count = shown.len();
    shown.sort_unstable();
    shown.dedup();
    assert_eq!(shown.len(), count, "an observation is shown twice");
    assert_eq!(shown, log, "the tree shows exactly the thread's log");
}

/// Once the thread page follows its stream live, post `query` from the page's form.
async fn ask_from_the_page(browser: &Browser, query: &str) {
    browser
        .wait_for(
            "the live stream",
            "document.querySelector('.connection')?.dataset.state === 'live'",
        )
        .await;
    browser.type_into("#query", query).await;
    browser.click("#ask button[type=submit]").await;
}

#[tokio::test]
async fn a_person_posts_a_query_watches_the_tree_approves_a_suspension_and_reads_the_answer() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_with(Backend::Sqlite, None, |_| {}).await;

    browser.goto(&app.url("/console")).await;
    browser
        .wait_for("the thread list", "document.querySelector('#new-thread')")
        .await;
    browser.type_into("#new-thread-id", "console-demo").await;
    browser
        .type_into(
            "#new-thread-config",
            r#"{"requireApproval": ["calculator"]}"#,
        )
        .await;
    browser.click("#new-thread button[type=submit]").await;
    browser
        .wait_for(
            "the thread page",
            "location.search === '?thread=console-demo' && document.querySelector('#ask')",
        )
        .await;
    ask_from_the_page(&browser, "What is 6*7 and what time is it in Tokyo?").await;

    // The tree fills as the run goes: run → items → the calculator call → its suspension, while
    // the other item (the time) runs in parallel and completes.
    browser
        .wait_for(
            "the suspension under its tool call",
            "document.querySelector('li.item[data-item=\"step-1\"] li.obs[data-type=TOOL_CALL] li.obs[data-type=AGENT_SUSPENDED]')",
        )
        .await;
    browser
        .wait_for(
            "the suspension card",
            "document.querySelector('.suspension h3')?.textContent.includes('calculator')",
        )
        .await;
    browser
        .wait_for(
            "the parallel item completed while step-1 waits",
            "document.querySelector('ol.todo li[data-item=\"step-2\"]')?.dataset.status === 'completed' \
             && document.querySelector('ol.todo li[data-item=\"step-1\"]')?.dataset.status === 'waiting'",
        )
        .await;
    // The answer box says the run waits for a person, and for what (not "Working on").
    let waiting = browser
        .wait_for(
            "the answer box waiting for a person",
            "document.querySelector('.answer')?.dataset.state === 'waiting' \
             && document.querySelector('.answer').textContent",
        )
        .await;
    let waiting = waiting.as_str().unwrap();
    assert!(
        waiting.starts_with("Waiting for a person: May the agent call `calculator`"),
        "{waiting}"
    );
    assert!(!waiting.contains("Working on"), "{waiting}");
    let card = browser.text(".suspension").await;
    assert!(card.contains("Proposed call: calculator"), "{card}");
    assert!(card.contains("\"expression\": \"6*7\""), "{card}");

    // A node's content shows when it is opened.
    browser
        .click("li.obs[data-type=TOOL_CALL] > details > summary")
        .await;
    // The content is drawn on the `toggle` event, which the browser fires after the click.
    browser
        .wait_for(
            "the call's content",
            "document.querySelector('li.obs[data-type=TOOL_CALL] > details > pre')?.textContent.length > 0",
        )
        .await;
    let content = browser
        .text("li.obs[data-type=TOOL_CALL] > details > pre")
        .await;
    assert!(
        content.contains("\"toolCallId\": \"call_step-1_1\""),
        "{content}"
    );
    let shot = browser.screenshot("thread-suspended").await;
    if std::env::var_os("PES_CONSOLE_DOCS_SCREENSHOT").is_some() {
        // The README's picture (`PES_CONSOLE_DOCS_SCREENSHOT=1` makes it again).
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/console.png");
        std::fs::copy(&shot, docs).unwrap();
    }

    // Edited arguments the tool's schema refuses: the server's 422 is shown in the card, and the
    // suspension still waits.
    browser.click(".suspension details.decision summary").await;
    browser
        .type_into(
            ".suspension details.decision textarea",
            r#"{"expression": 5}"#,
        )
        .await;
    browser
        .click(".suspension details.decision button[type=submit]")
        .await;
    let error = browser
        .wait_for(
            "the 422 in the card",
            "document.querySelector('.suspension .error')?.textContent",
        )
        .await;
    let error = error.as_str().unwrap();
    assert!(error.contains("422 validation_failed"), "{error}");
    assert!(error.contains("/expression"), "{error}");

    browser.click(".suspension form.decision > button").await;
    let answer = browser
        .wait_for(
            "the final answer",
            "document.querySelector('.answer .response')?.textContent",
        )
        .await;
    assert!(answer.as_str().unwrap().contains("6*7 = 42"), "{answer}");
    browser
        .wait_for(
            "the run completed",
            "document.querySelector('li.run')?.dataset.status === 'completed' \
             && document.querySelector('.run-status')?.dataset.status === 'completed'",
        )
        .await;
    browser
        .wait_for(
            "no suspension left",
            "document.querySelectorAll('.suspension').length === 0",
        )
        .await;
    let suggestions = browser.text(".answer ul").await;
    assert!(
        suggestions.contains("Configure a real model"),
        "{suggestions}"
    );
    assert_tree_matches_log(&browser, &app, "console-demo").await;
    // The tool result sits under its call.
    browser
        .wait_for(
            "the result under its call",
            "document.querySelector('li.obs[data-type=TOOL_CALL] li.obs[data-type=TOOL_EXECUTION]')",
        )
        .await;
    browser.screenshot("thread-completed").await;

    // The list shows the thread and opens it.
    browser.goto(&app.url("/console")).await;
    browser
        .wait_for(
            "the thread in the list",
            "document.querySelector('tr[data-thread=\"console-demo\"] a')",
        )
        .await;
    browser.screenshot("threads").await;
    // No script error on the way (the refused edit's 422 is the network's, and expected).
    let logs = browser.logs().await;
    assert!(
        !logs
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["level"] == "SEVERE" && m["source"] != "network"),
        "the page's scripts failed: {logs}"
    );
    browser.quit().await;
    app.stop().await;
}

#[tokio::test]
async fn a_decision_someone_else_made_first_is_shown_plainly_as_a_409() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_with(Backend::Sqlite, None, |_| {}).await;
    let (_, suspension) = suspended_thread(&app, "decided-elsewhere").await;
    browser
        .goto(&app.url("/console?thread=decided-elsewhere"))
        .await;
    browser
        .wait_for(
            "the suspension card",
            "document.querySelector('.suspension')",
        )
        .await;
    // Opened on a run that already waits: the answer box says so from the start.
    browser
        .wait_for(
            "the answer box waiting for a person",
            "document.querySelector('.answer')?.dataset.state === 'waiting' \
             && document.querySelector('.answer').textContent.startsWith('Waiting for a person: ')",
        )
        .await;
    // Another client approves, and the person clicks Approve at that very moment: the click
    // comes as soon as the other decision is answered, before the page can hear of it.
    let status = browser
        .script_async(
            "const [id, done] = arguments;
             fetch('v1/suspensions/' + id + '/resume', {method: 'POST',
                 headers: {'Content-Type': 'application/json'}, body: '{\"decision\":\"approve\"}'})
               .then(r => { document.querySelector('.suspension form.decision > button').click();
                            done(r.status); });",
            json!([suspension]),
        )
        .await;
    assert_eq!(status, 202);
    let notice = browser
        .wait_for(
            "the 409 notice",
            "document.querySelector('.suspensions .notice')?.textContent",
        )
        .await;
    let notice = notice.as_str().unwrap();
    assert!(notice.contains("Already decided elsewhere"), "{notice}");
    assert!(notice.contains("409 suspension_resolved"), "{notice}");
    browser.screenshot("decided-elsewhere").await;
    // The other decision goes on: the run completes, and the page shows it.
    browser
        .wait_for(
            "the answer",
            "document.querySelector('.answer .response')?.textContent.includes('6*7 = 42')",
        )
        .await;
    browser.quit().await;
    app.stop().await;
}

#[tokio::test]
async fn the_page_reconnects_after_a_server_restart_and_shows_nothing_twice() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let url = database_url(Backend::Sqlite).await;
    let app = spawn_config(test_config(&url, None)).await;
    let port = app.base.rsplit(':').next().unwrap().to_owned();
    app.thread(json!({"threadId": "restart"})).await;
    let first = app.run_wait("restart", "What is 2+3?").await;
    assert_eq!(first["status"], "completed");
    let before = app.observations("restart").await.len();

    browser.goto(&app.url("/console?thread=restart")).await;
    browser
        .wait_for(
            "the first run's end",
            "document.querySelector('li.run')?.dataset.status === 'completed' \
             && document.querySelector('.connection')?.dataset.state === 'live'",
        )
        .await;
    app.stop().await;
    browser
        .wait_for(
            "the page noticing the server is gone",
            "document.querySelector('.connection')?.dataset.state === 'reconnecting'",
        )
        .await;

    // The same service comes back on the same port and database.
    let mut config = test_config(&url, None);
    config.bind = format!("127.0.0.1:{port}").parse().unwrap();
    let app = spawn_config(config).await;
    let live = browser
        .wait_for(
            "the page live again",
            "document.querySelector('.connection')?.dataset.state === 'live' \
             && document.querySelector('.connection').textContent",
        )
        .await;
    // It asked for what came after the last observation it had, not for the whole log again.
    assert!(
        live.as_str().unwrap().contains(&format!("after #{before}")),
        "{live}"
    );
    let second = app.run_wait("restart", "What is 3*4?").await;
    assert_eq!(second["status"], "completed");
    browser
        .wait_for(
            "the second run's end",
            "document.querySelectorAll('li.run[data-status=completed]').length === 2",
        )
        .await;
    assert_tree_matches_log(&browser, &app, "restart").await;
    browser.screenshot("after-restart").await;
    browser.quit().await;
    app.stop().await;
}

#[tokio::test]
async fn the_page_asks_for_an_api_key_keeps_it_in_the_browser_and_uses_it() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_with(Backend::Sqlite, None, |c| c.api_keys = Some("k1".into())).await;
    let created = app
        .client
        .post(app.url("/v1/threads"))
        .bearer_auth("k1")
        .json(&json!({"threadId": "keyed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    browser.goto(&app.url("/console")).await;
    browser
        .wait_for(
            "the key dialog",
            "document.querySelector('#key-dialog[open]')",
        )
        .await;
    browser.type_into("#key-input", "wrong").await;
    browser.click("#key-form button[type=submit]").await;
    browser
        .wait_for(
            "the refusal",
            "document.querySelector('#key-dialog[open]') \
             && document.querySelector('#key-error').textContent.includes('refused')",
        )
        .await;
    browser.screenshot("api-key").await;
    browser.type_into("#key-input", "k1").await;
    browser.click("#key-form button[type=submit]").await;
    browser
        .wait_for(
            "the thread listed with the key",
            "document.querySelector('tr[data-thread=\"keyed\"]')",
        )
        .await;
    let stored = browser
        .script(
            "return [sessionStorage.getItem('pes-api-key'), localStorage.getItem('pes-api-key')];",
            json!([]),
        )
        .await;
    assert_eq!(stored, json!(["k1", null]), "kept for this tab only");

    // The stream is behind the key too: the thread page goes live with it.
    browser.click("tr[data-thread=\"keyed\"] a").await;
    browser
        .wait_for(
            "the stream live with the key",
            "document.querySelector('.connection')?.dataset.state === 'live'",
        )
        .await;
    browser.type_into("#query", "What is 1+1?").await;
    browser.click("#ask button[type=submit]").await;
    let answer: Value = browser
        .wait_for(
            "the answer",
            "document.querySelector('.answer .response')?.textContent",
        )
        .await;
    assert!(answer.as_str().unwrap().contains("1+1 = 2"), "{answer}");
    browser.quit().await;
    app.stop().await;
}

/// Parallel items in flight at once, a team's children inside the team (in the plan and in the
/// tree), and a flowchart's steps under its tool call.
#[tokio::test]
async fn the_page_shows_parallel_items_in_flight_team_children_and_flowchart_steps() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let llm = FakeLlm::start().await;
    let app = spawn_with(Backend::Sqlite, Some(&llm), |_| {}).await;
    let put = app
        .client
        .put(app.url("/v1/flowcharts/triage"))
        .json(&json!({
            "description": "Triage a refund.",
            "flowchart": {"start": "route", "stages": {
                "route": {"kind": "decide", "default": "review", "rules": [
                    {"condition": {">": [{"var": "args.amount"}, 1000]}, "next": "escalate"}]},
                "review": {"kind": "end", "result": {"decision": "review"}},
                "escalate": {"kind": "end", "result": {"decision": "escalated"}}
            }}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    let team = |mut item: Value| {
        item["kind"] = json!("team");
        item
    };
    let plan_of = |items: Vec<Value>| {
        Reply::Json(json!({"title": "Refunds", "intent": "test", "plan": "p", "todoList": items}))
    };
    llm.push(
        "plan",
        plan_of(vec![
            team(plan_item("t", "Research the refund", &[], &[])),
            plan_item("f", "Triage the refund", &["triage"], &[]),
        ]),
    );
    llm.push(
        "plan",
        plan_of(vec![
            plan_item("a", "Read the order", &[], &[]),
            plan_item("b", "Read the policy", &[], &[]),
        ]),
    );
    llm.push_item(
        "f",
        Reply::ToolCalls(vec![("triage".into(), json!({"amount": 2500}))]),
    );
    // Every item's model call waits until the page has shown them all at work.
    llm.hold_if(|req| phase_of(req) == "execute");
    app.thread(json!({"threadId": "refunds"})).await;

    browser.goto(&app.url("/console?thread=refunds")).await;
    ask_from_the_page(&browser, "Should we refund order 42?").await;
    browser
        .wait_for(
            "three items in flight at once",
            "['t.a', 't.b', 'f'].every(id => document.querySelector(`ol.todo li[data-item=\"${id}\"]`)?.dataset.status === 'in_progress')",
        )
        .await;
    // The team's children are inside the team, in the plan and in the tree.
    browser
        .wait_for(
            "the children inside their team",
            "document.querySelector('ol.todo li[data-item=\"t\"] ol.todo li[data-item=\"t.b\"]')              && document.querySelector('li.item[data-item=\"t\"] li.item[data-item=\"t.a\"]')",
        )
        .await;
    let badges = browser.text("ol.todo").await;
    assert!(badges.matches("in progress").count() >= 3, "{badges}");
    browser.screenshot("parallel-in-flight").await;
    llm.release();

    browser
        .wait_for(
            "the flowchart's step under its call",
            "document.querySelector('li.item[data-item=\"f\"] li.obs[data-type=TOOL_CALL] li.obs[data-type=FLOWCHART_STEP]')",
        )
        .await;
    browser
        .wait_for(
            "the run completed",
            "document.querySelector('li.run')?.dataset.status === 'completed'",
        )
        .await;
    // A finished item folds away; a click unfolds it, and its call's steps show.
    let hidden = browser
        .text("li.obs[data-type=FLOWCHART_STEP] > details > summary")
        .await;
    assert_eq!(hidden, "", "folded with its completed item");
    browser
        .click("li.item[data-item=\"f\"] > details > summary")
        .await;
    let step = browser
        .text("li.obs[data-type=FLOWCHART_STEP] > details > summary")
        .await;
    assert!(step.starts_with("FLOWCHART_STEP"), "{step}");
    assert_tree_matches_log(&browser, &app, "refunds").await;
    browser.screenshot("teams-and-flowchart").await;
    browser.quit().await;
    app.stop().await;
}

#[tokio::test]
async fn the_thread_list_shows_the_newest_first_a_page_at_a_time() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let llm = FakeLlm::start().await;
    // Every plan fails but the first: one thread gets a title, another only its query.
    llm.set_default(
        "plan",
        Reply::Status(400, r#"{"error": {"message": "no plan"}}"#.into(), None),
    );
    llm.push(
        "plan",
        crate::fake_llm::plan(&[("s1", "Say hello", &[], &[])]),
    );
    let app = spawn_with(Backend::Sqlite, Some(&llm), |_| {}).await;
    for i in 0..25 {
        app.thread(json!({"threadId": format!("t-{i:02}")})).await;
    }
    let titled = app.run_wait("t-24", "Say hello").await;
    assert_eq!(titled["status"], "completed", "{titled}");
    let query = "Which of our refund requests from last quarter were paid twice, and to whom did the money go?";
    let untitled = app.run_wait("t-23", query).await;
    assert_eq!(untitled["status"], "failed", "{untitled}");
    browser.goto(&app.url("/console")).await;
    let rows = "[...document.querySelectorAll('tr[data-thread]')].map(r => r.dataset.thread)";
    let first = browser
        .wait_for("the first page", &format!("{rows}.length === 20 && {rows}"))
        .await;
    assert_eq!(first[0], "t-24", "newest first: {first}");
    assert_eq!(first[19], "t-05");
    // Each thread by its title, else its last query (shortened, whole on hover), else its id;
    // the id stays under a title or a query.
    let label = |id: &str| {
        format!(
            "(() => {{ const a = document.querySelector('tr[data-thread=\"{id}\"] td a'); \
               return [a.dataset.label, a.textContent, a.title, \
                       a.parentElement.querySelector('.thread-id')?.textContent ?? null]; }})()"
        )
    };
    let shown = browser
        .script(&format!("return {};", label("t-24")), json!([]))
        .await;
    assert_eq!(shown, json!(["title", "Test plan", "", "t-24"]));
    let shown = browser
        .script(&format!("return {};", label("t-23")), json!([]))
        .await;
    assert_eq!(shown[0], "query", "{shown}");
    let text = shown[1].as_str().unwrap();
    assert!(
        text.ends_with('…')
            && text.chars().count() <= 80
            && query.starts_with(text.trim_end_matches('…')),
        "{shown}"
    );
    assert_eq!(shown[2], query, "the whole query on hover");
    assert_eq!(shown[3], "t-23");
    let shown = browser
        .script(&format!("return {};", label("t-22")), json!([]))
        .await;
    assert_eq!(shown, json!(["id", "t-22", "", null]));
    browser.click("#more-threads").await;
    let all = browser
        .wait_for(
            "the second page",
            &format!("{rows}.length === 25 && {rows}"),
        )
        .await;
    assert_eq!(all[24], "t-00", "{all}");
    browser
        .wait_for(
            "no more pages",
            "document.querySelector('#more-threads').hidden",
        )
        .await;
    // A thread opens from the list.
    browser.click("tr[data-thread=\"t-03\"] a").await;
    browser
        .wait_for(
            "the thread page",
            "document.querySelector('h1 code')?.textContent === 't-03'",
        )
        .await;
    browser.quit().await;
    app.stop().await;
}

/// What item `s2` writes, slowly, in the live-text test.
const LIVE_ANSWER: &str = "Two and two make four, as the calculator said a moment ago.";
/// The synthesis' response in the live-text test (found nowhere else on the page).
const LIVE_RESPONSE: &str = "Four: the calculator added two and two, nothing else.";

/// The text of the live block of `phase` in the list `holder` selects, while `pending` (a
/// selector) matches nothing, i.e. before what the text becomes is committed; null otherwise.
/// It also checks that the text is no live region (screen readers are not read every word).
fn live_text_before(holder: &str, phase: &str, pending: &str) -> String {
    format!(
        "(() => {{
           const el = document.querySelector('{holder} > details > ul > li.live[data-phase={phase}] .live-text');
           if (!el || !el.textContent || document.querySelector('{pending}')) return null;
           if (el.closest('[aria-live]:not([aria-live=off])')) return 'a live region: ' + el.outerHTML;
           return el.textContent;
         }})()"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_model_writing_until_it_is_committed_and_nothing_twice_after_a_reconnect()
 {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let llm = FakeLlm::start().await;
    // Every reply in 20 pieces, 100 ms apart: each model call writes for about 2 s.
    llm.stream_slowly(20, Duration::from_millis(100));
    llm.push_item("s2", Reply::Text(LIVE_ANSWER.into()));
    llm.push(
        "synthesis",
        Reply::Json(json!({"response": LIVE_RESPONSE, "sources": [], "suggestions": []})),
    );
    let url = database_url(Backend::Sqlite).await;
    let app = spawn_config(test_config(&url, Some(&llm))).await;
    let port = app.base.rsplit(':').next().unwrap().to_owned();
    app.thread(json!({"threadId": "live"})).await;

    browser.goto(&app.url("/console?thread=live")).await;
    ask_from_the_page(&browser, "What is 2+2?").await;

    // The plan's JSON as it is written, under the run, before PLAN is committed.
    let plan = browser
        .wait_for(
            "the plan being written",
            &live_text_before("li.run", "plan", "li.obs[data-type=PLAN]"),
        )
        .await;
    assert!(plan.as_str().unwrap().starts_with('{'), "{plan}");
    // Item s2's answer as it is written, under s2, while s2 is in progress: a prefix of what it
    // will commit, each piece once.
    let s2 = browser
        .wait_for(
            "s2's answer being written",
            &format!(
                "document.querySelector('ol.todo li[data-item=\"s2\"]')?.dataset.status === 'in_progress' \
                 && ({}) || null",
                live_text_before(
                    "li.item[data-item=\"s2\"]",
                    "execute",
                    "li.item[data-item=\"s2\"] li.obs[data-type=THOUGHTS]"
                )
            ),
        )
        .await;
    let s2 = s2.as_str().unwrap();
    assert!(
        s2.starts_with("Two") && LIVE_ANSWER.starts_with(s2),
        "a prefix of the answer: {s2:?}"
    );
    browser.screenshot("live-tokens").await;
    // The synthesis' JSON, under the run, before FINAL_RESPONSE.
    let synthesis = browser
        .wait_for(
            "the answer being written",
            &live_text_before("li.run", "synthesize", "li.obs[data-type=FINAL_RESPONSE]"),
        )
        .await;
    assert!(synthesis.as_str().unwrap().starts_with('{'), "{synthesis}");

    // Once the run completes, the live text is gone and the committed answer shows, once.
    browser
        .wait_for(
            "the run completed",
            "document.querySelector('li.run')?.dataset.status === 'completed' \
             && document.querySelector('.answer .response')",
        )
        .await;
    let after = browser
        .script(
            "return [document.querySelectorAll('li.live').length,
                     document.querySelector('.answer .response').textContent,
                     document.body.innerText.split(arguments[0]).length - 1];",
            json!([LIVE_RESPONSE]),
        )
        .await;
    assert_eq!(
        after,
        json!([0, LIVE_RESPONSE, 1]),
        "no live text left, the answer once"
    );
    assert_tree_matches_log(&browser, &app, "live").await;

    // Token frames have no id: the reconnect after a restart asks for what came after the last
    // observation, not after some delta.
    let before = app.observations("live").await.len();
    app.stop().await;
    browser
        .wait_for(
            "the page noticing the server is gone",
            "document.querySelector('.connection')?.dataset.state === 'reconnecting'",
        )
        .await;
    let mut config = test_config(&url, Some(&llm));
    config.bind = format!("127.0.0.1:{port}").parse().unwrap();
    let app = spawn_config(config).await;
    let live = browser
        .wait_for(
            "the page live again",
            "document.querySelector('.connection')?.dataset.state === 'live' \
             && document.querySelector('.connection').textContent",
        )
        .await;
    assert!(
        live.as_str().unwrap().contains(&format!("after #{before}")),
        "{live}"
    );
    // The new connection asked for tokens too: the next run's plan shows as it is written.
    let (status, run) = app
        .post("/v1/threads/live/runs", json!({"query": "And 3+3?"}))
        .await;
    assert_eq!(status, 202, "{run}");
    browser
        .wait_for(
            "the second plan being written",
            &live_text_before(
                "li.run:nth-child(2)",
                "plan",
                "li.run:nth-child(2) li.obs[data-type=PLAN], li.run:nth-child(2) li.obs[data-type=PLAN_UPDATE]",
            ),
        )
        .await;
    browser
        .wait_for(
            "the second run's end",
            "document.querySelectorAll('li.run[data-status=completed]').length === 2 \
             && document.querySelectorAll('li.live').length === 0",
        )
        .await;
    assert_tree_matches_log(&browser, &app, "live").await;
    let logs = browser.logs().await;
    assert!(
        !logs
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["level"] == "SEVERE" && m["source"] != "network"),
        "the page's scripts failed: {logs}"
    );
    browser.quit().await;
    app.stop().await;
}

/// The page shows what the run spent (tokens, and dollars by the price table, as
/// `data-tokens`/`data-cost-usd`), and its text box steers the run while it works: the item's
/// next model call reads the message.
#[tokio::test]
async fn the_page_shows_the_spend_and_steers_the_run() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let llm = metered_llm().await;
    llm.push(
        "plan",
        crate::fake_llm::plan(&[("a", "compute 2+2", &["calculator"], &[])]),
    );
    llm.push_item(
        "a",
        Reply::ToolCalls(vec![("calculator".into(), json!({"expression": "2+2"}))]),
    );
    llm.push_item("a", Reply::Text("4".into()));
    llm.hold_if(|r| crate::fake_llm::item_of(r).as_deref() == Some("a"));
    let app = spawn_with(Backend::Sqlite, Some(&llm), |c| {
        c.model_prices = Some(r#"{"fake-model": {"input": 2, "output": 10}}"#.into());
    })
    .await;
    app.thread(json!({"threadId": "spend"})).await;
    browser.goto(&app.url("/console?thread=spend")).await;
    ask_from_the_page(&browser, "What is 2+2?").await;
    llm.wait_for_request(|r| crate::fake_llm::item_of(r).as_deref() == Some("a"))
        .await;
    browser
        .wait_for(
            "the steering box of the running run",
            "document.querySelector('#steer-form') && !document.querySelector('#steer-form').hidden",
        )
        .await;
    browser.type_into("#steer", "Answer in French").await;
    browser.click("#steer-form button[type=submit]").await;
    app.wait_observation("spend", |o| {
        o["type"] == "STEERING" && o["content"]["message"] == "Answer in French"
    })
    .await;
    llm.release();
    let calls = {
        browser
            .wait_for(
                "the run completed",
                "document.querySelector('li.obs[data-type=RUN_COMPLETED]')",
            )
            .await;
        llm.calls()
    };
    let spent = browser
        .wait_for(
            "the run's spend",
            &format!(
                "(e => e && !e.hidden && e.dataset.tokens === '{}' && [e.dataset.tokens, e.dataset.costUsd, e.textContent])(document.querySelector('.spend'))",
                calls * 1500
            ),
        )
        .await;
    let usd: f64 = spent[1].as_str().unwrap().parse().unwrap();
    assert!((usd - calls as f64 * 0.007).abs() < 1e-9, "{spent}");
    assert!(
        spent[2].as_str().unwrap().contains(&format!("${:.4}", usd)),
        "{spent}"
    );
    let of_a: Vec<Value> = llm
        .requests()
        .into_iter()
        .filter(|r| crate::fake_llm::item_of(r).as_deref() == Some("a"))
        .collect();
    assert_eq!(of_a.len(), 2);
    assert!(of_a[1].to_string().contains("Answer in French"));
    browser.screenshot("spend-and-steer").await;
    browser.quit().await;
    app.stop().await;
}
