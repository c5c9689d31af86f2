//! What a model call sees of the run beyond its own conversation: an item's brief (the query, the
//! plan, the results it may read, its role and its goal) and the results the synthesizer reads.
//! Items read compacted outputs, never whole histories, so a long plan's prompts stay bounded;
//! and what earlier runs of the thread did reaches a prompt only as a bounded summary
//! ([`prompts::Earlier`]), so a long thread's prompts stay bounded too.

use crate::model::{ContextMode, ItemStatus, TodoItem};

use super::Engine;
use super::journal::Ctx;
use super::prompts::{self, Brief, Earlier, EarlierLine, Outcome, ResultLine, truncate};

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
                .and_then(|r| ctx.env.cfg.roles.as_ref()?.get(r))
                .map(|r| (r.name.as_str(), r.system_prompt_fragment.as_str())),
            item_id: item.id.as_str(),
            description: &item.description,
            expected_outcome: item.expected_outcome.as_deref(),
            required_tools: &item.required_tools,
        })
    }

    /// What an item reads of the others (`contextMode`): with `dependencies` (the default), the
    /// compacted output of each of its dependencies, and, for a team's child, of the team's
    /// dependencies (the context the team was planned with); with `all`, of every completed item
    /// of this run, after the bounded summary of earlier runs' items ([`Earlier`]).
    pub(super) fn context_lines(&self, ctx: &Ctx<'_>, item: &TodoItem) -> Vec<ResultLine> {
        let wanted: Vec<&crate::model::ItemId> = match ctx.env.cfg.context_mode.unwrap_or_default()
        {
            ContextMode::All => {
                let mut lines: Vec<ResultLine> = self
                    .earlier(ctx, prompts::EARLIER_ITEMS_IN_SYNTHESIS)
                    .shown
                    .into_iter()
                    .filter(|l| l.status == ItemStatus::Completed)
                    .map(|l| ResultLine {
                        id: l.id,
                        description: l.description,
                        outcome: Outcome::Completed(l.output),
                    })
                    .collect();
                lines.extend(self.result_lines_of(ctx, |it| {
                    it.id != item.id && it.status == ItemStatus::Completed && this_runs(ctx, it)
                }));
                return lines;
            }
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

    /// What the synthesis reads: the compacted output of every top-level item of this run, or
    /// why it did not complete (a team's output already holds its children's). Earlier runs'
    /// items reach it only through [`Engine::earlier`].
    pub(super) fn result_lines(&self, ctx: &Ctx<'_>) -> Vec<ResultLine> {
        self.result_lines_of(ctx, |it| it.parent_item_id.is_none() && this_runs(ctx, it))
    }

    /// The bounded summary of the top-level items earlier runs finished, for the planner of a
    /// follow-up, the synthesis and an item with `contextMode` `all`: the latest `shown` of them,
    /// in plan order, each on one line, and how many there are.
    pub(super) fn earlier(&self, ctx: &Ctx<'_>, shown: usize) -> Earlier {
        let finished: Vec<&TodoItem> = ctx
            .items
            .iter()
            .filter(|it| {
                it.parent_item_id.is_none()
                    && it.status != ItemStatus::Pending
                    && !this_runs(ctx, it)
            })
            .collect();
        let skip = finished.len().saturating_sub(shown);
        Earlier {
            total: finished.len(),
            shown: finished[skip..]
                .iter()
                .map(|it| {
                    let output = match it.status {
                        ItemStatus::Completed => it
                            .compacted_output
                            .as_deref()
                            .or(it.result.as_deref())
                            .unwrap_or("")
                            .to_owned(),
                        _ => it
                            .error
                            .as_ref()
                            .map_or_else(|| "did not complete".to_owned(), |e| e.message.clone()),
                    };
                    EarlierLine::of(it, &output)
                })
                .collect(),
        }
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

/// Whether `it` belongs to the run being driven: planned (or re-planned) by it, or started by
/// it. Every other item was finished by an earlier run of the thread.
pub(super) fn this_runs(ctx: &Ctx<'_>, it: &TodoItem) -> bool {
    it.run_id == Some(ctx.run.run_id)
}
