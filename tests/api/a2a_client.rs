//! Our A2A client against remote agents built with the official Python SDK's server classes
//! (`tests/a2a/agents.py`), v1.0 and v0.3-only: reading their cards, sending without waiting,
//! streaming a task to its end, input-required and the answer, cancel, failure, finding a task
//! by its context, and a task the remote does not know.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use pes_server::a2a::client::card::{self, Protocol};
use pes_server::a2a::client::config::AgentConfig;
use pes_server::a2a::client::net::{Net, NetSettings, Reach};
use pes_server::a2a::client::rpc::{A2aClient, RemoteEvent, RemoteState};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const T: Duration = Duration::from_secs(20);

/// The venv's Python with the Python A2A SDK (see [`crate::helpers::venv_python`]).
pub(crate) fn python() -> Option<PathBuf> {
    crate::helpers::venv_python("a2a.server", "the Python A2A SDK")
}

/// A remote agent, as a child process.
pub(crate) struct Agent {
    _child: Child,
    pub(crate) base: String,
}

impl Agent {
    pub(crate) async fn start(python: &Path, kind: &str, protocol: &str) -> Self {
        Self::start_for(python, kind, protocol, 4).await
    }

    /// An agent whose `slow` tasks take `seconds`.
    pub(crate) async fn start_for(python: &Path, kind: &str, protocol: &str, seconds: u32) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/a2a/agents.py");
        let mut child = Command::new(python)
            .arg(script)
            .args([
                kind,
                "--port",
                "0",
                "--protocol",
                protocol,
                "--seconds",
                &seconds.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the agent starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("READY in time")
            .unwrap()
            .expect("a READY line");
        let base = ready
            .strip_prefix("READY ")
            .expect("READY <url>")
            .to_owned();
        Self {
            _child: child,
            base,
        }
    }

    /// SIGKILL the agent: its tasks are gone with it.
    pub(crate) async fn kill(&mut self) {
        let _ = self._child.kill().await;
    }

    /// Our client of this agent, from its card (its card URL's origin is configured, so the
    /// loopback agent is reached without an allow list).
    pub(crate) async fn client(&self) -> (A2aClient, card::RemoteCard) {
        let config = AgentConfig {
            name: "test".into(),
            card_url: format!("{}/.well-known/agent-card.json", self.base),
            headers: BTreeMap::new(),
            origins: vec![],
        };
        let net = Arc::new(Net::new(NetSettings::default()).unwrap());
        let reach = Reach::new(net, &config).unwrap();
        let card = card::fetch(&reach, &config.card_url, T).await.unwrap();
        (A2aClient::new(reach, &card), card)
    }
}

/// The events of a task's stream until it settles (terminal, or waiting for its caller: judged by
/// state, as the remote may keep the stream open) or the remote closes it.
async fn drain(client: &A2aClient, id: &str) -> Vec<RemoteEvent> {
    let mut stream = client.watch(id, T).await.unwrap();
    let mut out = Vec::new();
    while let Some(e) = tokio::time::timeout(T, stream.next())
        .await
        .expect("stream stalled")
    {
        out.push(e.unwrap());
        if last_state(&out).is_some_and(|s| s.is_terminal() || s.is_interrupted()) {
            break;
        }
    }
    out
}

fn last_state(events: &[RemoteEvent]) -> Option<RemoteState> {
    events.iter().rev().find_map(|e| match e {
        RemoteEvent::Status { state, .. } => Some(*state),
        RemoteEvent::Task(t) => Some(t.state),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_speaks_to_sdk_agents_of_both_generations() {
    let Some(python) = python() else { return };
    for protocol in ["1.0", "0.3"] {
        let echo = Agent::start(&python, "echo", protocol).await;
        let (client, card) = echo.client().await;
        let want = if protocol == "1.0" {
            Protocol::V1
        } else {
            Protocol::V03
        };
        assert_eq!(card.protocol, want, "{protocol}");
        assert!(card.endpoint.ends_with("/a2a"), "{card:?}");
        assert!(!card.skills.is_empty());
        let task = client
            .send_message("hi", &uuid::Uuid::now_v7().to_string(), None, None, T)
            .await
            .unwrap();
        // Sent without waiting; the task is read back to its end.
        let deadline = tokio::time::Instant::now() + T;
        let done = loop {
            let t = client.get_task(&task.id, T).await.unwrap();
            if t.state.is_terminal() {
                break t;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{protocol}: never ended: {t:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(done.state, RemoteState::Completed, "{protocol}: {done:?}");
        assert_eq!(done.artifacts, vec![vec![json!("echo: hi")]], "{protocol}");
        let missing = client.get_task("no-such-task", T).await.unwrap_err();
        assert!(missing.is_task_not_found(), "{protocol}: {missing}");

        let input = Agent::start(&python, "input", protocol).await;
        let (client, _) = input.client().await;
        let task = client
            .send_message("hello", &uuid::Uuid::now_v7().to_string(), None, None, T)
            .await
            .unwrap();
        let events = drain(&client, &task.id).await;
        assert_eq!(
            last_state(&events),
            Some(RemoteState::InputRequired),
            "{protocol}: {events:?}"
        );
        let asked = events.iter().rev().find_map(|e| match e {
            RemoteEvent::Status { message, .. } => message.clone(),
            RemoteEvent::Task(t) => t.message.clone(),
            _ => None,
        });
        assert_eq!(asked.as_deref(), Some("What is your name?"), "{protocol}");
        client
            .send_message(
                "Ada",
                &uuid::Uuid::now_v7().to_string(),
                Some(&task.context_id),
                Some(&task.id),
                T,
            )
            .await
            .unwrap();
        let events = drain(&client, &task.id).await;
        assert_eq!(
            last_state(&events),
            Some(RemoteState::Completed),
            "{protocol}: {events:?}"
        );
        assert!(
            events.iter().any(|e| matches!(e, RemoteEvent::Artifact { parts, .. } if parts == &vec![json!("hello, Ada")]))
                || matches!(events.last(), Some(RemoteEvent::Task(t)) if t.artifacts == vec![vec![json!("hello, Ada")]]),
            "{protocol}: {events:?}"
        );

        let failing = Agent::start(&python, "failing", protocol).await;
        let (client, _) = failing.client().await;
        let task = client
            .send_message("x", &uuid::Uuid::now_v7().to_string(), None, None, T)
            .await
            .unwrap();
        let events = drain(&client, &task.id).await;
        assert_eq!(
            last_state(&events),
            Some(RemoteState::Failed),
            "{protocol}: {events:?}"
        );

        let slow = Agent::start(&python, "slow", protocol).await;
        let (client, _) = slow.client().await;
        let context = format!("pes-{}", uuid::Uuid::now_v7());
        let task = client
            .send_message(
                "work",
                &uuid::Uuid::now_v7().to_string(),
                Some(&context),
                None,
                T,
            )
            .await
            .unwrap();
        assert!(!task.state.is_terminal());
        if protocol == "1.0" {
            // A task is found again by the context the caller chose.
            let found = client.tasks_of_context(&context, T).await.unwrap().unwrap();
            assert_eq!(
                found.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
                [task.id.as_str()]
            );
        } else {
            assert_eq!(client.tasks_of_context(&context, T).await.unwrap(), None);
        }
        let canceled = client.cancel_task(&task.id, T).await.unwrap();
        assert_eq!(canceled.state, RemoteState::Canceled, "{protocol}");
    }
}
