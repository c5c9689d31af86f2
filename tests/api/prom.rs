//! A strict reader of the Prometheus text exposition format (0.0.4): every line is a `# HELP`, a
//! `# TYPE` or a sample, names and labels follow the grammar, every sample belongs to a family
//! declared before it (at most one TYPE and one HELP per family), and each histogram series has
//! ascending `le` buckets with non-decreasing counts, ending in `+Inf` equal to its `_count`.
//! Anything else panics with the line, so a test that reads `/metrics` through it also proves
//! the whole page parses.

use std::collections::{BTreeMap, HashMap};

/// One sample's identity: its name and its labels (sorted).
pub type Series = (String, BTreeMap<String, String>);

/// A parsed page.
#[derive(Debug, Default)]
pub struct Page {
    pub samples: HashMap<Series, f64>,
    /// Family name → type.
    pub types: HashMap<String, String>,
    pub helps: HashMap<String, String>,
}

impl Page {
    /// The value of `name` with exactly these labels (0 when the series is absent).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let key = (
            name.to_owned(),
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        self.samples.get(&key).copied().unwrap_or(0.0)
    }
}

fn is_name(s: &str, colon: bool) -> bool {
    let mut chars = s.chars();
    let ok_first = |c: char| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':');
    chars.next().is_some_and(ok_first)
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
}

fn number(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// `{a="x",b="y"}` (the braces included) → labels; the rest of the line after it.
fn labels(line: &str, rest: &str) -> (BTreeMap<String, String>, String) {
    let mut out = BTreeMap::new();
    let mut chars = rest.chars().peekable();
    assert_eq!(chars.next(), Some('{'), "{line}");
    loop {
        if chars.peek() == Some(&'}') {
            chars.next();
            break;
        }
        let name: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        assert!(is_name(&name, false), "bad label name `{name}`: {line}");
        assert_eq!(chars.next(), Some('='), "{line}");
        assert_eq!(chars.next(), Some('"'), "{line}");
        let mut value = String::new();
        loop {
            match chars.next() {
                Some('\\') => match chars.next() {
                    Some('\\') => value.push('\\'),
                    Some('"') => value.push('"'),
                    Some('n') => value.push('\n'),
                    other => panic!("bad escape {other:?}: {line}"),
                },
                Some('"') => break,
                Some(c) => value.push(c),
                None => panic!("unterminated label value: {line}"),
            }
        }
        assert!(
            out.insert(name.clone(), value).is_none(),
            "label `{name}` twice: {line}"
        );
        match chars.next() {
            Some(',') => {}
            Some('}') => break,
            other => panic!("expected , or }} got {other:?}: {line}"),
        }
    }
    (out, chars.collect())
}

/// The family a sample belongs to, given the declared types.
fn family<'a>(name: &'a str, types: &HashMap<String, String>) -> &'a str {
    if types.contains_key(name) {
        return name;
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && matches!(
                types.get(base).map(String::as_str),
                Some("histogram" | "summary")
            )
        {
            return base;
        }
    }
    panic!("sample `{name}` has no # TYPE before it");
}

/// Parse a page strictly (see the module doc).
pub fn parse(text: &str) -> Page {
    let mut page = Page::default();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let (kind, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
            match kind {
                "HELP" => {
                    assert!(is_name(name, true), "{line}");
                    assert!(
                        page.helps.insert(name.into(), value.into()).is_none(),
                        "HELP twice: {line}"
                    );
                }
                "TYPE" => {
                    assert!(is_name(name, true), "{line}");
                    assert!(
                        matches!(
                            value,
                            "counter" | "gauge" | "histogram" | "summary" | "untyped"
                        ),
                        "{line}"
                    );
                    assert!(
                        page.types.insert(name.into(), value.into()).is_none(),
                        "TYPE twice: {line}"
                    );
                }
                _ => {} // a plain comment
            }
            continue;
        }
        assert!(!line.starts_with('#'), "bad comment: {line}");
        let end = line.find(['{', ' ']).expect("a sample has a value");
        let name = &line[..end];
        assert!(is_name(name, true), "bad metric name: {line}");
        let (labels, rest) = if line[end..].starts_with('{') {
            labels(line, &line[end..])
        } else {
            (BTreeMap::new(), line[end..].to_owned())
        };
        let mut fields = rest.split_whitespace();
        let value = fields
            .next()
            .and_then(number)
            .unwrap_or_else(|| panic!("bad value: {line}"));
        if let Some(ts) = fields.next() {
            ts.parse::<i64>()
                .unwrap_or_else(|_| panic!("bad timestamp: {line}"));
        }
        assert!(fields.next().is_none(), "trailing text: {line}");
        family(name, &page.types);
        assert!(
            page.samples
                .insert((name.to_owned(), labels), value)
                .is_none(),
            "sample twice: {line}"
        );
    }
    check_histograms(&page);
    page
}

fn check_histograms(page: &Page) {
    for (fam, _) in page.types.iter().filter(|(_, t)| *t == "histogram") {
        let bucket = format!("{fam}_bucket");
        let mut series: HashMap<BTreeMap<String, String>, Vec<(f64, f64)>> = HashMap::new();
        for ((name, labels), v) in &page.samples {
            if *name != bucket {
                continue;
            }
            let mut rest = labels.clone();
            let le = rest.remove("le").expect("a bucket has `le`");
            series
                .entry(rest)
                .or_default()
                .push((number(&le).expect("`le` is a number"), *v));
        }
        for (labels, mut buckets) in series {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            assert!(
                buckets.windows(2).all(|w| w[0].1 <= w[1].1),
                "{fam}{labels:?}: bucket counts decrease: {buckets:?}"
            );
            let (le, inf) = *buckets.last().unwrap();
            assert!(le.is_infinite(), "{fam}{labels:?} has no +Inf bucket");
            let count = page.samples.get(&(format!("{fam}_count"), labels.clone()));
            assert_eq!(
                count,
                Some(&inf),
                "{fam}{labels:?}: +Inf bucket is not _count"
            );
            assert!(
                page.samples
                    .contains_key(&(format!("{fam}_sum"), labels.clone())),
                "{fam}{labels:?} has no _sum"
            );
        }
    }
}

#[test]
fn the_reader_refuses_what_prometheus_would_refuse() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"\"} 3\n";
    assert_eq!(parse(ok).value("a_total", &[("x", "1"), ("y", "q\"")]), 3.0);
    for bad in [
        "a_total 1\n",                               // no TYPE
        "# TYPE a counter\na{x=1} 1\n",              // unquoted label value
        "# TYPE a counter\na 1 2 3\n",               // trailing text
        "# TYPE a counter\n# TYPE a counter\na 1\n", // TYPE twice
        "# TYPE 1a counter\n",                       // bad name
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 0\n",
    ] {
        assert!(std::panic::catch_unwind(|| parse(bad)).is_err(), "{bad}");
    }
}
