//! clbctl shows the IP family: `state service` of an IPv6 inbound service and of an egress (which has
//! none), and the pending diff's families (an inbound creation's one, an egress's public IPs'),
//! against an embedded control plane.

use std::process::Output;
use std::time::Duration;

use clb_embedded::{Harness, Options, PATIENCE, WriterExt};

use clb_proto::v1::{
    self, EgressUpdate, Operation, PodUpdate, ServicePort, ServiceUpdate, Update, update::Kind,
};
use serde_json::Value;
use tokio::process::Command;

const CLBCTL: &str = env!("CARGO_BIN_EXE_clbctl");

async fn clbctl(args: &[&str]) -> Output {
    tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(CLBCTL).args(args).output(),
    )
    .await
    .expect("clbctl finishes")
    .expect("clbctl runs")
}

fn json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON")
}

fn service(id: &str, family: v1::IpFamily) -> Update {
    Update {
        kind: Some(Kind::Service(ServiceUpdate {
            operation: Operation::Add as i32,
            service_id: id.into(),
            ports: vec![ServicePort {
                port: 80,
                protocol: v1::Protocol::Tcp as i32,
                target_port: 0,
            }],
            ip_family: family as i32,
            settings: None,
        })),
    }
}

fn pod(address: &str, location: &str) -> Update {
    Update {
        kind: Some(Kind::Pod(PodUpdate {
            operation: Operation::Add as i32,
            address: address.into(),
            location: location.into(),
            egress_id: "eg-fam".into(),
            pod_key: "ns/p".into(),
            pod_uid: "uid-p".into(),
            ..Default::default()
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_family_of_services_and_of_egress_public_ips_is_shown() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let url = h.url();
    let server = ["--server", url.as_str()];
    let mut w = h.watcher().await;
    w.resync_ok(vec![
        service("svc-v6", v1::IpFamily::Ipv6),
        service("svc-v4", v1::IpFamily::Ipv4),
        Update {
            kind: Some(Kind::Egress(EgressUpdate {
                operation: Operation::Add as i32,
                egress_id: "eg-fam".into(),
            })),
        },
        pod("10.9.0.1", "10.0.9.1"),
        pod("fd09::1", "fd00::9:1"),
    ])
    .await;
    h.wait_idle(PATIENCE).await.expect("converges");

    let v =
        json(&clbctl(&[&server[..], &["-o", "json", "state", "service", "svc-v6"]].concat()).await);
    assert_eq!(v["ip_family"], "IPv6", "{v}");
    assert!(
        v["frontend_ip"].as_str().is_some_and(|ip| ip.contains(':')),
        "{v}"
    );
    let v =
        json(&clbctl(&[&server[..], &["-o", "json", "state", "service", "svc-v4"]].concat()).await);
    assert_eq!(v["ip_family"], "IPv4", "{v}");
    let v =
        json(&clbctl(&[&server[..], &["-o", "json", "state", "service", "eg-fam"]].concat()).await);
    assert_eq!(v["ip_family"], "", "an egress has no family: {v}");
    assert_eq!(
        v["actual_addresses"], 2,
        "both pods refer to it in NRP: {v}"
    );
    let o = clbctl(&[&server[..], &["state", "service", "svc-v6"]].concat()).await;
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("(inbound, IPv6, gateway"), "{out}");
    h.shutdown().await;
}
