//! Where the budget meets the run: every model call passes the meter first ([`Ctx::admit`]), its
//! usage is priced and counted when it returns ([`Ctx::spend`]), and at the limit the run either
//! fails or waits on a `budget` suspension ([`Engine::suspend_for_budget`]). The meter itself,
//! the run's and its tenant's limits, is in `budget.rs` and `tenant_budget.rs`.

use std::time::Instant;

use chrono::Utc;
use serde_json::json;

use super::Engine;
use super::budget::{BUDGET_ITEM, Refused, describe, estimate, exceeded_error};
use super::changes::Op;
use super::journal::{Ctx, Halt};
use super::tenant_budget::{NEAR, midnight};
use crate::llm::ChatRequest;
use crate::model::payloads::{AgentSuspendedContent, BudgetScope};
use crate::model::{
    Decision, ItemId, OnExceed, Suspension, SuspensionKind, SuspensionStatus, ToolCallRecord,
    Usage, new_id,
};

impl Ctx<'_> {
    /// Pass the meter before a model call for `key` (an item id; `""` for the run's own plan and
    /// synthesis). Refused: the `BUDGET` observation at the limit is staged (once), and the halt
    /// says what the run does: suspend ([`Halt::OverBudget`]) or fail.
    pub(super) fn admit(&mut self, key: &str, req: &ChatRequest) -> Result<(), Halt> {
        if !self.env.budget.limited() {
            return Ok(());
        }
        match self.env.budget.admit(estimate(req)) {
            Ok(ticket) => {
                if let Some(t) = ticket {
                    self.tickets.insert(key.to_owned(), t);
                }
                Ok(())
            }
            Err(Refused { first }) => {
                if let Some(c) = &first {
                    let title = match c.scope {
                        BudgetScope::Run => "Budget reached",
                        BudgetScope::Tenant => "Tenant's daily budget reached",
                    };
                    let o = self.emit(None, title, c);
                    self.pending.observe(o);
                }
                Err(match self.env.budget.on_exceed() {
                    OnExceed::Suspend => Halt::OverBudget,
                    OnExceed::Fail => Halt::Fail(exceeded_error(&self.env.budget.exceeded()), None),
                })
            }
        }
    }

    /// Whether the run's budget refuses item `id`'s model call `req` (suspend mode; `fail` mode
    /// fails the run here).
    pub(super) fn refuses(&mut self, id: &str, req: &ChatRequest) -> Result<bool, Halt> {
        match self.admit(id, req) {
            Ok(()) => Ok(false),
            Err(Halt::OverBudget) => Ok(true),
            Err(other) => Err(other),
        }
    }

    /// The model call for `key` failed: its reservation goes back.
    pub(super) fn unadmit(&mut self, key: &str) {
        let t = self.tickets.remove(key);
        self.env.budget.release(t);
    }

    /// Count a model call's usage for `key` (the item at `item`, if any): priced, added to the
    /// run's and the item's usage and to the meter (unless `metered` already counted it, as a
    /// flowchart call's stages do), with the `BUDGET` warning staged when it crossed 80 %.
    pub(super) fn spend(&mut self, key: &str, usage: &Usage, metered: bool) -> Usage {
        let used = if metered {
            *usage
        } else {
            self.env.budget.price(usage)
        };
        let ticket = self.tickets.remove(key);
        let warning = if metered {
            self.env.budget.release(ticket);
            self.env.budget.warning()
        } else {
            self.env.budget.settle(ticket, &used)
        };
        self.usage.add(&used);
        if let Some(i) = self.item_idx(key) {
            self.items[i].usage.add(&used);
        }
        if let Some(c) = warning {
            let title = match c.scope {
                BudgetScope::Run => "Budget at 80 %",
                BudgetScope::Tenant => "Tenant's daily budget at 80 %",
            };
            let o = self.emit(None, title, &c);
            self.pending.observe(o);
        }
        used
    }
}

impl Engine {
    /// The next model call would pass the budget and the run waits for a person: a `budget`
    /// suspension (or the one already pending), with every other suspension it waits on, and
    /// the run suspended.
    pub(super) async fn suspend_for_budget(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let content = ctx.env.budget.exceeded();
        let mut b = ctx.batch();
        let pending = ctx
            .suspensions
            .iter()
            .find(|s| {
                s.run_id == ctx.run.run_id
                    && s.kind == SuspensionKind::Budget
                    && s.status == SuspensionStatus::Pending
            })
            .map(|s| s.suspension_id);
        let budget_id = match pending {
            Some(id) => id,
            None => {
                let now = Utc::now();
                let ttl = ctx
                    .env
                    .cfg
                    .suspension_ttl_seconds
                    .unwrap_or(self.settings.suspension_ttl_seconds);
                let id = new_id();
                let call = ToolCallRecord {
                    id: format!("budget:{id}"),
                    name: "budget".into(),
                    arguments: json!(content),
                };
                let question = match content.scope {
                    BudgetScope::Run => format!(
                        "The run's next model call would pass its budget ({}). Approve with raiseBy to go on, or reject to fail the run.",
                        describe(&content)
                    ),
                    BudgetScope::Tenant => format!(
                        "The run's next model call would pass the tenant's daily budget ({}). Only the operator may raise it (approve with raiseBy at POST /v1/admin/suspensions/{id}/resume, or POST /v1/admin/tenants/{}/budget-raises): the tenant's runs stopped on it then go on. Reject to fail the run.",
                        describe(&content),
                        ctx.env.tenant
                    ),
                };
                let s = Suspension {
                    suspension_id: id,
                    thread_id: ctx.env.thread_id.clone(),
                    tenant: ctx.env.tenant.clone(),
                    run_id: ctx.run.run_id,
                    item_id: ItemId::from_stored(BUDGET_ITEM.into()),
                    kind: SuspensionKind::Budget,
                    tool_call: call.clone(),
                    allowed_decisions: vec![Decision::Approve, Decision::Reject],
                    question: Some(question.clone()),
                    input_schema: None,
                    iteration_state: serde_json::Value::Null,
                    partial_tool_results: vec![],
                    status: SuspensionStatus::Pending,
                    decision: None,
                    created_at: now,
                    resolved_at: None,
                    expires_at: (ttl > 0).then(|| {
                        let secs = ttl.min(crate::model::MAX_SUSPENSION_TTL_SECONDS) as i64;
                        now.checked_add_signed(chrono::Duration::seconds(secs))
                            .unwrap_or(chrono::DateTime::<Utc>::MAX_UTC)
                    }),
                };
                b.op(Op::InsertSuspension(Box::new(s.clone())));
                b.observe(ctx.emit(
                    None,
                    "Waiting for a person: budget",
                    &AgentSuspendedContent {
                        suspension_id: id,
                        item_id: s.item_id.clone(),
                        kind: SuspensionKind::Budget,
                        tool_call: call,
                        allowed_decisions: s.allowed_decisions.clone(),
                        question: Some(question),
                        input_schema: None,
                        expires_at: s.expires_at,
                    },
                ));
                ctx.suspensions.push(s);
                id
            }
        };
        let mut waiting = super::hitl::waiting_suspensions(ctx);
        waiting.push(budget_id);
        super::hitl::commit_waiting(ctx, b, waiting).await
    }
}

impl Ctx<'_> {
    /// Read the tenant's spend today from the store when this process's reading is stale (see
    /// `tenant_budget.rs`); nothing when the tenant has no daily budget.
    pub(super) async fn refresh_tenant_spend(&mut self) -> Result<(), Halt> {
        let Some(near) = self.env.budget.tenant_near(NEAR) else {
            return Ok(());
        };
        let budget = self.env.budget.clone();
        let Some(limit) = budget.tenant() else {
            return Ok(());
        };
        if !limit.gauge.stale(near) {
            return Ok(());
        }
        // This run's own spend is committed first, so the read holds all of it (what the gauge
        // counted since the last read is dropped with the read).
        self.flush().await?;
        let (now, at) = (Utc::now(), Instant::now());
        let read = self
            .env
            .journal
            .tenant_spend(midnight(now))
            .await
            .map_err(Halt::from)?;
        limit.gauge.set(now.date_naive(), at, read);
        Ok(())
    }
}
