//! `clbctl state location IP`, `clbctl state service ID` and `clbctl diff`: the desired and the
//! actual (NRP-confirmed) state side by side, and the changes still to send.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};

use super::refused_view::refused_table;
use super::time;
use super::view::{AddressSync, DiffView, LocationView, PortView, ServiceView};
use super::{Global, emit};

/// `clbctl state …`.
#[derive(Debug, Clone, Subcommand)]
pub enum StateCommand {
    /// One location (node IP): each address with its desired and actual services, differences
    /// marked.
    Location {
        /// The location: a node IP (any textual form).
        ip: String,
    },
    /// One service (inbound Service UID or egress name): desired and actual presence, address and
    /// location counts, ports, frontend IP.
    Service {
        /// The identity (case-insensitive).
        id: String,
    },
}

/// `clbctl diff`.
#[derive(Debug, Clone, Args)]
pub struct DiffArgs {
    /// The most service changes and location changes to show (each); 0 lets the server choose.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
}

fn table(header: Vec<&str>) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header);
    t
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "-".to_owned()
    } else {
        v.join(", ")
    }
}

/// Runs `clbctl state location|service`.
pub async fn run_state(global: &Global, cmd: &StateCommand) -> anyhow::Result<ExitCode> {
    let client = global.connect().await.with_context(|| {
        format!(
            "state: cannot reach the state server at {}",
            global.server()
        )
    })?;
    match cmd {
        StateCommand::Location { ip } => {
            let l = client
                .location(ip)
                .await
                .with_context(|| format!("state of location {ip}"))?;
            let view = LocationView::from(&l);
            emit(global.output, &view, render_location)?;
        }
        StateCommand::Service { id } => {
            let s = client
                .service(id)
                .await
                .with_context(|| format!("state of service {id}"))?;
            let view = ServiceView::from(&s);
            emit(global.output, &view, render_service)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A location as text: a summary line, then one row per address.
pub fn render_location(l: &LocationView) -> String {
    render_location_at(l, time::now_unix_ms())
}

/// [`render_location`] with times relative to `now_unix_ms`.
pub fn render_location_at(l: &LocationView, now_unix_ms: i64) -> String {
    let mut out = format!(
        "location {} (gateway {}): desired {}, in NRP {}  ·  {} addresses, {}\n",
        l.location,
        l.gateway,
        yes(l.desired),
        yes(l.actual),
        l.addresses.len(),
        match l.differences {
            0 => "all in sync".to_owned(),
            n => format!("{n} differ"),
        }
    );
    let mut t = table(vec![
        "address",
        "desired services",
        "actual services (NRP)",
        "state",
        "difference",
    ]);
    for a in &l.addresses {
        let mut difference = Vec::new();
        difference.extend(a.missing_services.iter().map(|s| format!("+{s}")));
        difference.extend(a.extra_services.iter().map(|s| format!("-{s}")));
        let desired = if a.desired {
            list(&a.desired_services)
        } else {
            "(not desired)".to_owned()
        };
        let actual = if a.actual {
            list(&a.actual_services)
        } else {
            "(not in NRP)".to_owned()
        };
        t.add_row(vec![
            Cell::new(&a.address),
            Cell::new(desired),
            Cell::new(actual),
            Cell::new(a.sync.mark()),
            Cell::new(match (&a.refused, a.sync) {
                (Some(r), _) => format!("{}  {}", difference.join(" "), r.summary(now_unix_ms)),
                (None, AddressSync::InSync) => String::new(),
                (None, _) => difference.join(" "),
            }),
        ]);
    }
    let _ = writeln!(out, "{t}");
    out
}

/// A service as text: one row per property, desired and actual side by side.
pub fn render_service(s: &ServiceView) -> String {
    let family = if s.ip_family.is_empty() {
        String::new()
    } else {
        format!(", {}", s.ip_family)
    };
    let mut out = format!(
        "service {} ({}{family}, gateway {}): {}\n",
        s.id,
        s.kind,
        s.gateway,
        if s.in_sync { "in sync" } else { "differs" }
    );
    let mut t = table(vec!["", "desired", "actual (NRP)"]);
    let right = |s: String| Cell::new(s).set_alignment(CellAlignment::Right);
    t.add_row(vec![
        Cell::new("present"),
        Cell::new(yes(s.desired)),
        Cell::new(yes(s.actual)),
    ]);
    t.add_row(vec![
        Cell::new("addresses"),
        right(s.desired_addresses.to_string()),
        right(s.actual_addresses.to_string()),
    ]);
    t.add_row(vec![
        Cell::new("locations"),
        right(s.desired_locations.to_string()),
        right(s.actual_locations.to_string()),
    ]);
    let ports = s.ports.iter().map(PortView::label).collect::<Vec<_>>();
    t.add_row(vec![
        Cell::new("ports"),
        Cell::new(list(&ports)),
        Cell::new(""),
    ]);
    if !s.settings.is_empty() {
        t.add_row(vec![
            Cell::new("settings"),
            Cell::new(s.settings.join(", ")),
            Cell::new(""),
        ]);
    }
    t.add_row(vec![
        Cell::new("frontend IP"),
        Cell::new(""),
        Cell::new(if s.frontend_ip.is_empty() {
            "(unknown)".to_owned()
        } else {
            s.frontend_ip.clone()
        }),
    ]);
    let _ = writeln!(out, "{t}");
    out
}

/// Runs `clbctl diff`.
pub async fn run_diff(global: &Global, args: &DiffArgs) -> anyhow::Result<ExitCode> {
    let client = global
        .connect()
        .await
        .with_context(|| format!("diff: cannot reach the state server at {}", global.server()))?;
    let d = client
        .pending_diff(args.limit)
        .await
        .context("pending diff")?;
    let view = DiffView::from(&d);
    emit(global.output, &view, render_diff)?;
    Ok(ExitCode::SUCCESS)
}

/// The pending diff as text: the work held after NRP refused it, service changes, then location
/// changes (one row per address).
pub fn render_diff(d: &DiffView) -> String {
    render_diff_at(d, time::now_unix_ms())
}

/// [`render_diff`] with times relative to `now_unix_ms`.
pub fn render_diff_at(d: &DiffView, now_unix_ms: i64) -> String {
    let mut out = format!(
        "pending diff of gateway {} at revision {}: {} service changes, {} location changes{}\n",
        d.gateway,
        d.revision,
        d.services.len(),
        d.locations.len(),
        if d.truncated {
            " (truncated: raise --limit to see more)"
        } else {
            ""
        }
    );
    if !d.refused.is_empty() {
        let _ = writeln!(
            out,
            "held after NRP refused them (sent again when their delay has passed or they \
             change):\n{}",
            refused_table(&d.refused, now_unix_ms)
        );
    }
    if d.services.is_empty() && d.locations.is_empty() {
        out.push_str("nothing to send: NRP has the desired state\n");
        return out;
    }
    if !d.services.is_empty() {
        let mut t = table(vec!["service", "kind", "action", "families", "ports"]);
        for s in &d.services {
            let ports = s.ports.iter().map(PortView::label).collect::<Vec<_>>();
            t.add_row(vec![
                Cell::new(&s.name),
                Cell::new(&s.kind),
                Cell::new(&s.action),
                Cell::new(list(&s.families)),
                Cell::new(list(&ports)),
            ]);
        }
        let _ = writeln!(out, "{t}");
    }
    if !d.locations.is_empty() {
        let mut t = table(vec!["location", "update", "address", "new services"]);
        for l in &d.locations {
            let action = l.action.replace('_', " ");
            if l.addresses.is_empty() {
                t.add_row(vec![
                    Cell::new(&l.location),
                    Cell::new(&action),
                    Cell::new("(none)"),
                    Cell::new("location deleted"),
                ]);
            }
            for (i, a) in l.addresses.iter().enumerate() {
                let (loc, act) = if i == 0 {
                    (l.location.as_str(), action.as_str())
                } else {
                    ("", "")
                };
                t.add_row(vec![
                    Cell::new(loc),
                    Cell::new(act),
                    Cell::new(&a.address),
                    Cell::new(if a.services.is_empty() {
                        "(removed)".to_owned()
                    } else {
                        a.services.join(", ")
                    }),
                ]);
            }
        }
        let _ = writeln!(out, "{t}");
    }
    out
}
