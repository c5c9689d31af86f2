//! `PES_A2A_AGENTS`: the remote agents the operator lets runs delegate to, read once at start.
//! Like MCP servers they come only from the operator, never from the API. The value is inline
//! JSON (it starts with `{`) or the path of a JSON file: `{"<agent>": {"url": "<agent card URL>",
//! "headers"?: {…}}}`. Every mistake is a start-up error naming the agent and the field.

use std::collections::BTreeMap;

use serde_json::Value;

/// One remote agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// The name the planner and `delegate_to_agent` use.
    pub name: String,
    /// Where its agent card is (`https://host/.well-known/agent-card.json`).
    pub card_url: String,
    /// Headers sent with every request to it (e.g. `Authorization`).
    pub headers: BTreeMap<String, String>,
}

/// The agents `PES_A2A_AGENTS` names, sorted by name.
///
/// # Errors
/// The file cannot be read, the JSON is malformed, or an entry is wrong (naming the agent and
/// the field).
pub fn parse(value: &str) -> Result<Vec<AgentConfig>, String> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let (text, origin) = if trimmed.starts_with('{') {
        (trimmed.to_owned(), "PES_A2A_AGENTS".to_owned())
    } else {
        let text = std::fs::read_to_string(trimmed)
            .map_err(|e| format!("PES_A2A_AGENTS: cannot read the file `{trimmed}`: {e}"))?;
        (text, format!("PES_A2A_AGENTS file `{trimmed}`"))
    };
    let doc: Value =
        serde_json::from_str(&text).map_err(|e| format!("{origin}: not valid JSON: {e}"))?;
    let Value::Object(agents) = doc else {
        return Err(format!(
            "{origin}: expected a JSON object of agents by name"
        ));
    };
    agents
        .into_iter()
        .map(|(name, entry)| agent(&name, entry).map_err(|e| format!("{origin}: {e}")))
        .collect()
}

fn agent(name: &str, entry: Value) -> Result<AgentConfig, String> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(format!(
            "agent name `{name}` must be 1-64 characters of A-Z a-z 0-9 - _"
        ));
    }
    let Value::Object(mut fields) = entry else {
        return Err(format!("agent `{name}`: expected an object"));
    };
    let card_url = match fields.remove("url") {
        Some(Value::String(u)) if u.starts_with("http://") || u.starts_with("https://") => u,
        Some(Value::String(u)) => {
            return Err(format!(
                "agent `{name}`: url must be http:// or https://, got `{u}`"
            ));
        }
        Some(_) => return Err(format!("agent `{name}`: url must be a string")),
        None => return Err(format!("agent `{name}`: needs url (its agent card URL)")),
    };
    let headers = match fields.remove("headers") {
        None => BTreeMap::new(),
        Some(Value::Object(map)) => map
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => {
                    if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
                        || reqwest::header::HeaderValue::from_str(&s).is_err()
                    {
                        Err(format!(
                            "agent `{name}`: the header `{k}` is not a valid HTTP header"
                        ))
                    } else {
                        Ok((k, s))
                    }
                }
                _ => Err(format!("agent `{name}`: headers.{k} must be a string")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(format!(
                "agent `{name}`: headers must be an object of strings"
            ));
        }
    };
    if let Some(extra) = fields.keys().next() {
        return Err(format!(
            "agent `{name}`: unknown field `{extra}` (allowed: url, headers)"
        ));
    }
    Ok(AgentConfig {
        name: name.to_owned(),
        card_url,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_parse_and_mistakes_are_named() {
        let agents = parse(
            r#"{"research": {"url": "https://r.example/.well-known/agent-card.json", "headers": {"Authorization": "Bearer k"}}, "echo": {"url": "http://127.0.0.1:9/.well-known/agent-card.json"}}"#,
        )
        .unwrap();
        assert_eq!(agents.len(), 2);
        assert_eq!(agents[0].name, "echo");
        assert_eq!(agents[1].headers["Authorization"], "Bearer k");
        assert!(parse("").unwrap().is_empty());
        for (value, says) in [
            ("{", "not valid JSON"),
            (r#"{"a b": {"url": "http://x"}}"#, "agent name `a b`"),
            (r#"{"a": {}}"#, "needs url"),
            (r#"{"a": {"url": "ftp://x"}}"#, "must be http"),
            (
                r#"{"a": {"url": "http://x", "headers": {"h": 1}}}"#,
                "headers.h must be a string",
            ),
            (
                r#"{"a": {"url": "http://x", "headers": {"h h": "1"}}}"#,
                "not a valid HTTP header",
            ),
            (
                r#"{"a": {"url": "http://x", "card": 1}}"#,
                "unknown field `card`",
            ),
            ("/no/such/agents.json", "cannot read the file"),
        ] {
            let e = parse(value).unwrap_err();
            assert!(e.contains(says), "{value}: {e}");
        }
    }
}
