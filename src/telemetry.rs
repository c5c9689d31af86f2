//! Logging: text lines by default, JSON lines with `PES_LOG_FORMAT=json`; the filter comes from
//! `PES_LOG`, else `RUST_LOG`, else `info` (with the MCP SDK's own transport logs off: every
//! failed reconnection to a down MCP server would log an error there, while the service logs one
//! warning with the cause and then retries quietly).

use tracing_subscriber::EnvFilter;

/// The log filter when none is given.
const DEFAULT_FILTER: &str = "info,rmcp=off";

use crate::config::{Config, LogFormat};

/// Install the global subscriber (once; later calls are ignored).
pub fn init(config: &Config) {
    let filter = config
        .log
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| DEFAULT_FILTER.into());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match config.log_format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
