//! Test-only tools, registered with `PES_DEBUG_TOOLS=true`: they make crash and concurrency
//! tests observable (a tool call that takes a while, and a log of the calls that completed).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError};

/// `debug_sleep {ms, tag}`: waits `ms`, then appends `tag` and the call's idempotency key to the
/// log file (one line per completed call), so a test can count executions across process
/// restarts. Writing that file is a side effect, so it keeps [`Tool::side_effects`]'s default.
pub struct DebugSleep {
    log: Option<PathBuf>,
}

impl DebugSleep {
    pub fn new(log: Option<PathBuf>) -> Self {
        Self { log }
    }
}

#[async_trait]
impl Tool for DebugSleep {
    fn name(&self) -> &str {
        "debug_sleep"
    }

    fn description(&self) -> &str {
        "Test-only: wait `ms` milliseconds, then record `tag` as completed."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["ms", "tag"],
            "properties": {
                "ms": {"type": "integer", "minimum": 0, "maximum": 600000},
                "tag": {"type": "string", "maxLength": 200}
            }
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let ms = args["ms"].as_u64().unwrap_or(0);
        let tag = args["tag"].as_str().unwrap_or_default().to_owned();
        tokio::time::sleep(Duration::from_millis(ms)).await;
        if let Some(path) = &self.log {
            let line = format!("{tag} {}\n", ctx.idempotency_key);
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(line.as_bytes()))
                .map_err(|e| ToolError::Failed(format!("writing the debug log: {e}")))?;
        }
        Ok(json!({"slept": ms, "tag": tag}))
    }
}
