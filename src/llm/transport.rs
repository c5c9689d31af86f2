//! What the HTTP providers (`openai`, `anthropic`) share: the transport policy and the reading of
//! a reply. One [`Transport`] per provider holds its client and the cap on calls in flight;
//! [`Transport::call`] is one model call: attempts (wait for a turn, send, read the whole reply,
//! or feed a streamed one event by event to a [`StreamedReply`]) until one succeeds, fails for
//! good, or the transient failures (429, 500, 502, 503, 504, 529, connection errors, timeouts, a
//! stream that broke off or reported an error) exhaust the retries, each waited out with
//! exponential backoff and jitter or the provider's `Retry-After` ([`Retrier`]). What a request
//! and a reply look like is each provider's [`Dialect`].

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use tracing::warn;

use super::{ChatResponse, LlmError, truncate};

/// Longest error body kept in [`LlmError::Rejected`] and [`LlmError::Unavailable`].
pub const MAX_ERROR_BODY: usize = 2048;
/// Longest `Retry-After` we honour; a longer one is cut to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// How a provider talks HTTP: the same settings for every provider (`PES_LLM_TIMEOUT_SECONDS`,
/// `PES_LLM_MAX_RETRIES`, `PES_LLM_MAX_IN_FLIGHT`, `PES_LLM_STREAM`).
#[derive(Debug, Clone, PartialEq)]
pub struct TransportConfig {
    /// Bound on one HTTP attempt (connect, send and read the whole reply, streamed or not).
    pub timeout: Duration,
    /// Retries of a transient failure after the first attempt.
    pub max_retries: u32,
    /// First backoff; doubled on each retry, with jitter.
    pub initial_backoff: Duration,
    /// Cap of the computed backoff.
    pub max_backoff: Duration,
    /// Model calls this provider has in flight at once, at most; more wait their turn. Each call
    /// holds a socket, and parallel items multiply calls per run: without a cap, thousands of
    /// runs answered at once exhaust file descriptors and fail their calls instead of queueing.
    pub max_in_flight: usize,
    /// Ask for streamed replies (`stream: true`), so the text reaches a request's token sink as
    /// the model writes it; the assembled reply is the one a non-streamed call returns.
    pub stream: bool,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(120),
            max_retries: 3,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            max_in_flight: 4096,
            stream: true,
        }
    }
}

impl TransportConfig {
    /// Backoff before retry number `retry` (0-based): exponential, capped, with "equal jitter"
    /// (half fixed, half random) so synchronized clients spread out.
    pub fn backoff(&self, retry: u32) -> Duration {
        let base = self
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(retry.min(16)))
            .min(self.max_backoff);
        let half = base / 2;
        let jitter_ms = u64::try_from(half.as_millis()).unwrap_or(u64::MAX);
        let extra = if jitter_ms == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(rand::rng().random_range(0..=jitter_ms))
        };
        half + extra
    }
}

/// A status worth another attempt: rate limits, server errors, and Anthropic's 529 (overloaded).
pub fn is_transient(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 500 | 502 | 503 | 504 | 529)
}

/// `Retry-After` as a delay: seconds (fractional accepted) or an HTTP date, capped.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let delay = if let Ok(secs) = text.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 {
            return None;
        }
        Duration::from_secs_f64(secs.min(MAX_RETRY_AFTER.as_secs_f64()))
    } else {
        let at = chrono::DateTime::parse_from_rfc2822(text).ok()?;
        let ms = (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_milliseconds();
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    };
    Some(delay.min(MAX_RETRY_AFTER))
}

/// Counts the retries of one model call and waits before the next attempt.
pub struct Retrier<'a> {
    cfg: &'a TransportConfig,
    provider: &'static str,
    model: &'a str,
    retries: u32,
}

impl<'a> Retrier<'a> {
    pub fn new(cfg: &'a TransportConfig, provider: &'static str, model: &'a str) -> Self {
        Self {
            cfg,
            provider,
            model,
            retries: 0,
        }
    }

    /// An attempt failed transiently: wait (`wait` when the provider said how long, else the
    /// backoff) and return, or give up when the retries are spent.
    ///
    /// # Errors
    /// [`LlmError::Unavailable`] naming the last problem and the attempts made.
    pub async fn transient(
        &mut self,
        problem: String,
        wait: Option<Duration>,
    ) -> Result<(), LlmError> {
        if self.retries >= self.cfg.max_retries {
            return Err(LlmError::Unavailable(format!(
                "{problem} (after {} attempts)",
                self.retries + 1
            )));
        }
        let delay = wait.unwrap_or_else(|| self.cfg.backoff(self.retries));
        self.retries += 1;
        warn!(
            provider = self.provider,
            model = self.model,
            retry = self.retries,
            max_retries = self.cfg.max_retries,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            %problem,
            "transient LLM provider error; retrying"
        );
        tokio::time::sleep(delay).await;
        Ok(())
    }
}

/// One Server-Sent Event of a streamed reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field (Anthropic names its events; OpenAI sends none).
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Splits a byte stream into [`SseEvent`]s (`\n`, `\r\n` and `\r` line ends; comments and
/// unknown fields skipped; a UTF-8 character split across chunks is kept whole).
#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    event: SseEvent,
    has_data: bool,
}

impl SseDecoder {
    /// Feed a chunk; the events it completes.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start..]
            .iter()
            .position(|b| *b == b'\n' || *b == b'\r')
        {
            let end = start + pos;
            // A `\r` at the very end may be the first half of `\r\n`: wait for the next chunk.
            if self.buf[end] == b'\r' && end + 1 == self.buf.len() {
                break;
            }
            let line = String::from_utf8_lossy(&self.buf[start..end]).into_owned();
            start = end + 1;
            if self.buf[end] == b'\r' && self.buf.get(start) == Some(&b'\n') {
                start += 1;
            }
            self.line(&line, &mut out);
        }
        self.buf.drain(..start);
        out
    }

    /// The event left without its closing blank line when the stream ended.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let rest = std::mem::take(&mut self.buf);
        let mut out = Vec::new();
        if !rest.is_empty() {
            self.line(&String::from_utf8_lossy(&rest), &mut out);
        }
        self.line("", &mut out);
        out.pop()
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.has_data {
                out.push(std::mem::take(&mut self.event));
            }
            self.event = SseEvent::default();
            self.has_data = false;
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event.event = Some(value.to_owned()),
            "data" => {
                if self.has_data {
                    self.event.data.push('\n');
                }
                self.event.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
    }
}

/// Why a streamed reply cannot go on.
#[derive(Debug)]
pub enum StreamFault {
    /// The provider reported an error in the stream (overloaded, server error): another attempt
    /// may succeed.
    Transient(String),
    /// The reply cannot be understood; another attempt would not help.
    Fatal(LlmError),
}

/// Takes a streamed reply event by event (a provider's assembler).
pub trait StreamReader: Send {
    /// One event, in order.
    ///
    /// # Errors
    /// A [`StreamFault`] ends the attempt.
    fn event(&mut self, event: SseEvent) -> Result<(), StreamFault>;
}

/// A [`StreamReader`] that makes the reply once the stream has ended.
pub trait StreamedReply: StreamReader {
    /// The reply the events made (usage without `llm_calls`).
    ///
    /// # Errors
    /// [`StreamFault::Transient`] for a stream that ended early; [`StreamFault::Fatal`] for a
    /// reply that cannot be understood.
    fn finish(self: Box<Self>) -> Result<ChatResponse, StreamFault>;
}

/// What a provider does with an error status that is not transient.
pub enum Refusal {
    /// The call fails with this error.
    Reject(LlmError),
    /// The provider changed its request: send it again (not counted as a retry).
    Again,
}

/// The part of a call that differs by API: the request, and what a reply means.
pub trait Dialect: Send {
    /// The request of the next attempt.
    fn request(&self) -> reqwest::RequestBuilder;
    /// A fresh reader for a streamed reply.
    fn reader(&self) -> Box<dyn StreamedReply>;
    /// A whole 2xx reply (usage without `llm_calls`).
    ///
    /// # Errors
    /// [`LlmError::BadReply`] when it cannot be understood.
    fn parse(&self, body: &str) -> Result<ChatResponse, LlmError>;
    /// An error status that is not transient.
    fn refused(&mut self, status: StatusCode, body: &str) -> Refusal;
    /// What an error body says, for messages.
    fn describe(&self, body: &str) -> String {
        truncate(body, MAX_ERROR_BODY)
    }
}

/// What one attempt brought back.
#[derive(Debug)]
pub enum Exchange {
    /// A whole reply: an error status, a non-streamed reply, or a server that answered a
    /// streamed request with plain JSON.
    Reply {
        status: StatusCode,
        retry_after: Option<Duration>,
        body: String,
    },
    /// A 2xx stream, every event of which the reader took.
    Streamed,
    /// No usable reply (cannot connect, timed out, the stream broke off or reported a transient
    /// error): worth another attempt.
    Failed(String),
}

/// A provider's HTTP client and its cap on calls in flight.
#[derive(Debug, Clone)]
pub struct Transport {
    pub cfg: TransportConfig,
    pub client: reqwest::Client,
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl Transport {
    /// A client bounded by `cfg.timeout`.
    ///
    /// # Errors
    /// The HTTP client cannot be built (e.g. no TLS backend).
    pub fn new(cfg: TransportConfig) -> Result<Self, reqwest::Error> {
        let client = crate::net::client_builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout.min(Duration::from_secs(10)))
            .build()?;
        Ok(Self {
            in_flight: Arc::new(tokio::sync::Semaphore::new(cfg.max_in_flight.max(1))),
            cfg,
            client,
        })
    }

    /// Send one request and read its reply whole; a 2xx `text/event-stream` reply goes to
    /// `reader` event by event instead (when there is one). The turn (a permit of the in-flight
    /// cap) is held until the reply is read; a call past the cap queues, it does not fail.
    ///
    /// # Errors
    /// [`LlmError::Unavailable`] when the client was shut down; a reader's fatal fault.
    pub async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
        reader: Option<&mut dyn StreamReader>,
    ) -> Result<Exchange, LlmError> {
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| LlmError::Unavailable("the model client was shut down".into()))?;
        let mut resp = match request.send().await {
            Ok(resp) => resp,
            Err(e) => return Ok(Exchange::Failed(self.describe(&e))),
        };
        let status = resp.status();
        let streamed = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let reader = match reader {
            Some(r) if status.is_success() && streamed => r,
            _ => {
                let retry_after = retry_after(resp.headers());
                return Ok(match resp.text().await {
                    Ok(body) => Exchange::Reply {
                        status,
                        retry_after,
                        body,
                    },
                    Err(e) => Exchange::Failed(format!("reading the reply failed: {e}")),
                });
            }
        };
        let mut decoder = SseDecoder::default();
        loop {
            let events = match resp.chunk().await {
                Ok(Some(chunk)) => decoder.push(&chunk),
                Ok(None) => {
                    if let Some(event) = decoder.finish()
                        && let Some(failed) = feed(reader, event)?
                    {
                        return Ok(failed);
                    }
                    return Ok(Exchange::Streamed);
                }
                Err(e) if e.is_timeout() => {
                    return Ok(Exchange::Failed(format!(
                        "the streamed reply timed out after {:?}",
                        self.cfg.timeout
                    )));
                }
                Err(e) => return Ok(Exchange::Failed(format!("the stream broke off: {e}"))),
            };
            for event in events {
                if let Some(failed) = feed(reader, event)? {
                    return Ok(failed);
                }
            }
        }
    }

    /// One model call of `provider` to `model`: attempts until one succeeds, fails for good,
    /// or transient failures exhaust the retries. `llm_calls` of the reply counts every attempt
    /// that got a reply.
    ///
    /// # Errors
    /// [`LlmError::Unavailable`] when the retries are spent; the dialect's rejections and
    /// unreadable replies.
    pub async fn call(
        &self,
        provider: &'static str,
        model: &str,
        dialect: &mut dyn Dialect,
    ) -> Result<ChatResponse, LlmError> {
        let mut replies: u64 = 0;
        let mut retrier = Retrier::new(&self.cfg, provider, model);
        loop {
            let mut reader = self.cfg.stream.then(|| dialect.reader());
            let exchange = self
                .exchange(
                    dialect.request(),
                    reader.as_mut().map(|r| r.as_mut() as &mut dyn StreamReader),
                )
                .await?;
            let reply = match exchange {
                Exchange::Streamed => {
                    replies += 1;
                    match reader.map(|r| r.finish()) {
                        Some(Ok(reply)) => Ok(reply),
                        Some(Err(StreamFault::Fatal(e))) => return Err(e),
                        Some(Err(StreamFault::Transient(problem))) => Err((problem, None)),
                        None => Err(("no stream was read".to_owned(), None)),
                    }
                }
                Exchange::Reply {
                    status,
                    retry_after,
                    body,
                } => {
                    replies += 1;
                    if status.is_success() {
                        Ok(dialect.parse(&body)?)
                    } else if !is_transient(status) {
                        match dialect.refused(status, &body) {
                            Refusal::Reject(e) => return Err(e),
                            Refusal::Again => continue,
                        }
                    } else {
                        let problem =
                            format!("HTTP {}: {}", status.as_u16(), dialect.describe(&body));
                        Err((problem, retry_after))
                    }
                }
                Exchange::Failed(problem) => Err((problem, None)),
            };
            match reply {
                Ok(mut reply) => {
                    reply.usage.llm_calls = replies;
                    tracing::debug!(provider, model, calls = replies, "model reply");
                    return Ok(reply);
                }
                Err((problem, wait)) => retrier.transient(problem, wait).await?,
            }
        }
    }

    fn describe(&self, e: &reqwest::Error) -> String {
        if e.is_timeout() {
            format!("timed out after {:?}", self.cfg.timeout)
        } else if e.is_connect() {
            format!("could not connect: {e}")
        } else {
            format!("request failed: {e}")
        }
    }
}

/// Hand one event to the reader: `Some(Failed)` for a transient fault in the stream.
fn feed(reader: &mut dyn StreamReader, event: SseEvent) -> Result<Option<Exchange>, LlmError> {
    match reader.event(event) {
        Ok(()) => Ok(None),
        Err(StreamFault::Transient(problem)) => {
            Ok(Some(Exchange::Failed(truncate(&problem, MAX_ERROR_BODY))))
        }
        Err(StreamFault::Fatal(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decoder_joins_data_lines_and_survives_any_chunking() {
        let text = "event: a\r\ndata: {\"x\":\r\ndata: 1}\r\n\r\n: comment\n\ndata: é\n\nid: 3\ndata: [DONE]\n\n";
        let whole = SseDecoder::default().push(text.as_bytes());
        assert_eq!(
            whole,
            vec![
                SseEvent {
                    event: Some("a".into()),
                    data: "{\"x\":\n1}".into()
                },
                SseEvent {
                    event: None,
                    data: "é".into()
                },
                SseEvent {
                    event: None,
                    data: "[DONE]".into()
                },
            ]
        );
        // One byte at a time: the same events (the `é` split across chunks stays whole).
        let mut d = SseDecoder::default();
        let bytewise: Vec<SseEvent> = text.as_bytes().iter().flat_map(|b| d.push(&[*b])).collect();
        assert_eq!(bytewise, whole);
        // A last event without its blank line is still read at the end.
        let mut d = SseDecoder::default();
        assert!(d.push(b"data: tail").is_empty());
        assert_eq!(d.finish().map(|e| e.data), Some("tail".into()));
    }

    #[test]
    fn backoff_is_bounded_and_retry_after_is_read() {
        let cfg = TransportConfig {
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(1),
            ..Default::default()
        };
        for retry in 0..40 {
            let d = cfg.backoff(retry);
            assert!(d <= Duration::from_secs(1), "{d:?}");
        }
        assert!(cfg.backoff(0) >= Duration::from_millis(100));
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, "120".parse().unwrap());
        assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER));
        h.insert(RETRY_AFTER, "1.5".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(1500)));
        h.insert(
            RETRY_AFTER,
            "Sun, 06 Nov 1994 08:49:37 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
        assert!(is_transient(StatusCode::from_u16(529).unwrap()));
        assert!(!is_transient(StatusCode::BAD_REQUEST));
    }
}
