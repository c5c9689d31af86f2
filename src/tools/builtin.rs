//! The built-in tools, always registered: `calculator` (the arithmetic of
//! [`crate::model::calc`]: recursive descent over `f64`, exact errors for bad expressions, bounded
//! to [`MAX_EXPRESSION_LEN`] characters and [`MAX_NESTING`] levels), `current_time` (IANA time
//! zones via `chrono-tz`) and `ask_user` (a blocking tool: every call suspends the run for a
//! person, so it never runs by itself).

use async_trait::async_trait;
use serde_json::{Number, Value, json};

use super::{Tool, ToolContext, ToolError};
use crate::json::schema;
use crate::model::SuspensionKind;
use crate::model::time_zone::parse_timezone;

pub use crate::model::calc::{CalcError, MAX_EXPRESSION_LEN, MAX_NESTING, evaluate};

/// A result as a JSON number: an integer when the value is integral and exactly representable
/// (|x| ≤ 2^53), otherwise a float rounded to 15 significant digits so `0.1+0.2` reads `0.3`.
pub fn number_to_json(x: f64) -> Value {
    const LIMIT: f64 = 9_007_199_254_740_992.0; // 2^53
    if x.fract() == 0.0 && x.abs() <= LIMIT {
        // Exact: integral and within the range where every integer is an f64.
        return Value::Number(Number::from(x as i64));
    }
    let rounded: f64 = format!("{x:.14e}").parse().unwrap_or(x);
    if rounded.fract() == 0.0 && rounded.abs() <= LIMIT {
        return Value::Number(Number::from(rounded as i64));
    }
    Number::from_f64(rounded).map_or(Value::Null, Value::Number)
}

fn string_arg<'a>(args: &'a Value, name: &str) -> Option<&'a str> {
    args.get(name).and_then(Value::as_str)
}

/// `calculator {expression}` → `{expression, result}`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Calculator;

#[async_trait]
impl Tool for Calculator {
    fn name(&self) -> &str {
        "calculator"
    }
    fn description(&self) -> &str {
        "Evaluate an arithmetic expression exactly. Supports + - * / % ^ (power), parentheses, \
         unary minus, sqrt, abs, round, floor, ceil, ln, log10, sin, cos, tan (radians), pow(x, y), \
         min(...), max(...) and the constants pi and e."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_EXPRESSION_LEN,
                    "description": "The expression, e.g. `12*(3+4)` or `sqrt(2)^2`"
                }
            },
            "required": ["expression"],
            "additionalProperties": false
        })
    }
    /// Arithmetic: the same call always gives the same result and touches nothing.
    fn side_effects(&self) -> bool {
        false
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let expression = string_arg(&args, "expression")
            .ok_or_else(|| ToolError::InvalidArguments("`expression` must be a string".into()))?;
        let result = evaluate(expression).map_err(|e| ToolError::Failed(e.0))?;
        Ok(json!({"expression": expression, "result": number_to_json(result)}))
    }
}

/// `current_time {timezone?}` → `{timezone, iso8601, unix}`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CurrentTime;

#[async_trait]
impl Tool for CurrentTime {
    fn name(&self) -> &str {
        "current_time"
    }
    fn description(&self) -> &str {
        "The current date and time, in UTC or in the given IANA time zone (e.g. Europe/Paris)."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "timezone": {
                    "type": "string",
                    "minLength": 1,
                    "description": "IANA time zone name, e.g. `Europe/Paris`; UTC when absent"
                }
            },
            "additionalProperties": false
        })
    }
    /// Reads the clock: a repeat may answer a later time, but changes nothing.
    fn side_effects(&self) -> bool {
        false
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let tz = match string_arg(&args, "timezone") {
            Some(name) => parse_timezone(name).map_err(|e| ToolError::Failed(e.to_string()))?,
            None => chrono_tz::UTC,
        };
        let now = chrono::Utc::now();
        let local = now.with_timezone(&tz);
        Ok(json!({
            "timezone": tz.name(),
            "iso8601": local.to_rfc3339_opts(chrono::SecondsFormat::Secs, false),
            "unix": now.timestamp(),
        }))
    }
}

/// `ask_user {question, inputSchema?}`: always suspends the run for a person's answer, which
/// becomes the tool's result. Its [`Tool::call`] is never used by the agent.
#[derive(Debug, Clone, Copy, Default)]
pub struct AskUser;

#[async_trait]
impl Tool for AskUser {
    fn name(&self) -> &str {
        "ask_user"
    }
    fn description(&self) -> &str {
        "Ask the user a question and wait for the answer. Use it only when you cannot go on without \
         information only the user has. Optionally give a JSON Schema the answer must match."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "question": {"type": "string", "minLength": 1, "description": "The question to ask"},
                "inputSchema": {"type": "object", "description": "JSON Schema of the expected answer"}
            },
            "required": ["question"],
            "additionalProperties": false
        })
    }
    fn blocking(&self) -> Option<SuspensionKind> {
        Some(SuspensionKind::Input)
    }
    fn check_arguments(&self, args: &Value) -> Result<(), ToolError> {
        match args.get("inputSchema") {
            Some(s) => schema::check_schema(s)
                .map_err(|e| ToolError::InvalidArguments(format!("/inputSchema: {e}"))),
            None => Ok(()),
        }
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        Err(ToolError::Failed(
            "`ask_user` must be answered by a person: the run suspends until someone responds"
                .into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(s: &str) -> f64 {
        evaluate(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn ev_err(s: &str) -> String {
        evaluate(s).expect_err(s).0
    }

    fn ctx() -> ToolContext {
        ToolContext {
            tenant: "default".into(),
            thread_id: "t".into(),
            idempotency_key: "k".into(),
            memory_namespace: None,
        }
    }

    #[test]
    fn precedence_and_associativity() {
        assert_eq!(ev("1 + 2 * 3"), 7.0);
        assert_eq!(ev("(1 + 2) * 3"), 9.0);
        assert_eq!(ev("12*(3+4)"), 84.0);
        assert_eq!(ev("10 - 4 - 3"), 3.0);
        assert_eq!(ev("100 / 10 / 5"), 2.0);
        assert_eq!(ev("2^3^2"), 512.0);
        assert_eq!(ev("2**10"), 1024.0);
        assert_eq!(ev("-2^2"), -4.0);
        assert_eq!(ev("2^-1"), 0.5);
        assert_eq!(ev("--3"), 3.0);
        assert_eq!(ev("+3 - -3"), 6.0);
        assert_eq!(ev("7 % 4 * 2"), 6.0);
        assert_eq!(ev("-7 % 4"), -3.0);
        assert_eq!(ev("2 * 3 ^ 2"), 18.0);
        assert_eq!(ev(" 1.5e3 + .5 "), 1500.5);
    }

    #[test]
    fn functions_and_constants() {
        assert_eq!(ev("sqrt(16)"), 4.0);
        assert_eq!(ev("abs(-3)"), 3.0);
        assert_eq!(ev("round(2.5)"), 3.0);
        assert_eq!(ev("floor(-2.5)"), -3.0);
        assert_eq!(ev("ceil(2.1)"), 3.0);
        assert_eq!(ev("ln(e)"), 1.0);
        assert_eq!(ev("log10(1000)"), 3.0);
        assert_eq!(ev("cos(0) + sin(0) + tan(0)"), 1.0);
        assert_eq!(ev("min(3, 1, 2)"), 1.0);
        assert_eq!(ev("max(3, 1+9, 2)"), 10.0);
        assert_eq!(ev("pow(2, 8)"), 256.0);
        assert_eq!(ev("PI"), std::f64::consts::PI);
        assert_eq!(ev("2*e"), 2.0 * std::f64::consts::E);
    }

    #[test]
    fn exact_errors_for_bad_expressions() {
        assert_eq!(ev_err("2+$"), "unexpected character `$` at position 3");
        assert_eq!(ev_err("1/0"), "division by zero");
        assert_eq!(ev_err("5 % (2-2)"), "division by zero");
        assert_eq!(ev_err("0^-1"), "division by zero");
        assert_eq!(ev_err("(1+2"), "unbalanced parentheses");
        assert_eq!(ev_err("1+2)"), "unbalanced parentheses");
        assert_eq!(ev_err("max(1,2"), "unbalanced parentheses");
        assert_eq!(ev_err("foo(1)"), "unknown function `foo`");
        assert_eq!(
            ev_err("2 + x"),
            "unknown name `x` at position 5 (known constants: pi, e)"
        );
        assert_eq!(ev_err(""), "empty expression");
        assert_eq!(ev_err("   "), "empty expression");
        assert_eq!(ev_err("1 +"), "unexpected end of expression");
        assert_eq!(ev_err("1 2"), "unexpected number `2` at position 3");
        assert_eq!(ev_err("*3"), "unexpected `*` at position 1");
        assert_eq!(
            ev_err("sqrt(1, 2)"),
            "function `sqrt` takes 1 argument, got 2"
        );
        assert_eq!(ev_err("pow(2)"), "function `pow` takes 2 arguments, got 1");
        assert_eq!(ev_err("max()"), "function `max` needs at least 1 argument");
        assert_eq!(ev_err("sqrt(-1)"), "square root of a negative number");
        assert_eq!(
            ev_err("ln(0)"),
            "logarithm of a number that is not positive"
        );
        assert_eq!(ev_err("10^400"), "the result is too large");
        assert_eq!(ev_err("1..2"), "invalid number `1..2` at position 1");
        assert_eq!(
            ev_err("sqrt 4"),
            "function `sqrt` at position 1 needs parentheses"
        );
        assert_eq!(ev_err("()"), "unexpected `)` at position 2");
        assert_eq!(ev_err("2e"), "unexpected `e` at position 2");
    }

    #[test]
    fn limits_are_enforced() {
        let long = format!("1{}", "+1".repeat(600));
        assert!(ev_err(&long).starts_with("expression too long"));
        let deep = format!("{}1{}", "(".repeat(100), ")".repeat(100));
        assert!(ev_err(&deep).starts_with("expression nested too deeply"));
        let fine = format!("{}1{}", "(".repeat(30), ")".repeat(30));
        assert_eq!(ev(&fine), 1.0);
        let minus = "-".repeat(500) + "1";
        assert!(ev_err(&minus).starts_with("expression nested too deeply"));
        let pows = "2^".repeat(200) + "1";
        assert!(ev_err(&pows).starts_with("expression nested too deeply"));
    }

    #[test]
    fn integral_results_are_json_integers() {
        assert_eq!(number_to_json(4.0).to_string(), "4");
        assert_eq!(number_to_json(-0.0).to_string(), "0");
        assert_eq!(number_to_json(0.5).to_string(), "0.5");
        assert_eq!(number_to_json(0.1 + 0.2).to_string(), "0.3");
        assert_eq!(
            number_to_json(2f64.powi(53)).to_string(),
            "9007199254740992"
        );
        assert_eq!(number_to_json(1e300).as_f64(), Some(1e300));
    }

    #[tokio::test]
    async fn calculator_tool_outputs_expression_and_result() {
        let out = Calculator
            .call(json!({"expression": "12*(3+4)"}), &ctx())
            .await
            .unwrap();
        assert_eq!(out, json!({"expression": "12*(3+4)", "result": 84}));
        let e = Calculator
            .call(json!({"expression": "1/0"}), &ctx())
            .await
            .unwrap_err();
        assert_eq!(e, ToolError::Failed("division by zero".into()));
    }

    #[tokio::test]
    async fn current_time_defaults_to_utc_and_knows_iana_zones() {
        let out = CurrentTime.call(json!({}), &ctx()).await.unwrap();
        assert_eq!(out["timezone"], "UTC");
        let iso = out["iso8601"].as_str().unwrap();
        let parsed = chrono::DateTime::parse_from_rfc3339(iso).unwrap();
        assert_eq!(parsed.timestamp(), out["unix"].as_i64().unwrap());

        let out = CurrentTime
            .call(json!({"timezone": "asia/tokyo"}), &ctx())
            .await
            .unwrap();
        assert_eq!(out["timezone"], "Asia/Tokyo");
        assert!(out["iso8601"].as_str().unwrap().ends_with("+09:00"));

        let e = CurrentTime
            .call(json!({"timezone": "Mars/Olympus"}), &ctx())
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown time zone `Mars/Olympus`"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn ask_user_is_blocking_and_never_runs_by_itself() {
        assert_eq!(AskUser.blocking(), Some(SuspensionKind::Input));
        assert!(
            AskUser
                .call(json!({"question": "?"}), &ctx())
                .await
                .is_err()
        );
        assert!(
            AskUser
                .check_arguments(&json!({"question": "?", "inputSchema": {"type": "object"}}))
                .is_ok()
        );
        let e = AskUser
            .check_arguments(&json!({"question": "?", "inputSchema": {"type": "nope"}}))
            .unwrap_err();
        let ToolError::InvalidArguments(e) = e else {
            panic!("{e}")
        };
        assert!(
            e.starts_with("/inputSchema: schema at /type: \"nope\" is not valid"),
            "{e}"
        );
    }
}
