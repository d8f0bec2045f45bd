//! The real `clbctl` binary against a state server running in this process (NRP emulator, state
//! server, workers over loopback): apply with per-item errors, the read commands as JSON, status
//! watch, completions, and a tiny load run.

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use clb_embedded::{Harness, Options, PATIENCE, WriterExt};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

const CLBCTL: &str = env!("CARGO_BIN_EXE_clbctl");

fn init() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

async fn clbctl(args: &[&str]) -> Output {
    Command::new(CLBCTL)
        .args(args)
        .env_remove("CLB_SERVER")
        .env_remove("CLB_GATEWAY")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("clbctl runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn show(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        text(&o.stdout),
        text(&o.stderr)
    )
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", show(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", show(o)))
}

fn temp_file(name: &str, content: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("clbctl-test-{}-{name}", std::process::id()));
    std::fs::write(&path, content).expect("write temp file");
    path
}

const GOOD_AND_BAD: &str = "\
# A service, its endpoints, a pod with a malformed IP, an egress.
- {kind: service, op: add, id: svc-cli, ports: [{port: 80, protocol: TCP}]}
- kind: endpoints
  service: svc-cli
  endpoints:
    - {address: 10.9.0.1, location: 10.0.9.1}
    - {address: 10.9.0.2, location: 10.0.9.1}
- {kind: pod, op: add, address: 10.9.0.300, location: 10.0.9.1, key: ns/bad}
- {kind: egress, op: add, id: eg-cli}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apply_reports_bad_items_and_the_read_commands_print_json() {
    init();
    let h = Harness::start(Options::e2e()).await;
    h.watcher().await.resync_ok(Vec::new()).await;
    let url = h.url();
    let server = ["--server", url.as_str()];

    // apply --dry-run: the server validates (the bad IP is found), nothing changes.
    let file = temp_file("updates.yaml", GOOD_AND_BAD);
    let path = file.to_str().expect("utf-8 path");
    let before = h.gateway_status().await.revision;
    let o = clbctl(&[&server[..], &["apply", "--dry-run", "-f", path]].concat()).await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(err.contains("would reject 1 of 4"), "{err}");
    assert!(
        err.contains("item 2 (pod)") && err.contains("\"10.9.0.300\""),
        "{err}"
    );
    assert!(text(&o.stdout).contains("3 of 4 updates"), "{}", show(&o));
    let o = clbctl(
        &[
            &server[..],
            &["-o", "json", "apply", "--dry-run", "-f", path],
        ]
        .concat(),
    )
    .await;
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(
        (v["dry_run"].as_bool(), v["applied"].as_u64()),
        (Some(true), Some(3)),
        "{v}"
    );
    assert_eq!(v["rejected"][0]["field"], "address", "{v}");
    assert_eq!(
        h.gateway_status().await.revision,
        before,
        "a dry run changes nothing"
    );
    let client = h.client().await;
    assert!(
        client.service("svc-cli").await.is_err(),
        "svc-cli not applied by the dry run"
    );

    // apply: one bad item → exit 1, the error names index, field, value and reason; the rest applied.
    let o = clbctl(&[&server[..], &["apply", "-f", path]].concat()).await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(err.contains("item 2 (pod)"), "{err}");
    assert!(err.contains("field `address`"), "{err}");
    assert!(err.contains("\"10.9.0.300\""), "{err}");
    assert!(err.contains("rejected 1 of 4"), "{err}");
    let out = text(&o.stdout);
    assert!(out.contains("applied 3 of 4"), "{out}");
    assert!(client.service("svc-cli").await.expect("svc-cli").desired);
    assert!(client.service("eg-cli").await.expect("eg-cli").desired);

    // The same file as JSON output: the rejected item with both field names.
    let o = clbctl(
        &[
            &server[..],
            &["-o", "json", "apply", "-f", path, "--writer", "ci"],
        ]
        .concat(),
    )
    .await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["applied"], 3);
    assert_eq!(v["writer"], "ci");
    assert_eq!(v["rejected"][0]["index"], 2);
    assert_eq!(v["rejected"][0]["field"], "address");
    assert_eq!(v["rejected"][0]["server_field"], "updates[2].pod.address");
    assert_eq!(v["rejected"][0]["value"], "10.9.0.300");
    assert!(
        v["rejected"][0]["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty())
    );

    // A malformed file: a precise error with line and column, and nothing sent.
    let before = h.gateway_status().await.revision;
    let bad = temp_file(
        "malformed.yaml",
        "- {kind: egress, op: add, id: eg-x}\n- kind: pod\n  op: ad\n  address: 10.9.0.9\n",
    );
    let o = clbctl(&[&server[..], &["apply", "-f", bad.to_str().expect("utf-8")]].concat()).await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(err.contains("item 1"), "{err}");
    assert!(err.contains("unknown variant `ad`"), "{err}");
    assert!(err.contains("line 3 column"), "{err}");
    assert_eq!(h.gateway_status().await.revision, before, "nothing sent");
    assert!(client.service("eg-x").await.is_err(), "eg-x not applied");

    // JSON from stdin, all valid → exit 0.
    let mut child = Command::new(CLBCTL)
        .args([&server[..], &["apply", "-f", "-"]].concat())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(
        &mut stdin,
        br#"[{"kind": "egress", "op": "add", "id": "eg-stdin"}]"#,
    )
    .await
    .expect("write stdin");
    drop(stdin);
    let o = child.wait_with_output().await.expect("wait");
    assert!(o.status.success(), "{}", show(&o));
    assert!(client.service("eg-stdin").await.expect("eg-stdin").desired);

    h.wait_idle(PATIENCE).await.expect("converges");

    // state location: one row per address, desired and actual side by side.
    let v = json(
        &clbctl(
            &[
                &server[..],
                &["state", "location", "10.0.9.1", "-o", "json"],
            ]
            .concat(),
        )
        .await,
    );
    assert_eq!(v["location"], "10.0.9.1");
    assert_eq!(v["desired"], true);
    assert_eq!(v["actual"], true);
    assert_eq!(v["in_sync"], true);
    let addresses = v["addresses"].as_array().expect("addresses");
    assert_eq!(addresses.len(), 2, "{v}");
    assert_eq!(addresses[0]["address"], "10.9.0.1");
    assert_eq!(addresses[0]["desired_services"][0], "svc-cli");
    assert_eq!(addresses[0]["actual_services"][0], "svc-cli");
    assert_eq!(addresses[0]["sync"], "in_sync");
    let o = clbctl(&[&server[..], &["state", "location", "10.0.9.1"]].concat()).await;
    assert!(o.status.success(), "{}", show(&o));
    assert!(text(&o.stdout).contains("= in sync"), "{}", show(&o));

    // state service: kind by name, counts.
    let v = json(
        &clbctl(&[&server[..], &["-o", "json", "state", "service", "SVC-CLI"]].concat()).await,
    );
    assert_eq!(v["id"], "svc-cli");
    assert_eq!(v["kind"], "inbound");
    assert_eq!(v["desired"], true);
    assert_eq!(v["actual"], true);
    assert_eq!(v["desired_addresses"], 2);
    assert_eq!(v["actual_addresses"], 2);
    assert!(
        v["ports"].is_array() && v.get("frontend_ip").is_some(),
        "{v}"
    );

    // diff: empty once converged, with its fields.
    let v = json(&clbctl(&[&server[..], &["-o", "json", "diff", "--limit", "10"]].concat()).await);
    assert_eq!(v["gateway"], "default");
    assert!(v["revision"].as_u64().is_some_and(|r| r > 0), "{v}");
    assert_eq!(v["services"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(v["locations"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(v["truncated"], false);

    // status: gateways, workers, writers; desired vs actual.
    let v = json(&clbctl(&[&server[..], &["status", "-o", "json"]].concat()).await);
    let g = &v["gateways"][0];
    assert_eq!(g["name"], "default");
    assert_eq!(g["desired_addresses"], 2);
    assert_eq!(g["actual_addresses"], 2);
    assert_eq!(g["in_sync"], true);
    assert_eq!(g["init"]["removals_allowed"], true);
    assert_eq!(v["workers"].as_array().map(Vec::len), Some(3), "{v}");
    let writers: Vec<&str> = v["writers"]
        .as_array()
        .expect("writers")
        .iter()
        .filter_map(|w| w["writer"].as_str())
        .collect();
    assert!(
        writers.contains(&"clbctl") && writers.contains(&"ci"),
        "{writers:?}"
    );
    let o = clbctl(&[&server[..], &["status"]].concat()).await;
    assert!(o.status.success(), "{}", show(&o));
    assert!(text(&o.stdout).contains("programmed (NRP)"), "{}", show(&o));

    // Errors say what failed and why, with exit 1.
    let o = clbctl(&[&server[..], &["state", "location", "10.0.0.300"]].concat()).await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("location 10.0.0.300"),
        "{}",
        show(&o)
    );
    assert!(text(&o.stderr).contains("InvalidArgument"), "{}", show(&o));
    let o = clbctl(&[&server[..], &["state", "service", "nope"]].concat()).await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("NotFound"), "{}", show(&o));

    // demo --state-server refuses a server that already holds desired state, and changes nothing.
    let before = client.status().await.expect("status").gateways[0].revision;
    let o = clbctl(&["demo", "--quick", "--plain", "--state-server", url.as_str()]).await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("already holds desired state")
            && text(&o.stderr).contains("--replace-existing-state"),
        "{}",
        show(&o)
    );
    assert_eq!(
        client.status().await.expect("status").gateways[0].revision,
        before
    );
    assert!(client.service("svc-cli").await.expect("svc-cli").desired);

    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(bad);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_and_bad_usage_fail_with_their_exit_codes() {
    init();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    drop(listener);
    let o = clbctl(&["--server", &url, "--connect-attempts", "1", "status"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(err.contains("cannot reach the state server"), "{err}");
    assert!(err.contains(&url), "{err}");

    let o = clbctl(&["state", "nowhere"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let o = clbctl(&["--output", "xml", "status"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let o = clbctl(&["apply", "-f", "/no/such/file.yaml"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("cannot read /no/such/file.yaml"),
        "{}",
        show(&o)
    );
    // With -o json a failure is JSON too, on stdout.
    let bad = temp_file("malformed.yaml", "- {kind: service, op: add, id: [\n");
    let path = bad.to_str().expect("utf-8 path");
    let o = clbctl(&["-o", "json", "apply", "--dry-run", "-f", path]).await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", show(&o)));
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(path), "{v}");
    // host:port without a scheme is http://, and the server named is what fails.
    let hostport = url.trim_start_matches("http://");
    let o = clbctl(&["--server", hostport, "--connect-attempts", "1", "status"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("cannot reach the state server"),
        "{}",
        show(&o)
    );
    assert!(!text(&o.stderr).contains("scheme"), "{}", show(&o));
}

#[tokio::test]
async fn completions_print_a_script() {
    let o = clbctl(&["completions", "bash"]).await;
    assert!(o.status.success(), "{}", show(&o));
    let script = text(&o.stdout);
    assert!(script.contains("_clbctl"), "{script}");
    assert!(script.contains("complete"), "{script}");
    for shell in ["zsh", "fish", "powershell", "elvish"] {
        let o = clbctl(&["completions", shell]).await;
        assert!(
            o.status.success() && !o.stdout.is_empty(),
            "{shell}: {}",
            show(&o)
        );
    }
    let o = clbctl(&["completions", "tcsh"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_watch_repeats_until_interrupted() {
    init();
    let h = Harness::start(Options::e2e()).await;
    let mut child = Command::new(CLBCTL)
        .args([
            "--server",
            &h.url(),
            "status",
            "--watch",
            "--interval",
            "100ms",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut readings = 0;
    let read = async {
        while let Some(line) = lines.next_line().await.expect("read") {
            if line.starts_with("--- ") {
                readings += 1;
                if readings == 3 {
                    break;
                }
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("three readings");
    let pid = child.id().expect("running").to_string();
    let killed = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .expect("kill");
    assert!(killed.success());
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("stops")
        .expect("wait");
    assert_eq!(status.code(), Some(0), "ctrl-c ends the watch cleanly");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_embedded_load_reports_its_figures_as_json() {
    let o = tokio::time::timeout(
        Duration::from_secs(300),
        clbctl(&[
            "-o",
            "json",
            "load",
            "--pods",
            "200",
            "--locations",
            "10",
            "--services",
            "4",
            "--churn-per-sec",
            "50",
            "--duration",
            "2s",
            "--nrp-latency",
            "5ms",
            "--nrp-latency-per-address",
            "10us",
            "--patience",
            "120s",
        ]),
    )
    .await
    .expect("load finishes");
    let v = json(&o);
    assert_eq!(v["mode"], "embedded");
    let ingest = &v["ingest"];
    let events = ingest["churn_events"].as_u64().expect("churn_events");
    assert!(events > 0, "{v}");
    assert_eq!(ingest["updates_acknowledged"].as_u64(), Some(3 * events));
    assert_eq!(ingest["updates_rejected"], 0);
    assert!(
        ingest["updates_per_sec"].as_f64().is_some_and(|r| r > 0.0),
        "{v}"
    );
    let latency = &v["convergence"]["latency"];
    assert!(latency["count"].as_u64().is_some_and(|n| n > 0), "{v}");
    for key in ["p50_ms", "p99_ms", "max_ms"] {
        assert!(latency[key].as_f64().is_some(), "{key}: {v}");
    }
    assert!(
        v["convergence"]["method"]
            .as_str()
            .is_some_and(|m| m.contains("GetLocation"))
    );
    assert_eq!(v["nrp"]["available"], true);
    assert!(v["nrp"]["calls"].as_u64().is_some_and(|n| n > 0), "{v}");
    assert!(
        v["nrp"]["update_address_locations_calls"]
            .as_u64()
            .is_some(),
        "{v}"
    );
    assert_eq!(v["converged"], true, "{v}");
    assert!(v["drain_s"].as_f64().is_some(), "{v}");
}
