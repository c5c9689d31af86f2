//! pes-server: durable Plan-Execute-Synthesize agents behind an HTTP API.
//!
//! Crate map:
//! - [`model`]: domain types shared by every layer;
//! - [`store`]: all SQL, behind the [`store::Store`] trait (Postgres and SQLite);
//! - [`llm`]: model providers (`openai`, `offline`);
//! - [`tools`]: the tool registry and built-in tools.

pub mod llm;
pub mod model;
pub mod store;
pub mod tools;
