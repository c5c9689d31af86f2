//! What a thread's or a run's config may say: its ranges, the providers and tools it names (the
//! tenant's flowcharts count as tools), and the tool policy floor a run cannot loosen.

use super::UseCases;
use crate::model::AgentConfig;
use crate::problem::ApiError;

impl UseCases {
    /// Validate a config against what the service has (providers, tools, the tenant's
    /// flowcharts) and its ranges.
    ///
    /// # Errors
    /// 422 naming the field that is out of range or names what does not exist.
    pub async fn check_config(&self, tenant: &str, cfg: &AgentConfig) -> Result<(), ApiError> {
        let state = self;
        cfg.validate().map_err(ApiError::Validation)?;
        if let Some(w) = &cfg.webhook {
            self.check_webhook(w, "config.webhook")?;
        }
        if let Some(ns) = &cfg.memory_namespace
            && ns.len() as u64 > self.config.store_max_namespace_depth
        {
            return Err(ApiError::Validation(format!(
                "config.memoryNamespace has {} labels; at most {} are allowed \
                 (PES_STORE_MAX_NAMESPACE_DEPTH)",
                ns.len(),
                self.config.store_max_namespace_depth
            )));
        }
        if let Some(p) = &cfg.provider
            && !state.engine.provider_names().contains(p)
        {
            return Err(ApiError::Validation(format!(
                "config.provider `{p}` is not configured (available: {})",
                state.engine.provider_names().join(", ")
            )));
        }
        let tools = state.engine.tools();
        // The tenant's flowcharts are tools too; read only when a name is not a registry tool.
        let mut flowcharts: Option<Vec<String>> = None;
        // Roles narrow the tools their items may call: their names must be tools too.
        let role_tools: Vec<(String, Option<Vec<String>>)> = cfg
            .roles
            .iter()
            .flatten()
            .map(|(id, r)| (format!("roles.{id}.tools"), r.tools.clone()))
            .collect();
        let lists = [
            ("tools".to_owned(), &cfg.tools),
            ("requireApproval".to_owned(), &cfg.require_approval),
        ]
        .into_iter()
        .chain(role_tools.iter().map(|(f, l)| (f.clone(), l)));
        for (field, list) in lists {
            for name in list.iter().flatten() {
                if tools.is_known(name) {
                    continue;
                }
                if flowcharts.is_none() {
                    let names = state.store.list_flowcharts(tenant).await?;
                    flowcharts = Some(names.into_iter().map(|r| r.name).collect());
                }
                let flowcharts = flowcharts.as_deref().unwrap_or_default();
                if !flowcharts.contains(name) {
                    let mut available = tools.names();
                    available.extend(flowcharts.iter().cloned());
                    available.sort();
                    return Err(ApiError::Validation(format!(
                        "config.{field} names unknown tool `{name}` (available: {})",
                        available.join(", ")
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A run may tighten its thread's tool policy, never loosen it: its `requireApproval` keeps every
/// tool the thread's names (the engine also takes the union, so a later change to the thread
/// cannot open a gap), and its `tools` stay within the thread's.
///
/// # Errors
/// 422 `policy_floor` naming the first tool the run would drop or add.
pub fn check_policy_floor(thread: &AgentConfig, run: &AgentConfig) -> Result<(), ApiError> {
    check_floor(thread, run, "thread")
}

/// [`check_policy_floor`] of `over` under `base`, the config of what `whose` names (`thread`,
/// `assistant`): the same floor holds for a thread under its assistant.
///
/// # Errors
/// 422 `policy_floor` naming the first tool `over` would drop or add.
pub(super) fn check_floor(
    base: &AgentConfig,
    over: &AgentConfig,
    whose: &str,
) -> Result<(), ApiError> {
    if let (Some(floor), Some(asked)) = (&base.require_approval, &over.require_approval)
        && let Some(dropped) = floor.iter().find(|n| !asked.contains(n))
    {
        return Err(ApiError::Unprocessable {
            code: "policy_floor",
            detail: format!(
                "config.requireApproval may add tools to the {whose}'s, never drop one: \
                 `{dropped}` needs approval on this {whose}"
            ),
        });
    }
    if let (Some(allowed), Some(asked)) = (&base.tools, &over.tools)
        && let Some(extra) = asked.iter().find(|n| !allowed.contains(n))
    {
        return Err(ApiError::Unprocessable {
            code: "policy_floor",
            detail: format!(
                "config.tools may narrow the {whose}'s tools, never widen them: `{extra}` is not \
                 enabled on this {whose}"
            ),
        });
    }
    Ok(())
}
