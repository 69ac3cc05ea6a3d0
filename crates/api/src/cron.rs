//! Five-field cron schedules (`minute hour day-of-month month day-of-week`), as a
//! PoolAutoscaler's `cronPolicies[].schedule` writes them, and their fire instants in a time
//! zone.
//!
//! # Syntax (Vixie cron)
//!
//! - Each field is a comma-separated list of items; an item is `*`, a value `a`, a range `a-b`
//!   (`a <= b`), each optionally followed by a step `/n` (`n >= 1`); `a/n` means `a-<max>/n`.
//! - Ranges: minute 0–59, hour 0–23, day of month 1–31, month 1–12 (or `JAN`–`DEC`), day of
//!   week 0–7 (or `SUN`–`SAT`; 0 and 7 are both Sunday). Names are case-insensitive and are
//!   values, so they may end a range (`MON-FRI`).
//! - When both day of month and day of week are restricted (neither field starts with `*`), a
//!   day matches if **either** matches; otherwise both must (the unrestricted one matches
//!   every day). `*/2` starts with `*`, so it counts as unrestricted, as in Vixie cron.
//! - The macros `@yearly`/`@annually` (`0 0 1 1 *`), `@monthly` (`0 0 1 * *`), `@weekly`
//!   (`0 0 * * 0`), `@daily`/`@midnight` (`0 0 * * *`) and `@hourly` (`0 * * * *`).
//! - Refused: six or seven fields (seconds, years), `@every`, `@reboot`, and `TZ=`/`CRON_TZ=`
//!   prefixes (the zone is a field of its own, `timeZone`).
//!
//! # Fire instants
//!
//! A schedule fires at the local wall-clock times it matches, in the given zone. A wall time
//! that a spring-forward skips never fires; a wall time a fall-back repeats fires once, at its
//! first occurrence. So within one zone the fire instants are the matching wall times in order,
//! which is what lets [`Schedule::latest_in`] and [`Schedule::next_after`] walk days instead of
//! minutes.

use std::fmt;
use std::ops::ControlFlow;
use std::str::FromStr;

use jiff::civil::{Date, DateTime};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Timestamp, ToSpan};

/// Why a schedule does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    /// Not five fields (and not a known macro).
    #[error("expected 5 fields (minute hour day-of-month month day-of-week), found {0}")]
    FieldCount(usize),
    /// An `@` form that is not one of the macros.
    #[error(
        "unknown macro {0:?}: use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly"
    )]
    UnknownMacro(String),
    /// A zone prefix; the zone belongs in `timeZone`.
    #[error("time zone prefixes are not accepted in the schedule: set timeZone instead")]
    ZonePrefix,
    /// A field whose text is not valid.
    #[error("invalid {field} field {text:?}: {reason}")]
    Field {
        /// The field's name.
        field: &'static str,
        /// The field's text.
        text: String,
        /// What is wrong.
        reason: String,
    },
}

/// How far back [`Schedule::walk_back`] looks: a catch-up after downtime considers fires of the
/// last year at most.
pub const MAX_LOOKBACK_DAYS: i64 = 366;

/// How far ahead [`Schedule::next_after`] looks: five years, so a leap-day schedule
/// (`0 0 29 2 *`) always finds its next fire; one that matches no day (`0 0 30 2 *`) has none.
pub const MAX_LOOKAHEAD_DAYS: i64 = 366 * 5;

/// The most a zone's offset changes at once, with room to spare: a walk starts this far
/// beyond its end so no wall time near it is missed.
const MAX_TRANSITION: SignedDuration = SignedDuration::from_hours(3);

/// A parsed schedule.
#[derive(Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u32,
    days_of_month: u32,
    months: u16,
    days_of_week: u8,
    day_of_month_star: bool,
    day_of_week_star: bool,
    text: String,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Schedule").field(&self.text).finish()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

struct FieldSpec {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: FieldSpec = FieldSpec { name: "minute", min: 0, max: 59, names: &[] };
const HOUR: FieldSpec = FieldSpec { name: "hour", min: 0, max: 23, names: &[] };
const DAY_OF_MONTH: FieldSpec = FieldSpec { name: "day-of-month", min: 1, max: 31, names: &[] };
const MONTH: FieldSpec = FieldSpec {
    name: "month",
    min: 1,
    max: 12,
    names: &["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
};
const DAY_OF_WEEK: FieldSpec = FieldSpec {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
};

impl FieldSpec {
    fn error(&self, text: &str, reason: impl Into<String>) -> CronError {
        CronError::Field { field: self.name, text: text.to_owned(), reason: reason.into() }
    }

    fn value(&self, field: &str, text: &str) -> Result<u32, CronError> {
        let upper = text.to_ascii_uppercase();
        if let Some(index) = self.names.iter().position(|n| *n == upper) {
            // Month names count from 1, weekday names from 0.
            return Ok(u32::try_from(index).unwrap_or(0) + self.min.min(1));
        }
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(self.error(field, format!("{text:?} is not a number")));
        }
        let value: u32 = text.parse().map_err(|_| self.error(field, "number out of range"))?;
        if value < self.min || value > self.max {
            return Err(self.error(field, format!("{value} is outside {}-{}", self.min, self.max)));
        }
        Ok(value)
    }

    /// The field's values as a bit set.
    fn parse(&self, field: &str) -> Result<u64, CronError> {
        let mut bits = 0u64;
        for item in field.split(',') {
            let (range, step) = match item.split_once('/') {
                Some((range, step)) => {
                    let step: u32 = step
                        .parse()
                        .ok()
                        .filter(|s| *s >= 1)
                        .ok_or_else(|| self.error(field, format!("invalid step {step:?}")))?;
                    (range, Some(step))
                }
                None => (item, None),
            };
            let (low, high) = if range == "*" {
                (self.min, self.max)
            } else if let Some((low, high)) = range.split_once('-') {
                let (low, high) = (self.value(field, low)?, self.value(field, high)?);
                if low > high {
                    return Err(self.error(field, format!("range {range} is backwards")));
                }
                (low, high)
            } else {
                let value = self.value(field, range)?;
                (value, if step.is_some() { self.max } else { value })
            };
            let mut value = low;
            while value <= high {
                bits |= 1u64 << value;
                value += step.unwrap_or(1);
            }
        }
        Ok(bits)
    }
}

impl FromStr for Schedule {
    type Err = CronError;

    fn from_str(text: &str) -> Result<Self, CronError> {
        Schedule::parse(text)
    }
}

impl Schedule {
    /// Parses a five-field schedule or a macro; see the [module documentation](self).
    ///
    /// # Errors
    ///
    /// [`CronError`] saying which field is wrong and why.
    pub fn parse(text: &str) -> Result<Schedule, CronError> {
        let trimmed = text.trim();
        let upper = trimmed.to_ascii_uppercase();
        if upper.starts_with("TZ=") || upper.starts_with("CRON_TZ=") {
            return Err(CronError::ZonePrefix);
        }
        let expanded = match trimmed {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => {
                return Err(CronError::UnknownMacro(other.to_owned()));
            }
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, day_of_month, month, day_of_week] = fields[..] else {
            return Err(CronError::FieldCount(fields.len()));
        };
        let mut days_of_week = DAY_OF_WEEK.parse(day_of_week)?;
        if days_of_week & (1 << 7) != 0 {
            days_of_week = (days_of_week | 1) & 0x7f;
        }
        // The casts keep the bits each field's range allows.
        Ok(Schedule {
            minutes: MINUTE.parse(minute)?,
            hours: u32::try_from(HOUR.parse(hour)?).unwrap_or(0),
            days_of_month: u32::try_from(DAY_OF_MONTH.parse(day_of_month)?).unwrap_or(0),
            months: u16::try_from(MONTH.parse(month)?).unwrap_or(0),
            days_of_week: u8::try_from(days_of_week).unwrap_or(0),
            day_of_month_star: day_of_month.starts_with('*'),
            day_of_week_star: day_of_week.starts_with('*'),
            text: trimmed.to_owned(),
        })
    }

    /// Whether the schedule fires on some time of `date`.
    pub fn matches_date(&self, date: Date) -> bool {
        let month = u32::try_from(date.month()).unwrap_or(0);
        if self.months & (1 << month) == 0 {
            return false;
        }
        let day = u32::try_from(date.day()).unwrap_or(0);
        let day_of_month = self.days_of_month & (1 << day) != 0;
        let weekday = date.weekday().to_sunday_zero_offset();
        let day_of_week = self.days_of_week & (1 << weekday) != 0;
        if self.day_of_month_star || self.day_of_week_star {
            day_of_month && day_of_week
        } else {
            day_of_month || day_of_week
        }
    }

    /// The wall times of `date` the schedule fires at, as (hour, minute), in order.
    fn times(&self) -> impl DoubleEndedIterator<Item = (i8, i8)> + '_ {
        (0..24i8).filter(|h| self.hours & (1 << h) != 0).flat_map(move |h| {
            (0..60i8).filter(move |m| self.minutes & (1 << m) != 0).map(move |m| (h, m))
        })
    }

    /// Calls `visit` with each fire instant `t` with `floor < t <= at`, latest first, until it
    /// breaks; walks back at most [`MAX_LOOKBACK_DAYS`].
    pub fn walk_back(
        &self,
        zone: &TimeZone,
        at: Timestamp,
        floor: Timestamp,
        mut visit: impl FnMut(Timestamp) -> ControlFlow<()>,
    ) {
        let start = local(zone, at.saturating_add(MAX_TRANSITION).unwrap_or(at)).date();
        let floor = floor.max(
            at.saturating_sub(SignedDuration::from_hours(24 * MAX_LOOKBACK_DAYS)).unwrap_or(floor),
        );
        let last = local(zone, floor.saturating_sub(MAX_TRANSITION).unwrap_or(floor)).date();
        let mut date = start;
        while date >= last {
            if self.matches_date(date) {
                for (hour, minute) in self.times().rev() {
                    let Some(instant) = fire_instant(zone, date.at(hour, minute, 0, 0)) else {
                        continue;
                    };
                    if instant <= floor {
                        return;
                    }
                    if instant <= at && visit(instant).is_break() {
                        return;
                    }
                }
            }
            match date.checked_sub(1.day()) {
                Ok(previous) => date = previous,
                Err(_) => return,
            }
        }
    }

    /// The latest fire instant `t` with `after < t <= at`, and how many earlier ones fall in
    /// that interval too (counted up to `count_limit`).
    pub fn latest_in(
        &self,
        zone: &TimeZone,
        after: Timestamp,
        at: Timestamp,
        count_limit: usize,
    ) -> Option<(Timestamp, usize)> {
        let mut latest = None;
        let mut earlier = 0;
        self.walk_back(zone, at, after, |instant| {
            if latest.is_none() {
                latest = Some(instant);
            } else {
                earlier += 1;
            }
            if earlier >= count_limit { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        });
        latest.map(|latest| (latest, earlier))
    }

    /// The first fire instant after `after`, within [`MAX_LOOKAHEAD_DAYS`].
    pub fn next_after(&self, zone: &TimeZone, after: Timestamp) -> Option<Timestamp> {
        let start = local(zone, after.saturating_sub(MAX_TRANSITION).unwrap_or(after)).date();
        let mut date = start;
        for _ in 0..=MAX_LOOKAHEAD_DAYS {
            if self.matches_date(date) {
                for (hour, minute) in self.times() {
                    match fire_instant(zone, date.at(hour, minute, 0, 0)) {
                        Some(instant) if instant > after => return Some(instant),
                        _ => {}
                    }
                }
            }
            date = date.checked_add(1.day()).ok()?;
        }
        None
    }
}

/// The wall-clock time of `at` in `zone`.
fn local(zone: &TimeZone, at: Timestamp) -> DateTime {
    zone.to_datetime(at)
}

/// The instant a wall time fires at: none in a spring-forward gap, the first occurrence in a
/// fall-back fold.
fn fire_instant(zone: &TimeZone, wall: DateTime) -> Option<Timestamp> {
    let ambiguous = zone.to_ambiguous_timestamp(wall);
    match ambiguous.offset() {
        AmbiguousOffset::Gap { .. } => None,
        AmbiguousOffset::Unambiguous { .. } | AmbiguousOffset::Fold { .. } => {
            ambiguous.earlier().ok()
        }
    }
}

#[cfg(test)]
mod tests;
