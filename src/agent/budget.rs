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

use super::tenant_budget::TenantLimit;
use crate::llm::ChatRequest;
use crate::model::payloads::{BudgetContent, BudgetScope, BudgetState};
use crate::model::{
    Budget, ErrorInfo, OnExceed, Prices, ResumeDecision, Suspension, SuspensionKind,
    SuspensionStatus, Usage, add_usd,
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
        Some(t.share() >= share)
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
        s.tenant_warned = self.tenant.as_ref().is_some_and(|t| t.share() >= WARN_AT);
    }

    fn limits(&self, s: &State) -> (Option<u64>, Option<f64>) {
        (
            self.max_tokens.map(|t| t.saturating_add(s.raised_tokens)),
            self.max_usd.map(|u| add_usd(u, s.raised_usd)),
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
            let (limit_tokens, limit_usd) = t.limits();
            return BudgetContent {
                state,
                scope,
                spent_tokens,
                spent_usd,
                limit_tokens,
                limit_usd,
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
            .fold((0u64, 0.0f64), |(t, u), (rt, ru)| {
                (t.saturating_add(*rt), add_usd(u, *ru))
            });
        let over_tokens = lt.is_some_and(|l| {
            s.spent_tokens
                .saturating_add(rt)
                .saturating_add(prompt_tokens)
                > l
        });
        let over_usd = lu.is_some_and(|l| add_usd(add_usd(s.spent_usd, ru), usd) > l);
        let hold = (prompt_tokens.max(s.largest.0), usd.max(s.largest.1));
        // The tenant's day is checked (and the hold taken there) only for a call the run admits.
        let over_tenant = !(s.shut || over_tokens || over_usd)
            && self
                .tenant
                .as_ref()
                .is_some_and(|t| !t.gauge.try_reserve(t.limits(), (prompt_tokens, usd), hold));
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
        self.unhold(&mut s, ticket);
        s.spent_tokens = s.spent_tokens.saturating_add(used.total_tokens);
        s.spent_usd = add_usd(s.spent_usd, used.cost_usd);
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
        if !s.tenant_warned && self.tenant.as_ref().is_some_and(|t| t.share() >= WARN_AT) {
            s.tenant_warned = true;
            return Some(self.content(&s, BudgetState::Warning, BudgetScope::Tenant));
        }
        None
    }

    /// A call ended without a reply: give its reservation back.
    pub(super) fn release(&self, ticket: Option<Ticket>) {
        let mut s = self.lock();
        self.unhold(&mut s, ticket);
    }

    /// Give back the reservation of `ticket`, the run's and the tenant's.
    fn unhold(&self, s: &mut State, ticket: Option<Ticket>) {
        let Some(Ticket(id)) = ticket else {
            return;
        };
        if let (Some(hold), Some(t)) = (s.reserved.remove(&id), &self.tenant) {
            t.gauge.unreserve(hold);
        }
    }

    /// The content of the `BUDGET` observation at the limit, as the meter stands.
    pub(super) fn exceeded(&self) -> BudgetContent {
        let s = self.lock();
        self.content(&s, BudgetState::Exceeded, s.shut_by)
    }
}

impl Drop for Meter {
    /// A run that stops with calls in flight (a shutdown, a cancel) gives their holds on the
    /// tenant's day back: they are the process's, and the process goes on.
    fn drop(&mut self) {
        let Some(t) = &self.tenant else {
            return;
        };
        let s = self.lock();
        for hold in s.reserved.values() {
            t.gauge.unreserve(*hold);
        }
    }
}

/// What people approved for this run's own budget so far (tokens, dollars), whose budget a person
/// refused to raise, if one did (the run then fails), and whether the operator approved going on
/// past the tenant's day (its raise is the tenant's, read with the day's spend, not the run's).
/// Sums saturate: no number of approvals overflows.
pub(super) fn decisions(suspensions: &[Suspension], run_id: uuid::Uuid) -> Decided {
    let mut d = Decided::default();
    for s in suspensions
        .iter()
        .filter(|s| s.run_id == run_id && s.kind == SuspensionKind::Budget)
    {
        let scope = s.budget_scope().unwrap_or_default();
        match (s.status, &s.decision) {
            (SuspensionStatus::Pending, _) => {}
            (SuspensionStatus::Resolved, Some(ResumeDecision::Approve { raise_by, .. })) => {
                match scope {
                    BudgetScope::Tenant => d.tenant_approved = true,
                    BudgetScope::Run => {
                        if let Some(r) = raise_by {
                            d.raised.0 = d.raised.0.saturating_add(r.tokens.unwrap_or(0));
                            d.raised.1 = add_usd(d.raised.1, r.usd.unwrap_or(0.0));
                        }
                    }
                }
            }
            _ => d.rejected = Some(scope),
        }
    }
    d
}

/// What the decisions on a run's `budget` suspensions say (see [`decisions`]).
#[derive(Debug, Default)]
pub(super) struct Decided {
    /// What its own budget was raised by (tokens, dollars).
    pub(super) raised: (u64, f64),
    /// Whose budget a person refused to raise.
    pub(super) rejected: Option<BudgetScope>,
    /// The operator let it go on past the tenant's day.
    pub(super) tenant_approved: bool,
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

pub(super) fn describe(c: &BudgetContent) -> String {
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
