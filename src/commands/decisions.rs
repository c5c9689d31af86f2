//! A person's decision on a suspension: which decisions its kind allows and what each needs
//! (edited arguments valid for the tool, a response valid for the question's schema, a raise
//! within `PES_MAX_BUDGET_RAISE_*`), and who may take it (a tenant may reject a suspension on its
//! daily budget, never approve it: that is the operator's), checked the same way whichever door it
//! came through.

use serde_json::Value;

use super::UseCases;
use crate::model::{
    Decision, RaiseBy, RaiseLimits, RaiseRequest, ResumeDecision, Suspension, SuspensionKind,
    SuspensionStatus,
};
use crate::problem::ApiError;

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
pub fn already_decided(s: Option<&Suspension>) -> ApiError {
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
    ApiError::Conflict {
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
    pub fn decide(
        &self,
        s: &Suspension,
        body: DecisionRequest,
    ) -> Result<ResumeDecision, ApiError> {
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
    ) -> Result<ResumeDecision, ApiError> {
        let state = self;
        if who == Decider::Tenant && s.on_tenant_budget() && body.decision == Decision::Approve {
            return Err(ApiError::operator_only(format!(
                "only the operator may raise the tenant's daily budget: the operator approves \
                 it (`POST /v1/admin/suspensions/{}/resume`, or `POST \
                 /v1/admin/tenants/{}/budget-raises`, with an operator key); the tenant may \
                 reject it to fail the run",
                s.suspension_id, s.tenant
            )));
        }
        if !s.allowed_decisions.contains(&body.decision) {
            let allowed: Vec<&str> = s.allowed_decisions.iter().map(|d| d.as_str()).collect();
            return Err(ApiError::Unprocessable {
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
            return Err(ApiError::Validation(
                "reason is longer than 4000 characters".into(),
            ));
        }
        if body.modified_args.is_some() && body.decision != Decision::Edit {
            return Err(ApiError::Validation(format!(
                "modifiedArgs goes only with decision `edit` (not `{}`): use `edit` to run the call with other arguments",
                body.decision
            )));
        }
        if body.response.is_some() && body.decision != Decision::Respond {
            return Err(ApiError::Validation(format!(
                "response goes only with decision `respond` (not `{}`)",
                body.decision
            )));
        }
        let raise_by = check_raise(s, &body, self.raise_limits())?;
        let reason = body.reason;
        Ok(match body.decision {
            Decision::Edit => {
                let args = body.modified_args.ok_or_else(|| {
                    ApiError::Validation("decision `edit` needs `modifiedArgs`".into())
                })?;
                state
                    .engine
                    .tools()
                    .validate(&s.tool_call.name, &args)
                    .map_err(|e| {
                        ApiError::Validation(format!(
                            "modifiedArgs do not fit `{}`: {e}",
                            s.tool_call.name
                        ))
                    })?;
                ResumeDecision::Edit { args, reason }
            }
            Decision::Respond => {
                let response = body.response.ok_or_else(|| {
                    ApiError::Validation("decision `respond` needs `response`".into())
                })?;
                if let Some(schema) = &s.input_schema {
                    crate::json::schema::validate(schema, &response).map_err(|errors| {
                        ApiError::Validation(format!(
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
) -> Result<Option<RaiseBy>, ApiError> {
    let budget = s.kind == SuspensionKind::Budget;
    let Some(raise) = &body.raise_by else {
        if budget && body.decision == Decision::Approve {
            return Err(ApiError::Unprocessable {
                code: "invalid_raise",
                detail: "decision `approve` on a budget suspension needs `raiseBy` ({tokens?, \
                         usd?}): how much more may be spent"
                    .into(),
            });
        }
        return Ok(None);
    };
    if !budget || body.decision != Decision::Approve {
        return Err(ApiError::Validation(
            "raiseBy goes only with decision `approve` on a budget suspension".into(),
        ));
    }
    Ok(Some(raise.check("raiseBy", limits)?))
}
