//! Per-tenant stream slots: how many event streams (the SSE routes, A2A streams) one tenant holds
//! open in this process, bounded by `PES_TENANT_MAX_STREAMS`. A slot is taken before the work a
//! stream reports is started (so a refused stream starts nothing) and given back when the
//! response body is dropped, whichever way the stream ends.
//!
//! The count is per replica: streams are connections to one process, and what a tenant can pin
//! is that process's sockets and memory. The run quota (`PES_TENANT_MAX_ACTIVE_RUNS`) is counted
//! in the store instead, across replicas.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::problem::Refusal;

/// The open streams of every tenant, and the limit.
#[derive(Clone, Debug)]
pub struct StreamSlots {
    open: Arc<Mutex<HashMap<String, u64>>>,
    max: u64,
}

/// One open stream of a tenant; dropping it frees the slot.
#[derive(Debug)]
pub struct StreamSlot {
    slots: StreamSlots,
    tenant: String,
}

impl StreamSlots {
    /// At most `max` open streams per tenant.
    pub fn new(max: u64) -> Self {
        Self {
            open: Arc::default(),
            max,
        }
    }

    /// A slot for one more stream of `tenant`.
    ///
    /// # Errors
    /// 429 `quota_exceeded` when the tenant already holds `max` streams.
    pub fn take(&self, tenant: &str) -> Result<StreamSlot, Refusal> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(tenant.to_owned()).or_default();
        if *n >= self.max {
            return Err(Refusal::QuotaExceeded {
                detail: format!(
                    "the tenant has {} event streams open, its quota (PES_TENANT_MAX_STREAMS): \
                     close one first",
                    self.max
                ),
                retry_after_seconds: 5,
            });
        }
        *n += 1;
        Ok(StreamSlot {
            slots: self.clone(),
            tenant: tenant.to_owned(),
        })
    }

    /// How many streams `tenant` holds open now.
    pub fn open(&self, tenant: &str) -> u64 {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                // Tenants with nothing open take no memory.
                open.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_gets_its_quota_and_a_slot_comes_back_when_dropped() {
        let slots = StreamSlots::new(2);
        let a = slots.take("a").unwrap();
        let _b = slots.take("a").unwrap();
        let refused = slots.take("a").unwrap_err();
        assert_eq!(crate::http::error::refusal_parts(&refused).0.as_u16(), 429);
        // Another tenant is not affected.
        let _other = slots.take("b").unwrap();
        drop(a);
        assert_eq!(slots.open("a"), 1);
        let _c = slots.take("a").unwrap();
    }
}
