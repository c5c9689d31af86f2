//! A real browser for the console's tests: the distribution's headless Chromium, driven over the
//! W3C WebDriver protocol through its `chromedriver` (JSON over loopback HTTP, spoken here with
//! the tests' own reqwest client: no WebDriver crate, and nothing is ever downloaded).
//!
//! Where no Chromium is installed the tests say so loudly and pass, unless `CI` is set (`.ci/run`
//! installs it): there a missing browser fails them. Screenshots go to
//! `target/console-screenshots/`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The key WebDriver names an element reference with.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long a condition on the page may take to hold.
const DEADLINE: Duration = Duration::from_secs(30);

/// A headless Chromium session. Dropping it kills chromedriver's whole process group (the driver
/// and the browser it started), so a failed test leaves no browser behind.
pub struct Browser {
    driver: Child,
    /// chromedriver's process group (its pid), until it is killed.
    pgid: Option<i32>,
    base: String,
    session: String,
    client: reqwest::Client,
    _profile: TempDir,
}

/// Where a program is on `PATH`.
fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// A directory removed on drop (the browser's profile).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where the tests' screenshots go.
pub fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("console-screenshots")
}

impl Browser {
    /// Start chromedriver and a headless Chromium session, or `None` (after a loud SKIPPED)
    /// where none is installed and `CI` is not set.
    pub async fn start() -> Option<Browser> {
        let (Some(chromium), Some(driver)) = (
            which("chromium").or_else(|| which("chromium-browser")),
            which("chromedriver"),
        ) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "the browser tests need chromium and chromedriver (.ci/run installs them)"
            );
            eprintln!(
                "\n!!! SKIPPED: no chromium/chromedriver on PATH: the console's browser tests did not run.\n\
                 !!! Install them (Debian: apt-get install chromium chromium-driver); CI does.\n"
            );
            return None;
        };
        let mut cmd = Command::new(driver);
        cmd.arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            // Its own process group: the browser it starts joins it, and one kill ends both.
            .process_group(0);
        let mut child = cmd.spawn().expect("chromedriver starts");
        let pgid = i32::try_from(child.id().expect("running"))
            .ok()
            .filter(|p| *p > 1);
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = tokio::time::timeout(Duration::from_secs(20), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.split("started successfully on port ").nth(1) {
                    return rest.trim_end_matches('.').parse::<u16>().ok();
                }
            }
            None
        })
        .await
        .expect("chromedriver says its port within 20 s")
        .expect("chromedriver printed its port");
        // Keep reading its output so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let profile = std::env::temp_dir().join(format!("pes-chromium-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&profile).unwrap();
        let client = pes_server::net::client_builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,1000", "--no-first-run", "--disable-background-networking",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }}});
        let mut browser = Browser {
            driver: child,
            pgid,
            base,
            session: String::new(),
            client,
            _profile: TempDir(profile),
        };
        let v = browser.command("POST", "/session", caps).await;
        browser.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("a WebDriver session: {v}"))
            .to_owned();
        Some(browser)
    }

    /// One WebDriver command; its `value`. A WebDriver error fails the test.
    async fn command(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.client.get(url),
            "DELETE" => self.client.delete(url),
            _ => self.client.post(url).json(&body),
        };
        let resp = req.send().await.expect("chromedriver answers");
        let status = resp.status();
        let v: Value = resp.json().await.expect("a WebDriver answer is JSON");
        assert!(status.is_success(), "WebDriver {method} {path}: {v}");
        v["value"].clone()
    }

    fn at(&self, path: &str) -> String {
        format!("/session/{}{path}", self.session)
    }

    pub async fn goto(&self, url: &str) {
        self.command("POST", &self.at("/url"), json!({"url": url}))
            .await;
    }

    /// Run `script` (a function body; `arguments` are `args`) in the page; what it returns.
    pub async fn script(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            &self.at("/execute/sync"),
            json!({"script": script, "args": args}),
        )
        .await
    }

    /// Run `script`, which ends by calling `arguments[arguments.length - 1](result)`.
    pub async fn script_async(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            &self.at("/execute/async"),
            json!({"script": script, "args": args}),
        )
        .await
    }

    async fn element(&self, css: &str) -> String {
        let v = self
            .command(
                "POST",
                &self.at("/element"),
                json!({"using": "css selector", "value": css}),
            )
            .await;
        v[ELEMENT].as_str().unwrap().to_owned()
    }

    /// Click what `css` selects, as a person would (WebDriver moves the pointer and clicks).
    pub async fn click(&self, css: &str) {
        let id = self.element(css).await;
        self.command("POST", &self.at(&format!("/element/{id}/click")), json!({}))
            .await;
    }

    /// Clear the field `css` selects and type `text` into it, key by key.
    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.command("POST", &self.at(&format!("/element/{id}/clear")), json!({}))
            .await;
        self.command(
            "POST",
            &self.at(&format!("/element/{id}/value")),
            json!({"text": text}),
        )
        .await;
    }

    /// The visible text of what `css` selects.
    pub async fn text(&self, css: &str) -> String {
        let id = self.element(css).await;
        let v = self
            .command("GET", &self.at(&format!("/element/{id}/text")), json!({}))
            .await;
        v.as_str().unwrap_or_default().to_owned()
    }

    /// Wait until `expr` (a JavaScript expression) is truthy in the page; its value. On the
    /// deadline, a screenshot and the page's text go with the failure.
    pub async fn wait_for(&self, what: &str, expr: &str) -> Value {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let script = format!("return ({expr}) || null;");
        loop {
            let v = self.script(&script, json!([])).await;
            if !v.is_null() && v != json!(false) {
                return v;
            }
            if tokio::time::Instant::now() > deadline {
                let shot = self.screenshot(&format!("timeout-{}", slug(what))).await;
                let text = self
                    .script("return document.body.innerText", json!([]))
                    .await;
                let logs = self.logs().await;
                panic!(
                    "the page never showed {what} ({expr}); screenshot {}\n--- page ---\n{}\n--- console ---\n{logs}",
                    shot.display(),
                    text.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Save a PNG of the window under [`screenshot_dir`]; its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let v = self
            .command("GET", &self.at("/screenshot"), json!({}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap();
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    /// The browser console's messages so far (errors of the page's scripts among them).
    pub async fn logs(&self) -> Value {
        self.command("POST", &self.at("/se/log"), json!({"type": "browser"}))
            .await
    }

    /// End the session and the driver.
    pub async fn quit(mut self) {
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            self.client
                .delete(format!("{}/session/{}", self.base, self.session))
                .send(),
        )
        .await;
        self.kill_group();
        let _ = self.driver.wait().await;
    }

    fn kill_group(&mut self) {
        // Once only: the id may be reused after the group is gone. Never 0 or 1 (`kill(-0)`
        // would signal the test's own group).
        if let Some(pgid) = self.pgid.take() {
            // SAFETY: kill(2) on the process group we created; no memory is involved.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.kill_group();
    }
}

fn slug(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}
