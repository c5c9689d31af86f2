//! `PES_MCP_SERVERS`: which MCP servers the operator connects, read once at start. Servers come
//! only from here, never from the API: a stdio server is a command the service runs, so naming
//! one is code execution and stays the operator's decision.
//!
//! The value is inline JSON (it starts with `{`) or the path of a JSON file:
//! `{"<server>": {"url": "…", "headers"?: {…}} | {"command": "…", "args"?: […], "env"?: {…}}}`.
//! Every mistake is a start-up error that names the server and the field.

use std::collections::BTreeMap;

use serde_json::Value;

/// How to reach one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Streamable HTTP at `url`, with extra request headers (e.g. `Authorization`).
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
    /// A child process speaking MCP over its stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
    },
}

/// One configured server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Its name: its tools are `<name>__<tool>`.
    pub name: String,
    pub transport: Transport,
}

/// The servers `PES_MCP_SERVERS` names, sorted by name.
///
/// # Errors
/// The file cannot be read, the JSON is malformed, or a server's entry is wrong (the message
/// names the server and the field).
pub fn parse(value: &str) -> Result<Vec<ServerConfig>, ServersError> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let (text, origin) = if trimmed.starts_with('{') {
        (trimmed.to_owned(), "PES_MCP_SERVERS".to_owned())
    } else {
        let text = std::fs::read_to_string(trimmed).map_err(|source| ServersError::Read {
            path: trimmed.to_owned(),
            source,
        })?;
        (text, format!("PES_MCP_SERVERS file `{trimmed}`"))
    };
    let doc: Value = match serde_json::from_str(&text) {
        Ok(doc) => doc,
        Err(source) => return Err(ServersError::Json { origin, source }),
    };
    let Value::Object(servers) = doc else {
        return Err(ServersError::NotAnObject { origin });
    };
    servers
        .into_iter()
        .map(|(name, entry)| {
            server(&name, entry).map_err(|source| ServersError::Server {
                origin: origin.clone(),
                source,
            })
        })
        .collect()
}

/// Why `PES_MCP_SERVERS` cannot be used (each message starts with where the value came from).
#[derive(Debug, thiserror::Error)]
pub enum ServersError {
    #[error("PES_MCP_SERVERS: cannot read the file `{path}`: {source}")]
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
    #[error("{origin}: expected a JSON object of servers by name")]
    NotAnObject { origin: String },
    #[error("{origin}: {source}")]
    Server {
        origin: String,
        #[source]
        source: EntryError,
    },
}

/// What is wrong with one server's entry: the message names the server and the field (no
/// library error lies under it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EntryError(String);

fn server(name: &str, entry: Value) -> Result<ServerConfig, EntryError> {
    let valid_name = !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.contains("__");
    if !valid_name {
        return Err(EntryError(format!(
            "server name `{name}` must be 1-32 characters of A-Z a-z 0-9 - _ without `__` (its \
             tools are named `<server>__<tool>`)"
        )));
    }
    let Value::Object(mut fields) = entry else {
        return Err(EntryError(format!("server `{name}`: expected an object")));
    };
    let transport = match (fields.remove("url"), fields.remove("command")) {
        (Some(url), None) => {
            let url = string(name, "url", url)?;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(EntryError(format!(
                    "server `{name}`: url must be http:// or https://, got `{url}`"
                )));
            }
            let headers = string_map(name, "headers", fields.remove("headers"))?;
            for (k, v) in &headers {
                check_header(name, k, v)?;
            }
            Transport::Http { url, headers }
        }
        (None, Some(command)) => {
            let command = string(name, "command", command)?;
            if command.trim().is_empty() {
                return Err(EntryError(format!("server `{name}`: command is empty")));
            }
            let args = match fields.remove("args") {
                None => Vec::new(),
                Some(Value::Array(items)) => items
                    .into_iter()
                    .map(|a| string(name, "args[]", a))
                    .collect::<Result<_, _>>()?,
                Some(_) => {
                    return Err(EntryError(format!(
                        "server `{name}`: args must be an array of strings"
                    )));
                }
            };
            let env = string_map(name, "env", fields.remove("env"))?;
            Transport::Stdio { command, args, env }
        }
        (Some(_), Some(_)) => {
            return Err(EntryError(format!(
                "server `{name}`: give either url (streamable HTTP) or command (stdio), not both"
            )));
        }
        (None, None) => {
            return Err(EntryError(format!(
                "server `{name}`: needs url (streamable HTTP) or command (stdio)"
            )));
        }
    };
    if let Some(extra) = fields.keys().next() {
        let allowed = match transport {
            Transport::Http { .. } => "url, headers",
            Transport::Stdio { .. } => "command, args, env",
        };
        return Err(EntryError(format!(
            "server `{name}`: unknown field `{extra}` (allowed: {allowed})"
        )));
    }
    Ok(ServerConfig {
        name: name.to_owned(),
        transport,
    })
}

/// Headers the MCP transport sets itself.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

fn check_header(server: &str, name: &str, value: &str) -> Result<(), EntryError> {
    if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(EntryError(format!(
            "server `{server}`: `{name}` is not a valid HTTP header name"
        )));
    }
    if RESERVED_HEADERS
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
    {
        return Err(EntryError(format!(
            "server `{server}`: the header `{name}` is set by the MCP transport itself"
        )));
    }
    if reqwest::header::HeaderValue::from_str(value).is_err() {
        return Err(EntryError(format!(
            "server `{server}`: the value of the header `{name}` is not a valid HTTP header value"
        )));
    }
    Ok(())
}

fn string(server: &str, field: &str, v: Value) -> Result<String, EntryError> {
    match v {
        Value::String(s) => Ok(s),
        _ => Err(EntryError(format!(
            "server `{server}`: {field} must be a string"
        ))),
    }
}

fn string_map(
    server: &str,
    field: &str,
    v: Option<Value>,
) -> Result<BTreeMap<String, String>, EntryError> {
    match v {
        None => Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .into_iter()
            .map(|(k, v)| Ok((k.clone(), string(server, &format!("{field}.{k}"), v)?)))
            .collect(),
        Some(_) => Err(EntryError(format!(
            "server `{server}`: {field} must be an object of strings"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_transports_parse_inline_and_from_a_file() {
        let inline = r#"{"docs": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer x"}},
                         "fs": {"command": "python3", "args": ["server.py", "stdio"], "env": {"A": "1"}}}"#;
        let servers = parse(inline).unwrap();
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[0].name, "docs");
        assert_eq!(
            servers[0].transport,
            Transport::Http {
                url: "http://127.0.0.1:9/mcp".into(),
                headers: [("Authorization".to_owned(), "Bearer x".to_owned())].into()
            }
        );
        assert!(
            matches!(&servers[1].transport, Transport::Stdio { command, args, .. } if command == "python3" && args.len() == 2)
        );
        let path = std::env::temp_dir().join(format!("pes-mcp-{}.json", std::process::id()));
        std::fs::write(&path, inline).unwrap();
        assert_eq!(parse(path.to_str().unwrap()).unwrap(), servers);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(parse("  ").unwrap(), vec![]);
    }

    #[test]
    fn mistakes_name_the_server_and_the_field() {
        for (value, says) in [
            ("{", "not valid JSON"),
            ("[]", "cannot read the file"),
            (r#"{"a__b": {"url": "http://x"}}"#, "server name `a__b`"),
            (r#"{"s": {"url": "ftp://x"}}"#, "url must be http"),
            (
                r#"{"s": {}}"#,
                "needs url (streamable HTTP) or command (stdio)",
            ),
            (r#"{"s": {"url": "http://x", "command": "y"}}"#, "not both"),
            (
                r#"{"s": {"command": "y", "args": "z"}}"#,
                "args must be an array",
            ),
            (
                r#"{"s": {"url": "http://x", "headers": {"h": 1}}}"#,
                "headers.h must be a string",
            ),
            (
                r#"{"s": {"url": "http://x", "cmd": 1}}"#,
                "unknown field `cmd`",
            ),
            (
                r#"{"s": {"url": "http://x", "headers": {"a b": "1"}}}"#,
                "not a valid HTTP header name",
            ),
            (
                r#"{"s": {"url": "http://x", "headers": {"Accept": "1"}}}"#,
                "set by the MCP transport",
            ),
            (
                r#"{"s": {"url": "http://x", "headers": {"h": "a\nb"}}}"#,
                "not a valid HTTP header value",
            ),
            (
                "/no/such/file.json",
                "cannot read the file `/no/such/file.json`",
            ),
        ] {
            let e = parse(value).unwrap_err().to_string();
            assert!(e.contains(says), "{value}: {e}");
        }
    }
}
