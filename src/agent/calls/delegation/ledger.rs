//! The state of a run's delegations, read from its log in one place. The log is the only record
//! of a remote task (there is no table of them): a delegation's `TOOL_CALL`, the
//! `A2A_TASK_UPDATE`s committed under it (the first names the task; later ones report progress,
//! an answer `forwarded` to the remote, and how the call `settled`), and the `TOOL_EXECUTION`
//! that answers it. The call itself, the watcher of a parked run, the cancel of a run, and the
//! thread's state all read this one ledger.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::a2a::client::agents::DELEGATE_TOOL;
use crate::model::payloads::{A2aTaskUpdateContent, ToolCallContent, ToolExecutionContent};
use crate::model::{Observation, ObservationType};

/// One delegation as its log records it.
#[derive(Debug, Clone)]
pub struct DelegationRecord {
    /// The model's id of the call.
    pub call_id: String,
    /// The item that delegates (named by its first update).
    pub item_id: Option<String>,
    /// The remote agent (named by its first update).
    pub agent: Option<String>,
    /// The remote task, once its first update recorded it.
    pub task_id: Option<String>,
    /// When the task was recorded.
    pub submitted_at: Option<DateTime<Utc>>,
    /// The call's `TOOL_CALL` observation: its updates nest under it.
    pub parent: Option<String>,
    /// The suspensions whose answer was forwarded to the remote, in order.
    pub forwarded: Vec<String>,
    /// How the call settled (`{result}`, `{error}` or `{question}`), when that came after the last
    /// answer forwarded: the call, resumed, reads it instead of asking the remote again.
    pub settled: Option<Value>,
    /// Whether the call has its tool result (a `TOOL_EXECUTION`).
    pub answered: bool,
}

impl DelegationRecord {
    /// A call the log shows nothing of yet.
    pub fn new(call_id: &str) -> Self {
        Self {
            call_id: call_id.to_owned(),
            item_id: None,
            agent: None,
            task_id: None,
            submitted_at: None,
            parent: None,
            forwarded: vec![],
            settled: None,
            answered: false,
        }
    }
}

/// Every delegation a log shows, in the order their first record was committed.
#[derive(Debug, Default)]
pub struct DelegationLedger {
    calls: Vec<DelegationRecord>,
}

impl DelegationLedger {
    /// The observation types the ledger reads (pass any subset: what is not read is not known).
    pub const TYPES: [ObservationType; 3] = [
        ObservationType::ToolCall,
        ObservationType::A2aTaskUpdate,
        ObservationType::ToolExecution,
    ];

    /// Read the delegations of `log` (observations in `seq` order; other types are ignored).
    pub fn read<'a>(log: impl IntoIterator<Item = &'a Observation>) -> Self {
        let mut ledger = Self::default();
        for o in log {
            if let Some(c) = o.payload::<ToolCallContent>() {
                if c.name == DELEGATE_TOOL {
                    ledger.entry(&c.tool_call_id).parent = Some(o.id.to_string());
                }
            } else if let Some(c) = o.payload::<ToolExecutionContent>() {
                if let Some(r) = ledger
                    .calls
                    .iter_mut()
                    .find(|r| r.call_id == c.tool_call_id)
                {
                    r.answered = true;
                }
            } else if let Some(c) = o.payload::<A2aTaskUpdateContent>() {
                let r = ledger.entry(&c.tool_call_id);
                if r.task_id.is_none()
                    && let Some(task) = c.task_id
                {
                    r.task_id = Some(task);
                    r.submitted_at = Some(o.created_at);
                    r.item_id = c.item_id.map(|i| i.to_string());
                    r.agent = Some(c.agent);
                    r.parent = r.parent.take().or_else(|| o.parent_id.clone());
                }
                if let Some(sid) = c.forwarded {
                    r.forwarded.push(sid.to_string());
                    r.settled = None;
                }
                if let Some(settled) = c.settled.filter(Value::is_object) {
                    r.settled = Some(settled);
                }
            }
        }
        ledger
    }

    fn entry(&mut self, call: &str) -> &mut DelegationRecord {
        if let Some(i) = self.calls.iter().position(|r| r.call_id == call) {
            return &mut self.calls[i];
        }
        self.calls.push(DelegationRecord::new(call));
        self.calls.last_mut().expect("just pushed")
    }

    /// The delegation of call `id`, if the log shows it.
    pub fn call(&self, id: &str) -> Option<&DelegationRecord> {
        self.calls.iter().find(|r| r.call_id == id)
    }

    /// The delegations whose remote task is recorded and that have no tool result yet, in the
    /// order they were sent.
    pub fn unanswered(&self) -> impl Iterator<Item = &DelegationRecord> {
        self.calls
            .iter()
            .filter(|r| r.task_id.is_some() && !r.answered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obs(seq: i64, kind: ObservationType, parent: Option<&str>, content: Value) -> Observation {
        Observation {
            id: uuid::Uuid::now_v7(),
            seq,
            thread_id: crate::model::ThreadId::parse("t").expect("an id"),
            tenant: String::new(),
            run_id: None,
            parent_id: parent.map(str::to_owned),
            kind,
            title: String::new(),
            content,
            created_at: Utc::now(),
        }
    }

    /// A suspension's id, as a forwarded answer names it.
    const FORWARDED: &str = "01a22374-5df4-7353-9ed0-0708cd5efbcc";

    #[test]
    fn settles_forwards_and_answers_in_log_order() {
        let call = obs(
            1,
            ObservationType::ToolCall,
            Some("step-1"),
            json!({"toolCallId": "c1", "name": DELEGATE_TOOL, "arguments": {}}),
        );
        let parent = call.id.to_string();
        let log = vec![
            call,
            obs(
                2,
                ObservationType::ToolCall,
                Some("step-1"),
                json!({"toolCallId": "c2", "name": "calculator", "arguments": {}}),
            ),
            obs(
                3,
                ObservationType::A2aTaskUpdate,
                Some(&parent),
                json!({"toolCallId": "c1", "taskId": "T", "agent": "a", "itemId": "step-1", "state": "working"}),
            ),
            obs(
                4,
                ObservationType::A2aTaskUpdate,
                Some(&parent),
                json!({"toolCallId": "c1", "agent": "a", "taskId": "T", "settled": {"question": "why?"}}),
            ),
            obs(
                5,
                ObservationType::A2aTaskUpdate,
                Some(&parent),
                json!({"toolCallId": "c1", "agent": "a", "taskId": "T", "forwarded": FORWARDED}),
            ),
        ];
        let ledger = DelegationLedger::read(&log);
        let r = ledger.call("c1").expect("recorded");
        assert_eq!(r.task_id.as_deref(), Some("T"));
        assert_eq!(r.parent.as_deref(), Some(parent.as_str()));
        assert_eq!(r.forwarded, [FORWARDED]);
        assert!(
            r.settled.is_none(),
            "an answer forwarded after it settled reopens it"
        );
        assert!(
            ledger.call("c2").is_none(),
            "only delegations are in the ledger"
        );
        assert_eq!(ledger.unanswered().count(), 1);

        let mut log = log;
        log.push(obs(
            6,
            ObservationType::A2aTaskUpdate,
            Some(&parent),
            json!({"toolCallId": "c1", "agent": "a", "taskId": "T", "settled": {"result": 1}}),
        ));
        log.push(obs(
            7,
            ObservationType::ToolExecution,
            Some("step-1"),
            json!({"toolCallId": "c1", "name": DELEGATE_TOOL, "status": "success", "output": 1,
                   "error": null}),
        ));
        let ledger = DelegationLedger::read(&log);
        assert_eq!(
            ledger.call("c1").and_then(|r| r.settled.clone()),
            Some(json!({"result": 1}))
        );
        assert_eq!(ledger.unanswered().count(), 0);
    }
}
