//! The provider against a scripted Messages server over real HTTP.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::llm::openai::test_transport;
use crate::llm::test_server::{self, Recorder, Scripted, call, event_stream, reply, usage};
use crate::llm::{ChatMessage, JsonSchemaFormat, Phase, Tokens, ToolSpec};

fn message(content: Value, stop: &str) -> Scripted {
    reply(
        200,
        json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": content, "stop_reason": stop,
            "usage": {"input_tokens": 7, "cache_read_input_tokens": 3, "output_tokens": 5}
        }),
    )
}

/// A streamed reply: each `(event, data)` as a named event.
fn sse(events: &[(&str, Value)]) -> Scripted {
    event_stream(
        events
            .iter()
            .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
            .collect(),
    )
}

async fn serve(script: Vec<Scripted>) -> (test_server::Fake, String) {
    test_server::serve("/v1/messages", script).await
}

fn provider(base_url: &str, max_retries: u32, stream: bool) -> AnthropicProvider {
    AnthropicProvider::new(AnthropicConfig {
        base_url: base_url.into(),
        api_key: Some("ak-test".into()),
        default_model: "claude-test".into(),
        max_tokens: 1000,
        transport: test_transport(max_retries, stream),
    })
    .unwrap()
}

fn request() -> ChatRequest {
    ChatRequest {
        phase: Phase::Execute,
        model: None,
        messages: vec![ChatMessage::system("be brief"), ChatMessage::user("hi")],
        tools: vec![],
        response_format: None,
        tokens: Tokens::none(),
    }
}

fn plan_schema() -> JsonSchemaFormat {
    JsonSchemaFormat {
        name: "pes_plan".into(),
        schema: json!({"type": "object", "properties": {"title": {"type": "string"}},
                       "required": ["title"], "additionalProperties": false}),
    }
}

#[tokio::test]
async fn a_plain_reply_is_read_with_usage_headers_and_a_separate_system_prompt() {
    let (fake, url) = serve(vec![message(
        json!([{"type": "text", "text": "hello"}]),
        "end_turn",
    )])
    .await;
    let p = provider(&url, 0, false);
    assert_eq!(p.endpoint(), format!("{url}/v1/messages"));
    let r = p.complete(request()).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("hello"));
    assert_eq!(r.finish_reason.as_deref(), Some("stop"));
    // Cached input counts as input, and is reported apart as well (it is priced apart).
    assert_eq!(
        r.usage,
        crate::model::Usage {
            cached_prompt_tokens: 3,
            ..usage(10, 5, 1)
        }
    );
    let seen = fake.seen.lock().unwrap();
    let (body, headers) = &seen[0];
    assert_eq!(headers["x-api-key"], "ak-test");
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert_eq!(
        *body,
        json!({
            "model": "claude-test",
            "max_tokens": 1000,
            "system": "be brief",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        })
    );
}

#[tokio::test]
async fn tool_calls_and_results_become_alternating_turns_of_blocks() {
    let (fake, url) = serve(vec![message(
        json!([
            {"type": "text", "text": "let me compute"},
            {"type": "tool_use", "id": "toolu_9", "name": "calculator", "input": {"expression": "2+2"}}
        ]),
        "tool_use",
    )])
    .await;
    let mut req = request();
    req.model = Some("other".into());
    req.tools = vec![ToolSpec {
        name: "calculator".into(),
        description: "math".into(),
        parameters: json!({"type": "object"}),
    }];
    req.messages.push(ChatMessage::assistant(
        None,
        vec![
            call("call_1", "calculator", json!({"expression": "1+1"})),
            call("call.2", "calculator", Value::String("{bad".into())),
        ],
    ));
    req.messages.push(ChatMessage::tool("call_1", "2"));
    req.messages.push(ChatMessage::tool("call.2", ""));
    req.messages.push(ChatMessage::user("go on"));
    let r = provider(&url, 0, false).complete(req).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("let me compute"));
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        r.tool_calls,
        vec![call("toolu_9", "calculator", json!({"expression": "2+2"}))]
    );
    let body = &fake.bodies()[0];
    assert_eq!(body["model"], "other");
    assert_eq!(
        body["tools"],
        json!([{"name": "calculator", "description": "math", "input_schema": {"type": "object"}}])
    );
    assert!(body.get("tool_choice").is_none());
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_1", "name": "calculator", "input": {"expression": "1+1"}},
                {"type": "tool_use", "id": "call_2", "name": "calculator", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "2"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": "(empty)"},
                {"type": "text", "text": "go on"}
            ]}
        ])
    );
}

#[tokio::test]
async fn structured_output_forces_a_tool_and_the_repair_rule_applies() {
    let (fake, url) = serve(vec![
        message(
            json!([{"type": "tool_use", "id": "t1", "name": "pes_plan", "input": {"nope": 1}}]),
            "tool_use",
        ),
        message(
            json!([{"type": "tool_use", "id": "t2", "name": "pes_plan", "input": {"title": "t"}}]),
            "tool_use",
        ),
    ])
    .await;
    let mut req = request();
    req.phase = Phase::Plan;
    req.response_format = Some(plan_schema());
    let p = provider(&url, 0, false);
    let (value, resp) = crate::llm::structured::complete_structured(&p, req)
        .await
        .unwrap();
    assert_eq!(value, json!({"title": "t"}));
    assert_eq!(resp.usage.llm_calls, 2);
    let bodies = fake.bodies();
    for b in &bodies {
        assert_eq!(
            b["tool_choice"],
            json!({"type": "tool", "name": "pes_plan"})
        );
        assert_eq!(b["tools"][0]["name"], "pes_plan");
        assert_eq!(b["tools"][0]["input_schema"], plan_schema().schema);
    }
    // The repair request shows the first reply and says what was wrong, in alternating turns.
    let msgs = bodies[1]["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    assert_eq!(msgs[1]["role"], "assistant");
    assert_eq!(msgs[1]["content"][0]["text"], "{\"nope\":1}");
    assert!(
        msgs[2]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("not valid for the schema `pes_plan`")
    );
}

#[tokio::test]
async fn a_schema_that_is_not_an_object_goes_in_the_system_prompt() {
    let (fake, url) = serve(vec![message(
        json!([{"type": "text", "text": "\"yes\""}]),
        "end_turn",
    )])
    .await;
    let mut req = request();
    req.response_format = Some(JsonSchemaFormat {
        name: "pes_flowchart".into(),
        schema: json!({"type": "string"}),
    });
    let r = provider(&url, 0, false).complete(req).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("\"yes\""));
    let body = &fake.bodies()[0];
    assert!(body.get("tool_choice").is_none());
    assert!(
        body["system"]
            .as_str()
            .unwrap()
            .starts_with("be brief\n\nReply with only a JSON object that matches")
    );
}

#[tokio::test]
async fn overloaded_and_rate_limited_replies_are_retried_honouring_retry_after() {
    let overloaded =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let mut limited = reply(
        429,
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
    );
    limited.headers.push(("retry-after", "0".into()));
    let (fake, url) = serve(vec![
        reply(529, overloaded.clone()),
        limited,
        message(json!([{"type": "text", "text": "ok"}]), "end_turn"),
    ])
    .await;
    let r = provider(&url, 2, false).complete(request()).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("ok"));
    assert_eq!(r.usage.llm_calls, 3);
    assert_eq!(fake.bodies().len(), 3);
    // Past the retries: unavailable, with Anthropic's message.
    let (_fake, url) = serve(vec![reply(529, overloaded.clone()), reply(529, overloaded)]).await;
    let e = provider(&url, 1, false)
        .complete(request())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LlmError::Unavailable(m) if m.contains("HTTP 529: overloaded_error: Overloaded") && m.contains("after 2 attempts")),
        "{e}"
    );
}

#[tokio::test]
async fn a_4xx_is_rejected_at_once_with_anthropics_message() {
    let (fake, url) = serve(vec![
        reply(400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too large"}})),
        message(json!([{"type": "text", "text": "never"}]), "end_turn"),
    ])
    .await;
    let e = provider(&url, 3, false)
        .complete(request())
        .await
        .unwrap_err();
    match e {
        LlmError::Rejected { status, body } => {
            assert_eq!(status, 400);
            assert_eq!(body, "invalid_request_error: max_tokens: too large");
        }
        other => panic!("expected Rejected, got {other}"),
    }
    assert_eq!(fake.bodies().len(), 1);
}

/// The events of a streamed reply writing `text` in two pieces, then calling `calculator`.
fn streamed_turn() -> Vec<(&'static str, Value)> {
    vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "model": "m", "content": [], "usage": {"input_tokens": 7, "cache_read_input_tokens": 3, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "let me "}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "compute"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_9", "name": "calculator", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"expression\": "}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"2+2\"}"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]
}

#[tokio::test]
async fn a_streamed_reply_is_the_reply_a_plain_call_returns_and_its_text_is_forwarded() {
    let (fake, url) = serve(vec![sse(&streamed_turn())]).await;
    let sink = Arc::new(Recorder::default());
    let mut req = request();
    req.tokens = Tokens::to(sink.clone());
    let streamed = provider(&url, 0, true).complete(req).await.unwrap();
    assert_eq!(fake.bodies()[0]["stream"], true);
    let (_f, url2) = serve(vec![message(
        json!([
            {"type": "text", "text": "let me compute"},
            {"type": "tool_use", "id": "toolu_9", "name": "calculator", "input": {"expression": "2+2"}}
        ]),
        "tool_use",
    )])
    .await;
    let plain = provider(&url2, 0, false).complete(request()).await.unwrap();
    assert_eq!(streamed, plain);
    // The text, not the tool's input.
    assert_eq!(*sink.0.lock().unwrap(), vec!["let me ", "compute"]);
}

#[tokio::test]
async fn a_structured_stream_forwards_the_json_being_written() {
    let events = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 4, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t", "name": "pes_plan", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"title\""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": ": \"t\"}"}}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    let (_fake, url) = serve(vec![sse(&events)]).await;
    let sink = Arc::new(Recorder::default());
    let mut req = request();
    req.response_format = Some(plan_schema());
    req.tokens = Tokens::to(sink.clone());
    let r = provider(&url, 0, true).complete(req).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("{\"title\":\"t\"}"));
    assert!(r.tool_calls.is_empty());
    assert_eq!(r.usage.prompt_tokens, 4);
    assert_eq!(r.usage.completion_tokens, 9);
    assert_eq!(sink.0.lock().unwrap().concat(), "{\"title\": \"t\"}");
}

#[tokio::test]
async fn an_error_event_or_a_cut_stream_is_retried() {
    let mut cut = streamed_turn();
    cut.truncate(5);
    let (fake, url) = serve(vec![
        sse(&[("error", json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))]),
        sse(&cut),
        sse(&streamed_turn()),
    ])
    .await;
    let r = provider(&url, 2, true).complete(request()).await.unwrap();
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(fake.bodies().len(), 3);
    // A cut stream gives up like any transient failure.
    let (_fake, url) = serve(vec![sse(&cut)]).await;
    let e = provider(&url, 0, true)
        .complete(request())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LlmError::Unavailable(m) if m.contains("message_stop")),
        "{e}"
    );
}

#[test]
fn config_is_checked_and_a_base_with_v1_is_accepted() {
    assert!(matches!(
        AnthropicProvider::new(AnthropicConfig {
            base_url: "ftp://x".into(),
            ..Default::default()
        }),
        Err(OpenAiConfigError::BadBaseUrl(_))
    ));
    let p = AnthropicProvider::new(AnthropicConfig::default()).unwrap();
    assert_eq!(p.endpoint(), "https://api.anthropic.com/v1/messages");
    let p = AnthropicProvider::new(AnthropicConfig {
        base_url: "http://127.0.0.1:9/v1/".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(p.endpoint(), "http://127.0.0.1:9/v1/messages");
}
