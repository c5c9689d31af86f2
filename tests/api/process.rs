//! The real `pes-server` binary as a child process, for tests that kill it: `kill -9` means
//! SIGKILL, with no chance to clean up.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running server process.
pub struct Proc {
    pub child: Child,
    pub base: String,
    pub client: reqwest::Client,
    /// Every JSON log line the process printed so far, in order.
    pub logs: Arc<Mutex<Vec<Value>>>,
}

impl Proc {
    /// Start the binary on a free port with `env`, and wait until it listens.
    pub async fn start(env: &[(&str, String)]) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pes-server"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("PES_BIND", "127.0.0.1:0")
            .env("PES_LOG_FORMAT", "json")
            .env("PES_LOG", "info")
            .env("PES_POLL_INTERVAL_MS", "50")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("the pes-server binary starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<String>();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut tx = Some(tx);
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                sink.lock().unwrap().push(v.clone());
                if v["message"] == "pes-server listening"
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(v["addr"].as_str().unwrap_or_default().to_owned());
                }
            }
        });
        let addr = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .expect("the server listens within 30 s")
            .expect("the server printed its address");
        Proc {
            child,
            base: format!("http://{addr}"),
            client: pes_server::net::client_builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            logs,
        }
    }

    /// The JSON log lines printed so far.
    pub fn log_lines(&self) -> Vec<Value> {
        self.logs.lock().unwrap().clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        crate::helpers::read(self.client.get(self.url(path)).send().await.unwrap()).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        crate::helpers::read(
            self.client
                .post(self.url(path))
                .json(&body)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// SIGKILL, and wait until the process is gone.
    pub async fn kill9(mut self) {
        self.child.start_kill().unwrap();
        let _ = self.child.wait().await;
    }

    /// SIGTERM, and the exit status (deadline 60 s).
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().expect("running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .unwrap()
            .unwrap()
    }

    /// Poll `GET path` until `pred` holds (deadline 30 s).
    pub async fn wait_for(&self, path: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (_, v) = self.get(path).await;
            if pred(&v) {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "condition never held: {v}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// Environment for a process on `database_url` with the fake LLM.
pub fn env_for(database_url: &str, llm_url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("PES_DATABASE_URL", database_url.to_owned()),
        ("PES_LLM_BASE_URL", llm_url.to_owned()),
        ("PES_LLM_API_KEY", "test-key".to_owned()),
        ("PES_LLM_MODEL", "fake-model".to_owned()),
    ]
}
