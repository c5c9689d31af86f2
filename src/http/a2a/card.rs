//! The agent card this service serves (`GET /.well-known/agent-card.json`): who this agent is,
//! where its JSON-RPC endpoint is (`PES_PUBLIC_URL` + `/a2a`), which protocol versions it speaks
//! there (1.0 first, then 0.3), what it can do (one `answer` skill, plus one per registered tool
//! it may use), and the bearer scheme when API keys are set.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::a2a::card::{AgentCapabilities, AgentCard, AgentInterface, AgentSkill};
use crate::a2a::types::Version;
use crate::http::AppState;

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
    let tools = state.cases.operator_tools();
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
