//! What a model call sees of the run beyond its own conversation: an item's brief (the query, the
//! plan, the results of earlier items, its goal) and the earlier items' results the synthesizer
//! and the offline model read.

use crate::model::{ItemStatus, TodoItem};

use super::Engine;
use super::journal::Ctx;
use super::prompts::truncate;

impl Engine {
    /// The first user message of an item's conversation: what it is for and what came before.
    pub(super) fn item_brief(&self, ctx: &Ctx<'_>, item: &TodoItem) -> String {
        let mut s = format!("User query: {}\n", ctx.run.query);
        if let Some(p) = &ctx.state.plan {
            s.push_str(&format!("Plan: {p}\n"));
        }
        let outputs = self.step_outputs_text(ctx);
        if !outputs.is_empty() {
            s.push_str("Results of earlier items:\n");
            s.push_str(&outputs);
        }
        s.push_str(&format!(
            "\nYour item [{}]: {}\n",
            item.id, item.description
        ));
        if let Some(e) = &item.expected_outcome {
            s.push_str(&format!("Expected outcome: {e}\n"));
        }
        if !item.required_tools.is_empty() {
            s.push_str(&format!(
                "Required tools: {}\n",
                item.required_tools.join(", ")
            ));
        }
        s
    }

    /// Earlier items' results (or failures), one line each, truncated to `step_output_chars`.
    pub(super) fn step_outputs_text(&self, ctx: &Ctx<'_>) -> String {
        let mut s = String::new();
        for it in &ctx.items {
            match it.status {
                ItemStatus::Completed => s.push_str(&format!(
                    "- [{}] {}: {}\n",
                    it.id,
                    it.description,
                    truncate(
                        it.result.as_deref().unwrap_or(""),
                        self.settings.step_output_chars
                    )
                )),
                ItemStatus::Failed => s.push_str(&format!(
                    "- [{}] {}: FAILED ({})\n",
                    it.id,
                    it.description,
                    it.error
                        .as_ref()
                        .map(|e| e.message.as_str())
                        .unwrap_or("unknown error")
                )),
                _ => {}
            }
        }
        s
    }

    /// The same results as (description, output) pairs, the offline model's hints.
    pub(super) fn step_output_pairs(&self, ctx: &Ctx<'_>) -> Vec<(String, String)> {
        ctx.items
            .iter()
            .filter(|i| i.status == ItemStatus::Completed || i.status == ItemStatus::Failed)
            .map(|i| {
                let out = match (&i.result, &i.error) {
                    (Some(r), _) if i.status == ItemStatus::Completed => {
                        truncate(r, self.settings.step_output_chars)
                    }
                    (_, Some(e)) => format!("failed: {}", e.message),
                    _ => String::new(),
                };
                (i.description.clone(), out)
            })
            .collect()
    }
}
