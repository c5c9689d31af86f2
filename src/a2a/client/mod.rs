//! The A2A client: the remote agents the operator configured (`PES_A2A_AGENTS`) and what our
//! runs need of them. (The delegation itself comes in a later slice; see the issue notes.)

pub mod agents;
pub mod card;
pub mod config;
pub mod rpc;
