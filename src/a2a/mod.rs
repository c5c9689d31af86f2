//! A2A (DESIGN.md §6.4): serving our agent to other agents, and delegating to remote ones.

pub mod client;
