//! When a schedule's ticks fall: a cron expression read as crontab reads
//! it, or `@every D`.
//!
//! Expressions are checked here, field by field, so that an error names the
//! field and its range in the user's own five (or six) fields; only then is
//! the expression handed to the `cron` crate, whose own numbering of the
//! weekdays (1 = Sunday) is not crontab's (0 or 7 = Sunday, 1 = Monday):
//! the weekday field is rewritten into the crate's numbers on the way.

use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};

use crate::error::{Error, Result};

/// When a schedule's ticks fall.
///
/// - A cron expression of five fields (`min hour day month weekday`, run at
///   second 0), six (seconds first) or seven (a year last). Weekdays are
///   crontab's: 0 or 7 is Sunday, 1 Monday, … 6 Saturday, or `SUN`–`SAT`.
///   `@yearly`, `@monthly`, `@weekly`, `@daily` and `@hourly` are accepted.
/// - `@every D`: every D (`90s`, `5m`, `1h30m`, whole seconds, at least
///   one). Ticks fall on multiples of D since the Unix epoch, so every
///   instance derives the same ticks whenever it started (`@every 90m`
///   ticks at 00:00, 01:30, 03:00 UTC…); the time zone plays no part.
///
/// # Examples
///
/// ```
/// use tenure::Timetable;
/// assert!(Timetable::parse("@every 90m").is_ok());
/// assert!(Timetable::parse("0 9 * * MON-FRI").is_ok());
/// let e = Timetable::parse("61 * * * *").unwrap_err().to_string();
/// assert!(e.contains("minute must be 0-59"), "{e}");
/// ```
#[derive(Debug, Clone)]
pub struct Timetable {
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Cron(Box<cron::Schedule>),
    /// Every this many seconds, on multiples of it since the epoch.
    Every(i64),
}

/// A field of a cron expression: its name and inclusive range. The fields
/// are statics, not consts, so that each has one address: a field is told
/// apart by `std::ptr::eq` (a const's every use may be a copy of its own).
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

static SECOND: Field = Field {
    name: "second",
    min: 0,
    max: 59,
    names: &[],
};
static MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
static HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
static DAY: Field = Field {
    name: "day of month",
    min: 1,
    max: 31,
    names: &[],
};
static MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ],
};
static WEEKDAY: Field = Field {
    name: "weekday",
    min: 0,
    max: 7,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
};
static YEAR: Field = Field {
    name: "year",
    min: 1970,
    max: 2099,
    names: &[],
};

/// The shorthands the `cron` crate reads as they are.
const SHORTHANDS: &[&str] = &[
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];

/// The longest `@every`: a year (longer is no schedule a lease should wait on).
const MAX_EVERY_SECS: i64 = 366 * 24 * 3600;

fn invalid(expr: &str, reason: impl std::fmt::Display) -> Error {
    Error::InvalidArgument {
        what: "schedule",
        reason: format!("{expr:?}: {reason}"),
    }
}

impl Timetable {
    /// Reads a schedule: a cron expression or `@every D`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming the field and what it may hold.
    pub fn parse(expr: &str) -> Result<Timetable> {
        let expr = expr.trim();
        if let Some(d) = expr.strip_prefix("@every") {
            return Ok(Timetable {
                kind: Kind::Every(every_secs(expr, d.trim())?),
            });
        }
        if expr.starts_with('@') {
            let lower = expr.to_ascii_lowercase();
            let known = SHORTHANDS.contains(&lower.as_str());
            if !known {
                return Err(invalid(
                    expr,
                    "unknown shorthand: use @every D, @hourly, @daily, @weekly, @monthly or @yearly",
                ));
            }
            let lower = if lower == "@annually" {
                "@yearly".into()
            } else {
                lower
            };
            let cron = cron::Schedule::from_str(&lower).map_err(|e| invalid(expr, e))?;
            return Ok(Timetable {
                kind: Kind::Cron(Box::new(cron)),
            });
        }
        let fields: Vec<&str> = expr.split_whitespace().collect();
        let layout: &[&Field] = match fields.len() {
            5 => &[&MINUTE, &HOUR, &DAY, &MONTH, &WEEKDAY],
            6 => &[&SECOND, &MINUTE, &HOUR, &DAY, &MONTH, &WEEKDAY],
            7 => &[&SECOND, &MINUTE, &HOUR, &DAY, &MONTH, &WEEKDAY, &YEAR],
            n => {
                return Err(invalid(
                    expr,
                    format!(
                        "{n} field(s): give five (minute hour day-of-month month weekday), \
                         six (a second first) or seven (a year last), or @every D"
                    ),
                ))
            }
        };
        let mut rewritten: Vec<String> = Vec::with_capacity(7);
        if fields.len() == 5 {
            rewritten.push("0".into());
        }
        for (text, field) in fields.iter().zip(layout) {
            let values = check_field(expr, text, field)?;
            if std::ptr::eq(*field, &WEEKDAY) {
                rewritten.push(crate_weekdays(text, &values));
            } else {
                rewritten.push((*text).to_string());
            }
        }
        let cron = cron::Schedule::from_str(&rewritten.join(" ")).map_err(|e| invalid(expr, e))?;
        Ok(Timetable {
            kind: Kind::Cron(Box::new(cron)),
        })
    }

    /// The first tick strictly after `t`, reading the expression in `tz`.
    pub fn next_after<Z: TimeZone>(&self, t: DateTime<Utc>, tz: &Z) -> Option<DateTime<Utc>> {
        self.ticks_after(t, tz).next()
    }

    /// The ticks strictly after `t`, in order.
    pub fn ticks_after<'a, Z: TimeZone + 'a>(
        &'a self,
        t: DateTime<Utc>,
        tz: &Z,
    ) -> Box<dyn Iterator<Item = DateTime<Utc>> + 'a> {
        match &self.kind {
            Kind::Cron(cron) => Box::new(
                cron.after(&t.with_timezone(tz))
                    .map(|d| d.with_timezone(&Utc)),
            ),
            Kind::Every(secs) => {
                let secs = *secs;
                let first = t.timestamp().div_euclid(secs) * secs + secs;
                Box::new(
                    (0..)
                        .map_while(move |i: i64| i.checked_mul(secs)?.checked_add(first))
                        .map_while(|s| Utc.timestamp_opt(s, 0).single()),
                )
            }
        }
    }

    /// The last tick at or before `t`.
    pub fn last_at_or_before<Z: TimeZone>(
        &self,
        t: DateTime<Utc>,
        tz: &Z,
    ) -> Option<DateTime<Utc>> {
        match &self.kind {
            Kind::Cron(cron) => {
                // `after(t).rev()` walks back from t; t itself may be a tick.
                let just_after = t.with_timezone(tz) + chrono::Duration::milliseconds(1);
                cron.after(&just_after)
                    .next_back()
                    .map(|d| d.with_timezone(&Utc))
            }
            Kind::Every(secs) => {
                let s = t.timestamp().div_euclid(*secs) * secs;
                Utc.timestamp_opt(s, 0).single()
            }
        }
    }
}

/// `@every D`'s D in whole seconds: `90s`, `5m`, `1h30m`, `2h`.
fn every_secs(expr: &str, d: &str) -> Result<i64> {
    if d.is_empty() {
        return Err(invalid(expr, "@every needs a duration, such as @every 5m"));
    }
    if d.contains("ms") || d.contains("us") || d.contains("ns") {
        return Err(invalid(
            expr,
            format!("{d:?}: @every counts whole seconds (at least 1s): use s, m, h or d"),
        ));
    }
    let mut total: i64 = 0;
    let mut number = String::new();
    for c in d.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit: i64 = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => {
                return Err(invalid(
                    expr,
                    format!("{d:?} is not a duration: use whole seconds, minutes, hours or days (90s, 5m, 1h30m)"),
                ))
            }
        };
        let n: i64 = number
            .parse()
            .map_err(|_| invalid(expr, format!("{d:?}: a number must come before {c:?}")))?;
        number.clear();
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .filter(|t| *t <= MAX_EVERY_SECS)
            .ok_or_else(|| invalid(expr, "longer than a year"))?;
    }
    if !number.is_empty() {
        return Err(invalid(
            expr,
            format!("{d:?}: give a unit (s, m, h or d) after {number}"),
        ));
    }
    if total < 1 {
        return Err(invalid(expr, "@every needs at least 1s"));
    }
    Ok(total)
}

/// Checks one field (`*`, `?`, values, ranges, steps, lists, names) and
/// returns the values it selects (empty for `*` and `?`).
fn check_field(expr: &str, text: &str, field: &Field) -> Result<Vec<u32>> {
    let range = || format!("{} must be {}-{}", field.name, field.min, field.max);
    let bad = |why: String| invalid(expr, format!("{} field {text:?}: {why}", field.name));
    let value = |v: &str| -> Result<u32> {
        if let Some(i) = field.names.iter().position(|n| n.eq_ignore_ascii_case(v)) {
            // Month names count from 1, weekday names from 0 (Sunday).
            return Ok(i as u32 + field.min);
        }
        let n: u32 = v.parse().map_err(|_| {
            if field.names.is_empty() {
                bad(format!("{v:?} is not a number ({})", range()))
            } else {
                bad(format!(
                    "{v:?} is neither a number nor a name ({}, or {}-{})",
                    range(),
                    field.names[0],
                    field.names[field.names.len() - 1]
                ))
            }
        })?;
        if n < field.min || n > field.max {
            return Err(bad(format!("{}, not {n}", range())));
        }
        Ok(n)
    };
    if text == "*" {
        return Ok(Vec::new());
    }
    if text == "?" {
        if std::ptr::eq(field, &DAY) || std::ptr::eq(field, &WEEKDAY) {
            return Ok(Vec::new());
        }
        return Err(bad("? is only for the day of month or the weekday".into()));
    }
    let mut all = Vec::new();
    for item in text.split(',') {
        let (span, step) = match item.split_once('/') {
            Some((span, step)) => {
                let step: u32 = step.parse().ok().filter(|s| *s >= 1).ok_or_else(|| {
                    bad(format!(
                        "the step {step:?} must be a whole number of at least 1"
                    ))
                })?;
                (span, step)
            }
            None => (item, 1),
        };
        let (from, to) = if span == "*" {
            (field.min, field.max)
        } else if let Some((a, b)) = span.split_once('-') {
            let (a, b) = (value(a)?, value(b)?);
            if a > b {
                return Err(bad(format!("the range {span:?} runs backwards")));
            }
            (a, b)
        } else {
            let a = value(span)?;
            // `5/15` means from 5 to the end, every 15.
            (a, if item.contains('/') { field.max } else { a })
        };
        all.extend((from..=to).step_by(step as usize));
    }
    Ok(all)
}

/// The weekday field in the `cron` crate's numbers (1 = Sunday … 7 =
/// Saturday), from crontab's (0 or 7 = Sunday).
fn crate_weekdays(text: &str, values: &[u32]) -> String {
    if text == "*" || text == "?" {
        return text.to_string();
    }
    let mut days: Vec<u32> = values.iter().map(|d| d % 7 + 1).collect();
    days.sort_unstable();
    days.dedup();
    days.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, Timelike, Weekday};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn every_ticks_on_multiples_since_the_epoch() {
        let t = Timetable::parse("@every 90m").unwrap();
        let ticks: Vec<String> = t
            .ticks_after(at("2026-11-27T00:10:00Z"), &Utc)
            .take(3)
            .map(|d| d.format("%H:%M").to_string())
            .collect();
        assert_eq!(ticks, ["01:30", "03:00", "04:30"]);
        let one = Timetable::parse("@every 1s").unwrap();
        let base = at("2026-11-27T00:00:00Z");
        assert_eq!(
            one.next_after(base, &Utc),
            Some(base + chrono::Duration::seconds(1))
        );
        assert_eq!(one.last_at_or_before(base, &Utc), Some(base));
        assert_eq!(
            t.last_at_or_before(at("2026-11-27T02:59:59Z"), &Utc),
            Some(at("2026-11-27T01:30:00Z"))
        );
    }

    #[test]
    fn every_refuses_what_is_not_whole_seconds() {
        for bad in [
            "@every",
            "@every 0s",
            "@every 500ms",
            "@every 5",
            "@every m",
            "@every 400d",
        ] {
            let e = Timetable::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("@every")
                    || e.contains("duration")
                    || e.contains("unit")
                    || e.contains("year")
                    || e.contains("number"),
                "{bad}: {e}"
            );
        }
        assert!(Timetable::parse("@every 1h30m").is_ok());
        let e = Timetable::parse("@every 1ms").unwrap_err().to_string();
        assert!(e.contains("whole seconds"), "{e}");
    }

    #[test]
    fn errors_name_the_field_in_the_users_terms() {
        let e = Timetable::parse("61 * * * *").unwrap_err().to_string();
        assert!(e.contains("minute must be 0-59, not 61"), "{e}");
        assert!(e.contains("\"61 * * * *\""), "{e}");
        assert!(
            !e.contains("0 61"),
            "the internal six-field form leaked: {e}"
        );
        let e = Timetable::parse("0 24 * * *").unwrap_err().to_string();
        assert!(e.contains("hour must be 0-23, not 24"), "{e}");
        let e = Timetable::parse("0 0 * * 8").unwrap_err().to_string();
        assert!(e.contains("weekday must be 0-7"), "{e}");
        let e = Timetable::parse("* * * *").unwrap_err().to_string();
        assert!(e.contains("4 field(s)"), "{e}");
        let e = Timetable::parse("every tuesday").unwrap_err().to_string();
        assert!(e.contains("field(s)"), "{e}");
        let e = Timetable::parse("0 0 * * FUN").unwrap_err().to_string();
        assert!(e.contains("SUN-SAT"), "{e}");
        assert!(Timetable::parse("59 23 31 12 7").is_ok());
    }

    #[test]
    fn weekdays_are_crontabs() {
        // 2026-11-27 is a Friday.
        let from = at("2026-11-27T12:00:00Z");
        let day = |expr: &str| {
            Timetable::parse(expr)
                .unwrap()
                .next_after(from, &Utc)
                .unwrap()
                .weekday()
        };
        assert_eq!(day("0 9 * * 1"), Weekday::Mon);
        assert_eq!(day("0 9 * * 0"), Weekday::Sun);
        assert_eq!(day("0 9 * * 7"), Weekday::Sun);
        assert_eq!(day("0 9 * * 6"), Weekday::Sat);
        assert_eq!(day("0 9 * * MON"), Weekday::Mon);
        assert_eq!(day("0 0 9 * * 1"), Weekday::Mon);
        // Mon-Fri from a Friday noon: Monday next (not Sunday).
        assert_eq!(day("0 9 * * 1-5"), Weekday::Mon);
        assert_eq!(day("0 9 * * MON-FRI"), Weekday::Mon);
        assert_eq!(day("0 9 * * 5-7"), Weekday::Sat);
        // 0, 2, 4, 6: Sunday, Tuesday, Thursday, Saturday.
        assert_eq!(day("0 9 * * */2"), Weekday::Sat);
    }

    #[test]
    fn shorthands_and_steps() {
        let from = at("2026-11-27T12:34:56Z");
        let hourly = Timetable::parse("@hourly").unwrap();
        assert_eq!(
            hourly.next_after(from, &Utc),
            Some(at("2026-11-27T13:00:00Z"))
        );
        let weekly = Timetable::parse("@weekly").unwrap();
        assert_eq!(
            weekly.next_after(from, &Utc).unwrap().weekday(),
            Weekday::Sun
        );
        let steps = Timetable::parse("*/15 * * * *").unwrap();
        assert_eq!(steps.next_after(from, &Utc).unwrap().minute(), 45);
        assert!(Timetable::parse("@often").is_err());
    }
}
