//! MCP client on the official Rust SDK (`rmcp`): the servers the operator configured
//! (`PES_MCP_SERVERS`), each kept connected by a task of its own, their tools mounted in the
//! registry as `<server>__<tool>`. A server that is down never stops the service or a run: its
//! tools are unavailable and say so until it comes back.

mod config;
mod server;
mod tool;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{ServerConfig, Transport, parse as parse_servers};
pub use server::McpSettings;
pub use tool::IDEMPOTENCY_META_KEY;

use super::ToolRegistry;
use server::Connection;

/// The configured MCP servers, connected.
pub struct McpHub {
    connections: Vec<Arc<Connection>>,
}

impl McpHub {
    /// Declare every server to `registry` and start keeping each connected (on `tracker`, until
    /// `stop`). Returns at once; [`McpHub::wait_first_attempts`] waits for the first discovery.
    pub fn start(
        servers: Vec<ServerConfig>,
        registry: &ToolRegistry,
        timings: McpSettings,
        tracker: &TaskTracker,
        stop: &CancellationToken,
    ) -> Self {
        let connections: Vec<Arc<Connection>> = servers
            .into_iter()
            .map(|s| Connection::new(s, timings.max_output_bytes))
            .collect();
        for c in &connections {
            registry.declare_server(c.clone());
            tracker.spawn(server::keep(
                c.clone(),
                registry.clone(),
                tool::mount,
                timings,
                tracker.clone(),
                stop.clone(),
            ));
        }
        Self { connections }
    }

    /// Wait until every server's first connection attempt finished, at most `limit`, so the
    /// first runs see the tools of the servers that are up. A server still down stays down and
    /// keeps being retried in the background.
    pub async fn wait_first_attempts(&self, limit: Duration) {
        let all =
            futures::future::join_all(self.connections.iter().map(|c| c.first_attempt_done()));
        let _ = tokio::time::timeout(limit, all).await;
    }

    /// How many servers are configured.
    pub fn len(&self) -> usize {
        self.connections.len()
    }

    /// True when no server is configured.
    pub fn is_empty(&self) -> bool {
        self.connections.is_empty()
    }
}
