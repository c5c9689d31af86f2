//! A scripted model server over real HTTP for the providers' unit tests: each request gets the
//! next scripted reply (status, headers, body; status 0 never answers, so a client timeout fires)
//! and is kept with its headers. Also a token sink that records what it is sent.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::Value;

/// One scripted reply.
pub struct Scripted {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

/// A JSON reply with this status.
pub fn reply(status: u16, body: Value) -> Scripted {
    Scripted {
        status,
        headers: vec![],
        body: body.to_string(),
    }
}

/// A `text/event-stream` reply of this body.
pub fn event_stream(body: String) -> Scripted {
    Scripted {
        status: 200,
        headers: vec![("content-type", "text/event-stream".into())],
        body,
    }
}

/// The server's script and what it received.
#[derive(Clone, Default)]
pub struct Fake {
    script: Arc<Mutex<VecDeque<Scripted>>>,
    /// Each request's body and headers.
    pub seen: Arc<Mutex<Vec<(Value, HeaderMap)>>>,
}

impl Fake {
    /// Every request body, in order.
    pub fn bodies(&self) -> Vec<Value> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(b, _)| b.clone())
            .collect()
    }
}

async fn handler(State(fake): State<Fake>, headers: HeaderMap, body: String) -> Response {
    let parsed: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    fake.seen.lock().unwrap().push((parsed, headers));
    let next = fake.script.lock().unwrap().pop_front();
    let Some(s) = next else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "script exhausted").into_response();
    };
    if s.status == 0 {
        // Never answer: the client's timeout must fire.
        std::future::pending::<()>().await;
    }
    let mut resp = (StatusCode::from_u16(s.status).unwrap(), s.body).into_response();
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    for (k, v) in s.headers {
        resp.headers_mut().insert(k, v.parse().unwrap());
    }
    resp
}

/// A server on 127.0.0.1:0 answering `POST {route}` from `script`; its `http://<addr>`.
pub async fn serve(route: &str, script: Vec<Scripted>) -> (Fake, String) {
    let fake = Fake::default();
    fake.script.lock().unwrap().extend(script);
    let app = Router::new()
        .route(route, post(handler))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    #[allow(clippy::disallowed_methods)] // a test server, for the test's life
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (fake, format!("http://{addr}"))
}

/// A token sink that keeps what it is sent.
#[derive(Default)]
pub struct Recorder(pub Mutex<Vec<String>>);

impl super::TokenSink for Recorder {
    fn listening(&self) -> bool {
        true
    }
    fn delta(&self, text: &str) {
        self.0.lock().unwrap().push(text.to_owned());
    }
}

/// A tool call, briefly.
pub fn call(id: &str, name: &str, arguments: Value) -> super::ToolCall {
    super::ToolCall {
        id: id.into(),
        name: name.into(),
        arguments,
    }
}

/// Usage, briefly (total = prompt + completion).
pub fn usage(prompt: u64, completion: u64, calls: u64) -> crate::model::Usage {
    crate::model::Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        llm_calls: calls,
        ..Default::default()
    }
}
