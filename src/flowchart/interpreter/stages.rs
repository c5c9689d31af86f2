//! One stage of a chain, of each kind but `flow` (see `flow.rs`): `set`, `tool`, `llm`,
//! `decide`, `select`, `loop` and `end`, each run (or, replaying, taken from its committed step)
//! and committed before the next one; a stage that fails commits its step with the error.

use std::time::Instant;

use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::steps::as_map;
use super::{Ended, FlowCall, FlowError, Frame, Gate, Paused, Step, next_or_end};
use crate::flowchart::evidence::{eval_args, evaluate_rules, reads_of};
use crate::flowchart::expr;
use crate::flowchart::model::Stage;

impl FlowCall<'_> {
    /// Run the stage `id` of `frame` and commit its step, or, replaying, take what it did from
    /// its committed step; where control goes next.
    pub(super) async fn run_stage(
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
}
