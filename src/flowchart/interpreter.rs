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

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::evidence::{eval_args, evaluate_rules, reads_of};
use super::expr;
pub use super::host::{FlowError, FlowHost, FlowLimits, Gate, MAX_DEPTH, Paused, StepRecord};
use super::model::{FlowchartRecord, Stage};
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

impl<'h> FlowCall<'h> {
    /// The most bytes of step content one call may write to the log (all its steps, sub-flows
    /// included): 32 values of the largest size a stage may write. A loop that writes large
    /// values over and over ends as a stage error instead of filling the database.
    fn max_log_bytes(&self) -> usize {
        self.limits.expr.limits().max_value_bytes.saturating_mul(32)
    }

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

    /// The committed record of this step, when the call is replaying. A step committed with an
    /// error ends the call again with that error: a stage that failed (or passed a limit) is
    /// never run again.
    fn recorded(&mut self, key: &str, step: u32) -> Result<Option<Recorded>, FlowError> {
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
    async fn failed(
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
    async fn commit(
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

    async fn run_stage(
        &mut self,
        frame: &mut Frame,
        id: &str,
        stage: &Stage,
    ) -> Result<Step, FlowError> {
        let started = Instant::now();
        let (key, iteration, step) = self.begin(frame, id)?;
        // A `flow` stage's step follows its sub-flow's steps; it is handled on its own.
        if let Stage::Flow {
            flowchart,
            args,
            output,
            next,
        } = stage
        {
            return self
                .run_flow(
                    frame, &key, step, iteration, started, flowchart, args, output,
                )
                .await
                .map(|()| next_or_end(next.as_deref()));
        }
        let recorded = self.recorded(&key, step)?;
        let kind = stage.kind();
        let data = frame.data();
        let mut extra = Map::new();
        // A stage that fails commits its step with the error (see `failed`).
        macro_rules! fail {
            ($extra:expr, $message:expr) => {
                return Err(self
                    .failed(
                        frame, &key, kind, step, iteration, started, $extra, $message,
                    )
                    .await)
            };
        }
        let evaluator = self.limits.expr.clone();
        let outcome = match stage {
            Stage::Set { values, next } => {
                let mut reads = Map::new();
                let writes = match &recorded {
                    Some(r) => as_map(&r.content["writes"]),
                    None => {
                        let mut w = Map::new();
                        for (k, e) in values {
                            reads.extend(expr::reads(e, &data));
                            match evaluator.eval(e, &data).await {
                                Ok(v) => {
                                    w.insert(k.clone(), v);
                                }
                                Err(err) => {
                                    extra.insert("reads".into(), Value::Object(reads));
                                    fail!(extra, format!("`{k}`: {}", err.message));
                                }
                            }
                        }
                        if let Some(m) = self.oversize_writes(&w) {
                            extra.insert("reads".into(), Value::Object(reads));
                            fail!(extra, m);
                        }
                        w
                    }
                };
                frame.state.extend(writes.clone());
                extra.insert("reads".into(), Value::Object(reads));
                extra.insert("writes".into(), Value::Object(writes));
                next_or_end(next.as_deref())
            }
            Stage::Tool {
                tool,
                args,
                output,
                next,
            } => {
                let writes = match &recorded {
                    Some(r) => as_map(&r.content["writes"]),
                    None => {
                        let (call_args, reads) = eval_args(&evaluator, args, &data).await;
                        extra.insert("reads".into(), Value::Object(reads));
                        extra.insert("tool".into(), json!(tool));
                        let call_args = match call_args {
                            Ok(a) => a,
                            Err(e) => fail!(extra, e.message),
                        };
                        extra.insert("args".into(), Value::Object(call_args.clone()));
                        if !self.host.may_call(tool) {
                            fail!(
                                extra,
                                format!(
                                    "the tool `{tool}` is not one the calling item may call \
                                     (the thread's tools, the item's toolAllowlist and its \
                                     role's tools)"
                                )
                            );
                        }
                        let key_for_tool =
                            format!("{}:{}:{key}:{iteration}", self.run_id, self.tool_call_id);
                        let gated_id = format!("{}:{key}:{iteration}", self.tool_call_id);
                        let args = Value::Object(call_args);
                        let ran = match self.host.gate(tool, &args, &gated_id) {
                            Gate::Run(args) => self.host.call_tool(tool, args, key_for_tool).await,
                            Gate::Answer(v) => Ok(v),
                            Gate::Reject(reason) => {
                                Err(format!("a person rejected the call: {reason}"))
                            }
                            Gate::Suspend(kind) => {
                                self.paused = Some(Paused {
                                    call: crate::model::ToolCallRecord {
                                        id: gated_id,
                                        name: tool.clone(),
                                        arguments: args,
                                    },
                                    kind,
                                });
                                return Err(FlowError {
                                    stage: key,
                                    message: "waiting for a person's decision".into(),
                                });
                            }
                        };
                        let w = match ran {
                            Ok(v) => Map::from_iter([(output.clone(), v)]),
                            Err(e) => fail!(extra, format!("the tool `{tool}` failed: {e}")),
                        };
                        if let Some(m) = self.oversize_writes(&w) {
                            fail!(extra, m);
                        }
                        w
                    }
                };
                frame.state.extend(writes.clone());
                extra.insert("writes".into(), Value::Object(writes));
                next_or_end(next.as_deref())
            }
            Stage::Llm {
                prompt,
                output_schema,
                output,
                next,
            } => {
                let writes = match &recorded {
                    Some(r) => as_map(&r.content["writes"]),
                    None => {
                        extra.insert("reads".into(), Value::Object(expr::reads(prompt, &data)));
                        let text = match evaluator.eval(prompt, &data).await {
                            Ok(Value::String(s)) => s,
                            Ok(other) => other.to_string(),
                            Err(e) => fail!(extra, e.message),
                        };
                        let (value, usage) =
                            match self.host.ask_model(text, output_schema.clone()).await {
                                Ok(r) => r,
                                Err(e) => fail!(extra, format!("the model failed: {e}")),
                            };
                        self.usage.add(&usage);
                        extra.insert("usage".into(), json!(usage));
                        let w = Map::from_iter([(output.clone(), value)]);
                        if let Some(m) = self.oversize_writes(&w) {
                            fail!(extra, m);
                        }
                        w
                    }
                };
                frame.state.extend(writes.clone());
                extra.insert("writes".into(), Value::Object(writes));
                next_or_end(next.as_deref())
            }
            Stage::Decide { rules, default } => {
                let chosen = match &recorded {
                    Some(r) => match r.content["decision"]["chosen"].as_str() {
                        Some(c) => c.to_owned(),
                        None => {
                            return Err(FlowError {
                                stage: key,
                                message: "its committed step has no decision".into(),
                            });
                        }
                    },
                    None => {
                        let (evidence, matched) = match evaluate_rules(
                            &evaluator,
                            rules.iter().map(|r| &r.condition),
                            &data,
                            true,
                        )
                        .await
                        {
                            Ok(r) => r,
                            Err(e) => fail!(extra, e.message),
                        };
                        let chosen = matched
                            .first()
                            .map_or_else(|| default.clone(), |i| rules[*i].next.clone());
                        extra.insert("reads".into(), Value::Object(reads_of(&evidence)));
                        extra.insert(
                            "decision".into(),
                            json!({"rules": evidence, "chosen": chosen}),
                        );
                        chosen
                    }
                };
                Step::Next(chosen)
            }
            Stage::Select { rules, next } => {
                let matched: Vec<usize> = match &recorded {
                    Some(r) => r.content["decision"]["matched"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|v| v.as_u64().and_then(|n| usize::try_from(n).ok()))
                                .collect()
                        })
                        .unwrap_or_default(),
                    None => {
                        let (evidence, matched) = match evaluate_rules(
                            &evaluator,
                            rules.iter().map(|r| &r.condition),
                            &data,
                            false,
                        )
                        .await
                        {
                            Ok(r) => r,
                            Err(e) => fail!(extra, e.message),
                        };
                        let branches: Vec<&str> =
                            matched.iter().map(|i| rules[*i].branch.as_str()).collect();
                        extra.insert("reads".into(), Value::Object(reads_of(&evidence)));
                        extra.insert(
                            "decision".into(),
                            json!({"rules": evidence, "chosen": branches, "matched": matched}),
                        );
                        matched
                    }
                };
                if recorded.is_none() {
                    self.commit(
                        frame,
                        Uuid::now_v7(),
                        &key,
                        "select",
                        step,
                        iteration,
                        started,
                        extra,
                    )
                    .await?;
                }
                for i in matched {
                    let Some(rule) = rules.get(i) else { continue };
                    if let Ended::End(r) = self.run_chain(frame, &rule.branch).await? {
                        return Ok(Step::End(r));
                    }
                }
                return Ok(next_or_end(next.as_deref()));
            }
            Stage::Loop {
                condition,
                body,
                max_iterations,
                next,
            } => {
                // Each check of the condition is a step of its own (the loop stage, its
                // iteration), so a crash inside the body resumes in the right round.
                let mut round = iteration;
                let mut this_step = step;
                let mut this_recorded = recorded;
                let mut this_started = started;
                loop {
                    let data = frame.data();
                    let go = match &this_recorded {
                        Some(r) => r.content["matched"].as_bool().unwrap_or(false),
                        None => {
                            let mut extra = Map::new();
                            extra.insert(
                                "reads".into(),
                                Value::Object(expr::reads(condition, &data)),
                            );
                            let v = match evaluator.eval(condition, &data).await {
                                Ok(v) => v,
                                Err(e) => {
                                    return Err(self
                                        .failed(
                                            frame,
                                            &key,
                                            "loop",
                                            this_step,
                                            round,
                                            this_started,
                                            extra,
                                            e.message,
                                        )
                                        .await);
                                }
                            };
                            let go = expr::truthy(&v);
                            extra.insert("matched".into(), json!(go));
                            self.commit(
                                frame,
                                Uuid::now_v7(),
                                &key,
                                "loop",
                                this_step,
                                round,
                                this_started,
                                extra,
                            )
                            .await?;
                            go
                        }
                    };
                    if !go {
                        break;
                    }
                    let done_rounds = self.executions.get(&key).copied().unwrap_or(1);
                    if done_rounds > *max_iterations {
                        return Err(FlowError {
                            stage: key,
                            message: format!(
                                "the loop ran its maxIterations ({max_iterations}) and its condition still holds"
                            ),
                        });
                    }
                    if let Ended::End(r) = self.run_chain(frame, body).await? {
                        return Ok(Step::End(r));
                    }
                    this_started = Instant::now();
                    let (_, r, s) = self.begin(frame, id)?;
                    round = r;
                    this_step = s;
                    this_recorded = self.recorded(&key, s)?;
                }
                return Ok(next_or_end(next.as_deref()));
            }
            Stage::End { result } => {
                let value = match &recorded {
                    Some(r) => r.content["writes"].get("result").cloned(),
                    None => match result {
                        Some(e) => {
                            extra.insert("reads".into(), Value::Object(expr::reads(e, &data)));
                            let v = match evaluator.eval(e, &data).await {
                                Ok(v) => v,
                                Err(err) => fail!(extra, err.message),
                            };
                            if let Some(m) = self.oversize("the call's result", &v) {
                                fail!(extra, m);
                            }
                            Some(v)
                        }
                        None => None,
                    },
                };
                if let Some(v) = &value {
                    extra.insert("writes".into(), json!({"result": v}));
                }
                Step::End(value)
            }
            Stage::Flow { .. } => unreachable!("handled above"),
        };
        if recorded.is_none() {
            self.commit(
                frame,
                Uuid::now_v7(),
                &key,
                kind,
                step,
                iteration,
                started,
                extra,
            )
            .await?;
        }
        Ok(outcome)
    }

    /// A `flow` stage: the sub-flow runs in a fresh state, its steps nested under this stage's
    /// observation, which is committed once it ends with the sub-flow's result as its write
    /// (or, when it failed, with its error and the failed stage as `errorStage`).
    #[allow(clippy::too_many_arguments)]
    async fn run_flow(
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

/// Where control goes after a stage.
enum Step {
    Next(String),
    ChainEnd,
    End(Option<Value>),
}

fn next_or_end(next: Option<&str>) -> Step {
    next.map_or(Step::ChainEnd, |n| Step::Next(n.to_owned()))
}

/// Where a committed step's stage is in the call: its `path` inside a sub-flow, else its
/// `stage` (steps committed before `path` existed have the path in `stage`).
fn path_of(content: &Value) -> &Value {
    match &content["path"] {
        Value::Null => &content["stage"],
        path => path,
    }
}

/// The error a committed step ended the call with, if it did (`errorStage` when the error was
/// a sub-flow's, naming its stage).
fn recorded_error(content: &Value, key: &str) -> Option<FlowError> {
    let message = content["error"].as_str()?;
    Some(FlowError {
        stage: content["errorStage"].as_str().unwrap_or(key).to_owned(),
        message: message.to_owned(),
    })
}

fn as_map(v: &Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}
