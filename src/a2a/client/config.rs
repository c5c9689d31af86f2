//! `PES_A2A_AGENTS`: the remote agents the operator lets runs delegate to, read once at start.
//! Like MCP servers they come only from the operator, never from the API. The value is inline
//! JSON (it starts with `{`) or the path of a JSON file: `{"<agent>": {"url": "<agent card URL>",
//! "headers"?: {…}, "origins"?: ["https://…"]}}`. Every mistake is a start-up error naming the
//! agent and the field.
//!
//! The card URL's origin, and each of `origins`, are the agent's configured origins: reached
//! without the SSRF guard (the operator wrote them) and the only ones sent its `headers` (see
//! `net`). A card that names its endpoint on another origin needs that origin in `origins` to
//! get the headers.

use std::collections::BTreeMap;

use serde_json::Value;

/// One remote agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// The name the planner and `delegate_to_agent` use.
    pub name: String,
    /// Where its agent card is (`https://host/.well-known/agent-card.json`).
    pub card_url: String,
    /// Headers sent with every request to its configured origins (e.g. `Authorization`).
    pub headers: BTreeMap<String, String>,
    /// Origins beyond the card URL's that the operator vouches for (`https://api.example`):
    /// reached without the guard, and sent `headers`.
    pub origins: Vec<String>,
}

/// The agents `PES_A2A_AGENTS` names, sorted by name.
///
/// # Errors
/// The file cannot be read, the JSON is malformed, or an entry is wrong (naming the agent and
/// the field).
pub fn parse(value: &str) -> Result<Vec<AgentConfig>, AgentsError> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let (text, origin) = if trimmed.starts_with('{') {
        (trimmed.to_owned(), "PES_A2A_AGENTS".to_owned())
    } else {
        let text = std::fs::read_to_string(trimmed).map_err(|source| AgentsError::Read {
            path: trimmed.to_owned(),
            source,
        })?;
        (text, format!("PES_A2A_AGENTS file `{trimmed}`"))
    };
    let doc: Value = match serde_json::from_str(&text) {
        Ok(doc) => doc,
        Err(source) => return Err(AgentsError::Json { origin, source }),
    };
    let Value::Object(agents) = doc else {
        return Err(AgentsError::NotAnObject { origin });
    };
    agents
        .into_iter()
        .map(|(name, entry)| {
            agent(&name, entry).map_err(|source| AgentsError::Agent {
                origin: origin.clone(),
                source,
            })
        })
        .collect()
}

fn agent(name: &str, entry: Value) -> Result<AgentConfig, EntryError> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(EntryError::Invalid(format!(
            "agent name `{name}` must be 1-64 characters of A-Z a-z 0-9 - _"
        )));
    }
    let Value::Object(mut fields) = entry else {
        return Err(EntryError::Invalid(format!(
            "agent `{name}`: expected an object"
        )));
    };
    let card_url = match fields.remove("url") {
        Some(Value::String(u)) if u.starts_with("http://") || u.starts_with("https://") => {
            http_url(&u).map_err(|source| EntryError::Url {
                name: name.to_owned(),
                url: u.clone(),
                source,
            })?;
            u
        }
        Some(Value::String(u)) => {
            return Err(EntryError::Invalid(format!(
                "agent `{name}`: url must be http:// or https://, got `{u}`"
            )));
        }
        Some(_) => {
            return Err(EntryError::Invalid(format!(
                "agent `{name}`: url must be a string"
            )));
        }
        None => {
            return Err(EntryError::Invalid(format!(
                "agent `{name}`: needs url (its agent card URL)"
            )));
        }
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
                        Err(EntryError::Invalid(format!(
                            "agent `{name}`: the header `{k}` is not a valid HTTP header"
                        )))
                    } else {
                        Ok((k, s))
                    }
                }
                _ => Err(EntryError::Invalid(format!(
                    "agent `{name}`: headers.{k} must be a string"
                ))),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(EntryError::Invalid(format!(
                "agent `{name}`: headers must be an object of strings"
            )));
        }
    };
    let origins = match fields.remove("origins") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|o| {
                let shown = o.as_str().map_or_else(|| o.to_string(), str::to_owned);
                let bad = |why: &str| {
                    EntryError::Invalid(format!("agent `{name}`: origins: `{shown}` {why}"))
                };
                let text = o.as_str().ok_or_else(|| bad("is not a string"))?;
                let url = http_url(text).map_err(|source| EntryError::Origin {
                    name: name.to_owned(),
                    origin: shown.clone(),
                    source,
                })?;
                if !matches!(url.path(), "" | "/") || url.query().is_some() {
                    return Err(bad(
                        "is not an origin (scheme, host and port only, e.g. `https://api.example`)",
                    ));
                }
                Ok(text.to_owned())
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(EntryError::Invalid(format!(
                "agent `{name}`: origins must be a list of origins (`https://host[:port]`)"
            )));
        }
    };
    if let Some(extra) = fields.keys().next() {
        return Err(EntryError::Invalid(format!(
            "agent `{name}`: unknown field `{extra}` (allowed: url, headers, origins)"
        )));
    }
    Ok(AgentConfig {
        name: name.to_owned(),
        card_url,
        headers,
        origins,
    })
}

/// An absolute http or https URL with a host.
fn http_url(text: &str) -> Result<reqwest::Url, UrlError> {
    let url = reqwest::Url::parse(text).map_err(UrlError::Parse)?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(UrlError::NotHttp);
    }
    Ok(url)
}

/// Why `PES_A2A_AGENTS` cannot be used (each message starts with where the value came from).
#[derive(Debug, thiserror::Error)]
pub enum AgentsError {
    #[error("PES_A2A_AGENTS: cannot read the file `{path}`: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: not valid JSON: {source}")]
    Json {
        origin: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{origin}: expected a JSON object of agents by name")]
    NotAnObject { origin: String },
    #[error("{origin}: {source}")]
    Agent {
        origin: String,
        #[source]
        source: EntryError,
    },
}

/// What is wrong with one agent's entry, naming the agent and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// A name, a field or a value that is not what the entry takes (the message says which).
    #[error("{0}")]
    Invalid(String),
    #[error("agent `{name}`: url `{url}` {source}")]
    Url {
        name: String,
        url: String,
        #[source]
        source: UrlError,
    },
    #[error("agent `{name}`: origins: `{origin}` {source}")]
    Origin {
        name: String,
        origin: String,
        #[source]
        source: UrlError,
    },
}

/// Why text is not an absolute http or https URL with a host (worded to follow the URL).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("is not a valid URL ({0})")]
    Parse(#[source] crate::model::webhooks::UrlParseError),
    #[error("must be an http:// or https:// URL with a host")]
    NotHttp,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_parse_and_mistakes_are_named() {
        let agents = parse(
            r#"{"research": {"url": "https://r.example/.well-known/agent-card.json", "headers": {"Authorization": "Bearer k"}, "origins": ["https://api.r.example", "http://10.0.0.1:8080/"]}, "echo": {"url": "http://127.0.0.1:9/.well-known/agent-card.json"}}"#,
        )
        .unwrap();
        assert_eq!(agents.len(), 2);
        assert_eq!(agents[0].name, "echo");
        assert!(agents[0].origins.is_empty());
        assert_eq!(agents[1].headers["Authorization"], "Bearer k");
        assert_eq!(agents[1].origins.len(), 2);
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
            (r#"{"a": {"url": "http://"}}"#, "is not a valid URL"),
            (
                r#"{"a": {"url": "http://x", "origins": "https://y"}}"#,
                "origins must be a list",
            ),
            (
                r#"{"a": {"url": "http://x", "origins": ["https://y/a2a"]}}"#,
                "`https://y/a2a` is not an origin",
            ),
            (
                r#"{"a": {"url": "http://x", "origins": ["ftp://y"]}}"#,
                "must be an http:// or https:// URL",
            ),
        ] {
            let e = parse(value).unwrap_err().to_string();
            assert!(e.contains(says), "{value}: {e}");
        }
    }
}
