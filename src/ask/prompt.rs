//! Asking a person at a suspension, one line of input at a time: which decision (only those the
//! suspension allows), then what it needs (edited arguments as JSON, a reason, a response). A
//! pure state machine over lines, so the session can feed it from stdin between stream events
//! and the tests can drive it directly.
//!
//! Editing starts from the current arguments: they are shown as indented JSON, to copy and
//! change, and the new ones may come over several lines (a pasted object is read until it is
//! whole). An empty line or `back` goes back to the choices without deciding anything.

use serde_json::{Value, json};

use super::render::Style;

/// What a suspension asks, as the client shows it.
#[derive(Debug, Clone)]
pub struct Question {
    pub suspension_id: String,
    pub question: String,
    /// The proposed tool call: name and arguments.
    pub tool_call: Option<(String, Value)>,
    pub allowed: Vec<String>,
    pub input_schema: Option<Value>,
}

impl Question {
    /// From an `AGENT_SUSPENDED` observation's content (or a suspension from the API).
    pub fn from_content(c: &Value) -> Option<Question> {
        Some(Question {
            suspension_id: c["suspensionId"].as_str()?.to_owned(),
            question: c["question"]
                .as_str()
                .unwrap_or("A decision is needed")
                .to_owned(),
            tool_call: c["toolCall"]["name"]
                .as_str()
                .map(|n| (n.to_owned(), c["toolCall"]["arguments"].clone())),
            allowed: c["allowedDecisions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            input_schema: Some(c["inputSchema"].clone()).filter(|s| !s.is_null()),
        })
    }

    /// The lines that introduce the question.
    pub fn intro(&self, style: Style) -> Vec<String> {
        let mut out = vec![style.paint("1;33", &format!("? {}", self.question))];
        if let Some((name, args)) = &self.tool_call {
            out.push(format!("  proposed call: {name} {args}"));
        }
        if let Some(schema) = &self.input_schema {
            out.push(format!("  answer as JSON fitting: {schema}"));
        }
        out
    }

    fn menu(&self) -> String {
        let names = [
            ("approve", "[a]pprove"),
            ("edit", "[e]dit"),
            ("reject", "[r]eject"),
            ("respond", "re[s]pond"),
        ];
        let options: Vec<&str> = names
            .iter()
            .filter(|(d, _)| self.allowed.iter().any(|a| a == d))
            .map(|(_, label)| *label)
            .collect();
        format!("{} > ", options.join(", "))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Choose,
    /// The lines of edited arguments read so far (empty before the first).
    Args(String),
    Reason,
    Response,
}

/// The prompt for edited arguments.
const ARGS_PROMPT: &str = "arguments (JSON; an empty line or `back` returns to the choices) > ";
/// The prompt for the next line of arguments that are not whole yet.
const MORE_ARGS_PROMPT: &str = "  … > ";

/// A line that leaves the arguments and goes back to the choices.
fn goes_back(line: &str) -> bool {
    line.is_empty() || line.eq_ignore_ascii_case("back")
}

/// What to do with the person's line.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// Show this prompt and read another line.
    Ask(String),
    /// Send this body to `POST /v1/suspensions/{id}/resume`.
    Send(Value),
}

/// One question being asked.
#[derive(Debug)]
pub struct Dialogue {
    pub question: Question,
    step: Step,
}

impl Dialogue {
    /// Start asking; the first prompt.
    pub fn start(question: Question) -> (Dialogue, String) {
        let prompt = question.menu();
        (
            Dialogue {
                question,
                step: Step::Choose,
            },
            prompt,
        )
    }

    /// Take the person's next line.
    pub fn answer(&mut self, line: &str) -> Next {
        let line = line.trim();
        match self.step {
            Step::Choose => {
                let decision = match line.to_ascii_lowercase().as_str() {
                    "a" | "approve" => "approve",
                    "e" | "edit" => "edit",
                    "r" | "reject" => "reject",
                    "s" | "respond" => "respond",
                    _ => return Next::Ask(format!("? {}", self.question.menu())),
                };
                if !self.question.allowed.iter().any(|a| a == decision) {
                    return Next::Ask(format!(
                        "{decision} is not allowed here; {}",
                        self.question.menu()
                    ));
                }
                match decision {
                    "approve" => Next::Send(json!({"decision": "approve"})),
                    "edit" => {
                        self.step = Step::Args(String::new());
                        Next::Ask(self.edit_intro())
                    }
                    "reject" => {
                        self.step = Step::Reason;
                        Next::Ask("reason (optional, the model is told) > ".into())
                    }
                    _ => {
                        self.step = Step::Response;
                        Next::Ask("response (JSON, or text) > ".into())
                    }
                }
            }
            Step::Args(ref read) if read.is_empty() && goes_back(line) => {
                self.step = Step::Choose;
                Next::Ask(self.question.menu())
            }
            Step::Args(ref mut read) => {
                if line.is_empty() {
                    // An empty line ends arguments that are not whole: drop them.
                    read.clear();
                    return Next::Ask(format!("incomplete JSON, dropped; {ARGS_PROMPT}"));
                }
                read.push_str(line);
                read.push('\n');
                match serde_json::from_str::<Value>(read) {
                    Ok(args) => Next::Send(json!({"decision": "edit", "modifiedArgs": args})),
                    // Not whole yet (a pasted object over several lines): read on.
                    Err(e) if e.is_eof() => Next::Ask(MORE_ARGS_PROMPT.into()),
                    Err(e) => {
                        read.clear();
                        Next::Ask(format!("not JSON ({e}); {ARGS_PROMPT}"))
                    }
                }
            }
            Step::Reason if line.is_empty() => Next::Send(json!({"decision": "reject"})),
            Step::Reason => Next::Send(json!({"decision": "reject", "reason": line})),
            Step::Response => {
                // Text that is not JSON is what the person meant to send, as a string.
                let response = serde_json::from_str::<Value>(line).unwrap_or_else(|_| json!(line));
                Next::Send(json!({"decision": "respond", "response": response}))
            }
        }
    }

    /// What editing starts with: the current arguments, indented, to copy and change.
    fn edit_intro(&self) -> String {
        let current = self
            .question
            .tool_call
            .as_ref()
            .map_or_else(|| json!({}), |(_, args)| args.clone());
        let pretty = serde_json::to_string_pretty(&current).unwrap_or_else(|_| current.to_string());
        format!("current arguments, to copy and change:\n{pretty}\n{ARGS_PROMPT}")
    }

    /// The prompt of the step the dialogue is at (to show it again after an interruption). Edited
    /// arguments start again from the first line.
    pub fn prompt(&mut self) -> String {
        match &mut self.step {
            Step::Choose => self.question.menu(),
            Step::Args(read) => {
                read.clear();
                ARGS_PROMPT.into()
            }
            Step::Reason => "reason (optional, the model is told) > ".into(),
            Step::Response => "response (JSON, or text) > ".into(),
        }
    }

    /// The server refused what was sent (422): ask for the same thing again.
    pub fn retry(&mut self) -> String {
        if !matches!(self.step, Step::Args(_) | Step::Response) {
            self.step = Step::Choose;
        }
        self.prompt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval() -> Question {
        Question::from_content(&json!({
            "suspensionId": "s-1",
            "question": "May the agent call `calculator`?",
            "toolCall": {"name": "calculator", "arguments": {"expression": "6*7"}},
            "allowedDecisions": ["approve", "edit", "reject", "respond"],
            "inputSchema": null,
        }))
        .unwrap()
    }

    #[test]
    fn each_decision_is_read_from_lines() {
        let (mut d, prompt) = Dialogue::start(approval());
        assert_eq!(prompt, "[a]pprove, [e]dit, [r]eject, re[s]pond > ");
        assert_eq!(d.answer("a"), Next::Send(json!({"decision": "approve"})));

        let (mut d, _) = Dialogue::start(approval());
        assert!(matches!(d.answer("edit"), Next::Ask(_)));
        assert!(matches!(d.answer("{oops"), Next::Ask(p) if p.starts_with("not JSON")));
        assert_eq!(
            d.answer(r#"{"expression": "2*3"}"#),
            Next::Send(json!({"decision": "edit", "modifiedArgs": {"expression": "2*3"}}))
        );
        // A refused edit asks for the arguments again.
        assert!(d.retry().starts_with("arguments"));

        let (mut d, _) = Dialogue::start(approval());
        d.answer("r");
        assert_eq!(
            d.answer("too risky"),
            Next::Send(json!({"decision": "reject", "reason": "too risky"}))
        );

        let (mut d, _) = Dialogue::start(approval());
        d.answer("s");
        assert_eq!(
            d.answer("42"),
            Next::Send(json!({"decision": "respond", "response": 42}))
        );
        let (mut d, _) = Dialogue::start(approval());
        d.answer("s");
        assert_eq!(
            d.answer("call me Ada"),
            Next::Send(json!({"decision": "respond", "response": "call me Ada"}))
        );
    }

    #[test]
    fn editing_shows_the_current_arguments_reads_them_over_lines_and_can_go_back() {
        let (mut d, menu) = Dialogue::start(approval());
        let Next::Ask(intro) = d.answer("e") else {
            panic!("edit asks for the arguments")
        };
        assert!(
            intro.contains("{\n  \"expression\": \"6*7\"\n}\n"),
            "the current arguments, indented: {intro}"
        );
        // Back to the choices, nothing decided: an empty line, or `back`.
        assert_eq!(d.answer(""), Next::Ask(menu.clone()));
        d.answer("e");
        assert_eq!(d.answer("BACK"), Next::Ask(menu.clone()));
        // A pasted object over several lines is read until it is whole.
        d.answer("e");
        assert_eq!(d.answer("{"), Next::Ask(MORE_ARGS_PROMPT.into()));
        assert_eq!(
            d.answer("  \"expression\": \"6*9\""),
            Next::Ask(MORE_ARGS_PROMPT.into())
        );
        assert_eq!(
            d.answer("}"),
            Next::Send(json!({"decision": "edit", "modifiedArgs": {"expression": "6*9"}}))
        );
        // An empty line drops arguments that are not whole, and asks again.
        let (mut d, _) = Dialogue::start(approval());
        d.answer("e");
        d.answer("{");
        assert!(matches!(d.answer(""), Next::Ask(p) if p.starts_with("incomplete JSON")));
        assert_eq!(
            d.answer(r#"{"expression": "1"}"#),
            Next::Send(json!({"decision": "edit", "modifiedArgs": {"expression": "1"}}))
        );
    }

    #[test]
    fn only_allowed_decisions_are_offered_and_taken() {
        let q = Question::from_content(&json!({
            "suspensionId": "s-2", "question": "What should I know?",
            "allowedDecisions": ["respond", "reject"],
            "inputSchema": {"type": "object"},
        }))
        .unwrap();
        let (mut d, prompt) = Dialogue::start(q);
        assert_eq!(prompt, "[r]eject, re[s]pond > ");
        assert!(matches!(d.answer("a"), Next::Ask(p) if p.contains("not allowed")));
        assert!(matches!(d.answer("?"), Next::Ask(_)));
    }
}
