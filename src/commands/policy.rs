//! What a thread's or a run's config may say: its ranges, the providers and tools it names (the
//! tenant's flowcharts count as tools), and the tool policy floor a run cannot loosen.

use super::UseCases;
use crate::model::{AgentConfig, AssistantPin, AssistantRef, ThreadId};
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
        if let Some(m) = cfg
            .model
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
            && !state.engine.allowed_models().allows(m)
        {
            return Err(ApiError::Unprocessable {
                code: "model_not_allowed",
                detail: format!(
                    "config.model `{m}` is not allowed here (allowed: {}; the operator sets \
                     PES_ALLOWED_MODELS)",
                    state.engine.allowed_models().describe()
                ),
            });
        }
        if let Some(p) = &cfg.provider
            && !state.engine.provider_names().contains(p)
        {
            return Err(ApiError::Validation(format!(
                "config.provider `{p}` is not configured (available: {})",
                state.engine.provider_names().join(", ")
            )));
        }
        // The tenant's flowcharts are tools too; read only when a name is not known without them.
        let mut flowcharts: Option<Vec<crate::flowchart::FlowchartRecord>> = None;
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
                if state.engine.knows_tool(name, &[]) {
                    continue;
                }
                if flowcharts.is_none() {
                    flowcharts = Some(state.store.list_flowcharts(tenant).await?);
                }
                let flowcharts = flowcharts.as_deref().unwrap_or_default();
                if !state.engine.knows_tool(name, flowcharts) {
                    let available: Vec<String> = state
                        .engine
                        .tool_catalogue(flowcharts)
                        .into_iter()
                        .map(|t| t.name)
                        .collect();
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

impl UseCases {
    /// A run under a dollar limit (its own, its thread's, its assistant's or its tenant's daily
    /// budget) must run on a model with a price, or the limit would cap nothing: 422
    /// `model_unpriced` at enqueue. Reads the thread and its assistant only when some model a
    /// run may use has no price (with prices for every allowed and default model, or a `*`
    /// price, it costs nothing).
    ///
    /// # Errors
    /// 422 `model_unpriced`; the store failed.
    pub(super) async fn check_priced(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        chosen: Option<&AssistantRef>,
        run: &AgentConfig,
    ) -> Result<(), ApiError> {
        let engine = &self.engine;
        let defaults = engine.default_models();
        if !engine
            .allowed_models()
            .unpriced_possible(engine.prices(), defaults.iter().map(String::as_str))
        {
            return Ok(());
        }
        let cfg = self
            .effective_config(tenant, thread_id, chosen, run)
            .await?;
        let model = cfg
            .model
            .clone()
            .filter(|m| !m.trim().is_empty())
            .or_else(|| engine.default_model(cfg.provider.as_deref()));
        let Some(model) = model else { return Ok(()) };
        if engine.prices().prices(&model) {
            return Ok(());
        }
        let run_limit = cfg.budget.as_ref().and_then(|b| b.max_cost_usd).is_some();
        let tenant_limit = engine
            .tenant_budget(tenant)
            .and_then(|b| b.max_cost_usd)
            .is_some();
        if run_limit || tenant_limit {
            let whose = if run_limit {
                "the run's budget (maxCostUsd)"
            } else {
                "the tenant's daily budget"
            };
            return Err(ApiError::Unprocessable {
                code: "model_unpriced",
                detail: format!(
                    "model `{model}` has no price in PES_MODEL_PRICES, so {whose} cannot cap \
                     what it spends: name a priced model, or ask the operator to price it"
                ),
            });
        }
        Ok(())
    }

    /// The config a run would run with: its thread's, under the assistant it uses (`chosen`, or
    /// the thread's), with the run's own on top (the assistant's locked fields kept), as the
    /// worker will load it.
    async fn effective_config(
        &self,
        tenant: &str,
        thread_id: &ThreadId,
        chosen: Option<&AssistantRef>,
        run: &AgentConfig,
    ) -> Result<AgentConfig, ApiError> {
        let (thread_cfg, thread_pin) = match self.store.get_thread(tenant, thread_id).await? {
            Some(t) => (
                t.config,
                t.assistant_id.map(|id| AssistantPin {
                    assistant_id: id,
                    version: t.assistant_version,
                }),
            ),
            None => (AgentConfig::default(), None),
        };
        let pin = chosen
            .map(|a| AssistantPin {
                assistant_id: a.assistant_id.clone(),
                version: Some(a.version),
            })
            .or(thread_pin);
        let version = match pin {
            Some(p) => {
                self.store
                    .assistant_version(tenant, &p.assistant_id, p.version, false)
                    .await?
            }
            None => None,
        };
        Ok(match version {
            Some(v) => v.base_for(&thread_cfg).overlay(&v.run_overrides(run)),
            None => thread_cfg.overlay(run),
        })
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
