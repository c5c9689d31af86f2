//! An item's failure and what it takes with it: the item fails, every pending item that depends
//! on it (directly, through other items, or as a member of a failed team) is cancelled with the
//! reason, and once no item can run, what is still pending is cancelled as unreachable.

use chrono::Utc;

use super::Engine;
use super::changes::{Op, RunUpdate};
use super::journal::Ctx;
use crate::model::payloads::{ErrorContent, ErrorPhase};
use crate::model::{ErrorInfo, ItemStatus};

impl Engine {
    /// Mark an item failed and cancel every item that depends on it, directly or not (staged).
    pub(super) fn fail_item(
        &self,
        ctx: &mut Ctx<'_>,
        item_id: &str,
        err: ErrorInfo,
        answer: Option<String>,
    ) {
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
        self.item_left(ctx);
        let mut b = ctx.batch();
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.observe(ctx.emit(
            Some(item_id),
            err.code.clone(),
            &ErrorContent {
                phase: ErrorPhase::Execute,
                code: err.code.clone(),
                message: err.message.clone(),
                item_id: Some(ctx.items[idx].id.clone()),
            },
        ));
        b.observe(ctx.status_change(&ctx.items[idx], previous));
        b.op(Op::UpdateRun(RunUpdate {
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        ctx.stage(b);
        self.cancel_dependents(ctx, item_id);
    }

    /// Cancel the pending items that depend on `failed`, directly or through other items.
    fn cancel_dependents(&self, ctx: &mut Ctx<'_>, failed: &str) {
        let mut doomed: Vec<String> = vec![failed.to_owned()];
        let mut b = ctx.batch();
        while let Some(gone) = doomed.pop() {
            for i in 0..ctx.items.len() {
                let it = &ctx.items[i];
                let depends = it.dependencies.iter().any(|d| d.as_str() == gone);
                let in_gone_team = it
                    .parent_item_id
                    .as_ref()
                    .is_some_and(|p| p.as_str() == gone);
                if it.status != ItemStatus::Pending || !(depends || in_gone_team) {
                    continue;
                }
                let now = Utc::now();
                let it = &mut ctx.items[i];
                it.status = ItemStatus::Cancelled;
                it.error = Some(ErrorInfo {
                    code: "dependency_failed".into(),
                    message: if in_gone_team && gone == failed {
                        format!("cancelled: its team `{failed}` failed")
                    } else if in_gone_team {
                        format!(
                            "cancelled: its team `{gone}` was cancelled because `{failed}` failed"
                        )
                    } else if gone == failed {
                        format!("cancelled: its dependency `{failed}` failed")
                    } else {
                        format!(
                            "cancelled: its dependency `{gone}` was cancelled because `{failed}` failed"
                        )
                    },
                });
                it.updated_at = now;
                it.completed_at = Some(now);
                doomed.push(it.id.to_string());
                b.op(Op::UpsertItem(Box::new(ctx.items[i].clone())));
                b.observe(ctx.status_change(&ctx.items[i], ItemStatus::Pending));
            }
        }
        ctx.stage(b);
    }

    /// An item stopped being in progress: `currentStepId` moves to the most recently started
    /// item still in progress.
    pub(super) fn item_left(&self, ctx: &mut Ctx<'_>) {
        ctx.state.current_step_id = ctx
            .items
            .iter()
            .filter(|i| i.status == ItemStatus::InProgress)
            .max_by_key(|i| i.started_at)
            .map(|i| i.id.to_string());
    }

    /// Once no item can run: every item still pending has a dependency that did not complete, so
    /// it is cancelled with that reason (staged in `b`, committed with the synthesis step).
    pub(super) fn cancel_unreachable(&self, ctx: &mut Ctx<'_>, b: &mut super::changes::Batch) {
        for i in 0..ctx.items.len() {
            if ctx.items[i].status != ItemStatus::Pending {
                continue;
            }
            let blocker = ctx.items[i]
                .dependencies
                .iter()
                .find(|d| {
                    !ctx.items
                        .iter()
                        .any(|o| &o.id == *d && o.status == ItemStatus::Completed)
                })
                .map(|d| d.to_string())
                .unwrap_or_default();
            let now = Utc::now();
            let it = &mut ctx.items[i];
            it.status = ItemStatus::Cancelled;
            it.error = Some(ErrorInfo {
                code: "dependency_failed".into(),
                message: format!("cancelled: its dependency `{blocker}` did not complete"),
            });
            it.updated_at = now;
            it.completed_at = Some(now);
            b.op(Op::UpsertItem(Box::new(ctx.items[i].clone())));
            b.observe(ctx.status_change(&ctx.items[i], ItemStatus::Pending));
        }
    }
}
