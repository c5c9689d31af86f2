//! Events: what this process learns happened, and whom it tells.
//!
//! - [`bus`]: the in-process fan-out of committed observations to SSE streams and waiters;
//! - [`replicas`]: wake-ups from other processes sharing the store (Postgres LISTEN, and a poll
//!   of the watched threads' `last_seq` for a lost notification), handed to the bus, the worker
//!   and the runs driven here;
//! - [`tokens`]: the ephemeral token deltas of the runs driven here, to the streams of this
//!   process that asked for them (never stored, so never the truth of anything).
//!
//! The first two only wake: the tables are the truth, and whoever is woken re-reads them.

pub mod bus;
pub mod replicas;
pub mod tokens;

pub use bus::{BusMsg, EventBus};
pub use tokens::{TokenChannels, TokenDelta, TokenSubscription};
