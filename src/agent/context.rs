//! What a model call sees of the run beyond its own conversation: an item's brief (the query, the
//! plan, the results it may read, its role and its goal) and the results the synthesizer reads.

use crate::model::{ItemStatus, TodoItem};

use super::Engine;
use super::journal::Ctx;
use super::prompts::{self, Brief, Outcome, ResultLine, truncate};

impl Engine {
    /// The first user message of an item's conversation: what it is for and what came before.
    pub(super) fn item_brief(&self, ctx: &Ctx<'_>, item: &TodoItem) -> String {
        prompts::item_brief(&Brief {
            query: &ctx.run.query,
            plan: ctx.state.plan.as_deref(),
            earlier: self.result_lines(ctx),
            role: None,
            item_id: item.id.as_str(),
            description: &item.description,
            expected_outcome: item.expected_outcome.as_deref(),
            required_tools: &item.required_tools,
        })
    }

    /// Finished items' results (or why they did not complete), truncated to `step_output_chars`.
    pub(super) fn result_lines(&self, ctx: &Ctx<'_>) -> Vec<ResultLine> {
        ctx.items
            .iter()
            .filter_map(|it| {
                let why = || {
                    it.error
                        .as_ref()
                        .map_or_else(|| "unknown error".to_owned(), |e| e.message.clone())
                };
                let outcome = match it.status {
                    ItemStatus::Completed => Outcome::Completed(truncate(
                        it.result.as_deref().unwrap_or(""),
                        self.settings.step_output_chars,
                    )),
                    ItemStatus::Failed => Outcome::Failed(why()),
                    ItemStatus::Cancelled => Outcome::Cancelled(why()),
                    _ => return None,
                };
                Some(ResultLine {
                    id: it.id.to_string(),
                    description: it.description.clone(),
                    outcome,
                })
            })
            .collect()
    }
}
