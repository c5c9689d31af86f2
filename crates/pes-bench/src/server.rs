//! The service under test: the release `pes-server` started as a child process on a free
//! loopback port, and the HTTP calls the modes make to it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use futures::StreamExt;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::system::proc_status_kib;
use crate::{Args, LlmKind};

/// The release `pes-server` next to this executable (both are built into one target dir).
pub(crate) fn server_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the bench's own executable")?;
    let bin = exe.with_file_name("pes-server");
    ensure!(
        bin.is_file(),
        "{} not found: build it with `cargo build --release -p pes-server -p pes-bench` (same target dir as \
         pes-bench)",
        bin.display()
    );
    Ok(bin)
}

/// A running `pes-server`; stopped by [`Server::stop`], killed if dropped. A server the bench
/// did not start ([`Server::remote`]), or one tenant's view of it ([`Server::as_tenant`]), has no
/// child and is left running.
pub(crate) struct Server {
    child: Option<tokio::sync::Mutex<Child>>,
    pub(crate) pid: u32,
    base: String,
    pub(crate) http: reqwest::Client,
}

impl Server {
    /// Start `bin` on a free loopback port with the mode's settings ([`Args::service_settings`])
    /// and wait until it is ready.
    pub(crate) async fn spawn(
        bin: &Path,
        args: &Args,
        db_url: &str,
        llm_url: &str,
    ) -> Result<Server> {
        let port = free_port()?;
        let mut cmd = Command::new("sh");
        // Raise the open-file limit where the hard limit allows it, then become the server.
        cmd.arg("-c")
            .arg(r#"ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "$0""#)
            .arg(bin);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PES_")) {
            cmd.env_remove(k);
        }
        cmd.env("PES_BIND", format!("127.0.0.1:{port}"))
            .env("PES_DATABASE_URL", db_url);
        match args.llm {
            LlmKind::Fake => {
                cmd.env("PES_LLM_BASE_URL", llm_url)
                    .env("PES_LLM_API_KEY", "x")
                    .env("PES_LLM_MODEL", "bench");
            }
            LlmKind::Offline => {
                cmd.env("PES_LLM_PROVIDER", "offline");
            }
        }
        // A developer's own provider keys configure nothing here.
        cmd.env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            // Waiting for a pool connection is what overload looks like here: the figures show it.
            .env("PES_LOG", "warn,sqlx::pool::acquire=error")
            .envs(args.service_settings())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("the server exited at once"))?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        let server = Server {
            child: Some(tokio::sync::Mutex::new(child)),
            pid,
            base: format!("http://127.0.0.1:{port}"),
            http,
        };
        server.wait_ready(Duration::from_secs(60)).await?;
        Ok(server)
    }

    /// The server already listening at `base` (no API keys): the bench only talks to it.
    pub(crate) fn remote(base: &str) -> Result<Server> {
        let url = reqwest::Url::parse(base)
            .with_context(|| format!("--server-url {base:?} is not a URL"))?;
        ensure!(
            matches!(url.scheme(), "http" | "https"),
            "--server-url must be an http(s) URL"
        );
        Ok(Server {
            child: None,
            pid: 0,
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .build()?,
        })
    }

    /// The same service as the tenant holding API key `key` sees it (the service has the key in
    /// `PES_API_KEYS`): every request carries `Authorization: Bearer <key>`, so every helper here
    /// acts for that tenant. The view owns no process: stopping or dropping it leaves the
    /// service running.
    pub(crate) fn as_tenant(&self, key: &str) -> Result<Server> {
        let mut bearer = HeaderValue::from_str(&format!("Bearer {key}"))
            .context("an API key must be a valid header value")?;
        bearer.set_sensitive(true);
        let headers = HeaderMap::from_iter([(AUTHORIZATION, bearer)]);
        Ok(Server {
            child: None,
            pid: self.pid,
            base: self.base.clone(),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .default_headers(headers)
                .build()?,
        })
    }

    pub(crate) async fn wait_ready(&self, deadline: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(child) = &self.child
                && let Some(status) = child.lock().await.try_wait()?
            {
                bail!("the server exited before it was ready ({status})");
            }
            let ready = self
                .http
                .get(self.url("/readyz"))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            ensure!(
                start.elapsed() < deadline,
                "the server was not ready within {deadline:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// SIGTERM, then SIGKILL after 10 s (a server the bench did not start is left alone).
    pub(crate) async fn stop(&self) {
        let Some(child) = &self.child else {
            return;
        };
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let mut child = child.lock().await;
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }

    pub(crate) async fn get_json(&self, path: &str) -> Result<Value> {
        Ok(self.get_timed(path).await?.0)
    }

    /// `GET path`, timed from the request sent to the last byte of the body received; the body
    /// is parsed after the clock stops (a read's latency is the service's, not the time the
    /// bench's own JSON parser takes over a megabyte).
    pub(crate) async fn get_timed(&self, path: &str) -> Result<(Value, Duration)> {
        let sent = std::time::Instant::now();
        let resp = self
            .http
            .get(self.url(path))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .with_context(|| format!("GET {path}: body"))?;
        let took = sent.elapsed();
        let text = String::from_utf8_lossy(&bytes);
        ensure!(
            status.is_success(),
            "GET {path} answered {status}: {}",
            truncate(&text, 300)
        );
        let body = serde_json::from_slice(&bytes)
            .with_context(|| format!("GET {path}: not JSON: {}", truncate(&text, 300)))?;
        Ok((body, took))
    }

    pub(crate) async fn post_json(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Value> {
        let resp = self
            .http
            .post(self.url(path))
            .json(body)
            .timeout(timeout)
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        json_body(resp, path).await
    }

    /// A counter of `/metrics`.
    pub(crate) async fn metric(&self, name: &str) -> Result<u64> {
        let text = self
            .http
            .get(self.url("/metrics"))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .context("GET /metrics")?
            .text()
            .await?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow!("/metrics has no {name}"))
    }

    pub(crate) async fn create_thread(&self) -> Result<String> {
        let t = self
            .post_json("/v1/threads", &json!({}), Duration::from_secs(30))
            .await?;
        t["threadId"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("POST /v1/threads answered without a threadId: {t}"))
    }

    /// Create `n` threads, `parallel` at a time.
    pub(crate) async fn create_threads(&self, n: usize, parallel: usize) -> Result<Vec<String>> {
        futures::stream::iter(0..n)
            .map(|_| self.create_thread())
            .buffer_unordered(parallel.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    pub(crate) fn rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid, "VmRSS")
    }

    pub(crate) fn peak_rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid, "VmHWM")
    }
}

pub(crate) async fn json_body(resp: reqwest::Response, what: &str) -> Result<Value> {
    let status = resp.status();
    let text = resp.text().await.with_context(|| format!("{what}: body"))?;
    ensure!(
        status.is_success(),
        "{what} answered {status}: {}",
        truncate(&text, 300)
    );
    serde_json::from_str(&text)
        .with_context(|| format!("{what}: not JSON: {}", truncate(&text, 300)))
}

pub(crate) fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// Run a phase under the bench's deadline.
pub(crate) async fn phase<T>(
    name: &str,
    limit: Duration,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| anyhow!("{name} did not finish within {limit:?} (--phase-timeout)"))?
}
