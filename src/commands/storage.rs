//! The per-tenant byte quota (`PES_TENANT_MAX_STORAGE_BYTES`): whether a tenant may grow what it
//! stores. Counting a tenant's bytes reads every row it owns, so each replica counts a tenant at
//! most once per `PES_TENANT_STORAGE_RECOUNT_SECONDS` and answers from that count in between;
//! the writes of one tenant that find the count stale wait for one recount, not one each. Only
//! what grows storage asks (a run, a fork, a steering message, a new thread, a store put):
//! reads and deletes never do, so a tenant over its quota can always free room.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::UseCases;
use crate::problem::Refusal;

/// Tenants whose counts one replica keeps at most; past it, counts older than the recount
/// interval are forgotten (a tenant forgotten is counted again at its next write).
const MAX_TENANTS: usize = 10_000;

/// One tenant's last count: behind an async lock, so a recount is made once while the other
/// writes of the tenant wait for it.
type Slot = Arc<tokio::sync::Mutex<Option<(u64, Instant)>>>;

/// The replica's counts of tenants' bytes (cheap to clone: shared).
#[derive(Clone, Default)]
pub struct StorageCounts {
    slots: Arc<Mutex<HashMap<String, Slot>>>,
}

impl StorageCounts {
    fn slot(&self, tenant: &str, fresh: Duration) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if slots.len() >= MAX_TENANTS && !slots.contains_key(tenant) {
            slots.retain(|_, slot| {
                slot.try_lock()
                    .map(|c| (*c).is_some_and(|(_, at)| at.elapsed() < fresh))
                    .unwrap_or(true)
            });
        }
        slots.entry(tenant.to_owned()).or_default().clone()
    }
}

impl UseCases {
    /// Refuse a write that grows the tenant's storage while its bytes are past
    /// `PES_TENANT_MAX_STORAGE_BYTES`.
    ///
    /// # Errors
    /// 429 `quota_exceeded` naming the setting; 503 when the store cannot be read.
    pub async fn storage_room(&self, tenant: &str) -> Result<(), Refusal> {
        let max = self.config.tenant_max_storage_bytes;
        let fresh = Duration::from_secs(self.config.tenant_storage_recount_seconds);
        let slot = self.storage.slot(tenant, fresh);
        let bytes = {
            let mut last = slot.lock().await;
            match *last {
                Some((bytes, at)) if at.elapsed() < fresh => bytes,
                _ => {
                    let bytes = self.store.tenant_bytes(tenant).await?;
                    *last = Some((bytes, Instant::now()));
                    bytes
                }
            }
        };
        if bytes <= max {
            return Ok(());
        }
        Err(Refusal::QuotaExceeded {
            detail: format!(
                "the tenant stores {bytes} bytes, past its quota of {max} \
                 (PES_TENANT_MAX_STORAGE_BYTES): delete threads or store items to make room; \
                 reads and deletes go on"
            ),
            retry_after_seconds: fresh.as_secs().max(1),
        })
    }
}
