//! The A2A protocol's data types, as this service speaks them: protocol v1.0 on the wire by
//! default (ProtoJSON: camelCase fields, `TASK_STATE_WORKING`, `ROLE_USER`, parts told apart by
//! which field they carry, stream events wrapped as `{"statusUpdate": …}`), v0.3 on request
//! ([`Version::V03`]: `working`, `user`, parts and events told apart by `kind`, `final` on status
//! updates). Reading is lenient: every type here parses the spellings of both versions, so the
//! A2A client (ours, talking to remote agents of either version) reuses them as they are.
//!
//! Why our own serde types rather than a crate: the a2aproject's `a2a-lf` 0.4 is lean (its few
//! dependencies are already in our tree) and maintained, but it models v1.0 only, so the v0.3
//! method names we must also serve (and the v0.3 agents our client must talk to) would need a
//! second set of types anyway, and it has no OpenAPI schemas; `a2a-rs` (another author) pulls its
//! own HTTP stack and needs a newer compiler than ours. The part of the protocol we use is a few
//! hundred lines, written once here for both versions.
//!
//! By concept: [`Version`] and the header naming it (`version.rs`), messages and their parts
//! (`message.rs`), tasks with their states, artifacts and the stream items that report them
//! (`task.rs`), and the parameters and answers of the methods (`params.rs`).

mod message;
mod params;
mod task;
mod version;

use serde::Serialize;
use serde_json::{Map, Value};

pub use message::{Message, Part, PartContent, PartError, Role};
pub use params::{
    ListTasksParams, ListTasksResponse, SendMessageConfiguration, SendMessageParams, TaskIdParams,
};
pub use task::{
    Artifact, StreamItemError, StreamResponse, Task, TaskArtifactUpdateEvent, TaskState,
    TaskStatus, TaskStatusUpdateEvent,
};
pub use version::{VERSION_HEADER, Version};

/// Serialize `value` (a struct) into its JSON object.
fn to_object<T: Serialize>(value: &T) -> Map<String, Value> {
    match serde_json::to_value(value) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn states_are_spelled_per_version_and_read_in_both() {
        assert_eq!(
            serde_json::to_value(TaskState::InputRequired).unwrap(),
            "TASK_STATE_INPUT_REQUIRED"
        );
        assert_eq!(
            TaskState::InputRequired.wire(Version::V03),
            "input-required"
        );
        for s in TaskState::ALL {
            for v in [Version::V1, Version::V03] {
                assert_eq!(TaskState::parse(s.wire(v)), Some(s));
            }
        }
        assert_eq!(TaskState::parse("running"), None);
    }

    #[test]
    fn parts_read_both_shapes_and_write_each() {
        let v1 = json!({"text": "hi"});
        let v03 = json!({"kind": "text", "text": "hi"});
        assert_eq!(Part::from_wire(&v1).unwrap(), Part::text("hi"));
        assert_eq!(Part::from_wire(&v03).unwrap(), Part::text("hi"));
        assert_eq!(Part::text("hi").to_wire(Version::V1), v1);
        assert_eq!(Part::text("hi").to_wire(Version::V03), v03);
        let data = Part::data(json!({"a": 1}));
        assert_eq!(
            data.to_wire(Version::V03),
            json!({"kind": "data", "data": {"a": 1}})
        );
        let file =
            json!({"kind": "file", "file": {"uri": "http://x/y.png", "mimeType": "image/png"}});
        let p = Part::from_wire(&file).unwrap();
        assert_eq!(p.content, PartContent::Url("http://x/y.png".into()));
        assert_eq!(
            p.to_wire(Version::V1),
            json!({"url": "http://x/y.png", "mediaType": "image/png"})
        );
        assert!(Part::from_wire(&json!({"text": "a", "data": {}})).is_err());
        assert!(Part::from_wire(&json!({})).is_err());
        assert!(Part::from_wire(&json!({"kind": "video"})).is_err());
    }

    #[test]
    fn stream_items_are_wrapped_in_v1_and_kinded_in_v03() {
        let e = StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: "t".into(),
            context_id: "c".into(),
            status: TaskStatus {
                state: TaskState::Completed,
                message: None,
                timestamp: None,
            },
            metadata: None,
        });
        let v1 = e.to_wire(Version::V1);
        assert_eq!(
            v1["statusUpdate"]["status"]["state"],
            "TASK_STATE_COMPLETED"
        );
        let v03 = e.to_wire(Version::V03);
        assert_eq!(v03["kind"], "status-update");
        assert_eq!(v03["final"], true);
        assert_eq!(v03["status"]["state"], "completed");
        assert_eq!(StreamResponse::from_wire(&v1).unwrap(), e);
        assert_eq!(StreamResponse::from_wire(&v03).unwrap(), e);
    }

    #[test]
    fn blocking_is_the_default_of_both_versions() {
        let c = SendMessageConfiguration::default();
        assert!(c.blocking());
        let v1: SendMessageConfiguration =
            serde_json::from_value(json!({"returnImmediately": true})).unwrap();
        assert!(!v1.blocking());
        let v03: SendMessageConfiguration =
            serde_json::from_value(json!({"blocking": false})).unwrap();
        assert!(!v03.blocking());
    }

    #[test]
    fn versions_parse_without_patch_numbers() {
        assert_eq!(Version::parse("1.0"), Some(Version::V1));
        assert_eq!(Version::parse("1.0.2"), Some(Version::V1));
        assert_eq!(Version::parse("0.3.0"), Some(Version::V03));
        assert_eq!(Version::parse("0.2"), None);
        assert_eq!(Version::parse("2.0"), None);
        assert_eq!(Version::parse("x"), None);
    }
}
