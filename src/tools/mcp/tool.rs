//! One MCP tool as a [`Tool`]: named `<server>__<tool>`, with the server's input schema, called
//! on the server's live connection with the call's idempotency key in `_meta`. What the server
//! answers becomes a tool output the model reads: structured content when there is some, else the
//! text; `isError` and protocol errors become tool errors.

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, MetaObject, RequestMetaObject,
};
use serde_json::{Map, Value, json};

use super::server::Connection;
use crate::tools::{Tool, ToolContext, ToolError, ToolServer, ToolSource};

/// The `_meta` key that carries the tool-call idempotency key (`<runId>:<toolCallId>`), stable
/// across a retried call, so a server with side effects can make a repeat harmless.
pub const IDEMPOTENCY_META_KEY: &str = "idempotencyKey";

/// Tool names the model may call: OpenAI-compatible function names are 1-64 characters of
/// `A-Za-z0-9_-`.
const MAX_NAME: usize = 64;

/// An MCP tool mounted in the registry.
pub struct McpTool {
    /// `<server>__<tool>`, sanitized.
    name: String,
    /// The tool's name on its server.
    remote: String,
    description: String,
    parameters: Value,
    side_effects: bool,
    connection: Arc<Connection>,
}

impl McpTool {
    /// Mount `tool` of the server behind `connection`; `None` when its name cannot be made a
    /// function name (the caller warns).
    pub(super) fn new(connection: Arc<Connection>, tool: &rmcp::model::Tool) -> Option<Self> {
        let name = local_name(connection.name(), &tool.name)?;
        let description = tool
            .description
            .as_deref()
            .or(tool.title.as_deref())
            .or_else(|| tool.annotations.as_ref()?.title.as_deref())
            .unwrap_or("")
            .to_owned();
        // A tool its server declares read-only can run twice without harm.
        let read_only = tool
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false);
        Some(Self {
            name,
            remote: tool.name.to_string(),
            description,
            parameters: Value::Object(tool.input_schema.as_ref().clone()),
            side_effects: !read_only,
            connection,
        })
    }
}

/// `<server>__<tool>` with every character a function name cannot hold replaced by `_`, or `None`
/// when it would be longer than a function name may be.
fn local_name(server: &str, tool: &str) -> Option<String> {
    let clean = crate::model::ids::identifier_chars(tool);
    let name = format!("{server}__{clean}");
    (!clean.is_empty() && name.len() <= MAX_NAME).then_some(name)
}

/// Mount a listed tool of the server behind `connection` (see [`McpTool::new`]).
pub(super) fn mount(
    connection: &Arc<Connection>,
    tool: &rmcp::model::Tool,
) -> Option<Arc<dyn Tool>> {
    McpTool::new(connection.clone(), tool).map(|t| Arc::new(t) as Arc<dyn Tool>)
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> Value {
        self.parameters.clone()
    }
    fn side_effects(&self) -> bool {
        self.side_effects
    }
    fn source(&self) -> ToolSource {
        ToolSource::Mcp
    }
    fn server(&self) -> Option<&str> {
        Some(self.connection.name())
    }
    fn unavailable(&self) -> Option<String> {
        self.connection.unavailable()
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let Value::Object(arguments) = args else {
            return Err(ToolError::InvalidArguments(
                "the arguments must be a JSON object".into(),
            ));
        };
        let mut meta = Map::new();
        meta.insert(
            IDEMPOTENCY_META_KEY.into(),
            Value::String(ctx.idempotency_key.clone()),
        );
        let mut params = CallToolRequestParams::new(self.remote.clone());
        params.arguments = Some(arguments);
        params.meta = Some(RequestMetaObject(MetaObject(meta)));
        let result = self.connection.call_tool(params).await?;
        output(self.connection.name(), &self.remote, result)
            .map(|v| bounded(v, self.connection.max_output_bytes))
    }
}

/// What the model reads from a tool result.
fn output(server: &str, tool: &str, result: CallToolResult) -> Result<Value, ToolError> {
    let text = texts(&result.content);
    if result.is_error == Some(true) {
        let detail = if text.is_empty() {
            result
                .structured_content
                .map_or_else(|| "no detail".to_owned(), |v| v.to_string())
        } else {
            text
        };
        return Err(ToolError::Failed(format!(
            "the MCP tool `{tool}` on `{server}` reported an error: {detail}"
        )));
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    let only_text = result
        .content
        .iter()
        .all(|c| matches!(c, ContentBlock::Text(_)));
    if only_text {
        return Ok(Value::String(text));
    }
    Ok(Value::Array(result.content.iter().map(block).collect()))
}

/// `value` when its JSON fits in `max` bytes; else its JSON text cut at `max` bytes (on a
/// character boundary) with a marker, so a huge answer cannot fill the log or the model's context.
fn bounded(value: Value, max: usize) -> Value {
    let text = match &value {
        Value::String(s) if s.len() <= max => return value,
        Value::String(s) => s.clone(),
        other => {
            let json = other.to_string();
            if json.len() <= max {
                return value;
            }
            json
        }
    };
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    Value::String(format!(
        "{}…[truncated: the tool's output exceeded {max} bytes]",
        &text[..cut]
    ))
}

/// The text blocks joined by blank lines.
fn texts(content: &[ContentBlock]) -> String {
    content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Text(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// One content block as JSON, binary payloads described rather than inlined (the model cannot
/// read base64, and it would fill the context).
fn block(c: &ContentBlock) -> Value {
    match c {
        ContentBlock::Text(t) => json!({"type": "text", "text": t.text}),
        ContentBlock::Image(i) => json!({
            "type": "image", "mimeType": i.mime_type, "note": format!("{} bytes of base64 not shown", i.data.len())
        }),
        ContentBlock::Audio(a) => json!({
            "type": "audio", "mimeType": a.mime_type, "note": format!("{} bytes of base64 not shown", a.data.len())
        }),
        other => serde_json::to_value(other).unwrap_or(Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_function_names() {
        assert_eq!(
            local_name("fs", "read_file").as_deref(),
            Some("fs__read_file")
        );
        assert_eq!(
            local_name("fs", "files.read/v2").as_deref(),
            Some("fs__files_read_v2")
        );
        assert_eq!(local_name("fs", ""), None);
        assert_eq!(local_name("fs", &"x".repeat(80)), None);
    }

    #[test]
    fn huge_outputs_are_cut_with_a_marker() {
        assert_eq!(bounded(json!({"a": 1}), 100), json!({"a": 1}));
        assert_eq!(
            bounded(json!("é".repeat(10)), 7),
            json!(format!(
                "{}…[truncated: the tool's output exceeded 7 bytes]",
                "é".repeat(3)
            ))
        );
        let cut = bounded(json!({"text": "x".repeat(100)}), 20);
        assert!(
            cut.as_str()
                .unwrap()
                .starts_with(r#"{"text":"xxxxxxxxxxx…[truncated"#),
            "{cut}"
        );
    }

    #[test]
    fn results_become_outputs_and_errors() {
        let text = |s: &str| ContentBlock::text(s.to_owned());
        let ok = |content, structured, is_error| {
            let mut r = CallToolResult::success(content);
            r.structured_content = structured;
            r.is_error = is_error;
            output("srv", "t", r)
        };
        assert_eq!(
            ok(vec![text("a"), text("b")], None, None),
            Ok(json!("a\n\nb"))
        );
        assert_eq!(
            ok(vec![text("5")], Some(json!({"sum": 5})), None),
            Ok(json!({"sum": 5}))
        );
        assert_eq!(
            ok(vec![text("nope")], None, Some(true)),
            Err(ToolError::Failed(
                "the MCP tool `t` on `srv` reported an error: nope".into()
            ))
        );
    }
}
