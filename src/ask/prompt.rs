//! Asking a person at a suspension, one line of input at a time: which decision (only those the
//! suspension allows), then what it needs (edited arguments as JSON, a reason, a response). A
//! pure state machine over lines, so the session can feed it from stdin between stream events
//! and the tests can drive it directly.

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Choose,
    Args,
    Reason,
    Response,
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
                        self.step = Step::Args;
                        Next::Ask("arguments (JSON on one line) > ".into())
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
            Step::Args => match serde_json::from_str::<Value>(line) {
                Ok(args) => Next::Send(json!({"decision": "edit", "modifiedArgs": args})),
                Err(e) => Next::Ask(format!("not JSON ({e}); arguments > ")),
            },
            Step::Reason if line.is_empty() => Next::Send(json!({"decision": "reject"})),
            Step::Reason => Next::Send(json!({"decision": "reject", "reason": line})),
            Step::Response => {
                // Text that is not JSON is what the person meant to send, as a string.
                let response = serde_json::from_str::<Value>(line).unwrap_or_else(|_| json!(line));
                Next::Send(json!({"decision": "respond", "response": response}))
            }
        }
    }

    /// The prompt of the step the dialogue is at (to show it again after an interruption).
    pub fn prompt(&self) -> String {
        match self.step {
            Step::Choose => self.question.menu(),
            Step::Args => "arguments (JSON on one line) > ".into(),
            Step::Reason => "reason (optional, the model is told) > ".into(),
            Step::Response => "response (JSON, or text) > ".into(),
        }
    }

    /// The server refused what was sent (422): ask for the same thing again.
    pub fn retry(&mut self) -> String {
        if !matches!(self.step, Step::Args | Step::Response) {
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
