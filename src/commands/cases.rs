//! [`UseCases`]: the handles every use case needs, shared by every door. A door (the REST
//! handlers, A2A, AG-UI, the MCP server) parses its own wire format into the plain inputs these
//! functions take, calls them, and words their [`crate::problem::Refusal`] its own way; nothing here knows
//! HTTP, JSON-RPC or SSE. The store, the engine and the event bus are private to this layer: a
//! door reaches them only through a use case.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::RunCommands;
use crate::agent::Engine;
use crate::config::Config;
use crate::store::SqlStore;

/// The use cases' handles: cheap to clone (every field is shared).
#[derive(Clone)]
pub struct UseCases {
    pub(super) store: Arc<SqlStore>,
    pub(super) engine: Arc<Engine>,
    pub(super) config: Arc<Config>,
    /// The one path from a store write to the runs and streams it concerns.
    pub(super) commands: RunCommands,
    /// Fires when the service shuts down: a wait for a run, a follower's stream end with it.
    pub(super) shutdown: CancellationToken,
    /// The service's tasks: work a client must not stop by hanging up (a fork's copy) runs in
    /// one of them, and the shutdown waits for it.
    pub(super) tracker: TaskTracker,
    /// How webhooks are signed and where they may go (`PES_WEBHOOK_*`).
    pub webhooks: crate::webhooks::WebhookSettings,
    /// The memory store's use cases (shared with the agent's memory tools).
    pub memory: super::memory::Memory,
    /// The replica's counts of tenants' bytes (`PES_TENANT_MAX_STORAGE_BYTES`).
    pub(super) storage: super::StorageCounts,
}

/// What the use cases are built from (the process's one store, engine and commands).
pub struct Handles {
    pub store: Arc<SqlStore>,
    pub engine: Arc<Engine>,
    pub config: Arc<Config>,
    pub commands: RunCommands,
    pub shutdown: CancellationToken,
    pub tracker: TaskTracker,
    pub webhooks: crate::webhooks::WebhookSettings,
    pub memory: super::memory::Memory,
}

impl UseCases {
    /// The use cases over the process's handles.
    pub fn new(h: Handles) -> Self {
        Self {
            store: h.store,
            engine: h.engine,
            config: h.config,
            commands: h.commands,
            shutdown: h.shutdown,
            tracker: h.tracker,
            webhooks: h.webhooks,
            memory: h.memory,
            storage: super::StorageCounts::default(),
        }
    }

    /// The service's settings.
    pub fn config(&self) -> &Config {
        &self.config
    }
}
