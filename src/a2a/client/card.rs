//! What our client needs of a remote agent's card, read from either protocol generation: the
//! v1.0 card lists `supportedInterfaces` (`{url, protocolBinding, protocolVersion}`), the v0.3
//! card has `url`, `protocolVersion` and `preferredTransport`. Only the JSON-RPC binding is
//! used.

use serde_json::Value;

/// The protocol generation a remote agent speaks (method names, the `A2A-Version` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `SendMessage`, `GetTask`, … with `A2A-Version: 1.0`.
    V1,
    /// `message/send`, `tasks/get`, … (the card declares only v0.3).
    V03,
}

/// A remote agent's card, as far as delegation needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteCard {
    pub name: String,
    pub description: String,
    /// The JSON-RPC endpoint.
    pub endpoint: String,
    pub protocol: Protocol,
    pub streaming: bool,
    /// `(id, name, description)` of each skill.
    pub skills: Vec<(String, String, String)>,
}

impl RemoteCard {
    /// Read a card.
    ///
    /// # Errors
    /// What is missing: a JSON-RPC endpoint, or a name.
    pub fn parse(card: &Value) -> Result<Self, String> {
        let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
        let name = text(&card["name"]);
        if name.is_empty() {
            return Err("the agent card has no name".into());
        }
        let jsonrpc = |i: &&Value| {
            i["protocolBinding"]
                .as_str()
                .or_else(|| i["transport"].as_str())
                .is_none_or(|b| b.eq_ignore_ascii_case("JSONRPC"))
        };
        let interfaces: Vec<&Value> = card["supportedInterfaces"]
            .as_array()
            .map(|a| a.iter().filter(jsonrpc).collect())
            .unwrap_or_default();
        let v1 = interfaces.iter().find(|i| {
            i["protocolVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with('1'))
        });
        let (endpoint, protocol) = match (v1, interfaces.first()) {
            (Some(i), _) => (text(&i["url"]), Protocol::V1),
            (None, Some(i)) => (text(&i["url"]), version_of(&i["protocolVersion"])),
            (None, None) => (text(&card["url"]), version_of(&card["protocolVersion"])),
        };
        if endpoint.is_empty() {
            return Err("the agent card names no JSON-RPC endpoint".into());
        }
        let skills = card["skills"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| (text(&s["id"]), text(&s["name"]), text(&s["description"])))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            name,
            description: text(&card["description"]),
            endpoint,
            protocol,
            streaming: card["capabilities"]["streaming"].as_bool().unwrap_or(false),
            skills,
        })
    }
}

/// v1 unless the version says 0.x.
fn version_of(v: &Value) -> Protocol {
    match v.as_str() {
        Some(s) if s.starts_with("0.") => Protocol::V03,
        _ => Protocol::V1,
    }
}

/// Fetch and read the card at `url`, sending `headers`.
///
/// # Errors
/// The card cannot be fetched, is not JSON, or lacks what delegation needs.
pub async fn fetch(
    url: &str,
    headers: &std::collections::BTreeMap<String, String>,
    timeout: std::time::Duration,
) -> Result<RemoteCard, String> {
    let client = crate::net::client_builder()
        .timeout(timeout)
        .build()
        .map_err(|e| format!("building the HTTP client: {e}"))?;
    let mut req = client.get(url);
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let resp = req
        .send()
        .await
        .map_err(|e| format!("fetching the agent card {url}: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("fetching the agent card {url}: HTTP {status}"));
    }
    let card: Value = resp
        .json()
        .await
        .map_err(|e| format!("the agent card at {url} is not JSON: {e}"))?;
    RemoteCard::parse(&card)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn both_card_generations_are_read() {
        let v1 = RemoteCard::parse(&json!({
            "name": "Echo", "description": "Echoes",
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
            "name": "Old", "url": "http://h/", "protocolVersion": "0.3.0", "preferredTransport": "JSONRPC"
        }))
        .unwrap();
        assert_eq!(
            (v03.endpoint.as_str(), v03.protocol, v03.streaming),
            ("http://h/", Protocol::V03, false)
        );
        assert!(RemoteCard::parse(&json!({"name": "x"})).is_err());
        assert!(RemoteCard::parse(&json!({"url": "http://h"})).is_err());
    }
}
