//! How the terminal client shows a run: each observation as one line (a plan as a few), indented
//! by its place in the tree (run → item → tool call → flowchart step or remote update), with the
//! item it belongs to in brackets, since parallel items interleave. Colour only on a terminal
//! and never with `NO_COLOR`; a progress line on stderr only when stderr is a terminal.

use std::collections::HashMap;
use std::io::Write;
use std::time::Instant;

use serde_json::Value;

/// Whether to colour, and how: ANSI SGR codes.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
}

impl Style {
    /// This process's style: see [`Style::decide`].
    pub fn detect() -> Style {
        use std::io::IsTerminal;
        Style::decide(
            std::io::stdout().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
            std::env::var("TERM").ok().as_deref(),
        )
    }

    /// Colour when stdout is a terminal, `NO_COLOR` is unset or empty (no-color.org), and
    /// `TERM` is not `dumb`.
    pub fn decide(terminal: bool, no_color: Option<&std::ffi::OsStr>, term: Option<&str>) -> Style {
        Style {
            color: terminal && no_color.is_none_or(|v| v.is_empty()) && term != Some("dumb"),
        }
    }

    /// `text` in the SGR `code` (e.g. `1;32`), or as it is without colour.
    pub fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
}

/// The SGR code of an observation type: the run's ends stand out, tool traffic is cyan, what
/// waits for a person is yellow, nested steps magenta, failures red.
fn type_color(kind: &str) -> &'static str {
    match kind {
        "RUN_COMPLETED" => "1;32",
        "RUN_FAILED" | "ERROR" | "RUN_CANCELLED" => "1;31",
        "RUN_STARTED" | "FINAL_RESPONSE" => "1",
        "AGENT_SUSPENDED" | "RUN_SUSPENDED" | "AGENT_RESUMED" => "33",
        "TOOL_CALL" | "TOOL_EXECUTION" => "36",
        "FLOWCHART_STEP" | "A2A_TASK_UPDATE" => "35",
        _ => "2",
    }
}

/// Where each observation sits, so the next one can be indented under its parent.
#[derive(Default)]
pub struct Tree {
    /// observation id → (depth, item it belongs to).
    placed: HashMap<String, (usize, Option<String>)>,
    /// tool call id → the `TOOL_CALL` observation's id.
    calls: HashMap<String, String>,
    /// item id → its team (from the plans).
    teams: HashMap<String, String>,
}

/// Longest argument or result text on a line, in characters.
const SNIPPET: usize = 100;

impl Tree {
    /// The lines that show `obs`.
    pub fn lines(&mut self, obs: &Value, style: Style) -> Vec<String> {
        let kind = obs["type"].as_str().unwrap_or("?");
        let c = &obs["content"];
        let (depth, item) = self.place(obs);
        if let Some(id) = obs["id"].as_str() {
            self.placed.insert(id.to_owned(), (depth, item.clone()));
        }
        if kind == "TOOL_CALL"
            && let (Some(call), Some(id)) = (c["toolCallId"].as_str(), obs["id"].as_str())
        {
            self.calls.insert(call.to_owned(), id.to_owned());
        }
        let tag = item
            .as_deref()
            .map(|i| format!("{} ", style.paint("34", &format!("[{i}]"))))
            .unwrap_or_default();
        let head = format!(
            "{}{tag}{} {}",
            "  ".repeat(depth),
            style.paint(type_color(kind), kind),
            text_of(kind, obs)
        );
        let mut out = vec![head];
        if kind == "PLAN" {
            let team = c["teamId"].as_str();
            for it in c["todoList"].as_array().into_iter().flatten() {
                let id = it["id"].as_str().unwrap_or("?");
                if let Some(t) = team.or(it["parentItemId"].as_str()) {
                    self.teams.insert(id.to_owned(), t.to_owned());
                }
                let deps: Vec<&str> = it["dependencies"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let after = if deps.is_empty() {
                    String::new()
                } else {
                    format!(" (after {})", deps.join(", "))
                };
                let team_mark = if it["kind"] == "team" { " [team]" } else { "" };
                out.push(format!(
                    "{}- {} {}{team_mark}{after}",
                    "  ".repeat(depth + 1),
                    style.paint("34", id),
                    it["description"].as_str().unwrap_or_default()
                ));
            }
        }
        out
    }

    /// The depth of an observation and the item it belongs to, from its links.
    fn place(&self, obs: &Value) -> (usize, Option<String>) {
        let c = &obs["content"];
        let kind = obs["type"].as_str().unwrap_or_default();
        let call = c["toolCallId"].as_str().or(if kind == "AGENT_SUSPENDED" {
            c["toolCall"]["id"].as_str()
        } else {
            None
        });
        if kind != "TOOL_CALL"
            && let Some(above) = call
                .and_then(|id| self.calls.get(id))
                .and_then(|o| self.placed.get(o))
        {
            return (above.0 + 1, above.1.clone());
        }
        match obs["parentId"].as_str() {
            None => (0, None),
            Some(p) => match self.placed.get(p) {
                Some((d, item)) => (d + 1, item.clone()),
                // An item's own status line sits at the item's depth; what happens inside
                // the item (its tool calls, thoughts, questions) one step further in.
                None if kind == "ITEM_STATUS_CHANGE" => (self.item_depth(p), Some(p.to_owned())),
                None => (self.item_depth(p) + 1, Some(p.to_owned())),
            },
        }
    }

    /// 1 for a top-level item, one more per team it is nested in.
    fn item_depth(&self, item: &str) -> usize {
        let mut depth = 1;
        let mut at = item;
        while let Some(team) = self.teams.get(at) {
            depth += 1;
            at = team;
            if depth > 16 {
                break;
            }
        }
        depth
    }
}

/// The text after the type: what a person wants to read of each kind.
fn text_of(kind: &str, obs: &Value) -> String {
    let c = &obs["content"];
    let title = obs["title"].as_str().unwrap_or_default();
    match kind {
        "RUN_STARTED" => match (c["provider"].as_str(), c["model"].as_str()) {
            (Some(p), Some(m)) => format!("{title} ({p}/{m})"),
            _ => title.to_owned(),
        },
        "TOOL_CALL" => format!(
            "{} {}",
            c["name"].as_str().unwrap_or(title),
            snippet(&c["arguments"])
        ),
        "TOOL_EXECUTION" => {
            let name = c["name"].as_str().unwrap_or(title);
            if c["status"] == "success" {
                format!("{name} → {}", snippet(&c["output"]))
            } else {
                let why = if c["error"].is_null() {
                    &c["output"]
                } else {
                    &c["error"]
                };
                format!(
                    "{name} ✗ {}: {}",
                    c["status"].as_str().unwrap_or("error"),
                    snippet(why)
                )
            }
        }
        "ITEM_STATUS_CHANGE" => format!(
            "{} → {}",
            c["previousStatus"].as_str().unwrap_or("?"),
            c["status"].as_str().unwrap_or("?")
        ),
        "PLAN" => {
            let n = c["todoList"].as_array().map_or(0, Vec::len);
            format!("{title}: {n} items")
        }
        "RUN_FAILED" => format!(
            "{title}: {} {}",
            c["error"]["code"].as_str().unwrap_or_default(),
            c["error"]["message"].as_str().unwrap_or_default()
        ),
        _ => title.to_owned(),
    }
}

/// A JSON value on one line, cut at [`SNIPPET`] characters.
fn snippet(v: &Value) -> String {
    let text = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let text = text.replace('\n', " ");
    if text.chars().count() > SNIPPET {
        let cut: String = text.chars().take(SNIPPET).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// The final answer: its text, then its sources and suggestions when it has any.
pub fn answer_lines(a: &Value, s: Style) -> Vec<String> {
    let mut out = vec![
        String::new(),
        s.paint("1", "Answer"),
        a["response"].as_str().unwrap_or_default().to_owned(),
    ];
    let sources: Vec<&Value> = a["sources"].as_array().into_iter().flatten().collect();
    if !sources.is_empty() {
        out.push(String::new());
        out.push(s.paint("1", "Sources"));
        for src in sources {
            out.push(format!(
                "- {} <{}>",
                src["title"].as_str().unwrap_or_default(),
                src["url"].as_str().unwrap_or_default()
            ));
        }
    }
    let suggestions: Vec<&str> = a["suggestions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !suggestions.is_empty() {
        out.push(String::new());
        out.push(s.paint("1", "Suggestions"));
        out.extend(suggestions.iter().map(|t| format!("- {t}")));
    }
    out
}

/// The progress line on stderr: a spinner, what the run is doing, the time so far. Drawn only
/// when stderr is a terminal; cleared before any other output so lines never mix.
pub struct Progress {
    enabled: bool,
    shown: bool,
    started: Instant,
    frame: usize,
    color: bool,
}

const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

impl Progress {
    pub fn detect(style: Style) -> Progress {
        use std::io::IsTerminal;
        Progress {
            enabled: std::io::stderr().is_terminal(),
            shown: false,
            started: Instant::now(),
            frame: 0,
            color: style.color,
        }
    }

    /// Redraw with `status`.
    pub fn draw(&mut self, status: &str) {
        if !self.enabled {
            return;
        }
        self.frame = (self.frame + 1) % SPINNER.len();
        let secs = self.started.elapsed().as_secs();
        let line = format!("{} {status} · {secs}s", SPINNER[self.frame]);
        let line = if self.color {
            format!("\x1b[2m{line}\x1b[0m")
        } else {
            line
        };
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        self.shown = true;
    }

    /// Remove the line (before other output).
    pub fn clear(&mut self) {
        if self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obs(id: &str, kind: &str, parent: Option<&str>, title: &str, content: Value) -> Value {
        json!({"id": id, "type": kind, "parentId": parent, "title": title, "content": content})
    }

    #[test]
    fn lines_are_indented_by_their_place_in_the_tree() {
        let mut t = Tree::default();
        let plain = Style { color: false };
        let plan = json!({"todoList": [
            {"id": "s1", "description": "Add", "dependencies": [], "kind": "team"},
            {"id": "s2", "description": "Say", "dependencies": ["s1"], "kind": "leaf"}]});
        assert_eq!(
            t.lines(&obs("o1", "PLAN", None, "Plan", plan), plain),
            vec![
                "PLAN Plan: 2 items",
                "  - s1 Add [team]",
                "  - s2 Say (after s1)"
            ]
        );
        let team = json!({"teamId": "s1", "todoList": [{"id": "s1.a", "description": "Inner"}]});
        t.lines(
            &obs("o2", "PLAN", Some("s1"), "Plan of team s1", team),
            plain,
        );
        let started =
            json!({"itemId": "s1.a", "status": "in_progress", "previousStatus": "pending"});
        assert_eq!(
            t.lines(
                &obs(
                    "o2b",
                    "ITEM_STATUS_CHANGE",
                    Some("s1.a"),
                    "s1.a: pending → in_progress",
                    started
                ),
                plain
            )[0]
            .find('['),
            Some(4),
            "an item's status line at the item's depth"
        );
        // A tool call one step under its item's status line.
        let call =
            json!({"toolCallId": "c1", "name": "calculator", "arguments": {"expression": "1+1"}});
        assert_eq!(
            t.lines(
                &obs("o3", "TOOL_CALL", Some("s1.a"), "calculator", call),
                plain
            ),
            vec![r#"      [s1.a] TOOL_CALL calculator {"expression":"1+1"}"#]
        );
        let step = obs("o4", "FLOWCHART_STEP", Some("o3"), "fee", json!({}));
        assert_eq!(
            t.lines(&step, plain),
            vec!["        [s1.a] FLOWCHART_STEP fee"]
        );
        let result = json!({"toolCallId": "c1", "name": "calculator", "status": "success", "output": {"result": 2}});
        assert_eq!(
            t.lines(
                &obs("o5", "TOOL_EXECUTION", Some("s1.a"), "calculator", result),
                plain
            ),
            vec![r#"        [s1.a] TOOL_EXECUTION calculator → {"result":2}"#]
        );
    }

    #[test]
    fn colour_is_only_added_when_asked_for() {
        let mut t = Tree::default();
        let o = obs("o1", "RUN_COMPLETED", None, "Run completed", json!({}));
        assert_eq!(
            t.lines(&o, Style { color: false }),
            vec!["RUN_COMPLETED Run completed"]
        );
        let coloured = t.lines(&o, Style { color: true });
        assert_eq!(
            coloured,
            vec!["\x1b[1;32mRUN_COMPLETED\x1b[0m Run completed"]
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(Style::decide(true, None, Some("xterm-256color")).color);
        assert!(Style::decide(true, Some(OsStr::new("")), None).color);
        assert!(!Style::decide(false, None, Some("xterm")).color, "piped");
        assert!(
            !Style::decide(true, Some(OsStr::new("1")), None).color,
            "NO_COLOR"
        );
        assert!(!Style::decide(true, None, Some("dumb")).color);
    }

    #[test]
    fn the_answer_lists_its_sources_and_suggestions() {
        let a = json!({"response": "42", "sources": [{"title": "Docs", "url": "https://x.test/d"}],
                       "suggestions": ["Ask again"]});
        assert_eq!(
            answer_lines(&a, Style { color: false }),
            vec![
                "",
                "Answer",
                "42",
                "",
                "Sources",
                "- Docs <https://x.test/d>",
                "",
                "Suggestions",
                "- Ask again"
            ]
        );
    }

    #[test]
    fn long_values_are_cut_on_a_character_boundary() {
        let s = snippet(&json!("é".repeat(300)));
        assert_eq!(s.chars().count(), SNIPPET + 1);
        assert!(s.ends_with('…'));
    }
}
