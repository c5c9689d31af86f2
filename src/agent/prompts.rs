//! Prompts and JSON Schemas of the three phases. The schemas are the fixed wire contract of
//! DESIGN §3 (`pes_plan`, `pes_synthesis`, `update_plan`): any OpenAI-compatible model, and any test
//! double, can serve them.

use serde_json::{Value, json};

use crate::model::{AgentConfig, TodoItem};

/// Schema name of the planning reply.
pub const PLAN_SCHEMA_NAME: &str = "pes_plan";
/// Schema name of the synthesis reply.
pub const SYNTHESIS_SCHEMA_NAME: &str = "pes_synthesis";
/// The tool through which the model may change the items not yet started.
pub const UPDATE_PLAN_TOOL: &str = "update_plan";

fn todo_item_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["id", "description", "stepType", "requiredTools", "expectedOutcome", "dependencies"],
        "properties": {
            "id": {"type": "string", "description": "Unique id, 1-64 characters of A-Za-z0-9_.-"},
            "description": {"type": "string"},
            "stepType": {"type": "string", "enum": ["tool", "reasoning"]},
            "requiredTools": {"type": "array", "items": {"type": "string"}},
            "expectedOutcome": {"type": "string"},
            "dependencies": {"type": "array", "items": {"type": "string"}}
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

/// Every schema the service sends to a model as a structured-output format or a tool's
/// parameters, by name: the strict-mode test walks them all, so a schema added here cannot break
/// OpenAI's `strict: true` rules unnoticed.
pub fn sent_schemas() -> Vec<(&'static str, Value)> {
    vec![
        (PLAN_SCHEMA_NAME, plan_schema()),
        (SYNTHESIS_SCHEMA_NAME, synthesis_schema()),
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
pub fn planning_system(cfg: &AgentConfig, tools: &[(String, String)], max_items: u32) -> String {
    let mut s = persona_line(cfg, |p| p.planning.as_ref());
    s.push_str(
        "You plan how to answer the user's query. Break the work into a short todo list of \
         concrete items. Each item has a unique id (1-64 characters of A-Za-z0-9_.-), a \
         description, a stepType (`tool` when it needs tools, `reasoning` when it needs only \
         thinking), requiredTools (names of tools the item must call), an expectedOutcome, and \
         dependencies (ids of items whose results it needs). Dependencies must form no cycle.\n",
    );
    s.push_str(&format!("Use at most {max_items} items.\n"));
    if tools.is_empty() {
        s.push_str("No tools are available.\n");
    } else {
        s.push_str("Available tools:\n");
        for (name, desc) in tools {
            s.push_str(&format!("- {name}: {desc}\n"));
        }
    }
    s.push_str("Reply with a JSON object {title, intent, plan, todoList}.");
    s
}

/// The existing todo list shown to the planner when it refines a plan.
pub fn refinement_note(items: &[TodoItem]) -> String {
    let mut s = String::from(
        "This thread already has a plan. Refine it for the new query: return the FULL new todo \
         list. Keep the ids of items you keep; completed items stay completed and keep their ids. \
         Current todo list:\n",
    );
    for it in items {
        s.push_str(&format!(
            "- {} [{}]: {}{}\n",
            it.id,
            it.status,
            it.description,
            it.result
                .as_deref()
                .map(|r| format!(" (result: {})", truncate(r, 300)))
                .unwrap_or_default()
        ));
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
        "You write the final answer to the user's query from the results of the plan's items. \
         Reply with a JSON object {response, sources, suggestions}.",
    );
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
