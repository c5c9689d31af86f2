//! pes-server: durable Plan-Execute-Synthesize agents behind an HTTP API.
//!
//! Crate map, by layer from the process down (a module uses only its own layer and those below;
//! `scripts/check-layers` checks it, and `docs/src/internals.md` explains it):
//! - [`app`], [`cli`]: start-up and shutdown ([`App::build`], [`App::run_until_stopped`]), and
//!   the command line;
//! - the doors: [`http`] (the REST API, SSE, and under it the A2A server, AG-UI, the MCP server
//!   and the console) and [`ask`] (`pes-server ask`, the terminal client); a door uses neither
//!   the store nor the engine, only the use cases;
//! - [`commands`]: the use cases every door calls ([`commands::UseCases`]: threads, runs and
//!   their checks, following a thread's observations, decisions carried out exactly once, forks,
//!   flowcharts, the tool catalogue, assistants, crons, webhooks, the memory store) and the run
//!   commands (store write, publish, wake, reach the local run); [`worker`]: claims runs under a
//!   lease and drives the engine; [`problem`]: why a request is refused, for every door;
//! - [`store`]: all SQL, in one concrete type [`store::SqlStore`] (Postgres and SQLite);
//!   [`registry`]: the runs this process drives; [`events`]: in-process fan-out of committed
//!   observations and token deltas; [`config`]: every setting (flag + `PES_*` variable);
//!   [`webhooks`]: signing and sending the webhook outbox (Standard Webhooks);
//! - [`agent`]: the PES engine (plan, execute, synthesize; durable call kinds);
//! - [`a2a`]: the A2A protocol types and the client that delegates to remote agents;
//! - [`llm`]: model providers (`openai`, `anthropic`, `offline`); [`tools`]: the tool registry,
//!   built-in, HTTP and MCP tools; [`flowchart`]: flowchart definitions, validation,
//!   expressions and the interpreter;
//! - [`telemetry`]: metrics, spans, trace export;
//! - leaves: [`model`] (domain types shared by every layer, a module per concept), [`json`]
//!   (strict reading and JSON Schema validation), [`text`] (cutting long text), [`redact`]
//!   (URLs with their secrets replaced), [`net`] (outbound HTTP clients), [`heap`] (returns
//!   freed heap memory to the system; "memory" elsewhere is the agent's memory store).

pub mod a2a;
pub mod agent;
pub mod app;
pub mod ask;
pub mod cli;
pub mod commands;
pub mod config;
pub mod events;
pub mod flowchart;
pub mod heap;
pub mod http;
pub mod json;
pub mod llm;
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
