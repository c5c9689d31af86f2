//! Flowchart calls inside a run: a call of a flowchart tool runs the interpreter with this run's
//! tools, model and journal ([`RunFlowHost`]); each stage's step is committed as it happens, and
//! a call resumed after a crash reads its committed steps back from the log first.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{CallFuture, CallKind, Flowcharts, Outcome, Watching};
use crate::agent::Engine;
use crate::agent::changes::Batch;
use crate::agent::journal::{Ctx, Journal, RunEnv};
use crate::flowchart::FlowchartRecord;
use crate::flowchart::interpreter::{FlowCall, FlowHost, FlowLimits, Gate, Paused, StepRecord};
use crate::flowchart::tool::FlowTool;
use crate::llm::{ChatMessage, ChatRequest, LlmProvider, Phase};
use crate::model::payloads::{FlowchartStepContent, ToolCallContent};
use crate::model::{
    NewObservation, ObservationType, ResumeDecision, Suspension, SuspensionKind, SuspensionStatus,
    ThreadId, ToolCallRecord, ToolResultRecord, ToolResultStatus, Usage,
};
use crate::tools::{ToolContext, ToolError, ToolInfo, ToolRegistry, ToolSource};

/// What a flowchart call uses of the run: its journal, tools, model and identity.
pub(super) struct RunFlowHost<'a> {
    pub journal: &'a dyn Journal,
    pub tools: &'a ToolRegistry,
    /// Where the calls of its `tool` stages are counted.
    pub metrics: &'a crate::telemetry::metrics::Metrics,
    pub llm: Arc<dyn LlmProvider>,
    /// Where its `llm` stages' text streams (the calling item's, phase `flowchart`).
    pub tokens: crate::llm::Tokens,
    pub model: Option<String>,
    pub tenant: String,
    pub thread_id: ThreadId,
    /// The thread config's `memoryNamespace` (the memory tools' namespace).
    pub memory_namespace: Option<Vec<String>>,
    pub run_id: uuid::Uuid,
    /// The thread's `requireApproval`.
    pub require_approval: Vec<String>,
    /// The tools the calling item may call (the thread's tools, the item's `toolAllowlist`,
    /// its role's tools): all its `tool` stages may call.
    pub may_call: Vec<String>,
    /// The suspensions of this call's gated `tool` stages (ids `<toolCallId>:…`).
    pub decisions: Vec<Suspension>,
    /// The run's budget: each `llm` stage passes it before it asks, and is priced by it.
    pub budget: Arc<crate::agent::budget::Meter>,
}

/// The suspensions of `call`'s own steps (a flowchart's gated stages, a remote's questions: ids
/// `<toolCallId>:…`), from the run's.
pub(in crate::agent) fn decisions_of(all: &[Suspension], call: &ToolCallRecord) -> Vec<Suspension> {
    let prefix = format!("{}:", call.id);
    all.iter()
        .filter(|s| s.tool_call.id.starts_with(&prefix))
        .cloned()
        .collect()
}

/// A call of one of the tenant's flowcharts (unless a registry tool has its name).
pub(super) struct Flowchart;

impl CallKind for Flowchart {
    fn claims(&self, engine: &Engine, flowcharts: &dyn Flowcharts, name: &str) -> bool {
        flowcharts.get(name).is_some() && !engine.tools.contains(name)
    }

    fn offers(&self, _: &Engine, flowcharts: &dyn Flowcharts) -> Vec<ToolInfo> {
        flowcharts
            .records()
            .into_iter()
            .map(|r| ToolInfo {
                name: r.name.clone(),
                description: r.spec.description.clone(),
                parameters: r.spec.input_schema(),
                source: ToolSource::Flowchart,
                server: None,
                available: true,
                unavailable_reason: None,
            })
            .collect()
    }

    fn knows(&self, _: &Engine, flowcharts: &dyn Flowcharts, name: &str) -> bool {
        flowcharts.get(name).is_some()
    }

    fn tenants_own(&self) -> bool {
        true
    }

    /// A flowchart's stages may call tools with side effects: its call is committed first.
    fn side_effects(&self, _: &Engine, _: &str) -> bool {
        true
    }

    fn pauses_inside(&self) -> bool {
        true
    }

    fn validate(
        &self,
        _: &Engine,
        env: &RunEnv<'_>,
        name: &str,
        args: &Value,
    ) -> Result<(), ToolError> {
        let flowchart = env.flowcharts.get(name).expect("claimed");
        flowchart
            .validate(args)
            .map_err(ToolError::InvalidArguments)
    }

    fn metric_label(&self, _: &Engine, _: &ToolCallRecord) -> String {
        "flowchart".to_owned()
    }

    fn start<'f>(
        &self,
        engine: &'f Engine,
        ctx: &Ctx<'f>,
        item: &str,
        call: ToolCallRecord,
        args: Value,
        _parkable: &Arc<Watching>,
    ) -> CallFuture<'f> {
        let tool = ctx.env.flowcharts.get(&call.name).expect("claimed").clone();
        // Its `tool` stages may call what the calling item may call, no more.
        let enabled = engine.enabled_catalogue(ctx).into_iter().map(|t| t.name);
        let may_call = match ctx.item_idx(item) {
            None => enabled.collect(),
            Some(i) => enabled
                .filter(|t| engine.item_may_call(ctx, &ctx.items[i], t))
                .collect(),
        };
        let host = RunFlowHost {
            may_call,
            journal: ctx.env.journal,
            tools: &engine.tools,
            metrics: &engine.metrics,
            tokens: ctx.tap(Some(item), Phase::Flowchart),
            llm: ctx.env.llm.clone(),
            model: ctx.model_in_use(),
            tenant: ctx.env.tenant.clone(),
            thread_id: ctx.env.thread_id.clone(),
            memory_namespace: ctx.env.cfg.memory_namespace.clone(),
            run_id: ctx.run.run_id,
            require_approval: ctx.env.cfg.require_approval.clone().unwrap_or_default(),
            decisions: decisions_of(&ctx.suspensions, &call),
            budget: ctx.env.budget.clone(),
        };
        let limits = FlowLimits {
            max_steps: engine.settings.flowchart_max_steps.max(1),
            expr: engine.settings.flowchart_expr.clone(),
        };
        Box::pin(async move { invoke_flowchart(&host, &tool, &call, args, limits).await })
    }
}

// The host's errors are text because `FlowHost` says so: the interpreter puts them in the stage
// error the model reads.
#[async_trait]
impl FlowHost for RunFlowHost<'_> {
    async fn load(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> Result<Option<FlowchartRecord>, String> {
        self.journal
            .flowchart(name, version)
            .await
            .map_err(|e| e.to_string())
    }

    async fn commit_step(&self, step: StepRecord) -> Result<(), String> {
        let mut obs = NewObservation::new(
            self.run_id,
            step.parent_id,
            ObservationType::FlowchartStep,
            step.title,
            step.content,
        );
        obs.id = step.id;
        let mut batch = Batch::new(self.tenant.clone(), self.thread_id.clone());
        batch.observe(obs);
        self.journal.commit(batch).await.map_err(|e| e.to_string())
    }

    fn may_call(&self, tool: &str) -> bool {
        self.may_call.iter().any(|t| t == tool)
    }

    async fn call_tool(&self, name: &str, args: Value, key: String) -> Result<Value, String> {
        // A stage's call has no model call id: its idempotency key stands for it.
        let span = crate::telemetry::spans::execute_tool(name, &key);
        let ctx = ToolContext {
            tenant: self.tenant.clone(),
            thread_id: self.thread_id.to_string(),
            idempotency_key: key,
            memory_namespace: self.memory_namespace.clone(),
        };
        let label = self.tools.metric_label(name, &args);
        let tool = label.as_str();
        let outcome = crate::telemetry::spans::timed(
            span.clone(),
            self.tools.invoke(name, args, &ctx),
            |o, took| {
                let outcome = if o.error.is_none() { "ok" } else { "error" };
                if o.error.is_some() {
                    crate::telemetry::spans::failed(&span, "tool_error");
                }
                self.metrics.tool_call(tool, outcome, took);
            },
            |took| self.metrics.tool_call(tool, "cancelled", took),
        )
        .await;
        match outcome.error {
            None => Ok(outcome.output),
            Some(e) => Err(e.to_string()),
        }
    }

    fn gate(&self, tool: &str, args: &Value, call_id: &str) -> Gate {
        let kind = match self.tools.get(tool).and_then(|t| t.blocking()) {
            Some(k) => k,
            None if self.require_approval.iter().any(|n| n == tool) => SuspensionKind::Approval,
            None => return Gate::Run(args.clone()),
        };
        let Some(s) = self.decisions.iter().find(|s| s.tool_call.id == call_id) else {
            return Gate::Suspend(kind);
        };
        match (s.status, &s.decision) {
            (SuspensionStatus::Pending, _) => Gate::Suspend(kind),
            (SuspensionStatus::Resolved, Some(ResumeDecision::Approve { .. })) => {
                Gate::Run(s.tool_call.arguments.clone())
            }
            (SuspensionStatus::Resolved, Some(ResumeDecision::Edit { args, .. })) => {
                Gate::Run(args.clone())
            }
            (SuspensionStatus::Resolved, Some(ResumeDecision::Respond { response, .. })) => {
                Gate::Answer(response.clone())
            }
            (SuspensionStatus::Resolved, Some(ResumeDecision::Reject { reason })) => {
                Gate::Reject(reason.clone().unwrap_or_else(|| "no reason given".into()))
            }
            (SuspensionStatus::Expired, _) => {
                Gate::Reject("expired: no one decided in time".into())
            }
            _ => Gate::Reject("no decision".into()),
        }
    }

    async fn ask_model(
        &self,
        prompt: String,
        output_schema: Option<Value>,
    ) -> Result<(Value, Usage), String> {
        let system = match &output_schema {
            Some(_) => {
                "You are one stage of a flowchart (a fixed procedure). Answer the request with \
                 only a JSON object that fits the schema."
            }
            None => "You are one stage of a flowchart (a fixed procedure). Answer the request.",
        };
        let request = ChatRequest {
            phase: Phase::Flowchart,
            model: self.model.clone(),
            messages: vec![ChatMessage::system(system), ChatMessage::user(prompt)],
            tools: vec![],
            response_format: output_schema.map(|schema| crate::llm::JsonSchemaFormat {
                name: "pes_flowchart".into(),
                schema,
            }),
            tokens: self.tokens.clone(),
        };
        // Past the budget the stage fails (the model reads why); the run suspends or fails at its
        // next model call, which the shut meter refuses.
        let ticket = self
            .budget
            .admit(crate::agent::budget::estimate(&request))
            .map_err(|_| "the run's budget is spent: no model call may start".to_owned())?;
        let reply = if request.response_format.is_some() {
            crate::llm::structured::complete_structured(self.llm.as_ref(), request).await
        } else {
            self.llm.complete(request).await.map(|resp| {
                let text = Value::String(resp.content.clone().unwrap_or_default());
                (text, resp)
            })
        };
        match reply {
            Ok((value, resp)) => {
                let used = self.budget.price(&resp.usage);
                self.budget.count(ticket, &used);
                Ok((value, used))
            }
            Err(e) => {
                self.budget.release(ticket);
                Err(e.to_string())
            }
        }
    }
}

/// Run a flowchart call until it ends (with a result, or a tool error naming the stage that
/// failed: the model reads it, the run goes on) or pauses at a `tool` stage for a person.
async fn invoke_flowchart(
    host: &RunFlowHost<'_>,
    tool: &FlowTool,
    call: &ToolCallRecord,
    args: Value,
    limits: FlowLimits,
) -> Outcome {
    let mut paused = None;
    let mut usage = Usage::default();
    let result = run(host, tool, call, args, limits, &mut paused, &mut usage).await;
    if let Some(p) = paused {
        return Outcome::Paused(p.call, p.kind);
    }
    let (status, output, error) = match result {
        Ok(v) => (ToolResultStatus::Success, v, None),
        Err(e) => {
            let message = e.to_string();
            (
                ToolResultStatus::Error,
                json!({"error": message}),
                Some(message),
            )
        }
    };
    Outcome::Done(
        ToolResultRecord {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            status,
            output,
            error,
        },
        usage,
    )
}

/// Why a flowchart call ended without a result. Its text is the call's tool error.
#[derive(Debug, thiserror::Error)]
enum FlowchartCallError {
    #[error(transparent)]
    Arguments(#[from] ToolError),
    #[error("its committed steps could not be read: {0}")]
    StepsUnread(#[source] crate::agent::EngineError),
    /// `FlowHost::load`'s reason, text by that trait's contract.
    #[error("its version {version} could not be read: {reason}")]
    VersionUnread { version: i64, reason: String },
    #[error(transparent)]
    Flow(#[from] crate::flowchart::interpreter::FlowError),
}

async fn run(
    host: &RunFlowHost<'_>,
    tool: &FlowTool,
    call: &ToolCallRecord,
    args: Value,
    limits: FlowLimits,
    paused: &mut Option<Paused>,
    usage: &mut Usage,
) -> Result<Value, FlowchartCallError> {
    tool.validate(&args).map_err(ToolError::InvalidArguments)?;
    // The call's own observation (its steps nest under it) and any steps already committed.
    let committed = host
        .journal
        .run_observations(&[ObservationType::ToolCall, ObservationType::FlowchartStep])
        .await
        .map_err(FlowchartCallError::StepsUnread)?;
    let parent = committed
        .iter()
        .rev()
        .find(|o| {
            o.payload::<ToolCallContent>()
                .is_some_and(|c| c.tool_call_id == call.id)
        })
        .map(|o| o.id.to_string());
    let steps: Vec<_> = committed
        .into_iter()
        .filter(|o| o.kind == ObservationType::FlowchartStep)
        .collect();
    // A call that had started runs on the version it started with.
    let version = steps
        .iter()
        .filter_map(|o| o.payload::<FlowchartStepContent>())
        .find(|s| s.tool_call_id == call.id && s.parent_step.is_none())
        .map(|s| s.version);
    let record = match version {
        Some(v) if v != tool.record.version => match host.load(&tool.record.name, Some(v)).await {
            Ok(Some(r)) => Arc::new(r),
            Ok(None) => tool.record.clone(),
            Err(reason) => {
                return Err(FlowchartCallError::VersionUnread { version: v, reason });
            }
        },
        _ => tool.record.clone(),
    };
    let mut flow = FlowCall::new(host, host.run_id, call.id.clone(), limits, steps);
    let result = flow
        .run(record, args, parent)
        .await
        .map_err(FlowchartCallError::from);
    *paused = flow.paused().cloned();
    *usage = flow.usage();
    result
}
