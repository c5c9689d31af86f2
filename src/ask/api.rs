//! The terminal client's side of the public API: JSON calls with the person's API key, problems
//! turned into one readable line, and the run's observation stream followed across drops.
//!
//! The stream is `GET /v1/threads/{id}/events?runId=<run>`: only the run's observations, replayed
//! from its start. When the connection ends or stalls (no byte, not even a keep-alive, for
//! [`STALL`]) it reconnects with `Last-Event-ID` set to the last `seq` it delivered, so the
//! server sends exactly what came after, and a frame at or below that `seq` is dropped: nothing
//! is missed and nothing is shown twice, across a network drop or a server restart.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::mpsc;

/// No byte for this long (the server sends a keep-alive every 15 s by default) means the
/// connection is dead, even when the socket has not noticed.
const STALL: Duration = Duration::from_secs(45);
const RETRY_MIN: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The service at a base URL, called with an optional API key.
#[derive(Clone)]
pub struct Api {
    client: reqwest::Client,
    base: String,
    key: Option<String>,
}

/// A call that did not succeed: the server's status and problem, or why it could not be made.
#[derive(Debug)]
pub struct Failure {
    pub status: Option<StatusCode>,
    pub code: Option<String>,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.status, &self.code) {
            (Some(s), Some(c)) => write!(f, "{} {c}: {}", s.as_u16(), self.message),
            (Some(s), None) => write!(f, "{}: {}", s.as_u16(), self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl Api {
    /// # Errors
    /// When the HTTP client cannot be built (no TLS provider).
    pub fn new(base: &str, key: Option<String>) -> reqwest::Result<Api> {
        Ok(Api {
            client: crate::net::client_builder()
                .connect_timeout(Duration::from_secs(10))
                .build()?,
            base: base.trim_end_matches('/').to_owned(),
            key: key.filter(|k| !k.trim().is_empty()),
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.client.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(k) => req.bearer_auth(k),
            None => req,
        }
    }

    /// `GET path` as JSON.
    ///
    /// # Errors
    /// The server's problem, or why the call could not be made.
    pub async fn get(&self, path: &str) -> Result<Value, Failure> {
        let req = self
            .request(reqwest::Method::GET, path)
            .timeout(Duration::from_secs(30));
        answer(req.send().await, self.key.is_some()).await
    }

    /// `POST path` with a JSON body (or none).
    ///
    /// # Errors
    /// The server's problem, or why the call could not be made.
    pub async fn post(&self, path: &str, body: Option<&Value>) -> Result<Value, Failure> {
        let mut req = self
            .request(reqwest::Method::POST, path)
            .timeout(Duration::from_secs(30));
        if let Some(b) = body {
            req = req.json(b);
        }
        answer(req.send().await, self.key.is_some()).await
    }
}

/// The JSON an answer carries, or a failure worded for a person; `key_sent` tells a key the
/// server refused from a key that is missing.
async fn answer(
    sent: reqwest::Result<reqwest::Response>,
    key_sent: bool,
) -> Result<Value, Failure> {
    let resp = sent.map_err(unreachable_failure)?;
    let status = resp.status();
    let text = resp.text().await.map_err(unreachable_failure)?;
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if status.is_success() {
        return Ok(body);
    }
    let message = match status {
        StatusCode::UNAUTHORIZED if key_sent => {
            "the key was refused: check --api-key (or PES_API_KEY) against the server's \
             PES_API_KEYS"
                .to_owned()
        }
        StatusCode::UNAUTHORIZED => {
            "the server needs an API key: pass --api-key or set PES_API_KEY".to_owned()
        }
        _ => body["detail"]
            .as_str()
            .or_else(|| body.as_str())
            .unwrap_or("no detail")
            .to_owned(),
    };
    Err(Failure {
        status: Some(status),
        code: body["code"].as_str().map(str::to_owned),
        message,
    })
}

fn unreachable_failure(e: reqwest::Error) -> Failure {
    // The chain says what went wrong underneath (refused, reset, DNS).
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message = format!("{message}: {s}");
        source = s.source();
    }
    if e.is_connect() {
        message.push_str(
            " (is the service running there? pass --url, or set PES_BIND to its address)",
        );
    }
    Failure {
        status: None,
        code: None,
        message,
    }
}

/// What the stream follower reports.
#[derive(Debug)]
pub enum StreamMsg {
    /// The next observation of the run (each exactly once, in `seq` order).
    Observation(Value),
    /// The connection was lost; it is being made again.
    Lost(String),
    /// Connected again after a loss, resuming after this `seq`.
    Back(i64),
    /// The stream cannot go on (the thread was deleted, the key refused).
    Ended(String),
}

/// A task that follows the stream; aborted when dropped, so it never outlives the client.
pub struct Follower(tokio::task::JoinHandle<()>);

impl Drop for Follower {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Follow the observations of `run` on `thread` until dropped.
pub fn follow(api: Api, thread: String, run: String) -> (mpsc::Receiver<StreamMsg>, Follower) {
    let (tx, rx) = mpsc::channel(256);
    // Aborted when the `Follower` is dropped: it lives exactly as long as the session using it.
    #[allow(clippy::disallowed_methods)]
    let task = tokio::spawn(async move {
        let path = format!("/v1/threads/{thread}/events?runId={run}");
        let mut last = 0_i64;
        let mut delay = RETRY_MIN;
        let mut lost = false;
        loop {
            let mut req = api
                .request(reqwest::Method::GET, &path)
                .header("accept", "text/event-stream");
            if last > 0 {
                req = req.header("last-event-id", last.to_string());
            }
            let why = match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    if lost {
                        lost = false;
                        if tx.send(StreamMsg::Back(last)).await.is_err() {
                            return;
                        }
                    }
                    delay = RETRY_MIN;
                    match read_frames(resp, &mut last, &tx).await {
                        Frames::Closed => return,
                        Frames::Deleted => {
                            let _ = tx
                                .send(StreamMsg::Ended("the thread was deleted".into()))
                                .await;
                            return;
                        }
                        Frames::Broken(why) => why,
                    }
                }
                Ok(resp) if resp.status().is_client_error() => {
                    let failure = answer(Ok(resp), api.key.is_some()).await.err();
                    let text = failure.map_or_else(|| "refused".into(), |f| f.to_string());
                    let _ = tx.send(StreamMsg::Ended(text)).await;
                    return;
                }
                Ok(resp) => format!("the server answered {}", resp.status()),
                Err(e) => unreachable_failure(e).message,
            };
            if !lost {
                lost = true;
                if tx.send(StreamMsg::Lost(why)).await.is_err() {
                    return;
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(RETRY_MAX);
        }
    });
    (rx, Follower(task))
}

enum Frames {
    /// The receiver is gone: stop.
    Closed,
    Deleted,
    /// The connection broke (or stalled): reconnect.
    Broken(String),
}

/// Read SSE frames until the connection ends, sending each new observation on.
async fn read_frames(
    mut resp: reqwest::Response,
    last: &mut i64,
    tx: &mpsc::Sender<StreamMsg>,
) -> Frames {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let chunk = match tokio::time::timeout(STALL, resp.chunk()).await {
            Err(_) => return Frames::Broken("no data for 45 s".into()),
            Ok(Err(e)) => return Frames::Broken(unreachable_failure(e).message),
            Ok(Ok(None)) => return Frames::Broken("the server ended the stream".into()),
            Ok(Ok(Some(c))) => c,
        };
        buf.extend_from_slice(&chunk);
        // Frames end with a blank line; split on bytes, so a character cut between two chunks
        // is whole again before it is decoded.
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let frame: Vec<u8> = buf.drain(..end + 2).collect();
            let frame = String::from_utf8_lossy(&frame);
            match parse_frame(&frame) {
                Frame::Deleted => return Frames::Deleted,
                Frame::Observation(seq, data) if seq > *last => {
                    let Ok(obs) = serde_json::from_str::<Value>(&data) else {
                        return Frames::Broken("an event that is not JSON".into());
                    };
                    *last = seq;
                    if tx.send(StreamMsg::Observation(obs)).await.is_err() {
                        return Frames::Closed;
                    }
                }
                Frame::Observation(..) | Frame::Other => {}
            }
        }
    }
}

#[derive(Debug, PartialEq)]
enum Frame {
    Observation(i64, String),
    Deleted,
    /// A keep-alive comment, or a frame without an id (never an observation).
    Other,
}

fn parse_frame(frame: &str) -> Frame {
    let (mut id, mut event, mut data) = (None, None, Vec::new());
    for line in frame.lines() {
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = value.parse::<i64>().ok(),
            "event" => event = Some(value),
            "data" => data.push(value),
            _ => {}
        }
    }
    if event == Some("THREAD_DELETED") {
        return Frame::Deleted;
    }
    match id {
        Some(seq) if !data.is_empty() => Frame::Observation(seq, data.join("\n")),
        _ => Frame::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_read_as_the_server_writes_them() {
        assert_eq!(
            parse_frame("id: 7\nevent: PLAN\ndata: {\"seq\":7}\n\n"),
            Frame::Observation(7, "{\"seq\":7}".into())
        );
        assert_eq!(parse_frame(": keep-alive\n\n"), Frame::Other);
        assert_eq!(
            parse_frame("event: THREAD_DELETED\ndata: {}\n\n"),
            Frame::Deleted
        );
        assert_eq!(parse_frame("event: token\ndata: {}\n\n"), Frame::Other);
    }
}
