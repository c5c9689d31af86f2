//! The delivery loop: claim due outbox rows, send each (one attempt), record the outcome.
//! [`Deliverer::deliver_due`] is one round, so tests and the loop drive the same unit of work.

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use reqwest::{Url, redirect};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{WebhookSettings, backoff};
use crate::store::{ClaimedDelivery, DeliveryOutcome, SqlStore, StoreResult};
use crate::tools::http::guard::{GuardError, GuardedResolver};

/// How much longer than one attempt may take a claim holds a delivery: past it, another replica
/// takes the delivery over (its sender is taken for dead).
const LEASE_MARGIN: Duration = Duration::from_secs(5);

/// How long the loop waits after a wake-up before it claims, so that deliveries written by
/// commits close together are claimed and recorded together.
const GATHER: Duration = Duration::from_millis(10);

/// Sends this process's share of the outbox.
pub struct Deliverer {
    store: Arc<SqlStore>,
    settings: WebhookSettings,
    client: reqwest::Client,
    owner: String,
}

/// The webhook HTTP client cannot be built.
#[derive(Debug, thiserror::Error)]
#[error("building the webhook HTTP client: {0}")]
pub struct ClientBuildError(#[source] reqwest::Error);

impl Deliverer {
    /// A deliverer claiming as `owner` (unique per process), with a guarded HTTP client that
    /// follows no redirect and uses no proxy (either could route around the guard).
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(
        store: Arc<SqlStore>,
        settings: WebhookSettings,
        owner: String,
    ) -> Result<Self, ClientBuildError> {
        let client = crate::net::client_builder()
            .no_proxy()
            .redirect(redirect::Policy::none())
            .referer(false)
            .dns_resolver(GuardedResolver::new(settings.guard.clone()))
            .timeout(settings.timeout)
            .build()
            .map_err(ClientBuildError)?;
        Ok(Self {
            store,
            settings,
            client,
            owner,
        })
    }

    /// Until `stop` fires: send what is due, then wait for a commit of this process that wrote a
    /// delivery, or `PES_WEBHOOK_POLL_MS` (other replicas' deliveries, retries that came due).
    pub async fn run(self, stop: CancellationToken) {
        info!(
            allowed = %self.settings.guard.allow_list(),
            "webhooks are signed and sent; targets beyond public addresses: only what \
             PES_WEBHOOK_ALLOW allows"
        );
        loop {
            match self.deliver_due().await {
                // A full batch: more may be due.
                Ok(n) if n >= self.settings.concurrency => continue,
                Ok(_) => {}
                Err(e) => warn!(error = %e, "claiming webhook deliveries failed; retrying"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.store.webhook_written_wait() => {
                    // Runs that end together are sent together: one claim and one record for
                    // all of them, for a few milliseconds of delay.
                    tokio::time::sleep(GATHER).await;
                }
                _ = tokio::time::sleep(self.settings.poll) => {}
            }
        }
    }

    /// One round: claim up to `PES_WEBHOOK_CONCURRENCY` due deliveries, send them at once, record
    /// their outcomes together. How many were claimed.
    ///
    /// # Errors
    /// The claim failed (outcomes that cannot be recorded are logged; their leases run out and
    /// the deliveries are sent again).
    pub async fn deliver_due(&self) -> StoreResult<usize> {
        let lease = self.settings.timeout + LEASE_MARGIN;
        let claimed = self
            .store
            .claim_deliveries(&self.owner, lease, self.settings.concurrency)
            .await?;
        let n = claimed.len();
        if n == 0 {
            return Ok(0);
        }
        let done: Vec<(String, DeliveryOutcome)> =
            futures::future::join_all(claimed.iter().map(|c| self.deliver(c)))
                .await
                .into_iter()
                .collect();
        let rows: Vec<(&ClaimedDelivery, &str, &DeliveryOutcome)> = claimed
            .iter()
            .zip(&done)
            .filter(|(_, (body, _))| !body.is_empty())
            .map(|(c, (body, outcome))| (c, body.as_str(), outcome))
            .collect();
        match self.store.finish_deliveries(&self.owner, &rows).await {
            Ok(k) if k < rows.len() => debug!(
                lost = rows.len() - k,
                "webhook leases lost: another replica has those deliveries"
            ),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "recording webhook attempts failed"),
        }
        Ok(n)
    }

    /// One attempt of a claimed delivery: the body it sent (empty when none could be built: the
    /// lease runs out and it is tried again) and its outcome.
    async fn deliver(&self, claimed: &ClaimedDelivery) -> (String, DeliveryOutcome) {
        let id = claimed.delivery.delivery_id;
        let body = match &claimed.body {
            Some(b) => b.clone(),
            None => match self.body(claimed).await {
                Ok(b) => b,
                Err(e) => {
                    warn!(delivery_id = %id, error = %e, "building a webhook's body failed");
                    let outcome = failed(e.to_string(), None);
                    return (String::new(), outcome);
                }
            },
        };
        let outcome = self.attempt(claimed, &body).await;
        match &outcome {
            DeliveryOutcome::Delivered { status_code } => {
                debug!(delivery_id = %id, status_code, "webhook delivered");
            }
            DeliveryOutcome::Retry { after, error, .. } => {
                info!(delivery_id = %id, attempt = claimed.delivery.attempts, retry_in_ms = after.as_millis() as u64, %error, "webhook attempt failed; retrying");
            }
            DeliveryOutcome::Failed { error, .. } => {
                warn!(delivery_id = %id, attempts = claimed.delivery.attempts, %error, "webhook delivery failed");
            }
        }
        (body, outcome)
    }

    /// The body every attempt sends: `{type, timestamp, data}`, `data` the run as its event
    /// left it (with the suspension a `run.suspended` is about).
    async fn body(&self, c: &ClaimedDelivery) -> StoreResult<String> {
        let mut run = c.run.clone();
        if let Some(sid) = c.suspension_id
            && let Some(s) = self.store.get_suspension(&c.tenant, sid).await?
        {
            run.suspension = serde_json::to_value(&s).ok();
        }
        Ok(json!({
            "type": c.delivery.event.as_str(),
            "timestamp": c.delivery.created_at.to_rfc3339_opts(SecondsFormat::Micros, true),
            "data": run,
        })
        .to_string())
    }

    /// One attempt, signed with its own timestamp.
    async fn attempt(&self, c: &ClaimedDelivery, body: &str) -> DeliveryOutcome {
        let Some(secret) = &self.settings.secret else {
            return DeliveryOutcome::Failed {
                error: "PES_WEBHOOK_SECRET is not set: webhooks cannot be signed".into(),
                status_code: None,
            };
        };
        let url = match Url::parse(&c.delivery.url) {
            Ok(u) => u,
            Err(e) => return failed(format!("the URL does not parse: {e}"), None),
        };
        // An address in the URL never reaches the resolver: judge it here.
        if let Err(e) = self.settings.guard.check_url(&url) {
            return failed(e.to_string(), None);
        }
        let id = c.delivery.delivery_id.to_string();
        let timestamp = Utc::now().timestamp();
        let signature = secret.sign(&id, timestamp, body.as_bytes());
        let sent = self
            .client
            .post(url)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body.to_owned())
            .send()
            .await;
        match sent {
            Ok(resp) if resp.status().is_success() => DeliveryOutcome::Delivered {
                status_code: i64::from(resp.status().as_u16()),
            },
            Ok(resp) if resp.status() == reqwest::StatusCode::GONE => failed(
                "the receiver answered 410 Gone: no more attempts".into(),
                Some(410),
            ),
            Ok(resp) => {
                let code = resp.status().as_u16();
                self.again(
                    c,
                    format!("the receiver answered {}", resp.status()),
                    Some(code),
                )
            }
            Err(e) => match guard_refusal(&e) {
                Some(refused) => failed(refused.to_string(), None),
                None if e.is_timeout() => self.again(
                    c,
                    format!(
                        "no answer within {} s (PES_WEBHOOK_TIMEOUT_SECONDS)",
                        self.settings.timeout.as_secs()
                    ),
                    None,
                ),
                None => self.again(c, format!("could not send: {}", chain(&e)), None),
            },
        }
    }

    /// A failed attempt: retried after the backoff, or the last one.
    fn again(&self, c: &ClaimedDelivery, error: String, code: Option<u16>) -> DeliveryOutcome {
        let made = c.round_attempts;
        let max = i64::from(self.settings.max_attempts);
        let status_code = code.map(i64::from);
        if made >= max {
            return DeliveryOutcome::Failed {
                error: format!("{error} (attempt {made} of {max}: PES_WEBHOOK_MAX_ATTEMPTS)"),
                status_code,
            };
        }
        DeliveryOutcome::Retry {
            after: backoff(made, self.settings.retry_base),
            error,
            status_code,
        }
    }
}

fn failed(error: String, status_code: Option<i64>) -> DeliveryOutcome {
    DeliveryOutcome::Failed { error, status_code }
}

/// The guard's refusal inside a send error (the resolver refused every address).
fn guard_refusal(e: &reqwest::Error) -> Option<&GuardError> {
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(g) = s.downcast_ref::<GuardError>() {
            return Some(g);
        }
        source = s.source();
    }
    None
}

/// An error with its causes, on one line.
fn chain(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
