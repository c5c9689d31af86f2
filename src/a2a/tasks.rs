//! Runs seen as A2A tasks: `taskId` = runId, `contextId` = threadId. [`task_of_run`] reads a task
//! off its run row (`GetTask`, `ListTasks`, a blocking `SendMessage`); [`TaskFold`] builds the same
//! task from the run's observation log, one observation at a time, and says which stream events
//! each observation stands for, so a stream is the log replayed and nothing else.
//!
//! Status mapping: queued → submitted (working again once it has started: a resumed run waits in
//! the queue), running → working, suspended → input-required (the suspension's question as the
//! status message), completed → completed (the final response as the `response` artifact),
//! failed → failed (the error as the status message), cancelled → canceled.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Map, Value, json};

use super::types::{
    Artifact, Message, Part, Role, StreamResponse, Task, TaskArtifactUpdateEvent, TaskState,
    TaskStatus, TaskStatusUpdateEvent,
};
use crate::model::payloads::{
    AgentResumedContent, AgentSuspendedContent, RunFailedContent, RunSuspendedContent,
};
use crate::model::{Observation, ObservationType, Run, RunStatus};
use serde::Deserialize;

/// The id of the artifact that holds a run's final response.
pub const RESPONSE_ARTIFACT: &str = "response";

/// RFC 3339 with milliseconds, UTC (`…Z`), as the spec asks.
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The task state of a run.
pub fn state_of_run(run: &Run) -> TaskState {
    match run.status {
        RunStatus::Queued if run.started_at.is_some() => TaskState::Working,
        RunStatus::Queued => TaskState::Submitted,
        RunStatus::Running => TaskState::Working,
        RunStatus::Suspended => TaskState::InputRequired,
        RunStatus::Completed => TaskState::Completed,
        RunStatus::Failed => TaskState::Failed,
        RunStatus::Cancelled => TaskState::Canceled,
    }
}

/// The run statuses of a task state, for `ListTasks`: the statuses, and for `queued` whether the
/// run has started before (`None`: either).
pub fn statuses_of_state(state: TaskState) -> (Vec<RunStatus>, Option<bool>) {
    match state {
        TaskState::Submitted => (vec![RunStatus::Queued], Some(false)),
        TaskState::Working => (vec![RunStatus::Running, RunStatus::Queued], Some(true)),
        TaskState::InputRequired => (vec![RunStatus::Suspended], None),
        TaskState::Completed => (vec![RunStatus::Completed], None),
        TaskState::Failed => (vec![RunStatus::Failed], None),
        TaskState::Canceled => (vec![RunStatus::Cancelled], None),
        TaskState::Rejected | TaskState::AuthRequired | TaskState::Unspecified => (vec![], None),
    }
}

/// The agent's question for a suspension (`AGENT_SUSPENDED` content, or a run's `suspension`):
/// a text part a person can read, and a data part with what a program needs (the suspension id,
/// kind, tool call, allowed decisions, input schema). Answering it is a message with the task's
/// id: its data (or text) becomes the suspended call's result (`respond`).
pub fn suspension_message(task_id: &str, context_id: &str, s: &AgentSuspendedContent) -> Message {
    let question = match &s.question {
        Some(q) => q.clone(),
        None => format!(
            "Approval needed: the agent wants to call `{}` with {}. Reply to this task: your \
             message becomes the call's result instead (to approve, edit or reject the call \
             itself, use the pes-server API's suspension {}).",
            s.tool_call.name, s.tool_call.arguments, s.suspension_id
        ),
    };
    // The suspension's fields but its question (the text part says it), nulls left out.
    let mut details = match serde_json::to_value(s) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    details.remove("question");
    details.retain(|_, v| !v.is_null());
    let id = s.suspension_id.to_string();
    let mut m = Message::agent(
        id,
        vec![
            Part::text(question),
            Part::data(json!({"suspension": details})),
        ],
    );
    m.task_id = Some(task_id.to_owned());
    m.context_id = Some(context_id.to_owned());
    m
}

/// The status message of a failed run: its error.
fn failure_message(task_id: &str, context_id: &str, error: &Value) -> Message {
    let text = error["message"].as_str().unwrap_or("the run failed");
    let mut m = Message::agent(
        format!("{task_id}-error"),
        vec![Part::text(text), Part::data(json!({"error": error}))],
    );
    m.task_id = Some(task_id.to_owned());
    m.context_id = Some(context_id.to_owned());
    m
}

/// The artifact of a final response `{response, sources, suggestions}`: the answer as text, and
/// the sources and suggestions as data.
pub fn response_artifact(final_response: &Value) -> Artifact {
    let text = final_response["response"].as_str().unwrap_or_default();
    let sources = final_response.get("sources").cloned().unwrap_or(json!([]));
    let suggestions = final_response
        .get("suggestions")
        .cloned()
        .unwrap_or(json!([]));
    Artifact {
        artifact_id: RESPONSE_ARTIFACT.into(),
        name: Some("response".into()),
        description: Some("The agent's final answer, with its sources and suggestions".into()),
        parts: vec![
            Part::text(text),
            Part::data(json!({"sources": sources, "suggestions": suggestions})),
        ],
        metadata: None,
    }
}

/// The user's query as the task's history.
fn history_of(
    run: &Run,
    task_id: &str,
    context_id: &str,
    length: Option<i64>,
) -> Option<Vec<Message>> {
    if length == Some(0) {
        return None;
    }
    let mut m = Message::agent(format!("{task_id}-query"), vec![Part::text(&run.query)]);
    m.role = Role::User;
    m.task_id = Some(task_id.to_owned());
    m.context_id = Some(context_id.to_owned());
    Some(vec![m])
}

/// The task a run is, read off its row. `history_length` 0 leaves the history out; artifacts
/// are left out unless `with_artifacts`.
pub fn task_of_run(run: &Run, history_length: Option<i64>, with_artifacts: bool) -> Task {
    let task_id = run.run_id.to_string();
    let context_id = run.thread_id.to_string();
    let state = state_of_run(run);
    let message = match state {
        TaskState::InputRequired => run
            .suspension
            .as_ref()
            .and_then(|s| AgentSuspendedContent::deserialize(s).ok())
            .map(|s| suspension_message(&task_id, &context_id, &s)),
        TaskState::Failed => run.error.as_ref().map(|e| {
            failure_message(
                &task_id,
                &context_id,
                &json!({"code": e.code, "message": e.message}),
            )
        }),
        _ => None,
    };
    let changed = run.ended_at.or(run.started_at).unwrap_or(run.created_at);
    let artifacts = with_artifacts.then(|| {
        run.final_response
            .iter()
            .map(response_artifact)
            .collect::<Vec<_>>()
    });
    Task {
        history: history_of(run, &task_id, &context_id, history_length),
        id: task_id,
        context_id,
        status: TaskStatus {
            state,
            message,
            timestamp: Some(timestamp(changed)),
        },
        artifacts,
        metadata: Some(metadata(run)),
    }
}

fn metadata(run: &Run) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "pes".into(),
        json!({"runStatus": run.status, "threadId": run.thread_id, "runId": run.run_id}),
    );
    m
}

/// Observations whose progress a stream reports as a `working` status update (with the
/// observation's title as the message): the tree's main steps, not every thought.
fn reports_progress(kind: ObservationType) -> bool {
    matches!(
        kind,
        ObservationType::RunStarted
            | ObservationType::Plan
            | ObservationType::PlanUpdate
            | ObservationType::ItemStatusChange
            | ObservationType::ToolCall
            | ObservationType::ToolExecution
            | ObservationType::AgentResumed
            | ObservationType::Synthesis
            | ObservationType::Error
    )
}

/// A task built from its run's observation log. Feed it the run's observations in `seq` order;
/// each answers the stream events it stands for.
#[derive(Debug, Clone)]
pub struct TaskFold {
    run: Run,
    task_id: String,
    context_id: String,
    state: TaskState,
    message: Option<Message>,
    changed: DateTime<Utc>,
    artifact: Option<Artifact>,
    /// Suspensions announced and not yet resumed: `(suspensionId, AGENT_SUSPENDED content)`.
    pending: Vec<AgentSuspendedContent>,
}

impl TaskFold {
    /// The task of `run` before any of its observations: submitted.
    pub fn new(run: &Run) -> Self {
        Self {
            task_id: run.run_id.to_string(),
            context_id: run.thread_id.to_string(),
            state: TaskState::Submitted,
            message: None,
            changed: run.created_at,
            artifact: None,
            pending: Vec::new(),
            run: run.clone(),
        }
    }

    /// Nothing more will be streamed: the task ended or waits for input.
    pub fn finished(&self) -> bool {
        self.state.is_final()
    }

    /// The task as the observations so far make it.
    pub fn task(&self) -> Task {
        Task {
            id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            status: self.status(),
            artifacts: self.artifact.clone().map(|a| vec![a]),
            history: history_of(&self.run, &self.task_id, &self.context_id, None),
            metadata: Some(metadata(&self.run)),
        }
    }

    fn status(&self) -> TaskStatus {
        TaskStatus {
            state: self.state,
            message: self.message.clone(),
            timestamp: Some(timestamp(self.changed)),
        }
    }

    fn status_event(&self, extra: Option<&Observation>) -> StreamResponse {
        StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            status: self.status(),
            metadata: extra.map(observation_metadata),
        })
    }

    /// Apply one observation of the run; the events a stream sends for it.
    pub fn apply(&mut self, o: &Observation) -> Vec<StreamResponse> {
        if o.run_id != Some(self.run.run_id) {
            return Vec::new();
        }
        self.changed = o.created_at;
        match o.kind {
            ObservationType::AgentSuspended => {
                self.pending.extend(o.payload::<AgentSuspendedContent>());
                Vec::new()
            }
            ObservationType::RunSuspended => {
                let waits_on = o
                    .payload::<RunSuspendedContent>()
                    .map(|c| c.suspension_ids)
                    .unwrap_or_default();
                let first = self
                    .pending
                    .iter()
                    .find(|s| waits_on.is_empty() || waits_on.contains(&s.suspension_id));
                self.state = TaskState::InputRequired;
                self.message =
                    first.map(|s| suspension_message(&self.task_id, &self.context_id, s));
                vec![self.status_event(Some(o))]
            }
            ObservationType::FinalResponse => {
                let artifact = response_artifact(&o.content);
                self.artifact = Some(artifact.clone());
                vec![StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
                    task_id: self.task_id.clone(),
                    context_id: self.context_id.clone(),
                    artifact,
                    append: Some(false),
                    last_chunk: Some(true),
                    metadata: Some(observation_metadata(o)),
                })]
            }
            ObservationType::RunCompleted => self.end(TaskState::Completed, None, o),
            ObservationType::RunFailed => {
                let error = o
                    .payload::<RunFailedContent>()
                    .and_then(|c| serde_json::to_value(c.error).ok())
                    .unwrap_or(Value::Null);
                let m = failure_message(&self.task_id, &self.context_id, &error);
                self.end(TaskState::Failed, Some(m), o)
            }
            ObservationType::RunCancelled => self.end(TaskState::Canceled, None, o),
            kind => {
                if let Some(resumed) = o.payload::<AgentResumedContent>() {
                    self.pending
                        .retain(|p| p.suspension_id != resumed.suspension_id);
                }
                if !reports_progress(kind) {
                    return Vec::new();
                }
                self.state = TaskState::Working;
                let mut m = Message::agent(o.id.to_string(), vec![Part::text(&o.title)]);
                m.task_id = Some(self.task_id.clone());
                m.context_id = Some(self.context_id.clone());
                self.message = Some(m);
                vec![self.status_event(Some(o))]
            }
        }
    }

    fn end(
        &mut self,
        state: TaskState,
        message: Option<Message>,
        o: &Observation,
    ) -> Vec<StreamResponse> {
        self.state = state;
        self.message = message;
        vec![self.status_event(Some(o))]
    }
}

/// Where an event comes from in the observation log: `{"pes": {seq, type, observationId,
/// parentId}}`, so a client can relate it to the run's tree (and resume after `seq`).
fn observation_metadata(o: &Observation) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "pes".into(),
        json!({"seq": o.seq, "type": o.kind, "observationId": o.id, "parentId": o.parent_id}),
    );
    m
}
