//! The tables the engine's ops write, and one mapping per table from a domain row to its columns:
//! both ways of committing a batch (statement by statement, and each dialect's one-round-trip
//! way) write rows from these, so a column is named and encoded in one place.

use super::StoreResult;
use super::rows;
use super::sql::{Arg, Conn, Dialect, q};
use crate::model::{AgentStateRow, ItemId, Message, Suspension, ThreadId, TodoItem};

/// A table the engine's ops write: its key (an upsert replaces every other column, but for
/// `add` columns, which add the new value to the stored one) and how one row maps to columns.
pub(crate) struct Table {
    pub name: &'static str,
    /// The conflict key after `(tenant, thread_id)`; empty for plain inserts.
    pub key: &'static [&'static str],
    pub add: &'static [&'static str],
}

pub(crate) const AGENT_STATE: Table = Table {
    name: "agent_state",
    key: &[],
    add: &["version"],
};
pub(crate) const TODO_ITEMS: Table = Table {
    name: "todo_items",
    key: &["item_id"],
    add: &[],
};
pub(crate) const MESSAGES: Table = Table {
    name: "messages",
    key: &[],
    add: &[],
};
pub(crate) const SUSPENSIONS: Table = Table {
    name: "suspensions",
    key: &[],
    add: &[],
};

/// One row's columns (after `tenant, thread_id`) and values.
pub(crate) type RowCols = Vec<(&'static str, Arg)>;

impl Table {
    /// `ON CONFLICT …` for an upsert table (agent_state's key is the thread itself).
    pub(crate) fn on_conflict(&self, cols: &[&'static str]) -> String {
        if self.key.is_empty() && self.add.is_empty() {
            return String::new();
        }
        let key: Vec<&str> = ["tenant", "thread_id"]
            .into_iter()
            .chain(self.key.iter().copied())
            .collect();
        let set: Vec<String> = cols
            .iter()
            .filter(|c| !self.key.contains(c))
            .map(|c| {
                if self.add.contains(c) {
                    format!("{c} = {}.{c} + EXCLUDED.{c}", self.name)
                } else {
                    format!("{c} = EXCLUDED.{c}")
                }
            })
            .collect();
        format!(
            " ON CONFLICT ({}) DO UPDATE SET {}",
            key.join(", "),
            set.join(", ")
        )
    }

    /// Write one row with its own statement.
    pub(crate) async fn write(
        &self,
        conn: &mut Conn,
        tenant: &str,
        thread_id: &ThreadId,
        row: RowCols,
    ) -> StoreResult<()> {
        let names: Vec<&'static str> = row.iter().map(|(c, _)| *c).collect();
        let params: Vec<String> = (3..names.len() + 3).map(|i| format!("${i}")).collect();
        let sql = format!(
            "INSERT INTO {} (tenant, thread_id, {}) VALUES ($1, $2, {}){}",
            self.name,
            names.join(", "),
            params.join(", "),
            self.on_conflict(&names)
        );
        let stmt = row
            .into_iter()
            .fold(q(sql).bind(tenant).bind(thread_id.as_str()), |q, (_, a)| {
                q.bind(a)
            });
        conn.exec(stmt).await?;
        Ok(())
    }
}

pub(crate) fn state_cols(s: &AgentStateRow) -> RowCols {
    vec![
        ("intent", (&s.intent).into()),
        ("title", (&s.title).into()),
        ("plan", (&s.plan).into()),
        ("current_step_id", (&s.current_step_id).into()),
        // Every set bumps the version (counted from 0 by the row `create_thread` inserts).
        ("version", 1i64.into()),
    ]
}

pub(crate) fn item_cols(item: &TodoItem) -> StoreResult<RowCols> {
    Ok(vec![
        ("item_id", item.id.as_str().into()),
        ("position", item.position.into()),
        ("description", (&item.description).into()),
        ("status", item.status.as_str().into()),
        ("dependencies", rows::to_json(&item.dependencies)?.into()),
        ("step_type", item.step_type.as_str().into()),
        (
            "required_tools",
            rows::to_json(&item.required_tools)?.into(),
        ),
        (
            "tool_validation_mode",
            item.tool_validation_mode.as_str().into(),
        ),
        ("validation_status", item.validation_status.as_str().into()),
        ("expected_outcome", (&item.expected_outcome).into()),
        ("tool_calls", rows::to_json(&item.tool_calls)?.into()),
        (
            "actual_tool_calls",
            rows::to_json(&item.actual_tool_calls)?.into(),
        ),
        ("tool_results", rows::to_json(&item.tool_results)?.into()),
        ("thoughts", rows::to_json(&item.thoughts)?.into()),
        ("result", (&item.result).into()),
        ("error", rows::opt_json(item.error.as_ref())?.into()),
        ("attempts", i64::from(item.attempts).into()),
        ("usage", rows::to_json(&item.usage)?.into()),
        ("conversation", rows::to_json(&item.conversation)?.into()),
        ("run_id", item.run_id.into()),
        ("created_at", item.created_at.into()),
        ("updated_at", item.updated_at.into()),
        ("started_at", item.started_at.into()),
        ("completed_at", item.completed_at.into()),
        ("kind", item.kind.as_str().into()),
        (
            "parent_item_id",
            item.parent_item_id.as_ref().map(ItemId::as_str).into(),
        ),
        ("role", (&item.role).into()),
        (
            "tool_allowlist",
            rows::opt_json(item.tool_allowlist.as_ref())?.into(),
        ),
        ("compacted_output", (&item.compacted_output).into()),
    ])
}

/// Every column of `todo_items` after `(tenant, thread_id)`, in [`item_cols`]'s order: the
/// columns an item's version copies (`todo_item_versions` holds them all, then `seq`, `deleted`).
pub(crate) const ITEM_COLUMNS: &[&str] = &[
    "item_id",
    "position",
    "description",
    "status",
    "dependencies",
    "step_type",
    "required_tools",
    "tool_validation_mode",
    "validation_status",
    "expected_outcome",
    "tool_calls",
    "actual_tool_calls",
    "tool_results",
    "thoughts",
    "result",
    "error",
    "attempts",
    "usage",
    "conversation",
    "run_id",
    "created_at",
    "updated_at",
    "started_at",
    "completed_at",
    "kind",
    "parent_item_id",
    "role",
    "tool_allowlist",
    "compacted_output",
];

/// The select list of an item for a reader that shows the state (`GET …/state`, now or in the
/// past): every column of [`ITEM_COLUMNS`] read from `alias`, but the item's ReAct
/// `conversation`, which the state view leaves out, read as empty (on a long thread the
/// conversations are about a quarter of its items' bytes, decoded only to be dropped).
pub(crate) fn item_view_columns(d: Dialect, alias: &str) -> String {
    ITEM_COLUMNS
        .iter()
        .map(|c| match (*c, d) {
            ("conversation", Dialect::Postgres) => "'[]'::jsonb AS conversation".to_owned(),
            ("conversation", Dialect::Sqlite) => "'[]' AS conversation".to_owned(),
            _ => format!("{alias}.{c}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns of `agent_state` after `(tenant, thread_id)`, as its versions copy them.
pub(crate) const STATE_COLUMNS: &[&str] =
    &["intent", "title", "plan", "current_step_id", "version"];

/// A message's columns and the seq of the commit that writes it (`Arg::Int(None)` where the
/// dialect computes it in SQL instead).
pub(crate) fn message_cols_at(m: &Message, seq: Option<i64>) -> StoreResult<RowCols> {
    let mut cols = message_cols(m)?;
    cols.push(("seq", Arg::Int(seq)));
    Ok(cols)
}

pub(crate) fn message_cols(m: &Message) -> StoreResult<RowCols> {
    let tool_calls = if m.tool_calls.is_empty() {
        None
    } else {
        Some(rows::to_json(&m.tool_calls)?)
    };
    Ok(vec![
        ("id", m.id.into()),
        ("run_id", m.run_id.into()),
        ("role", m.role.as_str().into()),
        ("content", (&m.content).into()),
        ("item_id", (&m.item_id).into()),
        ("tool_call_id", (&m.tool_call_id).into()),
        ("created_at", m.created_at.into()),
        ("name", (&m.name).into()),
        ("tool_calls", tool_calls.into()),
    ])
}

pub(crate) fn suspension_cols(s: &Suspension) -> StoreResult<RowCols> {
    Ok(vec![
        ("suspension_id", s.suspension_id.into()),
        ("run_id", s.run_id.into()),
        ("item_id", s.item_id.as_str().into()),
        ("kind", s.kind.as_str().into()),
        ("tool_call", rows::to_json(&s.tool_call)?.into()),
        (
            "allowed_decisions",
            rows::to_json(&s.allowed_decisions)?.into(),
        ),
        ("question", (&s.question).into()),
        ("input_schema", s.input_schema.clone().into()),
        ("iteration_state", s.iteration_state.clone().into()),
        (
            "partial_tool_results",
            rows::to_json(&s.partial_tool_results)?.into(),
        ),
        ("status", s.status.as_str().into()),
        (
            "decision",
            s.decision.as_ref().map(rows::to_json).transpose()?.into(),
        ),
        ("created_at", s.created_at.into()),
        ("resolved_at", s.resolved_at.into()),
        ("expires_at", s.expires_at.into()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version tables copy items column by column: the list must name every column an item
    /// writes, in order.
    #[test]
    fn item_columns_name_every_written_column() {
        let item: TodoItem = serde_json::from_value(serde_json::json!({
            "id": "a", "position": 0, "description": "d", "status": "pending",
            "dependencies": [], "stepType": "tool", "requiredTools": [],
            "toolValidationMode": "advisory", "validationStatus": "pending", "toolCalls": [],
            "actualToolCalls": [], "toolResults": [], "thoughts": [], "result": null,
            "error": null, "attempts": 0,
            "usage": {"promptTokens": 0, "completionTokens": 0, "totalTokens": 0, "llmCalls": 0},
            "conversation": [], "runId": null,
            "createdAt": "2026-01-01T00:00:00Z", "updatedAt": "2026-01-01T00:00:00Z"
        }))
        .expect("a minimal item");
        let names: Vec<&str> = item_cols(&item).unwrap().iter().map(|(c, _)| *c).collect();
        assert_eq!(names, ITEM_COLUMNS);
    }
}
