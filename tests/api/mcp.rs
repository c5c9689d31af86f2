//! MCP servers as tool sources, against a real MCP server written with the official Python SDK
//! (`tests/mcp/server.py`), over streamable HTTP and over stdio: discovery into `/v1/tools`,
//! calls in a run (arguments, results, `isError`, the idempotency key in `_meta`, the operator's
//! headers), approval gating, `list_changed`, a server that is down at start, dies, crashes
//! mid-call and comes back, all without breaking a run or the service.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::both_stores;
use crate::fake_llm::{FakeLlm, Reply, plan};
use crate::helpers::{Backend, TestApp, scratch, spawn_with};

/// The venv's Python with the Python MCP SDK (see [`crate::helpers::venv_python`]).
fn python() -> Option<PathBuf> {
    crate::helpers::venv_python("mcp", "the Python MCP SDK")
}

fn server_py() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp/server.py")
        .to_string_lossy()
        .into_owned()
}

/// The MCP server over streamable HTTP, as a child process.
struct HttpPeer {
    python: PathBuf,
    child: Child,
    port: u16,
}

impl HttpPeer {
    async fn start(python: &Path, port: u16) -> Self {
        let mut child = Command::new(python)
            .args([
                server_py(),
                "http".into(),
                "--port".into(),
                port.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the MCP peer starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the MCP peer says READY in time")
            .unwrap()
            .expect("a READY line");
        let url = ready
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("unexpected first line: {ready}"));
        let port = url
            .trim_end_matches("/mcp")
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        Self {
            python: python.to_owned(),
            child,
            port,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// kill -9.
    async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// Start again on the same port.
    async fn restart(&mut self) {
        let _ = self.child.kill().await;
        *self = Self::start(&self.python, self.port).await;
    }
}

/// `PES_MCP_SERVERS` naming `web` (HTTP, with an Authorization header) and `local` (stdio).
fn servers(python: &Path, http_url: &str, count_file: &Path) -> String {
    json!({
        "web": {"url": http_url, "headers": {"Authorization": "Bearer sekret", "X-Team": "blue"}},
        "local": {
            "command": python,
            "args": [server_py(), "stdio"],
            "env": {"MCP_COUNT_FILE": count_file}
        }
    })
    .to_string()
}

async fn spawn_mcp(backend: Backend, llm: &FakeLlm, servers: String) -> TestApp {
    spawn_with(backend, Some(llm), |c| {
        c.mcp_servers = Some(servers);
        c.mcp_ping_ms = 100;
        c.mcp_reconnect_max_ms = 400;
        c.mcp_connect_timeout_seconds = 20;
        c.tool_timeout_seconds = 20;
    })
    .await
}

/// Poll `/v1/tools` until `pred` holds (30 s at most).
async fn wait_tools(app: &TestApp, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (st, body) = app.get("/v1/tools").await;
        assert_eq!(st, 200, "{body}");
        if pred(&body) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the catalogue never showed {what}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn tool<'a>(catalogue: &'a Value, name: &str) -> Option<&'a Value> {
    catalogue["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
}

fn available(catalogue: &Value, name: &str) -> bool {
    tool(catalogue, name).is_some_and(|t| t["available"] == true)
}

/// The `TOOL_EXECUTION` observations of a thread, by tool name.
async fn executions(app: &TestApp, thread: &str) -> Vec<Value> {
    app.observations(thread)
        .await
        .into_iter()
        .filter(|o| o["type"] == "TOOL_EXECUTION")
        .map(|o| o["content"].clone())
        .collect()
}

async fn tools_of_both_transports_work_in_a_run(backend: Backend) {
    let Some(python) = python() else { return };
    let (dir, _guard) = scratch("pes-mcp");
    let counter = dir.join("count");
    let peer = HttpPeer::start(&python, 0).await;
    let llm = FakeLlm::start().await;
    let app = spawn_mcp(backend, &llm, servers(&python, &peer.url(), &counter)).await;

    // Discovered at start: both servers' tools, with their schemas.
    let (st, cat) = app.get("/v1/tools").await;
    assert_eq!(st, 200);
    for server in ["web", "local"] {
        for t in ["echo", "add", "fail", "whoami", "count"] {
            let name = format!("{server}__{t}");
            let entry = tool(&cat, &name).unwrap_or_else(|| panic!("{name} missing: {cat}"));
            assert_eq!(entry["source"], "mcp");
            assert_eq!(entry["server"], server);
            assert_eq!(entry["available"], true);
        }
        let servers = cat["servers"].as_array().unwrap();
        let s = servers.iter().find(|s| s["name"] == server).unwrap();
        assert_eq!(
            (s["available"].as_bool(), s["source"].as_str()),
            (Some(true), Some("mcp"))
        );
    }
    let echo = tool(&cat, "web__echo").unwrap();
    assert_eq!(
        echo["parameters"]["properties"]["text"]["type"], "string",
        "{echo}"
    );
    assert_eq!(echo["parameters"]["required"], json!(["text"]));
    assert!(
        echo["description"].as_str().unwrap().contains("echo"),
        "{echo}"
    );

    llm.push(
        "plan",
        plan(&[(
            "s1",
            "Use the MCP tools",
            &[
                "web__echo",
                "local__add",
                "web__whoami",
                "local__whoami",
                "web__fail",
            ],
            &[],
        )]),
    );
    llm.push(
        "execute",
        Reply::ToolCalls(vec![
            ("web__echo".into(), json!({"text": "hi"})),
            ("local__add".into(), json!({"a": 2, "b": 3})),
            ("web__whoami".into(), json!({})),
            ("local__whoami".into(), json!({})),
            ("web__fail".into(), json!({"message": "no such order"})),
            ("web__echo".into(), json!({"text": 7})),
        ]),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "use the tools").await;
    assert_eq!(run["status"], "completed", "{run}");
    let run_id = run["runId"].as_str().unwrap();

    let ex = executions(&app, &t).await;
    assert_eq!(ex.len(), 6, "{ex:?}");
    let by = |name: &str, i: usize| -> &Value {
        ex.iter().filter(|e| e["name"] == name).nth(i).unwrap()
    };
    assert_eq!(by("web__echo", 0)["output"], "echo: hi");
    assert_eq!(by("web__echo", 0)["status"], "success");
    assert_eq!(by("local__add", 0)["output"], json!({"sum": 5}));
    // The idempotency key and the operator's headers reach the server.
    for (name, headers) in [("web__whoami", true), ("local__whoami", false)] {
        let e = by(name, 0);
        let who: Value = serde_json::from_str(e["output"].as_str().unwrap()).unwrap();
        assert_eq!(
            who["meta"]["idempotencyKey"],
            format!("{run_id}:{}", e["toolCallId"].as_str().unwrap()),
            "{who}"
        );
        if headers {
            assert_eq!(who["headers"]["authorization"], "Bearer sekret", "{who}");
            assert_eq!(who["headers"]["x-team"], "blue", "{who}");
        } else {
            // A stdio server starts with a cleared environment: the few variables a program
            // needs and its own `env`, never ours (the test's DATABASE_URL, provider keys).
            // Python adds LC_CTYPE itself when it finds the C locale (PEP 538).
            let names: Vec<&str> = who["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert!(names.contains(&"MCP_COUNT_FILE"), "{who}");
            for name in &names {
                assert!(
                    ["PATH", "HOME", "LANG", "TZ", "MCP_COUNT_FILE", "LC_CTYPE"].contains(name),
                    "the stdio server inherited {name}: {who}"
                );
            }
        }
    }
    // isError is a tool error the model reads; bad arguments never reach the server.
    let fail = by("web__fail", 0);
    assert_eq!(fail["status"], "error");
    assert!(
        fail["error"].as_str().unwrap().contains("no such order"),
        "{fail}"
    );
    let bad = by("web__echo", 1);
    assert_eq!(bad["status"], "error");
    assert!(
        bad["error"]
            .as_str()
            .unwrap()
            .contains("/text: 7 is not of type"),
        "{bad}"
    );
    let second = llm.requests_of("execute")[1].to_string();
    assert!(
        second.contains("no such order"),
        "the model read the tool error"
    );
    assert!(second.contains("echo: hi"));
    drop(peer);
    app.stop().await;
}
both_stores!(run, tools_of_both_transports_work_in_a_run);

async fn approval_gates_mcp_tools_and_the_call_runs_once(backend: Backend) {
    let Some(python) = python() else { return };
    let (dir, _guard) = scratch("pes-mcp");
    let counter = dir.join("count");
    let peer = HttpPeer::start(&python, 0).await;
    let llm = FakeLlm::start().await;
    let app = spawn_mcp(backend, &llm, servers(&python, &peer.url(), &counter)).await;
    llm.push("plan", plan(&[("s1", "Count", &["local__count"], &[])]));
    llm.push(
        "execute",
        Reply::ToolCalls(vec![("local__count".into(), json!({}))]),
    );
    let t = app
        .thread(json!({"config": {"requireApproval": ["local__count"]}}))
        .await;
    let run = app.run_wait(&t, "count once").await;
    assert_eq!(run["status"], "suspended", "{run}");
    assert_eq!(
        run["suspension"]["toolCall"]["name"], "local__count",
        "{run}"
    );
    assert!(!counter.exists(), "nothing ran before the approval");
    let sid = run["suspension"]["suspensionId"].as_str().unwrap();
    let (st, b) = app
        .post(
            &format!("/v1/suspensions/{sid}/resume"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(st, 202, "{b}");
    let done = app
        .wait_run(&t, run["runId"].as_str().unwrap(), |r| {
            r["status"] == "completed"
        })
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        std::fs::read_to_string(&counter).unwrap().lines().count(),
        1
    );
    let ex = executions(&app, &t).await;
    assert_eq!(ex[0]["output"], "1", "{ex:?}");
    drop(peer);
    app.stop().await;
}
both_stores!(approval, approval_gates_mcp_tools_and_the_call_runs_once);

/// A server down at start, killed, crashed mid-call, and restarted: the service starts anyway,
/// the tools say they are unavailable and why, runs go on with a tool error, and the tools come
/// back without a restart.
async fn a_dead_server_never_breaks_a_run_and_comes_back() {
    let Some(python) = python() else { return };
    let (dir, _guard) = scratch("pes-mcp");
    let counter = dir.join("count");
    // A port nothing listens on yet: take one, let it go, and start the server there later.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let llm = FakeLlm::start().await;
    let app = spawn_mcp(Backend::Sqlite, &llm, servers(&python, &url, &counter)).await;

    let cat = wait_tools(&app, "web down, local up", |c| {
        c["servers"][1]["name"] == "web"
            && c["servers"][1]["available"] == false
            && available(c, "local__echo")
    })
    .await;
    let reason = cat["servers"][1]["unavailableReason"].as_str().unwrap();
    assert!(reason.contains("web"), "{reason}");
    assert!(
        tool(&cat, "web__echo").is_none(),
        "nothing is known of web yet"
    );
    // Its tools may be named before it is up, and a call explains the outage.
    let t = app
        .thread(json!({"config": {"tools": ["web__echo", "local__echo"]}}))
        .await;
    // Not offered to the model (nothing is known of it), but a model that names it anyway is
    // told why it cannot have it.
    llm.push("plan", plan(&[("s1", "Echo", &["local__echo"], &[])]));
    llm.push(
        "execute",
        Reply::ToolCalls(vec![("web__echo".into(), json!({"text": "x"}))]),
    );
    let run = app.run_wait(&t, "echo while down").await;
    assert_eq!(run["status"], "completed", "{run}");
    let ex = executions(&app, &t).await;
    assert_eq!(ex[0]["status"], "error");
    assert!(
        ex[0]["error"].as_str().unwrap().contains("unavailable"),
        "{ex:?}"
    );

    // It comes up: discovered without a restart.
    let mut peer = HttpPeer::start(&python, port).await;
    wait_tools(&app, "web up", |c| available(c, "web__echo")).await;

    // kill -9: marked unavailable (by the ping), calls fail at once with the reason.
    peer.kill().await;
    let cat = wait_tools(&app, "web down again", |c| {
        tool(c, "web__echo").is_some_and(|t| t["available"] == false)
    })
    .await;
    let why = tool(&cat, "web__echo").unwrap()["unavailableReason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(why.contains("not connected"), "{why}");
    llm.push("plan", plan(&[("s1", "Echo", &["web__echo"], &[])]));
    llm.push(
        "execute",
        Reply::ToolCalls(vec![("web__echo".into(), json!({"text": "y"}))]),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "echo while dead").await;
    assert_eq!(run["status"], "completed", "{run}");
    let ex = executions(&app, &t).await;
    let last = ex.last().unwrap();
    assert_eq!(last["status"], "error");
    assert!(
        last["error"].as_str().unwrap().contains("not connected"),
        "{last}"
    );

    // Back on the same port: reconnected in the background, the call works again.
    peer.restart().await;
    wait_tools(&app, "web back", |c| available(c, "web__echo")).await;
    llm.push("plan", plan(&[("s1", "Echo", &["web__echo"], &[])]));
    llm.push(
        "execute",
        Reply::ToolCalls(vec![("web__echo".into(), json!({"text": "z"}))]),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "echo when back").await;
    assert_eq!(run["status"], "completed", "{run}");
    let ex = executions(&app, &t).await;
    assert_eq!(ex.last().unwrap()["output"], "echo: z", "{ex:?}");

    // A stdio server that dies mid-call: a tool error, then a new process serves.
    let (_, cat) = app.get("/v1/tools").await;
    assert!(available(&cat, "local__whoami"));
    let t2 = app.thread(json!({})).await;
    llm.push(
        "plan",
        plan(&[("s1", "Crash", &["local__crash", "local__whoami"], &[])]),
    );
    llm.push(
        "execute",
        Reply::ToolCalls(vec![("local__crash".into(), json!({}))]),
    );
    let run = app.run_wait(&t2, "crash it").await;
    assert_eq!(run["status"], "completed", "{run}");
    let ex = executions(&app, &t2).await;
    assert_eq!(ex[0]["status"], "error", "{ex:?}");
    wait_tools(&app, "local back", |c| available(c, "local__whoami")).await;
    // Healthz never noticed any of it.
    let (st, _) = app.get("/healthz").await;
    assert_eq!(st, 200);
    drop(peer);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_never_breaks_a_run_or_the_service() {
    a_dead_server_never_breaks_a_run_and_comes_back().await;
}

/// `notifications/tools/list_changed` re-lists the server's tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_change_reaches_the_catalogue() {
    let Some(python) = python() else { return };
    let (dir, _guard) = scratch("pes-mcp");
    let peer = HttpPeer::start(&python, 0).await;
    let llm = FakeLlm::start().await;
    let app = spawn_mcp(
        Backend::Sqlite,
        &llm,
        servers(&python, &peer.url(), &dir.join("count")),
    )
    .await;
    llm.push(
        "plan",
        plan(&[(
            "s1",
            "Add tools",
            &["web__add_tool", "local__add_tool"],
            &[],
        )]),
    );
    llm.push(
        "execute",
        Reply::ToolCalls(vec![
            ("web__add_tool".into(), json!({"name": "fresh"})),
            ("local__add_tool".into(), json!({"name": "fresh"})),
        ]),
    );
    let t = app.thread(json!({})).await;
    let run = app.run_wait(&t, "add a tool").await;
    assert_eq!(run["status"], "completed", "{run}");
    let cat = wait_tools(&app, "the new tools", |c| {
        available(c, "web__fresh") && available(c, "local__fresh")
    })
    .await;
    assert_eq!(tool(&cat, "web__fresh").unwrap()["source"], "mcp");
    drop(peer);
    app.stop().await;
}

/// A mistake in `PES_MCP_SERVERS` stops the start with a message naming it.
#[tokio::test]
async fn a_bad_server_config_is_a_start_up_error() {
    let url = crate::helpers::database_url(Backend::Sqlite).await;
    let mut config = crate::helpers::test_config(&url, None);
    config.mcp_servers = Some(r#"{"docs": {"url": "ftp://x"}}"#.into());
    let err = pes_server::App::build(config).await.err().expect("refused");
    assert!(
        format!("{err:#}").contains("server `docs`: url must be http"),
        "{err:#}"
    );
}

/// With no model configured, the offline model calls an MCP tool a query names, with the JSON
/// arguments that follow its name: a new user can try a server before wiring a real model.
#[tokio::test]
async fn the_offline_model_calls_a_tool_the_query_names() {
    let Some(python) = python() else { return };
    let (dir, _guard) = scratch("pes-mcp");
    let peer = HttpPeer::start(&python, 0).await;
    let app = spawn_with(Backend::Sqlite, None, |c| {
        c.mcp_servers = Some(servers(&python, &peer.url(), &dir.join("count")));
    })
    .await;
    let t = app.thread(json!({})).await;
    let run = app
        .run_wait(
            &t,
            r#"Call local__echo with {"text": "hi"} and web__add with {"a": 2, "b": 40}"#,
        )
        .await;
    assert_eq!(run["status"], "completed", "{run}");
    let answer = run["finalResponse"]["response"].as_str().unwrap();
    assert!(answer.contains("echo: hi"), "{answer}");
    assert!(answer.contains(r#"{"sum":42}"#), "{answer}");
    let ex = executions(&app, &t).await;
    assert_eq!(ex.len(), 2, "{ex:?}");
    drop(peer);
    app.stop().await;
}
