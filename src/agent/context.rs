//! What a model call sees of the run beyond its own conversation: an item's brief (the query, the
//! plan, the results it may read, its role and its goal) and the results the synthesizer reads.
//! Items read compacted outputs, never whole histories, so a long plan's prompts stay bounded.

use crate::model::{ContextMode, ItemStatus, TodoItem};

use super::Engine;
use super::journal::Ctx;
use super::prompts::{self, Brief, Outcome, ResultLine, truncate};

impl Engine {
    /// The first user message of an item's conversation: what it is for and what came before.
    pub(super) fn item_brief(&self, ctx: &Ctx<'_>, item: &TodoItem) -> String {
        prompts::item_brief(&Brief {
            query: &ctx.run.query,
            plan: ctx.state.plan.as_deref(),
            earlier: self.context_lines(ctx, item),
            role: item
                .role
                .as_ref()
                .and_then(|r| ctx.cfg.roles.as_ref()?.get(r))
                .map(|r| (r.name.as_str(), r.system_prompt_fragment.as_str())),
            item_id: item.id.as_str(),
            description: &item.description,
            expected_outcome: item.expected_outcome.as_deref(),
            required_tools: &item.required_tools,
        })
    }

    /// What an item reads of the others (`contextMode`): with `dependencies` (the default), the
    /// compacted output of each of its dependencies, and, for a team's child, of the team's
    /// dependencies (the context the team was planned with); with `all`, of every completed item.
    pub(super) fn context_lines(&self, ctx: &Ctx<'_>, item: &TodoItem) -> Vec<ResultLine> {
        let wanted: Vec<&crate::model::ItemId> = match ctx.cfg.context_mode.unwrap_or_default() {
            ContextMode::All => ctx
                .items
                .iter()
                .filter(|i| i.id != item.id)
                .map(|i| &i.id)
                .collect(),
            ContextMode::Dependencies => {
                let mut ids: Vec<&crate::model::ItemId> = item.dependencies.iter().collect();
                let mut parent = item.parent_item_id.as_ref();
                while let Some(p) = parent {
                    let Some(team) = ctx.items.iter().find(|i| &i.id == p) else {
                        break;
                    };
                    ids.extend(team.dependencies.iter());
                    parent = team.parent_item_id.as_ref();
                }
                ids
            }
        };
        self.result_lines_of(ctx, |it| {
            wanted.contains(&&it.id) && it.status == ItemStatus::Completed
        })
    }

    /// What the synthesis reads: every top-level item's compacted output, or why it did not
    /// complete (a team's output already holds its children's).
    pub(super) fn result_lines(&self, ctx: &Ctx<'_>) -> Vec<ResultLine> {
        self.result_lines_of(ctx, |it| it.parent_item_id.is_none())
    }

    /// Finished items among those `pick` selects: the compacted output of a completed one (its
    /// result truncated to `step_output_chars` when it has none yet), or why it did not complete.
    fn result_lines_of(&self, ctx: &Ctx<'_>, pick: impl Fn(&TodoItem) -> bool) -> Vec<ResultLine> {
        ctx.items
            .iter()
            .filter(|it| pick(it))
            .filter_map(|it| {
                let why = || {
                    it.error
                        .as_ref()
                        .map_or_else(|| "unknown error".to_owned(), |e| e.message.clone())
                };
                let outcome = match it.status {
                    ItemStatus::Completed => Outcome::Completed(match &it.compacted_output {
                        Some(c) => c.clone(),
                        None => truncate(
                            it.result.as_deref().unwrap_or(""),
                            self.settings.step_output_chars,
                        ),
                    }),
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
