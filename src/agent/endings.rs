//! The end of a run that did not complete: `RUN_FAILED` (with the item it failed in) and
//! `RUN_CANCELLED`. A run's end ends its work: its unfinished items become `cancelled` and its
//! pending suspensions are resolved as cancelled, in the same commit, so no later run executes a
//! call that waited for a decision nobody took (a later run plans for its own query, and reads
//! these items as context only).

use crate::model::payloads::{
    CancelReason, ErrorContent, ErrorPhase, RunCancelledContent, RunFailedContent,
};
use chrono::Utc;
use tracing::warn;

use super::changes::{Batch, Op, RunUpdate};
use crate::model::{ErrorInfo, ItemStatus, RunPhase, RunStatus};

use super::Engine;
use super::journal::{Ctx, Halt};

impl Engine {
    pub(super) async fn commit_failed(
        &self,
        ctx: &mut Ctx<'_>,
        err: ErrorInfo,
        item: Option<String>,
    ) -> Result<(), Halt> {
        warn!(run_id = %ctx.run.run_id, code = %err.code, message = %err.message, "run failed");
        let phase = match ctx.run.phase {
            RunPhase::Planning | RunPhase::New => ErrorPhase::Plan,
            RunPhase::Synthesizing => ErrorPhase::Synthesize,
            RunPhase::Executing | RunPhase::Done => ErrorPhase::Execute,
        };
        let mut b = ctx.batch();
        if let Some(item_id) = &item
            && let Some(idx) = ctx.item_idx(item_id)
        {
            let it = &mut ctx.items[idx];
            let previous = it.status;
            it.status = ItemStatus::Failed;
            it.error = Some(err.clone());
            it.updated_at = Utc::now();
            b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
            b.observe(ctx.status_change(&ctx.items[idx], previous));
        }
        end_unfinished(
            ctx,
            &mut b,
            &ErrorInfo {
                code: "run_failed".into(),
                message: format!("cancelled: the run failed ({})", err.code),
            },
        );
        ctx.state.current_step_id = None;
        b.op(Op::SetAgentState(ctx.state.clone()));
        b.observe(ctx.emit(
            item.as_deref(),
            err.code.clone(),
            &ErrorContent {
                phase,
                code: err.code.clone(),
                message: err.message.clone(),
                item_id: None,
            },
        ));
        b.observe(ctx.emit(
            None,
            "Run failed",
            &RunFailedContent {
                error: err.clone(),
                usage: ctx.usage,
            },
        ));
        b.op(Op::UpdateRun(RunUpdate {
            status: Some(RunStatus::Failed),
            usage: Some(ctx.usage),
            error: Some(err),
            ended: true,
            ..Default::default()
        }));
        ctx.commit(b).await
    }

    /// Cancelled: the unfinished items are cancelled with the run, which ends.
    pub(super) async fn commit_cancelled(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let mut b = ctx.batch();
        // Each kind of call stops what it has in flight outside (a remote agent's task).
        for o in self.cancel_calls(ctx.env.journal, ctx.run.run_id).await {
            b.observe(o);
        }
        end_unfinished(
            ctx,
            &mut b,
            &ErrorInfo {
                code: "run_cancelled".into(),
                message: "cancelled: the run was cancelled".into(),
            },
        );
        ctx.state.current_step_id = None;
        b.op(Op::SetAgentState(ctx.state.clone()));
        b.observe(ctx.emit(
            None,
            "Run cancelled",
            &RunCancelledContent {
                reason: CancelReason::Cancelled,
                by_run_id: None,
                usage: Some(ctx.usage),
            },
        ));
        b.op(Op::UpdateRun(RunUpdate {
            status: Some(RunStatus::Cancelled),
            usage: Some(ctx.usage),
            ended: true,
            ..Default::default()
        }));
        ctx.commit(b).await
    }
}

/// Cancel every item of the run that has not finished (pending, in progress or waiting for a
/// person) with `why`, and the run's pending suspensions: staged in `b`, the commit that ends the
/// run. Only one run works on a thread at a time, so every unfinished item is this run's.
pub(super) fn end_unfinished(ctx: &mut Ctx<'_>, b: &mut Batch, why: &ErrorInfo) {
    let now = Utc::now();
    for i in 0..ctx.items.len() {
        let previous = ctx.items[i].status;
        if previous.is_done() {
            continue;
        }
        let it = &mut ctx.items[i];
        it.status = ItemStatus::Cancelled;
        it.error = Some(why.clone());
        it.updated_at = now;
        it.completed_at = Some(now);
        b.op(Op::UpsertItem(Box::new(ctx.items[i].clone())));
        b.observe(ctx.status_change(&ctx.items[i], previous));
    }
    b.op(Op::CancelSuspensions);
}
