//! `clbctl status`: the state server's Admin Status as tables (per gateway: desired vs programmed
//! counts, work in flight, initialization gates; then workers, writers and the last errors), and the
//! convergence test on a status that `clbctl demo --state-server` and `clbctl load` use when NRP
//! is not visible to them.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use clb_proto::v1::admin_client::AdminClient;
use clb_proto::v1::{GatewayStatus, StatusRequest, StatusResponse};
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};

use crate::cli::refused_view::{RefusedView, refused_table};
use crate::cli::time;
use clb_client::client::Client;

/// Reads `Admin.Status` from the state server at `url` (e.g. `http://127.0.0.1:50051`).
pub async fn fetch(url: &str) -> anyhow::Result<StatusResponse> {
    let mut admin = AdminClient::connect(url.to_owned()).await?;
    Ok(admin.status(StatusRequest {}).await?.into_inner())
}

fn table(header: Vec<&str>) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header);
    t
}

fn right(s: impl ToString) -> Cell {
    Cell::new(s.to_string()).set_alignment(CellAlignment::Right)
}

/// Whether desired and actual counts are equal and nothing is dirty or in flight.
pub fn counts_in_sync(g: &GatewayStatus) -> bool {
    g.desired_addresses == g.actual_addresses
        && g.desired_locations == g.actual_locations
        && g.desired_services == g.actual_services
        && g.desired_egresses == g.actual_nat_gateways
        && g.dirty_locations == 0
        && g.units_in_flight == 0
}

/// Whether the gateway looks converged from its status alone: initialization gates open (removals
/// are sent), [`counts_in_sync`] and nothing held after NRP refused it.
pub fn converged(g: &GatewayStatus) -> bool {
    g.init.as_ref().is_some_and(|i| i.removals_allowed)
        && counts_in_sync(g)
        && g.parked_units == 0
        && g.refused_addresses == 0
}

/// Why [`converged`] does not hold, in words (empty when it holds).
pub fn not_converged_because(g: &GatewayStatus) -> String {
    let mut why = Vec::new();
    let init = g.init.clone().unwrap_or_default();
    if !init.removals_allowed {
        why.push(format!(
            "removals not allowed yet (NRP observed: {}, pending writers: {:?})",
            init.nrp_observed, init.pending_writers
        ));
    }
    let pairs = [
        ("addresses", g.desired_addresses, g.actual_addresses),
        ("locations", g.desired_locations, g.actual_locations),
        ("services", g.desired_services, g.actual_services),
        ("egresses", g.desired_egresses, g.actual_nat_gateways),
    ];
    for (what, d, a) in pairs {
        if d != a {
            why.push(format!("{what}: desired {d}, programmed {a}"));
        }
    }
    if g.dirty_locations > 0 {
        why.push(format!("{} dirty locations", g.dirty_locations));
    }
    if g.units_in_flight > 0 {
        why.push(format!("{} units in flight", g.units_in_flight));
    }
    if g.parked_units > 0 {
        why.push(format!("{} parked units", g.parked_units));
    }
    if g.refused_addresses > 0 {
        why.push(format!(
            "{} addresses held after NRP refused them",
            g.refused_addresses
        ));
    }
    why.join("; ")
}

/// The status of the client's gateway (the first one, the server's default, when the client names
/// none).
pub fn gateway_of<'a>(client: &Client, status: &'a StatusResponse) -> Option<&'a GatewayStatus> {
    if client.gateway().is_empty() {
        status.gateways.first()
    } else {
        status
            .gateways
            .iter()
            .find(|g| g.name.eq_ignore_ascii_case(client.gateway()))
    }
}

/// Waits until the client's gateway has converged as far as the Admin API can tell: [`converged`],
/// an empty pending diff, and the same revision with nothing in flight on a second look. Polls every
/// `poll`; fails after `timeout` with the reasons, or at once when a call fails.
pub async fn wait_converged(
    client: &Client,
    timeout: Duration,
    poll: Duration,
) -> Result<GatewayStatus, String> {
    let deadline = Instant::now() + timeout;
    let gateway = |s: &StatusResponse| {
        gateway_of(client, s).cloned().ok_or_else(|| {
            format!(
                "the state server has no gateway {:?} (it has {:?})",
                client.gateway(),
                s.gateways.iter().map(|g| &g.name).collect::<Vec<_>>()
            )
        })
    };
    loop {
        let g = gateway(&client.status().await.map_err(|e| e.to_string())?)?;
        if converged(&g) {
            let d = client.pending_diff(1).await.map_err(|e| e.to_string())?;
            if d.services.is_empty() && d.locations.is_empty() {
                let again = gateway(&client.status().await.map_err(|e| e.to_string())?)?;
                if again.revision == g.revision && converged(&again) {
                    return Ok(again);
                }
            }
        }
        if Instant::now() >= deadline {
            let d = client.pending_diff(5).await.map_err(|e| e.to_string())?;
            return Err(format!(
                "not converged after {}: {}; pending diff: {} service changes, {} location \
                 changes{}",
                time::short(timeout),
                not_converged_because(&g),
                d.services.len(),
                d.locations.len(),
                if d.truncated { " (or more)" } else { "" },
            ));
        }
        tokio::time::sleep(poll).await;
    }
}

/// Renders `status` as text, one table per section, with ages relative to now.
pub fn render(status: &StatusResponse) -> String {
    render_at(status, time::now_unix_ms())
}

/// Renders `status` as text with ages relative to `now_unix_ms`.
pub fn render_at(status: &StatusResponse, now_unix_ms: i64) -> String {
    let mut out = format!("server {}\n", status.server_id);
    for g in &status.gateways {
        let init = g.init.clone().unwrap_or_default();
        let verdict = if converged(g) {
            "in sync".to_owned()
        } else {
            format!("converging: {}", not_converged_because(g))
        };
        let _ = writeln!(
            out,
            "\ngateway {}  ·  revision {}  ·  {verdict}",
            g.name, g.revision
        );
        let mut t = table(vec!["", "desired", "programmed (NRP)", "difference"]);
        let rows = [
            ("addresses", g.desired_addresses, g.actual_addresses),
            ("locations", g.desired_locations, g.actual_locations),
            (
                "services (load balancers)",
                g.desired_services,
                g.actual_services,
            ),
            (
                "egresses (NAT gateways)",
                g.desired_egresses,
                g.actual_nat_gateways,
            ),
        ];
        for (what, d, a) in rows {
            let diff = i128::from(d) - i128::from(a);
            t.add_row(vec![
                Cell::new(what),
                right(d),
                right(a),
                right(if diff == 0 {
                    "=".to_owned()
                } else {
                    format!("{diff:+}")
                }),
            ]);
        }
        let _ = writeln!(out, "{t}");
        let oldest = match g.oldest_pending_change_age_ms {
            0 => "none".to_owned(),
            ms => time::short(Duration::from_millis(ms)),
        };
        let _ = writeln!(
            out,
            "dirty locations {}  ·  units in flight {}  ·  parked units {}  ·  oldest unconfirmed \
             change {oldest}",
            g.dirty_locations, g.units_in_flight, g.parked_units,
        );
        let pending = if init.pending_writers.is_empty() {
            "none".to_owned()
        } else {
            init.pending_writers.join(", ")
        };
        let _ = writeln!(
            out,
            "init gates: NRP observed {}  ·  pending writers {pending}  ·  removals allowed {}",
            yes(init.nrp_observed),
            yes(init.removals_allowed),
        );
        for line in held_lines(&init, now_unix_ms) {
            let _ = writeln!(out, "{line}");
        }
        if !g.refused.is_empty() {
            let refused: Vec<RefusedView> = g.refused.iter().map(RefusedView::from).collect();
            let _ = writeln!(
                out,
                "held after NRP refused them ({} addresses, {} locations and services; sent \
                 again when their delay has passed or they change):\n{}",
                g.refused_addresses,
                g.parked_units,
                refused_table(&refused, now_unix_ms)
            );
        }
    }
    let mut w = table(vec![
        "worker",
        "capacity",
        "in flight",
        "connected",
        "last unit",
        "last report",
        "leases expired",
        "gateways",
    ]);
    let mut stuck = Vec::new();
    for s in &status.workers {
        let expired = if s.expiries_since_report > 0 {
            stuck.push(s);
            format!(
                "{} (! {} since report)",
                s.lease_expiries, s.expiries_since_report
            )
        } else {
            s.lease_expiries.to_string()
        };
        w.add_row(vec![
            Cell::new(&s.worker_id),
            right(s.capacity),
            right(s.units_in_flight),
            Cell::new(time::ago(s.connected_at_unix_ms, now_unix_ms)),
            Cell::new(time::ago(s.last_unit_unix_ms, now_unix_ms)),
            Cell::new(time::ago(s.last_report_unix_ms, now_unix_ms)),
            right(expired),
            Cell::new(if s.gateways.is_empty() {
                "all".to_owned()
            } else {
                s.gateways.join(", ")
            }),
        ]);
    }
    if status.workers.is_empty() {
        out.push_str("\nworkers: none connected\n");
    } else {
        let _ = writeln!(out, "\nworkers: {}\n{w}", status.workers.len());
    }
    for s in stuck {
        let _ = writeln!(
            out,
            "worker {}: {} unit lease{} expired since its last report ({}): it holds units without \
             reporting (hung, stopped, or cut off from NRP); its units go to other workers",
            s.worker_id,
            s.expiries_since_report,
            if s.expiries_since_report == 1 {
                ""
            } else {
                "s"
            },
            time::ago(s.last_report_unix_ms, now_unix_ms),
        );
    }
    let mut r = table(vec!["writer", "last resync", "updates applied", "rejected"]);
    for s in &status.writers {
        r.add_row(vec![
            Cell::new(&s.writer),
            Cell::new(time::ago(s.last_resync_unix_ms, now_unix_ms)),
            right(s.updates_applied),
            right(s.items_rejected),
        ]);
    }
    if status.writers.is_empty() {
        out.push_str("\nwriters: none yet\n");
    } else {
        let _ = writeln!(out, "\nwriters: {}\n{r}", status.writers.len());
    }
    let errors: Vec<_> = status
        .gateways
        .iter()
        .flat_map(|g| g.last_errors.iter().map(move |e| (&g.name, e)))
        .collect();
    if errors.is_empty() {
        out.push_str("\nlast errors: none\n");
    } else {
        let mut e = table(vec![
            "gateway", "at (UTC)", "age", "worker", "unit", "code", "kind", "message",
        ]);
        for (gw, x) in errors {
            let worker = if x.worker_id.is_empty() {
                "?"
            } else {
                x.worker_id.as_str()
            };
            e.add_row(vec![
                Cell::new(gw),
                Cell::new(time::utc(x.at_unix_ms)),
                Cell::new(time::ago(x.at_unix_ms, now_unix_ms)),
                Cell::new(worker),
                Cell::new(format!("#{} {}", x.work_id, x.unit)),
                Cell::new(&x.code),
                Cell::new(if x.terminal { "terminal" } else { "retryable" }),
                Cell::new(&x.message),
            ]);
        }
        let _ = writeln!(out, "\nlast errors:\n{e}");
    }
    out
}

/// One line per reason the restart gate holds removals back, e.g. `removals held back: waiting for
/// node-agent/node-3 (pod writer) at 1 location: 4 addresses, 0 services; gives up in 2m 40s`.
pub fn held_lines(init: &clb_proto::v1::InitGates, now_unix_ms: i64) -> Vec<String> {
    init.held
        .iter()
        .map(|h| {
            let what = match h.reason.as_str() {
                "nrp_not_observed" => "NRP not read back yet".to_owned(),
                "cluster_view" => "waiting for the cluster watcher's resync".to_owned(),
                "expected_writer" => format!("waiting for {} (expected writer)", h.writer),
                "pod_writer" => format!("waiting for {} (pod writer)", h.writer),
                other => other.to_owned(),
            };
            let bound = if h.deadline_unix_ms > 0 {
                let left = (h.deadline_unix_ms - now_unix_ms).max(0) as u64;
                format!("; gives up in {}", time::short(Duration::from_millis(left)))
            } else {
                String::new()
            };
            format!(
                "removals held back: {what} at {} location{}: {} addresses, {} services{bound}",
                h.locations,
                if h.locations == 1 { "" } else { "s" },
                h.addresses,
                h.services,
            )
        })
        .collect()
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
