//! Messages between a client and an agent, who sent them ([`Role`]), and the parts they (and
//! artifacts) are made of: text, bytes, a URL or data, told apart by the field they carry in
//! v1.0 and by `kind` in v0.3.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value, json};

use super::{Version, to_object};

/// Who sent a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Agent,
}

impl Role {
    fn wire(self, v: Version) -> &'static str {
        match (self, v) {
            (Self::User, Version::V1) => "ROLE_USER",
            (Self::Agent, Version::V1) => "ROLE_AGENT",
            (Self::User, Version::V03) => "user",
            (Self::Agent, Version::V03) => "agent",
        }
    }
}

impl Serialize for Role {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.wire(Version::V1))
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match String::deserialize(d)?.as_str() {
            "ROLE_USER" | "user" => Ok(Self::User),
            "ROLE_AGENT" | "agent" => Ok(Self::Agent),
            other => Err(D::Error::custom(format!(
                "unknown role `{other}` (ROLE_USER or ROLE_AGENT)"
            ))),
        }
    }
}

/// What a part holds (v1.0 names; v0.3 `text`/`data`/`file` parts map onto them).
#[derive(Debug, Clone, PartialEq)]
pub enum PartContent {
    Text(String),
    /// Bytes, base64 as on the wire.
    Raw(String),
    Url(String),
    Data(Value),
}

/// One piece of a message or an artifact.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub content: PartContent,
    pub metadata: Option<Map<String, Value>>,
    pub filename: Option<String>,
    pub media_type: Option<String>,
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self::of(PartContent::Text(text.into()))
    }

    /// A structured data part (`application/json`).
    pub fn data(value: Value) -> Self {
        Self::of(PartContent::Data(value))
    }

    fn of(content: PartContent) -> Self {
        Self {
            content,
            metadata: None,
            filename: None,
            media_type: None,
        }
    }

    /// The wire form of `v`.
    pub fn to_wire(&self, v: Version) -> Value {
        let mut out = Map::new();
        match v {
            Version::V1 => {
                let (key, value) = match &self.content {
                    PartContent::Text(t) => ("text", json!(t)),
                    PartContent::Raw(b) => ("raw", json!(b)),
                    PartContent::Url(u) => ("url", json!(u)),
                    PartContent::Data(d) => ("data", d.clone()),
                };
                out.insert(key.into(), value);
                if let Some(f) = &self.filename {
                    out.insert("filename".into(), json!(f));
                }
                if let Some(m) = &self.media_type {
                    out.insert("mediaType".into(), json!(m));
                }
            }
            Version::V03 => match &self.content {
                PartContent::Text(t) => {
                    out.insert("kind".into(), json!("text"));
                    out.insert("text".into(), json!(t));
                }
                PartContent::Data(d) => {
                    out.insert("kind".into(), json!("data"));
                    // v0.3 data parts hold an object.
                    let d = if d.is_object() {
                        d.clone()
                    } else {
                        json!({"value": d})
                    };
                    out.insert("data".into(), d);
                }
                PartContent::Raw(_) | PartContent::Url(_) => {
                    let mut file = Map::new();
                    match &self.content {
                        PartContent::Raw(b) => file.insert("bytes".into(), json!(b)),
                        PartContent::Url(u) => file.insert("uri".into(), json!(u)),
                        _ => None,
                    };
                    if let Some(f) = &self.filename {
                        file.insert("name".into(), json!(f));
                    }
                    if let Some(m) = &self.media_type {
                        file.insert("mimeType".into(), json!(m));
                    }
                    out.insert("kind".into(), json!("file"));
                    out.insert("file".into(), Value::Object(file));
                }
            },
        }
        if let Some(m) = &self.metadata {
            out.insert("metadata".into(), Value::Object(m.clone()));
        }
        Value::Object(out)
    }

    /// A part in either version's shape.
    ///
    /// # Errors
    /// A part that holds none (or more than one) of text, raw, url, data, or an unknown `kind`.
    pub fn from_wire(v: &Value) -> Result<Self, PartError> {
        let obj = v.as_object().ok_or("a part must be an object")?;
        let metadata = match obj.get("metadata") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m.clone()),
            Some(_) => return Err("part metadata must be an object".into()),
        };
        let text_of = |key: &str| -> Result<Option<String>, PartError> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(format!("part `{key}` must be a string").into()),
            }
        };
        if let Some(kind) = obj.get("kind") {
            // v0.3
            let part = match kind.as_str() {
                Some("text") => Part::text(text_of("text")?.ok_or("a text part needs `text`")?),
                Some("data") => {
                    Part::data(obj.get("data").cloned().ok_or("a data part needs `data`")?)
                }
                Some("file") => {
                    let file = obj
                        .get("file")
                        .and_then(Value::as_object)
                        .ok_or("a file part needs a `file` object")?;
                    let s = |k: &str| file.get(k).and_then(Value::as_str).map(str::to_owned);
                    let content = match (s("bytes"), s("uri")) {
                        (Some(b), None) => PartContent::Raw(b),
                        (None, Some(u)) => PartContent::Url(u),
                        _ => return Err("a file part needs `bytes` or `uri`".into()),
                    };
                    Part {
                        content,
                        metadata: None,
                        filename: s("name"),
                        media_type: s("mimeType"),
                    }
                }
                _ => return Err(format!("unknown part kind {kind}").into()),
            };
            return Ok(Part { metadata, ..part });
        }
        let mut found = Vec::new();
        if let Some(t) = text_of("text")? {
            found.push(PartContent::Text(t));
        }
        if let Some(b) = text_of("raw")? {
            found.push(PartContent::Raw(b));
        }
        if let Some(u) = text_of("url")? {
            found.push(PartContent::Url(u));
        }
        if let Some(d) = obj.get("data") {
            found.push(PartContent::Data(d.clone()));
        }
        if found.len() != 1 {
            return Err("a part holds exactly one of `text`, `raw`, `url`, `data`".into());
        }
        Ok(Part {
            content: found.remove(0),
            metadata,
            filename: text_of("filename")?,
            media_type: text_of("mediaType")?,
        })
    }
}

/// Why a value is not a part of either version (the message names the field; no library error
/// lies under it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PartError(String);

impl From<&str> for PartError {
    fn from(message: &str) -> Self {
        Self(message.to_owned())
    }
}

impl From<String> for PartError {
    fn from(message: String) -> Self {
        Self(message)
    }
}

impl Serialize for Part {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_wire(Version::V1).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Part::from_wire(&Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// A message between a client and an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    pub message_id: String,
    pub role: Role,
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_task_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
}

impl Message {
    /// A message from the agent.
    pub fn agent(message_id: impl Into<String>, parts: Vec<Part>) -> Self {
        Self {
            message_id: message_id.into(),
            role: Role::Agent,
            parts,
            context_id: None,
            task_id: None,
            metadata: None,
            reference_task_ids: Vec::new(),
            extensions: Vec::new(),
        }
    }

    /// The wire form of `v`.
    pub fn to_wire(&self, v: Version) -> Value {
        let mut out = to_object(self);
        out.insert("role".into(), json!(self.role.wire(v)));
        out.insert(
            "parts".into(),
            Value::Array(self.parts.iter().map(|p| p.to_wire(v)).collect()),
        );
        if v == Version::V03 {
            out.insert("kind".into(), json!("message"));
        }
        Value::Object(out)
    }
}
