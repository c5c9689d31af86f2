//! Durable calls: a tool call of an item that may run across commits. A plain tool runs once
//! (under an idempotency key); a flowchart commits each stage as a step and may pause at a stage
//! for a person; a delegation sends its message once, records the remote task, and may pause when
//! the remote asks a question. After a crash each reads what it committed back from the log and
//! goes on from there: nothing that finished runs again.
//!
//! Every kind is one [`CallKind`] in one file of this folder; the scheduler starts any call the
//! same way ([`kind_of`] then [`CallKind::start`]) and takes in its [`Outcome`] the same way. A new
//! kind (a memory write, a budget pause…) is a new file here and one line in [`KINDS`].

pub(in crate::agent) mod delegation;
mod flowchart;
mod tool;

use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;

use super::Engine;
use super::journal::{Ctx, RunEnv};
use crate::model::{SuspensionKind, ToolCallRecord, ToolResultRecord, Usage};
use crate::tools::ToolError;

pub(super) use delegation::Watching;
pub(super) use flowchart::decisions_of;

/// How a call's I/O ended.
pub(super) enum Outcome {
    /// The call has its result (a tool error included: the model reads it), with what it used of
    /// the model (flowchart `llm` stages).
    Done(ToolResultRecord, Usage),
    /// The call waits for a person on this call (one of its own steps, or a remote's question:
    /// ids `<toolCallId>:…`); the call stays unanswered and goes on once the person decides.
    Paused(ToolCallRecord, SuspensionKind),
}

/// The I/O of one call, borrowing only what outlives the run's loop.
pub(super) type CallFuture<'f> = Pin<Box<dyn Future<Output = Outcome> + Send + 'f>>;

/// One kind of durable call.
pub(super) trait CallKind: Sync {
    /// Whether this kind runs calls of `name` in this run (kinds are asked in [`KINDS`] order).
    fn claims(&self, engine: &Engine, env: &RunEnv<'_>, name: &str) -> bool;

    /// Whether its calls pause at steps of their own (suspensions with ids `<toolCallId>:…`):
    /// such a call waits while one of them is pending instead of being started again.
    fn pauses_inside(&self) -> bool {
        false
    }

    /// Check a call's arguments before a person is asked about it (arguments that do not fit
    /// are the model's to fix). By default, as the tool registry checks them.
    ///
    /// # Errors
    /// The arguments do not fit, or the tool is unavailable.
    fn validate(
        &self,
        engine: &Engine,
        _env: &RunEnv<'_>,
        name: &str,
        args: &Value,
    ) -> Result<(), ToolError> {
        engine.tools.validate(name, args)
    }

    /// The label its calls are counted under in the metrics.
    fn metric_label(&self, engine: &Engine, call: &ToolCallRecord) -> String {
        engine.tools.metric_label(&call.name, &call.arguments)
    }

    /// Read what the call needs of the run now, and return its I/O: it runs until the call has a
    /// result or pauses for a person. `parkable` is told while the call only waits on something
    /// outside (so the run may give its worker slot back).
    fn start<'f>(
        &self,
        engine: &'f Engine,
        ctx: &Ctx<'f>,
        item: &str,
        call: ToolCallRecord,
        args: Value,
        parkable: &Arc<Watching>,
    ) -> CallFuture<'f>;
}

/// Every kind, in the order they are asked; the plain tool claims whatever is left.
const KINDS: &[&dyn CallKind] = &[&flowchart::Flowchart, &delegation::Delegate, &tool::Tool];

/// The kind that runs calls of `name` in this run.
pub(super) fn kind_of(engine: &Engine, env: &RunEnv<'_>, name: &str) -> &'static dyn CallKind {
    KINDS
        .iter()
        .copied()
        .find(|k| k.claims(engine, env, name))
        .unwrap_or(&tool::Tool)
}

impl Engine {
    /// Check a call's arguments as its kind does: a flowchart's against its input schema, any
    /// other tool's in the registry.
    pub(super) fn validate_call(
        &self,
        ctx: &Ctx<'_>,
        name: &str,
        args: &Value,
    ) -> Result<(), ToolError> {
        kind_of(self, &ctx.env, name).validate(self, &ctx.env, name, args)
    }
}
