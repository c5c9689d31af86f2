//! A call's steps in the log: committing one (`FLOWCHART_STEP`, with what it read, what it
//! wrote and the evidence of a decision, bounded per value and per call), committing the step of
//! a stage that failed so it never runs again, and reading a committed step back for replay.

use std::time::Instant;

use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::{FlowCall, FlowError, Frame, Recorded, StepRecord};

/// A value read by a stage is kept in its step whole up to this many bytes of JSON; a larger one
/// is shown as a marker. What a step *reads* is there for people; what it *writes* is kept whole,
/// since replay rebuilds the state from it.
const READ_KEPT_BYTES: usize = 2048;

/// `value` with every part larger than [`READ_KEPT_BYTES`] of JSON replaced by a marker saying
/// how large it was.
fn shrink_reads(value: &mut Value) {
    let size = value.to_string().len();
    if size <= READ_KEPT_BYTES {
        return;
    }
    match value {
        Value::Object(m) => m.values_mut().for_each(shrink_reads),
        Value::Array(a) if a.len() <= 64 => a.iter_mut().for_each(shrink_reads),
        _ => *value = json!(format!("…[{size} bytes: not kept in the step]")),
    }
}

impl FlowCall<'_> {
    /// The most bytes of step content one call may write to the log (all its steps, sub-flows
    /// included): 32 values of the largest size a stage may write. A loop that writes large
    /// values over and over ends as a stage error instead of filling the database.
    fn max_log_bytes(&self) -> usize {
        self.limits.expr.limits().max_value_bytes.saturating_mul(32)
    }

    /// The committed record of this step, when the call is replaying. A step committed with an
    /// error ends the call again with that error: a stage that failed (or passed a limit) is
    /// never run again.
    pub(super) fn recorded(&mut self, key: &str, step: u32) -> Result<Option<Recorded>, FlowError> {
        let Some(head) = self.replay.front() else {
            return Ok(None);
        };
        if head.content["step"] != step {
            return Ok(None);
        }
        let rec = self.replay.pop_front().expect("a head");
        if path_of(&rec.content) != key {
            return Err(FlowError {
                stage: key.to_owned(),
                message: format!(
                    "the committed steps do not follow this flowchart (step {step} was `{}`)",
                    path_of(&rec.content)
                ),
            });
        }
        if let Some(e) = recorded_error(&rec.content, key) {
            return Err(e);
        }
        Ok(Some(rec))
    }

    /// Commit the step of a stage that failed, with `message` as its `error` (and what it had
    /// read, in `extra`), and the error that ends the call. The commit is what keeps a resumed
    /// call (after a crash, on another replica) from running the stage again.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn failed(
        &self,
        frame: &Frame,
        key: &str,
        kind: &str,
        step: u32,
        iteration: u32,
        started: Instant,
        mut extra: Map<String, Value>,
        message: String,
    ) -> FlowError {
        extra.insert("error".into(), json!(message));
        if let Err(e) = self
            .commit(
                frame,
                Uuid::now_v7(),
                key,
                kind,
                step,
                iteration,
                started,
                extra,
            )
            .await
        {
            return e;
        }
        FlowError {
            stage: key.to_owned(),
            message,
        }
    }

    /// Commit a step.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn commit(
        &self,
        frame: &Frame,
        id: Uuid,
        key: &str,
        kind: &str,
        step: u32,
        iteration: u32,
        started: Instant,
        mut extra: Map<String, Value>,
    ) -> Result<(), FlowError> {
        let mut content = Map::new();
        content.insert("flowchart".into(), json!(frame.record.name));
        content.insert("version".into(), json!(frame.record.version));
        // The stage's own id in its own flowchart; inside a sub-flow, `path` is how the call
        // reaches it (`<flow stage>/<stage>`), unique within the call.
        let own = key.strip_prefix(frame.prefix.as_str()).unwrap_or(key);
        content.insert("stage".into(), json!(own));
        if own != key {
            content.insert("path".into(), json!(key));
        }
        content.insert("kind".into(), json!(kind));
        content.insert("iteration".into(), json!(iteration));
        content.insert("step".into(), json!(step));
        content.insert("toolCallId".into(), json!(self.tool_call_id));
        if let Some(p) = frame.parent_step {
            content.insert("parentStep".into(), json!(p));
        }
        content.insert(
            "durationMs".into(),
            json!(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)),
        );
        for k in ["reads", "writes"] {
            content.insert(k.into(), extra.remove(k).unwrap_or_else(|| json!({})));
        }
        content.extend(extra);
        if let Some(reads) = content.get_mut("reads") {
            shrink_reads(reads);
        }
        if let Some(rules) = content
            .get_mut("decision")
            .and_then(|d| d.get_mut("rules"))
            .and_then(Value::as_array_mut)
        {
            for rule in rules {
                if let Some(inputs) = rule.get_mut("inputs") {
                    shrink_reads(inputs);
                }
            }
        }
        let size = serde_json::to_vec(&content).map_or(0, |v| v.len());
        let logged = self
            .logged
            .load(std::sync::atomic::Ordering::Relaxed)
            .saturating_add(size);
        if logged > self.max_log_bytes() {
            return Err(FlowError {
                stage: key.to_owned(),
                message: format!(
                    "the call's steps would take {logged} bytes in the log, more than {} \
                     (32 × PES_FLOWCHART_MAX_VALUE_BYTES)",
                    self.max_log_bytes()
                ),
            });
        }
        self.logged
            .store(logged, std::sync::atomic::Ordering::Relaxed);
        self.host
            .commit_step(StepRecord {
                id,
                parent_id: frame.parent.clone(),
                title: format!("{}: {own} ({kind})", frame.record.name),
                content: Value::Object(content),
            })
            .await
            .map_err(|m| FlowError {
                stage: key.to_owned(),
                message: format!("its step could not be committed: {m}"),
            })
    }
}

/// Where a committed step's stage is in the call: its `path` inside a sub-flow, else its
/// `stage` (steps committed before `path` existed have the path in `stage`).
pub(super) fn path_of(content: &Value) -> &Value {
    match &content["path"] {
        Value::Null => &content["stage"],
        path => path,
    }
}

/// The error a committed step ended the call with, if it did (`errorStage` when the error was
/// a sub-flow's, naming its stage).
pub(super) fn recorded_error(content: &Value, key: &str) -> Option<FlowError> {
    let message = content["error"].as_str()?;
    Some(FlowError {
        stage: content["errorStage"].as_str().unwrap_or(key).to_owned(),
        message: message.to_owned(),
    })
}

pub(super) fn as_map(v: &Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}
