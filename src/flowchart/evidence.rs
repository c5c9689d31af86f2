//! The evidence of a stage: the arguments it computed and what they read, and for `decide` and
//! `select` each rule's condition, the values it read and whether it matched.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::expr;

/// A JSON object.
pub(super) type Object = Map<String, Value>;

/// Arguments computed from their expressions, and what they read.
pub(super) fn eval_args(
    args: &BTreeMap<String, Value>,
    data: &Value,
) -> Result<(Object, Object), String> {
    let mut out = Map::new();
    let mut reads = Map::new();
    for (k, e) in args {
        reads.extend(expr::reads(e, data));
        out.insert(
            k.clone(),
            expr::eval(e, data).map_err(|m| format!("argument `{k}`: {m}"))?,
        );
    }
    Ok((out, reads))
}

/// Evaluate each rule's condition: the evidence (`{index, condition, inputs, matched}` per rule)
/// and the indices that matched. For `decide` (`first_only`), a rule after the first match that
/// fails to evaluate is recorded with its error instead of failing the stage.
pub(super) fn evaluate_rules<'a>(
    conditions: impl Iterator<Item = &'a Value>,
    data: &Value,
    first_only: bool,
) -> Result<(Vec<Value>, Vec<usize>), String> {
    let mut evidence = Vec::new();
    let mut matched = Vec::new();
    for (index, condition) in conditions.enumerate() {
        let inputs = expr::reads(condition, data);
        match expr::eval(condition, data) {
            Ok(v) => {
                let hit = expr::truthy(&v);
                if hit {
                    matched.push(index);
                }
                evidence.push(json!({"index": index, "condition": condition, "inputs": inputs, "matched": hit}));
            }
            Err(e) if first_only && !matched.is_empty() => {
                evidence.push(json!({"index": index, "condition": condition, "inputs": inputs, "matched": false, "error": e}));
            }
            Err(e) => return Err(format!("rule {index}: {e}")),
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
