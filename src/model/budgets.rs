//! Budgets: how much a run may spend on its model (tokens, US dollars), what happens at the limit,
//! how a person raises it, and the price table that turns tokens into dollars.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::*;

string_enum! {
    /// What a run does when its next model call would pass its budget.
    #[derive(Default)]
    OnExceed {
        /// Wait for a person (a `budget` suspension: approve with a raise, or reject).
        #[default]
        Suspend => "suspend",
        /// Fail at once with `budget_exceeded`.
        Fail => "fail",
    }
}

/// A cap on what a run spends on its model: set on a run, a thread or an assistant (the later
/// wins, as every config field) and checked before every model call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Budget {
    /// Tokens (prompt and completion) the run may use (1 to a trillion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000_000_000_u64)]
    pub max_tokens: Option<u64>,
    /// US dollars the run may spend (more than 0, at most a million), priced by
    /// `PES_MODEL_PRICES` (a model without a price costs nothing, so this caps only priced
    /// models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(exclusive_minimum = 0.0, maximum = 1_000_000.0)]
    pub max_cost_usd: Option<f64>,
    /// `suspend` (the default) or `fail`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exceed: Option<OnExceed>,
}

impl Budget {
    /// Check ranges a type cannot express.
    ///
    /// # Errors
    /// The field that is out of range, named under `field`.
    pub fn validate(&self, field: &str) -> Result<(), BudgetError> {
        if self
            .max_tokens
            .is_some_and(|t| !(1..=MAX_TOKENS).contains(&t))
        {
            return Err(BudgetError::MaxTokens(field.to_owned()));
        }
        if self.max_cost_usd.is_some_and(|u| !usd_in_range(u)) {
            return Err(BudgetError::MaxCostUsd(field.to_owned()));
        }
        Ok(())
    }

    /// Whether it caps anything.
    pub fn is_set(&self) -> bool {
        self.max_tokens.is_some() || self.max_cost_usd.is_some()
    }
}

/// A budget field out of range, named under the field that holds the budget (its API text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("{0}.maxTokens must be between 1 and {MAX_TOKENS}")]
    MaxTokens(String),
    #[error("{0}.maxCostUsd must be more than 0 and at most {MAX_USD}")]
    MaxCostUsd(String),
}

/// Why `PES_MODEL_PRICES` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PricesError {
    #[error("PES_MODEL_PRICES is not a JSON object of prices: {0}")]
    Json(#[source] serde_json::Error),
    #[error("PES_MODEL_PRICES: the prices of `{0}` must be non-negative numbers")]
    Negative(String),
}

/// Why `PES_TENANT_BUDGETS` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TenantBudgetsError {
    #[error(
        "PES_TENANT_BUDGETS is not a JSON object of tenant → {{maxTokens?, maxCostUsd?, onExceed?}}: {0}"
    )]
    Json(#[source] serde_json::Error),
    #[error(transparent)]
    Budget(#[from] BudgetError),
}

/// The largest token limit (or raise) a budget takes.
pub const MAX_TOKENS: u64 = 1_000_000_000_000;
/// The largest dollar limit (or raise) a budget takes.
pub const MAX_USD: f64 = 1_000_000.0;

/// A dollar amount a budget takes: more than 0, at most [`MAX_USD`].
pub fn usd_in_range(u: f64) -> bool {
    u.is_finite() && u > 0.0 && u <= MAX_USD
}

/// What a person adds to a budget when approving a `budget` suspension (the run's, or with an
/// operator key the tenant's day), or what an operator adds to a tenant's day. Each is bounded
/// per decision by `PES_MAX_BUDGET_RAISE_TOKENS` and `PES_MAX_BUDGET_RAISE_USD`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RaiseBy {
    /// Tokens added to `maxTokens`: a whole number from 1 to `PES_MAX_BUDGET_RAISE_TOKENS`
    /// (default 10,000,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000_000_000_u64)]
    pub tokens: Option<u64>,
    /// US dollars added to `maxCostUsd`: more than 0, at most `PES_MAX_BUDGET_RAISE_USD`
    /// (default 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(exclusive_minimum = 0.0, maximum = 1_000_000.0)]
    pub usd: Option<f64>,
}

/// The most one decision may raise a budget by (`PES_MAX_BUDGET_RAISE_TOKENS`,
/// `PES_MAX_BUDGET_RAISE_USD`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RaiseLimits {
    pub max_tokens: u64,
    pub max_usd: f64,
}

impl Default for RaiseLimits {
    fn default() -> Self {
        Self {
            max_tokens: 10_000_000,
            max_usd: 1000.0,
        }
    }
}

/// A raise as a request carries it, before its numbers are checked: any JSON, so that a value
/// the type could not hold (a float, a number past `u64`, a string) is refused as an invalid
/// raise by [`RaiseRequest::check`], with one code, rather than slipping through a lenient parse.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RaiseRequest {
    #[serde(default)]
    pub tokens: Option<serde_json::Value>,
    #[serde(default)]
    pub usd: Option<serde_json::Value>,
}

/// Why a raise is refused (422 `invalid_raise`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRaise(pub String);

impl RaiseRequest {
    /// The raise from loose numbers (a door that reads its own fields, such as an MCP form).
    pub fn of(tokens: Option<serde_json::Value>, usd: Option<serde_json::Value>) -> Self {
        Self { tokens, usd }
    }

    /// The raise, when its numbers are ones a budget takes: `tokens` a whole number from 1 to
    /// `limits.max_tokens`, `usd` a finite number above 0 and at most `limits.max_usd`, and at
    /// least one of them (`field` names the raise in the message: `raiseBy`, or empty for a
    /// body that is the raise itself).
    ///
    /// # Errors
    /// [`InvalidRaise`] naming the number that is not.
    pub fn check(&self, field: &str, limits: RaiseLimits) -> Result<RaiseBy, InvalidRaise> {
        let present = |v: &Option<serde_json::Value>| v.clone().filter(|v| !v.is_null());
        let (tokens, usd) = (present(&self.tokens), present(&self.usd));
        let name = |f: &str| {
            if field.is_empty() {
                f.to_owned()
            } else {
                format!("{field}.{f}")
            }
        };
        if tokens.is_none() && usd.is_none() {
            let whole = if field.is_empty() { "a raise" } else { field };
            return Err(InvalidRaise(format!(
                "{whole} needs `tokens` or `usd`: how much more may be spent"
            )));
        }
        let max_tokens = limits.max_tokens;
        let tokens = tokens
            .map(|v| {
                whole(&v)
                    .filter(|t| (1..=max_tokens).contains(t))
                    .ok_or_else(|| {
                        InvalidRaise(format!(
                            "{} must be a whole number from 1 to {max_tokens} \
                             (PES_MAX_BUDGET_RAISE_TOKENS), not {v}",
                            name("tokens")
                        ))
                    })
            })
            .transpose()?;
        let max_usd = limits.max_usd;
        let usd = usd
            .map(|v| {
                v.as_f64()
                    .filter(|u| u.is_finite() && *u > 0.0 && *u <= max_usd)
                    .ok_or_else(|| {
                        InvalidRaise(format!(
                            "{} must be a number above 0 and at most {max_usd} \
                             (PES_MAX_BUDGET_RAISE_USD), not {v}",
                            name("usd")
                        ))
                    })
            })
            .transpose()?;
        Ok(RaiseBy { tokens, usd })
    }
}

/// A JSON number that is a whole, non-negative number a `u64` holds exactly.
fn whole(v: &serde_json::Value) -> Option<u64> {
    let n = v.as_number()?;
    if let Some(u) = n.as_u64() {
        return Some(u);
    }
    let f = n.as_f64()?;
    // Below 2^53 every whole float is exact; above it a float names no one integer.
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f < 9_007_199_254_740_992.0)
        .then_some(f as u64)
}

/// Add two dollar amounts without ever making infinity or NaN (a sum past `f64::MAX` stays at
/// it; a NaN operand counts as nothing).
pub fn add_usd(a: f64, b: f64) -> f64 {
    let clean = |v: f64| if v.is_nan() { 0.0 } else { v };
    let sum = clean(a) + clean(b);
    if sum.is_finite() {
        sum
    } else if sum > 0.0 {
        f64::MAX
    } else {
        f64::MIN
    }
}

/// One raise of a tenant's daily budget by the operator: it counts until the end of the UTC day
/// it was made in.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantRaise {
    pub raise_id: uuid::Uuid,
    /// Tokens added to the day's `maxTokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub tokens: Option<u64>,
    /// US dollars added to the day's `maxCostUsd`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub usd: Option<f64>,
    /// The suspension whose approval made it, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub suspension_id: Option<uuid::Uuid>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A tenant's day as the operator sees it (`GET /v1/admin/tenants/{tenant}/spend`): what its
/// runs spent since UTC midnight, its daily budget, the operator's raises of the day, and the
/// limits in force (the budget plus the raises).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantSpend {
    pub tenant: String,
    /// The UTC day (`YYYY-MM-DD`).
    #[schema(value_type = String, format = Date)]
    pub day: chrono::NaiveDate,
    /// Tokens its runs created today used.
    pub spent_tokens: u64,
    /// US dollars its runs created today cost (priced by `PES_MODEL_PRICES`).
    pub spent_usd: f64,
    /// Its daily budget as configured (`PES_TENANT_BUDGETS`), without the raises; absent when
    /// it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub budget: Option<Budget>,
    /// The entry of `PES_TENANT_BUDGETS` the budget comes from: the tenant's name, or `*`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub budget_entry: Option<String>,
    /// The operator's raises of the day, oldest first.
    pub raises: Vec<TenantRaise>,
    /// Tokens the raises add today.
    pub raised_tokens: u64,
    /// US dollars the raises add today.
    pub raised_usd: f64,
    /// The token limit in force today (the budget's `maxTokens` plus the raises); absent: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub limit_tokens: Option<u64>,
    /// The dollar limit in force today (the budget's `maxCostUsd` plus the raises); absent: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub limit_usd: Option<f64>,
}

/// The start of the UTC day of `now`: a tenant's day (its spend, the operator's raises) runs
/// from it.
pub fn utc_midnight(now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    now.date_naive().and_time(chrono::NaiveTime::MIN).and_utc()
}

/// One tenant's day as the store has it: what its runs spent since UTC midnight, and what the
/// operator raised its daily budget by today.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TenantDay {
    /// Tokens its runs used.
    pub spent_tokens: u64,
    /// US dollars its runs cost.
    pub spent_usd: f64,
    /// Tokens the operator added to its daily limit today.
    pub raised_tokens: u64,
    /// US dollars the operator added to its daily limit today.
    pub raised_usd: f64,
}

/// The price of one model, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelPrice {
    pub input: f64,
    pub output: f64,
    /// Prompt tokens the provider served from its cache (priced as `input` when absent).
    #[serde(default)]
    pub cached_input: Option<f64>,
}

/// `PES_MODEL_PRICES`: model name → price; the entry `*` prices every other model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices(HashMap<String, ModelPrice>);

impl Prices {
    /// Read the JSON object of `PES_MODEL_PRICES` (empty text: no prices).
    ///
    /// # Errors
    /// What does not parse, or the model whose price is negative.
    pub fn parse(text: &str) -> Result<Self, PricesError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let map: HashMap<String, ModelPrice> =
            serde_json::from_str(text).map_err(PricesError::Json)?;
        for (model, p) in &map {
            let ok = |v: f64| v.is_finite() && v >= 0.0;
            if !ok(p.input) || !ok(p.output) || !p.cached_input.is_none_or(ok) {
                return Err(PricesError::Negative(model.clone()));
            }
        }
        Ok(Self(map))
    }

    /// Whether any model has a price.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every model has a price (there is a `*` price).
    pub fn prices_every_model(&self) -> bool {
        self.0.contains_key("*")
    }

    /// Whether `model` has a price (its own, or `*`'s): a dollar limit can cap it.
    pub fn prices(&self, model: &str) -> bool {
        self.of(Some(model)).is_some()
    }

    /// The models with a price of their own.
    pub fn named(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str).filter(|m| *m != "*")
    }

    /// The price of `model` (its own, else `*`'s).
    pub fn of(&self, model: Option<&str>) -> Option<ModelPrice> {
        model
            .and_then(|m| self.0.get(m))
            .or_else(|| self.0.get("*"))
            .copied()
    }

    /// What `usage` cost on `model`, in US dollars (0 for a model without a price).
    pub fn cost(&self, model: Option<&str>, usage: &Usage) -> f64 {
        let Some(p) = self.of(model) else {
            return 0.0;
        };
        let cached = usage.cached_prompt_tokens.min(usage.prompt_tokens);
        let fresh = usage.prompt_tokens - cached;
        (fresh as f64 * p.input
            + cached as f64 * p.cached_input.unwrap_or(p.input)
            + usage.completion_tokens as f64 * p.output)
            / 1_000_000.0
    }

    /// What `tokens` of prompt would cost on `model` (the estimate of a call not yet made).
    pub fn prompt_cost(&self, model: Option<&str>, tokens: u64) -> f64 {
        self.of(model)
            .map_or(0.0, |p| tokens as f64 * p.input / 1_000_000.0)
    }
}

/// `PES_ALLOWED_MODELS`: the models a thread, run or assistant config may name. A tenant names
/// models on the operator's provider keys, so by default it may name only the models the
/// operator configured (each provider's model) and those it priced in `PES_MODEL_PRICES`; `*`
/// allows any.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllowedModels(Option<std::collections::BTreeSet<String>>);

impl AllowedModels {
    /// Any model may be named.
    pub fn any() -> Self {
        Self(None)
    }

    /// The allowed models: `setting` (comma-separated; `*` for any) when given, else the
    /// `configured` models and the models `prices` names.
    pub fn new<'a>(
        setting: Option<&str>,
        configured: impl IntoIterator<Item = &'a str>,
        prices: &Prices,
    ) -> Self {
        let listed: Vec<&str> = setting
            .into_iter()
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .collect();
        if listed.contains(&"*") {
            return Self::any();
        }
        let names: std::collections::BTreeSet<String> = if listed.is_empty() {
            configured
                .into_iter()
                .map(str::to_owned)
                .chain(prices.named().map(str::to_owned))
                .collect()
        } else {
            listed.into_iter().map(str::to_owned).collect()
        };
        Self(Some(names))
    }

    /// Whether a config may name `model`.
    pub fn allows(&self, model: &str) -> bool {
        self.0.as_ref().is_none_or(|names| names.contains(model))
    }

    /// The allowed models, sorted (`*` when any is).
    pub fn describe(&self) -> String {
        match &self.0 {
            None => "*".into(),
            Some(names) => names.iter().cloned().collect::<Vec<_>>().join(", "),
        }
    }

    /// Whether some model a run may use has no price: any model may be named and not every one
    /// is priced, or an allowed one (or a provider's default, in `defaults`) has none.
    pub fn unpriced_possible<'a>(
        &self,
        prices: &Prices,
        defaults: impl IntoIterator<Item = &'a str>,
    ) -> bool {
        if prices.prices_every_model() {
            return false;
        }
        match &self.0 {
            None => true,
            Some(names) => {
                names.iter().any(|m| !prices.prices(m))
                    || defaults.into_iter().any(|m| !prices.prices(m))
            }
        }
    }
}

/// `PES_TENANT_BUDGETS`: what each tenant may spend on its models per UTC day (tenant → budget;
/// the entry `*` applies to every tenant not named, and a named entry without limits exempts its
/// tenant from `*`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantBudgets(HashMap<String, Budget>);

impl TenantBudgets {
    /// Read the JSON object of `PES_TENANT_BUDGETS` (empty text: no tenant has a daily budget).
    ///
    /// # Errors
    /// What does not parse, or the tenant's budget field that is out of range.
    pub fn parse(text: &str) -> Result<Self, TenantBudgetsError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let map: HashMap<String, Budget> =
            serde_json::from_str(text).map_err(TenantBudgetsError::Json)?;
        for (tenant, b) in &map {
            b.validate(&format!("PES_TENANT_BUDGETS[\"{tenant}\"]"))?;
        }
        Ok(Self(map))
    }

    /// Whether any tenant has a daily budget.
    pub fn is_empty(&self) -> bool {
        !self.0.values().any(Budget::is_set)
    }

    /// The daily budget of `tenant` (its own entry, else `*`'s), if it caps anything.
    pub fn of(&self, tenant: &str) -> Option<&Budget> {
        self.entry_of(tenant).map(|(_, b)| b)
    }

    /// The entry that gives `tenant` its daily budget (its own name, or `*`) with that budget,
    /// if it caps anything.
    pub fn entry_of(&self, tenant: &str) -> Option<(&str, &Budget)> {
        self.0
            .get_key_value(tenant)
            .or_else(|| self.0.get_key_value("*"))
            .filter(|(_, b)| b.is_set())
            .map(|(k, b)| (k.as_str(), b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_models_default_to_the_configured_and_priced_ones() {
        let prices = Prices::parse(r#"{"gpt-a": {"input": 1, "output": 2}}"#).unwrap();
        let by_default = AllowedModels::new(None, ["default-model"], &prices);
        assert!(by_default.allows("gpt-a") && by_default.allows("default-model"));
        assert!(!by_default.allows("anything-else"));
        assert_eq!(by_default.describe(), "default-model, gpt-a");
        assert!(
            by_default.unpriced_possible(&prices, ["default-model"]),
            "the configured model has no price"
        );
        let listed = AllowedModels::new(Some(" gpt-a , ,"), ["default-model"], &prices);
        assert!(
            !listed.allows("default-model"),
            "a list replaces the default"
        );
        assert!(!listed.unpriced_possible(&prices, ["gpt-a"]));
        let any = AllowedModels::new(Some("gpt-a,*"), [], &prices);
        assert!(any.allows("whatever") && any.unpriced_possible(&prices, []));
        let star = Prices::parse(r#"{"*": {"input": 1, "output": 2}}"#).unwrap();
        assert!(
            !any.unpriced_possible(&star, ["x"]),
            "`*` prices every model"
        );
    }

    #[test]
    fn prices_parse_and_price_usage() {
        let p = Prices::parse(r#"{"m": {"input": 2, "output": 10, "cachedInput": 1}, "*": {"input": 1, "output": 1}}"#)
            .unwrap();
        let u = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 500_000,
            cached_prompt_tokens: 200_000,
            ..Usage::default()
        };
        assert!((p.cost(Some("m"), &u) - (1.6 + 0.2 + 5.0)).abs() < 1e-9);
        assert!((p.cost(Some("other"), &u) - 1.5).abs() < 1e-9);
        assert!(Prices::parse(r#"{"m": {"input": -1, "output": 0}}"#).is_err());
        assert!(Prices::parse("[]").is_err());
        assert!(Prices::parse("").unwrap().is_empty());
    }

    #[test]
    fn raises_are_whole_finite_and_bounded() {
        let limits = RaiseLimits::default();
        let raise = |v: serde_json::Value| {
            serde_json::from_value::<RaiseRequest>(v)
                .unwrap()
                .check("raiseBy", limits)
        };
        assert_eq!(
            raise(serde_json::json!({"tokens": 100, "usd": 2.5})).unwrap(),
            RaiseBy {
                tokens: Some(100),
                usd: Some(2.5)
            }
        );
        assert_eq!(
            raise(serde_json::json!({"tokens": 1e3})).unwrap().tokens,
            Some(1000)
        );
        assert_eq!(
            raise(serde_json::json!({"tokens": 10_000_000}))
                .unwrap()
                .tokens,
            Some(10_000_000)
        );
        for bad in [
            r#"{"tokens": 18446744073709551615}"#,
            r#"{"tokens": 18446744073709551616}"#,
            r#"{"tokens": 1e15, "usd": 1e300}"#,
            r#"{"tokens": 10000001}"#,
            r#"{"tokens": 0}"#,
            r#"{"tokens": -5}"#,
            r#"{"tokens": 1.5}"#,
            r#"{"tokens": "5"}"#,
            r#"{"usd": 1000.01}"#,
            r#"{"usd": 0}"#,
            r#"{"usd": -1}"#,
            r#"{"usd": "NaN"}"#,
            r#"{}"#,
            r#"{"tokens": null}"#,
        ] {
            let r: RaiseRequest = serde_json::from_str(bad).unwrap();
            assert!(r.check("raiseBy", limits).is_err(), "{bad} was taken");
        }
    }

    #[test]
    fn dollar_sums_stay_finite() {
        assert_eq!(add_usd(1.0, 2.0), 3.0);
        assert_eq!(add_usd(f64::MAX, f64::MAX), f64::MAX);
        assert_eq!(add_usd(f64::NAN, 1.0), 1.0);
        assert!(add_usd(f64::INFINITY, 1.0).is_finite());
    }

    #[test]
    fn tenant_budgets_parse_with_a_default() {
        let b = TenantBudgets::parse(
            r#"{"*": {"maxTokens": 1000}, "big": {"maxCostUsd": 5, "onExceed": "fail"}, "free": {}}"#,
        )
        .unwrap();
        assert_eq!(b.of("any").unwrap().max_tokens, Some(1000));
        assert_eq!(b.of("big").unwrap().on_exceed, Some(OnExceed::Fail));
        assert!(
            b.of("free").is_none(),
            "an entry without limits exempts its tenant"
        );
        assert!(TenantBudgets::parse("").unwrap().is_empty());
        assert!(TenantBudgets::parse(r#"{"*": {"maxTokens": 0}}"#).is_err());
        assert!(TenantBudgets::parse(r#"{"*": {"maxTokens": 5, "other": 1}}"#).is_err());
        assert!(TenantBudgets::parse(r#"{"*": 5}"#).is_err());
        assert!(TenantBudgets::parse(r#"{"a": {"onExceed": "pause"}}"#).is_err());
    }
}
