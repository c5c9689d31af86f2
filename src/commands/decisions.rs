//! A person's decision on a suspension: which decisions its kind allows and what each needs
//! (edited arguments valid for the tool, a response valid for the question's schema, a raise
//! within `PES_MAX_BUDGET_RAISE_*`), and who may take it (a tenant may reject a suspension on its
//! daily budget, never approve it: that is the operator's), checked the same way whichever door it
//! came through; then carried out exactly once ([`UseCases::resume`]): one implementation for
//! REST, AG-UI, A2A, the MCP server and the operator's routes.

use serde_json::Value;
use uuid::Uuid;

use super::UseCases;
use crate::model::{
    Decision, RaiseBy, RaiseLimits, RaiseRequest, ResumeDecision, Run, Suspension, SuspensionKind,
    SuspensionStatus, ThreadId,
};
use crate::problem::Refusal;
use crate::store::{Resolution, ResolvedSuspension, StoreError, StoreResult};

/// Who decides: a tenant (through any door, with its API key) or the operator (`/v1/admin/*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decider {
    /// A tenant, on its own suspensions.
    Tenant,
    /// The operator, above every tenant.
    Operator,
}

/// A decision as a door received it, before it is checked against its suspension.
#[derive(Debug, Clone)]
pub struct DecisionRequest {
    pub decision: Decision,
    /// Why (given to the model on `reject`); at most 4,000 characters.
    pub reason: Option<String>,
    /// The arguments to run the call with (`edit`).
    pub modified_args: Option<Value>,
    /// The call's result (`respond`).
    pub response: Option<Value>,
    /// What `approve` adds to the budget (`budget` suspensions only, where it is needed), as
    /// the request gave it: its numbers are checked here.
    pub raise_by: Option<RaiseRequest>,
}

/// 409 for a suspension that is no longer pending, saying how and when it was resolved, so the
/// person who came second knows what happened.
pub fn already_decided(s: Option<&Suspension>) -> Refusal {
    let status = s.map(|s| s.status).unwrap_or(SuspensionStatus::Resolved);
    let how = s
        .and_then(|s| s.decision.as_ref().map(|d| (d, s.resolved_at)))
        .map(|(d, at)| {
            let at = at
                .map(|t| format!(" at {}", t.to_rfc3339()))
                .unwrap_or_default();
            let reason = d
                .reason()
                .map(|r| format!(" (reason: {r})"))
                .unwrap_or_default();
            format!(": decided `{}`{at}{reason}", d.kind())
        })
        .unwrap_or_default();
    Refusal::Conflict {
        code: "suspension_resolved",
        detail: format!("the suspension is already {status}{how}"),
    }
}

impl UseCases {
    /// Check a tenant's resume request against its suspension and build the decision it stands
    /// for (see [`UseCases::decide_as`]).
    ///
    /// # Errors
    /// As [`UseCases::decide_as`].
    pub fn decide(&self, s: &Suspension, body: DecisionRequest) -> Result<ResumeDecision, Refusal> {
        self.decide_as(Decider::Tenant, s, body)
    }

    /// The most one decision may raise a budget by (`PES_MAX_BUDGET_RAISE_*`).
    pub fn raise_limits(&self) -> RaiseLimits {
        RaiseLimits {
            max_tokens: self.config.max_budget_raise_tokens,
            max_usd: self.config.max_budget_raise_usd,
        }
    }

    /// Check a resume request of `who` against its suspension and build the decision it stands
    /// for: the one place a request's loose fields become a [`ResumeDecision`].
    ///
    /// # Errors
    /// 422 `decision_not_allowed` for a decision the suspension does not take, `invalid_raise`
    /// for a raise that is missing, not finite or past its bound, `validation_failed` for other
    /// fields; 403 `operator_only` for a tenant's `approve` of a suspension on its daily budget.
    pub fn decide_as(
        &self,
        who: Decider,
        s: &Suspension,
        body: DecisionRequest,
    ) -> Result<ResumeDecision, Refusal> {
        let state = self;
        if who == Decider::Tenant && s.on_tenant_budget() && body.decision == Decision::Approve {
            return Err(Refusal::operator_only(format!(
                "only the operator may raise the tenant's daily budget: the operator approves \
                 it (`POST /v1/admin/suspensions/{}/resume`, or `POST \
                 /v1/admin/tenants/{}/budget-raises`, with an operator key); the tenant may \
                 reject it to fail the run",
                s.suspension_id, s.tenant
            )));
        }
        if !s.allowed_decisions.contains(&body.decision) {
            let allowed: Vec<&str> = s.allowed_decisions.iter().map(|d| d.as_str()).collect();
            return Err(Refusal::Unprocessable {
                code: "decision_not_allowed",
                detail: format!(
                    "decision `{}` is not allowed for this {} suspension (allowed: {})",
                    body.decision,
                    s.kind,
                    allowed.join(", ")
                ),
            });
        }
        if body
            .reason
            .as_ref()
            .is_some_and(|r| r.chars().count() > 4000)
        {
            return Err(Refusal::Validation(
                "reason is longer than 4000 characters".into(),
            ));
        }
        if body.modified_args.is_some() && body.decision != Decision::Edit {
            return Err(Refusal::Validation(format!(
                "modifiedArgs goes only with decision `edit` (not `{}`): use `edit` to run the call with other arguments",
                body.decision
            )));
        }
        if body.response.is_some() && body.decision != Decision::Respond {
            return Err(Refusal::Validation(format!(
                "response goes only with decision `respond` (not `{}`)",
                body.decision
            )));
        }
        let raise_by = check_raise(s, &body, self.raise_limits())?;
        let reason = body.reason;
        Ok(match body.decision {
            Decision::Edit => {
                let args = body.modified_args.ok_or_else(|| {
                    Refusal::Validation("decision `edit` needs `modifiedArgs`".into())
                })?;
                state
                    .engine
                    .tools()
                    .validate(&s.tool_call.name, &args)
                    .map_err(|e| {
                        Refusal::Validation(format!(
                            "modifiedArgs do not fit `{}`: {e}",
                            s.tool_call.name
                        ))
                    })?;
                ResumeDecision::Edit { args, reason }
            }
            Decision::Respond => {
                let response = body.response.ok_or_else(|| {
                    Refusal::Validation("decision `respond` needs `response`".into())
                })?;
                if let Some(schema) = &s.input_schema {
                    crate::json::schema::validate(schema, &response).map_err(|errors| {
                        Refusal::Validation(format!(
                            "response does not fit the inputSchema: {}",
                            errors.join("; ")
                        ))
                    })?;
                }
                ResumeDecision::Respond { reason, response }
            }
            Decision::Approve => ResumeDecision::Approve { reason, raise_by },
            Decision::Reject => ResumeDecision::Reject { reason },
        })
    }
}

/// `raiseBy`: only with `approve` on a `budget` suspension, where it is required, with a whole
/// number of tokens or a finite number of dollars within `limits` (422 `invalid_raise`).
fn check_raise(
    s: &Suspension,
    body: &DecisionRequest,
    limits: RaiseLimits,
) -> Result<Option<RaiseBy>, Refusal> {
    let budget = s.kind == SuspensionKind::Budget;
    let Some(raise) = &body.raise_by else {
        if budget && body.decision == Decision::Approve {
            return Err(Refusal::Unprocessable {
                code: "invalid_raise",
                detail: "decision `approve` on a budget suspension needs `raiseBy` ({tokens?, \
                         usd?}): how much more may be spent"
                    .into(),
            });
        }
        return Ok(None);
    };
    if !budget || body.decision != Decision::Approve {
        return Err(Refusal::Validation(
            "raiseBy goes only with decision `approve` on a budget suspension".into(),
        ));
    }
    Ok(Some(raise.check("raiseBy", limits)?))
}

impl UseCases {
    /// A suspension of the tenant's that still waits for a decision.
    ///
    /// # Errors
    /// 404 for no such suspension, 409 `suspension_resolved` (saying how) for one decided,
    /// expired or cancelled.
    pub async fn pending_suspension(
        &self,
        tenant: &str,
        suspension_id: Uuid,
    ) -> Result<Suspension, Refusal> {
        let s = self
            .store
            .get_suspension(tenant, suspension_id)
            .await?
            .ok_or_else(Refusal::suspension_not_found)?;
        if s.status != SuspensionStatus::Pending {
            return Err(already_decided(Some(&s)));
        }
        Ok(s)
    }

    /// Carry out a decision checked by [`UseCases::decide_as`]: exactly once, whatever door it
    /// came through. One of any number of concurrent decisions goes through; the others get 409
    /// saying how the suspension was resolved (read again after the conflict).
    ///
    /// # Errors
    /// 409 `suspension_resolved`; the store fails.
    pub async fn carry_out(
        &self,
        tenant: &str,
        suspension_id: Uuid,
        decision: ResumeDecision,
        trace_context: Option<String>,
    ) -> Result<ResolvedSuspension, Refusal> {
        let resolution = Resolution {
            status: SuspensionStatus::Resolved,
            decision,
            trace_context,
        };
        match self
            .commands
            .resume(tenant, suspension_id, resolution)
            .await
        {
            Ok(done) => Ok(done),
            Err(StoreError::Conflict(_)) => {
                let now = self.store.get_suspension(tenant, suspension_id).await?;
                Err(already_decided(now.as_ref()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Resume a suspension with a person's decision: read it (pending), check the decision
    /// against it as `who` may take it, and carry it out exactly once.
    ///
    /// # Errors
    /// As [`UseCases::pending_suspension`], [`UseCases::decide_as`] and [`UseCases::carry_out`].
    pub async fn resume(
        &self,
        who: Decider,
        tenant: &str,
        suspension_id: Uuid,
        request: DecisionRequest,
        trace_context: Option<String>,
    ) -> Result<ResolvedSuspension, Refusal> {
        let s = self.pending_suspension(tenant, suspension_id).await?;
        let decision = self.decide_as(who, &s, request)?;
        self.carry_out(tenant, suspension_id, decision, trace_context)
            .await
    }

    /// A suspension of the tenant's, whatever its status.
    ///
    /// # Errors
    /// The store fails.
    pub async fn get_suspension(
        &self,
        tenant: &str,
        suspension_id: Uuid,
    ) -> StoreResult<Option<Suspension>> {
        self.store.get_suspension(tenant, suspension_id).await
    }

    /// A thread's suspensions, oldest first: pending ones, or all with `include_resolved`.
    ///
    /// # Errors
    /// The store fails.
    pub async fn list_suspensions(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        include_resolved: bool,
    ) -> StoreResult<Option<Vec<Suspension>>> {
        self.store
            .list_suspensions(tenant, thread_id, include_resolved)
            .await
    }

    /// The pending suspensions of one run.
    ///
    /// # Errors
    /// The store fails.
    pub async fn pending_of_run(&self, run: &Run) -> StoreResult<Vec<Suspension>> {
        Ok(self
            .store
            .list_suspensions(&run.tenant, &run.thread_id, false)
            .await?
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s.run_id == run.run_id && s.status == SuspensionStatus::Pending)
            .collect())
    }
}
