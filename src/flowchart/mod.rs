//! Flowcharts as tools: an operator's fixed procedure, registered per tenant
//! and mounted as one tool the model decides when to call. Each call runs in a fresh state,
//! durably: every executed stage commits a `FLOWCHART_STEP` observation with what it read and
//! wrote, so a crash resumes after the last committed stage.

mod evidence;
pub mod expr;
pub mod host;
pub mod interpreter;
pub mod model;
pub mod tool;
pub mod validate;

pub use model::{DecideRule, Expr, Flowchart, FlowchartRecord, FlowchartSpec, SelectRule, Stage};

#[cfg(test)]
mod tests;
