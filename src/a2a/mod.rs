//! A2A (agent-to-agent protocol, v1.0 with the v0.3 method names accepted too): this service as
//! an A2A agent other agents call, and ([`client`]) delegating to remote agents. [`types`] and [`rpc`] hold the protocol's data types and its
//! JSON-RPC envelope and errors, for both protocol versions (the client reuses them); [`card`]
//! the agent card; [`server`] the `POST /a2a` methods; [`tasks`] how a run is seen as a task;
//! [`stream`] a task's updates streamed from the observation log.

pub mod card;
pub mod client;
pub mod rpc;
pub mod server;
pub mod stream;
pub mod tasks;
pub mod types;
