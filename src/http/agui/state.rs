//! The AG-UI state of a run: the thread's todo list, as `PLAN`, `PLAN_UPDATE` and
//! `ITEM_STATUS_CHANGE` build it (the same reading as the console's), and what an AG-UI run
//! needs to know of the log before it starts ([`Base`]).

use serde_json::{Value, json};
use uuid::Uuid;

use crate::model::{Observation, ObservationType, Usage};

/// The todo list as the AG-UI state holds it: each item as `PLAN` and `PLAN_UPDATE` list it
/// (`TodoSummary`: id, description, status, dependencies, stepType, requiredTools, kind,
/// parentItemId, role), in plan order, team children after their team's plan was made.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TodoList {
    items: Vec<Value>,
}

fn id_of(item: &Value) -> Option<&str> {
    item.get("id").and_then(Value::as_str)
}

impl TodoList {
    /// The state this list is: `{todoList: [...]}`.
    pub fn snapshot(&self) -> Value {
        json!({ "todoList": self.items })
    }

    fn position(&self, id: &str) -> Option<usize> {
        self.items.iter().position(|i| id_of(i) == Some(id))
    }

    /// Take in a `PLAN`, `PLAN_UPDATE` or `ITEM_STATUS_CHANGE`; other observations change
    /// nothing.
    pub fn apply(&mut self, o: &Observation) {
        let c = &o.content;
        let listed = || -> Vec<Value> {
            c.get("todoList")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        match o.kind {
            ObservationType::Plan => {
                if let Some(team) = c.get("teamId").and_then(Value::as_str) {
                    for mut child in listed() {
                        if child.get("parentItemId").is_none_or(Value::is_null) {
                            child["parentItemId"] = team.into();
                        }
                        let id = id_of(&child).map(str::to_owned);
                        match id.and_then(|id| self.position(&id)) {
                            Some(at) => self.items[at] = child,
                            None => self.items.push(child),
                        }
                    }
                } else {
                    self.items = listed();
                }
            }
            ObservationType::PlanUpdate => {
                // A refined list replaces the old one; a team's children it does not list stay
                // (unless it removed them), so a refinement summarised at the top level does not
                // hide a team's plan.
                let removed: Vec<String> = c
                    .get("removed")
                    .and_then(Value::as_array)
                    .map(|r| {
                        r.iter()
                            .filter_map(|x| x.as_str().or_else(|| id_of(x)).map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let mut next = listed();
                let kept: Vec<Value> = self
                    .items
                    .iter()
                    .filter(|i| {
                        let id = id_of(i).unwrap_or_default();
                        let parent = i.get("parentItemId").and_then(Value::as_str);
                        !next.iter().any(|n| id_of(n) == Some(id))
                            && !removed.iter().any(|r| r == id)
                            && parent.is_some_and(|p| next.iter().any(|n| id_of(n) == Some(p)))
                    })
                    .cloned()
                    .collect();
                next.extend(kept);
                self.items = next;
            }
            ObservationType::ItemStatusChange => {
                let (Some(id), Some(status)) = (
                    c.get("itemId").and_then(Value::as_str),
                    c.get("status").and_then(Value::as_str),
                ) else {
                    return;
                };
                if let Some(at) = self.position(id) {
                    self.items[at]["status"] = status.into();
                }
            }
            _ => {}
        }
    }

    /// Items that are running or waiting for a person.
    pub(super) fn active(&self) -> Vec<String> {
        self.items
            .iter()
            .filter(|i| {
                matches!(
                    i.get("status").and_then(Value::as_str),
                    Some("in_progress" | "waiting")
                )
            })
            .filter_map(|i| id_of(i).map(str::to_owned))
            .collect()
    }
}

/// What the log says before an AG-UI run starts: the todo list, and of our run the usage it had
/// reported when it last suspended and the provider and model it uses.
#[derive(Debug, Clone, Default)]
pub struct Base {
    pub todo: TodoList,
    pub usage: Usage,
    pub provider: Option<String>,
    pub model: Option<String>,
}

impl Base {
    /// Take in one observation of the thread (only the todo list's and `run`'s own count).
    pub fn apply(&mut self, o: &Observation, run: Uuid) {
        self.todo.apply(o);
        if o.run_id != Some(run) {
            return;
        }
        match o.kind {
            ObservationType::RunSuspended => {
                if let Some(u) = usage_of(&o.content) {
                    self.usage = u;
                }
            }
            ObservationType::RunStarted => self.started(o),
            _ => {}
        }
    }

    pub(super) fn started(&mut self, o: &Observation) {
        let text = |k: &str| o.content.get(k).and_then(Value::as_str).map(str::to_owned);
        self.provider = text("provider");
        self.model = text("model");
    }
}

pub(super) fn usage_of(content: &Value) -> Option<Usage> {
    serde_json::from_value(content.get("usage")?.clone()).ok()
}
