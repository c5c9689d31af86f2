//! Sending webhooks: the Standard Webhooks signature ([`Secret`]), the settings
//! ([`WebhookSettings`]), the SSRF guard they go through, and the delivery loop ([`Deliverer`])
//! every replica runs over the store's outbox.
//!
//! What keeps deliveries right: the outbox row is written by the commit that ends (or suspends)
//! the run (`crate::store`), so a delivery exists exactly for the runs that got there; a replica
//! claims a due row under a lease and records the outcome fenced by that claim, so one replica
//! sends it at a time and a crashed sender's delivery is taken over when its lease runs out (at
//! least once: a crash between the receiver's 2xx and the record sends it again, with the same
//! `webhook-id`, which is how a receiver deduplicates). Every attempt of a delivery sends the same
//! body and the same `webhook-id`, signed afresh with the attempt's timestamp.

mod send;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::alphabet;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::store::SqlStore;
use crate::tools::http::guard::{AllowList, AllowListError, Guard};

pub use send::Deliverer;

/// The setting that allows webhook targets beyond public addresses; refusals name it.
pub const ALLOW_VAR: &str = "PES_WEBHOOK_ALLOW";

/// The prefix of a Standard Webhooks secret.
const SECRET_PREFIX: &str = "whsec_";

/// The longest wait between two attempts of a delivery.
pub const MAX_RETRY_WAIT: Duration = Duration::from_secs(3600);

/// The key webhooks are signed with (`PES_WEBHOOK_SECRET`, decoded).
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    /// Parse `whsec_<base64>` (padding optional), 16 to 128 bytes once decoded.
    ///
    /// # Errors
    /// What is wrong (never the secret itself).
    pub fn parse(raw: &str) -> Result<Self, SecretError> {
        let b64 = raw
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::Prefix)?;
        // As lenient as the reference libraries: padding optional, trailing bits ignored.
        let lenient = GeneralPurpose::new(
            &alphabet::STANDARD,
            GeneralPurposeConfig::new()
                .with_decode_padding_mode(DecodePaddingMode::Indifferent)
                .with_decode_allow_trailing_bits(true),
        );
        let bytes = lenient.decode(b64).map_err(SecretError::Base64)?;
        if !(16..=128).contains(&bytes.len()) {
            return Err(SecretError::Length(bytes.len()));
        }
        Ok(Self(bytes))
    }

    /// The `webhook-signature` of a message: `v1,` and the base64 HMAC-SHA256 of
    /// `<id>.<timestamp>.<body>`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// Why `PES_WEBHOOK_SECRET` cannot be used (the messages never quote the secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error(
        "PES_WEBHOOK_SECRET must start with `whsec_` (a Standard Webhooks secret: `whsec_` then \
         base64 of random bytes)"
    )]
    Prefix,
    #[error("PES_WEBHOOK_SECRET is not `whsec_` + base64: {0}")]
    Base64(#[source] base64::DecodeError),
    #[error("PES_WEBHOOK_SECRET holds {0} bytes; use 16 to 128 random bytes (32 is usual)")]
    Length(usize),
}

/// Why the webhook settings cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error(transparent)]
    Allow(#[from] AllowListError),
}

/// How webhooks are sent: the settings `PES_WEBHOOK_*`, parsed once.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// `None`: webhooks are not configured (refused where set, nothing sent).
    pub secret: Option<Arc<Secret>>,
    /// The SSRF guard with `PES_WEBHOOK_ALLOW`.
    pub guard: Arc<Guard>,
    pub timeout: Duration,
    pub max_attempts: u32,
    pub retry_base: Duration,
    pub concurrency: usize,
    pub poll: Duration,
}

impl WebhookSettings {
    /// Read the settings.
    ///
    /// # Errors
    /// A bad `PES_WEBHOOK_SECRET` or `PES_WEBHOOK_ALLOW`, named.
    pub fn from_config(config: &Config) -> Result<Self, SettingsError> {
        let secret = config
            .webhook_secret
            .as_deref()
            .map(Secret::parse)
            .transpose()?
            .map(Arc::new);
        let allow =
            AllowList::parse_setting(ALLOW_VAR, config.webhook_allow.as_deref().unwrap_or(""))?;
        Ok(Self {
            secret,
            guard: Arc::new(Guard::new(allow)),
            timeout: Duration::from_secs(config.webhook_timeout_seconds.max(1)),
            max_attempts: config.webhook_max_attempts.max(1),
            retry_base: Duration::from_millis(config.webhook_retry_base_ms.max(1)),
            concurrency: usize::try_from(config.webhook_concurrency.max(1)).unwrap_or(1),
            poll: Duration::from_millis(config.webhook_poll_ms.max(10)),
        })
    }

    /// Whether webhooks can be sent (a secret is set).
    pub fn enabled(&self) -> bool {
        self.secret.is_some()
    }
}

/// The wait after `failed` attempts: the base doubling per attempt, up to an hour, times a random
/// factor in [1, 1.25) so that many deliveries that failed together do not retry in step.
pub fn backoff(failed: i64, base: Duration) -> Duration {
    let doublings = u32::try_from(failed.saturating_sub(1).clamp(0, 32)).unwrap_or(32);
    let plain = base
        .checked_mul(2u32.saturating_pow(doublings))
        .unwrap_or(MAX_RETRY_WAIT)
        .min(MAX_RETRY_WAIT);
    let jitter = 1.0 + rand::random::<f64>() * 0.25;
    plain.mul_f64(jitter).min(MAX_RETRY_WAIT)
}

/// Run the delivery loop of this process until `stop` fires (nothing when webhooks are not
/// configured).
pub async fn deliver_until_stopped(
    store: Arc<SqlStore>,
    settings: WebhookSettings,
    owner: String,
    stop: CancellationToken,
) {
    if !settings.enabled() {
        return;
    }
    match Deliverer::new(store, settings, owner) {
        Ok(d) => d.run(stop).await,
        Err(e) => tracing::error!(error = %e, "webhooks are not sent: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_the_standard_webhooks_one() {
        // The example of the Standard Webhooks specification's reference libraries.
        let s = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sig = s.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_bad_secret_is_named_but_not_shown() {
        for bad in [
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_!!!",
            "whsec_AAAA",
        ] {
            let e = Secret::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("PES_WEBHOOK_SECRET") && !e.contains("MfKQ"),
                "{e}"
            );
        }
    }

    #[test]
    fn retries_back_off_to_an_hour() {
        let base = Duration::from_millis(1000);
        let first = backoff(1, base);
        assert!(first >= base && first < base.mul_f64(1.25), "{first:?}");
        let third = backoff(3, base);
        assert!(
            third >= base * 4 && third < (base * 4).mul_f64(1.25),
            "{third:?}"
        );
        assert_eq!(backoff(40, base), MAX_RETRY_WAIT);
    }
}
