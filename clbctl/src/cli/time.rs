//! Times for humans: Unix milliseconds as UTC timestamps and ages, durations in short form.

use std::time::Duration;

pub use clb_proto::now_unix_ms;

/// `unix_ms` as `YYYY-MM-DD HH:MM:SS` UTC; `-` for 0 or less (never).
pub fn utc(unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return "-".to_owned();
    }
    let secs = unix_ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// How long before `now_unix_ms` the time `unix_ms` was, e.g. `3m 12s ago`; `never` for 0.
pub fn ago(unix_ms: i64, now_unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return "never".to_owned();
    }
    let ms = (now_unix_ms - unix_ms).max(0);
    format!("{} ago", short(Duration::from_millis(ms.unsigned_abs())))
}

/// A duration in short form: `850 ms`, `12.3 s`, `3m 12s`, `2h 05m`.
pub fn short(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", d.as_secs_f64())
    } else if ms < 3_600_000 {
        format!("{}m {:02}s", ms / 60_000, ms % 60_000 / 1000)
    } else {
        format!("{}h {:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000)
    }
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(0), "-");
        assert_eq!(utc(1_000), "1970-01-01 00:00:01");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_767_225_599_000), "2025-12-31 23:59:59");
    }

    #[test]
    fn ages_and_short_durations() {
        assert_eq!(ago(0, 5_000), "never");
        assert_eq!(ago(1_000, 4_500), "3.5 s ago");
        assert_eq!(short(Duration::from_millis(850)), "850 ms");
        assert_eq!(short(Duration::from_secs(192)), "3m 12s");
        assert_eq!(short(Duration::from_secs(7_500)), "2h 05m");
    }
}
