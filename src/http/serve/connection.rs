//! One connection's task: the I/O that tells its state ([`Conn`]) when a head starts, and the
//! task that serves it until it ends, is evicted, or the service stops.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Shared;
use super::conn::Conn;
use super::request::RequestService;

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
