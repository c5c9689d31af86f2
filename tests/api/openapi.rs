//! The OpenAPI document checked by real tools, from the Python venv that `scripts/pyvenv` makes
//! (`.ci/run` exports its path as `PES_PYVENV`; else `target/pyvenv` is used when it exists):
//! `openapi-spec-validator` holds the document to the OpenAPI 3.1 rules; a bounded schemathesis
//! run fuzzes the real binary on each store against the document it serves, failing on any 5xx,
//! undocumented status code, content type or header, or response that does not fit its schema;
//! and `openapi-python-client` generates a client from the served document without a single
//! warning, which `tests/openapi/client_run.py` uses, typed end to end, for a run with an
//! approval. Without the venv these tests say so loudly and pass, except where `PES_PYVENV` or
//! `CI` is set: there a missing venv fails them.
//!
//! Without Python, the runs, suspensions, states and observations of real runs are validated
//! against the document's own schemas (each observation's content by its type).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_stores;
use crate::db;
use crate::helpers::{Backend, scratch, spawn, venv_python};
use crate::process::Proc;

/// The venv with `openapi-spec-validator` and `schemathesis`, or `None` (after a loud message)
/// when there is none and none is required.
fn pyvenv() -> Option<PathBuf> {
    let explicit = std::env::var_os("PES_PYVENV").filter(|v| !v.is_empty());
    let dir = explicit.clone().map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join("pyvenv")
    });
    let has = |tool: &str| dir.join("bin").join(tool).is_file();
    if has("openapi-spec-validator") && has("schemathesis") {
        return Some(dir);
    }
    assert!(
        explicit.is_none() && std::env::var_os("CI").is_none(),
        "the OpenAPI tools are missing from {}: run `scripts/pyvenv`",
        dir.display()
    );
    eprintln!(
        "\n!!! SKIPPED: no Python venv with the OpenAPI tools at {}.\n!!! Run `scripts/pyvenv` \
         (CI does) to validate the OpenAPI document and fuzz the server.\n",
        dir.display()
    );
    None
}

/// Run `openapi-spec-validator` (OpenAPI 3.1 rules) on `doc`: its success and its output.
fn validate(venv: &Path, doc: &Value) -> (bool, String) {
    let (dir, _guard) = scratch("pes-openapi");
    let file = dir.join("openapi.json");
    std::fs::write(&file, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
    let out = std::process::Command::new(venv.join("bin").join("openapi-spec-validator"))
        .args(["--schema", "3.1", "--validation-errors", "all"])
        .arg(&file)
        .output()
        .expect("openapi-spec-validator runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_document_is_valid_openapi_3_1() {
    let Some(venv) = pyvenv() else { return };
    let doc = serde_json::to_value(pes_server::http::openapi()).unwrap();
    let (ok, out) = validate(&venv, &doc);
    assert!(ok, "openapi-spec-validator refuses the document:\n{out}");

    // The validator is not a rubber stamp: the fault the document once had (a query parameter
    // declared as a path parameter the path does not name) is refused.
    let mut broken = doc;
    broken["paths"]["/v1/threads"]["get"]["parameters"]
        .as_array_mut()
        .expect("GET /v1/threads has parameters")
        .push(json!({"name": "limit2", "in": "path", "required": true, "schema": {"type": "integer"}}));
    let (ok, out) = validate(&venv, &broken);
    assert!(
        !ok && out.contains("limit2"),
        "the validator accepted a path parameter missing from its path:\n{out}"
    );
}

/// Operations schemathesis leaves out for good: a request/response fuzzer cannot consume an
/// endless stream. The SSE stream has its own tests (`http.rs`, `durability.rs`).
const EXCLUDED_PATHS: &[&str] = &["/v1/threads/{threadId}/events"];

/// Checks left out for good. `positive_data_acceptance` expects every schema-valid request to
/// succeed, but the server also refuses what a schema cannot state: a `config.provider` that is
/// not configured, tool names that are not registered, a cursor it did not make (cursors are
/// opaque), integral floats such as `5.0` where an integer is due.
const EXCLUDED_CHECKS: &[&str] = &["positive_data_acceptance"];

/// Test cases per operation and phase; with the coverage phase's boundary cases a run makes about
/// 1,500–2,500 requests and takes under a minute per store.
const MAX_EXAMPLES: u32 = 25;

/// Fixed so that a failure reproduces; `PES_SCHEMATHESIS_SEED` explores other inputs.
const SEED: &str = "20250107";

/// Fuzz the real binary on `backend` with schemathesis; fail on anything it finds.
async fn schemathesis_finds_nothing(backend: Backend) {
    let Some(venv) = pyvenv() else { return };
    let (database_url, _sqlite) = match backend {
        Backend::Postgres => (db::fresh_postgres_url().await, None),
        Backend::Sqlite => {
            let (url, dir) = db::fresh_sqlite_location();
            (url, Some(dir))
        }
    };
    let key = format!("st-{}", Uuid::new_v4().simple());
    // With operator keys too, so that the operator's routes answer a request without a key 401
    // (schemathesis sends the tenant's key: 403 there) as every guarded route does.
    let server = Proc::start(&[
        ("PES_DATABASE_URL", database_url),
        ("PES_API_KEYS", key.clone()),
        (
            "PES_OPERATOR_KEYS",
            format!("op-{}", Uuid::new_v4().simple()),
        ),
    ])
    .await;

    let (status, doc) = server.get("/openapi.json").await;
    assert_eq!(status, 200, "the served document: {doc}");
    let (dir, _guard) = scratch("pes-openapi");
    let file = dir.join("openapi.json");
    std::fs::write(&file, serde_json::to_vec(&doc).unwrap()).unwrap();

    let excluded: Vec<&str> = EXCLUDED_CHECKS.to_vec();
    let seed = std::env::var("PES_SCHEMATHESIS_SEED").unwrap_or_else(|_| SEED.to_owned());
    let mut cmd = tokio::process::Command::new(venv.join("bin").join("schemathesis"));
    cmd.current_dir(&dir)
        .arg("run")
        .arg(&file)
        .args(["--url", &server.base])
        .args(["--header", &format!("Authorization: Bearer {key}")])
        .args(["--checks", "all", "--exclude-checks", &excluded.join(",")])
        .args(["--max-examples", &MAX_EXAMPLES.to_string(), "--seed", &seed])
        .args(["--request-timeout", "30", "--generation-database", "none"])
        .args(["--no-color", "--output-truncate", "false"])
        .kill_on_drop(true);
    for path in EXCLUDED_PATHS {
        cmd.args(["--exclude-path", path]);
    }
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(300), cmd.output())
        .await
        .expect("schemathesis finishes within 5 minutes")
        .expect("schemathesis runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "schemathesis on {backend:?} took {:.1} s:\n{text}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "schemathesis found problems on {backend:?} (seed {seed}):\n{text}"
    );
    assert!(
        text.contains("passed") && !text.contains(" 0 generated"),
        "schemathesis ran no test case:\n{text}"
    );

    // The fuzzing left the server serving.
    let (status, ready) = server.get("/readyz").await;
    assert_eq!(status, 200, "{ready}");
    server.kill9().await;
}

both_stores!(schemathesis, schemathesis_finds_nothing);

/// What the document states about bodies and parameters holds at the edges, in the document's own
/// units (JSON Schema lengths count characters, not bytes).
async fn stated_constraints_hold_at_their_edges(backend: Backend) {
    let app = spawn(backend, None).await;
    let doc = serde_json::to_value(pes_server::http::openapi()).unwrap();
    let key_len =
        doc["components"]["schemas"]["CreateRun"]["properties"]["idempotencyKey"]["maxLength"]
            .as_u64()
            .unwrap() as usize;
    let run = |key: String| json!({"query": "hi", "ifNotExists": "create", "idempotencyKey": key});
    // Two bytes a character: a byte count would refuse the longest key the document allows.
    let (s, r) = app
        .post("/v1/threads/t1/runs", run("é".repeat(key_len)))
        .await;
    assert_eq!(s, 202, "{r}");
    let (s, r) = app
        .post("/v1/threads/t1/runs", run("é".repeat(key_len + 1)))
        .await;
    assert_eq!(s, 422, "{r}");
    let (s, r) = app
        .post("/v1/threads/t1/runs", json!({"query": " \t "}))
        .await;
    assert_eq!(
        (s, r["code"].as_str()),
        (422, Some("validation_failed")),
        "{r}"
    );
    let (s, r) = app.post("/v1/threads", json!({"metadata": [1]})).await;
    assert_eq!(s, 422, "metadata must be an object: {r}");

    let limit = &doc["paths"]["/v1/threads"]["get"]["parameters"][0]["schema"];
    let (min, max) = (
        limit["minimum"].as_u64().unwrap(),
        limit["maximum"].as_u64().unwrap(),
    );
    for (n, want) in [(min - 1, 422), (min, 200), (max, 200), (max + 1, 422)] {
        let (s, r) = app.get(&format!("/v1/threads?limit={n}")).await;
        assert_eq!(s, want, "limit={n}: {r}");
    }
    let (s, r) = app.get("/v1/threads/t1/suspensions?status=nope").await;
    assert_eq!(s, 422, "{r}");
    app.stop().await;
}

both_stores!(stated_constraints, stated_constraints_hold_at_their_edges);

/// A validator for the document's component schema `name` (its `$ref`s resolved within the
/// document), formats included.
fn validator(doc: &Value, name: &str) -> jsonschema::Validator {
    let root = json!({
        "$ref": format!("#/components/schemas/{name}"),
        "components": doc["components"],
    });
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&root)
        .unwrap_or_else(|e| panic!("the schema {name} compiles: {e}"))
}

/// Panic unless `value` fits the document's schema `name`, naming each violation.
fn assert_fits(doc: &Value, name: &str, value: &Value) {
    let errors: Vec<String> = validator(doc, name)
        .iter_errors(value)
        .map(|e| format!("{e} (at {})", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "not a {name}: {errors:#?}\n{value:#}");
}

/// What the server sends for runs with approvals (one edited, one interrupted by a newer run,
/// one rejected) fits the document: each run, suspension and state as the routes answer them,
/// and every observation, whose `content` the document types by `type`.
async fn what_runs_send_fits_the_document(backend: Backend) {
    let app = spawn(backend, None).await;
    let doc = serde_json::to_value(pes_server::http::openapi()).unwrap();
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;

    let first = app.run_wait(&t, "What is 2+2?").await;
    assert_eq!(first["status"], "suspended", "{first}");
    assert_fits(&doc, "Run", &first);
    let (_, state) = app.get(&format!("/v1/threads/{t}/state")).await;
    assert_fits(&doc, "AgentStateView", &state);
    let sid = first["suspension"]["suspensionId"].as_str().unwrap();
    let (s, resumed) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "edit", "modifiedArgs": {"expression": "3+3"}, "reason": "three"}),
        )
        .await;
    assert_eq!(s, 202, "{resumed}");
    assert_fits(&doc, "Run", &resumed);
    let done = app.settled(&first).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_fits(&doc, "Run", &done);
    let (_, decided) = app.get(&format!("/v1/suspensions/{sid}")).await;
    assert_eq!(decided["decision"], "edit", "{decided}");
    assert_fits(&doc, "Suspension", &decided);

    // A suspended run interrupted by a newer one; the newer one rejected.
    let second = app.run_wait(&t, "What is 5*5?").await;
    assert_eq!(second["status"], "suspended", "{second}");
    let (s, third) = app
        .post(
            &format!("/v1/threads/{t}/runs"),
            json!({"query": "What is 6*7?", "multitaskStrategy": "interrupt"}),
        )
        .await;
    assert_eq!(s, 202, "{third}");
    let third = app
        .wait_run(&t, third["runId"].as_str().unwrap(), |r| {
            r["status"] == "suspended"
        })
        .await;
    let sid = third["suspension"]["suspensionId"].as_str().unwrap();
    let (s, r) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "reject", "reason": "not now"}),
        )
        .await;
    assert_eq!(s, 202, "{r}");
    assert_eq!(app.settled(&third).await["status"], "completed");

    let (_, runs) = app.get(&format!("/v1/threads/{t}/runs")).await;
    assert_fits(&doc, "Page_Run", &runs);
    let statuses: Vec<&str> = runs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert!(statuses.contains(&"cancelled"), "{statuses:?}");
    let (_, page) = app
        .get(&format!("/v1/threads/{t}/observations?limit=1000"))
        .await;
    assert_fits(&doc, "Page_Observation", &page);
    let observations = page["items"].as_array().unwrap();
    let observation = validator(&doc, "Observation");
    let mut types = std::collections::BTreeSet::new();
    for o in observations {
        let errors: Vec<String> = observation.iter_errors(o).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{errors:#?}\n{o:#}");
        types.insert(o["type"].as_str().unwrap());
    }
    for t in [
        "RUN_STARTED",
        "PLAN",
        "TOOL_CALL",
        "AGENT_SUSPENDED",
        "RUN_SUSPENDED",
        "AGENT_RESUMED",
        "TOOL_EXECUTION",
        "THOUGHTS",
        "FINAL_RESPONSE",
        "RUN_COMPLETED",
        "RUN_CANCELLED",
    ] {
        assert!(types.contains(t), "no {t} in {types:?}");
    }

    // The validation bites: a PLAN whose content is another type's is refused.
    let mut wrong = observations
        .iter()
        .find(|o| o["type"] == "PLAN")
        .unwrap()
        .clone();
    wrong["content"] =
        json!({"itemId": "step-1", "status": "pending", "previousStatus": "pending"});
    assert!(!observation.is_valid(&wrong), "{wrong}");
    app.stop().await;
}

both_stores!(runs_fit_the_document, what_runs_send_fits_the_document);

/// Approve each approval `run` asks for until it has ended; the run as it ended.
async fn approve_until_ended(app: &crate::helpers::TestApp, mut run: Value) -> Value {
    while run["status"] == "suspended" {
        let sid = run["suspension"]["suspensionId"].as_str().unwrap();
        let (s, r) = app
            .post(
                &format!("/v1/suspensions/{sid}/resume"),
                json!({"decision": "approve"}),
            )
            .await;
        assert_eq!(s, 202, "{r}");
        run = app.settled(&run).await;
    }
    run
}

/// Every observation of the runs that write the rarer shapes fits the document too: a run steered
/// while it waits for a person (`STEERING`, and the `PLAN_UPDATE` of its refinement turn with
/// `steeringMessageIds`), a follow-up that refines the thread's plan, a flowchart run
/// (`FLOWCHART_STEP`), and a run that stops at its token budget (a `budget` suspension).
async fn what_other_runs_send_fits_the_document(backend: Backend) {
    let app = spawn(backend, None).await;
    let doc = serde_json::to_value(pes_server::http::openapi()).unwrap();
    let observation = validator(&doc, "Observation");

    // Steered while suspended, then approved: the refinement turn reads the steering.
    let t = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&t, "What is 17*23?").await;
    assert_eq!(run["status"], "suspended", "{run}");
    let rid = run["runId"].as_str().unwrap();
    let (s, steered) = app
        .post(
            &format!("/v1/threads/{t}/runs/{rid}/steer"),
            json!({"message": "Also say what 2+2 is."}),
        )
        .await;
    assert_eq!(s, 202, "{steered}");
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (s, r) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(s, 202, "{r}");
    // The refinement may plan another approval: approve until the run ends.
    let done = approve_until_ended(&app, app.settled(&run).await).await;
    assert_eq!(done["status"], "completed", "{done}");
    // A follow-up on the same thread refines its plan.
    let follow_up = app.run_wait(&t, "And what is 3+3?").await;
    let follow_up = approve_until_ended(&app, follow_up).await;
    assert_eq!(follow_up["status"], "completed", "{follow_up}");

    // A flowchart run.
    let spec = json!({
        "description": "Double a number.",
        "inputSchema": {"type": "object", "required": ["n"],
            "properties": {"n": {"type": "number"}}},
        "flowchart": {"start": "double", "stages": {
            "double": {"kind": "tool", "tool": "calculator", "output": "doubled", "next": "done",
                       "args": {"expression": {"cat": [{"var": "args.n"}, " * 2"]}}},
            "done": {"kind": "end", "result": {"doubled": {"var": "state.doubled.result"}}}
        }}
    });
    crate::helpers::define_flowchart(&app, None, "double", spec).await;
    let (s, fc) = app
        .post("/v1/flowcharts/double/runs", json!({"input": {"n": 21}}))
        .await;
    assert_eq!(s, 202, "{fc}");
    let fc = app.settled(&fc).await;
    assert_eq!(fc["status"], "completed", "{fc}");
    let fc_thread = fc["threadId"].as_str().unwrap().to_owned();

    // A run that stops at its token budget.
    let b = app.thread(json!({})).await;
    let budgeted = app
        .run_wait_with(
            &b,
            json!({"query": "What is 2+2 and what time is it?",
                   "config": {"budget": {"maxTokens": 1, "onExceed": "suspend"}}}),
        )
        .await;
    assert_eq!(budgeted["status"], "suspended", "{budgeted}");
    assert_eq!(budgeted["suspension"]["kind"], "budget", "{budgeted}");

    let mut types = std::collections::BTreeSet::new();
    for thread in [t.as_str(), fc_thread.as_str(), b.as_str()] {
        let (_, page) = app
            .get(&format!("/v1/threads/{thread}/observations?limit=1000"))
            .await;
        assert_fits(&doc, "Page_Observation", &page);
        for o in page["items"].as_array().unwrap() {
            let errors: Vec<String> = observation.iter_errors(o).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{errors:#?}\n{o:#}");
            types.insert(o["type"].as_str().unwrap().to_owned());
            if o["type"] == "PLAN_UPDATE" && !o["content"]["steeringMessageIds"].is_null() {
                types.insert("PLAN_UPDATE from steering".into());
            }
        }
    }
    for t in [
        "STEERING",
        "PLAN_UPDATE",
        "PLAN_UPDATE from steering",
        "FLOWCHART_STEP",
        "AGENT_SUSPENDED",
        "RUN_SUSPENDED",
    ] {
        assert!(types.contains(t), "no {t} among {types:?}");
    }
    app.stop().await;
}

both_stores!(
    other_runs_fit_the_document,
    what_other_runs_send_fits_the_document
);

/// The `openapi-python-client` CLI of the venv, or `None` after a loud message (see
/// [`venv_python`]).
fn python_client_generator() -> Option<(PathBuf, PathBuf)> {
    let python = venv_python("openapi_python_client", "openapi-python-client")?;
    let bin = python.parent().unwrap().to_owned();
    Some((python, bin))
}

/// Generate a Python client from the served document: no warning may be printed (a schema the
/// generator drops or must name itself would be one). Returns the folder holding the package.
async fn generate_client(bin: &Path, doc: &Value, dir: &Path) -> PathBuf {
    let file = dir.join("openapi.json");
    std::fs::write(&file, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
    let out_dir = dir.join("client");
    // The generator formats its output with ruff, from the venv too.
    let path = std::env::join_paths(std::iter::once(bin.to_owned()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(bin.join("openapi-python-client"))
            .current_dir(dir)
            .env("PATH", path)
            .args(["generate", "--path"])
            .arg(&file)
            .arg("--output-path")
            .arg(&out_dir)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("openapi-python-client finishes within 2 minutes")
    .expect("openapi-python-client runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "openapi-python-client failed:\n{text}"
    );
    // It prints `Generating <folder>` and, for anything it could not use, warnings.
    let noise: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Generating "))
        .collect();
    assert!(
        noise.is_empty(),
        "openapi-python-client warned about the document:\n{text}"
    );
    assert!(
        out_dir.join("pes_server_client").join("models").is_dir(),
        "{text}"
    );
    out_dir
}

/// A client generated from the document works typed end to end: `tests/openapi/client_run.py`
/// creates a thread that needs approval for the calculator, posts a query with runs/wait, reads
/// the run's `suspension` as a model, approves it with an `ApproveResumeRequest`, waits for the
/// run and reads the observations as per-type models with typed content. What it reports is
/// what the server holds.
async fn a_generated_client_runs_an_approval_typed_end_to_end(backend: Backend) {
    let Some((python, bin)) = python_client_generator() else {
        return;
    };
    let app = spawn(backend, None).await;
    let (status, doc) = app.get("/openapi.json").await;
    assert_eq!(status, 200, "{doc}");
    let (dir, _guard) = scratch("pes-openapi");
    let client = generate_client(&bin, &doc, &dir).await;

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openapi/client_run.py");
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(&python)
            .arg(&script)
            .arg(&client)
            .arg(&app.base)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the client script finishes within 2 minutes")
    .expect("the client script runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the generated client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));

    let t = report["threadId"].as_str().unwrap();
    let (_, s) = app
        .get(&format!(
            "/v1/suspensions/{}",
            report["suspensionId"].as_str().unwrap()
        ))
        .await;
    assert_eq!(
        (
            s["status"].as_str(),
            s["decision"].as_str(),
            s["reason"].as_str()
        ),
        (Some("resolved"), Some("approve"), Some("looks right")),
        "{s}"
    );
    let (_, run) = app
        .get(&format!(
            "/v1/threads/{t}/runs/{}",
            report["runId"].as_str().unwrap()
        ))
        .await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["finalResponse"]["response"], report["answer"]);
    assert!(report["answer"].as_str().unwrap().contains('4'), "{report}");
    // The client read every observation of the thread, each as its own type.
    let types: Vec<Value> = app
        .observations(t)
        .await
        .iter()
        .map(|o| o["type"].clone())
        .collect();
    assert_eq!(report["types"], Value::Array(types));
    app.stop().await;
}

both_stores!(
    generated_client,
    a_generated_client_runs_an_approval_typed_end_to_end
);
