//! Events: what this process learns happened, and whom it tells.
//!
//! - [`bus`]: the in-process fan-out of committed observations to SSE streams and waiters;
//! - [`tokens`]: the ephemeral token deltas of the runs, to the streams that asked for them
//!   (never stored, so never the truth of anything);
//! - [`token_relay`]: those deltas between replicas, sent only while another replica streams
//!   the thread (Postgres NOTIFY).
//!
//! Wake-ups from other replicas are delivered by [`crate::commands::replicas`], to this bus, the
//! worker and the runs driven here. The bus only wakes: the tables are the truth, and whoever is
//! woken re-reads them.

pub mod bus;
mod delta;
pub mod token_relay;
pub mod tokens;

pub use bus::{BusMsg, EventBus};
pub use tokens::{TokenChannels, TokenDelta, TokenSubscription};
