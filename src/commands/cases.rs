//! [`UseCases`]: the handles every use case needs, shared by every door. A door (the REST
//! handlers, the A2A server, and the doors of later waves) parses its own wire format into the
//! plain inputs these functions take, calls them, and words their [`ApiError`] its own way;
//! nothing here knows HTTP, JSON-RPC or SSE.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::RunCommands;
use crate::agent::Engine;
use crate::config::Config;
use crate::store::SqlStore;

/// The use cases' handles: cheap to clone (every field is shared).
#[derive(Clone)]
pub struct UseCases {
    pub store: Arc<SqlStore>,
    pub engine: Arc<Engine>,
    pub config: Arc<Config>,
    /// The one path from a store write to the runs and streams it concerns.
    pub commands: RunCommands,
    /// Fires when the service shuts down: a wait for a run ends with it.
    pub shutdown: CancellationToken,
    /// How webhooks are signed and where they may go (`PES_WEBHOOK_*`).
    pub webhooks: crate::webhooks::WebhookSettings,
    /// The memory store's use cases (shared with the agent's memory tools).
    pub memory: super::memory::Memory,
    /// The replica's counts of tenants' bytes (`PES_TENANT_MAX_STORAGE_BYTES`).
    pub storage: super::StorageCounts,
}
