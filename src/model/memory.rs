//! Memory (the long-term store runs and the API share): what an item of the store is, how a namespace is spelled, and the
//! pure pieces of search shared by the store, the use cases and the tools: the text full-text
//! search reads from a value, the terms of a query, and embeddings (their bytes and cosine).
//!
//! A namespace is a path of labels (`["users", "42"]`). Each label is 1–128 characters, holds no
//! `.` (the query form of `GET /v1/store/items` joins labels with dots) and no control character
//! (the store joins labels with U+001F, which must sort below every character a label holds, so
//! that a prefix is a range and truncated namespaces stay sorted).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// The most characters of one namespace label.
pub const MAX_LABEL_CHARS: usize = 128;
/// The most characters of an item's key.
pub const MAX_KEY_CHARS: usize = 512;
/// The most terms of a full-text query that are searched (the rest are ignored).
pub const MAX_QUERY_TERMS: usize = 32;
/// The separator of labels in the stored form of a namespace (below every label character).
pub const STORED_SEPARATOR: char = '\u{1f}';

/// A checked namespace: 1 or more labels (0 for a prefix that matches everything).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Namespace(Vec<String>);

impl Namespace {
    /// `labels` as a namespace of at most `max_depth` labels; `allow_empty` for a prefix.
    ///
    /// # Errors
    /// What is wrong: no label, too many, or the first bad label (by its index).
    pub fn parse(
        labels: Vec<String>,
        max_depth: usize,
        allow_empty: bool,
    ) -> Result<Self, NamespaceError> {
        if labels.is_empty() && !allow_empty {
            return Err(NamespaceError::Empty);
        }
        if labels.len() > max_depth {
            return Err(NamespaceError::TooDeep {
                depth: labels.len(),
                max_depth,
            });
        }
        for (index, label) in labels.iter().enumerate() {
            check_label(label).map_err(|source| NamespaceError::Label {
                index,
                label: label.clone(),
                source,
            })?;
        }
        Ok(Self(labels))
    }

    /// A namespace from the dotted query form (`a.b` is `["a", "b"]`).
    ///
    /// # Errors
    /// As [`Namespace::parse`].
    pub fn from_dotted(dotted: &str, max_depth: usize) -> Result<Self, NamespaceError> {
        let labels = if dotted.is_empty() {
            vec![]
        } else {
            dotted.split('.').map(str::to_owned).collect()
        };
        Self::parse(labels, max_depth, false)
    }

    /// The namespace of a thread's memory when its config names none: `["threads", <id>]`.
    ///
    /// # Errors
    /// When the thread id holds a `.` (no label may): the thread must name its namespace.
    pub fn for_thread(thread_id: &str) -> Result<Self, ThreadNamespaceError> {
        Self::parse(
            vec!["threads".into(), thread_id.to_owned()],
            usize::MAX,
            false,
        )
        .map_err(|source| ThreadNamespaceError {
            thread_id: thread_id.to_owned(),
            source,
        })
    }

    /// A namespace read back from the store (checked when it was written).
    pub fn from_stored(stored: &str) -> Self {
        Self(stored.split(STORED_SEPARATOR).map(str::to_owned).collect())
    }

    /// The stored form: the labels joined by [`STORED_SEPARATOR`].
    pub fn stored(&self) -> String {
        self.0.join(&STORED_SEPARATOR.to_string())
    }

    /// The labels.
    pub fn labels(&self) -> &[String] {
        &self.0
    }

    /// How many labels.
    pub fn depth(&self) -> usize {
        self.0.len()
    }

    /// The labels joined by dots (the query form), for messages.
    pub fn dotted(&self) -> String {
        self.0.join(".")
    }
}

/// Why a namespace is not valid. The text is the API's (`/namespace` problems read
/// `<path> <message>`), so it starts with a verb.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceError {
    #[error("must have at least one label")]
    Empty,
    #[error("has {depth} labels; at most {max_depth} are allowed (PES_STORE_MAX_NAMESPACE_DEPTH)")]
    TooDeep { depth: usize, max_depth: usize },
    #[error("label {index} ({label:?}) {source}")]
    Label {
        index: usize,
        label: String,
        #[source]
        source: LabelError,
    },
}

/// A thread's default namespace (`["threads", <id>]`) is not valid: its id holds a `.`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the thread's default memory namespace [\"threads\", {thread_id:?}] is not valid ({source}): \
     set `memoryNamespace` in the thread's config"
)]
pub struct ThreadNamespaceError {
    pub thread_id: String,
    #[source]
    pub source: NamespaceError,
}

/// Why one label (or an item's key) is not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("is empty")]
    Empty,
    /// The message for a key says "must not be empty" (its API text).
    #[error("must not be empty")]
    EmptyKey,
    #[error("is longer than {0} characters")]
    TooLong(usize),
    #[error("holds a `.` (the query form joins labels with dots)")]
    Dot,
    #[error("holds a control character")]
    Control,
}

/// The API's callers put these messages in a problem's field list as text.
impl From<NamespaceError> for String {
    fn from(e: NamespaceError) -> Self {
        e.to_string()
    }
}

impl From<ThreadNamespaceError> for String {
    fn from(e: ThreadNamespaceError) -> Self {
        e.to_string()
    }
}

impl From<LabelError> for String {
    fn from(e: LabelError) -> Self {
        e.to_string()
    }
}

/// Whether `label` may be a namespace label.
fn check_label(label: &str) -> Result<(), LabelError> {
    if label.is_empty() {
        return Err(LabelError::Empty);
    }
    if label.chars().count() > MAX_LABEL_CHARS {
        return Err(LabelError::TooLong(MAX_LABEL_CHARS));
    }
    if label.contains('.') {
        return Err(LabelError::Dot);
    }
    if label.chars().any(char::is_control) {
        return Err(LabelError::Control);
    }
    Ok(())
}

/// Whether `key` may be an item's key: 1–512 characters, no control character.
///
/// # Errors
/// What is wrong with it.
pub fn check_key(key: &str) -> Result<(), LabelError> {
    if key.is_empty() {
        return Err(LabelError::EmptyKey);
    }
    if key.chars().count() > MAX_KEY_CHARS {
        return Err(LabelError::TooLong(MAX_KEY_CHARS));
    }
    if key.chars().any(char::is_control) {
        return Err(LabelError::Control);
    }
    Ok(())
}

/// One item of the store, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"namespace": ["users", "42"], "key": "favourite-colour", "value": {"fact": "The user's favourite colour is green"}, "createdAt": "2026-11-22T10:00:00Z", "updatedAt": "2026-11-22T10:00:00Z", "score": 0.61}))]
pub struct MemoryItem {
    /// The labels of its namespace.
    #[schema(value_type = Vec<String>)]
    pub namespace: Namespace,
    pub key: String,
    /// A JSON object.
    #[schema(value_type = Object)]
    pub value: Map<String, Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When the item expires (`ttlSeconds` after its last write); absent: never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// Relevance to a search's `query`, higher first: the database's full-text rank, or the
    /// cosine similarity of the embeddings in a semantic search. Absent without a query.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

/// Where an item is, as full-text tokens (SQLite's index holds them beside the text): one
/// decimal number per namespace prefix of the item, the empty one included, each a hash of the
/// tenant and the prefix. A search under a prefix asks for [`scope_token`] of it too, so the
/// full-text engine intersects the two instead of reading every match of the store. A hash may
/// collide: the store checks the exact prefix as well, so a collision costs time, never a wrong
/// item.
pub fn scope_tokens(tenant: &str, namespace: &Namespace) -> String {
    (0..=namespace.depth())
        .map(|n| scope_hash(tenant, &namespace.labels()[..n]).to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The token of a search under `prefix` (see [`scope_tokens`]).
pub fn scope_token(tenant: &str, prefix: Option<&Namespace>) -> String {
    scope_hash(tenant, prefix.map_or(&[], |p| p.labels())).to_string()
}

/// FNV-1a (64 bits) of the tenant and the labels, separated by U+001F: stable across versions
/// and processes, as stored tokens must be.
fn scope_hash(tenant: &str, labels: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(tenant.as_bytes());
    for l in labels {
        eat(&[0x1f]);
        eat(l.as_bytes());
    }
    h
}

/// The text full-text search (and embedding) reads from a value: its field names and its string,
/// number and boolean leaves, in document order, one per line.
pub fn searchable_text(value: &Value) -> String {
    let mut out = String::new();
    collect_text(value, &mut out);
    out
}

fn collect_text(value: &Value, out: &mut String) {
    let mut push = |s: &str| {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(s);
    };
    match value {
        Value::String(s) => push(s),
        Value::Number(n) => push(&n.to_string()),
        Value::Bool(b) => push(if *b { "true" } else { "false" }),
        Value::Null => {}
        Value::Array(items) => items.iter().for_each(|v| collect_text(v, out)),
        Value::Object(fields) => {
            for (name, v) in fields {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(name);
                collect_text(v, out);
            }
        }
    }
}

/// The words of a full-text query: runs of letters and digits, lower-cased, each once, at most
/// [`MAX_QUERY_TERMS`] (each at most 64 characters). Matching is on any of them; the ranking
/// favours items that hold more of them.
pub fn query_terms(query: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    for word in query.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() {
            continue;
        }
        let word: String = word.to_lowercase().chars().take(64).collect();
        if !terms.contains(&word) {
            terms.push(word);
        }
        if terms.len() == MAX_QUERY_TERMS {
            break;
        }
    }
    terms
}

/// An embedding as stored: its floats, little-endian.
pub fn embedding_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

/// An embedding read back; `None` when the bytes are not whole floats.
pub fn embedding_from_bytes(b: &[u8]) -> Option<Vec<f32>> {
    if !b.len().is_multiple_of(4) {
        return None;
    }
    Some(
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// Cosine similarity of two embeddings (−1 to 1); 0 when their lengths differ or one is zero.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    dot / (na.sqrt() * nb.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn namespaces_are_checked_and_stored_in_label_order() {
        let ns = Namespace::parse(vec!["users".into(), "42".into()], 10, false).unwrap();
        assert_eq!(ns.stored(), "users\u{1f}42");
        assert_eq!(Namespace::from_stored(&ns.stored()), ns);
        assert_eq!(Namespace::from_dotted("users.42", 10).unwrap(), ns);
        for bad in [
            vec![],
            vec!["".into()],
            vec!["a.b".into()],
            vec!["a\nb".into()],
        ] {
            assert!(Namespace::parse(bad.clone(), 10, false).is_err(), "{bad:?}");
        }
        assert!(Namespace::parse(vec!["x".repeat(129)], 10, false).is_err());
        assert!(Namespace::parse(vec!["a".into(); 3], 2, false).is_err());
        assert!(Namespace::parse(vec![], 2, true).is_ok());
        assert!(
            Namespace::for_thread("t.1")
                .unwrap_err()
                .to_string()
                .contains("memoryNamespace")
        );
        // A label that sorts below the separator's successor keeps prefixes contiguous:
        // "a-c" < "a.b" as text, but ["a"] < ["a", "b"] < ["a-c"] stored.
        let a = Namespace::parse(vec!["a".into()], 9, false)
            .unwrap()
            .stored();
        let ab = Namespace::parse(vec!["a".into(), "b".into()], 9, false)
            .unwrap()
            .stored();
        let ac = Namespace::parse(vec!["a-c".into()], 9, false)
            .unwrap()
            .stored();
        assert!(a < ab && ab < ac);
    }

    #[test]
    fn scope_tokens_name_every_prefix_of_the_tenant() {
        let ns = Namespace::parse(vec!["users".into(), "42".into()], 10, false).unwrap();
        let tokens = scope_tokens("acme", &ns);
        let all: Vec<&str> = tokens.split(' ').collect();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0], scope_token("acme", None));
        let users = Namespace::parse(vec!["users".into()], 10, false).unwrap();
        assert_eq!(all[1], scope_token("acme", Some(&users)));
        assert_eq!(all[2], scope_token("acme", Some(&ns)));
        assert_ne!(scope_token("other", Some(&ns)), all[2]);
        assert!(all.iter().all(|t| t.chars().all(|c| c.is_ascii_digit())));
    }

    #[test]
    fn keys_are_checked() {
        assert!(check_key("k").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key("a\u{0}").is_err());
        assert!(check_key(&"k".repeat(513)).is_err());
    }

    #[test]
    fn the_searchable_text_holds_names_and_leaves() {
        let v = json!({"food": "pizza", "n": 3, "tags": ["red", {"deep": true}], "none": null});
        assert_eq!(
            searchable_text(&v),
            "food\npizza\nn\n3\nnone\ntags\nred\ndeep\ntrue"
        );
    }

    #[test]
    fn query_terms_are_words_once() {
        assert_eq!(
            query_terms("What's the user's favourite colour? colour!"),
            vec!["what", "s", "the", "user", "favourite", "colour"]
        );
        assert_eq!(query_terms("  ,, "), Vec::<String>::new());
        assert_eq!(query_terms(&"w ".repeat(100)).len(), 1);
    }

    #[test]
    fn embeddings_round_trip_and_compare() {
        let v = vec![0.5f32, -1.0, 2.0];
        assert_eq!(embedding_from_bytes(&embedding_bytes(&v)), Some(v.clone()));
        assert_eq!(embedding_from_bytes(&[1, 2, 3]), None);
        assert!((cosine(&v, &v) - 1.0).abs() < 1e-9);
        assert!((cosine(&[1.0, 0.0], &[0.0, 1.0])).abs() < 1e-9);
        assert_eq!(cosine(&[1.0], &[1.0, 2.0]), 0.0);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 2.0]), 0.0);
    }
}
