//! Tests of the cron parser and of fire instants across zones and DST transitions.

use std::ops::ControlFlow;

use jiff::Timestamp;
use jiff::tz::TimeZone;

use super::*;

fn ts(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn zone(name: &str) -> TimeZone {
    TimeZone::get(name).unwrap()
}

/// Every fire of `schedule` in `(after, at]` in `zone`, latest first.
fn fires(schedule: &str, zone: &TimeZone, after: &str, at: &str) -> Vec<String> {
    let schedule = Schedule::parse(schedule).unwrap();
    let mut out = Vec::new();
    schedule.walk_back(zone, ts(at), ts(after), |t| {
        out.push(t.to_string());
        ControlFlow::Continue(())
    });
    out
}

#[test]
fn fields_parse_to_their_values() {
    let cases: &[(&str, &str, bool)] = &[
        // (schedule, a wall time in UTC, whether it fires then)
        ("0 8 * * *", "2026-01-05T08:00:00Z", true),
        ("0 8 * * *", "2026-01-05T08:01:00Z", false),
        ("*/15 * * * *", "2026-01-05T10:45:00Z", true),
        ("*/15 * * * *", "2026-01-05T10:50:00Z", false),
        ("5/20 * * * *", "2026-01-05T10:45:00Z", true),
        ("5/20 * * * *", "2026-01-05T10:05:00Z", true),
        ("5/20 * * * *", "2026-01-05T10:15:00Z", false),
        ("0-10/5,30 9-17 * * *", "2026-01-05T17:30:00Z", true),
        ("0-10/5,30 9-17 * * *", "2026-01-05T18:00:00Z", false),
        ("0 0 1 jan *", "2026-01-01T00:00:00Z", true),
        ("0 0 1 FEB-mar *", "2026-03-01T00:00:00Z", true),
        ("0 0 1 FEB-mar *", "2026-01-01T00:00:00Z", false),
        // 2026-01-04 is a Sunday, 2026-01-05 a Monday.
        ("0 0 * * 7", "2026-01-04T00:00:00Z", true),
        ("0 0 * * 0", "2026-01-04T00:00:00Z", true),
        ("0 0 * * SUN", "2026-01-04T00:00:00Z", true),
        ("0 0 * * mon-FRI", "2026-01-04T00:00:00Z", false),
        ("0 0 * * mon-FRI", "2026-01-05T00:00:00Z", true),
        ("0 0 * * 5-7", "2026-01-04T00:00:00Z", true),
        // Both day fields restricted: either matches (the 13th, or a Friday).
        ("0 0 13 * 5", "2026-01-13T00:00:00Z", true),
        ("0 0 13 * 5", "2026-01-09T00:00:00Z", true),
        ("0 0 13 * 5", "2026-01-10T00:00:00Z", false),
        // One day field starts with `*`: both must match.
        ("0 0 */2 * 1", "2026-01-05T00:00:00Z", true),
        ("0 0 */2 * 1", "2026-01-12T00:00:00Z", false),
        ("0 0 */2 * 1", "2026-01-07T00:00:00Z", false),
        ("0 0 13 * *", "2026-01-09T00:00:00Z", false),
        ("@yearly", "2026-01-01T00:00:00Z", true),
        ("@annually", "2026-02-01T00:00:00Z", false),
        ("@monthly", "2026-02-01T00:00:00Z", true),
        ("@weekly", "2026-01-04T00:00:00Z", true),
        ("@weekly", "2026-01-05T00:00:00Z", false),
        ("@daily", "2026-01-05T00:00:00Z", true),
        ("@midnight", "2026-01-05T00:01:00Z", false),
        ("@hourly", "2026-01-05T13:00:00Z", true),
        ("  0   8 * *   *  ", "2026-01-05T08:00:00Z", true),
    ];
    for (text, at, fires_then) in cases {
        let schedule = Schedule::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let at = ts(at);
        let minute_before = at.checked_sub(jiff::SignedDuration::from_secs(60)).unwrap();
        let got = schedule.latest_in(&TimeZone::UTC, minute_before, at, 0).map(|(t, _)| t);
        assert_eq!(got == Some(at), *fires_then, "{text} at {at}");
    }
}

#[test]
fn invalid_schedules_are_refused_with_the_field_at_fault() {
    let cases: &[(&str, &str)] = &[
        ("0 8 * *", "expected 5 fields (minute hour day-of-month month day-of-week), found 4"),
        ("0 0 8 * * *", "expected 5 fields (minute hour day-of-month month day-of-week), found 6"),
        (
            "0 0 8 * * * 2026",
            "expected 5 fields (minute hour day-of-month month day-of-week), found 7",
        ),
        ("", "expected 5 fields (minute hour day-of-month month day-of-week), found 0"),
        (
            "@every 5m",
            "unknown macro \"@every 5m\": use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly",
        ),
        (
            "@reboot",
            "unknown macro \"@reboot\": use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly",
        ),
        (
            "TZ=UTC 0 8 * * *",
            "time zone prefixes are not accepted in the schedule: set timeZone instead",
        ),
        (
            "CRON_TZ=Asia/Shanghai 0 8 * * *",
            "time zone prefixes are not accepted in the schedule: set timeZone instead",
        ),
        ("60 * * * *", "invalid minute field \"60\": 60 is outside 0-59"),
        ("* 24 * * *", "invalid hour field \"24\": 24 is outside 0-23"),
        ("* * 0 * *", "invalid day-of-month field \"0\": 0 is outside 1-31"),
        ("* * * 13 *", "invalid month field \"13\": 13 is outside 1-12"),
        ("* * * * 8", "invalid day-of-week field \"8\": 8 is outside 0-7"),
        ("* * * * MON-", "invalid day-of-week field \"MON-\": \"\" is not a number"),
        ("5-1 * * * *", "invalid minute field \"5-1\": range 5-1 is backwards"),
        ("*/0 * * * *", "invalid minute field \"*/0\": invalid step \"0\""),
        ("*/x * * * *", "invalid minute field \"*/x\": invalid step \"x\""),
        ("? * * * *", "invalid minute field \"?\": \"?\" is not a number"),
        ("1,,2 * * * *", "invalid minute field \"1,,2\": \"\" is not a number"),
        ("* * * JANUARY *", "invalid month field \"JANUARY\": \"JANUARY\" is not a number"),
        ("-1 * * * *", "invalid minute field \"-1\": \"\" is not a number"),
    ];
    for (text, message) in cases {
        let error = Schedule::parse(text).unwrap_err();
        assert_eq!(error.to_string(), *message, "{text}");
    }
}

#[test]
fn fires_follow_the_zone() {
    // 08:00 in Shanghai (UTC+8) is midnight UTC.
    assert_eq!(
        fires("0 8 * * *", &zone("Asia/Shanghai"), "2026-01-04T12:00:00Z", "2026-01-06T12:00:00Z"),
        ["2026-01-06T00:00:00Z", "2026-01-05T00:00:00Z"]
    );
    // A day boundary that differs between the zone and UTC: Monday 06:00 in Shanghai is
    // Sunday 22:00 UTC.
    assert_eq!(
        fires("0 6 * * 1", &zone("Asia/Shanghai"), "2026-01-03T00:00:00Z", "2026-01-05T00:00:00Z"),
        ["2026-01-04T22:00:00Z"]
    );
}

#[test]
fn a_wall_time_skipped_by_spring_forward_never_fires() {
    // New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT.
    let ny = zone("America/New_York");
    assert_eq!(
        fires("30 2 * * *", &ny, "2026-03-07T00:00:00Z", "2026-03-09T12:00:00Z"),
        ["2026-03-09T06:30:00Z", "2026-03-07T07:30:00Z"]
    );
    let schedule = Schedule::parse("30 2 8 3 *").unwrap();
    assert_eq!(
        schedule.next_after(&ny, ts("2026-03-01T00:00:00Z")),
        Some(ts("2027-03-08T07:30:00Z")),
        "the only match of 2026 falls in the gap (2027-03-08 is still EST)"
    );
}

#[test]
fn a_wall_time_repeated_by_fall_back_fires_once_at_its_first_occurrence() {
    // New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice.
    let ny = zone("America/New_York");
    assert_eq!(
        fires("30 1 * * *", &ny, "2026-10-31T12:00:00Z", "2026-11-01T12:00:00Z"),
        ["2026-11-01T05:30:00Z"]
    );
    // Every half hour across the fold: 00:30 EDT, 01:00 EDT, 01:30 EDT, then (the repeated
    // 01:00 and 01:30 skipped) 02:00 EST.
    assert_eq!(
        fires("0,30 0-2 1 11 *", &ny, "2026-11-01T04:00:00Z", "2026-11-01T08:00:00Z"),
        [
            "2026-11-01T07:30:00Z",
            "2026-11-01T07:00:00Z",
            "2026-11-01T05:30:00Z",
            "2026-11-01T05:00:00Z",
            "2026-11-01T04:30:00Z",
        ]
    );
    let schedule = Schedule::parse("0,30 0-2 1 11 *").unwrap();
    assert_eq!(
        schedule.next_after(&ny, ts("2026-11-01T05:30:00Z")),
        Some(ts("2026-11-01T07:00:00Z"))
    );
}

#[test]
fn the_latest_fire_and_the_count_of_earlier_ones() {
    let schedule = Schedule::parse("0 * * * *").unwrap();
    let got = schedule.latest_in(
        &TimeZone::UTC,
        ts("2026-01-05T00:00:00Z"),
        ts("2026-01-05T05:30:00Z"),
        100,
    );
    assert_eq!(got, Some((ts("2026-01-05T05:00:00Z"), 4)), "01:00 to 04:00 are the earlier ones");
    let capped = schedule.latest_in(
        &TimeZone::UTC,
        ts("2026-01-05T00:00:00Z"),
        ts("2026-01-05T05:30:00Z"),
        2,
    );
    assert_eq!(capped, Some((ts("2026-01-05T05:00:00Z"), 2)));
    // The interval is open at `after` and closed at `at`.
    let at_edge = schedule.latest_in(
        &TimeZone::UTC,
        ts("2026-01-05T05:00:00Z"),
        ts("2026-01-05T06:00:00Z"),
        10,
    );
    assert_eq!(at_edge, Some((ts("2026-01-05T06:00:00Z"), 0)));
    assert_eq!(
        schedule.latest_in(
            &TimeZone::UTC,
            ts("2026-01-05T05:00:00Z"),
            ts("2026-01-05T05:59:59Z"),
            10
        ),
        None
    );
}

#[test]
fn lookback_stops_after_a_year() {
    let schedule = Schedule::parse("0 0 1 1 *").unwrap();
    let far = ts("2020-01-01T00:00:00Z");
    assert_eq!(
        schedule.latest_in(&TimeZone::UTC, far, ts("2026-06-01T00:00:00Z"), 100),
        Some((ts("2026-01-01T00:00:00Z"), 0)),
        "fires before the last year are not counted"
    );
    let never = Schedule::parse("0 0 30 2 *").unwrap();
    assert_eq!(never.latest_in(&TimeZone::UTC, far, ts("2026-06-01T00:00:00Z"), 100), None);
    assert_eq!(never.next_after(&TimeZone::UTC, far), None);
}

#[test]
fn next_fire_after_an_instant() {
    let utc = TimeZone::UTC;
    let cases: &[(&str, &str, &str)] = &[
        ("0 8 * * *", "2026-01-05T07:59:59Z", "2026-01-05T08:00:00Z"),
        ("0 8 * * *", "2026-01-05T08:00:00Z", "2026-01-06T08:00:00Z"),
        ("*/5 * * * *", "2026-01-05T08:02:00Z", "2026-01-05T08:05:00Z"),
        ("0 0 29 2 *", "2026-01-01T00:00:00Z", "2028-02-29T00:00:00Z"),
        ("0 0 31 * *", "2026-04-01T00:00:00Z", "2026-05-31T00:00:00Z"),
        ("59 23 31 12 *", "2026-12-31T23:59:00Z", "2027-12-31T23:59:00Z"),
    ];
    for (text, after, expected) in cases {
        let schedule = Schedule::parse(text).unwrap();
        assert_eq!(
            schedule.next_after(&utc, ts(after)),
            Some(ts(expected)),
            "{text} after {after}"
        );
    }
}

/// One field of a random schedule: `*`, a value, a range, a step, or a list of them.
fn field(min: u32, max: u32) -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let item = prop_oneof![
        Just("*".to_owned()),
        (min..=max).prop_map(|v| v.to_string()),
        (min..=max, min..=max).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
        (1..=max.max(1)).prop_map(|s| format!("*/{s}")),
        (min..=max, 1..=max.max(1)).prop_map(|(a, s)| format!("{a}/{s}")),
    ];
    proptest::collection::vec(item, 1..3).prop_map(|items| items.join(","))
}

/// Whether the wall time `dt` matches `fields` by the rules of the module, checked the slow
/// way: each field's text expanded to its set of values.
fn brute_matches(fields: &[String; 5], dt: jiff::civil::DateTime) -> bool {
    fn values(text: &str, min: u32, max: u32) -> Vec<u32> {
        let mut out = Vec::new();
        for item in text.split(',') {
            let (range, step) = match item.split_once('/') {
                Some((r, s)) => (r, s.parse::<u32>().unwrap()),
                None => (item, 1),
            };
            let (low, high) = if range == "*" {
                (min, max)
            } else if let Some((a, b)) = range.split_once('-') {
                (a.parse().unwrap(), b.parse().unwrap())
            } else {
                let a: u32 = range.parse().unwrap();
                (a, if item.contains('/') { max } else { a })
            };
            out.extend((low..=high).step_by(step as usize));
        }
        out
    }
    let has = |text: &str, min, max, v: i64| values(text, min, max).contains(&(v as u32));
    let weekday = i64::from(dt.weekday().to_sunday_zero_offset());
    let dow = has(&fields[4], 0, 7, weekday) || (weekday == 0 && has(&fields[4], 0, 7, 7));
    let dom = has(&fields[2], 1, 31, i64::from(dt.day()));
    let day = if fields[2].starts_with('*') || fields[4].starts_with('*') {
        dom && dow
    } else {
        dom || dow
    };
    has(&fields[0], 0, 59, i64::from(dt.minute()))
        && has(&fields[1], 0, 23, i64::from(dt.hour()))
        && has(&fields[3], 1, 12, i64::from(dt.month()))
        && day
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// The fires found by walking days equal those found by checking every minute of three
    /// days around a DST transition, each wall time once (its first occurrence), none in a gap.
    #[test]
    fn fires_equal_a_minute_by_minute_check(
        minute in field(0, 59),
        hour in field(0, 23),
        day_of_month in field(1, 31),
        month in proptest::prelude::Just("*".to_owned()),
        day_of_week in field(0, 7),
        zone_name in proptest::sample::select(vec!["UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"]),
        start in proptest::sample::select(vec!["2026-03-07T00:00:00Z", "2026-10-31T12:00:00Z", "2026-04-04T00:00:00Z"]),
    ) {
        let fields = [minute, hour, day_of_month, month, day_of_week];
        let text = fields.join(" ");
        let schedule = Schedule::parse(&text).unwrap();
        let zone = zone(zone_name);
        let from = ts(start);
        let to = from.checked_add(jiff::SignedDuration::from_hours(72)).unwrap();
        let mut expected = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut t = from.checked_add(jiff::SignedDuration::from_secs(60)).unwrap();
        // Australia/Lord_Howe shifts by 30 minutes: every minute is checked.
        while t <= to {
            let wall = zone.to_datetime(t);
            if brute_matches(&fields, wall) && seen.insert(wall) {
                expected.push(t);
            }
            t = t.checked_add(jiff::SignedDuration::from_secs(60)).unwrap();
        }
        let mut found = Vec::new();
        schedule.walk_back(&zone, to, from, |t| {
            found.push(t);
            ControlFlow::Continue(())
        });
        found.reverse();
        proptest::prop_assert_eq!(&found, &expected, "{} in {}", text, zone_name);
        let next = schedule.next_after(&zone, from);
        if let Some(first) = expected.first() {
            proptest::prop_assert_eq!(next, Some(*first));
        }
    }
}
