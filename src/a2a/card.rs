//! The agent card type, as this service serves it (`crate::http::a2a::card`) and as remote
//! cards of either protocol version are read: v1.0's fields and, beside them, the v0.3 ones
//! (`url`, `protocolVersion`, `preferredTransport`, the `type` of the security scheme,
//! `security`), so clients of either version read it; readers ignore what they do not know.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::types::Version;

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
