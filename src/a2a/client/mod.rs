//! The A2A client: the remote agents the operator configured (`PES_A2A_AGENTS`) and what our
//! runs need of them: their cards, JSON-RPC calls and streams, each reached through `net` (the
//! SSRF guard, headers only to configured origins, bounded reads). The delegation itself is run
//! by the engine (`agent/delegation/`).

pub mod agents;
pub mod card;
pub mod config;
pub mod net;
pub mod rpc;
