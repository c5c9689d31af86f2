//! Ids built once at the edge and trusted inside: a thread's and an item's ("parse, don't
//! validate").

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::*;

/// Why a client-supplied id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidId(pub String);

pub(super) fn check_id(kind: &str, s: &str, max: usize, extra: &[char]) -> Result<(), InvalidId> {
    if s.is_empty() || s.len() > max {
        return Err(InvalidId(format!(
            "{kind} must be 1 to {max} characters long"
        )));
    }
    if !s.chars().all(|c| {
        c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' || extra.contains(&c)
    }) {
        let allowed: String = extra.iter().collect();
        return Err(InvalidId(format!(
            "{kind} may contain only letters, digits and `_.-{allowed}`"
        )));
    }
    Ok(())
}

/// A thread id: client-chosen or a server-made UUIDv7; 1–128 characters of `A-Za-z0-9_.:-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(transparent)]
pub struct ThreadId(String);

impl ThreadId {
    /// Validate a client-supplied id.
    ///
    /// # Errors
    /// When the id is empty, too long or has characters outside the allowed set.
    pub fn parse(s: &str) -> Result<Self, InvalidId> {
        check_id("threadId", s, 128, &[':'])?;
        Ok(Self(s.to_owned()))
    }
    /// A fresh server-made id.
    pub fn generate() -> Self {
        Self(new_id().to_string())
    }
    /// Wrap an id read back from the store (already validated when it was written).
    pub fn from_stored(s: String) -> Self {
        Self(s)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ThreadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ThreadId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ThreadId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A todo item id as the model wrote it: 1–64 characters of `A-Za-z0-9_.-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(transparent)]
pub struct ItemId(String);

impl ItemId {
    /// # Errors
    /// When the id is empty, longer than 64 characters or has other characters.
    pub fn parse(s: &str) -> Result<Self, InvalidId> {
        check_id("item id", s, 64, &[])?;
        Ok(Self(s.to_owned()))
    }
    pub fn from_stored(s: String) -> Self {
        Self(s)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ItemId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ItemId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ItemId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// `text` with every character a function name or a tool-use id may not hold (anything but
/// `A-Za-z0-9_-`, the rule of the OpenAI and Anthropic APIs) replaced by `_`.
pub fn identifier_chars(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
