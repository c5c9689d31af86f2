//! JSON rules every layer shares, kept at the bottom so nothing imports upward for them:
//! [`strict`] reads a value into a type exactly as its schema says (a struct only from an
//! object), and [`schema`] validates a value against a JSON Schema with the service's wording.

pub mod schema;
pub mod strict;
