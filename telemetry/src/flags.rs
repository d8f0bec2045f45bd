//! Duration flags, shared by every binary: a duration is a number with a unit, or several
//! (`30s`, `1500ms`, `3m`, `1h 30m`, `0.5s`, `50us`; [`parse_duration`]), and its default is shown
//! as one. A number without a unit is refused: `--lease=30000` would otherwise mean whatever unit
//! the reader guesses.

use std::time::Duration;

/// The units a duration is written in, with their length in nanoseconds.
const UNITS: [(&str, u128); 6] = [
    ("us", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
];

/// What a duration looks like, for the errors.
const ACCEPTED: &str =
    "a number with one of the units us, ms, s, m, h, d (e.g. 30s, 500ms, 2m, 1h 30m, 365d)";

/// Parses a duration flag: one or more terms of a non-negative number (`30`, `0.5`) and a unit
/// (`us`, `ms`, `s`, `m`, `h`, `d` = 24 h), optionally separated by white space (`30s`, `1500ms`, `1h 30m`,
/// `0.5s`). A number without a unit is refused (`30000` could be seconds or milliseconds), except
/// `0`, which is the same in every unit.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() {
        return Err(format!("{s:?} is not a duration: write {ACCEPTED}"));
    }
    let mut nanos: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if number.is_empty() {
            return Err(format!("{s:?} is not a duration: write {ACCEPTED}"));
        }
        if unit.is_empty() && number == t {
            return Err(format!("{s:?} has no unit: write {ACCEPTED}"));
        }
        if unit.is_empty() {
            return Err(format!("{s:?}: {number} has no unit: write {ACCEPTED}"));
        }
        let Some(&(_, unit_nanos)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(format!(
                "{s:?}: {unit:?} is not a unit of a duration: write {ACCEPTED}"
            ));
        };
        let term = term_nanos(number, unit_nanos)
            .ok_or_else(|| format!("{s:?}: {number} is not a number: write {ACCEPTED}"))?;
        nanos = nanos
            .checked_add(term)
            .ok_or_else(|| format!("{s:?} is too long a duration"))?;
        rest = after.trim_start();
    }
    let secs = u64::try_from(nanos / 1_000_000_000)
        .map_err(|_| format!("{s:?} is too long a duration"))?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// `number` (digits, at most one `.`) units of `unit_nanos` nanoseconds each, in nanoseconds
/// (a fraction of a nanosecond dropped); `None` if it is not such a number or too large.
fn term_nanos(number: &str, unit_nanos: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut nanos = whole.checked_mul(unit_nanos)?;
    // Digits past the 24th are below a nanosecond even in hours.
    let fraction = &fraction[..fraction.len().min(24)];
    if !fraction.is_empty() {
        let digits: u128 = fraction.parse().ok()?;
        nanos = nanos.checked_add(digits * unit_nanos / 10u128.pow(fraction.len() as u32))?;
    }
    Some(nanos)
}

/// `d` as a humantime string: `30s`, `1m 30s`, `200ms`, `0s`.
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_with_units_parse() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1500ms"), Ok(ms(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0.5s"), Ok(ms(500)));
        assert_eq!(parse_duration(".25s"), Ok(ms(250)));
        assert_eq!(parse_duration("0.1s"), Ok(ms(100)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("50us"), Ok(Duration::from_micros(50)));
        assert_eq!(
            parse_duration("365d"),
            Ok(Duration::from_secs(365 * 86_400))
        );
        assert_eq!(parse_duration(" 30s "), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn a_number_without_a_unit_is_refused_with_the_units() {
        assert_eq!(
            parse_duration("30000").unwrap_err(),
            "\"30000\" has no unit: write a number with one of the units us, ms, s, m, h, d (e.g. \
             30s, 500ms, 2m, 1h 30m, 365d)"
        );
        assert_eq!(
            parse_duration("1h 30").unwrap_err(),
            "\"1h 30\": 30 has no unit: write a number with one of the units us, ms, s, m, h, d \
             (e.g. 30s, 500ms, 2m, 1h 30m, 365d)"
        );
        for bare in ["5", "1.5", " 30 ", "0.0"] {
            let e = parse_duration(bare).unwrap_err();
            assert!(
                e.contains("has no unit") && e.contains("us, ms, s, m, h, d"),
                "{bare:?}: {e}"
            );
        }
    }

    #[test]
    fn other_units_and_malformed_values_are_refused() {
        assert_eq!(
            parse_duration("5min").unwrap_err(),
            "\"5min\": \"min\" is not a unit of a duration: write a number with one of the units \
             us, ms, s, m, h, d (e.g. 30s, 500ms, 2m, 1h 30m, 365d)"
        );
        for unit in ["15M", "1D", "2sec", "1e3s", "5µs", "1s,2s"] {
            let e = parse_duration(unit).unwrap_err();
            assert!(e.contains("us, ms, s, m, h, d"), "{unit:?}: {e}");
        }
        for bad in ["fast", "", "-1s", "s", "1..5s", ".s", "NaN", "3 parsecs"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.starts_with(&format!("{bad:?}")), "{bad:?}: {e}");
        }
        let e = parse_duration("99999999999999999999999h").unwrap_err();
        assert!(
            e.contains("is not a number") || e.contains("too long"),
            "{e}"
        );
        assert_eq!(
            parse_duration("5124095576030432h").unwrap_err(),
            "\"5124095576030432h\" is too long a duration"
        );
    }

    #[test]
    fn durations_are_formatted_as_they_are_written() {
        assert_eq!(format_duration(Duration::from_secs(180)), "3m");
        assert_eq!(format_duration(Duration::from_millis(200)), "200ms");
        for d in ["30s", "1h 30m", "50us", "1m 30s 500ms"] {
            assert_eq!(format_duration(parse_duration(d).unwrap()), d);
        }
    }
}
