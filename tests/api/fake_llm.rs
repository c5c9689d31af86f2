//! The fake OpenAI-compatible model the tests script: the workspace's `fake-openai` crate (shared
//! with `pes-bench`), under the name the tests use.

pub use fake_openai::{FakeLlm, Reply, item_of, phase_of, plan, plan_item};
