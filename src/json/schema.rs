//! JSON Schema validation on the `jsonschema` crate (full Draft 2020-12, or the draft a schema's
//! `$schema` names), with the service's error wording: every problem as `<JSON Pointer>: <what is
//! wrong>`, so a model (or a client) can fix exactly the value that was wrong.
//!
//! Tool schemas are compiled once, when the tool is registered ([`CompiledSchema`]); schemas that
//! arrive with a request (an `inputSchema`) or per model call are compiled where they are used
//! ([`validate`]). References are resolved within the schema only: nothing is ever fetched from a
//! file or the network while validating.

use std::fmt;

use jsonschema::error::ValidationErrorKind;
use serde_json::Value;

/// At most this many problems are reported for one value (a huge array of bad items would
/// otherwise make a huge message).
const MAX_ERRORS: usize = 20;

/// A schema compiled once and used for every value checked against it.
pub struct CompiledSchema {
    validator: jsonschema::Validator,
}

impl fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CompiledSchema")
    }
}

impl CompiledSchema {
    /// Compile `schema` (formats are asserted, not just annotations: a `format: "email"` that
    /// does not hold is an error).
    ///
    /// # Errors
    /// What is wrong with the schema, naming where (`/properties/x/type: …`).
    pub fn compile(schema: &Value) -> Result<Self, SchemaError> {
        if !matches!(schema, Value::Object(_) | Value::Bool(_)) {
            return Err(SchemaError::NotASchema);
        }
        jsonschema::options()
            .should_validate_formats(true)
            .build(schema)
            .map(|validator| Self { validator })
            .map_err(|e| SchemaError::Invalid {
                // Meta-validation reports where in the schema the problem is as the instance path.
                at: pointer(&e.instance_path().to_string()),
                what: without_instance(&e),
                source: Box::new(e.to_owned()),
            })
    }

    /// Check `value`.
    ///
    /// # Errors
    /// Every problem found (up to twenty), each as `<JSON Pointer>: <what is wrong>`, in
    /// document order.
    pub fn validate(&self, value: &Value) -> Result<(), Vec<String>> {
        let mut errors: Vec<String> = self
            .validator
            .iter_errors(value)
            .take(MAX_ERRORS)
            .map(|e| describe(&e))
            .collect();
        errors.dedup();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// Why a schema cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("a schema must be a JSON object or a boolean")]
    NotASchema,
    /// Meta-validation failed at `at` (a JSON Pointer inside the schema, `/` for its root).
    #[error("schema at {at}: {what}")]
    Invalid {
        at: String,
        /// The validator's message, its quoted value shortened.
        what: String,
        #[source]
        source: Box<jsonschema::ValidationError<'static>>,
    },
}

/// Compile `schema` and check `value` against it, for a schema used once.
///
/// # Errors
/// The schema's own problem (prefixed `invalid schema`) or every problem of `value`.
pub fn validate(schema: &Value, value: &Value) -> Result<(), Vec<String>> {
    CompiledSchema::compile(schema)
        .map_err(|e| vec![format!("invalid schema: {e}")])?
        .validate(value)
}

/// Check that `schema` is a schema this service can validate against (e.g. an `ask_user`
/// `inputSchema` from the model).
///
/// # Errors
/// What is wrong with it, naming where.
pub fn check_schema(schema: &Value) -> Result<(), SchemaError> {
    CompiledSchema::compile(schema).map(drop)
}

/// `<JSON Pointer>: <message>`. A missing property is reported at the property's own path
/// (`/expression: required property is missing`), where a person looks for it; the root is `/`.
fn describe(e: &jsonschema::ValidationError<'_>) -> String {
    let path = e.instance_path().to_string();
    match e.kind() {
        ValidationErrorKind::Required { property } => {
            let name = property
                .as_str()
                .map_or_else(|| property.to_string(), str::to_owned);
            format!(
                "{path}/{}: required property is missing",
                name.replace('~', "~0").replace('/', "~1")
            )
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => unexpected
            .iter()
            .map(|p| {
                format!(
                    "{path}/{}: unknown property (not allowed by the schema)",
                    p.replace('~', "~0").replace('/', "~1")
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        _ => format!("{}: {}", pointer(&path), without_instance(e)),
    }
}

/// The root pointer (`""`) shown as `/`.
fn pointer(path: &str) -> String {
    if path.is_empty() {
        "/".into()
    } else {
        path.to_owned()
    }
}

/// The crate's message with the offending value shortened: a huge string or array that failed a
/// bound would otherwise be quoted whole.
fn without_instance(e: &jsonschema::ValidationError<'_>) -> String {
    let text = e.to_string();
    crate::text::truncate(&text, 300)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_json_path() {
        let schema = json!({
            "type": "object",
            "properties": {
                "expression": {"type": "string"},
                "email": {"type": "string", "format": "email"},
                "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "items": {"type": "array", "items": {"$ref": "#/$defs/n"}}
            },
            "$defs": {"n": {"type": "integer", "minimum": 0}},
            "required": ["expression"],
            "additionalProperties": false
        });
        let c = CompiledSchema::compile(&schema).unwrap();
        assert!(c.validate(&json!({"expression": "1"})).is_ok());
        let errors = c
            .validate(&json!({"email": "nope", "code": "abc", "items": [1, -2], "x": 1}))
            .unwrap_err();
        let all = errors.join("\n");
        assert!(
            all.contains("/expression: required property is missing"),
            "{all}"
        );
        assert!(all.contains("/email: "), "{all}");
        assert!(all.contains("/code: "), "{all}");
        assert!(all.contains("/items/1: "), "{all}");
        assert!(all.contains("/x: unknown property"), "{all}");
    }

    #[test]
    fn all_of_not_and_refs_are_enforced() {
        let schema = json!({
            "allOf": [{"type": "object"}, {"required": ["a"]}],
            "not": {"required": ["b"]}
        });
        assert!(validate(&schema, &json!({"a": 1})).is_ok());
        assert!(validate(&schema, &json!({"a": 1, "b": 2})).is_err());
        assert!(validate(&schema, &json!({})).is_err());
    }

    #[test]
    fn bad_schemas_are_refused_without_fetching() {
        assert!(check_schema(&json!({"type": "x"})).is_err());
        assert!(check_schema(&json!("string")).is_err());
        let remote = check_schema(&json!({"$ref": "https://example.com/s.json"}));
        assert!(remote.is_err(), "{remote:?}");
        assert!(check_schema(&json!({"type": "object"})).is_ok());
        assert!(check_schema(&json!(true)).is_ok());
    }

    #[test]
    fn a_huge_value_is_not_quoted_whole() {
        let long = "x".repeat(10_000);
        let errors = validate(&json!({"maxLength": 3}), &json!(long)).unwrap_err();
        assert!(errors[0].len() < 400, "{}", errors[0].len());
    }
}
