//! A2A (agent-to-agent protocol, v1.0 with the v0.3 method names accepted too), the protocol
//! side: [`types`] and [`rpc`] hold its data types and its JSON-RPC envelope and errors for both
//! versions, [`card`] the agent card, [`tasks`] how a run is seen as a task, and [`client`]
//! delegating to remote agents. The HTTP surface that serves this service as an A2A agent (the
//! card route, `POST /a2a`, its streams) is `crate::http::a2a`.

pub mod card;
pub mod client;
pub mod rpc;
pub mod tasks;
pub mod types;
