//! Flowcharts: the tenant's registered procedures, one row per version. A PUT
//! adds the version after the highest one (deleted ones included, so a number never names two
//! definitions); a delete marks every version deleted, soft, because a call the engine pinned to
//! a version must still find it. Written once for both dialects.

use super::rows;
use super::sql::{Row, q};
use super::sql_store::SqlStore;
use super::{PutFlowchart, StoreError, StoreResult};
use crate::flowchart::{FlowchartRecord, FlowchartSpec};

const COLUMNS: &str = "name, version, spec, created_at";

fn flowchart_from_row(r: &Row) -> StoreResult<FlowchartRecord> {
    Ok(FlowchartRecord {
        name: r.text("name")?,
        version: r.int("version")?,
        spec: r.typed("spec")?,
        created_at: r.ts("created_at")?,
    })
}

/// What versions of one flowchart are locked under (see [`super::sql::Conn::lock_key`]).
fn lock_key(tenant: &str, name: &str) -> String {
    format!("flowchart\u{1f}{tenant}\u{1f}{name}")
}

impl SqlStore {
    /// Store `spec` as the next version of the tenant's flowchart `name`: one more than its
    /// highest version, deleted ones included (after a delete the numbering goes on).
    /// Concurrent calls for one name get distinct versions.
    ///
    /// # Errors
    /// [`StoreError::OverQuota`] when `name` is new and the tenant holds as many flowcharts as
    /// it may (counted exactly, see `quotas`).
    pub async fn put_flowchart(
        &self,
        tenant: &str,
        name: &str,
        spec: &FlowchartSpec,
    ) -> StoreResult<PutFlowchart> {
        let mut tx = self.write().await?;
        // Two PUTs of one name at once: the second waits here, then reads the first's version.
        tx.lock_key(&lock_key(tenant, name)).await?;
        let seen = tx
            .one(
                q("SELECT COALESCE(MAX(version), 0) AS top, \
                     COALESCE(SUM(CASE WHEN deleted_at IS NULL THEN 1 ELSE 0 END), 0) AS live \
                   FROM flowcharts WHERE tenant = $1 AND name = $2")
                .bind(tenant)
                .bind(name),
            )
            .await?;
        let (top, live) = (seen.int("top")?, seen.int("live")?);
        let counted = "FROM (SELECT DISTINCT name FROM flowcharts \
                       WHERE tenant = $1 AND deleted_at IS NULL) f";
        if live == 0
            && !super::quotas::room(
                &mut tx,
                "flowcharts",
                counted,
                tenant,
                self.max_flowcharts,
                1,
            )
            .await?
        {
            return Err(StoreError::OverQuota {
                what: "flowcharts",
                setting: "PES_TENANT_MAX_FLOWCHARTS",
                max: self.max_flowcharts,
                hint: "delete one to register another",
                retry_after_seconds: 60,
            });
        }
        let row = tx
            .one(
                q(format!(
                    "INSERT INTO flowcharts (tenant, name, version, description, spec, created_at) \
                     VALUES ($1, $2, $3, $4, $5, {{now}}) RETURNING {COLUMNS}"
                ))
                .bind(tenant)
                .bind(name)
                .bind(top + 1)
                .bind(&spec.description)
                .bind(rows::to_json(spec)?),
            )
            .await?;
        let record = flowchart_from_row(&row)?;
        tx.commit().await?;
        Ok(PutFlowchart {
            record,
            created: live == 0,
        })
    }

    /// One version of a flowchart: `version`, or the latest when `None`. A deleted flowchart's
    /// versions are found only with `include_deleted` (the engine resuming a call pinned to a
    /// version; the API shows only live ones).
    pub async fn get_flowchart(
        &self,
        tenant: &str,
        name: &str,
        version: Option<i64>,
        include_deleted: bool,
    ) -> StoreResult<Option<FlowchartRecord>> {
        let mut sql = format!("SELECT {COLUMNS} FROM flowcharts WHERE tenant = $1 AND name = $2");
        if !include_deleted {
            sql.push_str(" AND deleted_at IS NULL");
        }
        let mut query = match version {
            Some(_) => {
                sql.push_str(" AND version = $3");
                q(sql)
            }
            None => q(sql + " ORDER BY version DESC LIMIT 1"),
        }
        .bind(tenant)
        .bind(name);
        if let Some(v) = version {
            query = query.bind(v);
        }
        self.read()
            .await?
            .opt(query)
            .await?
            .as_ref()
            .map(flowchart_from_row)
            .transpose()
    }

    /// The latest version of each of the tenant's flowcharts that is not deleted, sorted by name
    /// (byte order).
    pub async fn list_flowcharts(&self, tenant: &str) -> StoreResult<Vec<FlowchartRecord>> {
        let rows = self
            .read()
            .await?
            .all(
                q(format!(
                    "SELECT {COLUMNS} FROM flowcharts f \
                     WHERE f.tenant = $1 AND f.deleted_at IS NULL AND f.version = \
                       (SELECT MAX(g.version) FROM flowcharts g \
                        WHERE g.tenant = f.tenant AND g.name = f.name)"
                ))
                .bind(tenant),
            )
            .await?;
        let mut records = rows
            .iter()
            .map(flowchart_from_row)
            .collect::<StoreResult<Vec<_>>>()?;
        // Sorted here, byte-wise, so both backends agree whatever the database's collation.
        records.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(records)
    }

    /// Mark every version of the flowchart deleted; false when it had no live version.
    pub async fn delete_flowchart(&self, tenant: &str, name: &str) -> StoreResult<bool> {
        let mut tx = self.write().await?;
        tx.lock_key(&lock_key(tenant, name)).await?;
        let n = tx
            .exec(
                q("UPDATE flowcharts SET deleted_at = {now} \
                   WHERE tenant = $1 AND name = $2 AND deleted_at IS NULL")
                .bind(tenant)
                .bind(name),
            )
            .await?;
        tx.commit().await?;
        Ok(n > 0)
    }
}
