//! What the service says about the model it uses: the start-up log of a real process and the
//! `RUN_STARTED` observation of each run name the provider and model actually used, and the
//! offline warning appears only when the offline model really serves the run.

use serde_json::{Value, json};

use crate::both_stores;
use crate::fake_llm::FakeLlm;
use crate::helpers::{Backend, spawn};
use crate::process::Proc;

fn offline_warnings(logs: &[Value]) -> Vec<Value> {
    logs.iter()
        .filter(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.to_ascii_lowercase().contains("offline"))
        })
        .cloned()
        .collect()
}

fn provider_line(logs: &[Value]) -> Value {
    logs.iter()
        .find(|l| l["message"] == "default model provider")
        .cloned()
        .unwrap_or_else(|| panic!("no start-up line names the model provider: {logs:?}"))
}

#[tokio::test]
async fn start_up_log_names_the_configured_provider_and_model_without_an_offline_warning() {
    let dir = std::env::temp_dir().join(format!("pes-log-{}", uuid::Uuid::now_v7().simple()));
    let db = format!("sqlite://{}/pes.db", dir.display());
    let p = Proc::start(&[
        ("PES_DATABASE_URL", db.clone()),
        ("PES_LLM_PROVIDER", "openai".into()),
        ("PES_LLM_MODEL", "my-model".into()),
        // Never called: the process only starts.
        ("PES_LLM_BASE_URL", "http://127.0.0.1:9/v1".into()),
    ])
    .await;
    let logs = p.log_lines();
    let line = provider_line(&logs);
    assert_eq!(line["provider"], "openai", "{line}");
    assert_eq!(line["model"], "my-model", "{line}");
    assert!(
        offline_warnings(&logs).is_empty(),
        "no offline warning when openai is the default: {:?}",
        offline_warnings(&logs)
    );
    p.kill9().await;

    // With nothing configured the offline model is the default: it says so, once.
    let p = Proc::start(&[("PES_DATABASE_URL", db)]).await;
    let logs = p.log_lines();
    let line = provider_line(&logs);
    assert_eq!(line["provider"], "offline", "{line}");
    assert_eq!(line["model"], "offline", "{line}");
    let warnings = offline_warnings(&logs);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0]["level"], "WARN");
    p.kill9().await;
    let _ = std::fs::remove_dir_all(dir);
}

async fn run_started_reports_provider_and_model(backend: Backend) {
    let llm = FakeLlm::start().await;
    // The server default: openai with PES_LLM_MODEL=fake-model (see `test_config`).
    let app = spawn(backend, Some(&llm)).await;
    let started = |obs: Vec<Value>| {
        obs.into_iter()
            .filter(|o| o["type"] == "RUN_STARTED")
            .map(|o| o["content"].clone())
            .collect::<Vec<_>>()
    };

    let t = app.thread(json!({})).await;
    app.run_wait(&t, "what is 2+2?").await;
    let c = started(app.observations(&t).await).remove(0);
    assert_eq!(c["provider"], "openai", "{c}");
    assert_eq!(c["model"], "fake-model", "the server's default model: {c}");
    assert!(c.get("warning").is_none(), "{c}");
    assert_eq!(
        llm.requests()[0]["model"],
        "fake-model",
        "the model reported is the one called"
    );

    // The thread's model wins over the default, and a run's over the thread's.
    let t = app
        .thread(json!({"config": {"model": "thread-model"}}))
        .await;
    app.run_wait(&t, "what is 2+2?").await;
    let (s, _) = app
        .post(
            &format!("/v1/threads/{t}/runs/wait"),
            json!({"query": "again", "config": {"model": "run-model"}}),
        )
        .await;
    assert_eq!(s, 200);
    let c = started(app.observations(&t).await);
    assert_eq!(c[0]["model"], "thread-model", "{c:?}");
    assert_eq!(c[1]["model"], "run-model", "{c:?}");
    assert!(
        llm.requests().iter().any(|r| r["model"] == "run-model"),
        "the run's model was called"
    );

    // A thread that names the offline provider gets it, and is told it is not a real model.
    let t = app.thread(json!({"config": {"provider": "offline"}})).await;
    app.run_wait(&t, "what is 2+2?").await;
    let c = started(app.observations(&t).await).remove(0);
    assert_eq!(c["provider"], "offline", "{c}");
    assert_eq!(c["model"], "offline", "{c}");
    assert!(c["warning"].as_str().unwrap().contains("offline"), "{c}");
    app.stop().await;
}
both_stores!(
    run_started_names_the_model,
    run_started_reports_provider_and_model
);
