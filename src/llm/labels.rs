//! The labels of the briefs the engine writes (`agent::prompts` builds the briefs with them).
//! They are a contract with every reader of the prompts, the offline model first among them: it
//! reads these lines (never hidden hints), so a prompt change that breaks them breaks its tests.
//! They live here, below both the engine and the providers, so the offline model reads them
//! without importing the engine.

/// First line of an item brief and of the synthesis brief: `User query: <query>`.
pub const QUERY: &str = "User query: ";
/// `Plan: <the plan's prose>`.
pub const PLAN: &str = "Plan: ";
/// Header of the results an item reads (its dependencies', or every finished item's).
pub const EARLIER_RESULTS: &str = "Results of earlier items:";
/// Header of the results the synthesis reads: this run's items, the answer's material.
pub const ITEM_RESULTS: &str = "Results of the plan's items:";
/// `Role: <name>` then the role's fragment, before the item's goal.
pub const ROLE: &str = "Role: ";
/// `Your item [<id>]: <description>`.
pub const ITEM: &str = "Your item [";
/// `Expected outcome: <text>`.
pub const EXPECTED: &str = "Expected outcome: ";
/// `Required tools: a, b`.
pub const REQUIRED_TOOLS: &str = "Required tools: ";
/// In the planning system prompt, before one `- <name>: <description>` line per tool.
pub const AVAILABLE_TOOLS: &str = "Available tools:";
/// In the planning system prompt: `Use at most <n> items.`
pub const MAX_ITEMS: &str = "Use at most ";
/// First words of the refinement note (a follow-up query's planning request).
pub const REFINEMENT: &str = "This thread already has a plan.";
/// In the refinement note: `Finished items of earlier runs: <n> in all, the last <k> below…:`,
/// then one `- <id> [<status>]: <description> (result: <output>)` line each.
pub const EARLIER_ITEMS: &str = "Finished items of earlier runs: ";
/// In the refinement note, before one `- <id> [pending]: <description>` line per item no run
/// started, each followed, when it has dependencies, by `  depends on: a, b`.
pub const NOT_STARTED: &str = "Items not started yet:";
/// The dependencies line of an item not started yet (after two spaces).
pub const DEPENDS_ON: &str = "depends on: ";
/// In the synthesis brief, before the earlier items (context only):
/// `Earlier items of this thread, for context: <n> in all, the last <k> below…:`.
pub const EARLIER_CONTEXT: &str = "Earlier items of this thread, for context: ";
/// First line of the text a compaction request summarizes: `Result of item [<id>] <description>:`
pub const TO_COMPACT: &str = "Result of item [";
