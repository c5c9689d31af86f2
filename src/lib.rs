//! pes-server: durable Plan-Execute-Synthesize agents behind an HTTP API.
//!
//! Crate map:
//! - [`a2a`]: the A2A server (agent card, JSON-RPC `POST /a2a`) and the protocol types;
//! - [`app`]: start-up and shutdown ([`App::build`], [`App::run_until_stopped`]);
//! - [`ask`]: `pes-server ask`, the terminal client that follows a run and asks the person;
//! - [`cli`]: the command line (what to do, and the settings);
//! - [`config`]: every setting (flag + `PES_*` environment variable);
//! - [`http`]: routers per resource, problem+json errors, SSE;
//! - [`json`]: strict reading of request bodies and JSON Schema validation, shared by every layer;
//! - [`agent`]: the PES engine, pure logic over traits;
//! - [`commands`]: the use-case layer every door calls ([`commands::UseCases`]: enqueue with its
//!   checks, the wait for a run, decisions, config checks) and the run commands (store write,
//!   publish, wake, reach the local run);
//! - [`worker`]: claims runs under a lease and drives the engine;
//! - [`registry`]: the runs this process drives, so commands reach them at once;
//! - [`events`]: in-process fan-out of committed observations, and wake-ups from other replicas;
//! - [`store`]: all SQL, in one concrete type [`store::SqlStore`] (Postgres and SQLite);
//! - [`llm`]: model providers (`openai`, `anthropic`, `offline`);
//! - [`tools`]: the tool registry and built-in tools;
//! - [`memory`]: returns freed heap memory to the system (glibc);
//! - [`text`]: cutting long text for messages;
//! - [`redact`]: URLs with their secrets replaced, for logs and errors;
//! - [`problem`]: why a request is refused ([`problem::ApiError`]), for every door;
//! - [`model`]: domain types shared by every layer, a module per concept;
//! - [`flowchart`]: flowchart definitions, validation, expressions and the interpreter;
//! - [`net`]: outbound HTTP clients;
//! - [`telemetry`]: metrics, spans, trace export;
//! - [`webhooks`]: signing and sending the webhook outbox (Standard Webhooks).

pub mod a2a;
pub mod agent;
pub mod app;
pub mod ask;
pub mod cli;
pub mod commands;
pub mod config;
pub mod events;
pub mod flowchart;
pub mod http;
pub mod json;
pub mod llm;
pub mod memory;
pub mod model;
pub mod net;
pub mod problem;
pub mod redact;
pub mod registry;
pub mod store;
pub mod telemetry;
pub mod text;
pub mod tools;
pub mod webhooks;
pub mod worker;

pub use app::App;
pub use config::Config;
