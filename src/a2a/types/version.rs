//! Which A2A version is spoken: v1.0 by default, v0.3 when a client or a remote agent's card
//! asks for it, named by the `A2A-Version` header. Every type of [`super`] writes the version it
//! is given and reads both.

use std::fmt;

/// The `A2A-Version` header (the spec's service parameter, case-insensitive).
pub const VERSION_HEADER: &str = "A2A-Version";

/// Protocol versions we speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// v0.3: slash method names (`message/send`), kebab-case states, `kind` discriminators.
    V03,
    /// v1.0: PascalCase method names (`SendMessage`), ProtoJSON enums, wrapped stream events.
    V1,
}

impl Version {
    /// `Major.Minor`, as in an agent card's `protocolVersion` and the `A2A-Version` header.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V03 => "0.3",
            Self::V1 => "1.0",
        }
    }

    /// The version a header or card value names (`0.3`, `0.3.0`, `1.0`, `1.0.1`…); `None` for one
    /// we do not speak. Patch numbers do not count (spec §3.6).
    pub fn parse(raw: &str) -> Option<Self> {
        let mut parts = raw.trim().split('.');
        let major = parts.next()?.parse::<u32>().ok()?;
        let minor = parts.next().map_or(Some(0), |m| m.parse::<u32>().ok())?;
        match (major, minor) {
            (0, 3) => Some(Self::V03),
            (1, 0) => Some(Self::V1),
            _ => None,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
