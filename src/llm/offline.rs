//! The `offline` provider: deterministic, no network, the default when no model is configured,
//! so a new user sees the whole Plan-Execute-Synthesize pipeline (plan, tool calls, results,
//! synthesis) work end to end. It is NOT a language model and says so: the service warns at start
//! when it is the default provider, every run it serves says so in `RUN_STARTED`, and every
//! synthesized response starts with [`OFFLINE_NOTICE`].
//!
//! It never parses prose: it reads [`RequestHints`](super::RequestHints) (`phase`, the query, the
//! item being executed, the step outputs) and the tool results in the messages. The only text it
//! looks into is the query, for arithmetic expressions (checked with the calculator's own parser)
//! and for a question about the time.

use serde_json::{Value, json};

use super::{ChatMessage, ChatRequest, ChatResponse, LlmError, LlmProvider, Phase, Role, ToolCall};
use crate::model::Usage;
use crate::tools::builtin::{evaluate, parse_timezone};

/// Prefix of every synthesized response of the offline model.
pub const OFFLINE_NOTICE: &str = "[offline model: not a real LLM] ";

/// Items a plan holds when the hints give no bound.
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
    required_tools: Vec<&'static str>,
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
        })
    }
}

/// A new item's content before it gets an id.
struct Draft {
    description: String,
    tool: Option<&'static str>,
    expected_outcome: String,
}

const ANSWER_PREFIX: &str = "Compose the answer to: ";
const CALCULATE_PREFIX: &str = "Calculate ";
const TIME_PREFIX: &str = "Look up the current time";
const ASK_PREFIX: &str = "Ask the user: ";
/// The question the offline model asks when a query says "ask me".
const ASK_QUESTION: &str = "What should I know to answer?";

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

/// New items for a query: one per arithmetic expression, one for the time, then the answer.
fn drafts_for(query: &str) -> (Vec<Draft>, Draft) {
    let mut tools: Vec<Draft> = detect_expressions(query)
        .into_iter()
        .map(|expr| Draft {
            description: format!("{CALCULATE_PREFIX}{expr}"),
            tool: Some("calculator"),
            expected_outcome: format!("The value of {expr}"),
        })
        .collect();
    if asks_for_time(query) {
        let zone = detect_zone(query);
        let suffix = zone.map(|z| format!(" in {z}")).unwrap_or_default();
        tools.push(Draft {
            description: format!("{TIME_PREFIX}{suffix}"),
            tool: Some("current_time"),
            expected_outcome: format!("The current date and time{suffix}"),
        });
    }
    if wants_a_question(query) {
        tools.push(Draft {
            description: format!("{ASK_PREFIX}{ASK_QUESTION}"),
            tool: Some("ask_user"),
            expected_outcome: "The user's answer".into(),
        });
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

/// What an existing item must have been, from its description alone (the offline model wrote
/// it); answer items depend on the tool items since the previous answer, as when first planned.
fn rebuild_existing(existing: &[(String, String, String)]) -> Vec<PlanItem> {
    let mut items = Vec::new();
    let mut batch: Vec<String> = Vec::new();
    for (id, description, _status) in existing {
        let tool = if description.starts_with(CALCULATE_PREFIX) {
            Some("calculator")
        } else if description.starts_with(TIME_PREFIX) {
            Some("current_time")
        } else if description.starts_with(ASK_PREFIX) {
            Some("ask_user")
        } else {
            None
        };
        let item = match tool {
            Some(t) => {
                // The same expected outcome as when the item was first planned.
                let expected_outcome = match description.strip_prefix(CALCULATE_PREFIX) {
                    Some(expr) => format!("The value of {expr}"),
                    None if t == "ask_user" => "The user's answer".into(),
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
        items.push(item);
    }
    items
}

/// The `pes_plan` reply for the hints.
fn plan(req: &ChatRequest) -> Value {
    let hints = &req.hints;
    let query = query_of(req);
    let cap = match hints.max_items {
        0 => DEFAULT_MAX_ITEMS,
        n => n as usize,
    };
    let mut items = rebuild_existing(&hints.existing_items);
    let room = cap.saturating_sub(items.len());
    if room > 0 {
        let (mut tools, answer) = drafts_for(&query);
        tools.truncate(room - 1);
        let highest = items
            .iter()
            .filter_map(|i| i.id.strip_prefix("step-")?.parse::<usize>().ok())
            .max()
            .unwrap_or(0);
        let mut next = items.len().max(highest) + 1;
        let mut fresh_id = |items: &[PlanItem]| loop {
            let id = format!("step-{next}");
            next += 1;
            if !items.iter().any(|i| i.id == id) {
                return id;
            }
        };
        let mut tool_ids = Vec::new();
        for d in tools {
            let id = fresh_id(&items);
            tool_ids.push(id.clone());
            items.push(PlanItem {
                id,
                description: d.description,
                step_type: "tool",
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
            dependencies: tool_ids,
        });
    }
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

/// The run's query: from the hints, else the last user message.
fn query_of(req: &ChatRequest) -> String {
    if !req.hints.query.trim().is_empty() {
        return req.hints.query.clone();
    }
    req.messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .and_then(|m| m.content.clone())
        .unwrap_or_default()
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
    let hints = &req.hints;
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
    let description = hints.item_description.clone().unwrap_or_default();
    let made_before: usize = req.messages.iter().map(|m| m.tool_calls.len()).sum();
    let mut calls = Vec::new();
    let mut notes = Vec::new();
    for tool in &hints.required_tools {
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
            other => {
                notes.push(format!("The offline model cannot use the `{other}` tool."));
                continue;
            }
        };
        if !offered(tool) {
            notes.push(format!("The `{tool}` tool is not enabled for this thread."));
            continue;
        }
        calls.push(ToolCall {
            id: format!("call_{}", made_before + calls.len() + 1),
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
    (Some(reasoning_answer(req)), vec![])
}

/// A reasoning item's answer: the previous step outputs (from the hints, else the context the
/// agent put in the user messages).
fn reasoning_answer(req: &ChatRequest) -> String {
    let query = query_of(req);
    if !req.hints.step_outputs.is_empty() {
        let parts: Vec<String> = req
            .hints
            .step_outputs
            .iter()
            .map(|(d, r)| format!("{d}: {r}"))
            .collect();
        return format!("Answer to \"{}\": {}", query.trim(), parts.join("; "));
    }
    let context: Vec<&str> = req
        .messages
        .iter()
        .filter(|m| m.role == Role::User)
        .filter_map(|m| m.content.as_deref())
        .filter(|c| c.trim() != query.trim())
        .collect();
    if context.is_empty() {
        format!(
            "Answer to \"{}\": no earlier step produced a result.",
            query.trim()
        )
    } else {
        format!(
            "Answer to \"{}\", based on: {}",
            query.trim(),
            truncate_chars(&context.join("\n"), 1500)
        )
    }
}

/// The `pes_synthesis` reply.
fn synthesize(req: &ChatRequest) -> Value {
    let query = query_of(req);
    let mut response = String::from(OFFLINE_NOTICE);
    if req.hints.step_outputs.is_empty() {
        response.push_str(&format!(
            "No step produced a result for \"{}\".",
            query.trim()
        ));
    } else {
        response.push_str(&format!("Results for \"{}\":", query.trim()));
        for (description, result) in &req.hints.step_outputs {
            response.push_str(&format!("\n- {description}: {result}"));
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

/// The `pes_compaction` reply: the conversation's text, truncated.
fn compact(req: &ChatRequest) -> Value {
    let mut parts: Vec<String> = req
        .hints
        .step_outputs
        .iter()
        .map(|(d, r)| format!("{d}: {r}"))
        .collect();
    parts.extend(
        req.messages
            .iter()
            .filter(|m| m.role != Role::System)
            .filter_map(|m| m.content.clone())
            .filter(|c| !c.trim().is_empty()),
    );
    json!({ "summary": super::truncate(&parts.join("\n"), MAX_SUMMARY) })
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
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{RequestHints, ToolSpec};
    use crate::tools::ToolRegistry;

    fn req(phase: Phase, hints: RequestHints) -> ChatRequest {
        ChatRequest {
            phase,
            model: None,
            messages: vec![
                ChatMessage::system("system"),
                ChatMessage::user(hints.query.clone()),
            ],
            tools: ToolRegistry::with_builtins().specs(None),
            response_format: None,
            hints,
        }
    }

    async fn plan_for(query: &str, max_items: u32, existing: Vec<(&str, &str)>) -> Value {
        let hints = RequestHints {
            query: query.into(),
            max_items,
            existing_items: existing
                .into_iter()
                .map(|(i, d)| (i.into(), d.into(), "completed".into()))
                .collect(),
            ..Default::default()
        };
        let r = OfflineProvider::new()
            .complete(req(Phase::Plan, hints))
            .await
            .unwrap();
        assert_eq!(r.usage.llm_calls, 1);
        assert!(r.usage.total_tokens > 0);
        serde_json::from_str(r.content.as_deref().unwrap()).unwrap()
    }

    fn descriptions(plan: &Value) -> Vec<String> {
        plan["todoList"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["description"].as_str().unwrap().to_owned())
            .collect()
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

    #[tokio::test]
    async fn a_plan_has_one_item_per_expression_and_a_final_answer() {
        let p = plan_for("what is 12*(3+4) and 2^10", 10, vec![]).await;
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
                   "dependencies": []})
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
        let p = plan_for("What time is it in Asia/Tokyo?", 10, vec![]).await;
        let list = p["todoList"].as_array().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(
            list[0]["description"],
            "Look up the current time in Asia/Tokyo"
        );
        assert_eq!(list[0]["requiredTools"], json!(["current_time"]));
        assert_eq!(list[1]["dependencies"], json!(["step-1"]));
        let p = plan_for("tell me a joke", 10, vec![]).await;
        assert_eq!(
            descriptions(&p),
            vec!["Compose the answer to: tell me a joke"]
        );
    }

    #[tokio::test]
    async fn plans_respect_max_items_and_a_long_query_makes_a_short_title() {
        let p = plan_for("1+1, 2+2, 3+3 and 4+4", 3, vec![]).await;
        assert_eq!(
            descriptions(&p),
            vec![
                "Calculate 1+1",
                "Calculate 2+2",
                "Compose the answer to: 1+1, 2+2, 3+3 and 4+4"
            ]
        );
        let p = plan_for("1+1 and 2+2", 1, vec![]).await;
        assert_eq!(descriptions(&p).len(), 1);
        let long = "why ".repeat(40);
        let p = plan_for(&long, 5, vec![]).await;
        assert!(p["title"].as_str().unwrap().chars().count() <= 61);
    }

    #[tokio::test]
    async fn refinement_keeps_existing_items_and_continues_the_numbering() {
        let first = plan_for("what is 2+2", 10, vec![]).await;
        let existing: Vec<(String, String)> = first["todoList"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                (
                    i["id"].as_str().unwrap().into(),
                    i["description"].as_str().unwrap().into(),
                )
            })
            .collect();
        let refs: Vec<(&str, &str)> = existing
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let p = plan_for("and 3*3?", 10, refs).await;
        let list = p["todoList"].as_array().unwrap();
        // The kept items are exactly as first planned.
        assert_eq!(list[..2], first["todoList"].as_array().unwrap()[..]);
        assert_eq!(list[2]["id"], "step-3");
        assert_eq!(list[2]["description"], "Calculate 3*3");
        assert_eq!(list[3]["id"], "step-4");
        assert_eq!(list[3]["dependencies"], json!(["step-3"]));
    }

    #[tokio::test]
    async fn execute_calls_the_tool_then_answers_from_its_result() {
        let hints = RequestHints {
            query: "what is 12*(3+4)".into(),
            item_description: Some("Calculate 12*(3+4)".into()),
            required_tools: vec!["calculator".into()],
            ..Default::default()
        };
        let offline = OfflineProvider::new();
        let mut request = req(Phase::Execute, hints);
        let r = offline.complete(request.clone()).await.unwrap();
        assert_eq!(r.content, None);
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "call_1".into(),
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
            .push(ChatMessage::tool("call_1", outcome.to_model_text()));
        let r = offline.complete(request).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("12*(3+4) = 84"));
        assert!(r.tool_calls.is_empty());
    }

    #[tokio::test]
    async fn execute_reports_tool_errors_and_time_results() {
        let mut request = req(
            Phase::Execute,
            RequestHints {
                query: "1/0".into(),
                item_description: Some("Calculate 1/0".into()),
                required_tools: vec!["calculator".into()],
                ..Default::default()
            },
        );
        request.messages.push(ChatMessage::assistant(
            None,
            vec![ToolCall {
                id: "call_1".into(),
                name: "calculator".into(),
                arguments: json!({"expression": "1/0"}),
            }],
        ));
        request.messages.push(ChatMessage::tool(
            "call_1",
            r#"{"error":"division by zero"}"#,
        ));
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert_eq!(
            r.content.as_deref(),
            Some("The calculator tool failed: division by zero")
        );

        let request = req(
            Phase::Execute,
            RequestHints {
                query: "time in Europe/Paris".into(),
                item_description: Some("Look up the current time in Europe/Paris".into()),
                required_tools: vec!["current_time".into()],
                ..Default::default()
            },
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
        let mut request = req(
            Phase::Execute,
            RequestHints {
                query: "2+2".into(),
                item_description: Some("Calculate 2+2".into()),
                required_tools: vec!["calculator".into()],
                ..Default::default()
            },
        );
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
        let request = req(
            Phase::Execute,
            RequestHints {
                query: "what is 2+2".into(),
                item_description: Some("Compose the answer to: what is 2+2".into()),
                step_outputs: vec![("Calculate 2+2".into(), "2+2 = 4".into())],
                ..Default::default()
            },
        );
        let r = OfflineProvider::new().complete(request).await.unwrap();
        assert_eq!(
            r.content.as_deref(),
            Some("Answer to \"what is 2+2\": Calculate 2+2: 2+2 = 4")
        );
    }

    #[tokio::test]
    async fn synthesis_says_it_is_offline_and_includes_every_result() {
        let request = req(
            Phase::Synthesize,
            RequestHints {
                query: "what is 2+2 and 3*3".into(),
                step_outputs: vec![
                    ("Calculate 2+2".into(), "2+2 = 4".into()),
                    ("Calculate 3*3".into(), "3*3 = 9".into()),
                ],
                ..Default::default()
            },
        );
        let offline = OfflineProvider::new();
        assert!(offline.is_offline());
        assert_eq!(offline.name(), "offline");
        let r = offline.complete(request).await.unwrap();
        let v: Value = serde_json::from_str(r.content.as_deref().unwrap()).unwrap();
        let response = v["response"].as_str().unwrap();
        assert!(response.starts_with(OFFLINE_NOTICE));
        assert!(response.contains("2+2 = 4") && response.contains("3*3 = 9"));
        assert_eq!(v["sources"], json!([]));
        assert!(!v["suggestions"].as_array().unwrap().is_empty());
    }

    #[tokio::test]
    async fn compaction_is_a_truncated_summary() {
        let mut request = req(Phase::Compact, RequestHints::default());
        request.messages.push(ChatMessage::user("x".repeat(5000)));
        let r = OfflineProvider::new().complete(request).await.unwrap();
        let v: Value = serde_json::from_str(r.content.as_deref().unwrap()).unwrap();
        assert!(v["summary"].as_str().unwrap().len() <= MAX_SUMMARY + 3);
    }

    #[tokio::test]
    async fn the_offline_plan_matches_a_strict_plan_schema() {
        let schema = json!({
            "type": "object",
            "properties": {
                "title": {"type": "string"}, "intent": {"type": "string"}, "plan": {"type": "string"},
                "todoList": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"}, "description": {"type": "string"},
                        "stepType": {"enum": ["tool", "reasoning"]},
                        "requiredTools": {"type": "array", "items": {"type": "string"}},
                        "expectedOutcome": {"type": "string"},
                        "dependencies": {"type": "array", "items": {"type": "string"}}
                    },
                    "required": ["id", "description", "stepType", "requiredTools", "expectedOutcome", "dependencies"],
                    "additionalProperties": false
                }}
            },
            "required": ["title", "intent", "plan", "todoList"],
            "additionalProperties": false
        });
        let p = plan_for("what is 2+2 and what time is it", 10, vec![]).await;
        crate::tools::schema::validate(&schema, &p).unwrap();
    }
}
