//! Runs found without their thread: by id within a tenant (an A2A task id names a run alone), and
//! a tenant's runs across its threads (A2A `ListTasks`). Written once for both dialects.

use uuid::Uuid;

use super::rows;
use super::runs::attach_suspensions;
use super::sql::{Q, q};
use super::sql_store::SqlStore;
use super::threads::map_rows;
use super::{PageCursor, RunFilter, StoreResult};
use crate::model::Run;

/// The `WHERE` clause of `filter` over the tenant's runs (`$1` is the tenant), with its binds
/// appended to `args` from `$2` on.
fn filter_clause(filter: &RunFilter, args: &mut Vec<super::sql::Arg>) -> String {
    let mut sql = String::from("tenant = $1");
    let next = |arg: super::sql::Arg, args: &mut Vec<super::sql::Arg>| {
        args.push(arg);
        args.len() + 1
    };
    if let Some(thread) = &filter.thread_id {
        let n = next(thread.as_str().into(), args);
        sql.push_str(&format!(" AND thread_id = ${n}"));
    }
    if let Some(statuses) = &filter.statuses {
        let names: Vec<String> = statuses.iter().map(|s| s.as_str().to_owned()).collect();
        let n = next(names.into(), args);
        sql.push_str(&format!(" AND {{in status {n}}}"));
        if let Some(started) = filter.queued_started {
            let not = if started { "NOT " } else { "" };
            sql.push_str(&format!(
                " AND (status <> 'queued' OR started_at IS {not}NULL)"
            ));
        }
    }
    if let Some(after) = filter.updated_after {
        let n = next(after.into(), args);
        sql.push_str(&format!(
            " AND COALESCE(ended_at, started_at, created_at) > ${n}"
        ));
    }
    sql
}

fn with_args(mut stmt: Q, args: Vec<super::sql::Arg>) -> Q {
    for a in args {
        stmt = stmt.bind(a);
    }
    stmt
}

impl SqlStore {
    /// A run by its id alone, within `tenant` (an A2A task id names a run, not its thread): the
    /// primary key, so one row; another tenant's run is `None`.
    pub async fn find_run(&self, tenant: &str, run_id: Uuid) -> StoreResult<Option<Run>> {
        self.one_run(
            q("SELECT * FROM runs WHERE run_id = $1 AND tenant = $2")
                .bind(run_id)
                .bind(tenant),
        )
        .await
    }

    /// The tenant's runs that `filter` selects, across threads, newest first (`created_at` desc,
    /// then id desc), at most `limit` after `cursor`; with the number of runs the filter selects
    /// in all.
    pub async fn list_tenant_runs(
        &self,
        tenant: &str,
        filter: &RunFilter,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<(Vec<Run>, u64)> {
        let mut args = Vec::new();
        let clause = filter_clause(filter, &mut args);
        let count = with_args(
            q(format!("SELECT COUNT(*) AS n FROM runs WHERE {clause}")).bind(tenant),
            args.clone(),
        );
        let mut page_args = args;
        let mut page_clause = clause;
        if let Some(c) = cursor {
            page_args.push(c.created_at.into());
            page_args.push(rows::cursor_uuid(&c.id)?.into());
            let n = page_args.len();
            page_clause.push_str(&format!(
                " AND (created_at, run_id) < (${n0}, ${n1})",
                n0 = n,
                n1 = n + 1
            ));
        }
        page_args.push(rows::sql_limit(limit).into());
        let limit_at = page_args.len() + 1;
        let page = with_args(
            q(format!(
                "SELECT * FROM runs WHERE {page_clause} \
                 ORDER BY created_at DESC, run_id DESC LIMIT ${limit_at}"
            ))
            .bind(tenant),
            page_args,
        );
        let mut conn = self.snapshot().await?;
        let total = conn.one(count).await?.int("n")?;
        let mut runs = map_rows(&conn.all(page).await?, rows::run_from_row)?;
        attach_suspensions(&mut conn, &mut runs).await?;
        conn.commit().await?;
        Ok((runs, u64::try_from(total).unwrap_or(0)))
    }
}
