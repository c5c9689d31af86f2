//! An `llm` stage of a flowchart: the plainest value that fits the stage's schema.

use serde_json::{Value, json};

use super::read::last_user_text;
use super::{MAX_QUOTED_QUERY, truncate_chars};
use crate::llm::ChatRequest;

/// An `llm` stage of a flowchart: with a schema, the smallest object that fits it (each required
/// property at its type's plainest value); else the request quoted back.
pub(super) fn flowchart_stage(req: &ChatRequest) -> String {
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
