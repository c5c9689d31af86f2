//! Durable calls: a tool call of an item that may run across commits. A plain tool runs once
//! (under an idempotency key); a flowchart commits each stage as a step and may pause at a stage
//! for a person; a delegation sends its message once, records the remote task, and may pause when
//! the remote asks a question. After a crash each reads what it committed back from the log and
//! goes on from there: nothing that finished runs again.
//!
//! Every kind is one [`CallKind`] in one file of this folder, and says all the engine needs of
//! it: which tools it offers (the catalogue the planner, an item's model call, a config's check
//! and `GET /v1/tools` read: [`Engine::tool_catalogue`]), whether its calls have side effects, how
//! it checks arguments, how it runs a call, what cancelling a run does to its calls in flight,
//! and how it follows calls that only wait outside the process while the run is parked
//! (`outside.rs`). The scheduler starts any call the same way ([`kind_of`] then
//! [`CallKind::start`]) and takes in its [`Outcome`] the same way; nothing outside this folder
//! tells kinds apart by tool name. A new kind (a memory write, a budget pause…) is a new file here
//! and one line in [`KINDS`].

pub(in crate::agent) mod delegation;
mod flowchart;
mod outside;
mod tool;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;

use super::journal::{Ctx, Journal, RunEnv};
use super::{Engine, EngineError};
use crate::flowchart::FlowchartRecord;
use crate::flowchart::tool::FlowTool;
use crate::llm::ToolSpec;
use crate::model::{
    AgentConfig, NewObservation, SuspensionKind, ThreadId, ToolCallRecord, ToolResultRecord, Usage,
};
use crate::tools::{ToolError, ToolInfo};

pub(super) use flowchart::decisions_of;
pub(super) use outside::Watching;

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

/// Some work of a kind that borrows the run's journal.
pub(super) type KindFuture<'f, T> = Pin<Box<dyn Future<Output = T> + Send + 'f>>;

/// The tenant's flowcharts, by name, as the kinds read them: a run's mounted ones, or the
/// records a door read from the store.
pub(in crate::agent) trait Flowcharts: Sync {
    /// The flowchart called `name`.
    fn get(&self, name: &str) -> Option<&FlowchartRecord>;
    /// Every one, by name.
    fn records(&self) -> Vec<&FlowchartRecord>;
}

impl Flowcharts for BTreeMap<String, FlowTool> {
    fn get(&self, name: &str) -> Option<&FlowchartRecord> {
        BTreeMap::get(self, name).map(|t| t.record.as_ref())
    }
    fn records(&self) -> Vec<&FlowchartRecord> {
        self.values().map(|t| t.record.as_ref()).collect()
    }
}

impl Flowcharts for &[FlowchartRecord] {
    fn get(&self, name: &str) -> Option<&FlowchartRecord> {
        self.iter().find(|r| r.name == name)
    }
    fn records(&self) -> Vec<&FlowchartRecord> {
        let mut all: Vec<&FlowchartRecord> = self.iter().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}

/// One kind of durable call.
pub(super) trait CallKind: Sync {
    /// Whether this kind runs calls of `name` for a tenant with these flowcharts (kinds are asked
    /// in [`KINDS`] order).
    fn claims(&self, engine: &Engine, flowcharts: &dyn Flowcharts, name: &str) -> bool;

    /// The tools it offers a tenant with these flowcharts, as the catalogue shows them (a name
    /// an earlier kind claims is left out of the catalogue).
    fn offers(&self, engine: &Engine, flowcharts: &dyn Flowcharts) -> Vec<ToolInfo>;

    /// Whether a config may name `name` as one of its tools. By default: one it offers.
    fn knows(&self, engine: &Engine, flowcharts: &dyn Flowcharts, name: &str) -> bool {
        self.offers(engine, flowcharts)
            .iter()
            .any(|t| t.name == name)
    }

    /// Whether its tools are the tenant's own: listed after the operator's in a run's catalogue.
    fn tenants_own(&self) -> bool {
        false
    }

    /// Whether a call of `name` may change something outside the service: such a call starts
    /// only once the turn that asked for it is committed. By default, as the registry says.
    fn side_effects(&self, engine: &Engine, name: &str) -> bool {
        engine.tools.has_side_effects(name)
    }

    /// What cancelling a run does to its calls of this kind still in flight (best effort,
    /// bounded in time): the observations to commit with the cancellation. By default nothing.
    fn cancel<'f>(
        &self,
        _engine: &'f Engine,
        _journal: &'f dyn Journal,
        _run_id: uuid::Uuid,
    ) -> KindFuture<'f, Vec<NewObservation>> {
        Box::pin(async { Vec::new() })
    }

    /// How its calls that only wait outside the process (told to `parkable` in
    /// [`CallKind::start`]) are followed while the run is parked, without a worker slot: a
    /// future that resolves once one of them settles (its outcome committed), or `None` when the
    /// kind never waits outside.
    fn follow<'f>(
        &self,
        _engine: &'f Engine,
        _journal: &'f dyn Journal,
        _run: RunRef<'f>,
    ) -> Option<KindFuture<'f, Result<(), EngineError>>> {
        None
    }

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

/// Whose run a parked run's follower works for.
#[derive(Clone, Copy)]
pub(super) struct RunRef<'a> {
    pub tenant: &'a str,
    pub thread_id: &'a ThreadId,
    pub run_id: uuid::Uuid,
}

/// Every kind, in the order they are asked; the plain tool claims whatever is left.
const KINDS: &[&dyn CallKind] = &[&flowchart::Flowchart, &delegation::Delegate, &tool::Tool];

/// The index in [`KINDS`] of the kind that runs calls of `name`.
fn claimant(engine: &Engine, flowcharts: &dyn Flowcharts, name: &str) -> usize {
    KINDS
        .iter()
        .position(|k| k.claims(engine, flowcharts, name))
        .unwrap_or(KINDS.len() - 1)
}

/// The kind that runs calls of `name` in this run.
pub(super) fn kind_of(engine: &Engine, env: &RunEnv<'_>, name: &str) -> &'static dyn CallKind {
    KINDS[claimant(engine, env.flowcharts.as_ref(), name)]
}

/// Every tool offered to a tenant with these flowcharts: each kind's, the operator's first, then
/// the tenant's own, each group by name; a name belongs to the kind that claims it.
fn offered(engine: &Engine, flowcharts: &dyn Flowcharts) -> Vec<ToolInfo> {
    let mut all: Vec<(bool, ToolInfo)> = Vec::new();
    for (i, kind) in KINDS.iter().enumerate() {
        all.extend(
            kind.offers(engine, flowcharts)
                .into_iter()
                .filter(|t| claimant(engine, flowcharts, &t.name) == i)
                .map(|t| (kind.tenants_own(), t)),
        );
    }
    all.sort_by(|(a, x), (b, y)| a.cmp(b).then_with(|| x.name.cmp(&y.name)));
    all.into_iter().map(|(_, t)| t).collect()
}

impl Engine {
    /// Every tool a tenant with these flowcharts may enable and its runs may call, sorted by
    /// name, as `GET /v1/tools` lists them: the registry's (built-in, HTTP, MCP), delegation to
    /// the remote agents when there are any, and the tenant's flowcharts (a flowchart named
    /// like a registry tool is hidden by it).
    pub fn tool_catalogue(&self, flowcharts: &[FlowchartRecord]) -> Vec<ToolInfo> {
        let mut all = offered(self, &flowcharts);
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Whether a config may name `name` as a tool for a tenant with these flowcharts: a tool of
    /// [`Engine::tool_catalogue`], or one under a tool server that is down (its tools are not
    /// listed until it answers). Pass no flowcharts to ask whether the name is known without
    /// reading the tenant's.
    pub fn knows_tool(&self, name: &str, flowcharts: &[FlowchartRecord]) -> bool {
        KINDS.iter().any(|k| k.knows(self, &flowcharts, name))
    }

    /// The tools a run may use: the catalogue for its tenant's flowcharts, narrowed by the
    /// config's `tools` (in catalogue order: the operator's, then the tenant's own).
    pub(super) fn enabled_catalogue(&self, ctx: &Ctx<'_>) -> Vec<ToolInfo> {
        enabled(offered(self, ctx.env.flowcharts.as_ref()), &ctx.env.cfg)
    }

    /// Whether a call of `name` in this run may have side effects (its kind says).
    pub(super) fn call_side_effects(&self, ctx: &Ctx<'_>, name: &str) -> bool {
        kind_of(self, &ctx.env, name).side_effects(self, name)
    }

    /// Every kind's calls in flight, told the run is cancelled: what to commit with it.
    pub(super) async fn cancel_calls(
        &self,
        journal: &dyn Journal,
        run_id: uuid::Uuid,
    ) -> Vec<NewObservation> {
        let mut out = Vec::new();
        for kind in KINDS {
            out.extend(kind.cancel(self, journal, run_id).await);
        }
        out
    }

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

/// `all` narrowed by the config's `tools`, when it names some.
fn enabled(all: Vec<ToolInfo>, cfg: &AgentConfig) -> Vec<ToolInfo> {
    match &cfg.tools {
        Some(list) => all.into_iter().filter(|t| list.contains(&t.name)).collect(),
        None => all,
    }
}

/// What a model call reads of a tool.
pub(super) fn spec(t: ToolInfo) -> ToolSpec {
    ToolSpec {
        name: t.name,
        description: t.description,
        parameters: t.parameters,
    }
}
