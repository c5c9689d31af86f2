//! Webhooks as use cases: whether a webhook may be set (the service signs them,
//! and the SSRF guard allows where it points), a tenant's deliveries, and sending a failed one
//! again. Sending is `crate::webhooks`; the outbox is written by the store with the run's end.

use uuid::Uuid;

use super::UseCases;
use crate::model::{DeliveryStatus, WebhookDelivery, WebhookSpec};
use crate::problem::Refusal;
use crate::store::{DeliveryFilter, PageCursor};

fn delivery_not_found(id: Uuid) -> Refusal {
    Refusal::NotFound {
        code: "delivery_not_found",
        detail: format!("webhook delivery `{id}` not found"),
    }
}

impl UseCases {
    /// A webhook a run, a thread or an assistant sets at `field`: its form, a secret to sign
    /// with, and a target the guard allows (an address in the URL is judged now; a name when
    /// it is resolved, at each delivery).
    ///
    /// # Errors
    /// 422 naming the field and what is wrong; 422 `webhooks_not_configured` without
    /// `PES_WEBHOOK_SECRET`.
    pub fn check_webhook(&self, spec: &WebhookSpec, field: &str) -> Result<(), Refusal> {
        let url = spec
            .try_check(field)
            .map_err(|e| Refusal::Validation(e.to_string()))?;
        if !self.webhooks.enabled() {
            return Err(Refusal::Unprocessable {
                code: "webhooks_not_configured",
                detail: format!(
                    "{field} needs webhooks, which this service does not send: the operator sets \
                     PES_WEBHOOK_SECRET (the key they are signed with) to turn them on"
                ),
            });
        }
        self.webhooks
            .guard
            .check_url(&url)
            .map_err(|e| Refusal::Validation(format!("{field}.url is {e}")))
    }

    /// The tenant's deliveries, newest first.
    ///
    /// # Errors
    /// 422 for a cursor that is not this list's.
    pub async fn list_deliveries(
        &self,
        tenant: &str,
        run_id: Option<Uuid>,
        status: Option<DeliveryStatus>,
        limit: u32,
        cursor: Option<&PageCursor>,
    ) -> Result<Vec<WebhookDelivery>, Refusal> {
        let filter = DeliveryFilter { run_id, status };
        Ok(self
            .store
            .list_deliveries(tenant, &filter, limit, cursor)
            .await?)
    }

    /// Send a failed delivery again (a fresh round of attempts, the same `webhook-id`).
    ///
    /// # Errors
    /// 404 `delivery_not_found`; 409 `delivery_not_failed` for one pending or delivered.
    pub async fn retry_delivery(
        &self,
        tenant: &str,
        delivery_id: Uuid,
    ) -> Result<WebhookDelivery, Refusal> {
        match self.store.retry_delivery(tenant, delivery_id).await? {
            None => Err(delivery_not_found(delivery_id)),
            Some((d, true)) => Ok(d),
            Some((d, false)) => Err(Refusal::Conflict {
                code: "delivery_not_failed",
                detail: format!(
                    "webhook delivery `{delivery_id}` is {}: only a failed delivery is sent again",
                    d.status
                ),
            }),
        }
    }
}
