//! Structured output over any [`LlmProvider`]: send a request with a `response_format` JSON
//! schema, pull the JSON object out of the reply (tolerating code fences and stray prose), check
//! it against the schema with our validator, and give the model exactly one repair attempt with
//! the validation errors before failing with [`LlmError::InvalidStructured`], which quotes what
//! the model returned. Usage of every call made is summed in the returned response.

use serde_json::Value;

use super::{ChatMessage, ChatRequest, ChatResponse, LlmError, LlmProvider, truncate};
use crate::json::schema;

/// How much of a bad reply [`LlmError::InvalidStructured`] quotes.
const MAX_RETURNED: usize = 500;
/// At most this many `{` positions are tried when looking for a JSON object inside prose.
const MAX_OBJECT_STARTS: usize = 64;

/// The JSON value in a model's reply: the whole text when it is JSON; else the content of a
/// ```` ```json ```` (or bare ```` ``` ````) fenced block; else the first (outermost) `{…}` object
/// found in the text.
pub fn extract_json(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return None;
    }
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        return Some(v);
    }
    if let Some(v) = fenced_block(trimmed) {
        return Some(v);
    }
    first_object(trimmed)
}

/// The JSON inside the first fenced code block that parses.
fn fenced_block(text: &str) -> Option<Value> {
    let mut rest = text;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        // Skip the info string (`json`, `JSON`, …) up to the end of the line.
        let body_start = after.find('\n').map_or(0, |i| i + 1);
        let body = &after[body_start..];
        let end = body.find("```")?;
        if let Ok(v) = serde_json::from_str::<Value>(body[..end].trim()) {
            return Some(v);
        }
        rest = &body[end + 3..];
    }
    None
}

/// The first `{` from which a complete JSON object parses (trailing text ignored).
fn first_object(text: &str) -> Option<Value> {
    text.match_indices('{')
        .take(MAX_OBJECT_STARTS)
        .find_map(|(i, _)| {
            let mut stream = serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>();
            match stream.next() {
                Some(Ok(v @ Value::Object(_))) => Some(v),
                _ => None,
            }
        })
}

/// The JSON value of a reply, or what is wrong with it.
// Text by design: the model reads it when it is asked to repair its reply.
fn check_reply(content: Option<&str>, schema_value: &Value) -> Result<Value, String> {
    let text = content.unwrap_or("").trim();
    if text.is_empty() {
        return Err("the reply is empty".into());
    }
    let Some(mut value) = extract_json(text) else {
        return Err("the reply is not a JSON object".into());
    };
    // JSON text inside the reply may spell a NUL (`\u0000`) that no store can hold.
    crate::model::scrub_nul(&mut value);
    fill_omitted_nullables(schema_value, schema_value, &mut value, 0);
    schema::validate(schema_value, &value).map_err(|errors| errors.join("; "))?;
    Ok(value)
}

/// How deep [`fill_omitted_nullables`] follows a schema (recursive `$ref`s end here).
const MAX_FILL_DEPTH: usize = 32;

/// Set every property the reply left out, whose schema allows `null`, to `null`, throughout the
/// value: a strict provider always sends such a property (strict schemas list every property as
/// required), but Anthropic's tool input and local servers leave it out, and an absent optional
/// field means the same as its null. `root` resolves local `$ref`s (`#/$defs/…`).
fn fill_omitted_nullables(root: &Value, schema: &Value, value: &mut Value, depth: usize) {
    if depth > MAX_FILL_DEPTH {
        return;
    }
    let schema = resolve(root, schema);
    // A union: fill by the first branch that describes the value's kind.
    if let Some(branches) = schema.get("anyOf").and_then(Value::as_array) {
        let kind = if value.is_object() {
            "object"
        } else if value.is_array() {
            "array"
        } else {
            ""
        };
        if let Some(b) = branches
            .iter()
            .find(|b| !kind.is_empty() && has_type(resolve(root, b), kind))
        {
            fill_omitted_nullables(root, b, value, depth + 1);
        }
        return;
    }
    match value {
        Value::Object(map) => {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                return;
            };
            for (name, prop) in props {
                match map.get_mut(name) {
                    Some(v) => fill_omitted_nullables(root, prop, v, depth + 1),
                    None if allows_null(resolve(root, prop), root) => {
                        map.insert(name.clone(), Value::Null);
                    }
                    None => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for v in items {
                    fill_omitted_nullables(root, item_schema, v, depth + 1);
                }
            }
        }
        _ => {}
    }
}

/// `schema` itself, or what its local `$ref` (`#/…`) points at.
fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) if r.starts_with('#') => root.pointer(&r[1..]).unwrap_or(schema),
        _ => schema,
    }
}

fn has_type(schema: &Value, kind: &str) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == kind,
        Some(Value::Array(ts)) => ts.iter().any(|t| t == kind),
        _ => false,
    }
}

fn allows_null(schema: &Value, root: &Value) -> bool {
    has_type(schema, "null")
        || schema.get("nullable") == Some(&Value::Bool(true))
        || schema
            .get("anyOf")
            .and_then(Value::as_array)
            .is_some_and(|bs| bs.iter().any(|b| has_type(resolve(root, b), "null")))
}

/// Ask for a JSON reply matching `request.response_format` and return it with the reply of the
/// call that produced it (its `usage` is the sum over every call made, repair included).
///
/// # Errors
/// [`LlmError::BadReply`] when the request has no `response_format`; any error of the provider;
/// [`LlmError::InvalidStructured`] when the reply is still invalid after one repair attempt (it
/// names the schema, the validation errors and quotes up to 500 bytes of what was returned).
pub async fn complete_structured(
    provider: &dyn LlmProvider,
    mut request: ChatRequest,
) -> Result<(Value, ChatResponse), LlmError> {
    let Some(format) = request.response_format.clone() else {
        return Err(LlmError::BadReply(
            "a structured request needs a response_format".into(),
        ));
    };
    let first = provider.complete(request.clone()).await?;
    let problem = match check_reply(first.content.as_deref(), &format.schema) {
        Ok(value) => return Ok((value, first)),
        Err(problem) => problem,
    };
    tracing::warn!(
        schema = %format.name,
        provider = provider.name(),
        %problem,
        "structured reply invalid; asking the model to repair it"
    );
    request.messages.push(ChatMessage::assistant(
        Some(first.content.clone().unwrap_or_default()),
        vec![],
    ));
    request.messages.push(ChatMessage::user(format!(
        "Your reply was not valid for the schema `{}`: {problem}. Reply again with only the corrected JSON object.",
        format.name
    )));
    let mut second = provider.complete(request).await?;
    second.usage.add(&first.usage);
    match check_reply(second.content.as_deref(), &format.schema) {
        Ok(value) => Ok((value, second)),
        Err(error) => Err(LlmError::InvalidStructured {
            schema: format.name,
            error,
            returned: truncate(second.content.as_deref().unwrap_or(""), MAX_RETURNED),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use async_trait::async_trait;
    use serde_json::json;

    use super::*;
    use crate::llm::{JsonSchemaFormat, Phase, Role};
    use crate::model::Usage;

    /// Answers from a script and records what it was asked.
    struct Scripted {
        replies: Mutex<VecDeque<String>>,
        seen: Mutex<Vec<ChatRequest>>,
    }

    impl Scripted {
        fn new(replies: &[&str]) -> Self {
            Self {
                replies: Mutex::new(replies.iter().map(|s| (*s).to_owned()).collect()),
                seen: Mutex::new(vec![]),
            }
        }
    }

    #[async_trait]
    impl LlmProvider for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
            self.seen.lock().unwrap().push(request);
            let content = self.replies.lock().unwrap().pop_front();
            Ok(ChatResponse {
                content,
                tool_calls: vec![],
                usage: Usage {
                    prompt_tokens: 10,
                    completion_tokens: 2,
                    total_tokens: 12,
                    llm_calls: 1,
                    ..Default::default()
                },
                finish_reason: Some("stop".into()),
                model: None,
            })
        }
    }

    fn request() -> ChatRequest {
        ChatRequest {
            phase: Phase::Synthesize,
            model: None,
            messages: vec![ChatMessage::user("answer")],
            tools: vec![],
            response_format: Some(JsonSchemaFormat {
                name: "pes_synthesis".into(),
                schema: json!({
                    "type": "object",
                    "properties": {"response": {"type": "string"}},
                    "required": ["response"]
                }),
            }),
            tokens: crate::llm::Tokens::none(),
        }
    }

    #[test]
    fn an_omitted_nullable_property_is_read_as_null() {
        let schema = json!({
            "type": "object",
            "properties": {
                "todoList": {"type": "array", "items": {"$ref": "#/$defs/item"}},
                "title": {"type": "string"}
            },
            "required": ["todoList", "title"],
            "additionalProperties": false,
            "$defs": {"item": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "kind": {"type": ["string", "null"]},
                    "role": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "toolAllowlist": {"type": ["array", "null"], "items": {"type": "string"}}
                },
                "required": ["id", "kind", "role", "toolAllowlist"],
                "additionalProperties": false
            }}
        });
        let reply = r#"{"todoList": [{"id": "a"}, {"id": "b", "kind": "leaf"}]}"#;
        let v = check_reply(Some(reply), &schema).unwrap_err();
        // `title` is required and not nullable: still an error, the one that is left.
        assert!(v.contains("title"), "{v}");
        let reply = r#"{"title": "t", "todoList": [{"id": "a"}, {"id": "b", "kind": "leaf"}]}"#;
        let v = check_reply(Some(reply), &schema).unwrap();
        assert_eq!(v["todoList"][0]["kind"], Value::Null);
        assert_eq!(v["todoList"][0]["role"], Value::Null);
        assert_eq!(v["todoList"][0]["toolAllowlist"], Value::Null);
        assert_eq!(v["todoList"][1]["kind"], "leaf");
    }

    #[test]
    fn extract_json_tolerates_fences_and_prose() {
        assert_eq!(extract_json(r#" {"a": 1} "#), Some(json!({"a": 1})));
        assert_eq!(
            extract_json("Here you go:\n```json\n{\"a\": [1, 2]}\n```\nDone."),
            Some(json!({"a": [1, 2]}))
        );
        assert_eq!(extract_json("```\n{\"a\": 2}\n```"), Some(json!({"a": 2})));
        assert_eq!(
            extract_json(r#"Sure! {"a": {"b": "}"}} hope that helps {"c": 1}"#),
            Some(json!({"a": {"b": "}"}}))
        );
        assert_eq!(
            extract_json("{broken {\"ok\": true}"),
            Some(json!({"ok": true}))
        );
        assert_eq!(extract_json("no json here"), None);
        assert_eq!(extract_json(""), None);
        assert_eq!(extract_json("[1, 2]"), Some(json!([1, 2])));
    }

    #[tokio::test]
    async fn a_valid_reply_is_returned_as_is() {
        let p = Scripted::new(&[r#"{"response": "hi"}"#]);
        let (v, r) = complete_structured(&p, request()).await.unwrap();
        assert_eq!(v, json!({"response": "hi"}));
        assert_eq!(r.usage.llm_calls, 1);
        assert_eq!(p.seen.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn an_invalid_reply_is_repaired_once() {
        let p = Scripted::new(&[
            r#"{"response": 3}"#,
            "```json\n{\"response\": \"fixed\"}\n```",
        ]);
        let (v, r) = complete_structured(&p, request()).await.unwrap();
        assert_eq!(v, json!({"response": "fixed"}));
        assert_eq!(r.usage.llm_calls, 2);
        assert_eq!(r.usage.total_tokens, 24);
        let seen = p.seen.lock().unwrap();
        let repair = &seen[1].messages;
        assert_eq!(repair.len(), 3);
        assert_eq!(repair[1].role, Role::Assistant);
        assert_eq!(repair[1].content.as_deref(), Some(r#"{"response": 3}"#));
        assert_eq!(repair[2].role, Role::User);
        assert_eq!(
            repair[2].content.as_deref(),
            Some(
                "Your reply was not valid for the schema `pes_synthesis`: /response: 3 is not of type \"string\". Reply again with only the corrected JSON object."
            )
        );
        assert!(seen[1].response_format.is_some());
    }

    #[tokio::test]
    async fn a_reply_invalid_twice_fails_and_quotes_what_was_returned() {
        let long = format!("not json {}", "x".repeat(1000));
        let p = Scripted::new(&["nope", &long]);
        let e = complete_structured(&p, request()).await.unwrap_err();
        match e {
            LlmError::InvalidStructured {
                schema,
                error,
                returned,
            } => {
                assert_eq!(schema, "pes_synthesis");
                assert_eq!(error, "the reply is not a JSON object");
                assert!(returned.starts_with("not json xxx"));
                assert!(returned.len() <= MAX_RETURNED + '…'.len_utf8());
            }
            other => panic!("expected InvalidStructured, got {other}"),
        }
        assert_eq!(p.seen.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_request_without_a_schema_is_refused() {
        let p = Scripted::new(&[]);
        let mut req = request();
        req.response_format = None;
        assert!(matches!(
            complete_structured(&p, req).await,
            Err(LlmError::BadReply(_))
        ));
        assert!(p.seen.lock().unwrap().is_empty());
    }
}
