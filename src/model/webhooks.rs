//! Webhooks: where a run's end is announced ([`WebhookSpec`], set on a run, a
//! thread or an assistant), which events there are, and a delivery as the API lists it. Pure
//! types and checks; sending is `crate::webhooks`, the outbox is `crate::store`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::*;

/// The longest webhook URL accepted, in bytes.
pub const MAX_WEBHOOK_URL_BYTES: usize = 2048;

string_enum! {
    /// What a webhook announces: a run that ended, or that waits for a person.
    WebhookEvent {
        /// The run completed (`status: completed`).
        RunCompleted => "run.completed",
        /// The run failed.
        RunFailed => "run.failed",
        /// The run was cancelled (by a client, or displaced by an `interrupt`).
        RunCancelled => "run.cancelled",
        /// The run waits for a person's decision.
        RunSuspended => "run.suspended",
    }
}

impl WebhookEvent {
    /// The event a run entering `status` announces, if any.
    pub fn for_status(status: RunStatus) -> Option<Self> {
        match status {
            RunStatus::Completed => Some(Self::RunCompleted),
            RunStatus::Failed => Some(Self::RunFailed),
            RunStatus::Cancelled => Some(Self::RunCancelled),
            RunStatus::Suspended => Some(Self::RunSuspended),
            RunStatus::Queued | RunStatus::Running => None,
        }
    }
}

/// Where to announce a run's end: a run's top-level `webhook`, or `config.webhook` of a thread,
/// an assistant or a run. The run's own wins over its thread's, which wins over its assistant's
/// (unless the assistant locks `webhook`); it is resolved once, when the run is enqueued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"url": "https://hooks.example.com/pes", "events": ["run.completed", "run.failed"]}))]
pub struct WebhookSpec {
    /// An `http` or `https` URL, at most 2,048 bytes. Private, loopback and metadata addresses
    /// are refused unless the operator allows them (`PES_WEBHOOK_ALLOW`).
    #[schema(max_length = 2048, example = "https://hooks.example.com/pes")]
    pub url: String,
    /// The events to send; default all four.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<WebhookEvent>>,
}

impl WebhookSpec {
    /// Whether this webhook wants `event`.
    pub fn wants(&self, event: WebhookEvent) -> bool {
        self.events.as_ref().is_none_or(|e| e.contains(&event))
    }

    /// Check what a type cannot: the URL's form and the events list. `field` names the spot
    /// in the request (`webhook`, `config.webhook`). Where the URL may lead is the guard's
    /// business (its address is judged when it is resolved).
    ///
    /// # Errors
    /// What is wrong, naming the field.
    pub fn try_check(&self, field: &str) -> Result<reqwest::Url, WebhookSpecError> {
        let field = || field.to_owned();
        if self.url.len() > MAX_WEBHOOK_URL_BYTES {
            return Err(WebhookSpecError::UrlTooLong(field()));
        }
        let url = reqwest::Url::parse(&self.url).map_err(|source| WebhookSpecError::NotAUrl {
            field: field(),
            url: self.url.clone(),
            source,
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(WebhookSpecError::Scheme {
                field: field(),
                scheme: url.scheme().to_owned(),
            });
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(WebhookSpecError::NoHost(field()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(WebhookSpecError::Credentials(field()));
        }
        if let Some(events) = &self.events {
            if events.is_empty() {
                return Err(WebhookSpecError::NoEvents(field()));
            }
            let mut seen = Vec::new();
            for e in events {
                if seen.contains(e) {
                    return Err(WebhookSpecError::EventTwice(field(), *e));
                }
                seen.push(*e);
            }
        }
        Ok(url)
    }
}

/// Why text is not a URL (`url::ParseError`, reached through reqwest's `Url`).
pub type UrlParseError = <reqwest::Url as std::str::FromStr>::Err;

/// What is wrong with a webhook as a request gives it, naming the field (`field.url`…).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookSpecError {
    #[error("{0}.url is longer than {MAX_WEBHOOK_URL_BYTES} bytes")]
    UrlTooLong(String),
    #[error("{field}.url is not a URL ({source}): `{url}`")]
    NotAUrl {
        field: String,
        url: String,
        #[source]
        source: UrlParseError,
    },
    #[error("{field}.url must be an http or https URL, not `{scheme}:`")]
    Scheme { field: String, scheme: String },
    #[error("{0}.url has no host")]
    NoHost(String),
    #[error(
        "{0}.url must not carry credentials: deliveries are signed (`webhook-signature`), \
         verify that instead"
    )]
    Credentials(String),
    #[error("{0}.events must name at least one event (omit it for all)")]
    NoEvents(String),
    #[error("{0}.events names `{1}` twice")]
    EventTwice(String, WebhookEvent),
}

string_enum! {
    /// Where a delivery stands.
    DeliveryStatus {
        /// Not sent yet, or to be tried again at `nextAttemptAt`.
        Pending => "pending",
        /// The receiver answered 2xx.
        Delivered => "delivered",
        /// Given up: every attempt failed, the receiver answered 410, or the URL is refused.
        Failed => "failed",
    }
}

/// One webhook to send (or sent): the outbox row as `GET /v1/webhook-deliveries` lists it. Its
/// `deliveryId` is the `webhook-id` header of every attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDelivery {
    /// Also the `webhook-id` of every attempt.
    pub delivery_id: Uuid,
    pub run_id: Uuid,
    pub thread_id: ThreadId,
    pub event: WebhookEvent,
    pub url: String,
    pub status: DeliveryStatus,
    /// Attempts made over the delivery's life, those after a retry asked with `…/retry`
    /// included (a retry gets `PES_WEBHOOK_MAX_ATTEMPTS` more).
    pub attempts: i64,
    /// When the next attempt is due; null unless `pending`.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Why the last failed attempt failed (kept after a later success).
    pub last_error: Option<String>,
    /// The HTTP status of the last answer; null when none came.
    pub last_status_code: Option<i64>,
    /// When the run's end was committed (the outbox row with it).
    pub created_at: DateTime<Utc>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    pub delivered_at: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str, events: Option<Vec<WebhookEvent>>) -> WebhookSpec {
        WebhookSpec {
            url: url.into(),
            events,
        }
    }

    #[test]
    fn a_webhook_url_must_be_plain_http() {
        assert!(
            spec("https://h.example/x", None)
                .try_check("webhook")
                .is_ok()
        );
        for (bad, says) in [
            ("ftp://h.example/", "http or https"),
            ("not a url", "is not a URL"),
            ("https://u:p@h.example/", "credentials"),
        ] {
            let e = spec(bad, None)
                .try_check("webhook")
                .unwrap_err()
                .to_string();
            assert!(e.contains(says) && e.starts_with("webhook.url"), "{e}");
        }
        let e = spec("https://h.example/", Some(vec![]))
            .try_check("config.webhook")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("config.webhook.events"), "{e}");
    }

    #[test]
    fn events_default_to_all() {
        let all = spec("https://h.example/", None);
        let some = spec("https://h.example/", Some(vec![WebhookEvent::RunFailed]));
        for e in WebhookEvent::ALL {
            assert!(all.wants(*e));
        }
        assert!(some.wants(WebhookEvent::RunFailed) && !some.wants(WebhookEvent::RunCompleted));
        assert_eq!(
            WebhookEvent::for_status(RunStatus::Suspended),
            Some(WebhookEvent::RunSuspended)
        );
        assert_eq!(WebhookEvent::for_status(RunStatus::Running), None);
    }
}
