//! The connection loop: accepts TCP connections and serves HTTP/1.1 on them with bounds, so that
//! silent, half-sent, idle and slow clients cannot hold sockets (and file descriptors) for ever.
//!
//! What it keeps true:
//! - **At most `PES_MAX_CONNECTIONS` connections are open.** At the cap, a new connection closes
//!   the oldest connection with no request in flight (a silent socket, a half-sent head, an idle
//!   keep-alive); when every open connection is busy, new ones wait in the accept backlog. So a
//!   flood of silent sockets cannot lock a well-behaved client out: each newcomer pushes out the
//!   stalest idle one, and a client that sends its request at once is served.
//! - **A request head arrives within `PES_HEADER_READ_TIMEOUT_SECONDS`** of the accept (or of the
//!   first byte of a later request on a kept-alive connection), or the connection is closed.
//! - **A kept-alive connection waits at most `PES_IDLE_TIMEOUT_SECONDS`** for its next request.
//! - **A request body arrives in full within `PES_BODY_READ_TIMEOUT_SECONDS`** of its head, or the
//!   handler sees [`BodyReadTimeout`] and the request is answered 408.
//! - **Heads within `PES_MAX_HEADER_BYTES` / `PES_MAX_URI_BYTES` are served; larger ones are
//!   answered 431 / 414 as problem+json** before routing. hyper's own parser limits (buffer, header
//!   count) are set above ours so that a client within our limits never meets hyper's bare,
//!   body-less 431; only a head far beyond them (more than our two limits plus 8 KiB on the wire)
//!   still gets hyper's own answer.
//! - **None of these clocks runs while a response is being sent**: an SSE stream or a `runs/wait`
//!   lasts as long as it needs.
//! - **Shutdown is graceful**: on the shutdown token the listener closes, idle connections close at
//!   once, and a connection with a request in flight finishes that response (SSE streams end with
//!   the same token) and then closes; [`serve`] returns when every connection is gone.
//!
//! The clocks are ours rather than hyper's `header_read_timeout`, because hyper restarts that
//! timer as soon as a response ends, so it cannot give an idle keep-alive connection longer than a
//! half-sent head; and the body deadline is a total one rather than tower-http's
//! `RequestBodyTimeout`, which restarts on every frame and so never stops a byte-a-second drip.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, Response};
use axum::response::IntoResponse;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;
use tracing::{debug, error};

use super::ApiError;
use crate::config::Config;

/// Room hyper's read buffer keeps beyond our two head limits: the request line's method and
/// version, bare-LF or padded header lines. A head within our limits never fills the buffer.
const HEAD_SLACK_BYTES: usize = 8 * 1024;

/// The bounds of every connection (see the module doc).
#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub max_header_bytes: usize,
    pub max_uri_bytes: usize,
}

impl ServeSettings {
    /// The settings `PES_*` configure.
    pub fn from_config(config: &Config) -> Self {
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        Self {
            header_read_timeout: Duration::from_secs(config.header_read_timeout_seconds.max(1)),
            body_read_timeout: Duration::from_secs(config.body_read_timeout_seconds.max(1)),
            idle_timeout: Duration::from_secs(config.idle_timeout_seconds.max(1)),
            max_connections: size(config.max_connections.max(1)),
            max_header_bytes: size(config.max_header_bytes.max(1)),
            max_uri_bytes: size(config.max_uri_bytes.max(1)),
        }
    }

    /// hyper's read buffer: our head limits plus slack, so hyper's own 431 stays out of reach.
    fn hyper_buf_size(&self) -> usize {
        (self.max_uri_bytes + self.max_header_bytes + HEAD_SLACK_BYTES).max(8192)
    }

    /// hyper's header count: a field costs at least 5 bytes by our count (a one-letter name,
    /// `: `, an empty value, CRLF), so a head within `max_header_bytes` has fewer fields.
    fn hyper_max_headers(&self) -> usize {
        (self.max_header_bytes / 4).max(100)
    }

    /// 414 or 431 when the head is over our limits.
    fn check_head<B>(&self, req: &Request<B>) -> Result<(), ApiError> {
        let uri = req.uri();
        let uri_size = uri.scheme_str().map_or(0, |s| s.len() + 3)
            + uri.authority().map_or(0, |a| a.as_str().len())
            + uri.path_and_query().map_or(0, |p| p.as_str().len());
        if uri_size > self.max_uri_bytes {
            return Err(ApiError::UriTooLong {
                size: uri_size,
                limit: self.max_uri_bytes,
            });
        }
        let header_size: usize = req
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum();
        if header_size > self.max_header_bytes {
            return Err(ApiError::HeadersTooLarge {
                size: header_size,
                limit: self.max_header_bytes,
            });
        }
        Ok(())
    }
}

/// Serve `router` on `listener` until `shutdown` fires, then drain (see the module doc).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: ServeSettings,
    shutdown: CancellationToken,
) {
    let shared = Arc::new(Shared {
        router,
        settings,
        open: Mutex::new(BTreeMap::new()),
        shutdown: shutdown.clone(),
    });
    let slots = Arc::new(Semaphore::new(shared.settings.max_connections));
    let connections = TaskTracker::new();
    let mut next_id: u64 = 0;
    loop {
        let accepted = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                backoff_after_accept_error(e).await;
                continue;
            }
        };
        let Some(slot) = make_room(&slots, &shared).await else {
            break;
        };
        next_id += 1;
        let conn = Arc::new(Conn::new(next_id));
        shared.lock_open().insert(next_id, conn.clone());
        connections.spawn(serve_connection(stream, conn, slot, shared.clone()));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// A connection slot: free, or made by closing the oldest idle connection, or (every connection
/// busy) the first one freed. None when the service shuts down meanwhile.
async fn make_room(slots: &Arc<Semaphore>, shared: &Shared) -> Option<OwnedSemaphorePermit> {
    loop {
        if let Ok(slot) = slots.clone().try_acquire_owned() {
            return Some(slot);
        }
        shared.evict_oldest_idle();
        tokio::select! {
            () = shared.shutdown.cancelled() => return None,
            slot = slots.clone().acquire_owned() => return slot.ok(),
            // An evicted connection closes at once, unless a request arrived on it just now (it
            // finishes that first); and when every connection was busy, one may have gone idle
            // since. Either way, look again shortly.
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// An accept error is either the peer's (ignore it) or the process's — out of file descriptors
/// or memory — and then accepting again at once would spin.
async fn backoff_after_accept_error(e: io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    ) {
        return;
    }
    error!(error = %e, "accepting a connection failed; is the open-file limit (ulimit -n) above PES_MAX_CONNECTIONS?");
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// What every connection task shares.
struct Shared {
    router: Router,
    settings: ServeSettings,
    /// Open connections by accept order (oldest first).
    open: Mutex<BTreeMap<u64, Arc<Conn>>>,
    shutdown: CancellationToken,
}

impl Shared {
    fn lock_open(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ask the oldest connection with no request in flight to close (none when all are busy).
    fn evict_oldest_idle(&self) {
        let open = self.lock_open();
        let victim = open
            .values()
            .find(|c| !c.evict.is_cancelled() && c.activity().busy == 0);
        if let Some(c) = victim {
            debug!(
                connection = c.id,
                "at PES_MAX_CONNECTIONS: closing the oldest idle connection"
            );
            c.evict.cancel();
        }
    }
}

/// One connection's state, shared by its task, its I/O and its requests.
struct Conn {
    id: u64,
    activity: Mutex<Activity>,
    /// Set while idle until the first byte of the next head arrives (a cheap check on every read).
    awaiting_first_byte: AtomicBool,
    /// Wakes the connection task to recompute its deadline.
    changed: Notify,
    /// Cancelled to make room for a new connection.
    evict: CancellationToken,
}

#[derive(Debug, Clone, Copy)]
struct Activity {
    /// Requests whose head was read and whose response has not ended.
    busy: u32,
    /// Accept time, or when the last response ended.
    idle_since: Instant,
    /// First byte of a new head while idle.
    head_started: Option<Instant>,
    /// Whether a response has ended on this connection (then the idle timeout applies).
    served: bool,
}

impl Conn {
    fn new(id: u64) -> Self {
        Self {
            id,
            activity: Mutex::new(Activity {
                busy: 0,
                idle_since: Instant::now(),
                head_started: None,
                served: false,
            }),
            awaiting_first_byte: AtomicBool::new(true),
            changed: Notify::new(),
            evict: CancellationToken::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn activity(&self) -> Activity {
        *self.lock()
    }

    /// When the connection is to be closed unless something happens; None while busy.
    fn deadline(&self, s: &ServeSettings) -> Option<Instant> {
        let a = self.activity();
        if a.busy > 0 {
            return None;
        }
        Some(match a.head_started {
            // A fresh connection's clock runs from the accept, however late its first byte.
            _ if !a.served => a.idle_since + s.header_read_timeout,
            Some(t) => t + s.header_read_timeout,
            None => a.idle_since + s.idle_timeout,
        })
    }

    fn on_bytes_read(&self) {
        if self.awaiting_first_byte.swap(false, Ordering::AcqRel) {
            let mut a = self.lock();
            if a.busy == 0 && a.head_started.is_none() {
                a.head_started = Some(Instant::now());
            }
            drop(a);
            self.changed.notify_one();
        }
    }

    fn begin_request(self: &Arc<Self>) -> InFlight {
        let mut a = self.lock();
        a.busy += 1;
        a.head_started = None;
        self.awaiting_first_byte.store(false, Ordering::Release);
        drop(a);
        self.changed.notify_one();
        InFlight(self.clone())
    }

    fn end_request(&self) {
        let mut a = self.lock();
        a.busy = a.busy.saturating_sub(1);
        if a.busy == 0 {
            a.idle_since = Instant::now();
            a.head_started = None;
            a.served = true;
            self.awaiting_first_byte.store(true, Ordering::Release);
        }
        drop(a);
        self.changed.notify_one();
    }
}

/// A request in flight on its connection, from its head until its response body is dropped
/// (hyper drops it once written, or when the connection dies).
struct InFlight(Arc<Conn>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

async fn serve_connection(
    stream: TcpStream,
    conn: Arc<Conn>,
    slot: OwnedSemaphorePermit,
    shared: Arc<Shared>,
) {
    let settings = &shared.settings;
    let io = TokioIo::new(WatchedIo {
        stream,
        conn: conn.clone(),
    });
    let service = RequestService {
        conn: conn.clone(),
        shared: shared.clone(),
    };
    let mut builder = http1::Builder::new();
    builder
        .keep_alive(true)
        .max_buf_size(settings.hyper_buf_size())
        .max_headers(settings.hyper_max_headers());
    let http = builder.serve_connection(io, service);
    let mut http = std::pin::pin!(http);
    let mut draining = false;
    loop {
        let deadline = conn.deadline(settings);
        tokio::select! {
            result = http.as_mut() => {
                if let Err(e) = result {
                    debug!(connection = conn.id, error = %e, "connection ended with an error");
                }
                break;
            }
            () = conn.changed.notified() => {}
            () = sleep_until(deadline) => {
                if conn.deadline(settings).is_some_and(|d| d <= Instant::now()) {
                    debug!(connection = conn.id, "closing a connection that sent no request in time");
                    break;
                }
            }
            () = stop_requested(&conn, &shared.shutdown), if !draining => {
                let a = conn.activity();
                if a.busy == 0 && a.head_started.is_some() {
                    break; // a half-sent head: nothing to finish
                }
                // hyper closes an idle connection at once (after flushing what it wrote) and
                // one with a request in flight once that response has ended.
                http.as_mut().graceful_shutdown();
                draining = true;
            }
        }
    }
    shared.lock_open().remove(&conn.id);
    drop(slot);
}

/// Eviction or shutdown.
async fn stop_requested(conn: &Conn, shutdown: &CancellationToken) {
    tokio::select! {
        () = conn.evict.cancelled() => {}
        () = shutdown.cancelled() => {}
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The TCP stream, telling its connection when the first byte of a head arrives.
struct WatchedIo {
    stream: TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for WatchedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.conn.on_bytes_read();
        }
        polled
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Per connection: checks the head, puts the body on its deadline, routes, and keeps the
/// connection busy until the response ends.
#[derive(Clone)]
struct RequestService {
    conn: Arc<Conn>,
    shared: Arc<Shared>,
}

impl hyper::service::Service<Request<Incoming>> for RequestService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let in_flight = self.conn.begin_request();
        let shared = self.shared.clone();
        Box::pin(async move {
            let settings = &shared.settings;
            let response = match settings.check_head(&req) {
                Err(problem) => {
                    // Answered before the router: give it the request id the router would have.
                    let id = req
                        .headers()
                        .get(super::REQUEST_ID)
                        .cloned()
                        .unwrap_or_else(|| {
                            axum::http::HeaderValue::from_str(&uuid::Uuid::new_v4().to_string())
                                .expect("a UUID is a valid header value")
                        });
                    tracing::info!(request_id = ?id, status = %problem.status(), "refused before routing");
                    let mut resp = problem.into_response();
                    resp.headers_mut().insert(super::REQUEST_ID, id);
                    resp
                }
                Ok(()) => {
                    let timeout = settings.body_read_timeout;
                    let req = req.map(|body| Body::new(DeadlineBody::new(body, timeout)));
                    match shared.router.clone().oneshot(req).await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    }
                }
            };
            Ok(response.map(|body| TrackedBody {
                body,
                _in_flight: in_flight,
            }))
        })
    }
}

/// A response body that holds its request's [`InFlight`] until hyper drops it.
struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The error a request body yields when it has not arrived in full by its deadline; the body
/// extractors map it to 408 `request_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} s", .0.as_secs())]
pub struct BodyReadTimeout(Duration);

impl BodyReadTimeout {
    /// The deadline, in whole seconds.
    pub fn seconds(&self) -> u64 {
        self.0.as_secs()
    }
}

/// A request body that must arrive in full within `timeout` of its creation (the request head).
/// The timer starts only when someone reads the body, so a request without one costs nothing.
struct DeadlineBody {
    body: Incoming,
    deadline: Instant,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl DeadlineBody {
    fn new(body: Incoming, timeout: Duration) -> Self {
        Self {
            body,
            deadline: Instant::now() + timeout,
            timeout,
            sleep: None,
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyReadTimeout(this.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
