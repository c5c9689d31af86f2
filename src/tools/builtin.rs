//! The built-in tools, always registered: `calculator` (our own recursive-descent arithmetic over
//! `f64`, with exact errors for bad expressions), `current_time` (IANA time zones via `chrono-tz`)
//! and `ask_user` (a blocking tool: every call suspends the run for a person, so it never runs by
//! itself).
//!
//! The calculator never panics and is bounded: at most [`MAX_EXPRESSION_LEN`] characters and
//! [`MAX_NESTING`] levels of parentheses, unary signs or function calls.

use async_trait::async_trait;
use serde_json::{Number, Value, json};

use super::{Tool, ToolContext, ToolError};
use crate::json::schema;
use crate::model::SuspensionKind;

/// Longest expression the calculator accepts, in characters.
pub const MAX_EXPRESSION_LEN: usize = 1000;
/// Deepest nesting (parentheses, unary signs, function calls, right-associative powers).
pub const MAX_NESTING: usize = 64;

/// Why an expression could not be evaluated; the message is what the model sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CalcError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, CalcError> {
    Err(CalcError(msg.into()))
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Ident(String),
    Op(char),
    LParen,
    RParen,
    Comma,
}

/// A token and its 1-based character position in the expression.
type Spanned = (Tok, usize);

fn describe(tok: &Tok) -> String {
    match tok {
        Tok::Num(n) => format!("number `{n}`"),
        Tok::Ident(s) => format!("`{s}`"),
        Tok::Op(c) => format!("`{c}`"),
        Tok::LParen => "`(`".into(),
        Tok::RParen => "`)`".into(),
        Tok::Comma => "`,`".into(),
    }
}

fn tokenize(expr: &str) -> Result<Vec<Spanned>, CalcError> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let pos = i + 1;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            // Scientific notation: `1e3`, `2.5E-4` (only when digits follow, so `2e` stays `2 e`).
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let mut j = i + 1;
                if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    while j < chars.len() && chars[j].is_ascii_digit() {
                        j += 1;
                    }
                    i = j;
                }
            }
            let text: String = chars[start..i].iter().collect();
            match text.parse::<f64>() {
                Ok(n) => out.push((Tok::Num(n), pos)),
                Err(_) => return err(format!("invalid number `{text}` at position {pos}")),
            }
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let name: String = chars[start..i].iter().collect();
            out.push((Tok::Ident(name.to_ascii_lowercase()), pos));
        } else {
            i += 1;
            let tok = match c {
                '+' | '-' | '/' | '%' | '^' => Tok::Op(c),
                // `**` is a common spelling of the power operator.
                '*' if chars.get(i) == Some(&'*') => {
                    i += 1;
                    Tok::Op('^')
                }
                '*' | '×' => Tok::Op('*'),
                '÷' => Tok::Op('/'),
                '−' => Tok::Op('-'),
                '(' => Tok::LParen,
                ')' => Tok::RParen,
                ',' => Tok::Comma,
                other => return err(format!("unexpected character `{other}` at position {pos}")),
            };
            out.push((tok, pos));
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<Spanned>,
    pos: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(t, _)| t)
    }

    fn next(&mut self) -> Option<Spanned> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn enter(&mut self) -> Result<(), CalcError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return err(format!(
                "expression nested too deeply (at most {MAX_NESTING} levels)"
            ));
        }
        Ok(())
    }

    fn unexpected(&self, tok: Option<Spanned>) -> CalcError {
        match tok {
            None => CalcError("unexpected end of expression".into()),
            Some((t, pos)) => CalcError(format!("unexpected {} at position {pos}", describe(&t))),
        }
    }

    /// expr := term (('+' | '-') term)*
    fn expr(&mut self) -> Result<f64, CalcError> {
        let mut acc = self.term()?;
        while let Some(Tok::Op(op @ ('+' | '-'))) = self.peek().cloned() {
            self.pos += 1;
            let rhs = self.term()?;
            acc = if op == '+' { acc + rhs } else { acc - rhs };
        }
        Ok(acc)
    }

    /// term := unary (('*' | '/' | '%') unary)*
    fn term(&mut self) -> Result<f64, CalcError> {
        let mut acc = self.unary()?;
        while let Some(Tok::Op(op @ ('*' | '/' | '%'))) = self.peek().cloned() {
            self.pos += 1;
            let rhs = self.unary()?;
            acc = match op {
                '*' => acc * rhs,
                _ if rhs == 0.0 => return err("division by zero"),
                '/' => acc / rhs,
                _ => acc % rhs,
            };
        }
        Ok(acc)
    }

    /// unary := ('-' | '+') unary | power. So `-2^2` is `-(2^2)`, as in mathematics.
    fn unary(&mut self) -> Result<f64, CalcError> {
        if let Some(Tok::Op(op @ ('-' | '+'))) = self.peek().cloned() {
            self.pos += 1;
            self.enter()?;
            let v = self.unary()?;
            self.depth -= 1;
            return Ok(if op == '-' { -v } else { v });
        }
        self.power()
    }

    /// power := primary ('^' unary)?  (right-associative: `2^3^2` is `2^(3^2)`).
    fn power(&mut self) -> Result<f64, CalcError> {
        let base = self.primary()?;
        if let Some(Tok::Op('^')) = self.peek() {
            self.pos += 1;
            self.enter()?;
            let exp = self.unary()?;
            self.depth -= 1;
            if base == 0.0 && exp < 0.0 {
                return err("division by zero");
            }
            return Ok(base.powf(exp));
        }
        Ok(base)
    }

    /// primary := number | constant | function '(' args ')' | '(' expr ')'
    fn primary(&mut self) -> Result<f64, CalcError> {
        let tok = self.next();
        match tok {
            Some((Tok::Num(n), _)) => Ok(n),
            Some((Tok::LParen, _)) => {
                self.enter()?;
                let v = self.expr()?;
                self.depth -= 1;
                match self.next() {
                    Some((Tok::RParen, _)) => Ok(v),
                    None => err("unbalanced parentheses"),
                    other => Err(self.unexpected(other)),
                }
            }
            Some((Tok::Ident(name), pos)) => {
                if let Some(Tok::LParen) = self.peek() {
                    self.pos += 1;
                    self.enter()?;
                    let args = self.args()?;
                    self.depth -= 1;
                    call_function(&name, &args)
                } else {
                    match name.as_str() {
                        "pi" => Ok(std::f64::consts::PI),
                        "e" => Ok(std::f64::consts::E),
                        _ if FUNCTIONS.contains(&name.as_str()) => err(format!(
                            "function `{name}` at position {pos} needs parentheses"
                        )),
                        _ => err(format!(
                            "unknown name `{name}` at position {pos} (known constants: pi, e)"
                        )),
                    }
                }
            }
            other => Err(self.unexpected(other)),
        }
    }

    /// args := expr (',' expr)* ')' — the `(` is already consumed.
    fn args(&mut self) -> Result<Vec<f64>, CalcError> {
        let mut args = Vec::new();
        if let Some(Tok::RParen) = self.peek() {
            self.pos += 1;
            return Ok(args);
        }
        loop {
            args.push(self.expr()?);
            match self.next() {
                Some((Tok::Comma, _)) => {}
                Some((Tok::RParen, _)) => return Ok(args),
                None => return err("unbalanced parentheses"),
                other => return Err(self.unexpected(other)),
            }
        }
    }
}

const FUNCTIONS: &[&str] = &[
    "sqrt", "abs", "round", "floor", "ceil", "ln", "log10", "sin", "cos", "tan", "min", "max",
    "pow",
];

fn call_function(name: &str, args: &[f64]) -> Result<f64, CalcError> {
    let arity = |n: usize| -> Result<(), CalcError> {
        if args.len() == n {
            Ok(())
        } else {
            let plural = if n == 1 { "" } else { "s" };
            err(format!(
                "function `{name}` takes {n} argument{plural}, got {}",
                args.len()
            ))
        }
    };
    match name {
        "min" | "max" => {
            if args.is_empty() {
                return err(format!("function `{name}` needs at least 1 argument"));
            }
            let init = if name == "min" {
                f64::INFINITY
            } else {
                f64::NEG_INFINITY
            };
            Ok(args.iter().fold(init, |acc, &x| {
                if name == "min" {
                    acc.min(x)
                } else {
                    acc.max(x)
                }
            }))
        }
        "pow" => {
            arity(2)?;
            if args[0] == 0.0 && args[1] < 0.0 {
                return err("division by zero");
            }
            Ok(args[0].powf(args[1]))
        }
        _ => {
            if !FUNCTIONS.contains(&name) {
                return err(format!("unknown function `{name}`"));
            }
            arity(1)?;
            let x = args[0];
            match name {
                "sqrt" if x < 0.0 => err("square root of a negative number"),
                "sqrt" => Ok(x.sqrt()),
                "abs" => Ok(x.abs()),
                "round" => Ok(x.round()),
                "floor" => Ok(x.floor()),
                "ceil" => Ok(x.ceil()),
                "ln" | "log10" if x <= 0.0 => err("logarithm of a number that is not positive"),
                "ln" => Ok(x.ln()),
                "log10" => Ok(x.log10()),
                "sin" => Ok(x.sin()),
                "cos" => Ok(x.cos()),
                _ => Ok(x.tan()),
            }
        }
    }
}

/// Evaluate an arithmetic expression: `+ - * / % ^` (`^` right-associative, `**` accepted),
/// unary signs, parentheses, `sqrt abs round floor ceil ln log10 sin cos tan pow min max` and
/// the constants `pi` and `e`. Function and constant names are case-insensitive.
///
/// # Errors
/// A [`CalcError`] saying exactly what is wrong: `unexpected character `x` at position 3`,
/// `division by zero`, `unbalanced parentheses`, `unknown function `foo``, `expression too
/// long`, too deep nesting, or a result that is not a finite real number.
pub fn evaluate(expression: &str) -> Result<f64, CalcError> {
    let len = expression.chars().count();
    if len > MAX_EXPRESSION_LEN {
        return err(format!(
            "expression too long ({len} characters; at most {MAX_EXPRESSION_LEN})"
        ));
    }
    let toks = tokenize(expression)?;
    if toks.is_empty() {
        return err("empty expression");
    }
    let mut p = Parser {
        toks,
        pos: 0,
        depth: 0,
    };
    let v = p.expr()?;
    if p.pos < p.toks.len() {
        let rest = p.next();
        if let Some((Tok::RParen, _)) = rest {
            return err("unbalanced parentheses");
        }
        return Err(p.unexpected(rest));
    }
    if v.is_nan() {
        return err("the result is not a real number");
    }
    if v.is_infinite() {
        return err("the result is too large");
    }
    Ok(v)
}

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

/// Resolve an IANA time zone name (case-insensitive; `UTC` by default).
///
/// # Errors
/// A message naming the unknown zone and how to spell one.
pub fn parse_timezone(name: &str) -> Result<chrono_tz::Tz, String> {
    let name = name.trim();
    if let Ok(tz) = name.parse::<chrono_tz::Tz>() {
        return Ok(tz);
    }
    chrono_tz::TZ_VARIANTS
        .iter()
        .find(|tz| tz.name().eq_ignore_ascii_case(name))
        .copied()
        .ok_or_else(|| {
            format!("unknown time zone `{name}`: use an IANA name such as `Europe/Paris`, `America/New_York` or `UTC`")
        })
}

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
            Some(name) => parse_timezone(name).map_err(ToolError::Failed)?,
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
    fn check_arguments(&self, args: &Value) -> Result<(), String> {
        match args.get("inputSchema") {
            Some(s) => schema::check_schema(s).map_err(|e| format!("/inputSchema: {e}")),
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
        assert!(
            e.starts_with("/inputSchema: schema at /type: \"nope\" is not valid"),
            "{e}"
        );
    }
}
