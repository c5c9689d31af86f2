//! OpenAI's rules for `strict: true` structured outputs, as a checker over a JSON Schema: every
//! object lists all its properties in `required` and says `additionalProperties: false`, only the
//! supported keywords appear, and nesting stays within the limit. A schema that breaks them is
//! refused by OpenAI with a 400, so the service would pay a second call without the schema; the
//! unit tests run every schema the service sends through this check.

use serde_json::Value;

/// Keywords OpenAI's strict mode accepts (annotations included).
const SUPPORTED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "description",
    "title",
    "pattern",
    "format",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "minItems",
    "maxItems",
];

/// Nesting levels strict mode allows.
const MAX_DEPTH: usize = 10;

/// What makes `schema` unacceptable to OpenAI's strict mode, one line each with its JSON path;
/// empty when it is acceptable.
pub fn strict_mode_violations(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        out.push("$: the root must be `type: object`".into());
    }
    walk(schema, "$", 0, &mut out);
    out
}

fn walk(node: &Value, path: &str, depth: usize, out: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        out.push(format!("{path}: a schema must be an object"));
        return;
    };
    if depth > MAX_DEPTH {
        out.push(format!("{path}: nested deeper than {MAX_DEPTH} levels"));
    }
    for key in obj.keys() {
        if !SUPPORTED.contains(&key.as_str()) {
            out.push(format!("{path}: keyword `{key}` is not supported"));
        }
    }
    let typed = ["type", "anyOf", "$ref", "enum", "const"]
        .iter()
        .any(|k| obj.contains_key(*k));
    if !typed {
        out.push(format!("{path}: no `type`"));
    }
    let is_object = match obj.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => obj.contains_key("properties"),
    };
    if is_object {
        if obj.get("additionalProperties") != Some(&Value::Bool(false)) {
            out.push(format!("{path}: `additionalProperties` must be false"));
        }
        let props = obj.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for name in props.into_iter().flat_map(|p| p.keys()) {
            if !required.contains(&name.as_str()) {
                out.push(format!(
                    "{path}: property `{name}` is not in `required` (make it nullable instead)"
                ));
            }
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            walk(sub, &format!("{path}.properties.{name}"), depth + 1, out);
        }
    }
    if let Some(items) = obj.get("items") {
        walk(items, &format!("{path}.items"), depth + 1, out);
    }
    {
        let key = "anyOf";
        for (i, sub) in obj
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            walk(sub, &format!("{path}.{key}[{i}]"), depth + 1, out);
        }
    }
    if let Some(defs) = obj.get("$defs").and_then(Value::as_object) {
        for (name, sub) in defs {
            walk(sub, &format!("{path}.$defs.{name}"), depth + 1, out);
        }
    }
}
