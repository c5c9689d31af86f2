//! One `ask` session: the query posted, then a loop over the run's stream, the person's input,
//! Ctrl-C and the progress clock, until the run ends. What is asked and what is printed live in
//! [`super::prompt`] and [`super::render`]; this is the order of things.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::api::{self, Api, Failure, StreamMsg};
use super::prompt::{Dialogue, Next, Question};
use super::render::{Progress, Style, Tree, answer_lines};
use super::{AskArgs, exit, print_lines, segment, show_prompt, stdin_lines};

/// Which question the person is answering: a suspension, or "cancel the run?".
enum Asking {
    Nothing,
    Suspension(Dialogue),
    /// Ctrl-C was pressed; the dialogue it interrupted (if any) resumes after the answer.
    Cancel(Option<Dialogue>),
}

pub(super) struct Session {
    api: Api,
    thread: String,
    run: String,
    /// The thread's page in the web console, where a run this client leaves can be followed.
    console: String,
    style: Style,
    progress: Progress,
    tree: Tree,
    stdin: mpsc::UnboundedReceiver<Option<String>>,
    stdin_open: bool,
    stdin_is_terminal: bool,
    asking: Asking,
    /// Stream lines held back while a question is on screen.
    held: Vec<String>,
    questions: VecDeque<Question>,
    /// The run is suspended: nothing moves until a person decides.
    suspended: bool,
    started: bool,
    reconnecting: bool,
    in_progress: BTreeSet<String>,
    answer: Option<Value>,
}

impl Session {
    /// Post the query (making a thread first unless one is named).
    pub(super) async fn start(args: AskArgs, style: Style) -> Result<Session, (u8, String)> {
        let config = match &args.config {
            None => None,
            Some(text) => match serde_json::from_str::<Value>(text) {
                Ok(v @ Value::Object(_)) => Some(v),
                Ok(_) => return Err((exit::USAGE, "--config must be a JSON object".into())),
                Err(e) => return Err((exit::USAGE, format!("--config is not JSON: {e}"))),
            },
        };
        let api = Api::new(&args.base_url(), args.api_key.clone())
            .map_err(|e| (exit::ERROR, format!("cannot make an HTTP client: {e}")))?;
        let refused = |what: &str, f: Failure| (exit::ERROR, format!("{what}: {f}"));
        let mut body = json!({"query": args.query});
        if let Some(c) = config {
            body["config"] = c;
        }
        let thread = match &args.thread {
            Some(t) => {
                body["ifNotExists"] = json!("create");
                t.clone()
            }
            None => {
                let t = api
                    .post("/v1/threads", Some(&json!({})))
                    .await
                    .map_err(|f| refused("creating a thread", f))?;
                t["threadId"].as_str().unwrap_or_default().to_owned()
            }
        };
        let run = api
            .post(
                &format!("/v1/threads/{}/runs", segment(&thread)),
                Some(&body),
            )
            .await
            .map_err(|f| refused("posting the query", f))?;
        let run = run["runId"].as_str().unwrap_or_default().to_owned();
        let console = console_url(&args.base_url(), &thread);
        let session = Session {
            api,
            thread,
            run,
            console,
            style,
            progress: Progress::detect(style),
            tree: Tree::default(),
            stdin: stdin_lines(),
            stdin_open: true,
            stdin_is_terminal: std::io::IsTerminal::is_terminal(&std::io::stdin()),
            asking: Asking::Nothing,
            held: Vec::new(),
            questions: VecDeque::new(),
            suspended: false,
            started: false,
            reconnecting: false,
            in_progress: BTreeSet::new(),
            answer: None,
        };
        let header = format!("thread {} · run {}", session.thread, session.run);
        print_lines(&[style.paint("2", &header)]);
        Ok(session)
    }

    pub(super) async fn drive(mut self, mut interrupts: super::Interrupts) -> u8 {
        let (mut events, _follower) =
            api::follow(self.api.clone(), segment(&self.thread), self.run.clone());
        let mut tick = tokio::time::interval(Duration::from_millis(120));
        loop {
            if matches!(self.asking, Asking::Nothing) {
                self.ask_next().await;
            }
            if self.suspended
                && matches!(self.asking, Asking::Nothing)
                && self.questions.is_empty()
                && !self.stdin_open
            {
                self.progress.clear();
                eprintln!(
                    "pes-server ask: the run waits for a person and the input has ended; \
                     answer in the console ({}) or with the API",
                    self.console
                );
                return exit::NEEDS_PERSON;
            }
            let asking = !matches!(self.asking, Asking::Nothing);
            // At a terminal a line typed while nothing is asked may steer the run (`/steer …`);
            // piped input is kept for the questions.
            let wants_input = asking || (self.stdin_is_terminal && self.stdin_open);
            tokio::select! {
                msg = events.recv() => match msg {
                    Some(StreamMsg::Observation(obs)) => {
                        if let Some(code) = self.observe(&obs) {
                            return code;
                        }
                    }
                    Some(StreamMsg::Lost(why)) => {
                        self.reconnecting = true;
                        self.note(format!("connection lost ({why}); reconnecting…"));
                    }
                    Some(StreamMsg::Back(seq)) => {
                        self.reconnecting = false;
                        self.note(format!("reconnected; resuming after #{seq}"));
                    }
                    Some(StreamMsg::Ended(why)) => return self.stream_ended(&why),
                    None => return self.stream_ended("the stream follower stopped"),
                },
                line = self.stdin.recv(), if wants_input => self.on_line(line.flatten()).await,
                () = interrupts.next() => {
                    if let Some(code) = self.on_interrupt() {
                        return code;
                    }
                }
                _ = tick.tick(), if !asking => {
                    let status = self.status();
                    self.progress.draw(&status);
                }
            }
        }
    }

    fn stream_ended(&mut self, why: &str) -> u8 {
        self.progress.clear();
        eprintln!("pes-server ask: the stream ended: {why}");
        exit::ERROR
    }

    /// What the progress line says.
    fn status(&self) -> String {
        if self.reconnecting {
            "reconnecting".into()
        } else if self.suspended {
            "waiting for a person".into()
        } else if !self.started {
            "queued".into()
        } else if self.in_progress.is_empty() {
            "running".into()
        } else {
            let items: Vec<&str> = self.in_progress.iter().map(String::as_str).collect();
            format!("running {}", items.join(", "))
        }
    }

    /// Print lines now, or hold them while a question is on screen.
    fn emit(&mut self, lines: Vec<String>) {
        if matches!(self.asking, Asking::Nothing) {
            self.progress.clear();
            print_lines(&lines);
        } else {
            self.held.extend(lines);
        }
    }

    /// A note of the client's own (not an observation), on stderr.
    fn note(&mut self, text: String) {
        self.progress.clear();
        eprintln!("{}", self.style.paint("2", &format!("· {text}")));
    }

    fn release_held(&mut self) {
        let held = std::mem::take(&mut self.held);
        self.emit(held);
    }

    /// Take in one observation of the run; the exit status when it ended the run.
    fn observe(&mut self, obs: &Value) -> Option<u8> {
        let lines = self.tree.lines(obs, self.style);
        self.emit(lines);
        let c = &obs["content"];
        match obs["type"].as_str().unwrap_or_default() {
            "RUN_STARTED" => self.started = true,
            "ITEM_STATUS_CHANGE" => {
                let item = c["itemId"].as_str().unwrap_or_default().to_owned();
                if c["status"] == "in_progress" {
                    self.in_progress.insert(item);
                } else {
                    self.in_progress.remove(&item);
                }
            }
            "AGENT_SUSPENDED" => self.questions.extend(Question::from_content(c)),
            "AGENT_RESUMED" => {
                self.suspended = false;
                let id = c["suspensionId"].as_str().unwrap_or_default();
                self.questions.retain(|q| q.suspension_id != id);
                let mine =
                    matches!(&self.asking, Asking::Suspension(d) if d.question.suspension_id == id);
                if mine {
                    // Someone else answered while the question was on screen.
                    self.asking = Asking::Nothing;
                    eprintln!();
                    self.note(format!(
                        "decided elsewhere: {}",
                        c["decision"].as_str().unwrap_or("?")
                    ));
                    self.release_held();
                }
            }
            "RUN_SUSPENDED" => {
                self.suspended = true;
                self.note_spend(&c["usage"]);
            }
            "FINAL_RESPONSE" => self.answer = Some(c.clone()),
            "RUN_COMPLETED" => {
                self.finish();
                self.note_spend(&c["usage"]);
                self.print_answer();
                return Some(exit::COMPLETED);
            }
            "RUN_FAILED" => {
                self.finish();
                self.note_spend(&c["usage"]);
                let e = &c["error"];
                eprintln!(
                    "pes-server ask: the run failed: {} {}",
                    e["code"].as_str().unwrap_or_default(),
                    e["message"].as_str().unwrap_or_default()
                );
                return Some(exit::FAILED);
            }
            "RUN_CANCELLED" => {
                self.finish();
                eprintln!("pes-server ask: the run was cancelled");
                return Some(exit::CANCELLED);
            }
            _ => {}
        }
        None
    }

    /// The run ended: whatever question was open no longer matters.
    fn finish(&mut self) {
        if !matches!(self.asking, Asking::Nothing) {
            eprintln!();
        }
        self.asking = Asking::Nothing;
        self.release_held();
        self.progress.clear();
    }

    fn print_answer(&self) {
        if let Some(a) = &self.answer {
            print_lines(&answer_lines(a, self.style));
        }
    }

    /// Put the next pending question on screen, if it is still pending and someone can answer.
    async fn ask_next(&mut self) {
        while let Some(q) = self.questions.pop_front() {
            // After a reconnect the stream may replay a question already decided (here or
            // elsewhere): ask only what is still pending.
            let still = self
                .api
                .get(&format!("/v1/suspensions/{}", q.suspension_id))
                .await
                .map_or(true, |s| s["status"] == "pending");
            if !still {
                continue;
            }
            self.progress.clear();
            print_lines(&q.intro(self.style));
            if !self.stdin_open {
                self.note("the input has ended: this question stays open".into());
                continue;
            }
            let (dialogue, prompt) = Dialogue::start(q);
            show_prompt(&prompt);
            self.asking = Asking::Suspension(dialogue);
            return;
        }
    }

    /// The person's next line (`None`: the input ended).
    async fn on_line(&mut self, line: Option<String>) {
        if let Some(l) = &line
            && !self.stdin_is_terminal
        {
            // Piped answers are not echoed by a terminal: show them after their prompt, so the
            // record reads as a dialogue.
            eprintln!("{l}");
        }
        let asking = std::mem::replace(&mut self.asking, Asking::Nothing);
        let Some(line) = line else {
            self.stdin_open = false;
            eprintln!();
            if matches!(asking, Asking::Suspension(_) | Asking::Cancel(Some(_))) {
                self.note("the input has ended: this question stays open".into());
            }
            self.release_held();
            return;
        };
        match asking {
            Asking::Cancel(resume) => {
                if matches!(line.trim(), "y" | "Y" | "yes") {
                    self.cancel().await;
                    // The run's end comes on the stream; a question it interrupted is moot.
                    self.release_held();
                } else if let Some(mut d) = resume {
                    show_prompt(&d.prompt());
                    self.asking = Asking::Suspension(d);
                } else {
                    self.release_held();
                }
            }
            Asking::Suspension(mut d) => match d.answer(&line) {
                Next::Ask(prompt) => {
                    show_prompt(&prompt);
                    self.asking = Asking::Suspension(d);
                }
                Next::Send(body) => self.send_decision(d, body).await,
            },
            Asking::Nothing => match line.trim().strip_prefix("/steer") {
                Some(message) if !message.trim().is_empty() => self.steer(message.trim()).await,
                _ => self.note("type `/steer <message>` to steer the run while it works".into()),
            },
        }
    }

    /// `/steer <message>`: the run reads the message at its next step.
    async fn steer(&mut self, message: &str) {
        let path = format!(
            "/v1/threads/{}/runs/{}/steer",
            segment(&self.thread),
            self.run
        );
        let body = serde_json::json!({ "message": message });
        match self.api.post(&path, Some(&body)).await {
            Ok(_) => self.note("steered: the run reads it at its next step".into()),
            Err(f) => self.note(format!("could not steer: {f}")),
        }
    }

    /// What the run spent so far, from an observation's `usage`.
    fn note_spend(&mut self, usage: &Value) {
        let Some(tokens) = usage["totalTokens"].as_u64() else {
            return;
        };
        let cost = usage["costUsd"]
            .as_f64()
            .filter(|c| *c > 0.0)
            .map(|c| format!(", ${c:.4}"))
            .unwrap_or_default();
        self.note(format!("spent {tokens} tokens{cost}"));
    }

    async fn cancel(&mut self) {
        let path = format!(
            "/v1/threads/{}/runs/{}/cancel",
            segment(&self.thread),
            self.run
        );
        match self.api.post(&path, None).await {
            Ok(_) => self.note("cancelling the run…".into()),
            Err(f) => self.note(format!("could not cancel: {f}")),
        }
    }

    async fn send_decision(&mut self, mut d: Dialogue, body: Value) {
        let path = format!("/v1/suspensions/{}/resume", d.question.suspension_id);
        match self.api.post(&path, Some(&body)).await {
            Ok(_) => {
                let decision = body["decision"].as_str().unwrap_or_default();
                print_lines(&[self.style.paint("33", &format!("→ {decision}"))]);
                self.release_held();
            }
            Err(f) if f.status.is_some_and(|s| s.as_u16() == 409) => {
                self.note(format!("already decided elsewhere ({f})"));
                self.release_held();
            }
            Err(f) => {
                // Refused (422: arguments or response that do not fit) or not delivered: say
                // why and ask again.
                eprintln!("{}", self.style.paint("31", &format!("refused: {f}")));
                show_prompt(&d.retry());
                self.asking = Asking::Suspension(d);
            }
        }
    }

    /// Ctrl-C: ask whether to cancel the run; a second Ctrl-C leaves at once.
    fn on_interrupt(&mut self) -> Option<u8> {
        match std::mem::replace(&mut self.asking, Asking::Nothing) {
            Asking::Cancel(_) => {
                self.progress.clear();
                eprintln!(
                    "\npes-server ask: interrupted; the run goes on (thread {}, run {}): \
                     follow it in the console at {}",
                    self.thread, self.run, self.console
                );
                Some(exit::INTERRUPTED)
            }
            Asking::Suspension(d) => {
                eprintln!();
                show_prompt("cancel the run? [y/N] ");
                self.asking = Asking::Cancel(Some(d));
                None
            }
            Asking::Nothing => {
                self.progress.clear();
                eprintln!();
                show_prompt("cancel the run? [y/N] ");
                self.asking = Asking::Cancel(None);
                None
            }
        }
    }
}

/// The console's page of a thread (`<base>/console?thread=<id>`, the console's own address for
/// it), for a run this client leaves going on.
fn console_url(base: &str, thread: &str) -> String {
    format!(
        "{}/console?thread={}",
        base.trim_end_matches('/'),
        segment(thread)
    )
}

#[cfg(test)]
mod tests {
    use super::console_url;

    #[test]
    fn the_console_url_is_the_threads_page_under_the_base() {
        assert_eq!(
            console_url("http://127.0.0.1:8080/", "t-1"),
            "http://127.0.0.1:8080/console?thread=t-1"
        );
        // Behind a proxy that mounts the service under a prefix, the console is under it too.
        assert_eq!(
            console_url("https://example.test/pes", "a b"),
            "https://example.test/pes/console?thread=a%20b"
        );
    }
}
