//! Steering a run: one rule for every steering message, whether it came through `…/steer` or as
//! a query posted with `multitaskStrategy: "steer"` (which becomes one): not empty once trimmed,
//! at most [`MAX_STEERING_CHARS`] characters, within the tenant's storage.

use uuid::Uuid;

use super::UseCases;
use crate::model::ThreadId;
use crate::problem::Refusal;
use crate::store::SteeredRun;

/// The longest steering message, in characters.
pub const MAX_STEERING_CHARS: usize = 8000;

/// 422 for a steering message the rule refuses (`what` names the field: `message` or `query`).
///
/// # Errors
/// The message is empty or longer than [`MAX_STEERING_CHARS`].
pub fn check_steering_message(what: &str, message: &str) -> Result<(), Refusal> {
    if message.trim().is_empty() {
        return Err(Refusal::Validation(format!("{what} must not be empty")));
    }
    if message.trim().chars().count() > MAX_STEERING_CHARS {
        return Err(Refusal::Validation(format!(
            "{what} is longer than {MAX_STEERING_CHARS} characters, the most a steering \
             message may have"
        )));
    }
    Ok(())
}

impl UseCases {
    /// Steer a run that has not ended: the message is committed (a `STEERING` observation and a
    /// user message) and reaches the run at its next safe point.
    ///
    /// # Errors
    /// 422 for a message the rule refuses; 404 for no such run; 409 for a run that ended or
    /// takes no steering; 429 over the tenant's storage or the run's steering quota.
    pub async fn steer(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        run_id: Uuid,
        message: &str,
    ) -> Result<SteeredRun, Refusal> {
        check_steering_message("message", message)?;
        self.storage_room(tenant).await?;
        Ok(self
            .commands
            .steer(tenant, thread_id, run_id, message.trim().to_owned())
            .await?)
    }
}
