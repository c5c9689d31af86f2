//! The provider against a scripted Chat Completions server over real HTTP.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::llm::test_server::{self, Recorder, Scripted, call, event_stream, reply, usage};
use crate::llm::{ChatMessage, JsonSchemaFormat, Phase, ToolSpec};

fn ok_text(text: &str) -> Scripted {
    reply(
        200,
        json!({
            "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        }),
    )
}

/// A fake OpenAI-compatible server on 127.0.0.1:0 answering from `script`; its base URL.
async fn serve(script: Vec<Scripted>) -> (test_server::Fake, String) {
    let (fake, url) = test_server::serve("/v1/chat/completions", script).await;
    (fake, format!("{url}/v1/"))
}

fn config(base_url: &str, max_retries: u32) -> OpenAiConfig {
    OpenAiConfig {
        base_url: base_url.into(),
        api_key: Some("sk-test".into()),
        default_model: "test-model".into(),
        transport: test_transport(max_retries, false),
    }
}

fn provider(base_url: &str, max_retries: u32) -> OpenAiProvider {
    OpenAiProvider::new(config(base_url, max_retries)).unwrap()
}

fn request() -> ChatRequest {
    ChatRequest {
        phase: Phase::Execute,
        model: None,
        messages: vec![ChatMessage::system("be brief"), ChatMessage::user("hi")],
        tools: vec![],
        response_format: None,
        tokens: crate::llm::Tokens::none(),
    }
}

fn plan_schema() -> JsonSchemaFormat {
    JsonSchemaFormat {
        name: "pes_plan".into(),
        schema: json!({"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"], "additionalProperties": false}),
    }
}

#[tokio::test]
async fn a_plain_reply_is_parsed_with_usage_and_auth() {
    let (fake, url) = serve(vec![ok_text("hello")]).await;
    let p = provider(&url, 3);
    assert_eq!(p.endpoint(), format!("{}chat/completions", url));
    let r = p.complete(request()).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("hello"));
    assert_eq!(r.finish_reason.as_deref(), Some("stop"));
    assert_eq!(r.usage, usage(10, 5, 1));
    let seen = fake.seen.lock().unwrap();
    assert_eq!(seen[0].1["authorization"], "Bearer sk-test");
    assert_eq!(
        seen[0].0,
        json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"}
            ]
        })
    );
}

#[tokio::test]
async fn the_request_body_has_tools_tool_messages_and_response_format_as_designed() {
    let (fake, url) = serve(vec![ok_text("{}")]).await;
    let mut req = request();
    req.model = Some("other-model".into());
    req.tools = vec![ToolSpec {
        name: "calculator".into(),
        description: "math".into(),
        parameters: json!({"type": "object"}),
    }];
    req.response_format = Some(plan_schema());
    req.messages.push(ChatMessage::assistant(
        None,
        vec![
            call("call_1", "calculator", json!({"expression": "1+1"})),
            call("call_2", "calculator", Value::String("{bad".into())),
        ],
    ));
    req.messages
        .push(ChatMessage::tool("call_1", "{\"result\":2}"));
    provider(&url, 0).complete(req).await.unwrap();
    let body = &fake.bodies()[0];
    assert_eq!(body["model"], "other-model");
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "function": {"name": "calculator", "description": "math", "parameters": {"type": "object"}}}])
    );
    assert_eq!(
        body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "pes_plan", "strict": true, "schema": plan_schema().schema}})
    );
    assert_eq!(
        body["messages"][2],
        json!({"role": "assistant", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\":\"1+1\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "calculator", "arguments": "{bad"}}
        ]})
    );
    assert_eq!(
        body["messages"][3],
        json!({"role": "tool", "content": "{\"result\":2}", "tool_call_id": "call_1"})
    );
}

#[tokio::test]
async fn tool_calls_are_parsed_and_bad_arguments_kept_raw() {
    let (_fake, url) = serve(vec![reply(
        200,
        json!({
            "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\":\"2^10\"}"}},
                {"id": "b", "type": "function", "function": {"name": "current_time", "arguments": "{not json"}},
                {"id": "c", "type": "function", "function": {"name": "current_time", "arguments": ""}}
            ]}, "finish_reason": "tool_calls"}]
        }),
    )])
    .await;
    let r = provider(&url, 0).complete(request()).await.unwrap();
    assert_eq!(r.content, None);
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        r.tool_calls,
        vec![
            call("a", "calculator", json!({"expression": "2^10"})),
            call("b", "current_time", Value::String("{not json".into())),
            call("c", "current_time", json!({})),
        ]
    );
    // No usage in the reply: zeros, but the call is counted.
    assert_eq!(r.usage.total_tokens, 0);
    assert_eq!(r.usage.llm_calls, 1);
}

#[tokio::test]
async fn a_500_is_retried_and_counted() {
    let (fake, url) = serve(vec![reply(500, json!({"error": "oops"})), ok_text("ok")]).await;
    let r = provider(&url, 3).complete(request()).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("ok"));
    assert_eq!(r.usage.llm_calls, 2);
    assert_eq!(fake.bodies().len(), 2);
}

#[tokio::test]
async fn a_429_with_retry_after_is_retried() {
    let mut limited = reply(429, json!({"error": "slow down"}));
    limited.headers.push(("retry-after", "0".into()));
    let (fake, url) = serve(vec![limited, ok_text("ok")]).await;
    let r = provider(&url, 1).complete(request()).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("ok"));
    assert_eq!(fake.bodies().len(), 2);
}

#[tokio::test]
async fn a_timed_out_attempt_is_retried() {
    let hang = Scripted {
        status: 0,
        headers: vec![],
        body: String::new(),
    };
    let (fake, url) = serve(vec![hang, ok_text("late but fine")]).await;
    let mut cfg = config(&url, 1);
    cfg.transport.timeout = Duration::from_millis(300);
    let p = OpenAiProvider::new(cfg).unwrap();
    let r = p.complete(request()).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("late but fine"));
    // The timed-out attempt got no reply, so only one call is counted.
    assert_eq!(r.usage.llm_calls, 1);
    assert_eq!(fake.bodies().len(), 2);
}

#[tokio::test]
async fn transient_errors_give_up_after_max_retries() {
    let (fake, url) = serve(vec![
        reply(503, json!({})),
        reply(502, json!({})),
        reply(504, json!({"error": "gateway"})),
    ])
    .await;
    let e = provider(&url, 2).complete(request()).await.unwrap_err();
    assert!(
        matches!(&e, LlmError::Unavailable(m) if m.contains("HTTP 504") && m.contains("after 3 attempts")),
        "{e}"
    );
    assert_eq!(fake.bodies().len(), 3);
}

#[tokio::test]
async fn a_401_is_rejected_without_retry() {
    let (fake, url) = serve(vec![
        reply(401, json!({"error": {"message": "bad key"}})),
        ok_text("never"),
    ])
    .await;
    let e = provider(&url, 3).complete(request()).await.unwrap_err();
    match e {
        LlmError::Rejected { status, body } => {
            assert_eq!(status, 401);
            assert!(body.contains("bad key"));
        }
        other => panic!("expected Rejected, got {other}"),
    }
    assert_eq!(fake.bodies().len(), 1);
}

#[tokio::test]
async fn a_long_error_body_is_truncated() {
    let (_fake, url) = serve(vec![Scripted {
        status: 404,
        headers: vec![],
        body: "x".repeat(10_000),
    }])
    .await;
    let Err(LlmError::Rejected { body, .. }) = provider(&url, 0).complete(request()).await else {
        panic!("expected Rejected")
    };
    assert!(body.len() <= MAX_ERROR_BODY + '…'.len_utf8());
}

#[tokio::test]
async fn a_refused_response_format_is_retried_once_with_the_schema_in_the_prompt() {
    let (fake, url) = serve(vec![
        reply(
            400,
            json!({"error": {"message": "response_format json_schema is not supported"}}),
        ),
        ok_text("{\"title\":\"t\"}"),
    ])
    .await;
    let mut req = request();
    req.response_format = Some(plan_schema());
    let r = provider(&url, 0).complete(req).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("{\"title\":\"t\"}"));
    assert_eq!(r.usage.llm_calls, 2);
    let reqs = fake.bodies();
    assert!(reqs[0].get("response_format").is_some());
    assert!(reqs[1].get("response_format").is_none());
    let system = reqs[1]["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.starts_with(
            "be brief\n\nReply with only a JSON object that matches this JSON Schema: "
        )
    );
    assert!(system.contains(&plan_schema().schema.to_string()));
}

#[tokio::test]
async fn a_second_refusal_is_a_rejection() {
    let refusal = || reply(400, json!({"error": "unsupported response_format"}));
    let (fake, url) = serve(vec![refusal(), refusal(), refusal()]).await;
    let mut req = request();
    req.messages.remove(0);
    req.response_format = Some(plan_schema());
    let e = provider(&url, 3).complete(req).await.unwrap_err();
    assert!(matches!(e, LlmError::Rejected { status: 400, .. }));
    let reqs = fake.bodies();
    assert_eq!(reqs.len(), 2);
    // No system message before: one was added.
    assert_eq!(reqs[1]["messages"][0]["role"], "system");
}

#[tokio::test]
async fn connection_errors_are_retried_then_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let e = provider(&format!("http://{addr}/v1"), 1)
        .complete(request())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LlmError::Unavailable(m) if m.contains("after 2 attempts")),
        "{e}"
    );
}

#[tokio::test]
async fn a_reply_that_is_not_a_completion_is_a_bad_reply() {
    let (_fake, url) = serve(vec![reply(200, json!({"nope": true}))]).await;
    let e = provider(&url, 0).complete(request()).await.unwrap_err();
    assert!(matches!(e, LlmError::BadReply(_)), "{e}");
}

/// A streamed reply of these chunks (each a `data:` event), then `[DONE]`.
fn sse(chunks: &[Value]) -> Scripted {
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    event_stream(body)
}

fn streaming(base_url: &str, max_retries: u32) -> OpenAiProvider {
    let mut cfg = config(base_url, max_retries);
    cfg.transport.stream = true;
    OpenAiProvider::new(cfg).unwrap()
}

#[tokio::test]
async fn a_streamed_reply_is_the_reply_a_plain_call_returns_and_its_text_is_forwarded() {
    let delta = |d: Value| json!({"choices": [{"index": 0, "delta": d, "finish_reason": null}]});
    let (fake, url) = serve(vec![sse(&[
        delta(json!({"role": "assistant", "content": ""})),
        delta(json!({"content": "hel"})),
        delta(json!({"content": "lo"})),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}),
    ])])
    .await;
    let sink = Arc::new(Recorder::default());
    let mut req = request();
    req.tokens = crate::llm::Tokens::to(sink.clone());
    let streamed = streaming(&url, 0).complete(req).await.unwrap();
    // The same reply, not streamed.
    let (_fake2, url2) = serve(vec![ok_text("hello")]).await;
    let plain = provider(&url2, 0).complete(request()).await.unwrap();
    assert_eq!(streamed, plain);
    assert_eq!(*sink.0.lock().unwrap(), vec!["hel", "lo"]);
    let body = &fake.bodies()[0];
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
}

#[tokio::test]
async fn streamed_tool_calls_are_assembled_from_their_argument_deltas() {
    let calls = |c: Value| json!({"choices": [{"index": 0, "delta": {"tool_calls": c}}]});
    let (_fake, url) = serve(vec![sse(&[
        calls(json!([{"index": 0, "id": "a", "type": "function", "function": {"name": "calculator", "arguments": ""}}])),
        calls(json!([{"index": 0, "function": {"arguments": "{\"expression\":"}}])),
        calls(json!([{"index": 1, "id": "b", "type": "function", "function": {"name": "current_time", "arguments": "{}"}}])),
        calls(json!([{"index": 0, "function": {"arguments": "\"2^10\"}"}}])),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    ])])
    .await;
    let sink = Arc::new(Recorder::default());
    let mut req = request();
    req.tokens = crate::llm::Tokens::to(sink.clone());
    let r = streaming(&url, 0).complete(req).await.unwrap();
    assert_eq!(r.content, None);
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        r.tool_calls,
        vec![
            call("a", "calculator", json!({"expression": "2^10"})),
            call("b", "current_time", json!({})),
        ]
    );
    // Arguments are not text the model shows.
    assert!(sink.0.lock().unwrap().is_empty());
    // No usage chunk: zeros, but the call is counted.
    assert_eq!(r.usage.llm_calls, 1);
}

#[tokio::test]
async fn an_error_in_the_stream_is_retried_and_a_json_answer_to_a_stream_is_read() {
    let (fake, url) = serve(vec![
        sse(&[json!({"error": {"message": "overloaded"}})]),
        ok_text("plain"),
    ])
    .await;
    let r = streaming(&url, 1).complete(request()).await.unwrap();
    assert_eq!(r.content.as_deref(), Some("plain"));
    assert_eq!(fake.bodies().len(), 2);
}

#[test]
fn config_is_checked() {
    assert!(matches!(
        OpenAiProvider::new(OpenAiConfig {
            base_url: "ftp://x".into(),
            ..Default::default()
        }),
        Err(OpenAiConfigError::BadBaseUrl(_))
    ));
    assert!(matches!(
        OpenAiProvider::new(OpenAiConfig {
            default_model: " ".into(),
            ..Default::default()
        }),
        Err(OpenAiConfigError::EmptyModel)
    ));
    let p = OpenAiProvider::new(OpenAiConfig::default()).unwrap();
    assert_eq!(p.endpoint(), "https://api.openai.com/v1/chat/completions");
}

#[test]
fn an_operators_schema_outside_strict_rules_goes_without_strict() {
    let req = |schema: Value| ChatRequest {
        phase: crate::llm::Phase::Flowchart,
        model: None,
        messages: vec![ChatMessage::user("classify")],
        tools: vec![],
        response_format: Some(crate::llm::JsonSchemaFormat {
            name: "pes_flowchart".into(),
            schema,
        }),
        tokens: crate::llm::Tokens::none(),
    };
    let loose = json!({"type": "object", "properties": {"answer": {"type": "string"}}});
    let body = build_body(&req(loose.clone()), "m", false, false);
    assert_eq!(body["response_format"]["json_schema"]["strict"], false);
    assert_eq!(body["response_format"]["json_schema"]["schema"], loose);
    let tight = json!({"type": "object", "properties": {"answer": {"type": "string"}},
                       "required": ["answer"], "additionalProperties": false});
    let body = build_body(&req(tight), "m", false, false);
    assert_eq!(body["response_format"]["json_schema"]["strict"], true);
}
