//! The `offline` provider: deterministic, no network, the default when no model is configured,
//! so a new user sees the whole Plan-Execute-Synthesize pipeline (plan, parallel items, tool calls,
//! results, synthesis, compaction) work end to end. It is NOT a language model and says so: the
//! service warns at start when it is the default provider, every run it serves says so in
//! `RUN_STARTED`, and every synthesized response starts with [`OFFLINE_NOTICE`].
//!
//! It reads a request as any model does: the phase, the messages and the offered tools, nothing
//! else. The engine's prompts follow a written contract, the labelled lines of
//! [`crate::agent::prompts::labels`], and that is where the offline model finds what it needs:
//!
//! - plan: the query is the last user message; the cap is the system prompt's
//!   `Use at most N items.`; a refinement note (`This thread already has a plan.`) lists the
//!   latest items earlier runs finished and how many there are (for fresh ids) and the items not
//!   started yet, `- <id> [<status>]: <description>` (the latter with their `depends on:`); the
//!   cap bounds this run's items, never the thread's;
//! - execute: the item brief (the first user message) gives `Your item [<id>]: <description>`,
//!   `Required tools: …` and the `Results of earlier items:` section; tool results are the `tool`
//!   messages;
//! - synthesize: the synthesis brief's `Results of the plan's items:` section (this run's items;
//!   the earlier items it summarizes for context are not part of the answer);
//! - compact: the user message after its first line (`Result of item [<id>] …:`).
//!
//! Its tests build their requests with the engine's own prompt builders, so a prompt change that
//! breaks the contract breaks them. The only prose it interprets is the query: arithmetic
//! expressions (checked with the calculator's own parser), a question about the time, "ask me",
//! the name of any other available tool (an MCP tool, the HTTP tool, …) optionally followed by a
//! JSON object of arguments (`call web__echo with {"text": "hi"}`), and its independent parts
//! (split at `?`, `;` and line breaks) when no tool applies.
//!
//! Like the HTTP providers, it hands its reply's text to the request's token sink, word by word
//! (all at once: nothing here is slow), so token streaming can be watched without a model.

use serde_json::{Value, json};

use super::{ChatMessage, ChatRequest, ChatResponse, LlmError, LlmProvider, Phase, Role, ToolCall};
use crate::agent::prompts::labels;
use crate::model::{ItemId, ItemStatus, Usage};
use crate::tools::builtin::{evaluate, parse_timezone};

/// Prefix of every synthesized response of the offline model.
pub const OFFLINE_NOTICE: &str = "[offline model: not a real LLM] ";

/// Items a plan holds when the system prompt gives no bound.
const DEFAULT_MAX_ITEMS: usize = 20;
/// Longest query quoted in an item description.
const MAX_QUOTED_QUERY: usize = 500;
/// Longest compaction summary, in bytes.
const MAX_SUMMARY: usize = 1000;

/// The deterministic stand-in model (see the module docs).
#[derive(Debug)]
pub struct OfflineProvider {
    _private: (),
}

impl Default for OfflineProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl OfflineProvider {
    /// Build the offline model. It is always registered (a thread may name it), so building it
    /// says nothing: the start-up warning is for when it is the default provider.
    pub fn new() -> Self {
        Self { _private: () }
    }
}

/// One plan item as the `pes_plan` schema spells it.
#[derive(Debug, Clone, PartialEq)]
struct PlanItem {
    id: String,
    description: String,
    step_type: &'static str,
    required_tools: Vec<String>,
    expected_outcome: String,
    dependencies: Vec<String>,
}

impl PlanItem {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "description": self.description,
            "stepType": self.step_type,
            "requiredTools": self.required_tools,
            "expectedOutcome": self.expected_outcome,
            "dependencies": self.dependencies,
            "kind": "leaf",
            "role": null,
            "toolAllowlist": null,
        })
    }
}

/// A new item's content before it gets an id.
struct Draft {
    description: String,
    tool: Option<String>,
    expected_outcome: String,
}

const ANSWER_PREFIX: &str = "Compose the answer to: ";
const CALCULATE_PREFIX: &str = "Calculate ";
const TIME_PREFIX: &str = "Look up the current time";
const ASK_PREFIX: &str = "Ask the user: ";
/// Prefix of an item that calls a tool the query named: `Call the tool <name> with <json>`.
const CALL_PREFIX: &str = "Call the tool ";
/// Tools the offline model has rules of its own for.
const BUILTIN_RULES: &[&str] = &["calculator", "current_time", "ask_user"];
/// The question the offline model asks when a query says "ask me".
const ASK_QUESTION: &str = "What should I know to answer?";
/// Prefix of an item that answers one independent part of a query that needs no tool.
const PART_PREFIX: &str = "Answer this part: ";
/// Expected outcome of such an item.
const PART_OUTCOME: &str = "An answer to this part of the query";
/// Fewest words a piece of a query needs to be an independent part.
const MIN_PART_WORDS: usize = 2;

fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{}…", cut.trim_end())
    }
}

fn is_date_like(s: &str) -> bool {
    let parts: Vec<&str> = s.split(['-', '/']).collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// Arithmetic expressions in a text: maximal runs of digits, operators, parentheses, decimal
/// points and spaces that contain an operator and that the calculator accepts.
fn detect_expressions(text: &str) -> Vec<String> {
    const OPS: &[char] = &['+', '-', '*', '/', '%', '^'];
    let allowed = |c: char| c.is_ascii_digit() || OPS.contains(&c) || "(). ".contains(c);
    let mut found: Vec<String> = Vec::new();
    for run in text.split(|c: char| !allowed(c)) {
        let mut cand = run.trim();
        loop {
            let before = cand.len();
            cand = cand
                .trim_start_matches(|c: char| "+*/%^).".contains(c) || c == ' ')
                .trim_end_matches(|c: char| "+-*/%^(.".contains(c) || c == ' ');
            if cand.len() == before {
                break;
            }
        }
        let has_operator = cand
            .char_indices()
            .any(|(i, c)| OPS.contains(&c) && (i > 0 || c != '-'));
        if !has_operator
            || !cand.chars().any(|c| c.is_ascii_digit())
            || is_date_like(cand)
            || evaluate(cand).is_err()
        {
            continue;
        }
        let cand = cand.to_owned();
        if !found.contains(&cand) {
            found.push(cand);
        }
    }
    found
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// "ask me …" / "ask the user …": the offline model then asks with `ask_user`.
fn wants_a_question(query: &str) -> bool {
    let q = query.to_lowercase();
    q.contains("ask me") || q.contains("ask the user")
}

fn asks_for_time(query: &str) -> bool {
    words(query).any(|w| matches!(w.as_str(), "time" | "date" | "today" | "clock"))
}

/// An IANA zone named in a text: an `Area/Location` token, `UTC`/`GMT`, or a capitalized
/// zone name such as `Japan`.
fn detect_zone(text: &str) -> Option<String> {
    text.split_whitespace()
        .map(|t| t.trim_matches(|c: char| !(c.is_alphanumeric() || c == '_' || c == '/')))
        .find_map(|tok| {
            let plausible = tok.contains('/')
                || tok.eq_ignore_ascii_case("utc")
                || tok.eq_ignore_ascii_case("gmt")
                || (tok.len() >= 4 && tok.starts_with(|c: char| c.is_ascii_uppercase()));
            if !plausible || tok.chars().all(|c| c.is_ascii_digit() || c == '/') {
                return None;
            }
            if tok.contains('/')
                || tok.eq_ignore_ascii_case("utc")
                || tok.eq_ignore_ascii_case("gmt")
            {
                parse_timezone(tok).ok().map(|tz| tz.name().to_owned())
            } else {
                // Capitalized words must match a zone name exactly (no `Look` → nothing).
                tok.parse::<chrono_tz::Tz>()
                    .ok()
                    .map(|tz| tz.name().to_owned())
            }
        })
}

/// The tools a planning request offers: the `- <name>: <description>` lines after the system
/// prompt's `Available tools:`.
fn available_tools(req: &ChatRequest) -> Vec<String> {
    texts(req, Role::System)
        .flat_map(|t| {
            t.lines()
                .skip_while(|l| *l != labels::AVAILABLE_TOOLS)
                .skip(1)
                .map_while(|l| l.strip_prefix("- "))
                .filter_map(|l| l.split_once(": ").map(|(name, _)| name.to_owned()))
        })
        .collect()
}

/// The tools (other than those with rules of their own) the query names, in the order named,
/// each with the JSON object that follows its name (after an optional `with`), else `{}`; and
/// the query without those arguments (so numbers inside them are not taken for arithmetic).
fn named_calls(query: &str, available: &[String]) -> (Vec<(String, Value)>, String) {
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let mut found: Vec<(usize, String, Value, std::ops::Range<usize>)> = Vec::new();
    for name in available
        .iter()
        .filter(|n| !BUILTIN_RULES.contains(&n.as_str()))
    {
        for (at, _) in query.match_indices(name.as_str()) {
            let end = at + name.len();
            let bounded =
                !query[..at].ends_with(is_name_char) && !query[end..].starts_with(is_name_char);
            if !bounded {
                continue;
            }
            let after = query[end..].trim_start_matches(['`', '\'', '"', ' ']);
            let after = after.strip_prefix("with").unwrap_or(after).trim_start();
            let start = query.len() - after.len();
            let mut stream = serde_json::Deserializer::from_str(after).into_iter::<Value>();
            let (args, span) = match (after.starts_with('{'), stream.next()) {
                (true, Some(Ok(v @ Value::Object(_)))) => (v, start..start + stream.byte_offset()),
                _ => (json!({}), end..end),
            };
            found.push((at, name.clone(), args, span));
            break;
        }
    }
    found.sort_by_key(|f| f.0);
    let mut rest = query.to_owned();
    for (_, _, _, span) in found.iter().rev() {
        rest.replace_range(span.clone(), " ");
    }
    let calls = found.into_iter().map(|(_, n, a, _)| (n, a)).collect();
    (calls, rest)
}

/// The tool and arguments of an item the offline model planned from a named tool
/// (`Call the tool <name> with <json>`).
fn called_tool(description: &str) -> Option<(&str, Value)> {
    let (name, args) = description
        .strip_prefix(CALL_PREFIX)?
        .split_once(" with ")?;
    let args: Value = serde_json::from_str(args).ok()?;
    args.is_object().then_some((name, args))
}

/// The independent parts of a query: its pieces between `?`, `;` and line breaks that hold at
/// least [`MIN_PART_WORDS`] words, when there are at least two (a single part is the query).
fn independent_parts(query: &str) -> Vec<String> {
    let mut parts: Vec<String> = Vec::new();
    for piece in query.split(['?', ';', '\n']) {
        let piece = piece.trim().trim_end_matches(['.', '!', ',']).trim_end();
        if words(piece).count() >= MIN_PART_WORDS && !parts.iter().any(|p| p == piece) {
            parts.push(piece.to_owned());
        }
    }
    if parts.len() < 2 { Vec::new() } else { parts }
}

/// New items for a query: one per arithmetic expression, one for the time, one to ask the user,
/// or, when none of these applies, one per independent part of the query; then the answer, which
/// depends on all of them. The parts have no dependency between them, so they run in parallel.
fn drafts_for(query: &str, available: &[String]) -> (Vec<Draft>, Draft) {
    let (named, rest) = named_calls(query, available);
    let mut tools: Vec<Draft> = named
        .into_iter()
        .map(|(name, args)| Draft {
            description: format!("{CALL_PREFIX}{name} with {args}"),
            expected_outcome: format!("The result of {name}"),
            tool: Some(name),
        })
        .collect();
    tools.extend(detect_expressions(&rest).into_iter().map(|expr| Draft {
        description: format!("{CALCULATE_PREFIX}{expr}"),
        tool: Some("calculator".into()),
        expected_outcome: format!("The value of {expr}"),
    }));
    if asks_for_time(query) {
        let zone = detect_zone(query);
        let suffix = zone.map(|z| format!(" in {z}")).unwrap_or_default();
        tools.push(Draft {
            description: format!("{TIME_PREFIX}{suffix}"),
            tool: Some("current_time".into()),
            expected_outcome: format!("The current date and time{suffix}"),
        });
    }
    if wants_a_question(query) {
        tools.push(Draft {
            description: format!("{ASK_PREFIX}{ASK_QUESTION}"),
            tool: Some("ask_user".into()),
            expected_outcome: "The user's answer".into(),
        });
    }
    if tools.is_empty() {
        tools = independent_parts(query)
            .into_iter()
            .map(|part| Draft {
                description: format!("{PART_PREFIX}{}", truncate_chars(&part, MAX_QUOTED_QUERY)),
                tool: None,
                expected_outcome: PART_OUTCOME.into(),
            })
            .collect();
    }
    let answer = Draft {
        description: format!(
            "{ANSWER_PREFIX}{}",
            truncate_chars(query.trim(), MAX_QUOTED_QUERY)
        ),
        tool: None,
        expected_outcome: "A direct answer to the user's question".into(),
    };
    (tools, answer)
}

/// What items not started yet must have been, from their description (the offline model wrote
/// it) and the dependencies the note gives: answer items depend on what the note says, else on
/// the tool and part items listed since the previous answer, as when first planned.
fn rebuild_existing(existing: &[NoteEntry]) -> Vec<PlanItem> {
    let mut items = Vec::new();
    let mut batch: Vec<String> = Vec::new();
    for NoteEntry {
        id,
        description,
        dependencies,
        ..
    } in existing
    {
        let tool = if description.starts_with(CALCULATE_PREFIX) {
            Some("calculator".to_owned())
        } else if description.starts_with(TIME_PREFIX) {
            Some("current_time".to_owned())
        } else if description.starts_with(ASK_PREFIX) {
            Some("ask_user".to_owned())
        } else {
            called_tool(description).map(|(name, _)| name.to_owned())
        };
        let item = match tool {
            Some(t) => {
                // The same expected outcome as when the item was first planned.
                let expected_outcome = match description.strip_prefix(CALCULATE_PREFIX) {
                    Some(expr) => format!("The value of {expr}"),
                    None if t == "ask_user" => "The user's answer".into(),
                    None if description.starts_with(CALL_PREFIX) => format!("The result of {t}"),
                    None => format!(
                        "The current date and time{}",
                        &description[TIME_PREFIX.len()..]
                    ),
                };
                batch.push(id.clone());
                PlanItem {
                    id: id.clone(),
                    description: description.clone(),
                    step_type: "tool",
                    required_tools: vec![t],
                    expected_outcome,
                    dependencies: vec![],
                }
            }
            None if description.starts_with(PART_PREFIX) => {
                batch.push(id.clone());
                PlanItem {
                    id: id.clone(),
                    description: description.clone(),
                    step_type: "reasoning",
                    required_tools: vec![],
                    expected_outcome: PART_OUTCOME.into(),
                    dependencies: vec![],
                }
            }
            None => PlanItem {
                id: id.clone(),
                description: description.clone(),
                step_type: "reasoning",
                required_tools: vec![],
                expected_outcome: "A direct answer to the user's question".into(),
                dependencies: if description.starts_with(ANSWER_PREFIX) {
                    std::mem::take(&mut batch)
                } else {
                    vec![]
                },
            },
        };
        let item = match dependencies {
            Some(deps) => PlanItem {
                dependencies: deps.clone(),
                ..item
            },
            None => item,
        };
        items.push(item);
    }
    items
}

/// The `pes_plan` reply for the query of a planning request: the query's own items (at most the
/// cap), after the items of the refinement note no run started when they fit beside them (the
/// query wins when they do not). Items earlier runs finished are never listed again: they stay
/// in the thread whatever the list says, so a thread's 200th follow-up has the room its first had.
fn plan(req: &ChatRequest) -> Value {
    let query = last_user_text(req).unwrap_or_default();
    let available = available_tools(req);
    let cap = max_items(req).unwrap_or(DEFAULT_MAX_ITEMS);
    let note = read_refinement(req);
    let (mut drafts, answer) = drafts_for(query, &available);
    drafts.truncate(cap.saturating_sub(1));
    let not_started: Vec<NoteEntry> = note
        .entries
        .iter()
        .filter(|e| e.status == ItemStatus::Pending)
        .cloned()
        .collect();
    let mut items = if not_started.len() + drafts.len() < cap {
        rebuild_existing(&not_started)
    } else {
        Vec::new()
    };
    // Fresh ids continue the numbering: past every id the note lists, and past the count of the
    // thread's items (the note shows only the latest ones).
    let highest = note
        .entries
        .iter()
        .filter_map(|e| e.id.strip_prefix("step-")?.parse::<usize>().ok())
        .max()
        .unwrap_or(0);
    let mut next = highest.max(note.earlier_total + not_started.len()) + 1;
    let listed: Vec<String> = note.entries.iter().map(|e| e.id.clone()).collect();
    let mut fresh_id = |items: &[PlanItem]| loop {
        let id = format!("step-{next}");
        next += 1;
        if !items.iter().any(|i| i.id == id) && !listed.contains(&id) {
            return id;
        }
    };
    let mut draft_ids = Vec::new();
    for d in drafts {
        let id = fresh_id(&items);
        draft_ids.push(id.clone());
        items.push(PlanItem {
            id,
            description: d.description,
            step_type: if d.tool.is_some() {
                "tool"
            } else {
                "reasoning"
            },
            required_tools: d.tool.into_iter().collect(),
            expected_outcome: d.expected_outcome,
            dependencies: vec![],
        });
    }
    let id = fresh_id(&items);
    items.push(PlanItem {
        id,
        description: answer.description,
        step_type: "reasoning",
        required_tools: vec![],
        expected_outcome: answer.expected_outcome,
        dependencies: draft_ids,
    });
    let steps: Vec<String> = items
        .iter()
        .enumerate()
        .map(|(i, it)| format!("{}. {}", i + 1, it.description))
        .collect();
    let title = truncate_chars(query.trim(), 60);
    json!({
        "title": if title.is_empty() { "Untitled".to_owned() } else { title },
        "intent": format!(
            "The user wants an answer to: \"{}\" (planned by the offline model, not a real LLM).",
            truncate_chars(query.trim(), MAX_QUOTED_QUERY)
        ),
        "plan": steps.join("\n"),
        "todoList": items.iter().map(PlanItem::to_json).collect::<Vec<_>>(),
    })
}

// Reading the engine's prompts (`prompts::labels` is the contract).

/// The texts of the messages of one role, in order.
fn texts(req: &ChatRequest, role: Role) -> impl DoubleEndedIterator<Item = &str> {
    req.messages
        .iter()
        .filter(move |m| m.role == role)
        .map(|m| m.content.as_deref().unwrap_or(""))
}

/// The last user message: a planning request's query, a compaction request's text.
fn last_user_text(req: &ChatRequest) -> Option<&str> {
    texts(req, Role::User).next_back()
}

/// The first user message: an item's brief, the synthesis brief.
fn first_user_text(req: &ChatRequest) -> &str {
    texts(req, Role::User).next().unwrap_or("")
}

/// The planning cap: the last `Use at most <n> items.` line of the system prompt (the engine's
/// line follows any persona text); `None` when absent or zero.
fn max_items(req: &ChatRequest) -> Option<usize> {
    texts(req, Role::System)
        .flat_map(str::lines)
        .filter_map(|l| {
            l.strip_prefix(labels::MAX_ITEMS)?
                .strip_suffix(" items.")?
                .parse::<usize>()
                .ok()
        })
        .next_back()
        .filter(|&n| n > 0)
}

/// One item of the refinement note.
#[derive(Debug, Clone, PartialEq)]
struct NoteEntry {
    id: String,
    status: ItemStatus,
    description: String,
    /// The `depends on:` line under an item not started yet, when there is one.
    dependencies: Option<Vec<String>>,
}

/// What the offline model reads in the refinement note of a follow-up's planning request.
#[derive(Debug, Default, PartialEq)]
struct Refinement {
    /// The items it lists: the latest finished ones of earlier runs, and the ones not started.
    entries: Vec<NoteEntry>,
    /// Finished items of earlier runs in all (the note shows only the latest).
    earlier_total: usize,
}

/// The refinement note, when the request refines a plan: a user message before the query. Its
/// entries are `- <id> [<status>]: <description>`, a finished one followed by ` (result: …)`, one
/// not started by an indented `depends on: a, b` line when it has dependencies; only lines with
/// a valid id and status are entries. `Finished items of earlier runs: <n> in all, …` gives the
/// count.
fn read_refinement(req: &ChatRequest) -> Refinement {
    let Some(note) = texts(req, Role::User)
        .rev()
        .skip(1)
        .find(|t| t.starts_with(labels::REFINEMENT))
    else {
        return Refinement::default();
    };
    let mut out = Refinement::default();
    for line in note.lines().skip(1) {
        if let Some(count) = line.strip_prefix(labels::EARLIER_ITEMS) {
            out.earlier_total = count
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            continue;
        }
        if let Some(deps) = line
            .strip_prefix("  ")
            .and_then(|l| l.strip_prefix(labels::DEPENDS_ON))
        {
            if let Some(last) = out.entries.last_mut() {
                last.dependencies = Some(
                    deps.split(',')
                        .map(str::trim)
                        .filter(|d| !d.is_empty())
                        .map(str::to_owned)
                        .collect(),
                );
            }
            continue;
        }
        let entry = (|| {
            let (id, rest) = line.strip_prefix("- ")?.split_once(" [")?;
            let (status, rest) = rest.split_once("]: ")?;
            ItemId::parse(id).ok()?;
            let status = status.parse::<ItemStatus>().ok()?;
            let description = rest.split_once(" (result: ").map_or(rest, |(d, _)| d);
            Some(NoteEntry {
                id: id.to_owned(),
                status,
                description: description.to_owned(),
                dependencies: None,
            })
        })();
        out.entries.extend(entry);
    }
    out
}

/// Whether a line of a brief starts the part that follows the query.
fn ends_the_query(line: &str) -> bool {
    line.starts_with(labels::PLAN)
        || line.starts_with(labels::EARLIER_CONTEXT)
        || line == labels::EARLIER_RESULTS
        || line == labels::ITEM_RESULTS
        || line.starts_with(labels::ROLE)
        || line.starts_with(labels::ITEM)
}

/// A brief's query (`User query: …`, which may run over several lines) and the index of the
/// first line after it.
fn brief_query(lines: &[&str]) -> (String, usize) {
    let Some(first) = lines.first().and_then(|l| l.strip_prefix(labels::QUERY)) else {
        return (String::new(), 0);
    };
    let end = lines[1..]
        .iter()
        .position(|l| ends_the_query(l))
        .map_or(lines.len(), |i| i + 1);
    let mut query = vec![first];
    query.extend_from_slice(&lines[1..end]);
    (query.join("\n").trim().to_owned(), end)
}

/// The entries of the results section under `header`, each `<description>: <output>` with the
/// output's line breaks restored. The description and the output stay one text: a description
/// may itself hold `: ` (the answer items' do), so the line cannot say where it ends, and the
/// offline model only ever quotes the two together. A failed or cancelled item's output reads
/// `FAILED (…)` or `CANCELLED (…)`.
fn results_section(lines: &[&str], header: &str) -> Vec<String> {
    let Some(start) = lines.iter().position(|l| *l == header) else {
        return Vec::new();
    };
    let mut entries: Vec<String> = Vec::new();
    for line in &lines[start + 1..] {
        if let Some((_id, text)) = line
            .strip_prefix("- [")
            .and_then(|rest| rest.split_once("] "))
        {
            entries.push(text.to_owned());
        } else if let (Some(more), Some(entry)) = (line.strip_prefix("  "), entries.last_mut()) {
            entry.push('\n');
            entry.push_str(more);
        } else {
            break;
        }
    }
    entries
}

/// What the offline model reads in an item's brief.
#[derive(Debug, Default, PartialEq)]
struct ItemBrief {
    query: String,
    /// The item's id: its tool call ids carry it, so parallel items never share one.
    item_id: String,
    description: String,
    required_tools: Vec<String>,
    /// Entries of `Results of earlier items:` (see [`results_section`]).
    earlier: Vec<String>,
}

/// Read an item brief (`prompts::item_brief`): the query, the results, then, after the role, the
/// last `Your item [<id>]: <description>` line (the description runs until `Expected outcome:` or
/// `Required tools:`), and the required tools.
fn read_item_brief(text: &str) -> ItemBrief {
    let lines: Vec<&str> = text.lines().collect();
    let (query, after_query) = brief_query(&lines);
    let rest = &lines[after_query..];
    let earlier = results_section(rest, labels::EARLIER_RESULTS);
    // The last such line: the plan and the role's fragment come before it and are free text.
    let Some(at) = rest.iter().rposition(|l| l.starts_with(labels::ITEM)) else {
        return ItemBrief {
            query,
            earlier,
            ..Default::default()
        };
    };
    let (item_id, first) = rest[at][labels::ITEM.len()..]
        .split_once("]: ")
        .unwrap_or(("", ""));
    let is_field =
        |l: &&str| l.starts_with(labels::EXPECTED) || l.starts_with(labels::REQUIRED_TOOLS);
    let mut description = vec![first];
    description.extend(rest[at + 1..].iter().take_while(|l| !is_field(l)));
    let required_tools = rest[at + 1..]
        .iter()
        .find_map(|l| l.strip_prefix(labels::REQUIRED_TOOLS))
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    ItemBrief {
        query,
        item_id: item_id.to_owned(),
        description: description.join("\n").trim().to_owned(),
        required_tools,
        earlier,
    }
}

/// The name of the tool a tool call id belongs to, from the assistant messages.
fn tool_name_of<'a>(messages: &'a [ChatMessage], call_id: &str) -> Option<&'a str> {
    messages
        .iter()
        .flat_map(|m| &m.tool_calls)
        .find(|c| c.id == call_id)
        .map(|c| c.name.as_str())
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A sentence for one tool result.
fn describe_tool_result(messages: &[ChatMessage], msg: &ChatMessage) -> String {
    let name = msg
        .tool_call_id
        .as_deref()
        .and_then(|id| tool_name_of(messages, id))
        .unwrap_or("tool");
    let content = msg.content.as_deref().unwrap_or("");
    let parsed: Option<Value> = serde_json::from_str(content).ok();
    match parsed {
        Some(v) if v.get("expression").is_some() && v.get("result").is_some() => {
            format!(
                "{} = {}",
                scalar_text(&v["expression"]),
                scalar_text(&v["result"])
            )
        }
        Some(v) if v.get("iso8601").is_some() => format!(
            "The current time in {} is {}.",
            v.get("timezone").map_or_else(|| "UTC".into(), scalar_text),
            scalar_text(&v["iso8601"])
        ),
        Some(v) if v.get("error").is_some() => {
            format!("The {name} tool failed: {}", scalar_text(&v["error"]))
        }
        _ => format!(
            "The {name} tool returned: {}",
            truncate_chars(content, MAX_QUOTED_QUERY)
        ),
    }
}

/// Execute phase: call the item's tool once, then answer from its result.
fn execute(req: &ChatRequest) -> (Option<String>, Vec<ToolCall>) {
    let results: Vec<&ChatMessage> = req
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .collect();
    if !results.is_empty() {
        let lines: Vec<String> = results
            .iter()
            .map(|m| describe_tool_result(&req.messages, m))
            .collect();
        return (Some(lines.join("\n")), vec![]);
    }
    let offered = |name: &str| req.tools.iter().any(|t| t.name == name);
    let brief = read_item_brief(first_user_text(req));
    let description = brief.description.clone();
    let made_before: usize = req.messages.iter().map(|m| m.tool_calls.len()).sum();
    let mut calls = Vec::new();
    let mut notes = Vec::new();
    for tool in &brief.required_tools {
        let arguments = match tool.as_str() {
            "calculator" => {
                let expr = description
                    .strip_prefix(CALCULATE_PREFIX)
                    .map(|e| e.trim().to_owned())
                    .or_else(|| detect_expressions(&description).into_iter().next());
                match expr {
                    Some(e) => json!({ "expression": e }),
                    None => {
                        notes.push(format!(
                            "I found no expression to calculate in \"{description}\"."
                        ));
                        continue;
                    }
                }
            }
            "ask_user" => json!({
                "question": description.strip_prefix(ASK_PREFIX).unwrap_or(ASK_QUESTION),
                "inputSchema": {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}},
            }),
            "current_time" => match detect_zone(&description) {
                Some(z) => json!({ "timezone": z }),
                None => json!({}),
            },
            other => match called_tool(&description) {
                Some((name, args)) if name == other => args,
                _ => {
                    notes.push(format!(
                        "The offline model cannot use the `{other}` tool unless the query names it."
                    ));
                    continue;
                }
            },
        };
        if !offered(tool) {
            notes.push(format!("The `{tool}` tool is not enabled for this thread."));
            continue;
        }
        calls.push(ToolCall {
            id: format!("call_{}_{}", brief.item_id, made_before + calls.len() + 1),
            name: tool.clone(),
            arguments,
        });
    }
    if !calls.is_empty() {
        return (None, calls);
    }
    if !notes.is_empty() {
        return (Some(notes.join(" ")), vec![]);
    }
    (Some(reasoning_answer(&brief)), vec![])
}

/// A reasoning item's answer. An independent part is answered for itself, whatever else has
/// finished (parts run in parallel, so what they see of each other depends on timing); any other
/// item quotes the earlier results its brief holds.
fn reasoning_answer(brief: &ItemBrief) -> String {
    if let Some(part) = brief.description.strip_prefix(PART_PREFIX) {
        return format!(
            "The offline model cannot work out \"{part}\"; a real model would answer this part here."
        );
    }
    let query = brief.query.trim();
    if brief.earlier.is_empty() {
        format!("Answer to \"{query}\": no earlier step produced a result.")
    } else {
        format!("Answer to \"{query}\": {}", brief.earlier.join("; "))
    }
}

/// An `llm` stage of a flowchart: with a schema, the smallest object that fits it (each required
/// property at its type's plainest value); else the request quoted back.
fn flowchart_stage(req: &ChatRequest) -> String {
    let prompt = last_user_text(req).unwrap_or_default();
    match &req.response_format {
        Some(f) => plainest(&f.schema, prompt).to_string(),
        None => format!(
            "[offline model: not a real LLM] {}",
            truncate_chars(prompt, MAX_QUOTED_QUERY)
        ),
    }
}

/// The plainest value of a schema: the first `enum`/`const` value, `""` (or the prompt for a
/// string), 0, false, [] or an object of the required properties.
fn plainest(schema: &Value, prompt: &str) -> Value {
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    if let Some(first) = schema.get("enum").and_then(|e| e.get(0)) {
        return first.clone();
    }
    let ty = match &schema["type"] {
        Value::String(t) => t.as_str(),
        Value::Array(ts) => ts.first().and_then(Value::as_str).unwrap_or("object"),
        _ if schema.get("properties").is_some() => "object",
        _ => "string",
    };
    match ty {
        "object" => {
            let mut out = serde_json::Map::new();
            let required: Vec<&str> = schema["required"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for name in required {
                out.insert(
                    name.to_owned(),
                    plainest(&schema["properties"][name], prompt),
                );
            }
            Value::Object(out)
        }
        "array" => json!([]),
        "integer" | "number" => json!(0),
        "boolean" => json!(false),
        "null" => Value::Null,
        _ => json!(truncate_chars(prompt, MAX_QUOTED_QUERY)),
    }
}

/// The `pes_synthesis` reply: every item of the synthesis brief, with its output (or why it did
/// not complete).
fn synthesize(req: &ChatRequest) -> Value {
    let lines: Vec<&str> = first_user_text(req).lines().collect();
    let (query, after_query) = brief_query(&lines);
    let results = results_section(&lines[after_query..], labels::ITEM_RESULTS);
    let mut response = String::from(OFFLINE_NOTICE);
    if results.is_empty() {
        response.push_str(&format!("No step produced a result for \"{query}\"."));
    } else {
        response.push_str(&format!("Results for \"{query}\":"));
        for entry in &results {
            response.push_str(&format!("\n- {}", entry.replace('\n', "\n  ")));
        }
    }
    json!({
        "response": response,
        "sources": [],
        "suggestions": [
            "Configure a real model (PES_LLM_BASE_URL, PES_LLM_API_KEY, PES_LLM_MODEL) for real answers."
        ],
    })
}

/// The `pes_compaction` reply: the beginning of the result to compact (the user message after its
/// `Result of item [<id>] …:` line), at most [`MAX_SUMMARY`] bytes. A longer result gets a strict
/// prefix, so the summary is always shorter than what it replaces, in bytes and in characters.
fn compact(req: &ChatRequest) -> Value {
    let text = last_user_text(req).unwrap_or_default();
    let result = match text.split_once('\n') {
        Some((first, rest)) if first.starts_with(labels::TO_COMPACT) => rest,
        _ => text,
    };
    let mut end = result.len().min(MAX_SUMMARY);
    while !result.is_char_boundary(end) {
        end -= 1;
    }
    json!({ "summary": &result[..end] })
}

/// Rough token count: a token per four characters.
fn tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

#[async_trait::async_trait]
impl LlmProvider for OfflineProvider {
    fn name(&self) -> &'static str {
        "offline"
    }

    fn is_offline(&self) -> bool {
        true
    }

    fn default_model(&self) -> Option<&str> {
        Some("offline")
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let (content, tool_calls) = match request.phase {
            Phase::Plan => (Some(plan(&request).to_string()), vec![]),
            Phase::Execute => execute(&request),
            Phase::Synthesize => (Some(synthesize(&request).to_string()), vec![]),
            Phase::Compact => (Some(compact(&request).to_string()), vec![]),
            Phase::Flowchart => (Some(flowchart_stage(&request)), vec![]),
        };
        let prompt_chars: usize = request
            .messages
            .iter()
            .map(|m| {
                m.content.as_deref().map_or(0, str::len)
                    + m.tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.to_string().len())
                        .sum::<usize>()
            })
            .sum();
        let completion_chars = content.as_deref().map_or(0, str::len)
            + tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.to_string().len())
                .sum::<usize>();
        if let Some(text) = &content
            && request.tokens.listening()
        {
            for word in text.split_inclusive(' ') {
                request.tokens.send(word);
            }
        }
        let (prompt_tokens, completion_tokens) = (tokens(prompt_chars), tokens(completion_chars));
        let finish_reason = if tool_calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        Ok(ChatResponse {
            content,
            tool_calls,
            usage: Usage {
                prompt_tokens,
                completion_tokens,
                total_tokens: prompt_tokens + completion_tokens,
                llm_calls: 1,
            },
            finish_reason: Some(finish_reason.into()),
            model: Some("offline".into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::plan::{self, PlanReply};
    use crate::agent::prompts::{self, Brief, Outcome, ResultLine};
    use crate::llm::ToolSpec;
    use crate::model::{AgentConfig, TodoItem, ToolValidationMode};
    use crate::tools::ToolRegistry;

    fn request(phase: Phase, messages: Vec<ChatMessage>) -> ChatRequest {
        ChatRequest {
            phase,
            model: None,
            messages,
            tools: ToolRegistry::with_builtins().specs(None),
            response_format: None,
            tokens: crate::llm::Tokens::none(),
        }
    }

    /// A planning request as the planner builds it: system prompt, history, the refinement note
    /// when a plan exists, then the query.
    fn plan_request(
        query: &str,
        max_items: u32,
        history: &[&str],
        existing: &[TodoItem],
    ) -> ChatRequest {
        let described: Vec<(String, String)> = ToolRegistry::with_builtins()
            .specs(None)
            .into_iter()
            .map(|t| (t.name, t.description))
            .collect();
        let mut messages = vec![ChatMessage::system(prompts::planning_system(
            &AgentConfig::default(),
            &described,
            max_items,
            true,
        ))];
        messages.extend(history.iter().map(|h| ChatMessage::user(*h)));
        if !existing.is_empty() {
            messages.push(ChatMessage::user(note_for(existing)));
        }
        messages.push(ChatMessage::user(query));
        request(Phase::Plan, messages)
    }

    /// The refinement note the planner writes for a thread holding `existing`: its finished
    /// items as earlier runs' (the latest few shown), the pending ones whole.
    fn note_for(existing: &[TodoItem]) -> String {
        let finished: Vec<&TodoItem> = existing
            .iter()
            .filter(|i| i.status != ItemStatus::Pending)
            .collect();
        let skip = finished.len().saturating_sub(prompts::EARLIER_ITEMS_SHOWN);
        let earlier = prompts::Earlier {
            total: finished.len(),
            shown: finished[skip..]
                .iter()
                .map(|i| prompts::EarlierLine::of(i, i.result.as_deref().unwrap_or("")))
                .collect(),
        };
        let pending: Vec<TodoItem> = existing
            .iter()
            .filter(|i| i.status == ItemStatus::Pending)
            .cloned()
            .collect();
        prompts::refinement_note(&earlier, &pending)
    }

    async fn reply(req: ChatRequest) -> Value {
        let r = OfflineProvider::new().complete(req).await.unwrap();
        assert_eq!(r.usage.llm_calls, 1);
        assert!(r.usage.total_tokens > 0);
        serde_json::from_str(r.content.as_deref().unwrap()).unwrap()
    }

    async fn plan_for(query: &str, max_items: u32) -> Value {
        reply(plan_request(query, max_items, &[], &[])).await
    }

    /// The items of an offline plan as the engine stores them (validated), all completed.
    fn completed_items(plan_json: &Value) -> Vec<TodoItem> {
        let reply: PlanReply = serde_json::from_value(plan_json.clone()).unwrap();
        let known = ToolRegistry::with_builtins().names();
        plan::validate(
            &reply.todo_list,
            &[],
            &plan::Rules {
                known_tools: &known,
                roles: None,
                max_items: 20,
            },
        )
        .unwrap()
        .iter()
        .map(|v| {
            let mut it = plan::new_item(v, ToolValidationMode::Advisory);
            it.status = ItemStatus::Completed;
            it.result = Some(format!("done: {}\nsecond line", v.description));
            it
        })
        .collect()
    }

    fn descriptions(plan: &Value) -> Vec<String> {
        plan["todoList"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["description"].as_str().unwrap().to_owned())
            .collect()
    }

    fn completed(id: &str, description: &str, output: &str) -> ResultLine {
        ResultLine {
            id: id.into(),
            description: description.into(),
            outcome: Outcome::Completed(output.into()),
        }
    }

    /// An execution request as the executor builds it: system prompt, then the item's brief.
    fn execute_request(
        query: &str,
        description: &str,
        required_tools: &[&str],
        earlier: Vec<ResultLine>,
    ) -> ChatRequest {
        let required: Vec<String> = required_tools.iter().map(|t| (*t).to_owned()).collect();
        let brief = prompts::item_brief(&Brief {
            query,
            plan: Some("1. Something\n2. Something else"),
            earlier,
            role: Some(("Analyst", "You check numbers.\nYour item [x]: not this one")),
            item_id: "step-9",
            description,
            expected_outcome: Some("An outcome\nover two lines"),
            required_tools: &required,
        });
        request(
            Phase::Execute,
            vec![
                ChatMessage::system(prompts::execution_system(&AgentConfig::default(), true)),
                ChatMessage::user(brief),
            ],
        )
    }

    #[tokio::test]
    async fn a_tool_the_query_names_is_called_with_the_arguments_that_follow() {
        let described = vec![
            ("calculator".to_owned(), "math".to_owned()),
            ("web__echo".to_owned(), "echo".to_owned()),
            ("web__echo_all".to_owned(), "echo all".to_owned()),
            ("web__ping".to_owned(), "ping".to_owned()),
        ];
        let req = request(
            Phase::Plan,
            vec![
                ChatMessage::system(prompts::planning_system(
                    &AgentConfig::default(),
                    &described,
                    10,
                    true,
                )),
                ChatMessage::user(
                    r#"Use web__ping, then call `web__echo` with {"text": "1+1 at 2024-01-02"} and add 2*3"#,
                ),
            ],
        );
        assert_eq!(
            available_tools(&req),
            ["calculator", "web__echo", "web__echo_all", "web__ping"]
        );
        let plan = reply(req).await;
        let items = plan["todoList"].as_array().unwrap();
        let described: Vec<(&str, &Value)> = items
            .iter()
            .map(|i| (i["description"].as_str().unwrap(), &i["requiredTools"]))
            .collect();
        assert_eq!(
            described[..3],
            [
                ("Call the tool web__ping with {}", &json!(["web__ping"])),
                (
                    r#"Call the tool web__echo with {"text":"1+1 at 2024-01-02"}"#,
                    &json!(["web__echo"])
                ),
                ("Calculate 2*3", &json!(["calculator"])),
            ],
            "the arithmetic inside the arguments is not calculated: {plan}"
        );
        assert_eq!(items.len(), 4);
        // Executing the item calls the tool with exactly those arguments.
        let r = OfflineProvider::new()
            .complete(execute_request(
                "q",
                r#"Call the tool web__echo with {"text":"1+1 at 2024-01-02"}"#,
                &["web__echo"],
                vec![],
            ))
            .await
            .unwrap();
        assert_eq!(r.tool_calls.len(), 0, "not offered: {r:?}");
        let mut req = execute_request(
            "q",
            r#"Call the tool web__echo with {"text":"1+1 at 2024-01-02"}"#,
            &["web__echo"],
            vec![],
        );
        req.tools = vec![ToolSpec {
            name: "web__echo".into(),
            description: "echo".into(),
            parameters: json!({"type": "object"}),
        }];
        let r = OfflineProvider::new().complete(req).await.unwrap();
        assert_eq!(r.tool_calls[0].name, "web__echo");
        assert_eq!(
            r.tool_calls[0].arguments,
            json!({"text": "1+1 at 2024-01-02"})
        );
        // A refinement keeps the item as planned.
        let rebuilt = rebuild_existing(&[NoteEntry {
            id: "step-1".into(),
            status: ItemStatus::Pending,
            description: "Call the tool web__ping with {}".into(),
            dependencies: None,
        }]);
        assert_eq!(rebuilt[0].required_tools, ["web__ping"]);
    }

    #[test]
    fn expressions_are_found_in_prose() {
        assert_eq!(
            detect_expressions("what is 12*(3+4) and 2^10?"),
            vec!["12*(3+4)", "2^10"]
        );
        assert_eq!(
            detect_expressions("Compute (1.5 + 2) * 3."),
            vec!["(1.5 + 2) * 3"]
        );
        assert_eq!(detect_expressions("what is -3 + 5"), vec!["-3 + 5"]);
        assert!(detect_expressions("in 2024 I had 3 cats").is_empty());
        assert!(detect_expressions("on 2024-05-01 at 10:30").is_empty());
        assert!(detect_expressions("what is 5% of 200").is_empty());
        assert!(detect_expressions("hello world").is_empty());
    }

    #[test]
    fn zones_are_found() {
        assert_eq!(
            detect_zone("what time is it in Europe/Paris?").as_deref(),
            Some("Europe/Paris")
        );
        assert_eq!(detect_zone("time in utc").as_deref(), Some("UTC"));
        assert_eq!(
            detect_zone("what time is it in Japan").as_deref(),
            Some("Japan")
        );
        assert_eq!(detect_zone("Look up the current time"), None);
        assert_eq!(detect_zone("what is 12/4"), None);
    }

    #[test]
    fn an_item_brief_is_read_through_its_labels() {
        let req = execute_request(
            "what is 2+2\nand more",
            "Compose the answer to: what is 2+2",
            &["calculator", "current_time"],
            vec![
                completed("step-1", "Calculate 2+2", "2+2 = 4\nsecond line"),
                ResultLine {
                    id: "step-2".into(),
                    description: "Ask the user".into(),
                    outcome: Outcome::Failed("no answer".into()),
                },
            ],
        );
        assert_eq!(
            read_item_brief(first_user_text(&req)),
            ItemBrief {
                query: "what is 2+2\nand more".into(),
                item_id: "step-9".into(),
                description: "Compose the answer to: what is 2+2".into(),
                required_tools: vec!["calculator".into(), "current_time".into()],
                earlier: vec![
                    "Calculate 2+2: 2+2 = 4\nsecond line".into(),
                    "Ask the user: FAILED (no answer)".into()
                ],
            }
        );
        assert_eq!(read_item_brief("no labels at all"), ItemBrief::default());
    }

    #[tokio::test]
    async fn a_plan_has_one_item_per_expression_and_a_final_answer() {
        let p = plan_for("what is 12*(3+4) and 2^10", 10).await;
        assert_eq!(p["title"], "what is 12*(3+4) and 2^10");
        assert!(
            p["intent"]
                .as_str()
                .unwrap()
                .contains("what is 12*(3+4) and 2^10")
        );
        let list = p["todoList"].as_array().unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(
            list[0],
            json!({"id": "step-1", "description": "Calculate 12*(3+4)", "stepType": "tool",
                   "requiredTools": ["calculator"], "expectedOutcome": "The value of 12*(3+4)",
                   "dependencies": [], "kind": "leaf", "role": null, "toolAllowlist": null})
        );
        assert_eq!(list[1]["description"], "Calculate 2^10");
        assert_eq!(list[2]["id"], "step-3");
        assert_eq!(list[2]["stepType"], "reasoning");
        assert_eq!(
            list[2]["description"],
            "Compose the answer to: what is 12*(3+4) and 2^10"
        );
        assert_eq!(list[2]["dependencies"], json!(["step-1", "step-2"]));
        assert_eq!(
            p["plan"],
            "1. Calculate 12*(3+4)\n2. Calculate 2^10\n3. Compose the answer to: what is 12*(3+4) and 2^10"
        );
    }

    #[tokio::test]
    async fn a_time_question_plans_a_current_time_step() {
        let p = plan_for("What time is it in Asia/Tokyo?", 10).await;
        let list = p["todoList"].as_array().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(
            list[0]["description"],
            "Look up the current time in Asia/Tokyo"
        );
        assert_eq!(list[0]["requiredTools"], json!(["current_time"]));
        assert_eq!(list[1]["dependencies"], json!(["step-1"]));
        let p = plan_for("tell me a joke", 10).await;
        assert_eq!(
            descriptions(&p),
            vec!["Compose the answer to: tell me a joke"]
        );
    }

    #[tokio::test]
    async fn independent_parts_of_a_query_become_parallel_items() {
        let query =
            "Compare the history of Rome; summarize the causes of WW1; list three prime numbers";
        let p = plan_for(query, 10).await;
        let list = p["todoList"].as_array().unwrap();
        assert_eq!(
            descriptions(&p),
            vec![
                "Answer this part: Compare the history of Rome",
                "Answer this part: summarize the causes of WW1",
                "Answer this part: list three prime numbers",
                &format!("Compose the answer to: {query}"),
            ]
        );
        for part in &list[..3] {
            assert_eq!(part["stepType"], "reasoning");
            assert_eq!(part["requiredTools"], json!([]));
            assert_eq!(part["dependencies"], json!([]), "{part}");
        }
        assert_eq!(
            list[3]["dependencies"],
            json!(["step-1", "step-2", "step-3"])
        );

        // Questions split at `?`; trivial pieces do not count.
        let p = plan_for("Who built the pyramids? Why is the sky blue? Why?", 10).await;
        assert_eq!(
            descriptions(&p)[..2],
            [
                "Answer this part: Who built the pyramids",
                "Answer this part: Why is the sky blue"
            ]
        );
        assert_eq!(descriptions(&p).len(), 3);
        // One real part, or a query with a tool, is planned as before.
        for q in [
            "What is the capital of France? Thanks",
            "what is 2+3? and 4*5?",
        ] {
            let p = plan_for(q, 10).await;
            assert!(
                descriptions(&p).iter().all(|d| !d.starts_with(PART_PREFIX)),
                "{q}: {p}"
            );
        }
        // The cap leaves room for the answer.
        let p = plan_for(query, 3).await;
        assert_eq!(
            p["todoList"][2]["dependencies"],
            json!(["step-1", "step-2"])
        );
    }

    #[tokio::test]
    async fn plans_respect_max_items_and_a_long_query_makes_a_short_title() {
        let p = plan_for("1+1, 2+2, 3+3 and 4+4", 3).await;
        assert_eq!(
            descriptions(&p),
            vec![
                "Calculate 1+1",
                "Calculate 2+2",
                "Compose the answer to: 1+1, 2+2, 3+3 and 4+4"
            ]
        );
        let p = plan_for("1+1 and 2+2", 1).await;
        assert_eq!(descriptions(&p).len(), 1);
        let long = "why ".repeat(40);
        let p = plan_for(&long, 5).await;
        assert!(p["title"].as_str().unwrap().chars().count() <= 61);
        // Without the cap line, the default bound applies.
        let many: Vec<String> = (1..=25).map(|i| format!("{i}+{i}")).collect();
        let mut req = plan_request(&many.join(", "), 5, &[], &[]);
        req.messages[0] = ChatMessage::system("Plan.");
        assert_eq!(max_items(&req), None);
        let p = reply(req).await;
        assert_eq!(descriptions(&p).len(), DEFAULT_MAX_ITEMS);
    }

    #[tokio::test]
    async fn a_follow_up_plans_its_own_items_and_continues_the_numbering() {
        for first_query in [
            "what is 2+2",
            "Who built Rome? Who built Athens?",
            "What time is it in UTC? ask me",
        ] {
            let first = plan_for(first_query, 10).await;
            let items = completed_items(&first);
            let req = plan_request("and 3*3?", 10, &[first_query], &items);
            let note = read_refinement(&req);
            assert_eq!(note.entries.len(), items.len(), "{first_query}");
            assert_eq!(note.earlier_total, items.len());
            let p = reply(req).await;
            let list = p["todoList"].as_array().unwrap();
            let kept = items.len();
            // Finished items are not listed again (they stay whatever the list says); the new
            // query is planned, the previous one (in the history) is not planned again.
            assert_eq!(list.len(), 2, "{p}");
            assert_eq!(list[0]["id"], format!("step-{}", kept + 1));
            assert_eq!(list[0]["description"], "Calculate 3*3");
            assert_eq!(list[1]["id"], format!("step-{}", kept + 2));
            assert_eq!(
                list[1]["dependencies"],
                json!([format!("step-{}", kept + 1)])
            );
            assert_eq!(p["title"], "and 3*3?");
        }
    }

    #[tokio::test]
    async fn items_not_started_are_kept_with_their_dependencies_when_they_fit() {
        let first = plan_for("what is 2+2 and 3+3", 10).await;
        let mut items = completed_items(&first);
        // A cancelled run: the calculations finished, the answer never started.
        let answer = items.len() - 1;
        items[answer].status = ItemStatus::Pending;
        let p = reply(plan_request("and 4*4?", 10, &[], &items)).await;
        let list = p["todoList"].as_array().unwrap();
        assert_eq!(
            list[0], first["todoList"][answer],
            "kept as first planned: {p}"
        );
        assert_eq!(list[0]["dependencies"], json!(["step-1", "step-2"]));
        assert_eq!(
            descriptions(&p)[1..],
            ["Calculate 4*4", "Compose the answer to: and 4*4?"]
        );
        assert_eq!(list[1]["id"], "step-4");
        // When they do not fit beside the new query's items, the query wins.
        let p = reply(plan_request("and 4*4?", 2, &[], &items)).await;
        assert_eq!(
            descriptions(&p),
            ["Calculate 4*4", "Compose the answer to: and 4*4?"]
        );
    }

    #[tokio::test]
    async fn the_200th_follow_up_is_planned_like_the_first() {
        let mut thread: Vec<TodoItem> = Vec::new();
        let mut sizes = Vec::new();
        for n in 1..=200 {
            let query = format!("What is 2+{n}?");
            let req = plan_request(&query, 4, &[], &thread);
            sizes.push(
                req.messages
                    .iter()
                    .map(|m| m.content.as_deref().map_or(0, str::len))
                    .sum::<usize>(),
            );
            let p = reply(req).await;
            assert_eq!(
                descriptions(&p),
                [
                    format!("Calculate 2+{n}"),
                    format!("Compose the answer to: {query}")
                ],
                "run {n}"
            );
            let fresh = completed_items(&p);
            for it in &fresh {
                assert!(
                    thread.iter().all(|t| t.id != it.id),
                    "run {n} reuses {}",
                    it.id
                );
            }
            thread.extend(fresh);
        }
        // The planning prompt stops growing once the note shows its most items (but for the
        // numbers' digits).
        assert!(
            sizes[199] * 10 <= sizes[20] * 11,
            "{} vs {}",
            sizes[199],
            sizes[20]
        );
    }

    #[tokio::test]
    async fn execute_calls_the_tool_then_answers_from_its_result() {
        let offline = OfflineProvider::new();
        let mut request = execute_request(
            "what is 12*(3+4)",
            "Calculate 12*(3+4)",
            &["calculator"],
            vec![],
        );
        let r = offline.complete(request.clone()).await.unwrap();
        assert_eq!(r.content, None);
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "call_step-9_1".into(),
                name: "calculator".into(),
                arguments: json!({"expression": "12*(3+4)"})
            }]
        );
        // Run it for real through the registry, as the agent would.
        let registry = ToolRegistry::with_builtins();
        let ctx = crate::tools::ToolContext {
            tenant: "t".into(),
            thread_id: "th".into(),
            idempotency_key: "k".into(),
        };
        let outcome = registry
            .invoke("calculator", r.tool_calls[0].arguments.clone(), &ctx)
            .await;
        request
            .messages
            .push(ChatMessage::assistant(None, r.tool_calls.clone()));
        request
            .messages
            .push(ChatMessage::tool("call_step-9_1", outcome.to_model_text()));
        let r = offline.complete(request).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("12*(3+4) = 84"));
        assert!(r.tool_calls.is_empty());
    }

    #[tokio::test]
    async fn execute_reports_tool_errors_and_time_results() {
        let mut request = execute_request("1/0", "Calculate 1/0", &["calculator"], vec![]);
        request.messages.push(ChatMessage::assistant(
            None,
            vec![ToolCall {
                id: "call_step-9_1".into(),
                name: "calculator".into(),
                arguments: json!({"expression": "1/0"}),
            }],
        ));
        request.messages.push(ChatMessage::tool(
            "call_step-9_1",
            r#"{"error":"division by zero"}"#,
        ));
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert_eq!(
            r.content.as_deref(),
            Some("The calculator tool failed: division by zero")
        );

        let request = execute_request(
            "time in Europe/Paris",
            "Look up the current time in Europe/Paris",
            &["current_time"],
            vec![],
        );
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert_eq!(r.tool_calls[0].name, "current_time");
        assert_eq!(
            r.tool_calls[0].arguments,
            json!({"timezone": "Europe/Paris"})
        );
    }

    #[tokio::test]
    async fn a_disabled_tool_is_not_called() {
        let mut request = execute_request("2+2", "Calculate 2+2", &["calculator"], vec![]);
        request.tools = vec![ToolSpec {
            name: "current_time".into(),
            description: String::new(),
            parameters: json!({}),
        }];
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert!(r.tool_calls.is_empty());
        assert_eq!(
            r.content.as_deref(),
            Some("The `calculator` tool is not enabled for this thread.")
        );
    }

    #[tokio::test]
    async fn reasoning_items_summarize_previous_outputs() {
        let request = execute_request(
            "what is 2+2",
            "Compose the answer to: what is 2+2",
            &[],
            vec![completed("step-1", "Calculate 2+2", "2+2 = 4")],
        );
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert_eq!(
            r.content.as_deref(),
            Some("Answer to \"what is 2+2\": Calculate 2+2: 2+2 = 4")
        );
        let request = execute_request("hello", "Compose the answer to: hello", &[], vec![]);
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert_eq!(
            r.content.as_deref(),
            Some("Answer to \"hello\": no earlier step produced a result.")
        );
    }

    #[tokio::test]
    async fn a_part_item_answers_its_part_whatever_else_finished() {
        let answer = |earlier: Vec<ResultLine>| async move {
            let request = execute_request(
                "Who built Rome? Who built Athens?",
                "Answer this part: Who built Rome",
                &[],
                earlier,
            );
            let r = OfflineProvider::new().complete(request).await.unwrap();
            r.content.unwrap()
        };
        let alone = answer(vec![]).await;
        assert!(alone.contains("\"Who built Rome\""), "{alone}");
        let after_a_sibling = answer(vec![completed(
            "step-2",
            "Answer this part: Who built Athens",
            "x",
        )])
        .await;
        assert_eq!(alone, after_a_sibling);
    }

    #[tokio::test]
    async fn synthesis_says_it_is_offline_and_includes_every_result() {
        let brief = prompts::synthesis_brief(
            "what is 2+2 and 3*3",
            Some("1. Calculate 2+2\n2. Calculate 3*3"),
            &prompts::Earlier::default(),
            &[
                completed("step-1", "Calculate 2+2", "2+2 = 4"),
                completed("step-2", "Calculate 3*3", "3*3 = 9\nnine"),
                ResultLine {
                    id: "step-3".into(),
                    description: "Look up the current time".into(),
                    outcome: Outcome::Failed("the clock broke".into()),
                },
                ResultLine {
                    id: "step-4".into(),
                    description: "Compose the answer to: what is 2+2 and 3*3".into(),
                    outcome: Outcome::Cancelled("depends on failed item step-3".into()),
                },
            ],
        );
        let request = request(
            Phase::Synthesize,
            vec![
                ChatMessage::system(prompts::synthesis_system(&AgentConfig::default())),
                ChatMessage::user(brief),
            ],
        );
        let offline = OfflineProvider::new();
        assert!(offline.is_offline());
        assert_eq!(offline.name(), "offline");
        let v = reply(request).await;
        assert_eq!(
            v["response"],
            format!(
                "{OFFLINE_NOTICE}Results for \"what is 2+2 and 3*3\":\n\
                 - Calculate 2+2: 2+2 = 4\n\
                 - Calculate 3*3: 3*3 = 9\n  nine\n\
                 - Look up the current time: FAILED (the clock broke)\n\
                 - Compose the answer to: what is 2+2 and 3*3: CANCELLED (depends on failed item step-3)"
            )
        );
        assert_eq!(v["sources"], json!([]));
        assert!(!v["suggestions"].as_array().unwrap().is_empty());

        let empty = prompts::synthesis_brief("hi", None, &prompts::Earlier::default(), &[]);
        let v = reply(request_with_user(Phase::Synthesize, empty)).await;
        assert_eq!(
            v["response"],
            format!("{OFFLINE_NOTICE}No step produced a result for \"hi\".")
        );
    }

    #[tokio::test]
    async fn a_follow_up_is_answered_from_its_own_items_not_the_earlier_ones() {
        let earlier_item = |n: usize| {
            let v = plan::ValidItem {
                id: ItemId::parse(&format!("step-{n}")).unwrap(),
                description: format!("Calculate 2+{n}"),
                step_type: crate::model::StepType::Tool,
                required_tools: vec!["calculator".into()],
                expected_outcome: None,
                dependencies: vec![],
                kind: crate::model::ItemKind::Leaf,
                role: None,
                tool_allowlist: None,
            };
            let mut it = plan::new_item(&v, ToolValidationMode::Advisory);
            it.status = ItemStatus::Completed;
            prompts::EarlierLine::of(&it, &format!("2+{n} = {}\nmore", n + 2))
        };
        let earlier = prompts::Earlier {
            shown: (31..=40).map(earlier_item).collect(),
            total: 40,
        };
        let brief = prompts::synthesis_brief(
            "What is 2+41?",
            None,
            &earlier,
            &[completed("step-41", "Calculate 2+41", "2+41 = 43")],
        );
        assert!(
            brief.contains("40 in all, the last 10 below (30 older ones not shown)"),
            "{brief}"
        );
        assert!(
            brief.contains("- [step-40] Calculate 2+40: 2+40 = 42 more\n"),
            "{brief}"
        );
        let v = reply(request_with_user(Phase::Synthesize, brief)).await;
        assert_eq!(
            v["response"],
            format!("{OFFLINE_NOTICE}Results for \"What is 2+41?\":\n- Calculate 2+41: 2+41 = 43")
        );
    }

    fn request_with_user(phase: Phase, text: String) -> ChatRequest {
        request(
            phase,
            vec![ChatMessage::system("system"), ChatMessage::user(text)],
        )
    }

    async fn summary_of(result: &str) -> String {
        let req = request(
            Phase::Compact,
            vec![
                ChatMessage::system(prompts::compaction_system(1500)),
                ChatMessage::user(prompts::compaction_request("step-1", "Look it up", result)),
            ],
        );
        reply(req).await["summary"].as_str().unwrap().to_owned()
    }

    #[tokio::test]
    async fn compaction_keeps_the_beginning_of_the_result_and_is_always_shorter() {
        // A short result is its own summary, without the request's first line.
        assert_eq!(summary_of("2+2 = 4\nfour").await, "2+2 = 4\nfour");
        // Long results, with multi-byte characters placed so a byte cut would split them.
        for result in [
            "x".repeat(5000),
            "é".repeat(MAX_SUMMARY),
            format!("{}😀", "a".repeat(MAX_SUMMARY - 3)),
            format!("{}😀b", "a".repeat(MAX_SUMMARY - 1)),
        ] {
            let summary = summary_of(&result).await;
            assert!(summary.len() <= MAX_SUMMARY, "{} bytes", summary.len());
            assert!(result.starts_with(&summary));
            assert!(summary.len() < result.len());
            assert!(summary.chars().count() < result.chars().count());
            assert!(!summary.is_empty());
        }
    }

    #[tokio::test]
    async fn the_offline_plan_matches_a_strict_plan_schema() {
        let schema = crate::agent::prompts::plan_schema();
        for q in [
            "what is 2+2 and what time is it",
            "Who built Rome? Who built Athens?",
        ] {
            let p = plan_for(q, 10).await;
            crate::json::schema::validate(&schema, &p).unwrap();
        }
    }
}
