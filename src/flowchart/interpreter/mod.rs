//! Running one flowchart call: a fresh state, the stages walked from `start`, each executed
//! stage committed as a `FLOWCHART_STEP` (what it read, what it wrote, the evidence of a
//! decision) before the next one runs. Where the call resumes after a crash, the committed steps
//! are replayed in order: their writes rebuild the state and their decisions pick the same way,
//! and none of them runs again; execution goes on from the first stage with no committed step.
//! A stage that fails (its expression, its tool, a bound of §7.1) commits its step with the
//! error; replayed, that step ends the call with the same error, so the stage never runs again.
//!
//! Expressions run through the call's [`super::expr::Evaluator`], off the runtime's threads and
//! under its bounds; every value a stage writes, and the call's result, is at most
//! `PES_FLOWCHART_MAX_VALUE_BYTES`. A step inside a sub-flow names the sub-flow (`flowchart`)
//! and its own stage (`stage`); its `path` (`<flow stage>/<stage>`) is unique within the call
//! and is what replay matches.
//!
//! What the call needs from the run it serves (tools, the model, stored flowcharts, the
//! journal) comes through [`FlowHost`], so the walk itself is plain code over JSON.
//!
//! The walk itself, a call's frames and its bounds are here; `stages.rs` runs one stage of each
//! kind, `flow.rs` a `flow` stage's sub-flow, and `steps.rs` commits a step to the log and reads
//! it back for replay.

mod flow;
mod stages;
mod steps;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::expr;
pub use super::host::{FlowError, FlowHost, FlowLimits, Gate, MAX_DEPTH, Paused, StepRecord};
use super::model::FlowchartRecord;
use crate::model::{Observation, Usage};

/// A committed step read back for replay.
#[derive(Debug, Clone)]
struct Recorded {
    parent_id: Option<String>,
    content: Value,
}

/// How a chain of stages ended.
enum Ended {
    /// It reached a stage without `next`.
    Chain,
    /// An `end` stage: the call is over, with its result if it gave one.
    End(Option<Value>),
}

/// One flowchart's execution: its definition, arguments and state.
struct Frame {
    record: Arc<FlowchartRecord>,
    args: Value,
    state: Map<String, Value>,
    /// The observation the frame's steps nest under.
    parent: Option<String>,
    /// `""` at the top; `<flow stage path>/` inside a sub-flow (stage keys stay unique).
    prefix: String,
    depth: u32,
    /// The step number of the `flow` stage that runs this frame.
    parent_step: Option<u32>,
}

impl Frame {
    /// What its expressions read, `{args, state}` (shared with the threads that evaluate them).
    fn data(&self) -> Arc<Value> {
        Arc::new(json!({"args": self.args, "state": self.state}))
    }
}

/// A call in progress.
pub struct FlowCall<'h> {
    host: &'h dyn FlowHost,
    run_id: Uuid,
    tool_call_id: String,
    limits: FlowLimits,
    replay: VecDeque<Recorded>,
    steps: u32,
    executions: HashMap<String, u32>,
    usage: Usage,
    paused: Option<Paused>,
    /// Bytes of step content this call has in the log (replayed steps included), bounded by
    /// [`FlowCall::max_log_bytes`].
    logged: std::sync::atomic::AtomicUsize,
}

impl<'h> FlowCall<'h> {
    /// A call of the run `run_id`'s tool call `tool_call_id`, resuming after `committed` (the
    /// `FLOWCHART_STEP` observations of this call already in the log, in `seq` order).
    pub fn new(
        host: &'h dyn FlowHost,
        run_id: Uuid,
        tool_call_id: String,
        limits: FlowLimits,
        committed: Vec<Observation>,
    ) -> Self {
        let replay: VecDeque<Recorded> = committed
            .into_iter()
            .filter(|o| o.content["toolCallId"] == tool_call_id.as_str())
            .map(|o| Recorded {
                parent_id: o.parent_id,
                content: o.content,
            })
            .collect();
        let logged = replay.iter().map(|r| r.content.to_string().len()).sum();
        Self {
            host,
            run_id,
            tool_call_id,
            limits,
            replay,
            steps: 0,
            executions: HashMap::new(),
            usage: Usage::default(),
            paused: None,
            logged: std::sync::atomic::AtomicUsize::new(logged),
        }
    }

    /// Where the call paused for a person, when it ended that way (its `run` returned an
    /// error naming the stage; nothing of the stage was committed).
    pub fn paused(&self) -> Option<&Paused> {
        self.paused.as_ref()
    }

    /// Model usage of the call's `llm` stages.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Run `record` with `args` (already checked against its input schema); its steps nest
    /// under `parent` (the `TOOL_CALL` observation).
    ///
    /// # Errors
    /// [`FlowError`] naming the stage that failed or the limit reached.
    pub async fn run(
        &mut self,
        record: Arc<FlowchartRecord>,
        args: Value,
        parent: Option<String>,
    ) -> Result<Value, FlowError> {
        let frame = Frame {
            record,
            args,
            state: Map::new(),
            parent,
            prefix: String::new(),
            depth: 0,
            parent_step: None,
        };
        self.run_frame(frame).await
    }

    async fn run_frame(&mut self, mut frame: Frame) -> Result<Value, FlowError> {
        let start = frame.record.spec.flowchart.start.clone();
        match self.run_chain(&mut frame, &start).await? {
            // An `end` stage's result was checked as the value it writes.
            Ended::End(Some(result)) => Ok(result),
            Ended::End(None) | Ended::Chain => {
                let (stage, result) = match &frame.record.spec.result_mapper {
                    Some(mapper) => {
                        let stage = format!("{}resultMapper", frame.prefix);
                        match self.limits.expr.eval(mapper, &frame.data()).await {
                            Ok(v) => (stage, v),
                            Err(e) => {
                                return Err(FlowError {
                                    stage,
                                    message: e.message,
                                });
                            }
                        }
                    }
                    None => (
                        format!("{}result", frame.prefix),
                        Value::Object(frame.state.clone()),
                    ),
                };
                match self.oversize("the call's result", &result) {
                    Some(message) => Err(FlowError { stage, message }),
                    None => Ok(result),
                }
            }
        }
    }

    /// Why `value` (what `what` names) may not be written: larger than
    /// `PES_FLOWCHART_MAX_VALUE_BYTES`.
    fn oversize(&self, what: &str, value: &Value) -> Option<String> {
        let max = self.limits.expr.limits().max_value_bytes;
        if expr::json_size(value, max).is_some() {
            return None;
        }
        // How large, counted up to a few times the limit (the counting is the work).
        let far = max.saturating_mul(4);
        let size = expr::json_size(value, far)
            .map_or_else(|| format!("more than {far}"), |n| n.to_string());
        Some(format!(
            "{what} is {size} bytes of JSON, more than the limit of {max} bytes \
             (PES_FLOWCHART_MAX_VALUE_BYTES)"
        ))
    }

    /// The first of `writes` that is too large to write, as a stage error.
    fn oversize_writes(&self, writes: &Map<String, Value>) -> Option<String> {
        writes
            .iter()
            .find_map(|(k, v)| self.oversize(&format!("the value of `{k}`"), v))
    }

    /// Run the chain from `start` until a stage without `next` or an `end`.
    fn run_chain<'a>(
        &'a mut self,
        frame: &'a mut Frame,
        start: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Ended, FlowError>> {
        Box::pin(async move {
            let mut current = start.to_owned();
            loop {
                let stage = frame
                    .record
                    .spec
                    .flowchart
                    .stages
                    .get(&current)
                    .cloned()
                    .ok_or_else(|| FlowError {
                        stage: format!("{}{current}", frame.prefix),
                        message: "no such stage".into(),
                    })?;
                match self.run_stage(frame, &current, &stage).await? {
                    Step::Next(n) => current = n,
                    Step::ChainEnd => return Ok(Ended::Chain),
                    Step::End(r) => return Ok(Ended::End(r)),
                }
            }
        })
    }

    /// Count one more executed stage; its (stage key, iteration, step number).
    fn begin(&mut self, frame: &Frame, id: &str) -> Result<(String, u32, u32), FlowError> {
        let key = format!("{}{id}", frame.prefix);
        self.steps += 1;
        if self.steps > self.limits.max_steps {
            return Err(FlowError {
                stage: key,
                message: format!(
                    "the call reached the limit of {} stages (PES_FLOWCHART_MAX_STEPS)",
                    self.limits.max_steps
                ),
            });
        }
        let n = self.executions.entry(key.clone()).or_insert(0);
        *n += 1;
        Ok((key, *n, self.steps))
    }
}

/// Where control goes after a stage.
enum Step {
    Next(String),
    ChainEnd,
    End(Option<Value>),
}

fn next_or_end(next: Option<&str>) -> Step {
    next.map_or(Step::ChainEnd, |n| Step::Next(n.to_owned()))
}
