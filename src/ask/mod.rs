//! `pes-server ask`: a person's view of one run in a terminal. It posts the query through the
//! public API, follows the run's observation stream (reconnecting with `Last-Event-ID`), prints
//! the tree as it grows, asks the person at each suspension, and prints the final answer. The exit
//! status says how the run ended ([`exit`]), so scripts can use it too.
//!
//! Input is read a line at a time on a thread of its own (a blocking read inside the runtime
//! would keep the process alive at exit) and only when a question is on screen, so answers can be
//! piped in ahead: `printf 'a\n' | pes-server ask …` approves the first suspension. While a
//! question is asked, the lines of the stream are held back and shown after the answer.

mod api;
mod prompt;
mod render;
mod session;

use std::io::Write;

use tokio::sync::mpsc;

use render::Style;
use session::Session;

/// How `pes-server ask` is run, shown under its `--help`: whole commands a person can copy.
const EXAMPLES: &str = "\
Examples:
  # Ask on thread `demo` (made when missing), of the service on PES_BIND (else localhost:8080):
  pes-server ask \"What is 12*(3+4)?\" --thread demo

  # Every calculator call waits for your decision:
  pes-server ask \"What is 6*7, and what time is it in Tokyo?\" --thread demo \\
    --config '{\"requireApproval\": [\"calculator\"]}'

  # Another service, with an API key (or set PES_API_KEY):
  pes-server ask \"What is 2+2?\" --thread demo --url http://127.0.0.1:9000 --api-key \"$KEY\"

  # From a checkout, the same with cargo:
  cargo run --release -- ask \"What is 2+2?\" --thread demo

At a question: a approves, e edits the arguments (the current ones are shown; an empty line or
`back` returns to the choices), r rejects with a reason, s responds instead. Ctrl-C asks whether
to cancel the run; a second Ctrl-C leaves it running and prints its console URL.";

/// Arguments of `pes-server ask`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct AskArgs {
    /// The query to post.
    pub query: String,
    /// Post to this thread (created when missing); by default a new thread is made.
    #[arg(long)]
    pub thread: Option<String>,
    /// The service's base URL; default `http://<PES_BIND>` (a wildcard address as 127.0.0.1),
    /// else `http://localhost:8080`: the address a service started in the same environment
    /// listens on.
    #[arg(long)]
    pub url: Option<String>,
    /// API key, sent as `Authorization: Bearer <key>`.
    #[arg(long, env = "PES_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The run's configuration as a JSON object (overrides the thread's, field by field), e.g.
    /// `{"requireApproval": ["calculator"]}`.
    #[arg(long)]
    pub config: Option<String>,
}

impl AskArgs {
    /// The base URL to reach the service at (see [`AskArgs::url`]).
    pub fn base_url(&self) -> String {
        if let Some(u) = &self.url {
            return u.clone();
        }
        match std::env::var("PES_BIND")
            .ok()
            .and_then(|b| b.trim().parse::<std::net::SocketAddr>().ok())
        {
            Some(mut addr) => {
                if addr.ip().is_unspecified() {
                    addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                format!("http://{addr}")
            }
            None => "http://localhost:8080".into(),
        }
    }
}

/// The exit statuses of `pes-server ask`.
pub mod exit {
    /// The run completed; its answer was printed.
    pub const COMPLETED: u8 = 0;
    /// The service could not be reached, or refused the request (the reason is printed).
    pub const ERROR: u8 = 1;
    /// Bad arguments (as every command-line error).
    pub const USAGE: u8 = 2;
    /// The run failed.
    pub const FAILED: u8 = 3;
    /// The run was cancelled (here, after Ctrl-C, or by someone else).
    pub const CANCELLED: u8 = 4;
    /// The run waits for a person and this client cannot ask one (its input ended).
    pub const NEEDS_PERSON: u8 = 5;
    /// Ctrl-C twice: the client stopped and left the run as it was.
    pub const INTERRUPTED: u8 = 130;
}

/// Run the client; the process's exit status.
pub async fn run(args: AskArgs) -> u8 {
    let style = Style::detect();
    let interrupts = match Interrupts::catch() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("pes-server ask: Ctrl-C cannot be caught: {e}");
            return exit::ERROR;
        }
    };
    match Session::start(args, style).await {
        Ok(session) => session.drive(interrupts).await,
        Err((code, message)) => {
            eprintln!("pes-server ask: {message}");
            code
        }
    }
}

/// Ctrl-C presses, caught from the start. One receiver lives as long as the client, so a press
/// that comes while the client is busy between two waits is kept for the next wait (a fresh
/// `tokio::signal::ctrl_c()` per wait would lose it).
pub(super) struct Interrupts(tokio::signal::unix::Signal);

impl Interrupts {
    fn catch() -> std::io::Result<Self> {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).map(Self)
    }

    /// The next press (or one that came since the last wait).
    pub(super) async fn next(&mut self) {
        self.0.recv().await;
    }
}

/// A thread id as a path segment (ids are plain, but a mistyped one must not change the path).
fn segment(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b':' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Lines of standard input, read on their own thread; `None` at the end of input.
fn stdin_lines() -> mpsc::UnboundedReceiver<Option<String>> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(None);
                    return;
                }
                Ok(_) => {
                    let text = line.trim_end_matches(['\n', '\r']).to_owned();
                    if tx.send(Some(text)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// Lines on stdout, the run's record.
fn print_lines(lines: &[String]) {
    let mut out = std::io::stdout().lock();
    for l in lines {
        // A closed pipe (`| head`) is not worth a panic.
        let _ = writeln!(out, "{l}");
    }
    let _ = out.flush();
}

/// A prompt on stderr (stdout stays the run's record), without a line end.
fn show_prompt(prompt: &str) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "{prompt}");
    let _ = err.flush();
}
