//! The agent card (`GET /.well-known/agent-card.json`): who this agent is, where its JSON-RPC
//! endpoint is (`PES_PUBLIC_URL` + `/a2a`), which protocol versions it speaks there (1.0 first,
//! then 0.3), what it can do (one `answer` skill, plus one per registered tool it may use), and
//! the bearer scheme when API keys are set. The card carries v1.0's fields and, beside them, the
//! v0.3 ones (`url`, `protocolVersion`, `preferredTransport`, the `type` of the security
//! scheme, `security`), so clients of either version read it; readers ignore what they do not
//! know.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::types::Version;
use crate::http::AppState;

/// Where a card's endpoint is and what it speaks there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentInterface {
    pub url: String,
    /// `JSONRPC` here.
    pub protocol_binding: String,
    /// `1.0` or `0.3`.
    pub protocol_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// Optional features.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentCapabilities {
    #[serde(default)]
    pub streaming: Option<bool>,
    #[serde(default)]
    pub push_notifications: Option<bool>,
    #[serde(default)]
    pub extended_agent_card: Option<bool>,
}

/// Something the agent can do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSkill {
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_modes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_modes: Vec<String>,
}

/// An A2A agent card, as served here and as read from remote agents (of either version: a v0.3
/// card's `url` and `protocolVersion` become its one interface, see [`AgentCard::interfaces`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentCard {
    pub name: String,
    pub description: String,
    /// Endpoints in order of preference (v1.0).
    #[serde(default)]
    pub supported_interfaces: Vec<AgentInterface>,
    pub version: String,
    #[serde(default)]
    pub capabilities: AgentCapabilities,
    #[serde(default)]
    pub default_input_modes: Vec<String>,
    #[serde(default)]
    pub default_output_modes: Vec<String>,
    #[serde(default)]
    pub skills: Vec<AgentSkill>,
    /// Security schemes by name (both versions' fields side by side).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub security_schemes: Option<Value>,
    /// v1.0: `[{"schemes": {"bearer": {"list": []}}}]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub security_requirements: Option<Value>,
    /// v0.3: the preferred endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// v0.3: the protocol version of `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// v0.3: the transport of `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_transport: Option<String>,
    /// v0.3: `[{"bearer": []}]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub security: Option<Value>,
}

impl AgentCard {
    /// The card's endpoints: `supportedInterfaces`, else (a v0.3 card) its `url` with its
    /// `protocolVersion` (0.3 when absent) and `preferredTransport` (JSONRPC when absent).
    pub fn interfaces(&self) -> Vec<AgentInterface> {
        if !self.supported_interfaces.is_empty() {
            return self.supported_interfaces.clone();
        }
        self.url
            .iter()
            .map(|url| AgentInterface {
                url: url.clone(),
                protocol_binding: self
                    .preferred_transport
                    .clone()
                    .unwrap_or_else(|| "JSONRPC".into()),
                protocol_version: self
                    .protocol_version
                    .clone()
                    .unwrap_or_else(|| "0.3".into()),
                tenant: None,
            })
            .collect()
    }

    /// The JSON-RPC endpoint to call and the version to speak there: v1.0 when offered, else
    /// v0.3 (spec §8.3.2: the first of the best version).
    pub fn jsonrpc_endpoint(&self) -> Option<(AgentInterface, Version)> {
        let jsonrpc: Vec<(AgentInterface, Version)> = self
            .interfaces()
            .into_iter()
            .filter(|i| i.protocol_binding.eq_ignore_ascii_case("JSONRPC"))
            .filter_map(|i| Version::parse(&i.protocol_version).map(|v| (i, v)))
            .collect();
        let v1 = jsonrpc.iter().find(|(_, v)| *v == Version::V1).cloned();
        v1.or_else(|| jsonrpc.into_iter().next())
    }
}

/// The modes of every message and artifact.
const MODES: [&str; 2] = ["text/plain", "application/json"];

/// This service's card.
pub fn our_card(state: &AppState) -> AgentCard {
    let endpoint = format!("{}/a2a", state.config.public_url());
    let interface = |v: Version| AgentInterface {
        url: endpoint.clone(),
        protocol_binding: "JSONRPC".into(),
        protocol_version: v.as_str().into(),
        tenant: None,
    };
    let modes: Vec<String> = MODES.iter().map(|m| (*m).to_owned()).collect();
    let mut skills = vec![AgentSkill {
        id: "answer".into(),
        name: "Answer a request".into(),
        description: "Plans a todo list for the request, executes each item (with tools where it \
                      needs them, asking you when a tool needs a person), and synthesizes one \
                      answer with its sources and follow-up suggestions. Messages in one context \
                      share a conversation: a follow-up refines the plan."
            .into(),
        tags: vec!["plan-execute-synthesize".into(), "agent".into()],
        examples: vec!["What is 17 * 23, and what time is it in Tokyo?".into()],
        input_modes: modes.clone(),
        output_modes: modes.clone(),
    }];
    let mut tools = state.engine.tools().catalogue();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    skills.extend(tools.into_iter().map(|t| AgentSkill {
        id: format!("tool:{}", t.name),
        name: t.name.clone(),
        description: format!("Can use the `{}` tool: {}", t.name, t.description),
        tags: vec![
            "tool".into(),
            serde_json::to_value(t.source)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
        ],
        examples: Vec::new(),
        input_modes: Vec::new(),
        output_modes: Vec::new(),
    }));
    let keys = !state.api_keys.is_empty();
    AgentCard {
        name: "pes-server".into(),
        description: "A durable Plan-Execute-Synthesize agent: it plans a request as a todo list, \
                      executes the items with tools, pauses for a person when a tool needs one \
                      (input-required), and answers with one synthesized response. Tasks survive \
                      restarts; streams resume without losing an update."
            .into(),
        supported_interfaces: vec![interface(Version::V1), interface(Version::V03)],
        version: env!("CARGO_PKG_VERSION").into(),
        capabilities: AgentCapabilities {
            streaming: Some(true),
            push_notifications: Some(false),
            extended_agent_card: Some(false),
        },
        default_input_modes: modes.clone(),
        default_output_modes: modes,
        skills,
        security_schemes: keys.then(|| {
            json!({"bearer": {
                "httpAuthSecurityScheme": {"scheme": "Bearer", "description": "An API key of PES_API_KEYS"},
                "type": "http", "scheme": "bearer", "description": "An API key of PES_API_KEYS",
            }})
        }),
        security_requirements: keys.then(|| json!([{"schemes": {"bearer": {"list": []}}}])),
        url: Some(endpoint.clone()),
        protocol_version: Some("0.3.0".into()),
        preferred_transport: Some("JSONRPC".into()),
        security: keys.then(|| json!([{"bearer": []}])),
    }
}

/// The A2A agent card.
///
/// Public (no key needed): who this agent is, where its JSON-RPC endpoint is and which protocol
/// versions it speaks there, its skills, and the bearer scheme when API keys are set.
#[utoipa::path(get, path = "/.well-known/agent-card.json", tag = "a2a",
    responses((status = 200, description = "The A2A agent card (protocol 1.0, with the 0.3 fields beside)", body = AgentCard)))]
pub async fn agent_card(State(state): State<AppState>) -> Response {
    (
        [(header::CACHE_CONTROL, "public, max-age=60")],
        axum::Json(our_card(&state)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v03_card_names_its_one_interface_and_v1_is_preferred_when_offered() {
        let v03: AgentCard = serde_json::from_value(json!({
            "name": "echo", "description": "d", "version": "1", "url": "http://h/rpc",
            "protocolVersion": "0.3.0", "capabilities": {"streaming": true},
            "defaultInputModes": [], "defaultOutputModes": [], "skills": []
        }))
        .unwrap();
        let (i, v) = v03.jsonrpc_endpoint().unwrap();
        assert_eq!((i.url.as_str(), v), ("http://h/rpc", Version::V03));
        let mut both = v03.clone();
        both.supported_interfaces = vec![
            AgentInterface {
                url: "http://h/old".into(),
                protocol_binding: "JSONRPC".into(),
                protocol_version: "0.3".into(),
                tenant: None,
            },
            AgentInterface {
                url: "http://h/new".into(),
                protocol_binding: "JSONRPC".into(),
                protocol_version: "1.0".into(),
                tenant: None,
            },
        ];
        let (i, v) = both.jsonrpc_endpoint().unwrap();
        assert_eq!((i.url.as_str(), v), ("http://h/new", Version::V1));
    }
}
