//! A tenant's day (its daily budget, `PES_TENANT_BUDGETS`): what its runs spent on their models
//! since a moment, the committed usage of its runs created since then, summed over the `runs
//! (tenant, created_at)` index, and what the operator raised the day's limits by (the rows of
//! `tenant_budget_raises`). The usage is the one every commit already records, so the commit path
//! pays nothing for daily budgets; a raise is one row, written here or in the transaction that
//! resolves the suspension it approves.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::StoreResult;
use super::rows;
use super::sql::{Arg, Conn, Dialect, q};
use super::sql_store::SqlStore;
use crate::model::{RaiseBy, Suspension, SuspensionKind, TenantDay, TenantRaise, new_id};

/// The most raises of one day a read lists (the sum counts them all).
pub const MAX_LISTED_RAISES: u32 = 1000;

impl SqlStore {
    /// What the runs of `tenant` created since `since` used so far, and what the operator raised
    /// its daily limits by since then, in one statement.
    ///
    /// # Errors
    /// The store failed.
    pub async fn tenant_day(&self, tenant: &str, since: DateTime<Utc>) -> StoreResult<TenantDay> {
        let sql = match self.dialect() {
            Dialect::Postgres => {
                "SELECT s.tokens, s.usd, r.raised_tokens, r.raised_usd FROM \
                 (SELECT COALESCE(SUM((usage ->> 'totalTokens')::bigint), 0)::bigint AS tokens, \
                         COALESCE(SUM((usage ->> 'costUsd')::float8), 0)::float8 AS usd \
                  FROM runs WHERE tenant = $1 AND created_at >= $2) s, \
                 (SELECT COALESCE(SUM(tokens)::float8, 0)::float8 AS raised_tokens, \
                         COALESCE(SUM(usd), 0)::float8 AS raised_usd \
                  FROM tenant_budget_raises WHERE tenant = $1 AND created_at >= $2) r"
            }
            Dialect::Sqlite => {
                "SELECT s.tokens, s.usd, r.raised_tokens, r.raised_usd FROM \
                 (SELECT COALESCE(SUM(json_extract(usage, '$.totalTokens')), 0) AS tokens, \
                         TOTAL(json_extract(usage, '$.costUsd')) AS usd \
                  FROM runs WHERE tenant = $1 AND created_at >= $2) s, \
                 (SELECT TOTAL(tokens) AS raised_tokens, TOTAL(usd) AS raised_usd \
                  FROM tenant_budget_raises WHERE tenant = $1 AND created_at >= $2) r"
            }
        };
        let row = self
            .read()
            .await?
            .one(q(sql).bind(tenant).bind(since))
            .await?;
        let tokens = row.opt_int("tokens")?.unwrap_or(0);
        let finite = |v: Option<f64>| v.filter(|v| v.is_finite()).unwrap_or(0.0);
        Ok(TenantDay {
            spent_tokens: u64::try_from(tokens).unwrap_or(0),
            spent_usd: finite(row.opt_float("usd")?),
            // Summed as floats, so no number of raises overflows; `as` saturates.
            raised_tokens: finite(row.opt_float("raised_tokens")?) as u64,
            raised_usd: finite(row.opt_float("raised_usd")?),
        })
    }

    /// Raise `tenant`'s daily limits by `raise` for the rest of the UTC day.
    ///
    /// # Errors
    /// The store failed.
    pub async fn add_tenant_raise(&self, tenant: &str, raise: RaiseBy) -> StoreResult<TenantRaise> {
        let mut tx = self.write().await?;
        let made = insert_tenant_raise(&mut tx, tenant, raise, None).await?;
        tx.commit().await?;
        Ok(made)
    }

    /// The raises of `tenant`'s day since `since`, oldest first (at most
    /// [`MAX_LISTED_RAISES`]).
    ///
    /// # Errors
    /// The store failed.
    pub async fn tenant_raises(
        &self,
        tenant: &str,
        since: DateTime<Utc>,
    ) -> StoreResult<Vec<TenantRaise>> {
        self.read()
            .await?
            .all(
                q(
                    "SELECT * FROM tenant_budget_raises WHERE tenant = $1 AND created_at >= $2 \
                   ORDER BY created_at, raise_id LIMIT $3",
                )
                .bind(tenant)
                .bind(since)
                .bind(rows::sql_limit(MAX_LISTED_RAISES)),
            )
            .await?
            .iter()
            .map(|r| {
                let tokens = u64::try_from(r.int("tokens")?).unwrap_or(0);
                let usd = r.opt_float("usd")?.unwrap_or(0.0);
                Ok(TenantRaise {
                    raise_id: r.uuid("raise_id")?,
                    tokens: (tokens > 0).then_some(tokens),
                    usd: (usd > 0.0).then_some(usd),
                    suspension_id: r.opt_uuid("suspension_id")?,
                    created_at: r.ts("created_at")?,
                })
            })
            .collect()
    }

    /// A suspension by id, whatever its tenant (the operator's view).
    ///
    /// # Errors
    /// The store failed.
    pub async fn find_suspension(&self, suspension_id: Uuid) -> StoreResult<Option<Suspension>> {
        self.read()
            .await?
            .opt(q("SELECT * FROM suspensions WHERE suspension_id = $1").bind(suspension_id))
            .await?
            .as_ref()
            .map(rows::suspension_from_row)
            .transpose()
    }

    /// Up to `limit` pending `budget` suspensions of `tenant` on its daily budget, after
    /// `after` in id order (a page: pass the last id for the next).
    ///
    /// # Errors
    /// The store failed.
    pub async fn pending_tenant_budget_suspensions(
        &self,
        tenant: &str,
        after: Option<Uuid>,
        limit: u32,
    ) -> StoreResult<Vec<Suspension>> {
        let found = self
            .read()
            .await?
            .all(
                q(
                    "SELECT * FROM suspensions WHERE tenant = $1 AND status = 'pending' \
                   AND kind = $2 AND ($3 IS NULL OR suspension_id > $3) \
                   ORDER BY suspension_id LIMIT $4",
                )
                .bind(tenant)
                .bind(SuspensionKind::Budget.as_str())
                .bind(after)
                .bind(rows::sql_limit(limit)),
            )
            .await?;
        let mut out = Vec::with_capacity(found.len());
        for row in &found {
            out.push(rows::suspension_from_row(row)?);
        }
        Ok(out)
    }
}

/// Write one raise of `tenant`'s day in `tx` (`suspension_id`: the approval that made it).
pub(super) async fn insert_tenant_raise(
    tx: &mut Conn,
    tenant: &str,
    raise: RaiseBy,
    suspension_id: Option<Uuid>,
) -> StoreResult<TenantRaise> {
    let raise_id = new_id();
    let tokens = i64::try_from(raise.tokens.unwrap_or(0)).unwrap_or(i64::MAX);
    let usd = raise.usd.filter(|u| u.is_finite()).unwrap_or(0.0);
    let row = tx
        .one(
            q("INSERT INTO tenant_budget_raises \
               (raise_id, tenant, tokens, usd, suspension_id, created_at) \
               VALUES ($1, $2, $3, $4, $5, {now}) RETURNING created_at")
            .bind(raise_id)
            .bind(tenant)
            .bind(tokens)
            .bind(Arg::Float(usd))
            .bind(suspension_id),
        )
        .await?;
    Ok(TenantRaise {
        raise_id,
        tokens: raise.tokens,
        usd: raise.usd,
        suspension_id,
        created_at: row.ts("created_at")?,
    })
}
