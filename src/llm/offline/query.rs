//! Reading the query's prose, the only prose the offline model interprets: arithmetic
//! expressions (checked with the calculator's own parser), a question about the time and its zone,
//! "ask me", the names of other available tools with their JSON arguments, and the query's
//! independent parts.

use serde_json::{Value, json};

use crate::model::calc::evaluate;
use crate::model::time_zone::parse_timezone;

/// Tools the offline model has rules of its own for.
const BUILTIN_RULES: &[&str] = &["calculator", "current_time", "ask_user"];
/// Fewest words a piece of a query needs to be an independent part.
const MIN_PART_WORDS: usize = 2;

fn is_date_like(s: &str) -> bool {
    let parts: Vec<&str> = s.split(['-', '/']).collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// Arithmetic expressions in a text: maximal runs of digits, operators, parentheses, decimal
/// points and spaces that contain an operator and that the calculator accepts.
pub(super) fn detect_expressions(text: &str) -> Vec<String> {
    const OPS: &[char] = &['+', '-', '*', '/', '%', '^'];
    let allowed = |c: char| c.is_ascii_digit() || OPS.contains(&c) || "(). ".contains(c);
    let mut found: Vec<String> = Vec::new();
    for run in text.split(|c: char| !allowed(c)) {
        let mut cand = run.trim();
        loop {
            let before = cand.len();
            cand = cand
                .trim_start_matches(|c: char| "+*/%^).".contains(c) || c == ' ')
                .trim_end_matches(|c: char| "+-*/%^(.".contains(c) || c == ' ');
            if cand.len() == before {
                break;
            }
        }
        let has_operator = cand
            .char_indices()
            .any(|(i, c)| OPS.contains(&c) && (i > 0 || c != '-'));
        if !has_operator
            || !cand.chars().any(|c| c.is_ascii_digit())
            || is_date_like(cand)
            || evaluate(cand).is_err()
        {
            continue;
        }
        let cand = cand.to_owned();
        if !found.contains(&cand) {
            found.push(cand);
        }
    }
    found
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// "ask me …" / "ask the user …": the offline model then asks with `ask_user`.
pub(super) fn wants_a_question(query: &str) -> bool {
    let q = query.to_lowercase();
    q.contains("ask me") || q.contains("ask the user")
}

pub(super) fn asks_for_time(query: &str) -> bool {
    words(query).any(|w| matches!(w.as_str(), "time" | "date" | "today" | "clock"))
}

/// An IANA zone named in a text: an `Area/Location` token, `UTC`/`GMT`, or a capitalized
/// zone name such as `Japan`.
pub(super) fn detect_zone(text: &str) -> Option<String> {
    text.split_whitespace()
        .map(|t| t.trim_matches(|c: char| !(c.is_alphanumeric() || c == '_' || c == '/')))
        .find_map(|tok| {
            let plausible = tok.contains('/')
                || tok.eq_ignore_ascii_case("utc")
                || tok.eq_ignore_ascii_case("gmt")
                || (tok.len() >= 4 && tok.starts_with(|c: char| c.is_ascii_uppercase()));
            if !plausible || tok.chars().all(|c| c.is_ascii_digit() || c == '/') {
                return None;
            }
            if tok.contains('/')
                || tok.eq_ignore_ascii_case("utc")
                || tok.eq_ignore_ascii_case("gmt")
            {
                parse_timezone(tok).ok().map(|tz| tz.name().to_owned())
            } else {
                // Capitalized words must match a zone name exactly (no `Look` → nothing).
                tok.parse::<chrono_tz::Tz>()
                    .ok()
                    .map(|tz| tz.name().to_owned())
            }
        })
}

/// The tools (other than those with rules of their own) the query names, in the order named,
/// each with the JSON object that follows its name (after an optional `with`), else `{}`; and
/// the query without those arguments (so numbers inside them are not taken for arithmetic).
pub(super) fn named_calls(query: &str, available: &[String]) -> (Vec<(String, Value)>, String) {
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let mut found: Vec<(usize, String, Value, std::ops::Range<usize>)> = Vec::new();
    for name in available
        .iter()
        .filter(|n| !BUILTIN_RULES.contains(&n.as_str()))
    {
        for (at, _) in query.match_indices(name.as_str()) {
            let end = at + name.len();
            let bounded =
                !query[..at].ends_with(is_name_char) && !query[end..].starts_with(is_name_char);
            if !bounded {
                continue;
            }
            let after = query[end..].trim_start_matches(['`', '\'', '"', ' ']);
            let after = after.strip_prefix("with").unwrap_or(after).trim_start();
            let start = query.len() - after.len();
            let mut stream = serde_json::Deserializer::from_str(after).into_iter::<Value>();
            let (args, span) = match (after.starts_with('{'), stream.next()) {
                (true, Some(Ok(v @ Value::Object(_)))) => (v, start..start + stream.byte_offset()),
                _ => (json!({}), end..end),
            };
            found.push((at, name.clone(), args, span));
            break;
        }
    }
    found.sort_by_key(|f| f.0);
    let mut rest = query.to_owned();
    for (_, _, _, span) in found.iter().rev() {
        rest.replace_range(span.clone(), " ");
    }
    let calls = found.into_iter().map(|(_, n, a, _)| (n, a)).collect();
    (calls, rest)
}

/// The independent parts of a query: its pieces between `?`, `;` and line breaks that hold at
/// least [`MIN_PART_WORDS`] words, when there are at least two (a single part is the query).
pub(super) fn independent_parts(query: &str) -> Vec<String> {
    let mut parts: Vec<String> = Vec::new();
    for piece in query.split(['?', ';', '\n']) {
        let piece = piece.trim().trim_end_matches(['.', '!', ',']).trim_end();
        if words(piece).count() >= MIN_PART_WORDS && !parts.iter().any(|p| p == piece) {
            parts.push(piece.to_owned());
        }
    }
    if parts.len() < 2 { Vec::new() } else { parts }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_are_found_in_prose() {
        assert_eq!(
            detect_expressions("what is 12*(3+4) and 2^10?"),
            vec!["12*(3+4)", "2^10"]
        );
        assert_eq!(
            detect_expressions("Compute (1.5 + 2) * 3."),
            vec!["(1.5 + 2) * 3"]
        );
        assert_eq!(detect_expressions("what is -3 + 5"), vec!["-3 + 5"]);
        assert!(detect_expressions("in 2024 I had 3 cats").is_empty());
        assert!(detect_expressions("on 2024-05-01 at 10:30").is_empty());
        assert!(detect_expressions("what is 5% of 200").is_empty());
        assert!(detect_expressions("hello world").is_empty());
    }

    #[test]
    fn zones_are_found() {
        assert_eq!(
            detect_zone("what time is it in Europe/Paris?").as_deref(),
            Some("Europe/Paris")
        );
        assert_eq!(detect_zone("time in utc").as_deref(), Some("UTC"));
        assert_eq!(
            detect_zone("what time is it in Japan").as_deref(),
            Some("Japan")
        );
        assert_eq!(detect_zone("Look up the current time"), None);
        assert_eq!(detect_zone("what is 12/4"), None);
    }
}
