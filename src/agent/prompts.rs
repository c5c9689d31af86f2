//! Prompts and JSON Schemas of the three phases. The schemas (`pes_plan`, `pes_synthesis`,
//! `update_plan`) are a fixed wire contract between the engine and whatever model serves it: any
//! OpenAI-compatible model, and any test double (the offline model reads the same labels), can
//! serve them, so they change only together with their readers.

use serde_json::{Value, json};

use crate::model::{AgentConfig, ItemStatus, TodoItem};

/// Schema name of the planning reply.
pub const PLAN_SCHEMA_NAME: &str = "pes_plan";
/// Schema name of the synthesis reply.
pub const SYNTHESIS_SCHEMA_NAME: &str = "pes_synthesis";
/// Schema name of the compaction reply.
pub const COMPACTION_SCHEMA_NAME: &str = "pes_compaction";
/// The tool through which the model may change the items not yet started.
pub const UPDATE_PLAN_TOOL: &str = "update_plan";

fn todo_item_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["id", "description", "stepType", "requiredTools", "expectedOutcome", "dependencies", "kind", "role", "toolAllowlist"],
        "properties": {
            "id": {"type": "string", "description": "Unique id, 1-64 characters of A-Za-z0-9_.-"},
            "description": {"type": "string"},
            "stepType": {"type": "string", "enum": ["tool", "reasoning"]},
            "requiredTools": {"type": "array", "items": {"type": "string"}},
            "expectedOutcome": {"type": "string"},
            "dependencies": {"type": "array", "items": {"type": "string"}},
            "kind": {"type": ["string", "null"], "enum": ["leaf", "team", null],
                     "description": "team: a sub-goal planned into its own items when it is ready; leaf (or null) otherwise"},
            "role": {"type": ["string", "null"], "description": "A role id, or null"},
            "toolAllowlist": {"type": ["array", "null"], "items": {"type": "string"},
                              "description": "Tools the item may call (requiredTools among them); null = every available tool"}
        }
    })
}

/// `pes_plan`: `{title, intent, plan, todoList}`.
pub fn plan_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["title", "intent", "plan", "todoList"],
        "properties": {
            "title": {"type": "string"},
            "intent": {"type": "string"},
            "plan": {"type": "string"},
            "todoList": {"type": "array", "items": todo_item_schema()}
        }
    })
}

/// `pes_synthesis`: `{response, sources, suggestions}`. OpenAI's strict mode wants every property
/// required, so "no sources" is an empty array (or null, which the engine reads as empty).
pub fn synthesis_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["response", "sources", "suggestions"],
        "properties": {
            "response": {"type": "string"},
            "sources": {
                "type": ["array", "null"],
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["title", "url"],
                    "properties": {"title": {"type": "string"}, "url": {"type": "string"}}
                }
            },
            "suggestions": {"type": ["array", "null"], "items": {"type": "string"}}
        }
    })
}

/// `pes_compaction`: `{summary}`, the hand-off of a long item result to the items that read it.
pub fn compaction_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["summary"],
        "properties": {"summary": {"type": "string"}}
    })
}

/// System prompt of a compaction request.
pub fn compaction_system(max_chars: usize) -> String {
    format!(
        "You compact the result of one item of a plan into a hand-off for the items that build on \
         it. Keep every fact, number, name and source they may need; drop repetition and \
         narration. Use at most {max_chars} characters. Reply with a JSON object {{summary}}."
    )
}

/// The user message of a compaction request: the item and its full result.
pub fn compaction_request(item_id: &str, description: &str, result: &str) -> String {
    format!("{}{item_id}] {description}:\n{result}", labels::TO_COMPACT)
}

/// Every schema the service sends to a model as a structured-output format or a tool's
/// parameters, by name: the strict-mode test walks them all, so a schema added here cannot break
/// OpenAI's `strict: true` rules unnoticed.
pub fn sent_schemas() -> Vec<(&'static str, Value)> {
    vec![
        (PLAN_SCHEMA_NAME, plan_schema()),
        (SYNTHESIS_SCHEMA_NAME, synthesis_schema()),
        (COMPACTION_SCHEMA_NAME, compaction_schema()),
        (UPDATE_PLAN_TOOL, update_plan_parameters()),
    ]
}

/// Arguments of `update_plan`: the full new list of items not yet started.
pub fn update_plan_parameters() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["todoList"],
        "properties": {"todoList": {"type": "array", "items": todo_item_schema()}}
    })
}

fn persona_line(
    cfg: &AgentConfig,
    pick: impl Fn(&crate::model::PersonaPrompts) -> Option<&String>,
) -> String {
    let mut out = String::new();
    if let Some(sp) = &cfg.system_prompt {
        out.push_str(sp);
        out.push_str("\n\n");
    }
    if let Some(p) = &cfg.persona {
        if let Some(name) = &p.name {
            out.push_str(&format!("You are {name}.\n"));
        }
        if let Some(extra) = pick(&p.prompts) {
            out.push_str(extra);
            out.push('\n');
        }
    }
    out
}

/// System prompt of the planning phase.
pub fn planning_system(
    cfg: &AgentConfig,
    tools: &[(String, String)],
    max_items: u32,
    teams: bool,
) -> String {
    let mut s = persona_line(cfg, |p| p.planning.as_ref());
    s.push_str(
        "You plan how to answer the user's query. Break the work into a short todo list of \
         concrete items. Each item has a unique id (1-64 characters of A-Za-z0-9_.-), a \
         description, a stepType (`tool` when it needs tools, `reasoning` when it needs only \
         thinking), requiredTools (names of tools the item must call), an expectedOutcome, and \
         dependencies (ids of items whose results it needs). Dependencies must form no cycle. \
         Items that do not need each other's results have no dependency between them: they run \
         at the same time. toolAllowlist may narrow the tools an item may call (null: all).\n",
    );
    if teams {
        s.push_str(
            "An item of kind `team` is a larger sub-goal: it is planned into its own items when it \
             is ready. Use it only for work that needs several steps of its own; otherwise kind \
             is `leaf` (or null).\n",
        );
    } else {
        s.push_str("Every item is of kind `leaf` (or null): no teams.\n");
    }
    match cfg.roles.as_ref().filter(|r| !r.is_empty()) {
        None => s.push_str("No roles: role is null.\n"),
        Some(roles) => {
            s.push_str("Roles you may give an item (role id: name, what it does):\n");
            for (id, r) in roles {
                s.push_str(&format!(
                    "- {id}: {}, {}{}\n",
                    r.name,
                    truncate(&r.system_prompt_fragment, 200),
                    r.tools
                        .as_ref()
                        .map(|t| format!(" (tools: {})", t.join(", ")))
                        .unwrap_or_default()
                ));
            }
        }
    }
    s.push_str(&format!("Use at most {max_items} items.\n"));
    if tools.is_empty() {
        s.push_str("No tools are available.\n");
    } else {
        s.push_str(labels::AVAILABLE_TOOLS);
        s.push('\n');
        for (name, desc) in tools {
            // One line per tool, whatever the server wrote: a description over several lines
            // would read as the end of the list.
            let desc = desc.split_whitespace().collect::<Vec<_>>().join(" ");
            s.push_str(&format!("- {name}: {desc}\n"));
        }
    }
    s.push_str("Reply with a JSON object {title, intent, plan, todoList}.");
    s
}

/// Earlier runs' items a follow-up's planning prompt shows (the most recent ones), one line each:
/// a thread's 200th follow-up is planned from a prompt the size of its 2nd's. Older items stay in
/// the thread's state; the prompt says how many it leaves out.
pub const EARLIER_ITEMS_SHOWN: usize = 8;
/// Earlier runs' items the synthesis (and an item with `contextMode` `all`) shows, as context: the
/// answer is made of this run's items, earlier ones only help it refer to what came before.
pub const EARLIER_ITEMS_IN_SYNTHESIS: usize = 4;
/// Characters of an earlier item's compacted output its line keeps.
pub const EARLIER_OUTPUT_CHARS: usize = 300;
/// Characters of an earlier item's description its line keeps.
pub const EARLIER_DESCRIPTION_CHARS: usize = 200;

/// What a prompt shows of the items earlier runs finished: the latest few (see
/// [`EARLIER_ITEMS_SHOWN`]), each cut to one line, and how many there are in all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Earlier {
    /// The latest earlier items, oldest first, as results-section lines (outputs already cut).
    pub shown: Vec<EarlierLine>,
    /// Earlier items in all (shown ones included).
    pub total: usize,
}

/// One earlier item as a prompt shows it: `- <id> [<status>]: <description> (result: <output>)`
/// in the refinement note, `- [<id>] <description>: <output>` in the synthesis brief.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlierLine {
    pub id: String,
    pub status: ItemStatus,
    pub description: String,
    /// The compacted output (or why it did not complete), on one line, cut.
    pub output: String,
}

impl EarlierLine {
    /// The line of a finished item, `output` being its compacted output when it completed, else
    /// why it did not: description and output each on one line, cut to
    /// [`EARLIER_DESCRIPTION_CHARS`] and [`EARLIER_OUTPUT_CHARS`].
    pub fn of(it: &TodoItem, output: &str) -> Self {
        Self {
            id: it.id.to_string(),
            status: it.status,
            description: truncate(&one_line(&it.description), EARLIER_DESCRIPTION_CHARS),
            output: truncate(&one_line(output), EARLIER_OUTPUT_CHARS),
        }
    }
}

/// `text` with its line breaks (and the blanks around them) turned into single spaces.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Earlier {
    /// Earlier items the prompt leaves out.
    pub fn omitted(&self) -> usize {
        self.total.saturating_sub(self.shown.len())
    }

    /// `<total> in all, the last <k> below[ (<n> older ones not shown)]`.
    fn count_line(&self) -> String {
        let mut s = format!("{} in all, the last {} below", self.total, self.shown.len());
        if self.omitted() > 0 {
            s.push_str(&format!(" ({} older ones not shown)", self.omitted()));
        }
        s
    }
}

/// The note that tells the planner a thread already has a plan: a bounded summary of what
/// earlier runs did ([`Earlier`]), as context, and whole the items of this run not started yet
/// (a replan for steering: a new list keeps them only by listing them again; a follow-up's first
/// plan has none, as earlier runs' items are never its work). Finished items stay in the thread
/// whether the new list names them or not, so the planner plans only this query's items, and
/// `maxItems` bounds those.
pub fn refinement_note(earlier: &Earlier, pending: &[TodoItem]) -> String {
    use labels::*;
    let mut s = format!(
        "{REFINEMENT} Plan the new query: return the todo list of the items this query needs. \
         The items of earlier runs are context, not work: they stay as they are whether you list \
         them or not (listing one changes nothing), and an item may depend on a completed one by \
         its id; new items need ids not used in this thread. Items not started yet are dropped \
         unless you list them again with their ids.\n"
    );
    if earlier.total > 0 {
        s.push_str(&format!("{EARLIER_ITEMS}{}:\n", earlier.count_line()));
        for l in &earlier.shown {
            s.push_str(&format!(
                "- {} [{}]: {} (result: {})\n",
                l.id, l.status, l.description, l.output
            ));
        }
    }
    if !pending.is_empty() {
        s.push_str(&format!("{NOT_STARTED}\n"));
        for it in pending {
            s.push_str(&format!(
                "- {} [{}]: {}\n",
                it.id, it.status, it.description
            ));
            if !it.dependencies.is_empty() {
                let deps: Vec<&str> = it.dependencies.iter().map(|d| d.as_str()).collect();
                s.push_str(&format!("  {DEPENDS_ON}{}\n", deps.join(", ")));
            }
        }
    }
    s
}

/// System prompt of one item's ReAct loop.
pub fn execution_system(cfg: &AgentConfig, may_update_plan: bool) -> String {
    let mut s = persona_line(cfg, |p| p.execution.as_ref());
    s.push_str(
        "You execute one item of a plan. Call tools when they help; when you have the item's \
         result, answer with it in plain text (no tool call).",
    );
    if may_update_plan {
        s.push_str(&format!(
            " If the remaining plan must change, call `{UPDATE_PLAN_TOOL}` with the full new list \
             of items not yet started."
        ));
    }
    s
}

/// System prompt of the synthesis phase.
pub fn synthesis_system(cfg: &AgentConfig) -> String {
    let mut s = persona_line(cfg, |p| p.synthesis.as_ref());
    s.push_str(
        "You write the final answer to the user's query from the results of the plan's items \
         (this run's). Earlier items of the thread, when listed, are context only: answer the \
         query, not the earlier ones. Reply with a JSON object {response, sources, suggestions}.",
    );
    s
}

/// The labels of the briefs the engine writes: a contract with every reader of the prompts (the
/// offline model first), kept below the engine in [`crate::llm::labels`].
pub use crate::llm::labels;

/// How a finished item reads in a results section.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Completed(String),
    Failed(String),
    Cancelled(String),
}

/// One line of a results section: `- [<id>] <description>: <output>`, with `FAILED (<why>)` or
/// `CANCELLED (<why>)` as the output of an item that did not complete. Line breaks inside an output
/// continue on lines indented by two spaces, so every entry starts with `- [`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultLine {
    pub id: String,
    pub description: String,
    pub outcome: Outcome,
}

/// A results section (`header`, then one [`ResultLine`] each), empty when there are none.
pub fn results_section(header: &str, lines: &[ResultLine]) -> String {
    if lines.is_empty() {
        return String::new();
    }
    let mut s = format!("{header}\n");
    for l in lines {
        let text = match &l.outcome {
            Outcome::Completed(t) => t.clone(),
            Outcome::Failed(t) => format!("FAILED ({t})"),
            Outcome::Cancelled(t) => format!("CANCELLED ({t})"),
        };
        s.push_str(&format!(
            "- [{}] {}: {}\n",
            l.id,
            l.description,
            text.trim_end().replace('\n', "\n  ")
        ));
    }
    s
}

/// What an item's first user message says.
#[derive(Debug, Clone, Default)]
pub struct Brief<'a> {
    pub query: &'a str,
    pub plan: Option<&'a str>,
    /// Results the item may read (see `contextMode`).
    pub earlier: Vec<ResultLine>,
    /// The role's name and prompt fragment.
    pub role: Option<(&'a str, &'a str)>,
    pub item_id: &'a str,
    pub description: &'a str,
    pub expected_outcome: Option<&'a str>,
    pub required_tools: &'a [String],
}

/// The first user message of an item's conversation.
pub fn item_brief(b: &Brief<'_>) -> String {
    use labels::*;
    let mut s = format!("{QUERY}{}\n", b.query);
    if let Some(p) = b.plan {
        s.push_str(&format!("{PLAN}{p}\n"));
    }
    s.push_str(&results_section(EARLIER_RESULTS, &b.earlier));
    if let Some((name, fragment)) = b.role {
        s.push_str(&format!("\n{ROLE}{name}\n{fragment}\n"));
    }
    s.push_str(&format!("\n{ITEM}{}]: {}\n", b.item_id, b.description));
    if let Some(e) = b.expected_outcome {
        s.push_str(&format!("{EXPECTED}{e}\n"));
    }
    if !b.required_tools.is_empty() {
        s.push_str(&format!(
            "{REQUIRED_TOOLS}{}\n",
            b.required_tools.join(", ")
        ));
    }
    s
}

/// The user message of the synthesis request: the query, the plan, a bounded summary of what
/// earlier runs did (context only, see [`Earlier`]), then the results of this run's items, the
/// ones the answer is made of.
pub fn synthesis_brief(
    query: &str,
    plan: Option<&str>,
    earlier: &Earlier,
    results: &[ResultLine],
) -> String {
    use labels::*;
    let mut s = format!("{QUERY}{query}\n");
    if let Some(p) = plan {
        s.push_str(&format!("{PLAN}{p}\n"));
    }
    if earlier.total > 0 {
        s.push_str(&format!("{EARLIER_CONTEXT}{}:\n", earlier.count_line()));
        for l in &earlier.shown {
            s.push_str(&format!("- [{}] {}: {}\n", l.id, l.description, l.output));
        }
    }
    if results.is_empty() {
        s.push_str(&format!("{ITEM_RESULTS}\n(none)\n"));
    } else {
        s.push_str(&results_section(ITEM_RESULTS, results));
    }
    s
}

/// At most `max` characters of `s` (on a character boundary), with an ellipsis when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "hé…");
        assert_eq!(truncate("abc", 3), "abc");
    }

    #[test]
    fn every_sent_schema_is_valid_for_openai_strict_mode() {
        for (name, schema) in sent_schemas() {
            let problems = crate::llm::strict_mode_violations(&schema);
            assert!(problems.is_empty(), "{name}: {problems:#?}");
        }
    }

    #[test]
    fn the_strict_mode_check_catches_what_openai_refuses() {
        let open =
            json!({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}});
        assert!(!crate::llm::strict_mode_violations(&open).is_empty());
        let optional = json!({"type": "object", "additionalProperties": false, "required": [],
            "properties": {"a": {"type": "string"}}});
        assert!(!crate::llm::strict_mode_violations(&optional).is_empty());
        let nested = json!({"type": "object", "additionalProperties": false, "required": ["a"],
            "properties": {"a": {"type": "array", "items": {"type": "object", "properties": {}}}}});
        assert!(!crate::llm::strict_mode_violations(&nested).is_empty());
        let unsupported = json!({"type": "object", "additionalProperties": false, "required": ["a"],
            "properties": {"a": {"type": "string", "minLength": 1}}});
        assert!(!crate::llm::strict_mode_violations(&unsupported).is_empty());
    }
}
