//! Crons: a schedule that posts a query, on a thread or on a new thread per tick.
//! This file owns the types and the pure rules: parsing a schedule in its time zone
//! ([`Schedule`], with the `croner` crate and `chrono-tz`), naming what is wrong with a bad one,
//! the tick times, and what a tick's run is keyed by.

use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::*;

string_enum! {
    /// What a cron does about ticks that passed while no replica ran (found later than
    /// `PES_CRON_MISSED_AFTER_SECONDS`).
    #[derive(Default)]
    OnMissed {
        /// One catch-up run, for the latest missed tick (never one per missed tick).
        #[default]
        RunOnce => "run_once",
        /// No run; the cron waits for its next tick.
        Skip => "skip",
    }
}

/// A cron as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cron {
    pub cron_id: Uuid,
    #[serde(skip)]
    pub tenant: String,
    /// The thread each tick posts to; null: each tick runs on a new thread
    /// (`cron:<cronId>:<tick as Unix seconds>`).
    pub thread_id: Option<ThreadId>,
    /// The assistant each tick's run uses (instead of the thread's).
    #[schema(value_type = Option<String>)]
    pub assistant_id: Option<AssistantId>,
    /// A 5-field cron expression (minute hour day-of-month month day-of-week).
    pub schedule: String,
    /// The IANA time zone the schedule is read in.
    pub timezone: String,
    /// The query each tick posts.
    pub query: String,
    /// Each tick's run overrides of its thread's config.
    pub config: AgentConfig,
    /// The strategy each tick's run is posted with (default `enqueue`).
    pub multitask_strategy: Option<MultitaskStrategy>,
    /// Disabled crons do not tick.
    pub enabled: bool,
    pub on_missed: OnMissed,
    /// The next tick (UTC).
    pub next_run_at: DateTime<Utc>,
    /// The tick the last run was made for; null before the first.
    pub last_tick_at: Option<DateTime<Utc>>,
    /// The run the last tick made.
    pub last_run_id: Option<Uuid>,
    /// The thread the last tick's run is on.
    pub last_thread_id: Option<ThreadId>,
    /// Why the last tick made no run (a deleted assistant, the tenant's quota); null when it
    /// made one.
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Cron {
    /// The idempotency key of the run a tick makes: `cron:<cronId>:<tick RFC 3339>`. Every replica
    /// that would run the tick asks for the same key, so the tick has one run.
    pub fn tick_key(&self, tick: DateTime<Utc>) -> String {
        format!(
            "cron:{}:{}",
            self.cron_id,
            tick.to_rfc3339_opts(SecondsFormat::Secs, true)
        )
    }

    /// The thread of a tick: the cron's, or one made for the tick (`cron:<cronId>:<unix>`, so a
    /// tick run again after a crash finds its thread and its run).
    pub fn tick_thread(&self, tick: DateTime<Utc>) -> ThreadId {
        self.thread_id.clone().unwrap_or_else(|| {
            ThreadId::from_stored(format!("cron:{}:{}", self.cron_id, tick.timestamp()))
        })
    }
}

/// The five fields, named as a schedule's errors name them.
const FIELDS: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];

/// A parsed schedule in its time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: croner::Cron,
    tz: Tz,
}

impl Schedule {
    /// Parse `expr` (5 fields; with `seconds`, also 6 with a leading seconds field) read in
    /// `timezone` (an IANA name).
    ///
    /// # Errors
    /// What is wrong: the number of fields, the field that does not parse (by its name and
    /// text, with the parser's error), or the time zone.
    pub fn try_new(expr: &str, timezone: &str, seconds: bool) -> Result<Self, ScheduleError> {
        let tz =
            Tz::from_str(timezone).map_err(|_| ScheduleError::Timezone(timezone.to_owned()))?;
        let parser = CronParser::builder()
            .seconds(if seconds {
                Seconds::Optional
            } else {
                Seconds::Disallowed
            })
            .year(Year::Disallowed)
            .build();
        let fields: Vec<&str> = expr.split_whitespace().collect();
        let nickname = fields.len() == 1 && fields[0].starts_with('@');
        let counts = if seconds { "5 or 6" } else { "5" };
        let counted = fields.len() == 5 || (seconds && fields.len() == 6);
        if !(nickname || counted) {
            return Err(ScheduleError::FieldCount {
                expr: expr.to_owned(),
                count: fields.len(),
                counts,
                seconds_note: if seconds {
                    ", optionally after a seconds field"
                } else {
                    ""
                },
            });
        }
        let cron = parser
            .parse(expr)
            .map_err(|e| bad_field(&parser, expr, &fields, nickname, e))?;
        // A pattern that never matches (February 30th) has no tick to run.
        if cron
            .find_next_occurrence(&Utc::now().with_timezone(&tz), false)
            .is_err()
        {
            return Err(ScheduleError::NeverMatches(expr.to_owned()));
        }
        Ok(Self { cron, tz })
    }

    /// The first tick strictly after `t`; `None` when there is none (a schedule checked by
    /// [`Schedule::try_new`] always has one).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), false)
            .ok()
            .map(|n| n.with_timezone(&Utc))
    }

    /// The latest tick at or before `t`.
    pub fn latest_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&t.with_timezone(&self.tz), true)
            .ok()
            .map(|n| n.with_timezone(&Utc))
    }
}

/// Why a schedule cannot be used. The text names what to fix (the API answers it).
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "timezone `{0}` is not an IANA time zone name (e.g. `UTC`, `Europe/Paris`, \
         `America/New_York`)"
    )]
    Timezone(String),
    #[error(
        "schedule `{expr}` has {count} fields; a cron expression has {counts} \
         (minute hour day-of-month month day-of-week{seconds_note})"
    )]
    FieldCount {
        expr: String,
        count: usize,
        counts: &'static str,
        seconds_note: &'static str,
    },
    /// One field does not parse (tried alone, the others `*`).
    #[error("schedule `{expr}`: the {name} field `{field}` is not valid ({source})")]
    Field {
        expr: String,
        name: &'static str,
        field: String,
        #[source]
        source: croner::errors::CronError,
    },
    #[error("schedule `{expr}` is not a valid cron expression ({source})")]
    Expression {
        expr: String,
        #[source]
        source: croner::errors::CronError,
    },
    #[error("schedule `{0}` never matches a date")]
    NeverMatches(String),
}

/// Name the field of `expr` that does not parse: each field is tried alone, the others `*`.
fn bad_field(
    parser: &CronParser,
    expr: &str,
    fields: &[&str],
    nickname: bool,
    e: croner::errors::CronError,
) -> ScheduleError {
    if !nickname {
        let names: Vec<&str> = if fields.len() == 6 {
            std::iter::once("second").chain(FIELDS).collect()
        } else {
            FIELDS.to_vec()
        };
        for (i, field) in fields.iter().enumerate() {
            let alone: Vec<&str> = (0..fields.len())
                .map(|j| if i == j { *field } else { "*" })
                .collect();
            if let Err(source) = parser.parse(&alone.join(" ")) {
                return ScheduleError::Field {
                    expr: expr.to_owned(),
                    name: names[i],
                    field: (*field).to_owned(),
                    source,
                };
            }
        }
    }
    ScheduleError::Expression {
        expr: expr.to_owned(),
        source: e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_schedule_ticks_in_its_time_zone() {
        let s = Schedule::try_new("0 9 * * *", "Asia/Tokyo", false).unwrap();
        assert_eq!(
            s.next_after(at("2026-03-01T12:00:00Z")),
            Some(at("2026-03-02T00:00:00Z"))
        );
        assert_eq!(
            s.latest_at_or_before(at("2026-03-02T00:00:00Z")),
            Some(at("2026-03-02T00:00:00Z"))
        );
        let every = Schedule::try_new("*/15 * * * *", "UTC", false).unwrap();
        assert_eq!(
            every.next_after(at("2026-03-01T12:00:00Z")),
            Some(at("2026-03-01T12:15:00Z"))
        );
    }

    #[test]
    fn a_bad_schedule_says_what_is_wrong() {
        let e = Schedule::try_new("61 * * * *", "UTC", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("minute field `61`"), "{e}");
        let e = Schedule::try_new("0 9 * * MON-XYZ", "UTC", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("day-of-week"), "{e}");
        let e = Schedule::try_new("0 9 * *", "UTC", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has 4 fields") && e.contains("5"), "{e}");
        let e = Schedule::try_new("* * * * * *", "UTC", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has 6 fields"), "{e}");
        let e = Schedule::try_new("0 9 * * *", "Mars/Base", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("timezone `Mars/Base`"), "{e}");
        let e = Schedule::try_new("0 0 30 2 *", "UTC", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("never matches"), "{e}");
    }

    #[test]
    fn seconds_only_when_allowed() {
        let s = Schedule::try_new("*/2 * * * * *", "UTC", true).unwrap();
        assert_eq!(
            s.next_after(at("2026-03-01T12:00:00Z")),
            Some(at("2026-03-01T12:00:02Z"))
        );
        let e = Schedule::try_new("70 * * * * *", "UTC", true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("second field `70`"), "{e}");
    }

    #[test]
    fn a_tick_has_one_key_and_one_thread() {
        let c = Cron {
            cron_id: Uuid::nil(),
            tenant: "t".into(),
            thread_id: None,
            assistant_id: None,
            schedule: "* * * * *".into(),
            timezone: "UTC".into(),
            query: "q".into(),
            config: AgentConfig::default(),
            multitask_strategy: None,
            enabled: true,
            on_missed: OnMissed::RunOnce,
            next_run_at: Utc::now(),
            last_tick_at: None,
            last_run_id: None,
            last_thread_id: None,
            last_error: None,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        };
        let tick = at("2026-03-01T12:00:00Z");
        assert_eq!(
            c.tick_key(tick),
            format!("cron:{}:2026-03-01T12:00:00Z", Uuid::nil())
        );
        let thread = c.tick_thread(tick);
        assert!(ThreadId::parse(thread.as_str()).is_ok(), "{thread}");
    }
}
