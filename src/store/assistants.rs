//! Assistants: per tenant, one `assistants` row (which version runs, and the
//! last version number handed out) and one immutable `assistant_versions` row per version.
//! Written once for both dialects.
//!
//! Invariants:
//! - version numbers of an assistant are never reused: `last_version` only grows, through
//!   pruning, deletion and re-creation alike; two concurrent updates take the row lock in turn
//!   and get distinct versions, on any replica;
//! - the current version is never pruned, and neither is a version a queued, running or
//!   suspended run uses: a run's enqueue holds the version row (`FOR KEY SHARE`) until it
//!   commits, and pruning locks the rows it may delete first, then reads which versions active
//!   runs use in a later statement, so it sees every run committed meanwhile;
//! - a deleted assistant is a tombstone (`deleted_at`): hidden from the API and from new runs,
//!   while the runs already enqueued still read their version.

use super::rows;
use super::sql::{Arg, Conn, Row, q};
use super::sql_store::SqlStore;
use super::{AssistantDraft, PageCursor, StoreError, StoreResult};
use crate::model::{
    Assistant, AssistantId, AssistantPin, AssistantRef, AssistantVersion, ThreadId,
};

const VERSION_COLUMNS: &str = "v.assistant_id, v.version, v.name, v.description, v.config, \
    v.locked, v.created_at";

/// One assistant showing one version: the version's columns plus the assistant's
/// (`current_version`, `a_created_at`, `a_updated_at`).
const ASSISTANT_COLUMNS: &str = "v.assistant_id, v.version, v.name, v.description, v.config, \
    v.locked, v.created_at, a.current_version, a.created_at AS a_created_at, \
    a.updated_at AS a_updated_at";

/// The join of an assistant with its version `{version}` (an SQL expression).
fn assistant_join(version: &str) -> String {
    format!(
        "assistants a JOIN assistant_versions v ON v.tenant = a.tenant \
         AND v.assistant_id = a.assistant_id AND v.version = {version}"
    )
}

fn version_from_row(r: &Row) -> StoreResult<AssistantVersion> {
    Ok(AssistantVersion {
        assistant_id: AssistantId::from_stored(r.text("assistant_id")?),
        version: r.int("version")?,
        name: r.text("name")?,
        description: r.opt_text("description")?,
        config: r.typed("config")?,
        locked: r.typed("locked")?,
        created_at: r.ts("created_at")?,
    })
}

fn assistant_from_row(r: &Row) -> StoreResult<Assistant> {
    Ok(Assistant::showing(
        version_from_row(r)?,
        r.int("current_version")?,
        r.ts("a_created_at")?,
        r.ts("a_updated_at")?,
    ))
}

/// The live assistant's `(current_version, last_version)`, its row locked until the transaction
/// ends (a single-table lock: a join would drop the row when a concurrent update moved it on).
async fn lock_live(tx: &mut Conn, tenant: &str, id: &AssistantId) -> StoreResult<(i64, i64)> {
    let row = tx
        .opt(
            q("SELECT current_version, last_version FROM assistants \
               WHERE tenant = $1 AND assistant_id = $2 AND deleted_at IS NULL {lock}")
            .bind(tenant)
            .bind(id.as_str()),
        )
        .await?
        .ok_or_else(|| StoreError::AssistantNotFound(id.to_string()))?;
    Ok((row.int("current_version")?, row.int("last_version")?))
}

async fn insert_version(
    tx: &mut Conn,
    tenant: &str,
    id: &AssistantId,
    version: i64,
    draft: &AssistantDraft,
) -> StoreResult<()> {
    tx.exec(
        q(
            "INSERT INTO assistant_versions (tenant, assistant_id, version, name, description, \
             config, locked, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, {now})",
        )
        .bind(tenant)
        .bind(id.as_str())
        .bind(version)
        .bind(draft.name.clone().unwrap_or_default())
        .bind(&draft.description)
        .bind(rows::to_json(&draft.config)?)
        .bind(rows::to_json(&draft.locked.clone().unwrap_or_default())?),
    )
    .await?;
    Ok(())
}

/// The assistant showing `version` (the current one when `None`), read in `conn`.
async fn assistant_in(
    conn: &mut Conn,
    tenant: &str,
    id: &AssistantId,
    version: Option<i64>,
) -> StoreResult<Option<Assistant>> {
    conn.opt(
        q(format!(
            "SELECT {ASSISTANT_COLUMNS} FROM {} \
             WHERE a.tenant = $1 AND a.assistant_id = $2 AND a.deleted_at IS NULL",
            assistant_join("COALESCE($3, a.current_version)")
        ))
        .bind(tenant)
        .bind(id.as_str())
        .bind(Arg::Int(version)),
    )
    .await?
    .as_ref()
    .map(assistant_from_row)
    .transpose()
}

/// Delete the oldest versions past `keep` (the versions kept, `current` always among them)
/// that no queued, running or suspended run uses. Rows are locked first, so a run being
/// enqueued on one of them (which holds it `FOR KEY SHARE`) commits before the runs are read.
async fn prune(
    tx: &mut Conn,
    tenant: &str,
    id: &AssistantId,
    current: Option<i64>,
    keep: u64,
) -> StoreResult<()> {
    let count = tx
        .one(
            q("SELECT COUNT(*) AS n FROM assistant_versions WHERE tenant = $1 AND assistant_id = $2")
                .bind(tenant)
                .bind(id.as_str()),
        )
        .await?
        .int("n")?;
    let keep = i64::try_from(keep).unwrap_or(i64::MAX);
    if count <= keep {
        return Ok(());
    }
    let current = current.unwrap_or(0);
    tx.all(
        q("SELECT version FROM assistant_versions \
           WHERE tenant = $1 AND assistant_id = $2 AND version <> $3 {lock}")
        .bind(tenant)
        .bind(id.as_str())
        .bind(current),
    )
    .await?;
    // A new statement: on Postgres it sees the runs committed while the lock above waited.
    tx.exec(
        q(
            "DELETE FROM assistant_versions WHERE tenant = $1 AND assistant_id = $2 \
             AND version IN (SELECT v.version FROM assistant_versions v \
               WHERE v.tenant = $1 AND v.assistant_id = $2 AND v.version <> $3 \
                 AND v.version NOT IN (SELECT r.assistant_version FROM runs r \
                   WHERE r.tenant = $1 AND r.assistant_id = $2 \
                     AND r.status IN ('queued', 'running', 'suspended') \
                     AND r.assistant_version IS NOT NULL) \
               ORDER BY v.version LIMIT $4)",
        )
        .bind(tenant)
        .bind(id.as_str())
        .bind(current)
        .bind(count - keep),
    )
    .await?;
    Ok(())
}

/// What an enqueue reads of its thread (see [`lock_thread_for_run`]).
pub(super) struct LockedThread {
    pub last_seq: i64,
    pub assistant: Option<AssistantPin>,
    /// The thread's `config.webhook`, as stored.
    pub webhook: Option<serde_json::Value>,
}

/// Lock the thread row (as `threads::lock_thread`, the first lock of an enqueue) and read what a
/// run needs of it: its `last_seq`, the assistant it uses and its webhook; `None` when the thread
/// does not exist.
pub(super) async fn lock_thread_for_run(
    tx: &mut Conn,
    tenant: &str,
    thread_id: &ThreadId,
) -> StoreResult<Option<LockedThread>> {
    let sql = format!(
        "SELECT last_seq, assistant_id, assistant_version, {} AS webhook FROM threads \
         WHERE tenant = $1 AND thread_id = $2 AND NOT copying {{lock}}",
        super::webhooks::config_webhook(tx.dialect(), "config")
    );
    let Some(row) = tx.opt(q(sql).bind(tenant).bind(thread_id.as_str())).await? else {
        return Ok(None);
    };
    let pin = row.opt_text("assistant_id")?.map(|id| AssistantPin {
        assistant_id: AssistantId::from_stored(id),
        version: None,
    });
    let pin = match pin {
        Some(mut p) => {
            p.version = row.opt_int("assistant_version")?;
            Some(p)
        }
        None => None,
    };
    Ok(Some(LockedThread {
        last_seq: row.int("last_seq")?,
        assistant: pin,
        webhook: row.opt_json("webhook")?.filter(|v| !v.is_null()),
    }))
}

/// The version a run enqueued now uses: `pin`'s version, or the assistant's current one; held
/// (`FOR KEY SHARE`) until the enqueue commits, so it cannot be pruned under the new run. With it,
/// the version's webhook, and whether it locks `webhook`.
///
/// # Errors
/// [`StoreError::AssistantNotFound`] when the assistant is deleted or never was;
/// [`StoreError::AssistantVersionNotFound`] when the pinned version is not there (pruned).
pub(super) async fn version_for_run(
    tx: &mut Conn,
    tenant: &str,
    pin: &AssistantPin,
) -> StoreResult<(AssistantRef, super::webhooks::VersionHook)> {
    let found = tx
        .opt(
            q(format!(
                "SELECT v.version, {} AS webhook, v.locked FROM {} \
                 WHERE a.tenant = $1 AND a.assistant_id = $2 AND a.deleted_at IS NULL \
                 {{share of v}}",
                super::webhooks::config_webhook(tx.dialect(), "v.config"),
                assistant_join("COALESCE($3, a.current_version)")
            ))
            .bind(tenant)
            .bind(pin.assistant_id.as_str())
            .bind(Arg::Int(pin.version)),
        )
        .await?;
    match found {
        Some(row) => {
            let locked: Vec<String> = row.opt_typed("locked")?.unwrap_or_default();
            Ok((
                AssistantRef {
                    assistant_id: pin.assistant_id.clone(),
                    version: row.int("version")?,
                },
                super::webhooks::VersionHook {
                    webhook: row.opt_json("webhook")?.filter(|v| !v.is_null()),
                    locked: locked.iter().any(|f| f == "webhook"),
                },
            ))
        }
        None => Err(missing(tx, tenant, &pin.assistant_id, pin.version).await),
    }
}

/// Why an assistant (or one of its versions) was not found.
async fn missing(
    conn: &mut Conn,
    tenant: &str,
    id: &AssistantId,
    version: Option<i64>,
) -> StoreError {
    let live = conn
        .opt(
            q("SELECT 1 AS one FROM assistants \
               WHERE tenant = $1 AND assistant_id = $2 AND deleted_at IS NULL")
            .bind(tenant)
            .bind(id.as_str()),
        )
        .await;
    match (live, version) {
        (Err(e), _) => e,
        (Ok(Some(_)), Some(version)) => StoreError::AssistantVersionNotFound {
            assistant_id: id.to_string(),
            version,
        },
        (Ok(_), _) => StoreError::AssistantNotFound(id.to_string()),
    }
}

impl SqlStore {
    /// Create the tenant's assistant `id` with its first version, made current; `None` when the
    /// tenant already has `max` assistants. An id whose assistant was deleted is created again,
    /// its versions numbered on from the last one it had.
    ///
    /// # Errors
    /// [`StoreError::AssistantExists`] when the tenant has a live assistant with this id.
    pub async fn create_assistant(
        &self,
        tenant: &str,
        id: &AssistantId,
        draft: &AssistantDraft,
        max: u64,
    ) -> StoreResult<Option<Assistant>> {
        let mut tx = self.write().await?;
        // Creations of one tenant one at a time: the count below stays exact across replicas.
        tx.lock_key(&format!("assistants\u{1f}{tenant}")).await?;
        let existing = tx
            .opt(
                q("SELECT last_version, deleted_at FROM assistants \
                   WHERE tenant = $1 AND assistant_id = $2 {lock}")
                .bind(tenant)
                .bind(id.as_str()),
            )
            .await?;
        if let Some(row) = &existing
            && row.opt_ts("deleted_at")?.is_none()
        {
            return Err(StoreError::AssistantExists);
        }
        let live = tx
            .one(
                q("SELECT COUNT(*) AS n FROM (SELECT 1 FROM assistants \
                   WHERE tenant = $1 AND deleted_at IS NULL LIMIT $2) a")
                .bind(tenant)
                .bind(i64::try_from(max).unwrap_or(i64::MAX)),
            )
            .await?
            .int("n")?;
        if u64::try_from(live).unwrap_or(0) >= max {
            return Ok(None);
        }
        let version = match &existing {
            Some(row) => row.int("last_version")? + 1,
            None => 1,
        };
        let stmt = if existing.is_some() {
            "UPDATE assistants SET current_version = $3, last_version = $3, created_at = {now}, \
               updated_at = {now}, deleted_at = NULL WHERE tenant = $1 AND assistant_id = $2"
        } else {
            "INSERT INTO assistants (tenant, assistant_id, current_version, last_version, \
               created_at, updated_at) VALUES ($1, $2, $3, $3, {now}, {now})"
        };
        tx.exec(q(stmt).bind(tenant).bind(id.as_str()).bind(version))
            .await?;
        insert_version(&mut tx, tenant, id, version, draft).await?;
        let created = assistant_in(&mut tx, tenant, id, None).await?;
        tx.commit().await?;
        Ok(created)
    }

    /// Add a version to the assistant and make it current; `draft`'s `None` fields keep the
    /// current version's. Past `keep` versions, the oldest that neither is current nor is used
    /// by an active run are deleted.
    ///
    /// # Errors
    /// [`StoreError::AssistantNotFound`].
    pub async fn update_assistant(
        &self,
        tenant: &str,
        id: &AssistantId,
        draft: &AssistantDraft,
        keep: u64,
    ) -> StoreResult<Assistant> {
        let mut tx = self.write().await?;
        let (current, last) = lock_live(&mut tx, tenant, id).await?;
        let now = tx
            .one(
                q(format!(
                    "SELECT {VERSION_COLUMNS} FROM assistant_versions v \
                     WHERE v.tenant = $1 AND v.assistant_id = $2 AND v.version = $3"
                ))
                .bind(tenant)
                .bind(id.as_str())
                .bind(current),
            )
            .await?;
        let now = version_from_row(&now)?;
        let draft = AssistantDraft {
            name: draft.name.clone().or(Some(now.name)),
            description: draft.description.clone().or(now.description),
            config: draft.config.clone(),
            locked: draft.locked.clone().or(Some(now.locked)),
        };
        let version = last + 1;
        tx.exec(
            q(
                "UPDATE assistants SET current_version = $3, last_version = $3, \
               updated_at = {now} WHERE tenant = $1 AND assistant_id = $2",
            )
            .bind(tenant)
            .bind(id.as_str())
            .bind(version),
        )
        .await?;
        insert_version(&mut tx, tenant, id, version, &draft).await?;
        prune(&mut tx, tenant, id, Some(version), keep).await?;
        let updated = assistant_in(&mut tx, tenant, id, None)
            .await?
            .ok_or_else(|| StoreError::AssistantNotFound(id.to_string()))?;
        tx.commit().await?;
        Ok(updated)
    }

    /// The assistant showing `version` (the current one when `None`).
    ///
    /// # Errors
    /// [`StoreError::AssistantNotFound`]; [`StoreError::AssistantVersionNotFound`].
    pub async fn get_assistant(
        &self,
        tenant: &str,
        id: &AssistantId,
        version: Option<i64>,
    ) -> StoreResult<Assistant> {
        let mut conn = self.read().await?;
        match assistant_in(&mut conn, tenant, id, version).await? {
            Some(a) => Ok(a),
            None => Err(missing(&mut conn, tenant, id, version).await),
        }
    }

    /// One version of an assistant (the current one when `version` is `None`); a deleted
    /// assistant's versions only with `include_deleted` (a run enqueued before the delete reads
    /// the one it uses). `None` when there is no such version.
    pub async fn assistant_version(
        &self,
        tenant: &str,
        id: &AssistantId,
        version: Option<i64>,
        include_deleted: bool,
    ) -> StoreResult<Option<AssistantVersion>> {
        let live = if include_deleted {
            ""
        } else {
            "AND a.deleted_at IS NULL"
        };
        self.read()
            .await?
            .opt(
                q(format!(
                    "SELECT {VERSION_COLUMNS} FROM {} \
                     WHERE a.tenant = $1 AND a.assistant_id = $2 {live}",
                    assistant_join("COALESCE($3, a.current_version)")
                ))
                .bind(tenant)
                .bind(id.as_str())
                .bind(Arg::Int(version)),
            )
            .await?
            .as_ref()
            .map(version_from_row)
            .transpose()
    }

    /// The tenant's live assistants (each showing its current version), newest first
    /// (`created_at` desc, then id desc); at most `limit` after `cursor`.
    pub async fn list_assistants(
        &self,
        tenant: &str,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> StoreResult<Vec<Assistant>> {
        let after = if cursor.is_some() {
            "AND (a.created_at, a.assistant_id) < ($3, $4)"
        } else {
            ""
        };
        let mut stmt = q(format!(
            "SELECT {ASSISTANT_COLUMNS} FROM {} \
             WHERE a.tenant = $1 AND a.deleted_at IS NULL {after} \
             ORDER BY a.created_at DESC, a.assistant_id DESC LIMIT $2",
            assistant_join("a.current_version")
        ))
        .bind(tenant)
        .bind(rows::sql_limit(limit));
        if let Some(c) = cursor {
            stmt = stmt.bind(c.created_at).bind(&c.id);
        }
        let rows = self.read().await?.all(stmt).await?;
        rows.iter().map(assistant_from_row).collect()
    }

    /// The assistant's versions still kept, newest first: at most `limit` with a version below
    /// `before`.
    ///
    /// # Errors
    /// [`StoreError::AssistantNotFound`].
    pub async fn list_assistant_versions(
        &self,
        tenant: &str,
        id: &AssistantId,
        limit: u32,
        before: Option<i64>,
    ) -> StoreResult<Vec<AssistantVersion>> {
        let mut tx = self.snapshot().await?;
        let live = tx
            .opt(
                q("SELECT 1 AS one FROM assistants \
                   WHERE tenant = $1 AND assistant_id = $2 AND deleted_at IS NULL")
                .bind(tenant)
                .bind(id.as_str()),
            )
            .await?;
        if live.is_none() {
            return Err(StoreError::AssistantNotFound(id.to_string()));
        }
        let rows = tx
            .all(
                q(format!(
                    "SELECT {VERSION_COLUMNS} FROM assistant_versions v \
                     WHERE v.tenant = $1 AND v.assistant_id = $2 AND v.version < $4 \
                     ORDER BY v.version DESC LIMIT $3"
                ))
                .bind(tenant)
                .bind(id.as_str())
                .bind(rows::sql_limit(limit))
                .bind(before.unwrap_or(i64::MAX)),
            )
            .await?;
        tx.commit().await?;
        rows.iter().map(version_from_row).collect()
    }

    /// Make `version` the one that runs (roll back or forward): runs enqueued from now on use
    /// it; runs already enqueued keep theirs.
    ///
    /// # Errors
    /// [`StoreError::AssistantNotFound`]; [`StoreError::AssistantVersionNotFound`].
    pub async fn set_current_assistant_version(
        &self,
        tenant: &str,
        id: &AssistantId,
        version: i64,
    ) -> StoreResult<Assistant> {
        let mut tx = self.write().await?;
        lock_live(&mut tx, tenant, id).await?;
        let changed = tx
            .exec(
                q(
                    "UPDATE assistants SET current_version = $3, updated_at = {now} \
                   WHERE tenant = $1 AND assistant_id = $2 AND EXISTS (SELECT 1 \
                     FROM assistant_versions v WHERE v.tenant = $1 AND v.assistant_id = $2 \
                       AND v.version = $3)",
                )
                .bind(tenant)
                .bind(id.as_str())
                .bind(version),
            )
            .await?;
        if changed == 0 {
            return Err(StoreError::AssistantVersionNotFound {
                assistant_id: id.to_string(),
                version,
            });
        }
        let shown = assistant_in(&mut tx, tenant, id, None)
            .await?
            .ok_or_else(|| StoreError::AssistantNotFound(id.to_string()))?;
        tx.commit().await?;
        Ok(shown)
    }

    /// Delete the assistant: it is no longer listed, read or usable by new runs, and its
    /// versions are dropped except those queued, running or suspended runs use (they finish
    /// with them). A later create of the id numbers its versions on.
    ///
    /// # Errors
    /// [`StoreError::AssistantNotFound`].
    pub async fn delete_assistant(&self, tenant: &str, id: &AssistantId) -> StoreResult<()> {
        let mut tx = self.write().await?;
        lock_live(&mut tx, tenant, id).await?;
        tx.exec(
            q(
                "UPDATE assistants SET deleted_at = {now}, updated_at = {now} \
               WHERE tenant = $1 AND assistant_id = $2",
            )
            .bind(tenant)
            .bind(id.as_str()),
        )
        .await?;
        prune(&mut tx, tenant, id, None, 0).await?;
        tx.commit().await?;
        Ok(())
    }
}
