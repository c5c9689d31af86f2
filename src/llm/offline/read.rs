//! Reading the engine's prompts through their labels ([`crate::llm::labels`] is the contract):
//! the planning cap and the offered tools in the system prompt, the refinement note of a
//! follow-up, an item's brief, and the results sections of the briefs.

use crate::llm::labels;
use crate::llm::{ChatRequest, Role};
use crate::model::{ItemId, ItemStatus};

/// The tools a planning request offers: the `- <name>: <description>` lines after the system
/// prompt's `Available tools:`.
pub(super) fn available_tools(req: &ChatRequest) -> Vec<String> {
    texts(req, Role::System)
        .flat_map(|t| {
            t.lines()
                .skip_while(|l| *l != labels::AVAILABLE_TOOLS)
                .skip(1)
                .map_while(|l| l.strip_prefix("- "))
                .filter_map(|l| l.split_once(": ").map(|(name, _)| name.to_owned()))
        })
        .collect()
}

/// The texts of the messages of one role, in order.
fn texts(req: &ChatRequest, role: Role) -> impl DoubleEndedIterator<Item = &str> {
    req.messages
        .iter()
        .filter(move |m| m.role == role)
        .map(|m| m.content.as_deref().unwrap_or(""))
}

/// The last user message: a planning request's query, a compaction request's text.
pub(super) fn last_user_text(req: &ChatRequest) -> Option<&str> {
    texts(req, Role::User).next_back()
}

/// The first user message: an item's brief, the synthesis brief.
pub(super) fn first_user_text(req: &ChatRequest) -> &str {
    texts(req, Role::User).next().unwrap_or("")
}

/// The planning cap: the last `Use at most <n> items.` line of the system prompt (the engine's
/// line follows any persona text); `None` when absent or zero.
pub(super) fn max_items(req: &ChatRequest) -> Option<usize> {
    texts(req, Role::System)
        .flat_map(str::lines)
        .filter_map(|l| {
            l.strip_prefix(labels::MAX_ITEMS)?
                .strip_suffix(" items.")?
                .parse::<usize>()
                .ok()
        })
        .next_back()
        .filter(|&n| n > 0)
}

/// One item of the refinement note.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct NoteEntry {
    pub(super) id: String,
    pub(super) status: ItemStatus,
    pub(super) description: String,
    /// The `depends on:` line under an item not started yet, when there is one.
    pub(super) dependencies: Option<Vec<String>>,
}

/// What the offline model reads in the refinement note of a follow-up's planning request.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Refinement {
    /// The items it lists: the latest finished ones of earlier runs, and the ones not started.
    pub(super) entries: Vec<NoteEntry>,
    /// Finished items of earlier runs in all (the note shows only the latest).
    pub(super) earlier_total: usize,
}

/// The refinement note, when the request refines a plan: a user message before the query. Its
/// entries are `- <id> [<status>]: <description>`, a finished one followed by ` (result: …)`, one
/// not started by an indented `depends on: a, b` line when it has dependencies; only lines with
/// a valid id and status are entries. `Finished items of earlier runs: <n> in all, …` gives the
/// count.
pub(super) fn read_refinement(req: &ChatRequest) -> Refinement {
    let Some(note) = texts(req, Role::User)
        .rev()
        .skip(1)
        .find(|t| t.starts_with(labels::REFINEMENT))
    else {
        return Refinement::default();
    };
    let mut out = Refinement::default();
    for line in note.lines().skip(1) {
        if let Some(count) = line.strip_prefix(labels::EARLIER_ITEMS) {
            out.earlier_total = count
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            continue;
        }
        if let Some(deps) = line
            .strip_prefix("  ")
            .and_then(|l| l.strip_prefix(labels::DEPENDS_ON))
        {
            if let Some(last) = out.entries.last_mut() {
                last.dependencies = Some(
                    deps.split(',')
                        .map(str::trim)
                        .filter(|d| !d.is_empty())
                        .map(str::to_owned)
                        .collect(),
                );
            }
            continue;
        }
        let entry = (|| {
            let (id, rest) = line.strip_prefix("- ")?.split_once(" [")?;
            let (status, rest) = rest.split_once("]: ")?;
            ItemId::parse(id).ok()?;
            let status = status.parse::<ItemStatus>().ok()?;
            let description = rest.split_once(" (result: ").map_or(rest, |(d, _)| d);
            Some(NoteEntry {
                id: id.to_owned(),
                status,
                description: description.to_owned(),
                dependencies: None,
            })
        })();
        out.entries.extend(entry);
    }
    out
}

/// Whether a line of a brief starts the part that follows the query.
fn ends_the_query(line: &str) -> bool {
    line.starts_with(labels::PLAN)
        || line.starts_with(labels::EARLIER_CONTEXT)
        || line == labels::EARLIER_RESULTS
        || line == labels::ITEM_RESULTS
        || line.starts_with(labels::ROLE)
        || line.starts_with(labels::ITEM)
}

/// A brief's query (`User query: …`, which may run over several lines) and the index of the
/// first line after it.
pub(super) fn brief_query(lines: &[&str]) -> (String, usize) {
    let Some(first) = lines.first().and_then(|l| l.strip_prefix(labels::QUERY)) else {
        return (String::new(), 0);
    };
    let end = lines[1..]
        .iter()
        .position(|l| ends_the_query(l))
        .map_or(lines.len(), |i| i + 1);
    let mut query = vec![first];
    query.extend_from_slice(&lines[1..end]);
    (query.join("\n").trim().to_owned(), end)
}

/// The entries of the results section under `header`, each `<description>: <output>` with the
/// output's line breaks restored. The description and the output stay one text: a description
/// may itself hold `: ` (the answer items' do), so the line cannot say where it ends, and the
/// offline model only ever quotes the two together. A failed or cancelled item's output reads
/// `FAILED (…)` or `CANCELLED (…)`.
pub(super) fn results_section(lines: &[&str], header: &str) -> Vec<String> {
    let Some(start) = lines.iter().position(|l| *l == header) else {
        return Vec::new();
    };
    let mut entries: Vec<String> = Vec::new();
    for line in &lines[start + 1..] {
        if let Some((_id, text)) = line
            .strip_prefix("- [")
            .and_then(|rest| rest.split_once("] "))
        {
            entries.push(text.to_owned());
        } else if let (Some(more), Some(entry)) = (line.strip_prefix("  "), entries.last_mut()) {
            entry.push('\n');
            entry.push_str(more);
        } else {
            break;
        }
    }
    entries
}

/// What the offline model reads in an item's brief.
#[derive(Debug, Default, PartialEq)]
pub(super) struct ItemBrief {
    pub(super) query: String,
    /// The item's id: its tool call ids carry it, so parallel items never share one.
    pub(super) item_id: String,
    pub(super) description: String,
    pub(super) required_tools: Vec<String>,
    /// Entries of `Results of earlier items:` (see [`results_section`]).
    pub(super) earlier: Vec<String>,
}

/// Read an item brief (`prompts::item_brief`): the query, the results, then, after the role, the
/// last `Your item [<id>]: <description>` line (the description runs until `Expected outcome:` or
/// `Required tools:`), and the required tools.
pub(super) fn read_item_brief(text: &str) -> ItemBrief {
    let lines: Vec<&str> = text.lines().collect();
    let (query, after_query) = brief_query(&lines);
    let rest = &lines[after_query..];
    let earlier = results_section(rest, labels::EARLIER_RESULTS);
    // The last such line: the plan and the role's fragment come before it and are free text.
    let Some(at) = rest.iter().rposition(|l| l.starts_with(labels::ITEM)) else {
        return ItemBrief {
            query,
            earlier,
            ..Default::default()
        };
    };
    let (item_id, first) = rest[at][labels::ITEM.len()..]
        .split_once("]: ")
        .unwrap_or(("", ""));
    let is_field =
        |l: &&str| l.starts_with(labels::EXPECTED) || l.starts_with(labels::REQUIRED_TOOLS);
    let mut description = vec![first];
    description.extend(rest[at + 1..].iter().take_while(|l| !is_field(l)));
    let required_tools = rest[at + 1..]
        .iter()
        .find_map(|l| l.strip_prefix(labels::REQUIRED_TOOLS))
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    ItemBrief {
        query,
        item_id: item_id.to_owned(),
        description: description.join("\n").trim().to_owned(),
        required_tools,
        earlier,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::prompts::{Outcome, ResultLine};
    use crate::llm::offline::testing::*;

    #[test]
    fn an_item_brief_is_read_through_its_labels() {
        let req = execute_request(
            "what is 2+2\nand more",
            "Compose the answer to: what is 2+2",
            &["calculator", "current_time"],
            vec![
                completed("step-1", "Calculate 2+2", "2+2 = 4\nsecond line"),
                ResultLine {
                    id: "step-2".into(),
                    description: "Ask the user".into(),
                    outcome: Outcome::Failed("no answer".into()),
                },
            ],
        );
        assert_eq!(
            read_item_brief(first_user_text(&req)),
            ItemBrief {
                query: "what is 2+2\nand more".into(),
                item_id: "step-9".into(),
                description: "Compose the answer to: what is 2+2".into(),
                required_tools: vec!["calculator".into(), "current_time".into()],
                earlier: vec![
                    "Calculate 2+2: 2+2 = 4\nsecond line".into(),
                    "Ask the user: FAILED (no answer)".into()
                ],
            }
        );
        assert_eq!(read_item_brief("no labels at all"), ItemBrief::default());
    }
}
