//! `pes-server ask`, the terminal client, as a process (the built binary) against a running test
//! server: it prints the tree and the answer and exits 0; answers a suspension from piped input
//! (approve, reject); exits non-zero when the run fails, when a suspension cannot be answered,
//! and after Ctrl-C cancels the run; survives a server restart without repeating a line; writes
//! no colour into a pipe; and at a terminal steers the run (`/steer`) and shows what it spent.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Notify;

use crate::fake_llm::{FakeLlm, Reply};
use crate::helpers::{
    Backend, SseReader, TestApp, database_url, metered_llm, spawn, spawn_config, spawn_with,
    test_config,
};

/// What a stream of the child printed so far, with a wake-up for each new piece.
#[derive(Default)]
struct Output {
    text: Mutex<String>,
    grew: Notify,
}

impl Output {
    fn get(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Wait (deadline 30 s) until the text contains `needle`.
    async fn wait_for(&self, needle: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let grew = self.grew.notified();
            if self.get().contains(needle) {
                return;
            }
            assert!(
                tokio::time::timeout_at(deadline, grew).await.is_ok(),
                "never printed {needle:?}; so far:\n{}",
                self.get()
            );
        }
    }
}

/// A running `pes-server ask`.
struct Ask {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Output>,
    err: Arc<Output>,
}

fn pump(mut from: impl tokio::io::AsyncRead + Unpin + Send + 'static, to: Arc<Output>) {
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 {
                break;
            }
            to.text
                .lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
            to.grew.notify_waiters();
        }
    });
}

impl Ask {
    /// Start the client against `base` with `args` after the query; its input stays open
    /// (written with [`Ask::say`]) unless `input` is given, which is written and closed.
    /// `What is 6*7?` on a thread where the calculator needs a person's approval.
    fn approval_needed(base: &str, input: Option<&str>) -> Ask {
        Self::start(
            base,
            "What is 6*7?",
            &["--config", r#"{"requireApproval": ["calculator"]}"#],
            input,
        )
    }

    fn start(base: &str, query: &str, args: &[&str], input: Option<&str>) -> Ask {
        Self::start_on(base, query, args, input, Stdio::piped())
    }

    /// [`Ask::start`] with `stdin` as its input (a terminal's, say).
    fn start_on(base: &str, query: &str, args: &[&str], input: Option<&str>, stdin: Stdio) -> Ask {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pes-server"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .args(["ask", query, "--url", base])
            .args(args)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("pes-server ask starts");
        let out = Arc::new(Output::default());
        let err = Arc::new(Output::default());
        pump(child.stdout.take().unwrap(), out.clone());
        pump(child.stderr.take().unwrap(), err.clone());
        let mut stdin = child.stdin.take();
        if let Some(text) = input {
            let mut s = stdin.take().unwrap();
            let text = text.to_owned();
            tokio::spawn(async move {
                let _ = s.write_all(text.as_bytes()).await;
                // Dropped here: the client reads the end of its input.
            });
        }
        Ask {
            child,
            stdin,
            out,
            err,
        }
    }

    async fn say(&mut self, line: &str) {
        let s = self.stdin.as_mut().expect("input still open");
        s.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        s.flush().await.unwrap();
    }

    fn interrupt(&self) {
        let pid = self.child.id().expect("running") as i32;
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    }

    /// Wait (deadline 60 s) for the exit; its status, stdout and stderr.
    async fn finish(mut self) -> (ExitStatus, String, String) {
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "ask never exited; stdout:\n{}\nstderr:\n{}",
                    self.out.get(),
                    self.err.get()
                )
            })
            .unwrap();
        // The pipes close with the process; let the pumps take the last bytes.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        (status, self.out.get(), self.err.get())
    }
}

/// The `thread X · run Y` header's ids.
fn ids(stdout: &str) -> (String, String) {
    let head = stdout.lines().next().unwrap();
    let rest = head.strip_prefix("thread ").unwrap();
    let (t, r) = rest.split_once(" · run ").unwrap();
    (t.to_owned(), r.to_owned())
}

#[tokio::test]
async fn ask_prints_the_live_tree_and_the_answer_and_exits_0() {
    let app = spawn(Backend::Sqlite, None).await;
    let ask = Ask::start(
        &app.base,
        "What is 17*23, what is 2^10, and what time is it in Tokyo?",
        &[],
        Some(""),
    );
    let (status, out, err) = ask.finish().await;
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    // The tree: run-level lines at the left, items indented and tagged, results under calls.
    assert!(
        out.contains("\nPLAN Plan: 4 items\n  - step-1 Calculate 17*23\n"),
        "{out}"
    );
    // The item's status line at the item's depth, its tool call one step in, the result under
    // the call.
    assert!(out.contains("\n  [step-1] ITEM_STATUS_CHANGE"), "{out}");
    assert!(
        out.contains("\n    [step-1] TOOL_CALL calculator {\"expression\":\"17*23\"}"),
        "{out}"
    );
    assert!(
        out.contains(
            "\n      [step-1] TOOL_EXECUTION calculator → {\"expression\":\"17*23\",\"result\":391}"
        ),
        "{out}"
    );
    assert!(out.contains("\nRUN_COMPLETED Run completed\n"), "{out}");
    let answer = out.split("\nAnswer\n").nth(1).expect("an answer section");
    assert!(
        answer.contains("17*23 = 391") && answer.contains("2^10 = 1024"),
        "{answer}"
    );
    assert!(
        answer.contains("\nSuggestions\n- Configure a real model"),
        "{answer}"
    );
    // Piped: no colour, no progress line.
    assert!(
        !out.contains('\x1b') && !err.contains('\x1b'),
        "{out:?}\n{err:?}"
    );
    // The run it followed is the run the server completed.
    let (thread, run) = ids(&out);
    let (_, r) = app.get(&format!("/v1/threads/{thread}/runs/{run}")).await;
    assert_eq!(r["status"], "completed");
    app.stop().await;
}

#[tokio::test]
async fn ask_answers_a_suspension_from_piped_input() {
    let app = spawn(Backend::Sqlite, None).await;
    let ask = Ask::start(
        &app.base,
        "What is 6*7?",
        &[
            "--thread",
            "piped",
            "--config",
            r#"{"requireApproval": ["calculator"]}"#,
        ],
        // A refused edit is asked again; the second arguments fit.
        Some("e\n{\"expression\": 5}\n{\"expression\": \"6*8\"}\n"),
    );
    let (status, out, err) = ask.finish().await;
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains("thread piped · run "), "{out}");
    assert!(
        out.contains("? May the agent call `calculator` with these arguments?\n  proposed call: calculator {\"expression\":\"6*7\"}"),
        "{out}"
    );
    assert!(
        err.contains("refused: 422 validation_failed") && err.contains("/expression"),
        "{err}"
    );
    assert!(out.contains("→ edit"), "{out}");
    assert!(
        out.contains("TOOL_EXECUTION calculator → {\"expression\":\"6*8\",\"result\":48}"),
        "{out}"
    );
    assert!(out.contains("\nAnswer\n"), "{out}");
    app.stop().await;
}

#[tokio::test]
async fn ask_help_shows_whole_commands_to_copy() {
    let out = Command::new(env!("CARGO_BIN_EXE_pes-server"))
        .args(["ask", "--help"])
        .env_clear()
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).unwrap();
    for example in [
        r#"pes-server ask "What is 12*(3+4)?" --thread demo"#,
        r#"  --config '{"requireApproval": ["calculator"]}'"#,
        r#"pes-server ask "What is 2+2?" --thread demo --url http://127.0.0.1:9000 --api-key"#,
        r#"cargo run --release -- ask "What is 2+2?" --thread demo"#,
    ] {
        assert!(help.contains(example), "{example:?} in:\n{help}");
    }
    assert!(help.contains("an empty line or\n`back` returns"), "{help}");
}

#[tokio::test]
async fn ask_edit_starts_from_the_current_arguments_and_can_go_back_without_deciding() {
    let app = spawn(Backend::Sqlite, None).await;
    let ask = Ask::start(
        &app.base,
        "What is 6*7?",
        &[
            "--thread",
            "edits",
            "--config",
            r#"{"requireApproval": ["calculator"]}"#,
        ],
        // Edit, then back with an empty line; edit, then `back`; edit again with arguments
        // pasted over several lines.
        Some("e\n\ne\nback\ne\n{\n  \"expression\": \"6*9\"\n}\n"),
    );
    let (status, out, err) = ask.finish().await;
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    // The edit prompt shows the current arguments, indented, to copy and change.
    assert!(
        err.contains(
            "current arguments, to copy and change:\n{\n  \"expression\": \"6*7\"\n}\narguments"
        ),
        "{err}"
    );
    // The choices at the question, then twice again after going back.
    assert_eq!(err.matches("[a]pprove, [e]dit").count(), 3, "{err}");
    // One decision only, the last one.
    let decisions: Vec<&str> = out.lines().filter(|l| l.starts_with("→ ")).collect();
    assert_eq!(decisions, ["→ edit"], "{out}");
    assert!(
        out.contains("TOOL_EXECUTION calculator → {\"expression\":\"6*9\",\"result\":54}"),
        "{out}"
    );
    let (_, all) = app.get("/v1/threads/edits/suspensions?status=all").await;
    let all = all["items"].as_array().unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0]["decision"], "edit", "{all:?}");
    assert_eq!(
        all[0]["modifiedArgs"],
        serde_json::json!({"expression": "6*9"})
    );
    app.stop().await;
}

#[tokio::test]
async fn ask_approve_and_reject_each_let_the_run_go_on() {
    let app = spawn(Backend::Sqlite, None).await;
    let config = r#"{"requireApproval": ["calculator"]}"#;
    let approve = Ask::start(
        &app.base,
        "What is 6*7?",
        &["--config", config],
        Some("a\n"),
    );
    let (status, out, err) = approve.finish().await;
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(
        out.contains("→ approve") && out.contains("6*7 = 42"),
        "{out}"
    );

    let reject = Ask::start(
        &app.base,
        "What is 6*7?",
        &["--config", config],
        Some("r\nnot today\n"),
    );
    let (status, out, err) = reject.finish().await;
    // The model is told why; the engine goes on and the run completes without the result.
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains("→ reject"), "{out}");
    assert!(out.contains("AGENT_RESUMED Resumed: reject"), "{out}");
    assert!(
        out.contains("TOOL_EXECUTION calculator ✗ rejected"),
        "{out}"
    );
    assert!(!out.contains("6*7 = 42"), "{out}");
    assert!(
        out.contains("A person rejected this call of `calculator`: not today"),
        "{out}"
    );
    app.stop().await;
}

#[tokio::test]
async fn ask_exits_3_when_the_run_fails() {
    let llm = FakeLlm::start().await;
    llm.set_default(
        "plan",
        Reply::Status(
            400,
            r#"{"error": {"message": "no such model"}}"#.into(),
            None,
        ),
    );
    let app = spawn(Backend::Sqlite, Some(&llm)).await;
    let ask = Ask::start(&app.base, "What is 2+2?", &[], Some(""));
    let (status, out, err) = ask.finish().await;
    assert_eq!(status.code(), Some(3), "{out}\n{err}");
    assert!(out.contains("RUN_FAILED Run failed"), "{out}");
    assert!(err.contains("the run failed"), "{err}");
    app.stop().await;
}

#[tokio::test]
async fn ask_exits_5_when_a_suspension_waits_and_the_input_has_ended() {
    let app = spawn(Backend::Sqlite, None).await;
    let ask = Ask::approval_needed(&app.base, Some(""));
    let (status, out, err) = ask.finish().await;
    assert_eq!(status.code(), Some(5), "{out}\n{err}");
    assert!(err.contains("waits for a person"), "{err}");
    let (thread, _) = ids(&out);
    assert!(
        err.contains(&format!("{}/console?thread={thread}", app.base)),
        "{err}"
    );
    let (_, pending) = app.get(&format!("/v1/threads/{thread}/suspensions")).await;
    assert_eq!(pending["items"].as_array().unwrap().len(), 1, "still open");
    app.stop().await;
}

#[tokio::test]
async fn ask_cancels_the_run_after_ctrl_c_and_a_yes() {
    let app = spawn(Backend::Sqlite, None).await;
    let mut ask = Ask::approval_needed(&app.base, None);
    ask.err.wait_for("[a]pprove").await;
    ask.interrupt();
    ask.err.wait_for("cancel the run? [y/N]").await;
    ask.say("y").await;
    let (status, out, err) = ask.finish().await;
    assert_eq!(status.code(), Some(4), "{out}\n{err}");
    assert!(out.contains("RUN_CANCELLED"), "{out}");
    let (thread, run) = ids(&out);
    let (_, r) = app.get(&format!("/v1/threads/{thread}/runs/{run}")).await;
    assert_eq!(r["status"], "cancelled");
    // The run's work ended with it, as the tree shows; the next question on the thread runs
    // only its own call, never the one that waited for approval.
    assert!(out.contains("→ cancelled"), "{out}");
    let next = Ask::start(&app.base, "What is 2+3?", &["--thread", &thread], Some(""));
    let (status, out, err) = next.finish().await;
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(
        out.contains("calculator → {\"expression\":\"2+3\""),
        "{out}"
    );
    assert!(!out.contains("6*7"), "the cancelled call never runs: {out}");
    app.stop().await;
}

#[tokio::test]
async fn ask_survives_a_server_restart_and_prints_nothing_twice() {
    let url = database_url(Backend::Sqlite).await;
    let app = spawn_config(test_config(&url, None)).await;
    let port = app.base.rsplit(':').next().unwrap().to_owned();
    let mut ask = Ask::approval_needed(&app.base, None);
    ask.err.wait_for("[a]pprove").await;
    let seen = ask.out.get().lines().count();
    app.stop().await;
    ask.err.wait_for("connection lost").await;

    let mut config = test_config(&url, None);
    config.bind = format!("127.0.0.1:{port}").parse().unwrap();
    let app: TestApp = spawn_config(config).await;
    ask.err.wait_for("reconnected; resuming after #").await;
    ask.say("a").await;
    let (status, out, err) = ask.finish().await;
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(out.lines().count() > seen);
    // Every observation once: as many tree lines as the run has observations.
    let (thread, _) = ids(&out);
    let log = app.observations(&thread).await;
    let tree_lines = out
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            let l = l.split_once("] ").map_or(l, |(_, rest)| rest);
            l.split(' ').next().is_some_and(|w| {
                w.len() > 3 && w.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            })
        })
        .count();
    assert_eq!(tree_lines, log.len(), "{out}");
    app.stop().await;
}

#[tokio::test]
async fn ask_says_plainly_when_the_server_needs_a_key_and_uses_one() {
    let app = spawn_with(Backend::Sqlite, None, |c| c.api_keys = Some("k1".into())).await;
    let (status, out, err) = Ask::start(&app.base, "What is 1+1?", &[], Some(""))
        .finish()
        .await;
    assert_eq!(status.code(), Some(1), "{out}\n{err}");
    assert!(err.contains("401") && err.contains("--api-key"), "{err}");
    // A key that was passed and refused is said to be refused, not missing.
    let (status, out, err) =
        Ask::start(&app.base, "What is 1+1?", &["--api-key", "nope"], Some(""))
            .finish()
            .await;
    assert_eq!(status.code(), Some(1), "{out}\n{err}");
    assert!(err.contains("the key was refused"), "{err}");
    let (status, out, err) = Ask::start(&app.base, "What is 1+1?", &["--api-key", "k1"], Some(""))
        .finish()
        .await;
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains("1+1 = 2"), "{out}");
    app.stop().await;
}

#[tokio::test]
async fn ask_suggests_url_when_nothing_answers() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let (status, out, err) = Ask::start(&base, "What is 1+1?", &[], Some(""))
        .finish()
        .await;
    assert_eq!(status.code(), Some(1), "{out}\n{err}");
    assert!(err.contains("--url") && err.contains("PES_BIND"), "{err}");
}

#[tokio::test]
async fn a_second_ctrl_c_leaves_at_once_and_the_run_waits_on() {
    let app = spawn(Backend::Sqlite, None).await;
    let ask = Ask::approval_needed(&app.base, None);
    ask.err.wait_for("[a]pprove").await;
    ask.interrupt();
    ask.err.wait_for("cancel the run? [y/N]").await;
    ask.interrupt();
    let (status, out, err) = ask.finish().await;
    assert_eq!(status.code(), Some(130), "{out}\n{err}");
    assert!(err.contains("the run goes on"), "{err}");
    let (thread, run) = ids(&out);
    // Where to follow the run it left: the thread's page in the console, which serves it.
    let console = format!("{}/console?thread={thread}", app.base);
    assert!(err.contains(&format!("at {console}\n")), "{err}");
    let page = app.client.get(&console).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("pes-server console"));
    let (_, r) = app.get(&format!("/v1/threads/{thread}/runs/{run}")).await;
    assert_eq!(r["status"], "suspended");
    app.stop().await;
}

/// What the client follows: `GET /events?runId=` replays one run's observations only, from its
/// start, however long the thread is.
async fn the_event_stream_follows_one_run(backend: Backend) {
    let app = spawn(backend, None).await;
    app.thread(serde_json::json!({"threadId": "two-runs"}))
        .await;
    let first = app.run_wait("two-runs", "What is 1+1?").await;
    let second = app.run_wait("two-runs", "What is 2+2?").await;
    let run = second["runId"].as_str().unwrap();
    let resp = app
        .client
        .get(app.url(&format!("/v1/threads/two-runs/events?runId={run}")))
        .send()
        .await
        .unwrap();
    let seen = SseReader::new(resp).until("RUN_COMPLETED").await;
    assert_eq!(seen[0]["type"], "RUN_STARTED");
    assert!(seen.iter().all(|o| o["runId"] == run), "{seen:?}");
    let of_run = app
        .observations("two-runs")
        .await
        .into_iter()
        .filter(|o| o["runId"] == run)
        .count();
    assert_eq!(seen.len(), of_run);
    assert_ne!(first["runId"], second["runId"]);
    app.stop().await;
}

crate::both_stores!(event_stream_of_one_run, the_event_stream_follows_one_run);

/// A pseudo-terminal: its controlling side (what a person types into) and the terminal itself.
fn pty() -> (std::fs::File, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty(3) writes two new descriptors, which are owned from here on.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both are fresh descriptors nothing else owns.
    unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::os::fd::OwnedFd::from_raw_fd(slave),
        )
    }
}

/// At a terminal, a person steers the run with `/steer <message>` while it works (the item's
/// next model call reads it), and the run's spend, tokens and dollars, is shown when it ends.
#[tokio::test]
async fn ask_steers_at_a_terminal_and_shows_the_spend() {
    use std::io::Write;
    let llm = metered_llm().await;
    llm.push(
        "plan",
        crate::fake_llm::plan(&[("a", "compute 2+2", &["calculator"], &[])]),
    );
    llm.push_item(
        "a",
        Reply::ToolCalls(vec![(
            "calculator".into(),
            serde_json::json!({"expression": "2+2"}),
        )]),
    );
    llm.push_item("a", Reply::Text("4".into()));
    llm.hold_if(|r| crate::fake_llm::item_of(r).as_deref() == Some("a"));
    let app = spawn_with(Backend::Sqlite, Some(&llm), |c| {
        c.model_prices = Some(r#"{"fake-model": {"input": 2, "output": 10}}"#.into());
    })
    .await;
    let (mut keys, terminal) = pty();
    let ask = Ask::start_on(&app.base, "what is 2+2?", &[], None, terminal.into());
    llm.wait_for_request(|r| crate::fake_llm::item_of(r).as_deref() == Some("a"))
        .await;
    keys.write_all(b"/steer Answer in French\n").unwrap();
    ask.err.wait_for("steered").await;
    llm.release();
    let (status, out, err) = ask.finish().await;
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    let of_a: Vec<serde_json::Value> = llm
        .requests()
        .into_iter()
        .filter(|r| crate::fake_llm::item_of(r).as_deref() == Some("a"))
        .collect();
    assert_eq!(of_a.len(), 2);
    assert!(
        of_a[1].to_string().contains("Answer in French"),
        "the item's next call reads the steering: {}",
        of_a[1]
    );
    // 1,500 tokens a call, $0.007 each by the price table.
    let calls = llm.calls();
    let spent = format!(
        "spent {} tokens, ${:.4}",
        calls * 1500,
        calls as f64 * 0.007
    );
    assert!(err.contains(&spent), "{spent:?} in:\n{err}");
    drop(keys);
    app.stop().await;
}
