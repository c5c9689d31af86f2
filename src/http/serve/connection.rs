//! One connection: its clocks (the head's, the idle keep-alive's), the I/O that tells it when a
//! head starts, and the task that serves it until it ends, is evicted, or the service stops.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::request::RequestService;
use super::{ServeSettings, Shared};

/// One connection's state, shared by its task, its I/O and its requests.
pub(super) struct Conn {
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
    pub(super) fn new(id: u64) -> Self {
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

    /// Whether it may be closed to make room: no request in flight, not asked to close already.
    pub(super) fn evictable(&self) -> bool {
        !self.evict.is_cancelled() && self.activity().busy == 0
    }

    /// Ask it to close, to make room for a new connection.
    pub(super) fn evict(&self) {
        debug!(
            connection = self.id,
            "at PES_MAX_CONNECTIONS: closing the oldest idle connection"
        );
        self.evict.cancel();
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

    pub(super) fn begin_request(self: &Arc<Self>) -> InFlight {
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
pub(super) struct InFlight(Arc<Conn>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

pub(super) async fn serve_connection(
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
