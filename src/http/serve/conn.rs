//! One connection's state, shared by its task, its I/O and its requests: its clocks (the
//! head's, the idle keep-alive's), how many requests are in flight, and whether it was asked to
//! close to make room.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::ServeSettings;

/// One connection's state, shared by its task, its I/O and its requests.
pub(super) struct Conn {
    pub(super) id: u64,
    activity: Mutex<Activity>,
    /// Set while idle until the first byte of the next head arrives (a cheap check on every read).
    awaiting_first_byte: AtomicBool,
    /// Wakes the connection task to recompute its deadline.
    pub(super) changed: Notify,
    /// Cancelled to make room for a new connection.
    pub(super) evict: CancellationToken,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Activity {
    /// Requests whose head was read and whose response has not ended.
    pub(super) busy: u32,
    /// Accept time, or when the last response ended.
    pub(super) idle_since: Instant,
    /// First byte of a new head while idle.
    pub(super) head_started: Option<Instant>,
    /// Whether a response has ended on this connection (then the idle timeout applies).
    pub(super) served: bool,
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

    pub(super) fn activity(&self) -> Activity {
        *self.lock()
    }

    /// When the connection is to be closed unless something happens; None while busy.
    pub(super) fn deadline(&self, s: &ServeSettings) -> Option<Instant> {
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

    pub(super) fn on_bytes_read(&self) {
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
