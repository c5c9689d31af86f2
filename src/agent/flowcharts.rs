//! Flowchart calls inside a run: a call of a flowchart tool runs the interpreter with this run's
//! tools, model and journal ([`RunFlowHost`]); each stage's step is committed as it happens, and
//! a call resumed after a crash reads its committed steps back from the log first.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::Engine;
use super::changes::Batch;
use super::journal::{Ctx, Journal};
use crate::flowchart::FlowchartRecord;
use crate::flowchart::interpreter::{FlowCall, FlowHost, FlowLimits, Gate, Paused, StepRecord};
use crate::flowchart::tool::FlowTool;
use crate::llm::{ChatMessage, ChatRequest, LlmProvider, Phase};
use crate::model::{
    NewObservation, ObservationType, ResumeDecision, Suspension, SuspensionKind, SuspensionStatus,
    ThreadId, ToolCallRecord, ToolResultRecord, ToolResultStatus, Usage,
};
use crate::tools::{ToolContext, ToolError, ToolRegistry};

impl Engine {
    /// Check a call's arguments: a flowchart's against its input schema, any other tool's in the
    /// registry.
    pub(super) fn validate_call(
        &self,
        ctx: &Ctx<'_>,
        name: &str,
        args: &Value,
    ) -> Result<(), ToolError> {
        match ctx.flowcharts.get(name) {
            Some(f) if !self.tools.contains(name) => {
                f.validate(args).map_err(ToolError::InvalidArguments)
            }
            _ => self.tools.validate(name, args),
        }
    }
}

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
    pub run_id: uuid::Uuid,
    /// The thread's `requireApproval`.
    pub require_approval: Vec<String>,
    /// The tools the calling item may call (the thread's tools, the item's `toolAllowlist`,
    /// its role's tools): all its `tool` stages may call.
    pub may_call: Vec<String>,
    /// The suspensions of this call's gated `tool` stages (ids `<toolCallId>:…`).
    pub decisions: Vec<Suspension>,
}

impl RunFlowHost<'_> {
    /// The suspensions of `call`'s gated stages, from the run's.
    pub(super) fn decisions_of(all: &[Suspension], call: &ToolCallRecord) -> Vec<Suspension> {
        let prefix = format!("{}:", call.id);
        all.iter()
            .filter(|s| s.tool_call.id.starts_with(&prefix))
            .cloned()
            .collect()
    }
}

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
        if request.response_format.is_some() {
            let (value, resp) =
                crate::llm::structured::complete_structured(self.llm.as_ref(), request)
                    .await
                    .map_err(|e| e.to_string())?;
            return Ok((value, resp.usage));
        }
        let resp = self
            .llm
            .complete(request)
            .await
            .map_err(|e| e.to_string())?;
        Ok((Value::String(resp.content.unwrap_or_default()), resp.usage))
    }
}

/// How a flowchart call ended.
pub(super) enum FlowOutcome {
    /// With a result, or a tool error naming the stage that failed (the model reads it; the run
    /// goes on); and what its `llm` stages used of the model.
    Done(ToolResultRecord, Usage),
    /// Paused at a `tool` stage for a person's decision.
    Paused(Paused),
}

/// Run a flowchart call until it ends or pauses for a person.
pub(super) async fn invoke_flowchart(
    host: &RunFlowHost<'_>,
    tool: &FlowTool,
    call: &ToolCallRecord,
    args: Value,
    limits: FlowLimits,
) -> FlowOutcome {
    let mut paused = None;
    let mut usage = Usage::default();
    let result = run(host, tool, call, args, limits, &mut paused, &mut usage).await;
    if let Some(p) = paused {
        return FlowOutcome::Paused(p);
    }
    let (status, output, error) = match result {
        Ok(v) => (ToolResultStatus::Success, v, None),
        Err(message) => (
            ToolResultStatus::Error,
            json!({"error": message}),
            Some(message),
        ),
    };
    FlowOutcome::Done(
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

async fn run(
    host: &RunFlowHost<'_>,
    tool: &FlowTool,
    call: &ToolCallRecord,
    args: Value,
    limits: FlowLimits,
    paused: &mut Option<Paused>,
    usage: &mut Usage,
) -> Result<Value, String> {
    tool.validate(&args)
        .map_err(|e| ToolError::InvalidArguments(e).to_string())?;
    // The call's own observation (its steps nest under it) and any steps already committed.
    let committed = host
        .journal
        .run_observations(&[ObservationType::ToolCall, ObservationType::FlowchartStep])
        .await
        .map_err(|e| format!("its committed steps could not be read: {e}"))?;
    let parent = committed
        .iter()
        .rev()
        .find(|o| {
            o.kind == ObservationType::ToolCall && o.content["toolCallId"] == call.id.as_str()
        })
        .map(|o| o.id.to_string());
    let steps: Vec<_> = committed
        .into_iter()
        .filter(|o| o.kind == ObservationType::FlowchartStep)
        .collect();
    // A call that had started runs on the version it started with.
    let version = steps
        .iter()
        .find(|o| o.content["toolCallId"] == call.id.as_str() && o.content["parentStep"].is_null())
        .and_then(|o| o.content["version"].as_i64());
    let record = match version {
        Some(v) if v != tool.record.version => match host.load(&tool.record.name, Some(v)).await {
            Ok(Some(r)) => Arc::new(r),
            Ok(None) => tool.record.clone(),
            Err(e) => return Err(format!("its version {v} could not be read: {e}")),
        },
        _ => tool.record.clone(),
    };
    let mut flow = FlowCall::new(host, host.run_id, call.id.clone(), limits, steps);
    let result = flow
        .run(record, args, parent)
        .await
        .map_err(|e| e.to_string());
    *paused = flow.paused().cloned();
    *usage = flow.usage();
    result
}
