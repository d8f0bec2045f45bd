//! Duration flags, shared by every binary: a duration is a humantime string (`30s`, `1500ms`, `3m`,
//! `1h 30m`, `0.5s`; [`parse_duration`]) and its default is shown as one.
//!
//! The flags that took a number in a fixed unit (`--lease-ms=30000`, `--resync-wait-s=180`, …) were
//! renamed without the unit (`--lease=30s`, `--resync-wait=3m`). Each old name (and its `CLB_*_MS`
//! / `CLB_*_S` variable) is still accepted, in its old unit, as a hidden flag that conflicts with
//! the new one; the new flag's help says that the old name is deprecated, and the binary folds the
//! two into one `Duration` when it builds its configuration.

use std::time::Duration;

/// Parses a duration flag: a humantime string (`30s`, `1500ms`, `2m`, `1h 30m`, `0.5s`), or a bare
/// number of seconds (`30`, `0.5`; what the duration flags accepted before humantime).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{s:?} is not a non-negative duration"));
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("{s:?} is not a duration such as 30s, 1500ms, 2m or 1h 30m: {e}"))
}

/// `d` as a humantime string: `30s`, `1m 30s`, `200ms`, `0s`.
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humantime_strings_and_bare_seconds_parse() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration(" 30 "), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        for bad in ["fast", "3 parsecs", "-1", "-1s", "", "NaN"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_duration(Duration::from_secs(180)), "3m");
        assert_eq!(format_duration(Duration::from_millis(200)), "200ms");
    }
}
