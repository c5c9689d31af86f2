//! Scheduling: which item runs next (one resumed in progress first, else the first pending item
//! whose dependencies completed), failing an item, and cancelling the items that can no longer run
//! because a dependency did not complete.

use chrono::Utc;
use serde_json::json;

use crate::model::{ErrorInfo, ItemStatus, ObservationType};
use crate::store::{Batch, Op, RunUpdate};

use super::Engine;
use super::journal::{Ctx, Halt};

impl Engine {
    /// The item to work on: one already in progress (resumed), else the first pending item whose
    /// dependencies all completed.
    pub(super) fn next_item(&self, ctx: &Ctx<'_>) -> Option<usize> {
        if let Some(i) = ctx
            .items
            .iter()
            .position(|i| matches!(i.status, ItemStatus::InProgress | ItemStatus::Waiting))
        {
            return Some(i);
        }
        ctx.items.iter().position(|it| {
            it.status == ItemStatus::Pending
                && it.dependencies.iter().all(|d| {
                    ctx.items
                        .iter()
                        .any(|o| &o.id == d && o.status == ItemStatus::Completed)
                })
        })
    }

    /// Mark an item failed (and cancel what can no longer run) in one commit.
    pub(super) async fn fail_item(
        &self,
        ctx: &mut Ctx<'_>,
        item_id: &str,
        err: ErrorInfo,
        answer: Option<String>,
    ) -> Result<(), Halt> {
        let idx = ctx.item_idx(item_id).expect("item exists");
        let it = &mut ctx.items[idx];
        let previous = it.status;
        it.status = ItemStatus::Failed;
        it.error = Some(err.clone());
        if let Some(a) = answer {
            it.thoughts.push(a);
        }
        it.completed_at = Some(Utc::now());
        it.updated_at = Utc::now();
        ctx.state.current_step_id = None;
        let mut b = ctx.batch();
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.observe(ctx.obs(
            Some(item_id),
            ObservationType::Error,
            err.code.clone(),
            json!({"phase": "execute", "code": err.code, "message": err.message, "itemId": item_id}),
        ));
        b.observe(ctx.status_change(&ctx.items[idx], previous));
        b.op(Op::UpdateRun(RunUpdate {
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        ctx.stage(b);
        Ok(())
    }

    /// Once no item can run: every item still pending has a dependency that did not complete, so
    /// it is cancelled with that reason (staged in `b`, committed with the synthesis step).
    pub(super) fn cancel_unreachable(&self, ctx: &mut Ctx<'_>, b: &mut Batch) {
        loop {
            let blocked: Vec<usize> = ctx
                .items
                .iter()
                .enumerate()
                .filter(|(_, it)| it.status == ItemStatus::Pending)
                .map(|(i, _)| i)
                .collect();
            if blocked.is_empty() {
                break;
            }
            for i in blocked {
                let now = Utc::now();
                let it = &mut ctx.items[i];
                it.status = ItemStatus::Cancelled;
                it.error = Some(ErrorInfo {
                    code: "dependency_failed".into(),
                    message: "a dependency did not complete".into(),
                });
                it.updated_at = now;
                b.op(Op::UpsertItem(Box::new(ctx.items[i].clone())));
                b.observe(ctx.status_change(&ctx.items[i], ItemStatus::Pending));
            }
        }
    }
}
