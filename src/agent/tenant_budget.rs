//! Per-tenant daily budgets (`PES_TENANT_BUDGETS`): what one tenant's runs may spend on their
//! models together in one UTC day, raised by what the operator granted that day
//! (`POST /v1/admin/tenants/{tenant}/budget-raises`: the raises are rows of the store, read with
//! the spend, so every replica's gauge sees them at its next read, and a run that goes on after
//! the operator's approval reads them before its first call).
//!
//! The day's spend is the store's: the sum of the committed `usage` of the tenant's runs created
//! since UTC midnight (a run counts on the day it was created), read with one index-bounded query
//! (`runs (tenant, created_at)`), so it holds across replicas and restarts and costs the commit
//! path nothing. Each process keeps the tenant's last read in a [`Gauge`] shared by its runs, plus
//! what its own runs spent since; the gauge is read again when it is older than [`FRESH_FOR`], and
//! every [`NEAR_FRESH_FOR`] once the spend is past 80 % of a limit; the run commits what it staged before
//! it reads, so its own spend is all in the read. The calls in flight of the tenant's runs here
//! hold their share of the day in the gauge ([`Gauge::try_reserve`]), as one run's parallel items
//! do in its meter. Another run's usage counted here but not yet committed when the store was
//! read is out of sight until the next read, and another replica's calls until they commit: so a
//! tenant passes its limit by at most the model calls in flight when it is reached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDate, Utc};

use crate::model::{Budget, OnExceed, TenantDay, add_usd};

/// How long a read of the tenant's spend is used while the spend is below 80 % of its limits.
pub(super) const FRESH_FOR: Duration = Duration::from_secs(1);

/// How long a read is used once the spend is past 80 %: even near the limit one process reads
/// at most ten times a second per tenant; its own runs' spend counts at once regardless.
pub(super) const NEAR_FRESH_FOR: Duration = Duration::from_millis(100);

/// A read is used at least this many times as long as it took: the read sums the usage of every
/// run the tenant made today (about 1.5 ms per thousand runs on Postgres), so a tenant with very
/// many runs a day is read less often, and the reads never take more than 2 % of the time.
const READ_COST_FACTOR: u32 = 50;

/// Share of a limit from which the store is read more often ([`NEAR_FRESH_FOR`]).
pub(super) const NEAR: f64 = 0.8;

/// The tenants' gauges of one process (one per tenant with a daily budget that ran here).
#[derive(Default)]
pub(super) struct Gauges(Mutex<HashMap<String, Arc<Gauge>>>);

impl Gauges {
    /// The gauge of `tenant` (made on first use).
    pub(super) fn of(&self, tenant: &str) -> Arc<Gauge> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(tenant.to_owned())
            .or_default()
            .clone()
    }
}

/// One tenant's spend today, as this process knows it.
#[derive(Default)]
pub(super) struct Gauge(Mutex<Reading>);

#[derive(Default)]
struct Reading {
    /// The UTC day the read is of.
    day: Option<NaiveDate>,
    /// When the store was last read.
    at: Option<Instant>,
    /// How long that read took.
    took: Duration,
    /// The committed spend the store had (tokens, dollars).
    stored: (u64, f64),
    /// What the operator raised the tenant's daily limits by that day (tokens, dollars).
    raised: (u64, f64),
    /// What this process's runs spent since that read.
    since: (u64, f64),
    /// What the calls of the tenant's runs in flight here may still spend (their reservations).
    held: (u64, f64),
}

/// The start of the UTC day of `now`.
pub(super) fn midnight(now: DateTime<Utc>) -> DateTime<Utc> {
    crate::model::utc_midnight(now)
}

impl Gauge {
    fn lock(&self) -> std::sync::MutexGuard<'_, Reading> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The tenant's spend today (tokens, dollars): the last read plus what was spent here since.
    pub(super) fn spent(&self) -> (u64, f64) {
        let r = self.lock();
        if r.day != Some(Utc::now().date_naive()) {
            // A new day (or never read): only what was spent here since counts until the read.
            return r.since;
        }
        (
            r.stored.0.saturating_add(r.since.0),
            add_usd(r.stored.1, r.since.1),
        )
    }

    /// What the operator raised the tenant's daily limits by today, as last read (tokens,
    /// dollars).
    pub(super) fn raised(&self) -> (u64, f64) {
        let r = self.lock();
        if r.day != Some(Utc::now().date_naive()) {
            return (0, 0.0);
        }
        r.raised
    }

    /// A model call of one of the tenant's runs used this.
    pub(super) fn add(&self, tokens: u64, usd: f64) {
        let mut r = self.lock();
        r.since.0 = r.since.0.saturating_add(tokens);
        r.since.1 = add_usd(r.since.1, usd);
    }

    /// Read the store again before the next check, however fresh the last read: a run going on
    /// after the operator raised the day must see that raise at its first call.
    pub(super) fn expire(&self) {
        self.lock().at = None;
    }

    /// Whether the store must be read before the next check: never read, another day, or
    /// older than [`FRESH_FOR`] ([`NEAR_FRESH_FOR`] when `near` the limit), and than
    /// [`READ_COST_FACTOR`] times the last read's duration.
    pub(super) fn stale(&self, near: bool) -> bool {
        let r = self.lock();
        let fresh_for = if near { NEAR_FRESH_FOR } else { FRESH_FOR };
        let fresh_for = fresh_for.max(r.took.saturating_mul(READ_COST_FACTOR));
        r.day != Some(Utc::now().date_naive()) || r.at.is_none_or(|at| at.elapsed() >= fresh_for)
    }

    /// What the store says the tenant spent on `day`, and the operator's raises of that day.
    pub(super) fn set(&self, day: NaiveDate, at: Instant, read: TenantDay) {
        let mut r = self.lock();
        *r = Reading {
            day: Some(day),
            at: Some(at),
            took: at.elapsed(),
            stored: (read.spent_tokens, read.spent_usd),
            raised: (read.raised_tokens, read.raised_usd),
            since: (0, 0.0),
            held: r.held,
        };
    }

    /// Reserve `hold` for a call of one of the tenant's runs, unless what the tenant spent, what
    /// the calls in flight here hold, and the call's `need` pass `limits`; whether it did. So
    /// the parallel calls of all the tenant's runs in this process share its day as the items of
    /// one run share the run's budget.
    pub(super) fn try_reserve(
        &self,
        limits: (Option<u64>, Option<f64>),
        need: (u64, f64),
        hold: (u64, f64),
    ) -> bool {
        let (spent_tokens, spent_usd) = self.spent();
        let mut r = self.lock();
        let over = limits
            .0
            .is_some_and(|l| spent_tokens.saturating_add(r.held.0).saturating_add(need.0) > l)
            || limits
                .1
                .is_some_and(|l| add_usd(add_usd(spent_usd, r.held.1), need.1) > l);
        if !over {
            r.held.0 = r.held.0.saturating_add(hold.0);
            r.held.1 = add_usd(r.held.1, hold.1);
        }
        !over
    }

    /// A reserved call ended: its hold goes back.
    pub(super) fn unreserve(&self, hold: (u64, f64)) {
        let mut r = self.lock();
        r.held.0 = r.held.0.saturating_sub(hold.0);
        r.held.1 = (r.held.1 - hold.1).max(0.0);
    }
}

/// A run's view of its tenant's daily budget.
pub(super) struct TenantLimit {
    pub(super) gauge: Arc<Gauge>,
    pub(super) max_tokens: Option<u64>,
    pub(super) max_usd: Option<f64>,
    pub(super) on_exceed: OnExceed,
}

impl TenantLimit {
    pub(super) fn new(budget: &Budget, gauge: Arc<Gauge>) -> Self {
        Self {
            gauge,
            max_tokens: budget.max_tokens,
            max_usd: budget.max_cost_usd,
            on_exceed: budget.on_exceed.unwrap_or_default(),
        }
    }

    /// The tenant's daily limits, raised by what the operator granted today.
    pub(super) fn limits(&self) -> (Option<u64>, Option<f64>) {
        let raised = self.gauge.raised();
        (
            self.max_tokens.map(|l| l.saturating_add(raised.0)),
            self.max_usd.map(|l| add_usd(l, raised.1)),
        )
    }

    /// The larger share of its limits (as raised today) that the tenant spent.
    pub(super) fn share(&self) -> f64 {
        let (t, u) = self.gauge.spent();
        let (lt, lu) = self.limits();
        let st = lt.map_or(0.0, |l| t as f64 / l.max(1) as f64);
        let su = lu.map_or(0.0, |l| if l > 0.0 { u / l } else { 1.0 });
        st.max(su)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(tokens: u64, usd: f64) -> TenantDay {
        TenantDay {
            spent_tokens: tokens,
            spent_usd: usd,
            ..TenantDay::default()
        }
    }

    #[test]
    fn the_operators_raises_lift_the_limits_and_an_expired_gauge_is_read_again() {
        let g = Arc::new(Gauge::default());
        let limit = TenantLimit::new(
            &Budget {
                max_tokens: Some(1000),
                max_cost_usd: Some(1.0),
                on_exceed: None,
            },
            g.clone(),
        );
        g.set(Utc::now().date_naive(), Instant::now(), day(900, 0.0));
        assert_eq!(limit.limits(), (Some(1000), Some(1.0)));
        assert!((limit.share() - 0.9).abs() < 1e-9);
        g.set(
            Utc::now().date_naive(),
            Instant::now(),
            TenantDay {
                spent_tokens: 900,
                raised_tokens: u64::MAX,
                raised_usd: f64::MAX,
                ..TenantDay::default()
            },
        );
        assert_eq!(limit.limits(), (Some(u64::MAX), Some(f64::MAX)));
        assert!(!g.stale(false));
        g.expire();
        assert!(g.stale(false));
        let yesterday = Utc::now().date_naive().pred_opt().unwrap();
        g.set(
            yesterday,
            Instant::now(),
            TenantDay {
                raised_tokens: 5,
                ..TenantDay::default()
            },
        );
        assert_eq!(g.raised(), (0, 0.0), "yesterday's raises are not today's");
    }

    #[test]
    fn a_gauge_adds_what_was_spent_since_its_read() {
        let g = Gauge::default();
        g.add(10, 0.5);
        assert_eq!(g.spent(), (10, 0.5), "unread: only what was spent here");
        assert!(g.stale(false));
        g.set(Utc::now().date_naive(), Instant::now(), day(100, 1.0));
        assert!(!g.stale(false));
        assert!(!g.stale(true));
        std::thread::sleep(NEAR_FRESH_FOR);
        assert!(g.stale(true), "near the limit the store is read more often");
        assert!(!g.stale(false));
        g.add(5, 0.25);
        assert_eq!(g.spent(), (105, 1.25));
        let yesterday = Utc::now().date_naive().pred_opt().unwrap();
        g.set(yesterday, Instant::now(), day(100, 1.0));
        assert_eq!(g.spent(), (0, 0.0), "yesterday's spend is not today's");
        assert!(g.stale(false));
    }

    #[test]
    fn reservations_of_calls_in_flight_count_until_they_end() {
        let g = Gauge::default();
        g.set(Utc::now().date_naive(), Instant::now(), day(6000, 0.0));
        let limits = (Some(9000), None);
        assert!(g.try_reserve(limits, (100, 0.0), (1500, 0.0)));
        assert!(g.try_reserve(limits, (100, 0.0), (1500, 0.0)));
        assert!(
            !g.try_reserve(limits, (100, 0.0), (1500, 0.0)),
            "6,000 spent and 3,000 held: nothing more fits"
        );
        g.set(Utc::now().date_naive(), Instant::now(), day(6000, 0.0));
        assert!(
            !g.try_reserve(limits, (100, 0.0), (1500, 0.0)),
            "a read keeps the holds"
        );
        g.unreserve((1500, 0.0));
        assert!(g.try_reserve(limits, (100, 0.0), (1500, 0.0)));
    }

    #[test]
    fn midnight_is_the_start_of_the_utc_day() {
        let t = DateTime::parse_from_rfc3339("2026-03-04T17:05:06.7Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(midnight(t).to_rfc3339(), "2026-03-04T00:00:00+00:00");
    }
}
