//! Work NRP refused and the server holds on its refusal schedule (`RefusedItem`), as `clbctl
//! status`, `clbctl state location` and `clbctl diff` show it.

use std::time::Duration;

use clb_proto::v1::RefusedItem;
use comfy_table::{Cell, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;

use super::time;

/// The longest error message a table row shows (the JSON output has it whole).
const MESSAGE_CHARS: usize = 100;

/// One piece of refused work held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusedView {
    /// `address`, `location` or `service`.
    pub kind: String,
    /// The location of an address or a location.
    pub location: String,
    /// The address of an address.
    pub address: String,
    /// The ref NRP refused for an address; the service, for a service.
    pub services: Vec<String>,
    /// NRP's error code.
    pub code: String,
    /// NRP's message.
    pub message: String,
    /// When NRP refused it last (Unix ms).
    pub at_unix_ms: i64,
    /// Refusals in a row.
    pub refusals: u32,
    /// When it goes again unless it changes first (Unix ms; 0: due now).
    pub retry_at_unix_ms: i64,
}

impl From<&RefusedItem> for RefusedView {
    fn from(i: &RefusedItem) -> Self {
        Self {
            kind: i.kind.clone(),
            location: i.location.clone(),
            address: i.address.clone(),
            services: i.service_ids.clone(),
            code: i.code.clone(),
            message: i.message.clone(),
            at_unix_ms: i.at_unix_ms,
            refusals: i.refusals,
            retry_at_unix_ms: i.retry_at_unix_ms,
        }
    }
}

impl RefusedView {
    /// What is held, in short: `address 10.1.0.7 at 10.0.0.4`, `location 10.0.0.4`, `service x`.
    pub fn what(&self) -> String {
        match self.kind.as_str() {
            "address" => format!("address {} at {}", self.address, self.location),
            "location" => format!("location {}", self.location),
            _ => format!("{} {}", self.kind, self.services.join(", ")),
        }
    }

    /// When it goes again, relative to `now_unix_ms`: `in 25.0 s`, or `now`.
    pub fn retry(&self, now_unix_ms: i64) -> String {
        if self.retry_at_unix_ms <= now_unix_ms {
            "now".to_owned()
        } else {
            let ms = (self.retry_at_unix_ms - now_unix_ms).unsigned_abs();
            format!("in {}", time::short(Duration::from_millis(ms)))
        }
    }

    /// The code, the refusals in a row and when it goes again, in one cell.
    pub fn summary(&self, now_unix_ms: i64) -> String {
        format!(
            "refused: {} ×{}, again {}",
            self.code,
            self.refusals,
            self.retry(now_unix_ms)
        )
    }
}

/// The refused work as a table, one row per item, ages relative to `now_unix_ms`.
pub fn refused_table(items: &[RefusedView], now_unix_ms: i64) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(vec![
            "held", "code", "refusals", "refused", "again", "message",
        ]);
    for i in items {
        let message: String = if i.message.chars().count() > MESSAGE_CHARS {
            let cut: String = i.message.chars().take(MESSAGE_CHARS).collect();
            format!("{cut}…")
        } else {
            i.message.clone()
        };
        t.add_row(vec![
            Cell::new(i.what()),
            Cell::new(&i.code),
            Cell::new(i.refusals),
            Cell::new(time::ago(i.at_unix_ms, now_unix_ms)),
            Cell::new(i.retry(now_unix_ms)),
            Cell::new(message),
        ]);
    }
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(kind: &str, retry_at_unix_ms: i64) -> RefusedView {
        RefusedView::from(&RefusedItem {
            kind: kind.into(),
            location: "10.0.0.4".into(),
            address: if kind == "address" {
                "10.1.0.7".into()
            } else {
                String::new()
            },
            service_ids: vec!["svc-a".into()],
            code: "BackendPoolAddressesMustHaveSameIpVersion".into(),
            message: "x".repeat(150),
            at_unix_ms: 1_000_000,
            refusals: 3,
            retry_at_unix_ms,
        })
    }

    #[test]
    fn a_held_address_says_where_why_and_when_again() {
        let a = item("address", 1_030_000);
        assert_eq!(a.what(), "address 10.1.0.7 at 10.0.0.4");
        assert_eq!(a.retry(1_005_000), "in 25.0 s");
        assert_eq!(a.retry(1_040_000), "now");
        assert_eq!(
            a.summary(1_005_000),
            "refused: BackendPoolAddressesMustHaveSameIpVersion ×3, again in 25.0 s"
        );
        assert_eq!(item("location", 0).what(), "location 10.0.0.4");
        assert_eq!(item("service", 0).what(), "service svc-a");
        let t = refused_table(&[a], 1_005_000);
        assert!(
            t.contains("BackendPoolAddressesMustHaveSameIpVersion"),
            "{t}"
        );
        assert!(t.contains("5.0 s ago"), "{t}");
        assert!(
            t.contains(&format!("{}…", "x".repeat(MESSAGE_CHARS))),
            "{t}"
        );
        assert!(!t.contains(&"x".repeat(MESSAGE_CHARS + 1)), "{t}");
    }
}
