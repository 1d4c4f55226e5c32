//! Cron expressions: five fields (`minute hour day-of-month month
//! day-of-week`) or a name (`@hourly`, `@daily`, `@midnight`, `@weekly`,
//! `@monthly`, `@yearly`, `@annually`), matched against a civil (wall
//! clock) date and time. Time zones and daylight saving are the
//! schedule clock's concern (`super::clock`), not this module's.
//!
//! Fields take `*`, a value, a range `a-b`, a step `*/n`, `a-b/n` or
//! `a/n` (from `a` to the field's end), and lists of these (`1,15,30-40`).
//! Months may be written `jan`–`dec` and weekdays `sun`–`sat` (any case);
//! weekday 7 is Sunday, as 0 is. Day of month and day of week follow the
//! classic (Vixie) rule: when both are restricted (neither starts with
//! `*`), a day matches if either does; otherwise both must. Quartz extensions (`?`, `L`, `W`,
//! `#`) and seconds are refused: a schedule fires on whole minutes.

use std::fmt;

use jiff::civil::{Date, DateTime};

/// A cron expression that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad cron `{expr}`: {reason}")]
pub struct CronError {
    /// The expression as written.
    pub expr: String,
    /// What is wrong with it.
    pub reason: String,
}

/// A parsed cron expression: which minutes, hours, days and months match.
#[derive(Clone, PartialEq, Eq)]
pub struct Cron {
    text: String,
    minutes: u64,
    hours: u32,
    /// Bits 1..=31.
    days: u32,
    /// Bits 1..=12.
    months: u16,
    /// Bits 0..=6 (Sunday is 0).
    weekdays: u8,
    days_restricted: bool,
    weekdays_restricted: bool,
}

impl fmt::Debug for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cron({:?})", self.text)
    }
}

impl fmt::Display for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// One field's range and names.
struct Field {
    name: &'static str,
    lo: u32,
    hi: u32,
    names: &'static [&'static str],
    /// The value of the first name (`jan` is 1, `sun` is 0).
    first_name: u32,
}

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        lo: 0,
        hi: 59,
        names: &[],
        first_name: 0,
    },
    Field {
        name: "hour",
        lo: 0,
        hi: 23,
        names: &[],
        first_name: 0,
    },
    Field {
        name: "day of month",
        lo: 1,
        hi: 31,
        names: &[],
        first_name: 0,
    },
    Field {
        name: "month",
        lo: 1,
        hi: 12,
        names: &MONTHS,
        first_name: 1,
    },
    // 7 is Sunday too (folded into 0 after parsing).
    Field {
        name: "day of week",
        lo: 0,
        hi: 7,
        names: &WEEKDAYS,
        first_name: 0,
    },
];

impl Cron {
    /// Parses an expression (see the module doc).
    pub fn parse(expr: &str) -> Result<Cron, CronError> {
        let err = |reason: String| CronError {
            expr: expr.to_string(),
            reason,
        };
        let trimmed = expr.trim();
        let expanded = match trimmed.to_ascii_lowercase().as_str() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            s if s.starts_with('@') => {
                return Err(err(
                    "unknown name (use @hourly, @daily, @midnight, @weekly, @monthly, @yearly or @annually)"
                        .into(),
                ))
            }
            _ => trimmed,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(err(format!(
                "{} field(s); a cron has 5: minute hour day-of-month month day-of-week",
                parts.len()
            )));
        }
        let mut bits = [0u64; 5];
        for (i, (part, field)) in parts.iter().zip(FIELDS.iter()).enumerate() {
            bits[i] = parse_field(part, field).map_err(|r| err(format!("{}: {r}", field.name)))?;
        }
        let mut weekdays = bits[4];
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays & !(1 << 7)) | 1;
        }
        let cron = Cron {
            text: trimmed.to_string(),
            minutes: bits[0],
            hours: bits[1] as u32,
            days: bits[2] as u32,
            months: bits[3] as u16,
            weekdays: weekdays as u8,
            // As Vixie cron: a field that starts with `*` (`*`, `*/2`)
            // does not restrict.
            days_restricted: !parts[2].starts_with('*'),
            weekdays_restricted: !parts[4].starts_with('*'),
        };
        if !cron.can_fire() {
            return Err(err(
                "it names no day that exists (such as 30 February)".into()
            ));
        }
        Ok(cron)
    }

    /// The expression as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `date` is a day it fires on.
    pub fn matches_date(&self, date: Date) -> bool {
        if self.months & (1 << date.month()) == 0 {
            return false;
        }
        let day = self.days & (1 << date.day()) != 0;
        let weekday = self.weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        match (self.days_restricted, self.weekdays_restricted) {
            (true, true) => day || weekday,
            _ => day && weekday,
        }
    }

    /// Whether civil time `dt` (its minute) matches.
    pub fn matches(&self, dt: DateTime) -> bool {
        self.matches_date(dt.date())
            && self.hours & (1 << dt.hour()) != 0
            && self.minutes & (1 << dt.minute()) != 0
    }

    /// The first civil minute at or after `from` (seconds dropped) that
    /// matches, searched field by field; `None` if none does within eight
    /// years (a day that exists only in leap years is found).
    pub fn next_civil(&self, from: DateTime) -> Option<DateTime> {
        let mut date = from.date();
        let mut hour = from.hour() as u32;
        let mut minute = from.minute() as u32;
        let last = date.year().saturating_add(8);
        loop {
            if date.year() > last {
                return None;
            }
            if !self.matches_date(date) {
                date = date.tomorrow().ok()?;
                hour = 0;
                minute = 0;
                continue;
            }
            match next_bit(u64::from(self.hours), hour, 23) {
                None => {
                    date = date.tomorrow().ok()?;
                    hour = 0;
                    minute = 0;
                    continue;
                }
                Some(h) if h != hour => {
                    hour = h;
                    minute = 0;
                }
                Some(_) => {}
            }
            match next_bit(self.minutes, minute, 59) {
                Some(m) => {
                    return Some(date.at(hour as i8, m as i8, 0, 0));
                }
                None => {
                    minute = 0;
                    hour += 1;
                    if hour > 23 {
                        date = date.tomorrow().ok()?;
                        hour = 0;
                    }
                }
            }
        }
    }

    /// Whether some day in an eight-year span (two leap years) matches.
    fn can_fire(&self) -> bool {
        let from = jiff::civil::date(2024, 1, 1).at(0, 0, 0, 0);
        self.next_civil(from).is_some()
    }
}

/// The lowest set bit of `bits` at or above `from`, up to `hi`.
fn next_bit(bits: u64, from: u32, hi: u32) -> Option<u32> {
    if from > hi {
        return None;
    }
    let masked = bits >> from << from;
    let b = masked.trailing_zeros();
    (b <= hi && masked != 0).then_some(b)
}

fn parse_field(text: &str, field: &Field) -> Result<u64, String> {
    if text.is_empty() {
        return Err("empty".into());
    }
    let mut bits = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().ok().filter(|s| *s >= 1).ok_or_else(|| {
                    format!("`{item}`: the step must be a whole number of at least 1")
                })?;
                (r, Some(step))
            }
            None => (item, None),
        };
        let (lo, hi) = if range == "*" {
            (field.lo, field.hi)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (value(a, field)?, value(b, field)?);
            if a > b {
                return Err(format!("`{item}`: the range runs backwards"));
            }
            (a, b)
        } else {
            let v = value(range, field)?;
            // `a/n`: from `a` to the field's end.
            (v, if step.is_some() { field.hi } else { v })
        };
        let step = step.unwrap_or(1);
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

fn value(text: &str, field: &Field) -> Result<u32, String> {
    let lower = text.to_ascii_lowercase();
    if let Some(i) = field.names.iter().position(|n| *n == lower) {
        return Ok(i as u32 + field.first_name);
    }
    match text.parse::<u32>() {
        Ok(v) if (field.lo..=field.hi).contains(&v) => Ok(v),
        _ if matches!(text, "?" | "L" | "W") || text.contains(['#', 'L', 'W']) => Err(format!(
            "`{text}` is a Quartz extension, not supported (use the five classic fields)"
        )),
        _ => Err(format!(
            "`{text}` is not a value from {} to {}{}",
            field.lo,
            field.hi,
            if field.names.is_empty() {
                String::new()
            } else {
                format!(" (or a name: {})", field.names.join(", "))
            }
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use jiff::civil::date;

    #[test]
    fn fields_lists_ranges_steps_and_names() {
        let c = Cron::parse("*/15 9-17 * jan,JUL mon-fri").unwrap();
        assert!(c.matches(date(2026, 1, 5).at(9, 45, 0, 0))); // a Monday
        assert!(!c.matches(date(2026, 1, 5).at(9, 50, 0, 0)));
        assert!(!c.matches(date(2026, 1, 4).at(9, 45, 0, 0))); // Sunday
        assert!(!c.matches(date(2026, 2, 2).at(9, 45, 0, 0)));
        let sunday7 = Cron::parse("0 0 * * 7").unwrap();
        assert!(sunday7.matches(date(2026, 1, 4).at(0, 0, 0, 0)));
        let from = Cron::parse("5/20 * * * *").unwrap();
        assert_eq!(from.minutes, (1 << 5) | (1 << 25) | (1 << 45));
    }

    #[test]
    fn day_of_month_or_day_of_week_when_both_are_restricted() {
        let c = Cron::parse("0 0 13 * fri").unwrap();
        assert!(c.matches(date(2026, 1, 13).at(0, 0, 0, 0))); // a Tuesday the 13th
        assert!(c.matches(date(2026, 1, 2).at(0, 0, 0, 0))); // a Friday
        assert!(!c.matches(date(2026, 1, 3).at(0, 0, 0, 0)));
        // `*/2` starts with `*`: it does not restrict, so both must match.
        let c = Cron::parse("0 0 */2 * fri").unwrap();
        assert!(c.matches(date(2026, 1, 9).at(0, 0, 0, 0))); // Friday the 9th
        assert!(!c.matches(date(2026, 1, 2).at(0, 0, 0, 0))); // Friday the 2nd
        assert!(!c.matches(date(2026, 1, 3).at(0, 0, 0, 0))); // the 3rd, a Saturday
    }

    #[test]
    fn names_expand() {
        let h = Cron::parse("@hourly").unwrap();
        assert_eq!(
            h.next_civil(date(2026, 3, 1).at(10, 1, 0, 0)),
            Some(date(2026, 3, 1).at(11, 0, 0, 0))
        );
        let y = Cron::parse("@yearly").unwrap();
        assert_eq!(
            y.next_civil(date(2026, 3, 1).at(10, 1, 0, 0)),
            Some(date(2027, 1, 1).at(0, 0, 0, 0))
        );
        assert_eq!(h.as_str(), "@hourly");
    }

    #[test]
    fn next_civil_walks_fields() {
        let c = Cron::parse("30 2 29 2 *").unwrap();
        assert_eq!(
            c.next_civil(date(2025, 3, 1).at(0, 0, 0, 0)),
            Some(date(2028, 2, 29).at(2, 30, 0, 0))
        );
        let c = Cron::parse("59 23 31 12 *").unwrap();
        assert_eq!(
            c.next_civil(date(2026, 12, 31).at(23, 59, 0, 0)),
            Some(date(2026, 12, 31).at(23, 59, 0, 0))
        );
    }

    #[test]
    fn bad_expressions_say_why() {
        for (expr, says) in [
            ("* * * *", "4 field(s)"),
            ("61 * * * *", "minute: `61`"),
            ("* * * * * *", "6 field(s)"),
            ("*/0 * * * *", "step"),
            ("5-1 * * * *", "backwards"),
            ("0 0 L * *", "Quartz"),
            ("0 0 ? * *", "Quartz"),
            ("@reboot", "unknown name"),
            ("0 0 30 2 *", "no day"),
            ("0 0 * foo *", "month: `foo`"),
            ("", "0 field(s)"),
        ] {
            let e = Cron::parse(expr).unwrap_err().to_string();
            assert!(e.contains(says), "{expr}: {e}");
        }
    }
}
