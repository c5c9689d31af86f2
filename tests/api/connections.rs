//! Connection bounds over real TCP on 127.0.0.1: silent, half-sent, stalled and idle connections
//! are closed on their clocks, a flood of silent sockets cannot lock a client out of `/healthz`,
//! an SSE stream outlives every clock, and oversized heads are answered as problem+json.
//!
//! The clocks are set to a second or a few so every test ends in seconds; each test asserts both
//! bounds of a close (not before its clock, not long after), so a wrong clock fails it.

use std::time::Duration;

use pes_server::config::Config;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::helpers::{Backend, SseReader, TestApp, spawn_with};

/// Short clocks: head 1 s, body 1 s, idle 3 s (distinct from the head clock on purpose).
fn short_clocks(c: &mut Config) {
    c.header_read_timeout_seconds = 1;
    c.body_read_timeout_seconds = 1;
    c.idle_timeout_seconds = 3;
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .expect("connects")
}

/// Everything the server sends until it closes the connection, and when it closed (from
/// `since`). Panics when it is still open after `limit`.
async fn until_closed(
    stream: &mut TcpStream,
    since: Instant,
    limit: Duration,
) -> (Vec<u8>, Duration) {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match tokio::time::timeout_at(since + limit, stream.read(&mut buf)).await {
            Err(_) => panic!(
                "still open after {limit:?}; received: {}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => return (got, since.elapsed()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// One parsed HTTP/1.1 response.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    /// Parse a head and a `Content-Length` body from the start of `bytes`; None while incomplete.
    fn parse(bytes: &[u8]) -> Option<(RawResponse, usize)> {
        let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        if bytes.len() < end + len {
            return None;
        }
        let body = bytes[end..end + len].to_vec();
        Some((
            RawResponse {
                status,
                headers,
                body,
            },
            end + len,
        ))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A problem+json answer with `status` and `code`.
    fn assert_problem(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        let body = self.json();
        assert_eq!(body["code"], code, "{body}");
        assert_eq!(body["status"], status, "{body}");
        // Refused before routing or not, every answer has a request id.
        assert!(self.header("x-request-id").is_some(), "{self:?}");
    }
}

/// Send `request` and read one response (the connection stays open).
async fn exchange(stream: &mut TcpStream, request: &[u8]) -> RawResponse {
    stream.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some((r, _)) = RawResponse::parse(&got) {
            return r;
        }
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("a response within 10 s")
            .expect("reading the response");
        assert!(
            n > 0,
            "closed before a full response: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_after_the_header_read_timeout() {
    let app = spawn_with(Backend::Sqlite, None, short_clocks).await;
    let mut stream = connect(&app).await;
    let (got, after) = until_closed(&mut stream, Instant::now(), Duration::from_secs(5)).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(
        after >= Duration::from_millis(900),
        "closed after {after:?}"
    );
    assert!(after < Duration::from_secs(3), "closed after {after:?}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_request_head_is_closed_at_the_header_read_timeout() {
    let app = spawn_with(Backend::Sqlite, None, short_clocks).await;
    let stream = connect(&app).await;
    let start = Instant::now();
    let (mut read, mut write) = stream.into_split();
    // A byte every 100 ms: each gap is far below the clock, the whole head never arrives.
    let trickle = tokio::spawn(async move {
        write
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
            .await?;
        for _ in 0..100 {
            write.write_all(b"X").await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok::<_, std::io::Error>(())
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let after = loop {
        match tokio::time::timeout_at(start + Duration::from_secs(5), read.read(&mut buf)).await {
            Err(_) => panic!("a trickled head held the connection for 5 s"),
            Ok(Ok(0)) | Ok(Err(_)) => break start.elapsed(),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    };
    trickle.abort();
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(
        after >= Duration::from_millis(900),
        "closed after {after:?}"
    );
    assert!(after < Duration::from_secs(3), "closed after {after:?}");
    app.stop().await;
}

/// The head clock of a new connection runs from the accept: a first byte sent late does not
/// restart it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_first_byte_does_not_restart_the_header_read_timeout() {
    let app = spawn_with(Backend::Sqlite, None, |c| c.header_read_timeout_seconds = 2).await;
    let mut stream = connect(&app).await;
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    let (got, after) = until_closed(&mut stream, start, Duration::from_secs(6)).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(
        after >= Duration::from_millis(1900),
        "closed after {after:?}"
    );
    assert!(
        after < Duration::from_millis(3000),
        "closed after {after:?}"
    );
    app.stop().await;
}

/// A body that stops and a body that drips a byte every 100 ms are both answered 408 at the
/// body clock: the deadline is for the whole body, not between bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_or_dripping_request_body_is_answered_408() {
    let app = spawn_with(Backend::Sqlite, None, short_clocks).await;
    let head = b"POST /v1/threads HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n";
    let stalled = async {
        let mut stream = connect(&app).await;
        let start = Instant::now();
        stream.write_all(head).await.unwrap();
        stream.write_all(b"{\"metadata\"").await.unwrap();
        until_closed(&mut stream, start, Duration::from_secs(5)).await
    };
    let dripping = async {
        let stream = connect(&app).await;
        let start = Instant::now();
        let (mut read, mut write) = stream.into_split();
        write.write_all(head).await.unwrap();
        let drip = tokio::spawn(async move {
            for _ in 0..99 {
                write.write_all(b" ").await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok::<_, std::io::Error>(())
        });
        let mut got = Vec::new();
        read.read_to_end(&mut got).await.ok();
        drip.abort();
        (got, start.elapsed())
    };
    let ((stalled, stalled_after), (dripped, dripped_after)) = tokio::join!(stalled, dripping);
    for (got, after) in [(stalled, stalled_after), (dripped, dripped_after)] {
        let (response, _) = RawResponse::parse(&got)
            .unwrap_or_else(|| panic!("no response: {}", String::from_utf8_lossy(&got)));
        response.assert_problem(408, "request_timeout");
        assert!(
            after >= Duration::from_millis(900),
            "answered after {after:?}"
        );
        assert!(after < Duration::from_secs(3), "answered after {after:?}");
    }
    app.stop().await;
}

/// After a response the connection may stay idle for the idle clock (3 s here), longer than the
/// head clock (1 s); then it is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let app = spawn_with(Backend::Sqlite, None, short_clocks).await;
    let mut stream = connect(&app).await;
    assert_eq!(exchange(&mut stream, HEALTHZ).await.status, 200);
    // Idle for longer than the head clock: the connection is still there.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(exchange(&mut stream, HEALTHZ).await.status, 200);
    let (got, after) = until_closed(&mut stream, Instant::now(), Duration::from_secs(8)).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(
        after >= Duration::from_millis(2700),
        "closed after {after:?}"
    );
    assert!(after < Duration::from_secs(5), "closed after {after:?}");
    app.stop().await;
}

/// 200 silent sockets against a cap of 50, with a head clock of 20 s so that only eviction can
/// save `/healthz`: it answers at once, the stalest silent sockets are closed to make room,
/// and an SSE stream (a busy connection) is never evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_while_silent_sockets_fill_the_connection_cap() {
    let app = spawn_with(Backend::Sqlite, None, |c| {
        c.max_connections = 50;
        c.header_read_timeout_seconds = 20;
        c.sse_keepalive_seconds = 1;
    })
    .await;
    let thread = app.thread(serde_json::json!({})).await;
    let sse = pes_server::net::client_builder()
        .build()
        .unwrap()
        .get(app.url(&format!("/v1/threads/{thread}/events")))
        .send()
        .await
        .unwrap();
    let mut sse = SseReader::new(sse);

    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(connect(&app).await);
    }
    let fresh = pes_server::net::client_builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let start = Instant::now();
    let health = fresh.get(app.url("/healthz")).send().await.unwrap();
    let took = start.elapsed();
    assert_eq!(health.status(), 200);
    assert!(took < Duration::from_secs(5), "/healthz took {took:?}");

    // The cap held: at least 200 + 2 - 50 silent sockets were closed by the server (well
    // before their 20 s head clock).
    let closed = futures::future::join_all(silent.iter_mut().map(|s| async move {
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }))
    .await
    .into_iter()
    .filter(|c| *c)
    .count();
    assert!(
        closed >= 150,
        "only {closed} of 200 silent sockets were closed"
    );

    // The stream was busy, so it was not evicted: keep-alives still flow.
    let frame = sse.next(Duration::from_secs(5)).await.expect("stream open");
    assert!(frame.comment, "{frame:?}");
    app.stop().await;
}

/// At a cap of 1 with that connection busy, a new client waits; as soon as the busy one's
/// response ends (it stays kept-alive, idle), the newcomer takes its place — not after the idle
/// clock (20 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_waiting_at_the_cap_takes_the_place_of_a_connection_gone_idle() {
    let app = spawn_with(Backend::Sqlite, None, |c| {
        c.max_connections = 1;
        c.idle_timeout_seconds = 20;
    })
    .await;
    let body = br#"{"metadata":{}}"#;
    let mut busy = connect(&app).await;
    // `Expect: 100-continue`: the server says "100 Continue" once the handler reads the body,
    // so the connection is known to be busy (a half-sent head would be idle, and evicted).
    let head = format!(
        "POST /v1/threads HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    busy.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = busy.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before 100 Continue");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    busy.write_all(&body[..5]).await.unwrap();

    let waiting = connect(&app).await;
    let newcomer = tokio::spawn(async move {
        let mut waiting = waiting;
        exchange(&mut waiting, HEALTHZ).await.status
    });
    // The body completes within its clock: the busy connection answers and goes idle.
    busy.write_all(&body[5..]).await.unwrap();
    got.clear();
    let created = loop {
        if let Some((r, _)) = RawResponse::parse(&got) {
            break r;
        }
        let n = busy.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before answering");
        got.extend_from_slice(&buf[..n]);
    };
    assert_eq!(created.status, 201, "{created:?}");
    let idle_since = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(5), newcomer)
        .await
        .expect("the waiting client is served within 5 s of a connection going idle")
        .unwrap();
    assert_eq!(status, 200);
    assert!(idle_since.elapsed() < Duration::from_secs(5));
    // The idle connection made room: it was closed.
    let (_, _) = until_closed(&mut busy, idle_since, Duration::from_secs(5)).await;
    app.stop().await;
}

/// An SSE stream lives past the head clock (1 s) and the idle clock (1 s) while keep-alives
/// (every second) flow.
async fn an_sse_stream_outlives_the_connection_clocks(backend: Backend) {
    let app = spawn_with(backend, None, |c| {
        short_clocks(c);
        c.idle_timeout_seconds = 1;
        c.sse_keepalive_seconds = 1;
    })
    .await;
    let thread = app.thread(serde_json::json!({})).await;
    let r = app
        .client
        .get(app.url(&format!("/v1/threads/{thread}/events")))
        .send()
        .await
        .unwrap();
    let mut sse = SseReader::new(r);
    let start = Instant::now();
    let mut keepalives = 0;
    while start.elapsed() < Duration::from_millis(3500) {
        let frame = sse
            .next(Duration::from_secs(3))
            .await
            .expect("the stream stays open");
        if frame.comment {
            keepalives += 1;
        }
    }
    assert!(keepalives >= 3, "{keepalives} keep-alives in 3.5 s");
    app.stop().await;
}
crate::both_stores!(
    an_sse_stream_outlives_the_header_and_idle_timeouts,
    an_sse_stream_outlives_the_connection_clocks
);

/// 414 and 431 are problem+json with their codes; heads at the limits, and many small headers
/// (far more than the HTTP parser's default of 100), are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_are_answered_as_problem_json() {
    let app = spawn_with(Backend::Sqlite, None, |c| {
        c.max_uri_bytes = 1024;
        c.max_header_bytes = 16 * 1024;
    })
    .await;
    let get = |target: String, headers: String| {
        format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n").into_bytes()
    };
    let mut stream = connect(&app).await;

    // "/healthz?p=" is 11 bytes.
    let at_limit = format!("/healthz?p={}", "a".repeat(1024 - 11));
    let r = exchange(&mut stream, &get(at_limit, String::new())).await;
    assert_eq!(r.status, 200, "{r:?}");
    let over = format!("/healthz?p={}", "a".repeat(1024 - 10));
    exchange(&mut stream, &get(over, String::new()))
        .await
        .assert_problem(414, "uri_too_long");

    // 1000 headers of 9 bytes each by our count ("hNNN" ": " "v" CRLF): within 16 KiB.
    let many: String = (0..1000).map(|i| format!("h{i:03}: v\r\n")).collect();
    let r = exchange(&mut stream, &get("/healthz".into(), many)).await;
    assert_eq!(r.status, 200, "{r:?}");
    // 2000 of them: over 16 KiB.
    let too_many: String = (0..2000).map(|i| format!("h{i:04}: v\r\n")).collect();
    exchange(&mut stream, &get("/healthz".into(), too_many))
        .await
        .assert_problem(431, "headers_too_large");
    // One 20 KiB header.
    let big = format!("x-pad: {}\r\n", "p".repeat(20 * 1024));
    exchange(&mut stream, &get("/healthz".into(), big))
        .await
        .assert_problem(431, "headers_too_large");
    // The connection served all of that and is still usable.
    assert_eq!(exchange(&mut stream, HEALTHZ).await.status, 200);

    app.stop().await;
}

/// Shutdown does not wait for clients that send nothing: silent, half-sent and idle connections
/// close at once, an SSE stream ends, and the server returns well before any head clock (20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_connections_and_ends_streams_at_once() {
    let app = spawn_with(Backend::Sqlite, None, |c| {
        c.header_read_timeout_seconds = 20;
        c.idle_timeout_seconds = 20;
    })
    .await;
    let thread = app.thread(serde_json::json!({})).await;
    let r = app
        .client
        .get(app.url(&format!("/v1/threads/{thread}/events")))
        .send()
        .await
        .unwrap();
    let mut sse = SseReader::new(r);
    let mut silent = connect(&app).await;
    let mut half_sent = connect(&app).await;
    half_sent
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut idle = connect(&app).await;
    assert_eq!(exchange(&mut idle, HEALTHZ).await.status, 200);

    let start = Instant::now();
    app.token.cancel();
    tokio::time::timeout(Duration::from_secs(5), app.handle)
        .await
        .expect("the server stops within 5 s")
        .unwrap()
        .expect("a clean stop");
    for stream in [&mut silent, &mut half_sent, &mut idle] {
        let (got, _) = until_closed(stream, start, Duration::from_secs(5)).await;
        assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    }
    assert!(
        sse.next(Duration::from_secs(5)).await.is_none(),
        "the stream ends"
    );
}
