//! A registered flowchart as a run sees it: its definition, pinned for the run, and its input
//! schema compiled once, offered to the model as one more tool.

use std::sync::Arc;

use super::model::FlowchartRecord;
use crate::json::schema::{CompiledSchema, SchemaError};
use crate::model::ToolSpec;

/// A flowchart mounted as a tool.
#[derive(Debug, Clone)]
pub struct FlowTool {
    pub record: Arc<FlowchartRecord>,
    pub schema: Arc<CompiledSchema>,
}

impl FlowTool {
    /// Mount `record`.
    ///
    /// # Errors
    /// Its input schema does not compile (it was checked when it was stored, so only a record
    /// stored by an older version can fail here).
    pub fn new(record: FlowchartRecord) -> Result<Self, SchemaError> {
        let schema = CompiledSchema::compile(&record.spec.input_schema())?;
        Ok(Self {
            record: Arc::new(record),
            schema: Arc::new(schema),
        })
    }

    /// The function the model sees.
    pub fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.record.name.clone(),
            description: self.record.spec.description.clone(),
            parameters: self.record.spec.input_schema(),
        }
    }

    /// Check a call's arguments against the input schema.
    ///
    /// # Errors
    /// Every problem, with its JSON path.
    // Text by design: the model reads it (as the call's invalid-arguments error).
    pub fn validate(&self, args: &serde_json::Value) -> Result<(), String> {
        if !args.is_object() {
            return Err("the arguments must be a JSON object".into());
        }
        self.schema.validate(args).map_err(|e| e.join("; "))
    }
}
