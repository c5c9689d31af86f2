//! A plain tool call (built-in, HTTP, MCP): it runs once under the idempotency key
//! `<runId>:<toolCallId>`, so a call repeated after a crash is recognised by a tool that honours it.

use std::sync::Arc;

use serde_json::Value;

use super::{CallFuture, CallKind, Flowcharts, Outcome, Watching};
use crate::agent::Engine;
use crate::agent::journal::Ctx;
use crate::model::{ToolCallRecord, ToolResultRecord, ToolResultStatus, Usage};
use crate::tools::{ToolContext, ToolInfo, ToolRegistry};

/// Any tool of the registry.
pub(super) struct Tool;

impl CallKind for Tool {
    fn claims(&self, _: &Engine, _: &dyn Flowcharts, _: &str) -> bool {
        true
    }

    fn offers(&self, engine: &Engine, _: &dyn Flowcharts) -> Vec<ToolInfo> {
        engine.tools.catalogue()
    }

    /// A registered tool, or one under a declared server that is down.
    fn knows(&self, engine: &Engine, _: &dyn Flowcharts, name: &str) -> bool {
        engine.tools.is_known(name)
    }

    fn start<'f>(
        &self,
        engine: &'f Engine,
        ctx: &Ctx<'f>,
        _item: &str,
        call: ToolCallRecord,
        args: Value,
        _parkable: &Arc<Watching>,
    ) -> CallFuture<'f> {
        let tctx = ToolContext {
            tenant: ctx.env.tenant.clone(),
            thread_id: ctx.env.thread_id.to_string(),
            idempotency_key: format!("{}:{}", ctx.run.run_id, call.id),
            memory_namespace: ctx.env.cfg.memory_namespace.clone(),
        };
        Box::pin(async move {
            let result = invoke_tool(&engine.tools, &call, args, &tctx).await;
            Outcome::Done(result, Usage::default())
        })
    }
}

/// Run one registry tool and turn its outcome into the call's result.
pub(in crate::agent) async fn invoke_tool(
    tools: &ToolRegistry,
    call: &ToolCallRecord,
    args: Value,
    tctx: &ToolContext,
) -> ToolResultRecord {
    let outcome = tools.invoke(&call.name, args, tctx).await;
    ToolResultRecord {
        tool_call_id: call.id.clone(),
        name: call.name.clone(),
        status: if outcome.error.is_none() {
            ToolResultStatus::Success
        } else {
            ToolResultStatus::Error
        },
        error: outcome.error.map(|e| {
            let mut text = e.to_string();
            crate::model::scrub_nul_str(&mut text);
            text
        }),
        output: outcome.output,
    }
}
