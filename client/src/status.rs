//! `clbctl status`: the state server's Admin Status as tables (gateways, workers, writers, last
//! errors).

use clb_proto::v1::StatusRequest;
use clb_proto::v1::StatusResponse;
use clb_proto::v1::admin_client::AdminClient;
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};

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

/// Renders `status` as text: one table per section.
pub fn render(status: &StatusResponse) -> String {
    let mut out = format!("server {}\n", status.server_id);
    let mut g = table(vec![
        "gateway",
        "revision",
        "addresses (desired/actual)",
        "locations (desired/actual)",
        "services (desired/actual)",
        "egresses (desired/NAT gateways)",
        "dirty locations",
        "units in flight",
        "parked",
        "removals allowed",
    ]);
    for s in &status.gateways {
        let init = s.init.clone().unwrap_or_default();
        g.add_row(vec![
            s.name.clone(),
            s.revision.to_string(),
            format!("{}/{}", s.desired_addresses, s.actual_addresses),
            format!("{}/{}", s.desired_locations, s.actual_locations),
            format!("{}/{}", s.desired_services, s.actual_services),
            format!("{}/{}", s.desired_egresses, s.actual_nat_gateways),
            s.dirty_locations.to_string(),
            s.units_in_flight.to_string(),
            s.parked_units.to_string(),
            if init.removals_allowed {
                "yes".to_owned()
            } else {
                format!(
                    "no (NRP observed: {}, pending writers: {:?})",
                    init.nrp_observed, init.pending_writers
                )
            },
        ]);
    }
    out.push_str(&format!("{g}\n"));
    let mut w = table(vec!["worker", "capacity", "units in flight", "gateways"]);
    for s in &status.workers {
        w.add_row(vec![
            s.worker_id.clone(),
            s.capacity.to_string(),
            s.units_in_flight.to_string(),
            s.gateways.join(", "),
        ]);
    }
    out.push_str(&format!("{w}\n"));
    let mut r = table(vec![
        "writer",
        "last resync (unix ms)",
        "updates applied",
        "rejected",
    ]);
    for s in &status.writers {
        r.add_row(vec![
            s.source.clone(),
            s.last_resync_unix_ms.to_string(),
            s.updates_applied.to_string(),
            s.items_rejected.to_string(),
        ]);
    }
    out.push_str(&format!("{r}\n"));
    let errors: Vec<_> = status
        .gateways
        .iter()
        .flat_map(|g| g.last_errors.iter().map(move |e| (&g.name, e)))
        .collect();
    if !errors.is_empty() {
        let mut e = table(vec![
            "gateway",
            "at (unix ms)",
            "work",
            "code",
            "terminal",
            "message",
        ]);
        for (gw, x) in errors {
            e.add_row(vec![
                gw.clone(),
                x.at_unix_ms.to_string(),
                x.work_id.to_string(),
                x.code.clone(),
                x.terminal.to_string(),
                x.message.clone(),
            ]);
        }
        out.push_str(&format!("{e}\n"));
    }
    out
}
