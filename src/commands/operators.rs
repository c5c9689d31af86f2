//! The operator's use cases (`/v1/admin/*`): a tenant's day (what it spent, its daily budget,
//! the raises), raising that day for the rest of it, and deciding a suspension on it. The
//! operator is above tenants: any tenant's suspension is reachable here. A raise is a row of the
//! store, read by every replica's gauge with the day's spend; the runs stopped on the tenant's
//! day go on, each of their suspensions resolved as approved exactly once (the store's
//! compare-and-set), so a raise made twice at once still resumes each run once.

use chrono::Utc;
use uuid::Uuid;

use super::UseCases;
use super::decisions::{Decider, DecisionRequest, already_decided};
use crate::model::{
    RaiseBy, RaiseRequest, ResumeDecision, Suspension, SuspensionStatus, TenantRaise, TenantSpend,
    add_usd,
};
use crate::problem::Refusal;
use crate::store::{Resolution, ResolvedSuspension, StoreError};

/// Suspensions on a tenant's day read per page when a raise resumes them.
const PAGE: u32 = 200;

/// The most suspended runs one raise resumes (the next raise, or the operator's approval of
/// each, resumes the rest).
const MAX_RESUMED: usize = 10_000;

/// What a raise of a tenant's day did.
#[derive(Debug, Clone)]
pub struct TenantRaised {
    /// The raise, as stored.
    pub raise: TenantRaise,
    /// The runs it resumed (their suspensions on the tenant's day, resolved as approved).
    pub resumed: Vec<ResolvedSuspension>,
    /// The tenant's day after it.
    pub spend: TenantSpend,
}

impl UseCases {
    /// Whether `tenant` is one this service serves: a tenant of `PES_API_KEYS`, or the default
    /// tenant when there are no keys.
    fn known_tenant(&self, tenant: &str) -> bool {
        let keys = self.config.parsed_api_keys();
        if keys.is_empty() {
            tenant == crate::model::DEFAULT_TENANT
        } else {
            keys.iter().any(|(_, t)| t == tenant)
        }
    }

    fn tenant_not_found(tenant: &str) -> Refusal {
        Refusal::NotFound {
            code: "tenant_not_found",
            detail: format!(
                "no tenant `{}`: a tenant is one that PES_API_KEYS names (`default` when the \
                 service has no keys)",
                crate::text::truncate(tenant, 128)
            ),
        }
    }

    /// `tenant`'s day: its spend since UTC midnight, its daily budget, the raises, the limits in
    /// force.
    ///
    /// # Errors
    /// 404 `tenant_not_found` for a tenant the service does not serve; the store failed.
    pub async fn tenant_spend(&self, tenant: &str) -> Result<TenantSpend, Refusal> {
        if !self.known_tenant(tenant) {
            return Err(Self::tenant_not_found(tenant));
        }
        let now = Utc::now();
        let since = crate::model::utc_midnight(now);
        let day = self.store.tenant_day(tenant, since).await?;
        let raises = self.store.tenant_raises(tenant, since).await?;
        let entry = self.engine.tenant_budgets().entry_of(tenant);
        let budget = entry.map(|(_, b)| b.clone());
        Ok(TenantSpend {
            tenant: tenant.to_owned(),
            day: now.date_naive(),
            spent_tokens: day.spent_tokens,
            spent_usd: day.spent_usd,
            limit_tokens: budget
                .as_ref()
                .and_then(|b| b.max_tokens)
                .map(|l| l.saturating_add(day.raised_tokens)),
            limit_usd: budget
                .as_ref()
                .and_then(|b| b.max_cost_usd)
                .map(|l| add_usd(l, day.raised_usd)),
            budget,
            budget_entry: entry.map(|(name, _)| name.to_owned()),
            raises,
            raised_tokens: day.raised_tokens,
            raised_usd: day.raised_usd,
        })
    }

    /// Raise `tenant`'s daily limits by `raise` for the rest of the UTC day, and let its runs
    /// stopped on its day go on.
    ///
    /// # Errors
    /// 404 `tenant_not_found`; 422 `invalid_raise` for a raise that is missing, not finite or
    /// past `PES_MAX_BUDGET_RAISE_*`; the store failed.
    pub async fn raise_tenant_budget(
        &self,
        tenant: &str,
        raise: &RaiseRequest,
    ) -> Result<TenantRaised, Refusal> {
        if !self.known_tenant(tenant) {
            return Err(Self::tenant_not_found(tenant));
        }
        let raise = raise.check("", self.raise_limits())?;
        let made = self.store.add_tenant_raise(tenant, raise).await?;
        let resumed = self.resume_tenant_day(tenant, raise, None).await?;
        let spend = self.tenant_spend(tenant).await?;
        Ok(TenantRaised {
            raise: made,
            resumed,
            spend,
        })
    }

    /// The operator's decision on a suspension on a tenant's day, whatever the tenant: `approve`
    /// with `raiseBy` raises the tenant's day (in the transaction that resolves the suspension)
    /// and lets every run stopped on it go on; `reject` fails the run, as a tenant's would.
    ///
    /// # Errors
    /// 404 `suspension_not_found`; 409 when it is no longer pending; 422 `not_on_tenant_budget`
    /// for any other suspension (its tenant decides it), `invalid_raise`, or another refusal of
    /// [`UseCases::decide_as`]; the store failed.
    pub async fn operator_resume(
        &self,
        suspension_id: Uuid,
        body: DecisionRequest,
        trace_context: Option<String>,
    ) -> Result<ResolvedSuspension, Refusal> {
        let s = self
            .store
            .find_suspension(suspension_id)
            .await?
            .ok_or_else(Refusal::suspension_not_found)?;
        if s.status != SuspensionStatus::Pending {
            return Err(already_decided(Some(&s)));
        }
        if !s.on_tenant_budget() {
            return Err(Refusal::Unprocessable {
                code: "not_on_tenant_budget",
                detail: format!(
                    "this route decides suspensions on a tenant's daily budget; this one is a \
                     `{}` suspension{} of the tenant's own: the tenant decides it (`POST \
                     /v1/suspensions/{suspension_id}/resume`)",
                    s.kind,
                    if s.budget_scope().is_some() {
                        " on its run's budget"
                    } else {
                        ""
                    }
                ),
            });
        }
        let decision = self.decide_as(Decider::Operator, &s, body)?;
        let raise = match &decision {
            ResumeDecision::Approve {
                raise_by: Some(r), ..
            } => Some(*r),
            _ => None,
        };
        let resolution = Resolution {
            status: SuspensionStatus::Resolved,
            decision,
            trace_context,
        };
        let done = match raise {
            Some(r) => {
                self.commands
                    .resume_raising(&s.tenant, suspension_id, resolution, r)
                    .await
            }
            None => {
                self.commands
                    .resume(&s.tenant, suspension_id, resolution)
                    .await
            }
        };
        let done = match done {
            Ok(done) => done,
            Err(StoreError::Conflict(_)) => {
                let now = self.store.find_suspension(suspension_id).await?;
                return Err(already_decided(now.as_ref()));
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(r) = raise {
            // The day is raised for every run of the tenant: those stopped on it go on too.
            self.resume_tenant_day(&s.tenant, r, Some(suspension_id))
                .await?;
        }
        Ok(done)
    }

    /// Resolve as approved every pending suspension on `tenant`'s day (but `except`), each
    /// exactly once: its run goes on under the raised day. A run that ended meanwhile, or a
    /// suspension decided meanwhile, is passed over.
    async fn resume_tenant_day(
        &self,
        tenant: &str,
        raise: RaiseBy,
        except: Option<Uuid>,
    ) -> Result<Vec<ResolvedSuspension>, Refusal> {
        let mut resumed = Vec::new();
        let mut after = None;
        let mut seen = 0usize;
        loop {
            let page = self
                .store
                .pending_tenant_budget_suspensions(tenant, after, PAGE)
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            after = Some(last.suspension_id);
            let full = page.len() == PAGE as usize;
            for s in page.iter().filter(|s| is_on_day(s, except)) {
                seen += 1;
                if seen > MAX_RESUMED {
                    return Ok(resumed);
                }
                let resolution = Resolution {
                    status: SuspensionStatus::Resolved,
                    decision: ResumeDecision::Approve {
                        reason: Some("the operator raised the tenant's daily budget".into()),
                        raise_by: Some(raise),
                    },
                    trace_context: None,
                };
                match self
                    .commands
                    .resume(tenant, s.suspension_id, resolution)
                    .await
                {
                    Ok(done) => resumed.push(done),
                    Err(StoreError::Conflict(_) | StoreError::SuspensionNotFound) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if !full {
                break;
            }
        }
        Ok(resumed)
    }
}

/// Whether `s` waits on its tenant's day and is not `except`.
fn is_on_day(s: &Suspension, except: Option<Uuid>) -> bool {
    s.on_tenant_budget() && Some(s.suspension_id) != except
}
