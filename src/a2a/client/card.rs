//! What our client needs of a remote agent's card, read with the protocol's own card type
//! (either generation: the v1.0 card lists `supportedInterfaces`, the v0.3 card has `url`,
//! `protocolVersion` and `preferredTransport`). Only the JSON-RPC binding is used.

use serde_json::Value;

pub use crate::a2a::types::Version as Protocol;

use crate::a2a::card::AgentCard;

/// A remote agent's card, as far as delegation needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteCard {
    pub name: String,
    pub description: String,
    /// The JSON-RPC endpoint.
    pub endpoint: String,
    /// The version spoken there: v1.0 when offered, else v0.3.
    pub protocol: Protocol,
    pub streaming: bool,
    /// `(id, name, description)` of each skill.
    pub skills: Vec<(String, String, String)>,
}

impl RemoteCard {
    /// Read a card (of either version: [`AgentCard`] reads both).
    ///
    /// # Errors
    /// It is not an agent card, or it names no JSON-RPC endpoint of a version we speak.
    pub fn parse(card: &Value) -> Result<Self, CardError> {
        let card: AgentCard = serde_json::from_value(card.clone()).map_err(CardError::NotACard)?;
        let (interface, protocol) = card.jsonrpc_endpoint().ok_or(CardError::NoEndpoint)?;
        Ok(Self {
            endpoint: interface.url,
            protocol,
            streaming: card.capabilities.streaming.unwrap_or(false),
            skills: card
                .skills
                .into_iter()
                .map(|s| (s.id, s.name, s.description))
                .collect(),
            name: card.name,
            description: card.description,
        })
    }
}

/// Why a card cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CardError {
    #[error("not an agent card: {0}")]
    NotACard(#[source] serde_json::Error),
    #[error("the agent card names no JSON-RPC endpoint of version 1.0 or 0.3")]
    NoEndpoint,
}

/// Fetch and read the card at `url`, as `reach` allows: redirects followed hop by hop through
/// the guard, the agent's headers only to its configured origins, at most `PES_A2A_MAX_BYTES`
/// read.
///
/// # Errors
/// The card cannot be fetched (refused, too large, unreachable), is not JSON, or lacks what
/// delegation needs.
// Text, with the URLs in it redacted: a cause kept beside it would carry the credentials a URL
// may hold (user info, a token parameter). `agents.rs` keeps it as the agent's card slot.
pub async fn fetch(
    reach: &super::net::Reach,
    url: &str,
    timeout: std::time::Duration,
) -> Result<RemoteCard, String> {
    let card = reach
        .get_json(url, timeout)
        .await
        // The URL may carry credentials (user info, a token parameter): errors never show them.
        .map_err(|e| crate::redact::redact_urls_in(&format!("fetching the agent card: {e}")))?;
    RemoteCard::parse(&card).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn both_card_generations_are_read() {
        let v1 = RemoteCard::parse(&json!({
            "name": "Echo", "description": "Echoes", "version": "1",
            "supportedInterfaces": [
                {"url": "http://h/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
                {"url": "http://h/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
            ],
            "capabilities": {"streaming": true},
            "skills": [{"id": "echo", "name": "Echo", "description": "Says it back"}]
        }))
        .unwrap();
        assert_eq!(v1.endpoint, "http://h/a2a");
        assert_eq!(v1.protocol, Protocol::V1);
        assert!(v1.streaming);
        assert_eq!(v1.skills[0].0, "echo");
        let v03 = RemoteCard::parse(&json!({
            "name": "Old", "description": "", "version": "1", "url": "http://h/",
            "protocolVersion": "0.3.0", "preferredTransport": "JSONRPC"
        }))
        .unwrap();
        assert_eq!(
            (v03.endpoint.as_str(), v03.protocol, v03.streaming),
            ("http://h/", Protocol::V03, false)
        );
        assert!(
            RemoteCard::parse(&json!({"name": "x", "description": "", "version": "1"})).is_err()
        );
        assert!(RemoteCard::parse(&json!({"url": "http://h"})).is_err());
    }
}
