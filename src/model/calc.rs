//! The calculator's arithmetic: a recursive-descent evaluator over `f64` with exact errors for
//! bad expressions. Pure, so the `calculator` tool and the offline model (which checks the
//! expressions it finds in a query with it) share one grammar without depending on each other.
//!
//! It never panics and is bounded: at most [`MAX_EXPRESSION_LEN`] characters and
//! [`MAX_NESTING`] levels of parentheses, unary signs or function calls.

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
