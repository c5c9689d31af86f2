//! A tenant's spend on its models since a moment (its daily budget, `PES_TENANT_BUDGETS`): the
//! committed usage of its runs created since then, summed over the `runs (tenant, created_at)`
//! index. Read, never written here: the usage is the one every commit already records, so the
//! commit path pays nothing for daily budgets.

use chrono::{DateTime, Utc};

use super::StoreResult;
use super::sql::{Dialect, q};
use super::sql_store::SqlStore;

impl SqlStore {
    /// Tokens and US dollars the runs of `tenant` created since `since` used so far.
    ///
    /// # Errors
    /// The store failed.
    pub async fn tenant_spend(
        &self,
        tenant: &str,
        since: DateTime<Utc>,
    ) -> StoreResult<(u64, f64)> {
        let sql = match self.dialect() {
            Dialect::Postgres => {
                "SELECT COALESCE(SUM((usage ->> 'totalTokens')::bigint), 0)::bigint AS tokens, \
                 COALESCE(SUM((usage ->> 'costUsd')::float8), 0)::float8 AS usd \
                 FROM runs WHERE tenant = $1 AND created_at >= $2"
            }
            Dialect::Sqlite => {
                "SELECT COALESCE(SUM(json_extract(usage, '$.totalTokens')), 0) AS tokens, \
                 TOTAL(json_extract(usage, '$.costUsd')) AS usd \
                 FROM runs WHERE tenant = $1 AND created_at >= $2"
            }
        };
        let row = self
            .read()
            .await?
            .one(q(sql).bind(tenant).bind(since))
            .await?;
        let tokens = row.opt_int("tokens")?.unwrap_or(0);
        let usd = row.opt_float("usd")?.unwrap_or(0.0);
        Ok((u64::try_from(tokens).unwrap_or(0), usd))
    }
}
