//! One steering message of a run and what a model call reads of them: the data the run's
//! context holds (`journal.rs`), below the behaviour that reads them again and refines the plan
//! for them (`steering.rs`).

use uuid::Uuid;

use crate::llm::ChatMessage;
use crate::model::{Message, MessageRole};

/// The `name` of a user message that steers a run (beside the run's own query).
pub const STEERING_NAME: &str = "steering";

/// The steering messages a model call reads at most: the latest ones. A run takes at most
/// `PES_MAX_STEERS_PER_RUN` messages; a prompt stays small whatever that is.
pub const STEERING_IN_PROMPT: usize = 10;

/// The latest [`STEERING_IN_PROMPT`] of `steering`, as prompt lines.
pub(super) fn latest_lines(steering: &[Steer]) -> Vec<String> {
    let skip = steering.len().saturating_sub(STEERING_IN_PROMPT);
    steering[skip..]
        .iter()
        .map(|s| format!("- {}", s.text))
        .collect()
}

/// One steering message of the run.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Steer {
    pub(super) id: Uuid,
    pub(super) text: String,
    /// The planner took it in.
    pub(super) planned: bool,
}

/// The steering messages of run `run_id` among the thread's recent messages.
pub(super) fn from_messages(messages: &[Message], run_id: Uuid) -> Vec<Steer> {
    messages
        .iter()
        .filter(|m| {
            m.run_id == Some(run_id)
                && m.role == MessageRole::User
                && m.name.as_deref() == Some(STEERING_NAME)
        })
        .map(|m| Steer {
            id: m.id,
            text: m.content.clone(),
            planned: false,
        })
        .collect()
}

/// What an item's model call reads of the steering: one user message, after its conversation.
pub(super) fn note(steering: &[Steer]) -> Option<ChatMessage> {
    if steering.is_empty() {
        return None;
    }
    let lines = latest_lines(steering);
    Some(ChatMessage::user(format!(
        "The person who asked this steered the run while it worked; follow it:\n{}",
        lines.join("\n")
    )))
}
