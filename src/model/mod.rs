//! Domain types shared by every layer: threads, runs, todo items, messages, observations and
//! suspensions, plus the small enums and validated ids built once at the edge ("parse, don't
//! validate"). Nothing here does I/O. JSON shapes are camelCase, as the public contract requires.
//!
//! One file per concept, every type re-exported here (`crate::model::Run`): [`ids`] (thread and
//! item ids), [`runs`] (threads, runs, usage, messages), [`items`] (todo items, tool calls and
//! results), [`observations`], [`suspensions`] (and decisions), [`agent_config`] (a thread's
//! config and its policy floors), [`assistants`] (versioned configs and how they combine), [`webhooks`] (where a run's end is
//! announced, and deliveries), [`crons`] (schedules and their ticks), [`memory`] (the memory store's items and namespaces), [`calc`] (the calculator's arithmetic) and
//! [`time_zone`] (IANA names as people spell them), which the tools and the offline model share. This
//! file keeps what they share: `string_enum!`, the default tenant, new ids and NUL scrubbing.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident => $text:tt),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $text)] $variant),+
        }
        impl $name {
            /// The stable text used on the wire and in the database.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$(Self::$variant),+];
        }
        // Text: `http/sse.rs` answers it as a 422 detail (`ApiError::Validation` takes a String).
        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    other => Err(format!(
                        "unknown {} `{}` (expected one of: {})",
                        stringify!($name), other, [$($text),+].join(", ")
                    )),
                }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod agent_config;
pub mod assistants;
pub mod budgets;
pub mod calc;
pub mod crons;
pub mod ids;
pub mod items;
pub mod memory;
pub mod observations;
pub mod payloads;
pub mod runs;
pub mod suspensions;
pub mod time_zone;
pub mod webhooks;

pub use agent_config::*;
pub use assistants::*;
pub use budgets::*;
pub use crons::*;
pub use ids::*;
pub use items::*;
pub use memory::{MemoryItem, Namespace};
pub use observations::*;
pub use runs::*;
pub use suspensions::*;
pub use webhooks::*;

/// The tenant every request belongs to when no API keys are configured.
pub const DEFAULT_TENANT: &str = "default";

/// A new server-made id: UUIDv7, so ids sort by creation time.
pub fn new_id() -> Uuid {
    Uuid::now_v7()
}

string_enum! {
    /// Role of a conversation message.
    MessageRole {
        User => "user",
        Assistant => "assistant",
        Tool => "tool",
        System => "system",
    }
}

/// Replace every NUL character in the strings (and keys) of `value` with U+FFFD. Text that comes
/// from outside the API (a model's reply, a tool's output) is stored as it is, and Postgres
/// cannot hold a NUL in `text` or `jsonb`: a model that wrote one would fail every commit of its
/// run. The API itself refuses NUL in what clients send (a 422), so this only ever rewrites
/// what a model or a tool produced.
pub fn scrub_nul(value: &mut Value) {
    match value {
        Value::String(s) => scrub_nul_str(s),
        Value::Array(items) => items.iter_mut().for_each(scrub_nul),
        Value::Object(map) => {
            if map.keys().any(|k| k.contains('\0')) {
                let entries = std::mem::take(map);
                for (mut k, v) in entries {
                    scrub_nul_str(&mut k);
                    map.insert(k, v);
                }
            }
            map.values_mut().for_each(scrub_nul);
        }
        _ => {}
    }
}

/// [`scrub_nul`] for one string.
pub fn scrub_nul_str(s: &mut String) {
    if s.contains('\0') {
        *s = s.replace('\0', "\u{FFFD}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decisions stored before the type existed (built as a JSON object, keys sorted) read back
    /// as the decision they meant and write back byte for byte, in the text SQLite holds and as
    /// the JSON value Postgres holds.
    #[test]
    fn resume_decision_keeps_its_stored_json() {
        let cases = [
            (
                r#"{"decision":"approve"}"#,
                ResumeDecision::Approve {
                    reason: None,
                    raise_by: None,
                },
            ),
            (
                r#"{"decision":"approve","reason":"looks fine"}"#,
                ResumeDecision::Approve {
                    reason: Some("looks fine".into()),
                    raise_by: None,
                },
            ),
            (
                r#"{"decision":"edit","modifiedArgs":{"expression":"3+3"}}"#,
                ResumeDecision::Edit {
                    args: serde_json::json!({"expression": "3+3"}),
                    reason: None,
                },
            ),
            (
                r#"{"decision":"edit","modifiedArgs":{"a":[1,null]},"reason":"fixed it"}"#,
                ResumeDecision::Edit {
                    args: serde_json::json!({"a": [1, null]}),
                    reason: Some("fixed it".into()),
                },
            ),
            (
                r#"{"decision":"reject"}"#,
                ResumeDecision::Reject { reason: None },
            ),
            (
                r#"{"decision":"reject","reason":"expired"}"#,
                ResumeDecision::Reject {
                    reason: Some("expired".into()),
                },
            ),
            (
                r#"{"decision":"respond","response":{"answer":42}}"#,
                ResumeDecision::Respond {
                    reason: None,
                    response: serde_json::json!({"answer": 42}),
                },
            ),
            (
                r#"{"decision":"respond","reason":"asked","response":"yes"}"#,
                ResumeDecision::Respond {
                    reason: Some("asked".into()),
                    response: serde_json::json!("yes"),
                },
            ),
        ];
        for (old, meant) in cases {
            let read: ResumeDecision = serde_json::from_str(old).unwrap();
            assert_eq!(read, meant, "{old}");
            assert_eq!(serde_json::to_string(&read).unwrap(), old);
            let as_value: Value = serde_json::from_str(old).unwrap();
            assert_eq!(serde_json::to_value(&read).unwrap(), as_value);
            assert_eq!(serde_json::to_value(&read).unwrap().to_string(), old);
            assert_eq!(read.kind().as_str(), as_value["decision"]);
            assert_eq!(read.reason(), as_value["reason"].as_str());
        }
        for bad in [
            r#"{"decision":"maybe"}"#,
            r#"{"decision":"edit"}"#,
            r#"{"decision":"respond"}"#,
            r#"{"reason":"x"}"#,
        ] {
            assert!(
                serde_json::from_str::<ResumeDecision>(bad).is_err(),
                "{bad}"
            );
        }
    }

    /// Tool results journaled before the status was typed (a plain string) read back unchanged,
    /// and write back byte for byte.
    #[test]
    fn tool_result_status_keeps_its_stored_text() {
        for text in ["success", "error", "rejected", "responded"] {
            let stored = format!(
                r#"{{"toolCallId":"c1","name":"calculator","status":"{text}","output":null}}"#
            );
            let r: ToolResultRecord = serde_json::from_str(&stored).unwrap();
            assert_eq!(r.status.as_str(), text);
            assert_eq!(serde_json::to_string(&r).unwrap(), stored);
        }
        assert!(
            serde_json::from_str::<ToolResultRecord>(
                r#"{"toolCallId":"c1","name":"x","status":"maybe","output":null}"#
            )
            .is_err()
        );
        for p in RunPhase::ALL {
            assert_eq!(p.as_str().parse::<RunPhase>().unwrap(), *p);
        }
        assert_eq!(RunPhase::default(), RunPhase::New);
    }

    #[test]
    fn ids_reject_bad_characters_and_lengths() {
        assert!(ThreadId::parse("t-1.a:b_c").is_ok());
        assert!(ThreadId::parse("").is_err());
        assert!(ThreadId::parse("a b").is_err());
        assert!(ThreadId::parse(&"x".repeat(129)).is_err());
        assert!(ItemId::parse("step-1").is_ok());
        assert!(ItemId::parse("step:1").is_err());
        assert!(ItemId::parse(&"x".repeat(65)).is_err());
    }

    #[test]
    fn enums_round_trip_through_their_text() {
        for s in RunStatus::ALL {
            assert_eq!(s.as_str().parse::<RunStatus>().unwrap(), *s);
        }
        for t in ObservationType::ALL {
            let json = serde_json::to_string(t).unwrap();
            assert_eq!(json, format!("\"{}\"", t.as_str()));
        }
        assert!("nope".parse::<Decision>().is_err());
    }

    #[test]
    fn run_config_overrides_thread_config_field_by_field() {
        let thread = AgentConfig {
            model: Some("a".into()),
            max_iterations: Some(3),
            ..Default::default()
        };
        let run = AgentConfig {
            model: Some("b".into()),
            ..Default::default()
        };
        let merged = thread.overlay(&run);
        assert_eq!(merged.model.as_deref(), Some("b"));
        assert_eq!(merged.max_iterations, Some(3));
    }

    #[test]
    fn a_run_adds_approvals_and_narrows_tools_but_never_loosens_the_thread() {
        let names = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let thread = AgentConfig {
            tools: names(&["calculator", "current_time"]),
            require_approval: names(&["calculator"]),
            ..Default::default()
        };
        let run = AgentConfig {
            tools: names(&["current_time", "ask_user"]),
            require_approval: names(&["current_time"]),
            ..Default::default()
        };
        let merged = thread.overlay(&run);
        assert_eq!(merged.tools, names(&["current_time"]));
        assert_eq!(
            merged.require_approval,
            names(&["calculator", "current_time"])
        );
        let dropped = thread.overlay(&AgentConfig {
            require_approval: Some(vec![]),
            ..Default::default()
        });
        assert_eq!(dropped.require_approval, names(&["calculator"]));
        let open = AgentConfig::default().overlay(&run);
        assert_eq!(open.tools, names(&["current_time", "ask_user"]));
    }
}
