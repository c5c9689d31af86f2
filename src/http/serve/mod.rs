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
//!
//! The files: this one holds the settings, the accept loop and the choice of which connection
//! makes room; `connection` one connection's clocks and I/O; `request` one request on it (the
//! head check, the body's deadline, the response that keeps the connection busy).

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::http::Request;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::error;

use super::ApiError;
use crate::config::Config;
use conn::Conn;
use connection::serve_connection;

mod conn;
mod connection;
mod request;

pub use request::BodyReadTimeout;

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
        if let Some(c) = open.values().find(|c| c.evictable()) {
            c.evict();
        }
    }
}
