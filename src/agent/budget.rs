//! The run's budget: the meter every model call passes before it starts (planning, items,
//! compaction, team plans, synthesis, flowchart `llm` stages), what the run spent (priced by
//! `PES_MODEL_PRICES`), the `BUDGET` observations, and the `budget` suspension at the limit.
//!
//! A call is admitted while what was spent, plus what the calls in flight may still spend, plus
//! the new call's prompt stays within every limit. A call in flight is counted as large as the
//! largest call of the run so far (or its prompt, when larger), so parallel items and teams —
//! which share the one meter of their run — cannot together pass a limit by more than one call's
//! misestimate. Once a call is refused the meter stays shut until a person raises the budget: no
//! model call starts after the limit. The spend itself is the run's `usage`, committed with every
//! step, so a run re-claimed after a crash starts its meter where the store says it was.
//!
//! The meter also holds the run's share of its tenant's daily budget (`tenant_budget.rs`): a
//! call must fit under both, and the limit that refused it says what happens (`onExceed`) and
//! whose budget the `BUDGET` observation and the suspension name (`scope`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use serde_json::json;

use super::Engine;
use super::changes::{Op, RunUpdate};
use super::journal::{Ctx, Halt};
use super::tenant_budget::TenantLimit;
use crate::llm::ChatRequest;
use crate::model::payloads::{
    AgentSuspendedContent, BudgetContent, BudgetScope, BudgetState, RunSuspendedContent,
};
use crate::model::{
    Budget, Decision, ErrorInfo, ItemId, OnExceed, Prices, ResumeDecision, RunStatus, Suspension,
    SuspensionKind, SuspensionStatus, ToolCallRecord, Usage, new_id,
};

/// The item id a `budget` suspension names: it belongs to the run, not to one item.
pub(super) const BUDGET_ITEM: &str = "run";

/// Share of a limit at which the `BUDGET` warning is made.
const WARN_AT: f64 = 0.8;

/// An admitted call's reservation, given back when its usage is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ticket(u64);

/// The meter of one run, shared by its loop and the flowchart calls in flight.
pub(super) struct Meter {
    prices: Arc<Prices>,
    model: Option<String>,
    on_exceed: OnExceed,
    max_tokens: Option<u64>,
    max_usd: Option<f64>,
    /// The tenant's daily budget, when it has one.
    tenant: Option<TenantLimit>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    spent_tokens: u64,
    spent_usd: f64,
    raised_tokens: u64,
    raised_usd: f64,
    /// What each admitted call in flight may spend.
    reserved: HashMap<u64, (u64, f64)>,
    next: u64,
    /// The largest call so far (tokens, dollars).
    largest: (u64, f64),
    /// The 80 % mark was reported (for the limits as they are now).
    warned: bool,
    /// A call was refused: nothing more starts until the budget is raised.
    shut: bool,
    /// Whose limit refused it.
    shut_by: BudgetScope,
    /// The tenant's 80 % mark was reported by this run.
    tenant_warned: bool,
}

/// Why a call was refused.
pub(super) struct Refused {
    /// The `BUDGET` content at the limit, the first time the meter shut (none after).
    pub(super) first: Option<BudgetContent>,
}

/// A prompt's estimated size in tokens (four characters a token, tool schemas included).
pub(super) fn estimate(req: &ChatRequest) -> u64 {
    let chars: usize = req
        .messages
        .iter()
        .map(|m| {
            m.content.as_ref().map_or(0, String::len)
                + m.tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.to_string().len())
                    .sum::<usize>()
        })
        .sum::<usize>()
        + req
            .tools
            .iter()
            .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
            .sum::<usize>();
    (chars as u64).div_ceil(4)
}

impl Meter {
    /// A meter over `budget` (none: it only prices) that starts from `spent`, raised by what
    /// people approved so far.
    pub(super) fn new(
        budget: Option<&Budget>,
        tenant: Option<TenantLimit>,
        prices: Arc<Prices>,
        model: Option<String>,
        spent: &Usage,
        raised: (u64, f64),
    ) -> Self {
        let b = budget.cloned().unwrap_or_default();
        let m = Self {
            prices,
            model,
            on_exceed: b.on_exceed.unwrap_or_default(),
            max_tokens: b.max_tokens,
            max_usd: b.max_cost_usd,
            tenant,
            state: Mutex::new(State {
                spent_tokens: spent.total_tokens,
                spent_usd: spent.cost_usd,
                raised_tokens: raised.0,
                raised_usd: raised.1,
                ..State::default()
            }),
        };
        let mut s = m.lock();
        s.warned = m.share(&s) >= WARN_AT;
        drop(s);
        m
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the run has a limit at all, its own or its tenant's (without one, admission
    /// costs nothing).
    pub(super) fn limited(&self) -> bool {
        self.max_tokens.is_some() || self.max_usd.is_some() || self.tenant.is_some()
    }

    /// What the run does now that a call was refused: what the limit that refused it says.
    pub(super) fn on_exceed(&self) -> OnExceed {
        match (self.lock().shut_by, &self.tenant) {
            (BudgetScope::Tenant, Some(t)) => t.on_exceed,
            _ => self.on_exceed,
        }
    }

    /// The tenant's daily budget, when it has one.
    pub(super) fn tenant(&self) -> Option<&TenantLimit> {
        self.tenant.as_ref()
    }

    /// Whether the tenant's spend is past `share` of its daily limits (none: no daily budget).
    pub(super) fn tenant_near(&self, share: f64) -> Option<bool> {
        let t = self.tenant.as_ref()?;
        let s = self.lock();
        Some(t.share((s.raised_tokens, s.raised_usd)) >= share)
    }

    /// A person's decision on a budget suspension of `scope` shut the meter (a reject).
    pub(super) fn shut(&self, scope: BudgetScope) {
        let mut s = self.lock();
        s.shut = true;
        s.shut_by = scope;
    }

    /// A run that goes on does not report again the tenant's 80 % it reported before.
    pub(super) fn tenant_reported(&self) {
        let mut s = self.lock();
        let raised = (s.raised_tokens, s.raised_usd);
        s.tenant_warned = self
            .tenant
            .as_ref()
            .is_some_and(|t| t.share(raised) >= WARN_AT);
    }

    fn limits(&self, s: &State) -> (Option<u64>, Option<f64>) {
        (
            self.max_tokens.map(|t| t.saturating_add(s.raised_tokens)),
            self.max_usd.map(|u| u + s.raised_usd),
        )
    }

    /// The larger share of a limit that is spent.
    fn share(&self, s: &State) -> f64 {
        let (lt, lu) = self.limits(s);
        let t = lt.map_or(0.0, |l| s.spent_tokens as f64 / l.max(1) as f64);
        let u = lu.map_or(0.0, |l| if l > 0.0 { s.spent_usd / l } else { 1.0 });
        t.max(u)
    }

    fn content(&self, s: &State, state: BudgetState, scope: BudgetScope) -> BudgetContent {
        if let (BudgetScope::Tenant, Some(t)) = (scope, &self.tenant) {
            let (spent_tokens, spent_usd) = t.gauge.spent();
            return BudgetContent {
                state,
                scope,
                spent_tokens,
                spent_usd,
                limit_tokens: t.max_tokens.map(|l| l.saturating_add(s.raised_tokens)),
                limit_usd: t.max_usd.map(|l| l + s.raised_usd),
            };
        }
        let (limit_tokens, limit_usd) = self.limits(s);
        BudgetContent {
            state,
            scope: BudgetScope::Run,
            spent_tokens: s.spent_tokens,
            spent_usd: s.spent_usd,
            limit_tokens,
            limit_usd,
        }
    }

    /// Whether a call of `tokens` and `usd` more than what is spent and reserved (`reserved`)
    /// passes the tenant's daily limits (raised for this run).
    fn over_tenant(&self, s: &State, reserved: (u64, f64), tokens: u64, usd: f64) -> bool {
        let Some(t) = &self.tenant else {
            return false;
        };
        let (st, su) = t.gauge.spent();
        t.max_tokens
            .is_some_and(|l| st + reserved.0 + tokens > l.saturating_add(s.raised_tokens))
            || t.max_usd
                .is_some_and(|l| su + reserved.1 + usd > l + s.raised_usd)
    }

    /// What `usage` cost on the run's model.
    pub(super) fn price(&self, usage: &Usage) -> Usage {
        let mut u = *usage;
        if !self.prices.is_empty() {
            u.cost_usd = self.prices.cost(self.model.as_deref(), usage);
        }
        u
    }

    /// Admit a call whose prompt is about `prompt_tokens` long, or refuse it.
    pub(super) fn admit(&self, prompt_tokens: u64) -> Result<Option<Ticket>, Refused> {
        if !self.limited() {
            return Ok(None);
        }
        let mut s = self.lock();
        let usd = self
            .prices
            .prompt_cost(self.model.as_deref(), prompt_tokens);
        let (lt, lu) = self.limits(&s);
        let (rt, ru) = s
            .reserved
            .values()
            .fold((0u64, 0.0f64), |(t, u), (rt, ru)| (t + rt, u + ru));
        let over_tokens = lt.is_some_and(|l| s.spent_tokens + rt + prompt_tokens > l);
        let over_usd = lu.is_some_and(|l| s.spent_usd + ru + usd > l);
        let over_tenant = self.over_tenant(&s, (rt, ru), prompt_tokens, usd);
        if s.shut || over_tokens || over_usd || over_tenant {
            if !s.shut {
                s.shut_by = if over_tokens || over_usd {
                    BudgetScope::Run
                } else {
                    BudgetScope::Tenant
                };
            }
            let first = (!s.shut).then(|| self.content(&s, BudgetState::Exceeded, s.shut_by));
            s.shut = true;
            return Err(Refused { first });
        }
        let id = s.next;
        s.next += 1;
        let hold = (prompt_tokens.max(s.largest.0), usd.max(s.largest.1));
        s.reserved.insert(id, hold);
        Ok(Some(Ticket(id)))
    }

    /// A call ended: give its reservation back and count what it used (priced). The `BUDGET`
    /// warning's content when the spend is past 80 % of a limit for the first time.
    pub(super) fn settle(&self, ticket: Option<Ticket>, used: &Usage) -> Option<BudgetContent> {
        self.count(ticket, used);
        self.warning()
    }

    /// [`Meter::settle`] without the warning: a flowchart stage counts here, and the loop looks
    /// for the warning when it takes the call's result in.
    pub(super) fn count(&self, ticket: Option<Ticket>, used: &Usage) {
        let mut s = self.lock();
        if let Some(Ticket(id)) = ticket {
            s.reserved.remove(&id);
        }
        s.spent_tokens += used.total_tokens;
        s.spent_usd += used.cost_usd;
        if let Some(t) = &self.tenant {
            t.gauge.add(used.total_tokens, used.cost_usd);
        }
        s.largest = (
            s.largest.0.max(used.total_tokens),
            s.largest.1.max(used.cost_usd),
        );
    }

    /// The `BUDGET` warning's content, once per limit: when the spend is past 80 % of the
    /// run's limits, or of the tenant's.
    pub(super) fn warning(&self) -> Option<BudgetContent> {
        let mut s = self.lock();
        if !self.limited() {
            return None;
        }
        if !s.warned && self.share(&s) >= WARN_AT {
            s.warned = true;
            return Some(self.content(&s, BudgetState::Warning, BudgetScope::Run));
        }
        let raised = (s.raised_tokens, s.raised_usd);
        if !s.tenant_warned
            && self
                .tenant
                .as_ref()
                .is_some_and(|t| t.share(raised) >= WARN_AT)
        {
            s.tenant_warned = true;
            return Some(self.content(&s, BudgetState::Warning, BudgetScope::Tenant));
        }
        None
    }

    /// A call ended without a reply: give its reservation back.
    pub(super) fn release(&self, ticket: Option<Ticket>) {
        if let Some(Ticket(id)) = ticket {
            self.lock().reserved.remove(&id);
        }
    }

    /// The content of the `BUDGET` observation at the limit, as the meter stands.
    pub(super) fn exceeded(&self) -> BudgetContent {
        let s = self.lock();
        self.content(&s, BudgetState::Exceeded, s.shut_by)
    }
}

/// What people approved for this run's budget so far (tokens, dollars), and whose budget a
/// person refused to raise, if one did (the run then fails).
pub(super) fn decisions(
    suspensions: &[Suspension],
    run_id: uuid::Uuid,
) -> ((u64, f64), Option<BudgetScope>) {
    let mut raised = (0u64, 0.0f64);
    let mut rejected = None;
    for s in suspensions
        .iter()
        .filter(|s| s.run_id == run_id && s.kind == SuspensionKind::Budget)
    {
        match (s.status, &s.decision) {
            (SuspensionStatus::Pending, _) => {}
            (SuspensionStatus::Resolved, Some(ResumeDecision::Approve { raise_by, .. })) => {
                if let Some(r) = raise_by {
                    raised.0 += r.tokens.unwrap_or(0);
                    raised.1 += r.usd.unwrap_or(0.0);
                }
            }
            _ => {
                let scope = s.tool_call.arguments.get("scope").cloned();
                rejected = Some(
                    scope
                        .and_then(|v| serde_json::from_value(v).ok())
                        .unwrap_or_default(),
                );
            }
        }
    }
    (raised, rejected)
}

/// The run failed for its budget (or its tenant's daily budget).
pub(super) fn exceeded_error(c: &BudgetContent) -> ErrorInfo {
    ErrorInfo {
        code: "budget_exceeded".into(),
        message: format!("{} is spent: {}", whose(c.scope), describe(c)),
    }
}

/// Whose budget `scope` names, in words.
fn whose(scope: BudgetScope) -> &'static str {
    match scope {
        BudgetScope::Run => "the run's budget",
        BudgetScope::Tenant => "the tenant's daily budget",
    }
}

fn describe(c: &BudgetContent) -> String {
    let mut parts = vec![];
    if let Some(l) = c.limit_tokens {
        parts.push(format!("{} of {l} tokens", c.spent_tokens));
    }
    if let Some(l) = c.limit_usd {
        parts.push(format!("${:.4} of ${l:.4}", c.spent_usd));
    }
    if parts.is_empty() {
        parts.push(format!("{} tokens", c.spent_tokens));
    }
    parts.join(", ")
}

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
                        "The run's next model call would pass the tenant's daily budget ({}). Approve with raiseBy to let this run go on (it raises this run's allowance only), or reject to fail the run.",
                        describe(&content)
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
        let mut waiting = super::scheduler::waiting_suspensions(ctx);
        waiting.push(budget_id);
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
}
