//! What the service says about itself: whether it is ready (the store reachable and migrated,
//! no shutdown under way), which store it runs on, and the levels the metrics show (runs driven
//! here, streams, what waits in the store).

use super::UseCases;
use crate::store::{Backlog, StoreError, StoreResult};

/// Why the service cannot take work now.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("shutting down")]
    ShuttingDown,
    /// The store is unreachable, or not migrated to this build's schema.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How busy this replica is, as the metrics' gauges show it.
#[derive(Debug, Clone, Copy)]
pub struct Busy {
    /// Runs this process drives now.
    pub runs_in_flight: usize,
    /// Streams following a thread here.
    pub stream_subscribers: usize,
    /// Threads with at least one follower here.
    pub streamed_threads: usize,
    /// Threads whose model text another replica relays here.
    pub token_remote_threads: usize,
}

impl UseCases {
    /// Whether the service can take work: not shutting down, the store reachable and migrated.
    ///
    /// # Errors
    /// Why not.
    pub async fn ready(&self) -> Result<(), NotReady> {
        if self.shutdown.is_cancelled() {
            return Err(NotReady::ShuttingDown);
        }
        Ok(self.store.ready().await?)
    }

    /// `postgres` or `sqlite`.
    pub fn backend(&self) -> &'static str {
        self.store.backend()
    }

    /// What waits in the store (every tenant's): queued runs and pending suspensions.
    ///
    /// # Errors
    /// The store fails.
    pub async fn backlog(&self) -> StoreResult<Backlog> {
        self.store.backlog().await
    }

    /// How busy this replica is now.
    pub fn busy(&self) -> Busy {
        let bus = self.commands.bus();
        Busy {
            runs_in_flight: self.commands.runs().len(),
            stream_subscribers: bus.subscribers(),
            streamed_threads: bus.subscribed_threads(),
            token_remote_threads: bus.tokens().remotely_wanted(),
        }
    }
}
