//! The one integration test binary: black-box tests over HTTP against the app spawned on port 0,
//! a fake OpenAI-compatible LLM, and real Postgres and SQLite stores.
// Test servers and clients are tasks of the test itself.
#![allow(clippy::disallowed_methods)]

mod a2a_client;
mod a2a_delegation;
mod a2a_server;
mod agent;
mod anthropic;
mod ask;
mod assistant_runs;
mod assistants;
mod browser;
mod connections;
mod console;
mod contract;
mod crons;
mod db;
mod durability;
mod fake_llm;
mod flowchart_runs;
mod flowchart_store;
mod flowcharts;
mod fuzz;
mod graph;
mod helpers;
mod history;
mod hitl;
mod http;
mod http_tool;
mod item_times;
mod long_threads;
mod mcp;
mod metrics;
mod openapi;
mod otel;
mod packaging;
mod payloads;
mod process;
mod prom;
mod reclaim;
mod reporting;
mod startup;
mod store;
mod teams;
mod tenancy;
mod tokens;
mod tool_safety;
mod tools;
mod webhook_durability;
mod webhooks;
