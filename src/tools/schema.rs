//! A small JSON-Schema validator for the subset our tool schemas, the agent's structured-output
//! schemas and client-supplied `inputSchema`s use: `type` (one name or a list), `properties`,
//! `required`, `additionalProperties` (bool or schema), `items`, `enum`, `const`, the numeric
//! bounds, `minLength`/`maxLength`, `minItems`/`maxItems`, `anyOf` and `oneOf`. Unknown keywords
//! (`description`, `pattern`, `format`, …) are ignored, so a richer schema still validates what we
//! understand of it.
//!
//! Every error names the JSON Pointer of the offending value (`/expression: expected string, got
//! number`), so the model (or a client) can fix exactly what was wrong. Validation never panics and
//! is bounded in depth.

use serde_json::{Map, Value};

/// Type names `type` may use.
const KNOWN_TYPES: &[&str] = &[
    "object", "string", "number", "integer", "boolean", "array", "null",
];

/// Deepest schema nesting we follow; deeper schemas or values report an error instead of
/// recursing further.
const MAX_DEPTH: usize = 64;

/// Validate `value` against `schema`.
///
/// # Errors
/// Every problem found, each as `<json pointer>: <what is wrong>` (the root is `/`).
pub fn validate(schema: &Value, value: &Value) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    validate_at(schema, value, "", 0, &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// A minimal sanity check of a schema a client supplies (e.g. an `ask_user` `inputSchema`): it
/// must be an object (or a boolean), `type` must name known types, and nested schemas
/// (`properties`, `items`, `additionalProperties`, `anyOf`, `oneOf`) must be schemas too.
///
/// # Errors
/// The first problem found, naming where it is.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    check_at(schema, "", 0)
}

fn display_path(path: &str) -> &str {
    if path.is_empty() { "/" } else { path }
}

/// Escape a property name as a JSON Pointer token.
fn child_path(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// The JSON type name of a value, as a schema would spell it (`integer` for whole numbers).
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if is_integer(n) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integer(n: &serde_json::Number) -> bool {
    n.is_i64()
        || n.is_u64()
        || n.as_f64()
            .is_some_and(|f| f.is_finite() && f.fract() == 0.0)
}

fn matches_type(name: &str, value: &Value) -> bool {
    match name {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => matches!(value, Value::Number(n) if is_integer(n)),
        // An unknown type name never matches (check_schema refuses such schemas up front).
        _ => false,
    }
}

/// JSON equality where `1` and `1.0` are the same number.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

fn short(value: &Value) -> String {
    let s = value.to_string();
    if s.chars().count() > 60 {
        let cut: String = s.chars().take(57).collect();
        format!("{cut}...")
    } else {
        s
    }
}

fn validate_at(schema: &Value, value: &Value, path: &str, depth: usize, errors: &mut Vec<String>) {
    let here = display_path(path);
    if depth > MAX_DEPTH {
        errors.push(format!("{here}: nested too deeply to validate"));
        return;
    }
    let obj = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            errors.push(format!("{here}: no value is allowed here"));
            return;
        }
        Value::Object(obj) => obj,
        // Not a schema: nothing we can check (check_schema refuses these).
        _ => return,
    };

    if let Some(t) = obj.get("type") {
        let names: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !names.is_empty() && !names.iter().any(|n| matches_type(n, value)) {
            errors.push(format!(
                "{here}: expected {}, got {}",
                names.join(" or "),
                type_name(value)
            ));
            // The remaining keywords talk about a type the value does not have.
            return;
        }
    }

    if let Some(allowed) = obj.get("enum").and_then(Value::as_array)
        && !allowed.iter().any(|a| json_eq(a, value))
    {
        let list: Vec<String> = allowed.iter().map(short).collect();
        errors.push(format!(
            "{here}: {} is not one of {}",
            short(value),
            list.join(", ")
        ));
    }
    if let Some(expected) = obj.get("const")
        && !json_eq(expected, value)
    {
        errors.push(format!(
            "{here}: expected {}, got {}",
            short(expected),
            short(value)
        ));
    }

    match value {
        Value::Number(n) => check_number(obj, n, here, errors),
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(min) = obj.get("minLength").and_then(Value::as_u64)
                && len < min
            {
                errors.push(format!(
                    "{here}: must be at least {min} characters long, got {len}"
                ));
            }
            if let Some(max) = obj.get("maxLength").and_then(Value::as_u64)
                && len > max
            {
                errors.push(format!(
                    "{here}: must be at most {max} characters long, got {len}"
                ));
            }
        }
        Value::Array(items) => {
            let len = items.len() as u64;
            if let Some(min) = obj.get("minItems").and_then(Value::as_u64)
                && len < min
            {
                errors.push(format!("{here}: must have at least {min} items, got {len}"));
            }
            if let Some(max) = obj.get("maxItems").and_then(Value::as_u64)
                && len > max
            {
                errors.push(format!("{here}: must have at most {max} items, got {len}"));
            }
            if let Some(item_schema) = obj.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate_at(item_schema, item, &format!("{path}/{i}"), depth + 1, errors);
                }
            }
        }
        Value::Object(map) => check_object(obj, map, path, depth, errors),
        Value::Null | Value::Bool(_) => {}
    }

    if let Some(branches) = obj.get("anyOf").and_then(Value::as_array) {
        let mut first_errors = None;
        let mut ok = false;
        for branch in branches {
            match validate_branch(branch, value, path, depth) {
                Ok(()) => {
                    ok = true;
                    break;
                }
                Err(e) => {
                    first_errors.get_or_insert(e);
                }
            }
        }
        if !ok && !branches.is_empty() {
            let detail = first_errors.map(|e| e.join("; ")).unwrap_or_default();
            errors.push(format!(
                "{here}: does not match any of the allowed schemas (first: {detail})"
            ));
        }
    }
    if let Some(branches) = obj.get("oneOf").and_then(Value::as_array) {
        let matching = branches
            .iter()
            .filter(|b| validate_branch(b, value, path, depth).is_ok())
            .count();
        if matching == 0 && !branches.is_empty() {
            errors.push(format!("{here}: does not match any of the allowed schemas"));
        } else if matching > 1 {
            errors.push(format!(
                "{here}: matches {matching} of the schemas where exactly one is allowed"
            ));
        }
    }
}

fn validate_branch(
    branch: &Value,
    value: &Value,
    path: &str,
    depth: usize,
) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    validate_at(branch, value, path, depth + 1, &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn check_number(
    obj: &Map<String, Value>,
    n: &serde_json::Number,
    here: &str,
    errors: &mut Vec<String>,
) {
    let Some(x) = n.as_f64() else { return };
    let bound = |key: &str| obj.get(key).and_then(Value::as_f64);
    if let Some(min) = bound("minimum")
        && x < min
    {
        errors.push(format!("{here}: must be at least {min}, got {n}"));
    }
    if let Some(max) = bound("maximum")
        && x > max
    {
        errors.push(format!("{here}: must be at most {max}, got {n}"));
    }
    if let Some(min) = bound("exclusiveMinimum")
        && x <= min
    {
        errors.push(format!("{here}: must be greater than {min}, got {n}"));
    }
    if let Some(max) = bound("exclusiveMaximum")
        && x >= max
    {
        errors.push(format!("{here}: must be less than {max}, got {n}"));
    }
}

fn check_object(
    obj: &Map<String, Value>,
    map: &Map<String, Value>,
    path: &str,
    depth: usize,
    errors: &mut Vec<String>,
) {
    let properties = obj.get("properties").and_then(Value::as_object);
    if let Some(required) = obj.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(name) {
                errors.push(format!(
                    "{}: required property is missing",
                    child_path(path, name)
                ));
            }
        }
    }
    for (key, v) in map {
        let p = child_path(path, key);
        if let Some(prop_schema) = properties.and_then(|p| p.get(key)) {
            validate_at(prop_schema, v, &p, depth + 1, errors);
        } else {
            match obj.get("additionalProperties") {
                Some(Value::Bool(false)) => {
                    errors.push(format!("{p}: unknown property"));
                }
                Some(extra @ Value::Object(_)) => validate_at(extra, v, &p, depth + 1, errors),
                _ => {}
            }
        }
    }
}

fn check_at(schema: &Value, path: &str, depth: usize) -> Result<(), String> {
    let here = if path.is_empty() { "schema" } else { path };
    if depth > MAX_DEPTH {
        return Err(format!("{here}: nested too deeply"));
    }
    let obj = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(obj) => obj,
        other => {
            return Err(format!(
                "{here}: a schema must be a JSON object, got {}",
                type_name(other)
            ));
        }
    };
    if let Some(t) = obj.get("type") {
        let names: Vec<&Value> = match t {
            Value::Array(list) if !list.is_empty() => list.iter().collect(),
            Value::String(_) => vec![t],
            _ => {
                return Err(format!(
                    "{here}/type: must be a type name or a non-empty list of type names"
                ));
            }
        };
        for n in names {
            match n.as_str() {
                Some(s) if KNOWN_TYPES.contains(&s) => {}
                _ => {
                    return Err(format!(
                        "{here}/type: unknown type {} (expected one of: {})",
                        short(n),
                        KNOWN_TYPES.join(", ")
                    ));
                }
            }
        }
    }
    if let Some(props) = obj.get("properties") {
        let Some(props) = props.as_object() else {
            return Err(format!("{here}/properties: must be an object"));
        };
        for (k, v) in props {
            check_at(v, &child_path(&format!("{path}/properties"), k), depth + 1)?;
        }
    }
    if let Some(req) = obj.get("required")
        && !req
            .as_array()
            .is_some_and(|a| a.iter().all(Value::is_string))
    {
        return Err(format!("{here}/required: must be a list of property names"));
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = obj.get(key) {
            check_at(sub, &format!("{path}/{key}"), depth + 1)?;
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(sub) = obj.get(key) {
            let Some(list) = sub.as_array().filter(|l| !l.is_empty()) else {
                return Err(format!("{here}/{key}: must be a non-empty list of schemas"));
            };
            for (i, s) in list.iter().enumerate() {
                check_at(s, &format!("{path}/{key}/{i}"), depth + 1)?;
            }
        }
    }
    if let Some(e) = obj.get("enum")
        && !e.is_array()
    {
        return Err(format!("{here}/enum: must be a list of values"));
    }
    for key in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
        if let Some(v) = obj.get(key)
            && !v.is_number()
        {
            return Err(format!("{here}/{key}: must be a number"));
        }
    }
    for key in ["minLength", "maxLength", "minItems", "maxItems"] {
        if let Some(v) = obj.get(key)
            && v.as_u64().is_none()
        {
            return Err(format!("{here}/{key}: must be a non-negative integer"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errs(schema: Value, value: Value) -> Vec<String> {
        validate(&schema, &value).expect_err("expected the value to be invalid")
    }

    #[test]
    fn a_matching_value_is_valid() {
        let schema = json!({
            "type": "object",
            "properties": {
                "expression": {"type": "string", "minLength": 1},
                "n": {"type": "integer", "minimum": 0},
                "tags": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["expression"],
            "additionalProperties": false
        });
        validate(
            &schema,
            &json!({"expression": "1+1", "n": 3, "tags": ["a"]}),
        )
        .unwrap();
        validate(&schema, &json!({"expression": "x", "n": 3.0})).unwrap();
    }

    #[test]
    fn a_wrong_type_names_the_path() {
        let schema = json!({"type": "object", "properties": {"expression": {"type": "string"}}});
        assert_eq!(
            errs(schema, json!({"expression": 3})),
            vec!["/expression: expected string, got integer"]
        );
        assert_eq!(
            errs(json!({"type": "object"}), json!("x")),
            vec!["/: expected object, got string"]
        );
        assert_eq!(
            errs(json!({"type": "integer"}), json!(1.5)),
            vec!["/: expected integer, got number"]
        );
    }

    #[test]
    fn every_problem_is_reported() {
        let schema = json!({
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "number"}},
            "required": ["a", "b", "c"],
            "additionalProperties": false
        });
        let e = errs(schema, json!({"a": 1, "z": true}));
        assert!(
            e.contains(&"/a: expected string, got integer".to_string()),
            "{e:?}"
        );
        assert!(
            e.contains(&"/b: required property is missing".to_string()),
            "{e:?}"
        );
        assert!(
            e.contains(&"/c: required property is missing".to_string()),
            "{e:?}"
        );
        assert!(e.contains(&"/z: unknown property".to_string()), "{e:?}");
        assert_eq!(e.len(), 4);
    }

    #[test]
    fn type_lists_and_null() {
        let schema = json!({"type": ["string", "null"]});
        validate(&schema, &json!(null)).unwrap();
        validate(&schema, &json!("x")).unwrap();
        assert_eq!(
            errs(schema, json!(1)),
            vec!["/: expected string or null, got integer"]
        );
        validate(&json!({"type": "number"}), &json!(2)).unwrap();
        validate(&json!({"type": "boolean"}), &json!(false)).unwrap();
    }

    #[test]
    fn additional_properties_may_be_a_schema() {
        let schema = json!({"type": "object", "additionalProperties": {"type": "integer"}});
        validate(&schema, &json!({"x": 1, "y": 2})).unwrap();
        assert_eq!(
            errs(schema, json!({"x": "1"})),
            vec!["/x: expected integer, got string"]
        );
    }

    #[test]
    fn nested_arrays_report_item_indexes() {
        let schema = json!({
            "type": "object",
            "properties": {"todoList": {"type": "array", "minItems": 1, "items": {
                "type": "object",
                "properties": {"id": {"type": "string"}, "dependencies": {"type": "array", "items": {"type": "string"}}},
                "required": ["id"]
            }}}
        });
        let e = errs(
            schema.clone(),
            json!({"todoList": [{"id": "a"}, {"dependencies": [1]}]}),
        );
        assert_eq!(
            e,
            vec![
                "/todoList/1/id: required property is missing",
                "/todoList/1/dependencies/0: expected string, got integer"
            ]
        );
        assert_eq!(
            errs(schema, json!({"todoList": []})),
            vec!["/todoList: must have at least 1 items, got 0"]
        );
    }

    #[test]
    fn enum_and_const() {
        let schema = json!({"enum": ["tool", "reasoning"]});
        validate(&schema, &json!("tool")).unwrap();
        assert_eq!(
            errs(schema, json!("other")),
            vec![r#"/: "other" is not one of "tool", "reasoning""#]
        );
        validate(&json!({"const": 1}), &json!(1.0)).unwrap();
        assert_eq!(
            errs(json!({"const": "a"}), json!("b")),
            vec![r#"/: expected "a", got "b""#]
        );
    }

    #[test]
    fn numeric_and_length_bounds() {
        let s = json!({"type": "number", "minimum": 1, "maximum": 10});
        validate(&s, &json!(1)).unwrap();
        validate(&s, &json!(10)).unwrap();
        assert_eq!(
            errs(s.clone(), json!(0)),
            vec!["/: must be at least 1, got 0"]
        );
        assert_eq!(
            errs(s, json!(10.5)),
            vec!["/: must be at most 10, got 10.5"]
        );
        let s = json!({"exclusiveMinimum": 0, "exclusiveMaximum": 1});
        validate(&s, &json!(0.5)).unwrap();
        assert_eq!(errs(s.clone(), json!(0)).len(), 1);
        assert_eq!(errs(s, json!(1)).len(), 1);
        let s = json!({"type": "string", "minLength": 2, "maxLength": 3});
        validate(&s, &json!("héé")).unwrap();
        assert_eq!(
            errs(s.clone(), json!("a")),
            vec!["/: must be at least 2 characters long, got 1"]
        );
        assert_eq!(
            errs(s, json!("abcd")),
            vec!["/: must be at most 3 characters long, got 4"]
        );
        let s = json!({"type": "array", "maxItems": 1});
        assert_eq!(
            errs(s, json!([1, 2])),
            vec!["/: must have at most 1 items, got 2"]
        );
    }

    #[test]
    fn any_of_and_one_of() {
        let s = json!({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]});
        validate(&s, &json!("x")).unwrap();
        validate(&s, &json!(3)).unwrap();
        let e = errs(s, json!(-1));
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("/: does not match any of the allowed schemas"),
            "{e:?}"
        );
        let s = json!({"oneOf": [{"type": "number"}, {"type": "integer"}]});
        validate(&s, &json!(1.5)).unwrap();
        assert_eq!(
            errs(s, json!(2)),
            vec!["/: matches 2 of the schemas where exactly one is allowed"]
        );
    }

    #[test]
    fn unknown_keywords_and_boolean_schemas() {
        validate(
            &json!({"type": "string", "pattern": "^a$", "format": "email"}),
            &json!("b"),
        )
        .unwrap();
        validate(&json!(true), &json!({"any": 1})).unwrap();
        assert_eq!(
            errs(json!(false), json!(1)),
            vec!["/: no value is allowed here"]
        );
        validate(&json!({}), &json!([1, "a"])).unwrap();
    }

    #[test]
    fn property_names_are_escaped_in_paths() {
        let s = json!({"type": "object", "properties": {"a/b": {"type": "string"}}});
        assert_eq!(
            errs(s, json!({"a/b": 1})),
            vec!["/a~1b: expected string, got integer"]
        );
    }

    #[test]
    fn check_schema_accepts_reasonable_schemas() {
        check_schema(&json!({
            "type": "object",
            "properties": {"answer": {"type": ["string", "null"]}, "n": {"type": "integer", "minimum": 0}},
            "required": ["answer"],
            "additionalProperties": false,
            "anyOf": [{"required": ["answer"]}]
        }))
        .unwrap();
        check_schema(&json!({})).unwrap();
        check_schema(&json!(true)).unwrap();
    }

    #[test]
    fn check_schema_refuses_broken_schemas() {
        assert_eq!(
            check_schema(&json!("object")).unwrap_err(),
            "schema: a schema must be a JSON object, got string"
        );
        let e = check_schema(&json!({"type": "text"})).unwrap_err();
        assert!(e.starts_with("schema/type: unknown type \"text\""), "{e}");
        let e = check_schema(&json!({"properties": {"a": {"type": "float"}}})).unwrap_err();
        assert!(e.starts_with("/properties/a/type: unknown type"), "{e}");
        assert!(check_schema(&json!({"required": "a"})).is_err());
        assert!(check_schema(&json!({"properties": []})).is_err());
        assert!(check_schema(&json!({"items": 3})).is_err());
        assert!(check_schema(&json!({"anyOf": []})).is_err());
        assert!(check_schema(&json!({"minLength": -1})).is_err());
    }

    #[test]
    fn deep_values_do_not_overflow_the_stack() {
        let mut schema = json!({"type": "integer"});
        for _ in 0..200 {
            schema = json!({"type": "array", "items": schema});
        }
        let mut value = json!(1);
        for _ in 0..200 {
            value = json!([value]);
        }
        let e = errs(schema.clone(), value);
        assert!(e[0].contains("nested too deeply"), "{e:?}");
        assert!(check_schema(&schema).is_err());
    }
}
