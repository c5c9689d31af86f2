//! The evidence of a stage: the arguments it computed and what they read, and for `decide` and
//! `select` each rule's condition, the values it read and whether it matched.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::expr::{self, Evaluator, ExprError};

/// A JSON object.
pub(super) type Object = Map<String, Value>;

/// Arguments computed from their expressions, and what they read (also when one fails: the
/// reads so far go into the failed stage's step).
pub(super) async fn eval_args(
    evaluator: &Evaluator,
    args: &BTreeMap<String, Value>,
    data: &Arc<Value>,
) -> (Result<Object, ExprError>, Object) {
    let mut out = Map::new();
    let mut reads = Map::new();
    for (k, e) in args {
        reads.extend(expr::reads(e, data));
        match evaluator.eval(e, data).await {
            Ok(v) => {
                out.insert(k.clone(), v);
            }
            Err(err) => {
                let err = ExprError {
                    message: format!("argument `{k}`: {}", err.message),
                    ..err
                };
                return (Err(err), reads);
            }
        }
    }
    (Ok(out), reads)
}

/// Evaluate each rule's condition: the evidence (`{index, condition, inputs, matched}` per rule)
/// and the indices that matched. For `decide` (`first_only`), a rule after the first match that
/// fails to evaluate is recorded with its error instead of failing the stage, unless a bound
/// stopped it (that always fails the stage).
pub(super) async fn evaluate_rules<'a>(
    evaluator: &Evaluator,
    conditions: impl Iterator<Item = &'a Value>,
    data: &Arc<Value>,
    first_only: bool,
) -> Result<(Vec<Value>, Vec<usize>), ExprError> {
    let mut evidence = Vec::new();
    let mut matched = Vec::new();
    for (index, condition) in conditions.enumerate() {
        let inputs = expr::reads(condition, data);
        match evaluator.eval(condition, data).await {
            Ok(v) => {
                let hit = expr::truthy(&v);
                if hit {
                    matched.push(index);
                }
                evidence.push(json!({"index": index, "condition": condition, "inputs": inputs, "matched": hit}));
            }
            Err(e) if first_only && !matched.is_empty() && !e.limit => {
                evidence.push(json!({"index": index, "condition": condition, "inputs": inputs, "matched": false, "error": e.message}));
            }
            Err(e) => {
                return Err(ExprError {
                    message: format!("rule {index}: {}", e.message),
                    ..e
                });
            }
        }
    }
    if first_only {
        matched.truncate(1);
    }
    Ok((evidence, matched))
}

/// Every value the rules read.
pub(super) fn reads_of(evidence: &[Value]) -> Map<String, Value> {
    let mut out = Map::new();
    for e in evidence {
        if let Some(m) = e["inputs"].as_object() {
            for (k, v) in m {
                out.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    out
}
