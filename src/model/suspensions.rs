//! Suspensions: pauses for a person, the decisions they allow, and how one was decided.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::*;

string_enum! {
    /// What a suspension asks of a person.
    SuspensionKind {
        /// Approve (or edit, reject, answer instead of) a tool call before it runs.
        Approval => "approval",
        /// Answer a question (`ask_user`).
        Input => "input",
        /// Answer a remote agent's question (its task is `input-required`); the answer is
        /// forwarded to it.
        RemoteInput => "remote_input",
        /// The run's next model call would pass its budget: approve with `raiseBy` to go on, or
        /// reject to fail the run `budget_exceeded`.
        Budget => "budget",
    }
}

impl SuspensionKind {
    /// The decisions a person may take on a suspension of this kind.
    pub fn decisions(self) -> Vec<Decision> {
        match self {
            Self::Input | Self::RemoteInput => vec![Decision::Respond, Decision::Reject],
            Self::Budget => vec![Decision::Approve, Decision::Reject],
            Self::Approval => vec![
                Decision::Approve,
                Decision::Edit,
                Decision::Reject,
                Decision::Respond,
            ],
        }
    }

    /// The question a suspension of this kind on `call` is made with (its `question`, which the
    /// console and `pes-server ask` show above the proposed call): an approval asks about the
    /// call by name, a question (`ask_user`, a remote agent's) is the call's own `question`. A
    /// `budget` suspension's question says which budget and how much of it was spent, so its
    /// maker writes it (`None` here).
    pub fn question(self, call: &ToolCallRecord) -> Option<String> {
        match self {
            Self::Input | Self::RemoteInput => call
                .arguments
                .get("question")
                .and_then(Value::as_str)
                .map(str::to_owned),
            Self::Budget => None,
            Self::Approval => Some(format!(
                "May the agent call `{}` with these arguments?",
                call.name
            )),
        }
    }
}

string_enum! {
    /// Lifecycle of a suspension; `pending` → one of the others, exactly once.
    SuspensionStatus {
        Pending => "pending",
        Resolved => "resolved",
        Expired => "expired",
        Cancelled => "cancelled",
    }
}

string_enum! {
    /// A person's answer to a suspension.
    Decision {
        Approve => "approve",
        Reject => "reject",
        Edit => "edit",
        Respond => "respond",
    }
}

/// A person's decision on a suspension, as it was given: `decision` says which, with
/// `modifiedArgs` (`edit`), `response` (`respond`) and an optional `reason` (any decision; shown in
/// `AGENT_RESUMED`, given to the model on `reject`). An expired suspension holds a `reject` with
/// reason `expired`.
// Built once at the HTTP edge from a validated resume request, stored with the suspension and
// read back with serde: nothing re-parses it by hand. The JSON is the shape stored before this
// type existed (`{"decision", "modifiedArgs"?, "reason"?, "response"?}`, keys in that order), so
// old rows read and write back byte for byte (see the test below).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "decision", rename_all = "lowercase")]
pub enum ResumeDecision {
    /// Run the call as the model proposed it (a `budget` suspension: go on, with the budget
    /// raised by `raiseBy`).
    Approve {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(rename = "raiseBy", default, skip_serializing_if = "Option::is_none")]
        raise_by: Option<RaiseBy>,
    },
    /// Run the call with these arguments instead (valid for the tool's schema).
    Edit {
        #[serde(rename = "modifiedArgs")]
        args: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Do not run the call; the model is told why.
    Reject {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Do not run the call; `response` is its result.
    Respond {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        response: Value,
    },
}

impl ResumeDecision {
    /// Which of the four decisions this is.
    pub fn kind(&self) -> Decision {
        match self {
            Self::Approve { .. } => Decision::Approve,
            Self::Edit { .. } => Decision::Edit,
            Self::Reject { .. } => Decision::Reject,
            Self::Respond { .. } => Decision::Respond,
        }
    }

    /// The reason given with the decision, if any.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Approve { reason, .. }
            | Self::Edit { reason, .. }
            | Self::Reject { reason }
            | Self::Respond { reason, .. } => reason.as_deref(),
        }
    }
}

/// A pause for a person: a tool call waiting for approval, or a question waiting for an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Suspension {
    pub suspension_id: Uuid,
    pub thread_id: ThreadId,
    #[serde(skip)]
    pub tenant: String,
    pub run_id: Uuid,
    pub item_id: ItemId,
    pub kind: SuspensionKind,
    pub tool_call: ToolCallRecord,
    pub allowed_decisions: Vec<Decision>,
    #[serde(default)]
    pub question: Option<String>,
    #[serde(default)]
    pub input_schema: Option<Value>,
    /// The item's conversation up to the call.
    pub iteration_state: Value,
    /// Results of other calls of the same model turn that already ran.
    pub partial_tool_results: Vec<ToolResultRecord>,
    pub status: SuspensionStatus,
    /// How it was resolved, beside the other fields: `decision` (`approve`, `edit`, `reject`,
    /// `respond`) with its `reason`, `modifiedArgs` and `response`. Absent while pending.
    #[serde(flatten, with = "resolution")]
    #[schema(schema_with = resolution::schema)]
    pub decision: Option<ResumeDecision>,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub resolved_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
}

impl Suspension {
    /// Whose budget a `budget` suspension waits on (`None` for other kinds): the scope its
    /// call's arguments name (the run's when they name none).
    pub fn budget_scope(&self) -> Option<payloads::BudgetScope> {
        (self.kind == SuspensionKind::Budget).then(|| {
            self.tool_call
                .arguments
                .get("scope")
                .cloned()
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default()
        })
    }

    /// What a person is asked, in one sentence that stands alone (a door that shows only text
    /// beside the answer's form: an AG-UI interrupt's `message`, an MCP elicitation's): an
    /// approval names the call with its arguments; a budget or a question is its `question`, or
    /// a plain request when it has none.
    pub fn asks(&self) -> String {
        match self.kind {
            SuspensionKind::Approval => format!(
                "Approve the call of `{}` with {}?",
                self.tool_call.name, self.tool_call.arguments
            ),
            SuspensionKind::Budget => self.question.clone().unwrap_or_else(|| {
                "The run reached its budget: raise it, or stop the run?".to_owned()
            }),
            SuspensionKind::Input | SuspensionKind::RemoteInput => self
                .question
                .clone()
                .unwrap_or_else(|| "Answer the question".to_owned()),
        }
    }

    /// Whether it waits on the tenant's daily budget: only the operator may raise that, so a
    /// tenant may reject it but never approve it.
    pub fn on_tenant_budget(&self) -> bool {
        self.budget_scope() == Some(payloads::BudgetScope::Tenant)
    }

    /// The decisions a tenant may take on it: those it allows, less `approve` on the tenant's
    /// daily budget (what every door offers a person).
    pub fn tenant_decisions(&self) -> Vec<Decision> {
        let tenant_budget = self.on_tenant_budget();
        self.allowed_decisions
            .iter()
            .copied()
            .filter(|d| !(tenant_budget && *d == Decision::Approve))
            .collect()
    }
}

/// A suspension's decision on the wire: its fields beside the suspension's own (`decision`,
/// `reason`, `modifiedArgs`, `response`), none while it is pending.
mod resolution {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use utoipa::openapi::schema::{Object, ObjectBuilder, SchemaType, Type};
    use utoipa::openapi::{RefOr, Schema};

    use super::ResumeDecision;

    pub fn serialize<S: Serializer>(d: &Option<ResumeDecision>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => d.serialize(s),
            None => serde_json::Map::new().serialize(s),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<ResumeDecision>, D::Error> {
        let fields = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        if !fields.contains_key("decision") {
            return Ok(None);
        }
        let mut map = serde_json::Map::new();
        for k in ["decision", "reason", "modifiedArgs", "response", "raiseBy"] {
            if let Some(v) = fields.get(k) {
                map.insert(k.to_owned(), v.clone());
            }
        }
        serde_json::from_value(serde_json::Value::Object(map))
            .map(Some)
            .map_err(serde::de::Error::custom)
    }

    pub fn schema() -> Object {
        let prop = |t: Option<Type>, desc: &str| -> RefOr<Schema> {
            let b = ObjectBuilder::new().description(Some(desc));
            let b = match t {
                Some(t) => b.schema_type(t),
                None => b.schema_type(SchemaType::AnyValue),
            };
            b.build().into()
        };
        ObjectBuilder::new()
            .property(
                "decision",
                RefOr::Ref(utoipa::openapi::Ref::from_schema_name("Decision")),
            )
            .property(
                "reason",
                prop(
                    Some(Type::String),
                    "Why the person decided so (any decision).",
                ),
            )
            .property(
                "modifiedArgs",
                prop(None, "The arguments the call ran with instead (`edit`)."),
            )
            .property(
                "response",
                prop(None, "What became the call's result (`respond`)."),
            )
            .property(
                "raiseBy",
                RefOr::Ref(utoipa::openapi::Ref::from_schema_name("RaiseBy")),
            )
            .description(Some(
                "How a resolved suspension was decided; absent while it is pending.",
            ))
            .build()
    }
}
