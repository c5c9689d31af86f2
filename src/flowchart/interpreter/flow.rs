//! A `flow` stage: its sub-flow runs as a frame of its own, in a fresh state, its steps nested
//! under the stage's step, which is committed after them with the sub-flow's result. Replaying,
//! a finished sub-flow is skipped whole, and one cut short resumes on the version it started with.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::steps::{as_map, path_of, recorded_error};
use super::{FlowCall, FlowError, Frame, MAX_DEPTH};
use crate::flowchart::evidence::eval_args;

impl FlowCall<'_> {
    /// A `flow` stage: the sub-flow runs in a fresh state, its steps nested under this stage's
    /// observation, which is committed once it ends with the sub-flow's result as its write
    /// (or, when it failed, with its error and the failed stage as `errorStage`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_flow(
        &mut self,
        frame: &mut Frame,
        key: &str,
        step: u32,
        iteration: u32,
        started: Instant,
        name: &str,
        args: &std::collections::BTreeMap<String, Value>,
        output: &str,
    ) -> Result<(), FlowError> {
        // Replaying: when this stage's own step is in the log, its sub-flow had finished (its
        // steps come before it): take the committed result (or error) and skip them all.
        if let Some(i) = self
            .replay
            .iter()
            .position(|r| r.content["step"] == step && path_of(&r.content) == key)
        {
            let rec = self.replay.drain(..=i).next_back().expect("at least one");
            if let Some(e) = recorded_error(&rec.content, key) {
                return Err(e);
            }
            frame.state.extend(as_map(&rec.content["writes"]));
            let last = rec.content["lastStep"].as_u64().unwrap_or(u64::from(step));
            self.steps = self.steps.max(u32::try_from(last).unwrap_or(step));
            return Ok(());
        }
        // Else, when its sub-flow's first step is next, the sub-flow resumes on the version
        // it started with, under the same observation.
        let first_child = self
            .replay
            .front()
            .filter(|r| r.content["parentStep"] == step)
            .cloned();
        let id = first_child
            .as_ref()
            .and_then(|r| r.parent_id.as_deref())
            .and_then(|p| p.parse::<Uuid>().ok())
            .unwrap_or_else(Uuid::now_v7);
        let data = frame.data();
        let (call_args, reads) = eval_args(&self.limits.expr, args, &data).await;
        let mut extra = Map::new();
        extra.insert("reads".into(), Value::Object(reads));
        let call_args = match call_args {
            Ok(a) => a,
            Err(e) => {
                return Err(self
                    .failed_flow(
                        frame, id, key, step, iteration, started, extra, key, e.message,
                    )
                    .await);
            }
        };
        if frame.depth + 1 > MAX_DEPTH {
            let message = format!("sub-flows nest deeper than {MAX_DEPTH} (calling `{name}`)");
            return Err(self
                .failed_flow(
                    frame, id, key, step, iteration, started, extra, key, message,
                )
                .await);
        }
        let version = first_child
            .as_ref()
            .and_then(|r| r.content["version"].as_i64());
        let record = match self.host.load(name, version).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                let message = format!("the flowchart `{name}` does not exist");
                return Err(self
                    .failed_flow(
                        frame, id, key, step, iteration, started, extra, key, message,
                    )
                    .await);
            }
            Err(message) => {
                return Err(FlowError {
                    stage: key.to_owned(),
                    message,
                });
            }
        };
        let child = Frame {
            record: Arc::new(record),
            args: Value::Object(call_args.clone()),
            state: Map::new(),
            parent: Some(id.to_string()),
            // A flow stage that runs again (in a loop) gives its sub-flow's stages new keys.
            prefix: if iteration == 1 {
                format!("{key}/")
            } else {
                format!("{key}[{iteration}]/")
            },
            depth: frame.depth + 1,
            parent_step: Some(step),
        };
        let (sub_name, sub_version) = (child.record.name.clone(), child.record.version);
        let result = match self.run_frame(child).await {
            Ok(v) => v,
            // Paused for a person: nothing of this stage is committed yet.
            Err(e) if self.paused.is_some() => return Err(e),
            Err(e) => {
                return Err(self
                    .failed_flow(
                        frame, id, key, step, iteration, started, extra, &e.stage, e.message,
                    )
                    .await);
            }
        };
        let writes = Map::from_iter([(output.to_owned(), result)]);
        frame.state.extend(writes.clone());
        extra.insert("writes".into(), Value::Object(writes));
        extra.insert("args".into(), Value::Object(call_args));
        extra.insert(
            "subFlowchart".into(),
            json!({"name": sub_name, "version": sub_version}),
        );
        extra.insert("lastStep".into(), json!(self.steps));
        self.commit(frame, id, key, "flow", step, iteration, started, extra)
            .await
    }

    /// Commit a `flow` stage's step with the error that ended it: `stage` is where it failed
    /// (this stage, or a stage of its sub-flow, then kept as `errorStage`).
    #[allow(clippy::too_many_arguments)]
    async fn failed_flow(
        &self,
        frame: &Frame,
        id: Uuid,
        key: &str,
        step: u32,
        iteration: u32,
        started: Instant,
        mut extra: Map<String, Value>,
        stage: &str,
        message: String,
    ) -> FlowError {
        extra.insert("error".into(), json!(message));
        if stage != key {
            extra.insert("errorStage".into(), json!(stage));
        }
        if let Err(e) = self
            .commit(frame, id, key, "flow", step, iteration, started, extra)
            .await
        {
            return e;
        }
        FlowError {
            stage: stage.to_owned(),
            message,
        }
    }
}
