//! Static checks of one JSON Logic expression. The engine compiles with templating on, where an
//! object whose only key is not an operator is literal output: so a misspelt operator is not an
//! error to the engine, it silently becomes data. What is caught here, beyond compiling:
//!
//! - a lone key that is clearly meant as an operator but is none: an operator name in another
//!   case (`Var`, `IF`), or a key made only of operator symbols (`=`, `=>`, `&&`);
//! - a `var` that reads outside the data an expression sees, `{args, state}` (`{"var":
//!   "amount"}` for `args.amount` is always null). Inside the per-element logic of `map`,
//!   `filter`, `reduce`, `all`, `some` and `none`, `var` reads the element, and is not checked.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use serde_json::Value;

use super::{Problem, pointer};

/// The roots of the data every expression reads.
pub(crate) const ROOTS: [&str; 2] = ["args", "state"];

/// Compiling with constant folding off evaluates nothing: a tenant's expression is only ever
/// evaluated under the bounds of [`crate::flowchart::expr`].
static ENGINE: LazyLock<datalogic_rs::Engine> = LazyLock::new(|| {
    datalogic_rs::Engine::builder()
        .with_templating(true)
        .with_constant_folding(false)
        .build()
});

static OPERATORS: LazyLock<BTreeSet<&'static str>> =
    LazyLock::new(|| ENGINE.builtin_operator_names().collect());

/// Operators whose second argument onward is logic run per element (reading the element).
const SCOPED: [&str; 6] = ["map", "filter", "reduce", "all", "some", "none"];

/// Characters operators are spelt with.
const SYMBOLS: &str = "=<>!+-*/%?&|:^~";

/// Check `expr`, found at pointer `at`.
pub(super) fn check(expr: &Value, at: &str, out: &mut Vec<Problem>) {
    if let Err(e) = ENGINE.compile(expr) {
        out.push(Problem::new(
            at,
            format!("the expression does not compile: {e}"),
        ));
        return;
    }
    walk(expr, at, true, out);
}

/// `rooted`: a `var` here reads `{args, state}`.
fn walk(v: &Value, at: &str, rooted: bool, out: &mut Vec<Problem>) {
    match v {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(
                    item,
                    &format!("{at}{}", pointer([i.to_string().as_str()])),
                    rooted,
                    out,
                );
            }
        }
        Value::Object(map) if map.len() == 1 => {
            let Some((op, arg)) = map.iter().next() else {
                return;
            };
            let here = format!("{at}{}", pointer([op.as_str()]));
            if !OPERATORS.contains(op.as_str()) {
                match misspelt(op) {
                    Some(message) => out.push(Problem::new(here, message)),
                    None => walk(arg, &here, rooted, out),
                }
                return;
            }
            if rooted && op == "var" {
                check_var(arg, &here, out);
            }
            match arg {
                Value::Array(items) if SCOPED.contains(&op.as_str()) => {
                    for (i, item) in items.iter().enumerate() {
                        let at = format!("{here}{}", pointer([i.to_string().as_str()]));
                        walk(item, &at, rooted && i == 0, out);
                    }
                }
                _ => walk(arg, &here, rooted, out),
            }
        }
        Value::Object(map) => {
            for (k, item) in map {
                walk(item, &format!("{at}{}", pointer([k.as_str()])), rooted, out);
            }
        }
        _ => {}
    }
}

/// Why `key`, the only key of an object and not an operator, looks like a misspelt one.
fn misspelt(key: &str) -> Option<String> {
    if let Some(op) = OPERATORS.iter().find(|op| op.eq_ignore_ascii_case(key)) {
        return Some(format!(
            "`{key}` is not a JSON Logic operator (operators are lower case: `{op}`)"
        ));
    }
    if !key.is_empty() && key.chars().all(|c| SYMBOLS.contains(c)) {
        let hint = match key {
            "=" => " (did you mean `==`?)",
            "=>" => " (did you mean `>=`?)",
            "=<" => " (did you mean `<=`?)",
            "<>" | "=!" => " (did you mean `!=`?)",
            "&&" | "&" => " (did you mean `and`?)",
            "||" | "|" => " (did you mean `or`?)",
            _ => "",
        };
        return Some(format!("`{key}` is not a JSON Logic operator{hint}"));
    }
    None
}

/// A `var` path must start at `args` or `state` (the empty path reads both).
fn check_var(arg: &Value, at: &str, out: &mut Vec<Problem>) {
    let path = match arg {
        Value::String(s) => s.as_str(),
        Value::Array(items) => match items.first() {
            Some(Value::String(s)) => s.as_str(),
            _ => return,
        },
        _ => return,
    };
    if path.is_empty() {
        return;
    }
    let root = path.split('.').next().unwrap_or(path);
    if !ROOTS.contains(&root) {
        out.push(Problem::new(
            at,
            format!(
                "`{path}` reads nothing: an expression reads `args.<argument>` or \
                 `state.<key>`"
            ),
        ));
    }
}
