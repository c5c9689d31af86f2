//! Events: what this process learns happened, and whom it tells.
//!
//! - [`bus`]: the in-process fan-out of committed observations to SSE streams and waiters;
//! - [`replicas`]: wake-ups from other processes sharing the store (Postgres LISTEN, and a poll
//!   of the watched threads' `last_seq` for a lost notification), handed to the bus, the worker
//!   and the runs driven here;
//! - [`tokens`]: the ephemeral token deltas of the runs, to the streams that asked for them
//!   (never stored, so never the truth of anything);
//! - [`token_relay`]: those deltas between replicas, sent only while another replica streams
//!   the thread (Postgres NOTIFY).
//!
//! The first two only wake: the tables are the truth, and whoever is woken re-reads them.

pub mod bus;
mod delta;
pub mod replicas;
pub mod token_relay;
pub mod tokens;

pub use bus::{BusMsg, EventBus};
pub use tokens::{TokenChannels, TokenDelta, TokenSubscription};
