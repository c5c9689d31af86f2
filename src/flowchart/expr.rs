//! Flowchart expressions: JSON Logic (the `datalogic-rs` crate, with templating, so an object
//! whose key is not an operator is a literal object whose values are evaluated) over
//! `{args, state}`, JSON Logic truthiness, and what an expression read (the `var` paths it
//! names and their values: the evidence of a decision).

use std::sync::LazyLock;

use serde_json::{Map, Value};

/// One engine for the process: it holds no per-call state.
static ENGINE: LazyLock<datalogic_rs::Engine> = LazyLock::new(|| {
    datalogic_rs::Engine::builder()
        .with_templating(true)
        .build()
});

/// Check that `expr` compiles.
///
/// # Errors
/// Why it does not.
pub fn check(expr: &Value) -> Result<(), String> {
    ENGINE.compile(expr).map(drop).map_err(|e| describe(&e))
}

/// Evaluate `expr` over `data` (`{args, state}`).
///
/// # Errors
/// What went wrong (an unknown operator, a division by zero, …).
pub fn eval(expr: &Value, data: &Value) -> Result<Value, String> {
    let logic = ENGINE.compile(expr).map_err(|e| describe(&e))?;
    let mut session = ENGINE.session();
    session
        .eval_into::<Value, _>(&logic, data)
        .map_err(|e| describe(&e))
}

fn describe(e: &datalogic_rs::Error) -> String {
    let text = format!("{e:?}");
    crate::llm::truncate(&text, 300)
}

/// JSON Logic truthiness: `false`, `null`, `0`, `""` and `[]` are false; everything else true.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(_) => true,
    }
}

/// The values `expr` reads: every `var` path it names (`args.amount`, `state.total`) with its
/// value in `data` (`null` when absent), in the order first named.
pub fn reads(expr: &Value, data: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    collect(expr, data, &mut out);
    out
}

fn collect(expr: &Value, data: &Value, out: &mut Map<String, Value>) {
    match expr {
        Value::Object(map) => {
            for (k, v) in map {
                if k == "var" {
                    let path = match v {
                        Value::String(p) => Some(p.clone()),
                        Value::Array(a) => a.first().and_then(Value::as_str).map(str::to_owned),
                        Value::Number(n) => Some(n.to_string()),
                        _ => None,
                    };
                    if let Some(p) = path {
                        let value = lookup(data, &p);
                        out.entry(p).or_insert(value);
                        continue;
                    }
                }
                collect(v, data, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect(i, data, out)),
        _ => {}
    }
}

/// The value at a dotted path (`state.order.total`, `args.items.0`), `null` when absent.
pub fn lookup(data: &Value, path: &str) -> Value {
    if path.is_empty() {
        return data.clone();
    }
    let mut at = data;
    for part in path.split('.') {
        at = match at {
            Value::Object(m) => match m.get(part) {
                Some(v) => v,
                None => return Value::Null,
            },
            Value::Array(a) => match part.parse::<usize>().ok().and_then(|i| a.get(i)) {
                Some(v) => v,
                None => return Value::Null,
            },
            _ => return Value::Null,
        };
    }
    at.clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn expressions_evaluate_over_args_and_state() {
        let data = json!({"args": {"amount": 150}, "state": {"tier": "gold", "items": [1, 2]}});
        assert_eq!(
            eval(&json!({">": [{"var": "args.amount"}, 100]}), &data),
            Ok(json!(true))
        );
        assert_eq!(
            eval(
                &json!({"total": {"var": "args.amount"}, "tier": {"var": "state.tier"}}),
                &data
            ),
            Ok(json!({"total": 150, "tier": "gold"})),
            "an object of non-operators is a template"
        );
        assert_eq!(eval(&json!("literal"), &data), Ok(json!("literal")));
        assert!(eval(&json!({"/": [1, 0]}), &data).is_err());
        let r = reads(
            &json!({"and": [{">": [{"var": "args.amount"}, 100]}, {"==": [{"var": ["state.tier", "x"]}, "gold"]}, {"var": "state.none"}]}),
            &data,
        );
        assert_eq!(
            Value::Object(r),
            json!({"args.amount": 150, "state.tier": "gold", "state.none": null})
        );
        assert_eq!(lookup(&data, "state.items.1"), json!(2));
        for (v, t) in [
            (json!(0), false),
            (json!(""), false),
            (json!([]), false),
            (json!(null), false),
            (json!({}), true),
            (json!("0"), true),
        ] {
            assert_eq!(truthy(&v), t, "{v}");
        }
    }
}
