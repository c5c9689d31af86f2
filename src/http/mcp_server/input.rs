//! The 2026-07-28 input-required round trip (SEP-2322) for a run that needs a person: instead of
//! a result naming the suspensions, a client that negotiated that revision and can elicit gets an
//! `InputRequiredResult` with one elicitation per pending suspension (keyed by its id), asks its
//! user, and calls the same tool again with the answers and the echoed `requestState`. The answers
//! are decisions, checked and carried out like any other ([`crate::commands::UseCases::decide`],
//! [`crate::commands::RunCommands::resume`]); the call then waits for the run again.
//!
//! `requestState` is only a handle (`{"threadId", "runId"}`): it is read within the caller's
//! tenant, so a forged one can only name a run the caller may decide on anyway.

use std::collections::BTreeMap;

use rmcp::model::{ElicitationAction, InputRequest, InputRequiredResult, ProtocolVersion};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::commands::DecisionRequest;
use crate::model::{Decision, Suspension, SuspensionKind};

/// What `requestState` holds.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    pub thread_id: String,
    pub run_id: uuid::Uuid,
}

/// Whether the caller takes the round trip: it negotiated 2026-07-28 or later and can elicit.
pub fn supported(ctx: &RequestContext<RoleServer>) -> bool {
    let modern = ctx
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
    modern
        && ctx
            .client_capabilities()
            .is_some_and(|c| c.elicitation.is_some())
}

/// A flat object schema of strings, numbers and booleans (what a form elicitation can ask), or
/// `None`.
fn flat(schema: &Value) -> Option<Value> {
    let props = schema.get("properties")?.as_object()?;
    let primitive = props.values().all(|p| {
        matches!(
            p.get("type").and_then(Value::as_str),
            Some("string" | "number" | "integer" | "boolean")
        )
    });
    (schema.get("type") == Some(&json!("object")) && primitive).then(|| schema.clone())
}

/// The form that asks a person for `s`'s decision.
fn form(s: &Suspension) -> (String, Value) {
    match s.kind {
        SuspensionKind::Approval => {
            let allowed: Vec<&str> = s.allowed_decisions.iter().map(|d| d.as_str()).collect();
            (
                s.asks(),
                json!({
                    "type": "object",
                    "properties": {
                        "decision": {"type": "string", "enum": allowed, "description": "approve, edit (with modifiedArgs), reject, or respond (with response)"},
                        "reason": {"type": "string"},
                        "modifiedArgs": {"type": "string", "description": "edit: the arguments, as JSON"},
                        "response": {"type": "string", "description": "respond: the call's result"}
                    },
                    "required": ["decision"]
                }),
            )
        }
        SuspensionKind::Budget => (
            s.asks(),
            json!({
                "type": "object",
                "properties": {
                    "decision": {"type": "string", "enum": s.tenant_decisions(), "description": "approve (with a raise) or reject (the run fails budget_exceeded); only the operator may approve a raise of the tenant's daily budget"},
                    "raiseTokens": {"type": "integer", "minimum": 1, "description": "approve: tokens to add"},
                    "raiseUsd": {"type": "number", "minimum": 0, "description": "approve: US dollars to add"},
                    "reason": {"type": "string"}
                },
                "required": ["decision"]
            }),
        ),
        SuspensionKind::Input | SuspensionKind::RemoteInput => {
            let question = s.asks();
            let schema = s.input_schema.as_ref().and_then(flat).unwrap_or_else(|| {
                json!({
                    "type": "object",
                    "properties": {"answer": {"type": "string", "description": question}},
                    "required": ["answer"]
                })
            });
            (question, schema)
        }
    }
}

/// The input-required result asking for every pending suspension of the run `state` names.
///
/// # Errors
/// A suspension whose form the SDK refuses (never for the forms made here).
pub fn ask_for(pending: &[Suspension], state: &Value) -> Result<InputRequiredResult, McpError> {
    let mut requests = BTreeMap::new();
    for s in pending {
        let (message, schema) = form(s);
        let request: InputRequest = serde_json::from_value(json!({
            "method": "elicitation/create",
            "params": {"mode": "form", "message": message, "requestedSchema": schema},
        }))
        .map_err(|e| McpError::internal_error(format!("an elicitation: {e}"), None))?;
        requests.insert(s.suspension_id.to_string(), request);
    }
    Ok(InputRequiredResult::new(
        Some(requests),
        Some(state.to_string()),
    ))
}

/// A string that holds JSON, as that JSON; any other string as itself.
fn loose_json(v: &Value) -> Value {
    match v {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| v.clone()),
        other => other.clone(),
    }
}

/// What a person's answer to `s`'s elicitation decides: `None` when they cancelled (nothing is
/// decided; the suspension stays pending).
///
/// # Errors
/// An answer that is not an elicitation result, or names no decision.
pub fn decision(s: &Suspension, answer: &Value) -> Result<Option<DecisionRequest>, McpError> {
    let bad = |why: &str| {
        McpError::invalid_params(
            format!("the answer for suspension {}: {why}", s.suspension_id),
            None,
        )
    };
    let action: ElicitationAction = serde_json::from_value(answer["action"].clone())
        .map_err(|_| bad("`action` must be accept, decline or cancel"))?;
    let content = answer.get("content").cloned().unwrap_or(Value::Null);
    let reason = content
        .get("reason")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(match action {
        ElicitationAction::Cancel => None,
        ElicitationAction::Decline => Some(DecisionRequest {
            raise_by: None,
            decision: Decision::Reject,
            reason: reason.or_else(|| Some("the person declined".into())),
            modified_args: None,
            response: None,
        }),
        ElicitationAction::Accept => Some(match s.kind {
            SuspensionKind::Budget => {
                let decision: Decision = content
                    .get("decision")
                    .and_then(Value::as_str)
                    .and_then(|d| d.parse().ok())
                    .ok_or_else(|| bad("`decision` must be approve or reject"))?;
                // The numbers as given: the use case refuses what is not a raise it takes.
                let tokens = content.get("raiseTokens").cloned();
                let usd = content.get("raiseUsd").cloned();
                DecisionRequest {
                    raise_by: (decision == Decision::Approve)
                        .then(|| crate::model::RaiseRequest::of(tokens, usd)),
                    decision,
                    reason,
                    modified_args: None,
                    response: None,
                }
            }
            SuspensionKind::Approval => {
                let decision: Decision = content
                    .get("decision")
                    .and_then(Value::as_str)
                    .and_then(|d| d.parse().ok())
                    .ok_or_else(|| bad("`decision` must be one the suspension allows"))?;
                DecisionRequest {
                    raise_by: None,
                    decision,
                    reason,
                    modified_args: content
                        .get("modifiedArgs")
                        .filter(|_| decision == Decision::Edit)
                        .map(loose_json),
                    response: content
                        .get("response")
                        .filter(|_| decision == Decision::Respond)
                        .map(loose_json),
                }
            }
            SuspensionKind::Input | SuspensionKind::RemoteInput => {
                let used_schema = s.input_schema.as_ref().and_then(flat).is_some();
                let response = if used_schema {
                    content
                } else {
                    let answer = content.get("answer").cloned().unwrap_or(Value::Null);
                    if s.input_schema.is_some() {
                        loose_json(&answer)
                    } else {
                        answer
                    }
                };
                DecisionRequest {
                    raise_by: None,
                    decision: Decision::Respond,
                    reason: None,
                    modified_args: None,
                    response: Some(response),
                }
            }
        }),
        _ => return Err(bad("`action` must be accept, decline or cancel")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ItemId, SuspensionStatus, ThreadId, ToolCallRecord};

    fn suspension(kind: SuspensionKind, input_schema: Option<Value>) -> Suspension {
        Suspension {
            suspension_id: uuid::Uuid::now_v7(),
            thread_id: ThreadId::parse("t").unwrap(),
            tenant: "default".into(),
            run_id: uuid::Uuid::now_v7(),
            item_id: ItemId::parse("a").unwrap(),
            kind,
            tool_call: ToolCallRecord {
                id: "c".into(),
                name: "calculator".into(),
                arguments: json!({"expression": "1+1"}),
            },
            allowed_decisions: Decision::ALL.to_vec(),
            question: Some("Which city?".into()),
            input_schema,
            iteration_state: json!({}),
            partial_tool_results: vec![],
            status: SuspensionStatus::Pending,
            decision: None,
            created_at: chrono::Utc::now(),
            resolved_at: None,
            expires_at: None,
        }
    }

    #[test]
    fn form_answers_become_decisions() {
        let approval = suspension(SuspensionKind::Approval, None);
        let (message, schema) = form(&approval);
        assert!(message.contains("calculator"));
        assert_eq!(schema["required"], json!(["decision"]));
        let edit = decision(
            &approval,
            &json!({"action": "accept", "content": {"decision": "edit", "modifiedArgs": "{\"expression\": \"2+2\"}"}}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(edit.decision, Decision::Edit);
        assert_eq!(edit.modified_args, Some(json!({"expression": "2+2"})));
        let declined = decision(&approval, &json!({"action": "decline"}))
            .unwrap()
            .unwrap();
        assert_eq!(declined.decision, Decision::Reject);
        assert!(
            decision(&approval, &json!({"action": "cancel"}))
                .unwrap()
                .is_none()
        );
        assert!(decision(&approval, &json!({"action": "maybe"})).is_err());
        assert!(decision(&approval, &json!({"action": "accept", "content": {}})).is_err());

        // A question with a flat schema is asked with it, and answered with the form's content.
        let flat = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let q = suspension(SuspensionKind::Input, Some(flat.clone()));
        assert_eq!(form(&q).1, flat);
        let answer = decision(
            &q,
            &json!({"action": "accept", "content": {"city": "Oslo"}}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(answer.response, Some(json!({"city": "Oslo"})));
        // One without a schema (or with a nested one) is asked for an `answer`.
        let q = suspension(SuspensionKind::Input, None);
        assert_eq!(form(&q).1["required"], json!(["answer"]));
        let answer = decision(
            &q,
            &json!({"action": "accept", "content": {"answer": "Oslo"}}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(answer.response, Some(json!("Oslo")));
        let nested = json!({"type": "object", "properties": {"where": {"type": "object"}}});
        let q = suspension(SuspensionKind::Input, Some(nested));
        let answer = decision(
            &q,
            &json!({"action": "accept", "content": {"answer": "{\"where\": {\"city\": \"Oslo\"}}"}}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(answer.response, Some(json!({"where": {"city": "Oslo"}})));
    }

    #[test]
    fn the_forms_are_elicitations_the_sdk_takes() {
        let pending = [
            suspension(SuspensionKind::Approval, None),
            suspension(SuspensionKind::Input, None),
        ];
        let result = ask_for(
            &pending,
            &json!({"threadId": "t", "runId": uuid::Uuid::nil()}),
        )
        .unwrap();
        let wire = serde_json::to_value(&result).unwrap();
        assert_eq!(wire["resultType"], "input_required");
        let requests = wire["inputRequests"].as_object().unwrap();
        assert_eq!(requests.len(), 2);
        for r in requests.values() {
            assert_eq!(r["method"], "elicitation/create");
            assert_eq!(r["params"]["mode"], "form");
        }
        let state: State = serde_json::from_str(wire["requestState"].as_str().unwrap()).unwrap();
        assert_eq!(state.thread_id, "t");
    }
}
