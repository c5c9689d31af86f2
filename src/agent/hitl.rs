//! Human in the loop: suspending the run on a call that needs a person (approval or input),
//! turning a person's decision (or an expiry or cancellation) into the call's result, and the
//! run waiting for its people (what it waits on, the decisions it takes in, its suspension).

use crate::model::payloads::{AgentSuspendedContent, RunSuspendedContent};
use chrono::Utc;
use serde_json::{Value, json};

use super::changes::{Op, RunUpdate};
use crate::model::{
    ItemStatus, MessageRole, ResumeDecision, RunStatus, Suspension, SuspensionKind,
    SuspensionStatus, ToolCallRecord, ToolResultRecord, ToolResultStatus, new_id,
};

use super::Engine;
use super::journal::{Ctx, Halt};
use super::tool_calls::CallStep;

impl Engine {
    /// What a person's decision (or an expiry, or a cancellation) makes of a suspended call:
    /// approve and edit run it (with the edited arguments), respond answers in its place, and
    /// anything else rejects it.
    pub(super) fn decision_step(&self, call: &ToolCallRecord, s: &Suspension) -> CallStep {
        // Only a person's decision counts; an expiry or a cancellation rejects the call.
        let decision = match s.status {
            SuspensionStatus::Resolved => s.decision.as_ref(),
            _ => None,
        };
        let rejected = |reason: String| {
            CallStep::Answered(
                ToolResultRecord {
                    tool_call_id: call.id.clone(),
                    name: call.name.clone(),
                    status: ToolResultStatus::Rejected,
                    output: json!({"rejected": true, "reason": reason,
                                   "message": format!("A person rejected this call of `{}`: {reason}", call.name)}),
                    error: None,
                },
                vec![],
                vec![],
            )
        };
        match decision {
            Some(ResumeDecision::Approve { .. }) => CallStep::Invoke(call.arguments.clone()),
            Some(ResumeDecision::Edit { args, .. }) => CallStep::Invoke(args.clone()),
            Some(ResumeDecision::Respond { response, .. }) => CallStep::Answered(
                ToolResultRecord {
                    tool_call_id: call.id.clone(),
                    name: call.name.clone(),
                    status: ToolResultStatus::Responded,
                    output: response.clone(),
                    error: None,
                },
                vec![],
                vec![],
            ),
            Some(ResumeDecision::Reject { reason }) => {
                rejected(reason.clone().unwrap_or_else(|| "no reason given".into()))
            }
            None => rejected(match s.status {
                SuspensionStatus::Expired => "expired: nobody decided in time".into(),
                SuspensionStatus::Cancelled => "cancelled: the run that asked was cancelled".into(),
                _ => "no decision".into(),
            }),
        }
    }

    /// Stage a suspension: the item waits on `call` until a person decides. The other items go
    /// on; the run is suspended only once nothing else can proceed (see the scheduler).
    pub(super) fn suspend(
        &self,
        ctx: &mut Ctx<'_>,
        item_id: &str,
        call: &ToolCallRecord,
        kind: SuspensionKind,
    ) {
        let idx = ctx.item_idx(item_id).expect("item");
        let now = Utc::now();
        let ttl = ctx
            .env
            .cfg
            .suspension_ttl_seconds
            .unwrap_or(self.settings.suspension_ttl_seconds);
        let item = &ctx.items[idx];
        let turn_calls: Vec<String> = item
            .conversation
            .iter()
            .rev()
            .find(|m| m.role == MessageRole::Assistant)
            .map(|m| m.tool_calls.iter().map(|c| c.id.clone()).collect())
            .unwrap_or_default();
        let partial: Vec<ToolResultRecord> = item
            .tool_results
            .iter()
            .filter(|r| turn_calls.contains(&r.tool_call_id))
            .cloned()
            .collect();
        // What a person is asked, and may decide, is the kind's (`model/suspensions.rs`).
        let (allowed, question) = (kind.decisions(), kind.question(call));
        let input_schema = match kind {
            SuspensionKind::Input | SuspensionKind::RemoteInput => call
                .arguments
                .get("inputSchema")
                .cloned()
                .filter(|v| !v.is_null()),
            SuspensionKind::Budget | SuspensionKind::Approval => None,
        };
        let suspension = Suspension {
            suspension_id: new_id(),
            thread_id: ctx.env.thread_id.clone(),
            tenant: ctx.env.tenant.clone(),
            run_id: ctx.run.run_id,
            item_id: item.id.clone(),
            kind,
            tool_call: call.clone(),
            allowed_decisions: allowed,
            question,
            input_schema,
            iteration_state: serde_json::to_value(&item.conversation).unwrap_or(Value::Null),
            partial_tool_results: partial,
            status: SuspensionStatus::Pending,
            decision: None,
            created_at: now,
            resolved_at: None,
            // Bounded at the edge; clamped again here so a value stored before the bound existed
            // can never overflow the deadline.
            expires_at: (ttl > 0).then(|| {
                let secs = ttl.min(crate::model::MAX_SUSPENSION_TTL_SECONDS) as i64;
                now.checked_add_signed(chrono::Duration::seconds(secs))
                    .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
            }),
        };
        let it = &mut ctx.items[idx];
        let previous = it.status;
        it.status = ItemStatus::Waiting;
        it.updated_at = now;
        let mut b = ctx.batch();
        b.op(Op::InsertSuspension(Box::new(suspension.clone())));
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.op(Op::UpdateRun(RunUpdate {
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        if previous != ItemStatus::Waiting {
            b.observe(ctx.status_change(&ctx.items[idx], previous));
        }
        b.observe(ctx.emit(
            Some(item_id),
            format!("Waiting for a person: {}", call.name),
            &AgentSuspendedContent {
                suspension_id: suspension.suspension_id,
                item_id: ctx.items[idx].id.clone(),
                kind,
                tool_call: call.clone(),
                allowed_decisions: suspension.allowed_decisions.clone(),
                question: suspension.question.clone(),
                input_schema: suspension.input_schema.clone(),
                expires_at: suspension.expires_at,
            },
        ));
        ctx.stage(b);
        ctx.suspensions.push(suspension);
    }
}

/// The pending suspensions of this run that its waiting items wait on.
pub(super) fn waiting_suspensions(ctx: &Ctx<'_>) -> Vec<uuid::Uuid> {
    ctx.suspensions
        .iter()
        .filter(|s| s.status == SuspensionStatus::Pending && s.run_id == ctx.run.run_id)
        .filter(|s| {
            ctx.item_idx(s.item_id.as_str())
                .is_some_and(|i| ctx.items[i].status == ItemStatus::Waiting)
        })
        .map(|s| s.suspension_id)
        .collect()
}

/// Read which of `waiting` were decided since the run loaded them and take the decisions in;
/// `true` when there was one (its item can go on).
pub(super) async fn take_decisions(
    ctx: &mut Ctx<'_>,
    waiting: &[uuid::Uuid],
) -> Result<bool, Halt> {
    let decided = ctx.env.journal.decided(waiting).await.map_err(Halt::from)?;
    let any = !decided.is_empty();
    for d in decided {
        if let Some(s) = ctx
            .suspensions
            .iter_mut()
            .find(|s| s.suspension_id == d.suspension_id)
        {
            *s = d;
        }
    }
    Ok(any)
}

/// Nothing can proceed until a person decides on `waiting`: commit `b` with the run suspended
/// on them. Should one of them have been decided while this run was busy, the store queues the
/// run again instead.
pub(super) async fn commit_waiting(
    ctx: &mut Ctx<'_>,
    mut b: super::changes::Batch,
    waiting: Vec<uuid::Uuid>,
) -> Result<(), Halt> {
    ctx.state.current_step_id = None;
    b.op(Op::SetAgentState(ctx.state.clone()));
    b.observe(ctx.emit(
        None,
        format!("Waiting for {} decision(s)", waiting.len()),
        &RunSuspendedContent {
            suspension_ids: waiting.clone(),
            usage: ctx.usage,
        },
    ));
    b.op(Op::UpdateRun(RunUpdate {
        status: Some(RunStatus::Suspended),
        usage: Some(ctx.usage),
        unless_decided: waiting,
        ..Default::default()
    }));
    ctx.commit(b).await
}
