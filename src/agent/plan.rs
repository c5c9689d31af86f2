//! Plans as the model writes them, their validation (ids, dependencies, cycles, tools, size) and
//! how a new list is merged into the existing todo list: for a refinement on a follow-up query and
//! for `update_plan` during execution. Items that already started are frozen: a plan change never
//! rewrites or removes them.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::Utc;
use serde::{Deserialize, Serialize};

use crate::model::{
    AgentRole, ItemId, ItemKind, ItemStatus, StepType, TodoItem, ToolValidationMode, Usage,
    ValidationStatus,
};

/// The `pes_plan` reply.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReply {
    pub title: String,
    pub intent: String,
    pub plan: String,
    pub todo_list: Vec<PlannedItem>,
}

/// One item as the model wrote it (unvalidated).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedItem {
    pub id: String,
    pub description: String,
    #[serde(default = "default_step_type")]
    pub step_type: String,
    #[serde(default)]
    pub required_tools: Vec<String>,
    #[serde(default)]
    pub expected_outcome: String,
    #[serde(default)]
    pub dependencies: Vec<String>,
    /// `leaf` (default) or `team`; null reads as `leaf`.
    #[serde(default)]
    pub kind: Option<String>,
    /// A role id of the thread's `roles`, or null.
    #[serde(default)]
    pub role: Option<String>,
    /// Tools the item may call; null = every enabled tool.
    #[serde(default)]
    pub tool_allowlist: Option<Vec<String>>,
}

fn default_step_type() -> String {
    "reasoning".into()
}

/// A planned item that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidItem {
    pub id: ItemId,
    pub description: String,
    pub step_type: StepType,
    pub required_tools: Vec<String>,
    pub expected_outcome: Option<String>,
    pub dependencies: Vec<ItemId>,
    pub kind: ItemKind,
    pub role: Option<String>,
    pub tool_allowlist: Option<Vec<String>>,
}

/// What a plan is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// Tools enabled for the thread.
    pub known_tools: &'a [String],
    /// The thread's roles.
    pub roles: Option<&'a BTreeMap<String, AgentRole>>,
    /// How many items the list may hold besides the frozen ones (`maxItems`): it bounds what
    /// one run plans, never the thread's history, so a thread's 200th follow-up has the room its
    /// first had.
    pub max_items: usize,
}

/// Validate a todo list against the frozen items (their ids) it may depend on, the tools that exist and the
/// size limit (which counts only the list's items that are not frozen). Every problem is listed, so one repair request can fix them all.
///
/// # Errors
/// The list of problems, each a sentence the model can act on.
pub fn validate(
    planned: &[PlannedItem],
    frozen: &[ItemId],
    rules: &Rules<'_>,
) -> Result<Vec<ValidItem>, Vec<String>> {
    // Text by design: the problems go to the model, in its repair request, as they are.
    let Rules {
        known_tools,
        roles,
        max_items,
    } = *rules;
    let mut errors = Vec::new();
    if planned.is_empty() && frozen.is_empty() {
        errors.push("todoList is empty: plan at least one item".to_owned());
    }
    let fresh = planned
        .iter()
        .filter(|p| !frozen.iter().any(|f| f.as_str() == p.id))
        .count();
    if fresh > max_items {
        errors.push(format!(
            "too many items: {fresh} (at most {max_items} besides the ones that already started)"
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(planned.len());
    let all_ids: HashSet<&str> = planned
        .iter()
        .map(|p| p.id.as_str())
        .chain(frozen.iter().map(ItemId::as_str))
        .collect();
    for p in planned {
        let id = match ItemId::parse(&p.id) {
            Ok(id) => id,
            Err(e) => {
                errors.push(format!("item id `{}` is invalid: {e}", p.id));
                continue;
            }
        };
        if !seen.insert(p.id.clone()) {
            errors.push(format!("item id `{}` is used twice", p.id));
        }
        if p.description.trim().is_empty() {
            errors.push(format!("item `{}` has an empty description", p.id));
        }
        let step_type = match p.step_type.parse::<StepType>() {
            Ok(t) => t,
            Err(_) => {
                errors.push(format!(
                    "item `{}` has stepType `{}`: use `tool` or `reasoning`",
                    p.id, p.step_type
                ));
                StepType::Reasoning
            }
        };
        for t in &p.required_tools {
            if !known_tools.iter().any(|k| k == t) {
                errors.push(format!(
                    "item `{}` requires unknown tool `{t}` (available: {})",
                    p.id,
                    if known_tools.is_empty() {
                        "none".to_owned()
                    } else {
                        known_tools.join(", ")
                    }
                ));
            }
        }
        let kind = match p.kind.as_deref() {
            None => ItemKind::Leaf,
            Some(k) => k.parse::<ItemKind>().unwrap_or_else(|_| {
                errors.push(format!(
                    "item `{}` has kind `{k}`: use `leaf` or `team`",
                    p.id
                ));
                ItemKind::Leaf
            }),
        };
        let role = p.role.clone().filter(|r| !r.trim().is_empty());
        let role_tools = match &role {
            None => None,
            Some(r) => match roles.and_then(|all| all.get(r)) {
                Some(def) => def.tools.as_ref(),
                None => {
                    let known: Vec<&str> = roles
                        .map(|all| all.keys().map(String::as_str).collect())
                        .unwrap_or_default();
                    errors.push(format!(
                        "item `{}` has unknown role `{r}` (roles: {})",
                        p.id,
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    ));
                    None
                }
            },
        };
        if let Some(list) = &p.tool_allowlist {
            for t in list {
                if !known_tools.iter().any(|k| k == t) {
                    errors.push(format!(
                        "item `{}` allows unknown tool `{t}` in toolAllowlist",
                        p.id
                    ));
                }
            }
            for t in &p.required_tools {
                if !list.contains(t) {
                    errors.push(format!(
                        "item `{}` requires tool `{t}` that its toolAllowlist does not allow: \
                         requiredTools must be a subset of toolAllowlist",
                        p.id
                    ));
                }
            }
        }
        if let Some(list) = role_tools {
            for t in &p.required_tools {
                if !list.contains(t) {
                    errors.push(format!(
                        "item `{}` requires tool `{t}` that its role `{}` may not use",
                        p.id,
                        role.as_deref().unwrap_or_default()
                    ));
                }
            }
        }
        let mut deps = Vec::new();
        for d in &p.dependencies {
            if d == &p.id {
                errors.push(format!("item `{}` depends on itself", p.id));
            } else if !all_ids.contains(d.as_str()) {
                errors.push(format!("item `{}` depends on unknown item `{d}`", p.id));
            } else if let Ok(d) = ItemId::parse(d)
                && !deps.contains(&d)
            {
                deps.push(d);
            }
        }
        out.push(ValidItem {
            id,
            description: p.description.trim().to_owned(),
            step_type,
            required_tools: p.required_tools.clone(),
            expected_outcome: Some(p.expected_outcome.trim().to_owned()).filter(|s| !s.is_empty()),
            dependencies: deps,
            kind,
            role,
            tool_allowlist: p.tool_allowlist.clone(),
        });
    }
    if let Some(cycle) = find_cycle(&out) {
        errors.push(format!("dependencies form a cycle: {}", cycle.join(" → ")));
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// A dependency cycle among the items, as the ids along it, if there is one.
fn find_cycle(items: &[ValidItem]) -> Option<Vec<String>> {
    let deps: HashMap<&str, Vec<&str>> = items
        .iter()
        .map(|i| {
            (
                i.id.as_str(),
                i.dependencies.iter().map(ItemId::as_str).collect(),
            )
        })
        .collect();
    // 0 = unvisited, 1 = on the stack, 2 = done
    let mut mark: HashMap<&str, u8> = HashMap::new();
    fn visit<'a>(
        n: &'a str,
        deps: &HashMap<&'a str, Vec<&'a str>>,
        mark: &mut HashMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        match mark.get(n) {
            Some(2) => return None,
            Some(1) => {
                let start = stack.iter().position(|s| *s == n).unwrap_or(0);
                let mut cycle: Vec<String> = stack[start..].iter().map(|s| s.to_string()).collect();
                cycle.push(n.to_owned());
                return Some(cycle);
            }
            _ => {}
        }
        mark.insert(n, 1);
        stack.push(n);
        for d in deps.get(n).map(Vec::as_slice).unwrap_or(&[]) {
            if deps.contains_key(d)
                && let Some(c) = visit(d, deps, mark, stack)
            {
                return Some(c);
            }
        }
        stack.pop();
        mark.insert(n, 2);
        None
    }
    for i in items {
        let mut stack = Vec::new();
        if let Some(c) = visit(i.id.as_str(), &deps, &mut mark, &mut stack) {
            return Some(c);
        }
    }
    None
}

pub use crate::model::payloads::{TodoSummary, summary};

/// What merging a new list into the todo list changed.
#[derive(Debug, Clone, Default)]
pub struct PlanDiff {
    /// The whole todo list after the merge, in plan order.
    pub items: Vec<TodoItem>,
    pub added: Vec<ItemId>,
    pub changed: Vec<ItemId>,
    pub removed: Vec<ItemId>,
    /// The removed items as they were (only pending items are ever removed).
    pub removed_items: Vec<TodoItem>,
    /// Items of the new list that had already started and were left as they are.
    pub frozen: Vec<ItemId>,
    /// Items whose row must be written (new, changed or moved).
    pub dirty: Vec<ItemId>,
}

impl PlanDiff {
    /// `PLAN_UPDATE` content: `{added, changed, removed, todoList}`. The diff is carried in full
    /// (the added and changed items as they are now, the removed ones as they were: all of them
    /// pending, so small); `todoList` is the [`summary`] of the whole list, whose finished items
    /// may hold large results.
    pub fn observation_content(&self) -> crate::model::payloads::PlanUpdateContent {
        let pick = |ids: &[ItemId]| -> Vec<TodoItem> {
            ids.iter()
                .filter_map(|id| self.items.iter().find(|i| &i.id == id).cloned())
                .collect()
        };
        crate::model::payloads::PlanUpdateContent {
            added: pick(&self.added),
            changed: pick(&self.changed),
            removed: self.removed_items.clone(),
            todo_list: summary(&self.items),
            plan: None,
            steering_message_ids: None,
            unchanged: None,
            error: None,
        }
    }
}

/// A fresh pending item from a validated plan entry.
pub fn new_item(v: &ValidItem, mode: ToolValidationMode) -> TodoItem {
    let now = Utc::now();
    TodoItem {
        id: v.id.clone(),
        position: 0,
        description: v.description.clone(),
        status: ItemStatus::Pending,
        dependencies: v.dependencies.clone(),
        step_type: v.step_type,
        required_tools: v.required_tools.clone(),
        tool_validation_mode: mode,
        validation_status: if v.required_tools.is_empty() {
            ValidationStatus::Skipped
        } else {
            ValidationStatus::Pending
        },
        expected_outcome: v.expected_outcome.clone(),
        tool_calls: vec![],
        actual_tool_calls: vec![],
        tool_results: vec![],
        thoughts: vec![],
        result: None,
        error: None,
        attempts: 0,
        usage: Usage::default(),
        conversation: vec![],
        run_id: None,
        created_at: now,
        updated_at: now,
        started_at: None,
        completed_at: None,
        kind: v.kind,
        parent_item_id: None,
        role: v.role.clone(),
        tool_allowlist: v.tool_allowlist.clone(),
        compacted_output: None,
    }
}

/// Merge `planned`, the list run `run` planned, into `existing`. Pending items are replaced by
/// the new list (kept ids keep their row, changed fields are updated, missing ones removed) and
/// belong to `run` from now on (their `run_id`: what the run's synthesis answers from); items that
/// started or finished are frozen and stay, in their place, whatever the new list says of them.
pub fn merge(
    existing: Vec<TodoItem>,
    planned: &[ValidItem],
    mode: ToolValidationMode,
    run: uuid::Uuid,
) -> PlanDiff {
    let mut diff = PlanDiff::default();
    let in_new: HashSet<&str> = planned.iter().map(|p| p.id.as_str()).collect();
    // The items the new list names, taken out to be placed where it puts them.
    let mut named: HashMap<String, TodoItem> = HashMap::new();
    let mut items: Vec<TodoItem> = Vec::with_capacity(existing.len() + planned.len());

    // Frozen items the new list does not mention keep their relative order, first. A team's
    // children belong to their team's plan, not to this list: they stay as they are. Pending
    // items the list leaves out are removed.
    for it in existing {
        let kept = it.status != ItemStatus::Pending || it.parent_item_id.is_some();
        if in_new.contains(it.id.as_str()) {
            named.insert(it.id.as_str().to_owned(), it);
        } else if kept {
            items.push(it);
        } else {
            diff.removed.push(it.id.clone());
            diff.removed_items.push(it);
        }
    }
    for p in planned {
        match named.remove(p.id.as_str()) {
            Some(old) if old.status != ItemStatus::Pending => {
                diff.frozen.push(p.id.clone());
                items.push(old);
            }
            Some(mut it) => {
                let differs = it.description != p.description
                    || it.step_type != p.step_type
                    || it.required_tools != p.required_tools
                    || it.expected_outcome != p.expected_outcome
                    || it.dependencies != p.dependencies
                    || it.kind != p.kind
                    || it.role != p.role
                    || it.tool_allowlist != p.tool_allowlist;
                if differs {
                    it.description = p.description.clone();
                    it.step_type = p.step_type;
                    it.required_tools = p.required_tools.clone();
                    it.expected_outcome = p.expected_outcome.clone();
                    it.dependencies = p.dependencies.clone();
                    it.kind = p.kind;
                    it.role = p.role.clone();
                    it.tool_allowlist = p.tool_allowlist.clone();
                    it.validation_status = if it.required_tools.is_empty() {
                        ValidationStatus::Skipped
                    } else {
                        ValidationStatus::Pending
                    };
                    it.updated_at = Utc::now();
                    diff.changed.push(it.id.clone());
                    diff.dirty.push(it.id.clone());
                }
                if it.run_id != Some(run) {
                    it.run_id = Some(run);
                    if !differs {
                        diff.dirty.push(it.id.clone());
                    }
                }
                items.push(it);
            }
            None => {
                diff.added.push(p.id.clone());
                diff.dirty.push(p.id.clone());
                let mut it = new_item(p, mode);
                it.run_id = Some(run);
                items.push(it);
            }
        }
    }
    for (pos, it) in items.iter_mut().enumerate() {
        let pos = pos as i64;
        if it.position != pos {
            it.position = pos;
            if !diff.dirty.contains(&it.id) {
                diff.dirty.push(it.id.clone());
            }
        }
    }
    diff.items = items;
    diff
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: &str, deps: &[&str]) -> PlannedItem {
        PlannedItem {
            id: id.into(),
            description: format!("do {id}"),
            step_type: "reasoning".into(),
            required_tools: vec![],
            expected_outcome: String::new(),
            dependencies: deps.iter().map(|s| s.to_string()).collect(),
            kind: None,
            role: None,
            tool_allowlist: None,
        }
    }

    fn rules(tools: &[String], max_items: usize) -> Rules<'_> {
        Rules {
            known_tools: tools,
            roles: None,
            max_items,
        }
    }

    #[test]
    fn unknown_dependencies_cycles_and_bad_ids_are_all_reported() {
        let errs = validate(
            &[
                p("a", &["b"]),
                p("b", &["a"]),
                p("c", &["zz"]),
                p("bad id", &[]),
            ],
            &[],
            &rules(&[], 10),
        )
        .unwrap_err();
        let all = errs.join("\n");
        assert!(all.contains("unknown item `zz`"), "{all}");
        assert!(all.contains("cycle"), "{all}");
        assert!(all.contains("`bad id` is invalid"), "{all}");
    }

    #[test]
    fn unknown_required_tools_and_size_are_rejected() {
        let mut item = p("a", &[]);
        item.required_tools = vec!["nope".into()];
        let errs =
            validate(&[item, p("b", &[])], &[], &rules(&["calculator".into()], 1)).unwrap_err();
        let all = errs.join("\n");
        assert!(all.contains("unknown tool `nope`"), "{all}");
        assert!(all.contains("too many items"), "{all}");
    }

    #[test]
    fn roles_and_tool_allowlists_are_checked() {
        let tools = vec!["calculator".to_owned(), "current_time".to_owned()];
        let roles: BTreeMap<String, AgentRole> = [(
            "analyst".to_owned(),
            AgentRole {
                name: "Analyst".into(),
                system_prompt_fragment: "You check numbers.".into(),
                tools: Some(vec!["calculator".into()]),
            },
        )]
        .into();
        let r = Rules {
            known_tools: &tools,
            roles: Some(&roles),
            max_items: 10,
        };
        let mut ok = p("a", &[]);
        ok.role = Some("analyst".into());
        ok.required_tools = vec!["calculator".into()];
        ok.tool_allowlist = Some(vec!["calculator".into()]);
        let v = validate(std::slice::from_ref(&ok), &[], &r).unwrap();
        assert_eq!(v[0].role.as_deref(), Some("analyst"));

        let mut unknown_role = p("b", &[]);
        unknown_role.role = Some("poet".into());
        let mut outside_allowlist = p("c", &[]);
        outside_allowlist.required_tools = vec!["current_time".into()];
        outside_allowlist.tool_allowlist = Some(vec!["calculator".into()]);
        let mut outside_role = p("d", &[]);
        outside_role.role = Some("analyst".into());
        outside_role.required_tools = vec!["current_time".into()];
        let mut bad_kind = p("e", &[]);
        bad_kind.kind = Some("crowd".into());
        let errs = validate(
            &[unknown_role, outside_allowlist, outside_role, bad_kind],
            &[],
            &r,
        )
        .unwrap_err()
        .join("\n");
        assert!(
            errs.contains("unknown role `poet` (roles: analyst)"),
            "{errs}"
        );
        assert!(errs.contains("subset of toolAllowlist"), "{errs}");
        assert!(errs.contains("its role `analyst` may not use"), "{errs}");
        assert!(errs.contains("kind `crowd`"), "{errs}");
    }

    #[test]
    fn merge_keeps_started_items_and_reports_changes() {
        let valid = validate(&[p("a", &[]), p("b", &["a"])], &[], &rules(&[], 10)).unwrap();
        let run = uuid::Uuid::nil();
        let mut first = merge(vec![], &valid, ToolValidationMode::Strict, run).items;
        first[0].status = ItemStatus::Completed;
        // the new list changes a completed item (ignored), changes b, drops nothing, adds c
        let mut a2 = p("a", &[]);
        a2.description = "rewritten".into();
        let mut b2 = p("b", &["a"]);
        b2.description = "changed".into();
        let valid2 = validate(
            &[a2, b2, p("c", &["b"])],
            &[first[0].id.clone()],
            &rules(&[], 10),
        )
        .unwrap();
        let d = merge(first.clone(), &valid2, ToolValidationMode::Strict, run);
        assert_eq!(d.items[0].description, "do a");
        assert_eq!(d.items[0].status, ItemStatus::Completed);
        assert_eq!(d.changed, vec![ItemId::parse("b").unwrap()]);
        assert_eq!(d.added, vec![ItemId::parse("c").unwrap()]);
        assert!(d.removed.is_empty());
        assert_eq!(d.frozen, vec![ItemId::parse("a").unwrap()]);
        let d2 = merge(
            d.items.clone(),
            &validate(&[p("a", &[])], &[], &rules(&[], 10)).unwrap(),
            ToolValidationMode::Strict,
            run,
        );
        assert_eq!(d2.removed.len(), 2);
    }

    #[test]
    fn merge_gives_the_planning_run_its_pending_items_and_leaves_finished_ones_to_theirs() {
        let (first_run, second_run) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let valid = validate(&[p("a", &[]), p("b", &["a"])], &[], &rules(&[], 10)).unwrap();
        let mut first = merge(vec![], &valid, ToolValidationMode::Strict, first_run).items;
        assert!(first.iter().all(|i| i.run_id == Some(first_run)));
        first[0].status = ItemStatus::Completed;
        // The follow-up keeps b unchanged and adds c: both are its items now, a stays the first
        // run's; b's row is written for the new owner though nothing else changed.
        let planned = [p("b", &["a"]), p("c", &[])];
        let done = [first[0].id.clone()];
        let valid2 = validate(&planned, &done, &rules(&[], 2)).unwrap();
        let d = merge(
            first.clone(),
            &valid2,
            ToolValidationMode::Strict,
            second_run,
        );
        let owner = |id: &str| d.items.iter().find(|i| i.id.as_str() == id).unwrap().run_id;
        assert_eq!(owner("a"), Some(first_run));
        assert_eq!(owner("b"), Some(second_run));
        assert_eq!(owner("c"), Some(second_run));
        assert!(d.changed.is_empty());
        assert!(d.dirty.contains(&ItemId::parse("b").unwrap()));
        // maxItems counts the list's items that did not start, not the thread's.
        let errs = validate(
            &[p("x", &[]), p("y", &[]), p("z", &[])],
            &done,
            &rules(&[], 2),
        )
        .unwrap_err();
        assert!(errs.join("").contains("too many items: 3"), "{errs:?}");
    }
}
