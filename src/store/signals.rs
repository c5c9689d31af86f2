//! What a [`Signal`] between the processes that share a store says (Postgres LISTEN/NOTIFY):
//! the vocabulary only, below everything that sends or receives one. Inside a write, a signal is
//! sent with the transaction (`sql::Conn::notify`); listening, sending outside a transaction and
//! the poll of watched threads' seqs that covers a lost one are [`super::SqlStore`]'s (in
//! `sql_store.rs`), done by `postgres.rs`. On SQLite, one process owns the file: there is no one
//! to tell.

use uuid::Uuid;

/// A wake-up from another process sharing the store (Postgres LISTEN/NOTIFY). Signals carry no
/// data (whoever receives one re-reads the tables), except the two about token deltas, which are
/// never stored: [`Signal::TokensWanted`] and [`Signal::Tokens`]. A payload that parses as no
/// signal (malformed, or a kind a newer replica sends) is ignored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "k")]
pub enum Signal {
    /// A thread's observations up to `seq` were committed.
    #[serde(rename = "o")]
    Observations {
        tenant: String,
        thread: String,
        seq: i64,
    },
    /// A run may have become claimable (enqueued, resumed, released, or its thread freed).
    #[serde(rename = "r")]
    RunReady,
    /// A cancel was requested for a running run.
    #[serde(rename = "c")]
    Cancel { run: Uuid },
    /// A suspension of a running run was decided: the replica that drives the run hands it the
    /// decision at once, instead of at the run's next look at its suspensions.
    #[serde(rename = "s")]
    Decided { run: Uuid },
    /// A person steered a running run: the replica that drives it reads the message at once.
    #[serde(rename = "g")]
    Steered { run: Uuid },
    /// A thread was deleted: its streams end (before any thread created again under its id can
    /// be announced, since notifications arrive in commit order).
    #[serde(rename = "d")]
    ThreadDeleted { tenant: String, thread: String },
    /// The sender streams these (tenant, thread) token deltas to a client: whoever drives a run
    /// of one of them sends its deltas ([`Signal::Tokens`]) for a while (repeated while it lasts).
    #[serde(rename = "w")]
    TokensWanted { threads: Vec<(String, String)> },
    /// Token deltas of a thread's run, in the order they were written. `n` counts the sender's
    /// token payloads (Postgres folds identical payloads of one transaction into one: `n` keeps
    /// them apart).
    #[serde(rename = "t")]
    Tokens {
        tenant: String,
        thread: String,
        n: u64,
        deltas: Vec<TokenPiece>,
    },
}

/// One token delta on its way to another replica (short field names: a NOTIFY payload holds at
/// most 8,000 bytes).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenPiece {
    /// The run whose model wrote it.
    #[serde(rename = "r")]
    pub run_id: Uuid,
    /// The todo item (none for the run's plan and synthesis).
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
    #[serde(rename = "p")]
    pub phase: crate::llm::Phase,
    /// The text.
    #[serde(rename = "t")]
    pub text: String,
    /// The thread's `seq` the run had committed when it was written.
    #[serde(rename = "a")]
    pub after_seq: i64,
}
