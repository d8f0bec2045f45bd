//! Conformance of the emulator with Microsoft's own client: the Python SDK `azure-mgmt-network`
//! (from PyPI, pinned) drives an emulator on loopback through `tests/conformance/sdk_conformance.py`
//! — gateways (create/get/list/list_all/update_tags/delete), public IPs, load balancers, NAT
//! gateways, updateServices and updateAddressLocations at both levels, paging, ARM errors, IPv6
//! public IPs, a dual-stack load balancer, a StandardV2 NAT gateway with an IPv6 public IP
//! (`publicIpAddressesV6`), a dual-stack Service as one unit per family, 404 after
//! delete — at each api-version, answered synchronously and as long-running operations.
//!
//! Each api-version is driven by the SDK release generated for it: 30.2.0 for 2025-05-01 (where the
//! gateway actions are long-running `begin_*` methods accepting 202/204) and 33.1.0 for 2026-03-01
//! (synchronous actions accepting 200 with `ServiceGatewayActionOkResponseBody`). The virtual
//! environments live under the target directory (`target/tmp/sdk-conformance/`) and are reused when
//! their pinned packages match. Skipped, with a message, only when `python3` is absent.

use std::path::{Path, PathBuf};
use std::process::Command;

use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator, Stats};

/// Packages of every environment, pinned.
const COMMON: [&str; 2] = ["azure-core==1.41.0", "azure-mgmt-core==1.6.0"];

/// Steps of the script each run must pass (a run that executes fewer fails).
const CASES: u64 = 27;

fn python3() -> Option<PathBuf> {
    let out = Command::new("python3").arg("--version").output().ok()?;
    out.status.success().then(|| PathBuf::from("python3"))
}

/// A virtual environment at `dir` with `packages` installed (reused when its marker says so);
/// returns its interpreter.
fn venv(python: &Path, dir: &Path, packages: &[&str]) -> PathBuf {
    let interpreter = dir.join("bin").join("python");
    let marker = dir.join("clb-packages.txt");
    let wanted = packages.join("\n");
    if interpreter.exists() && std::fs::read_to_string(&marker).ok().as_deref() == Some(&wanted) {
        return interpreter;
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("create the venv directory");
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(
        Command::new(python).args(["-m", "venv"]).arg(dir),
        "python3 -m venv",
    );
    run(
        Command::new(&interpreter)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(packages),
        &format!("pip install {packages:?} (PyPI must be reachable)"),
    );
    std::fs::write(&marker, wanted).expect("write the venv marker");
    interpreter
}

/// The emulator of one run: listings paged by 2 so that every listing of the script spans pages.
fn config(long_running: bool) -> EmulatorConfig {
    EmulatorConfig {
        page_size: 2,
        long_running_operations: long_running,
        // A little latency so that polls see operations in progress.
        latency_ms: u64::from(long_running) * 2,
        lro_retry_after_secs: 0,
        // Azure's one-version rules (the default; stated: the script depends on them).
        single_ip_version_pools: true,
        ..EmulatorConfig::default()
    }
}

/// Runs the script at `api_version` against a fresh emulator; returns the emulator's statistics.
async fn run(interpreter: &Path, api_version: &str, long_running: bool) -> Stats {
    let emulator = Emulator::new(config(long_running)).expect("valid config");
    let server = RunningEmulator::start(emulator)
        .await
        .expect("bind loopback");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/sdk_conformance.py");
    let mode = if long_running { "lro" } else { "sync" };
    let out = tokio::process::Command::new(interpreter)
        .arg(&script)
        .args(["--base-url", &server.base_url()])
        .args(["--api-version", api_version, "--mode", mode])
        .output()
        .await
        .expect("run the conformance script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "SDK conformance at {api_version} ({mode}) failed:\n{stdout}\n{stderr}"
    );
    let summary: serde_json::Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no summary line:\n{stdout}\n{stderr}"));
    assert_eq!(summary["cases"], CASES, "{summary}");
    assert_eq!(summary["passed"], CASES, "{summary}");
    assert_eq!(summary["failed"], serde_json::json!([]), "{summary}");
    assert_eq!(summary["api_version"], api_version, "{summary}");
    println!("{summary}");
    let stats = server.emulator().stats();
    server.shutdown().await.expect("shutdown");
    stats
}

/// Checks that the emulator answered as `api_version` and the mode define (so that the SDK
/// accepted exactly these shapes).
fn check_statuses(stats: &Stats, api_version: &str, long_running: bool) {
    let n = |op: &str, status: u16| stats.calls_with_status(op, status);
    let actions = [
        "ServiceGateways_UpdateServices",
        "ServiceGateways_UpdateAddressLocations",
    ];
    let action_status = match (api_version, long_running) {
        ("2026-03-01", _) => 200,
        (_, true) => 202,
        _ => 204,
    };
    for op in actions {
        assert!(n(op, action_status) >= 4, "{op} {action_status}: {stats:?}");
        assert!(n(op, 400) >= 1, "{op} 400 (the ARM errors): {stats:?}");
        for other in [200, 202, 204].into_iter().filter(|s| *s != action_status) {
            assert_eq!(n(op, other), 0, "{op} {other}: {stats:?}");
        }
    }
    let put = "ServiceGateways_CreateOrUpdate";
    assert!(n(put, 201) >= 4 && n(put, 200) >= 1, "{put}: {stats:?}");
    let delete = "ServiceGateways_Delete";
    assert!(n(delete, 204) >= 1, "{delete} 204: {stats:?}");
    assert_eq!(n(delete, 200), 0, "{delete} never 200: {stats:?}");
    assert_eq!(n(delete, 202) >= 1, long_running, "{delete} 202: {stats:?}");
    assert!(n("ServiceGateways_UpdateTags", 200) >= 1, "{stats:?}");
    assert!(n("ServiceGateways_List", 200) >= 2, "{stats:?}");
    assert!(n("ServiceGateways_ListAll", 200) >= 2, "{stats:?}");
    assert!(n("ServiceGateways_Get", 404) >= 2, "{stats:?}");
    assert!(n("ServiceGateways_GetServices", 200) >= 3, "{stats:?}");
    assert!(
        n("ServiceGateways_GetAddressLocations", 200) >= 3,
        "{stats:?}"
    );
    assert_eq!(stats.operations_started > 0, long_running, "{stats:?}");
}

async fn conformance(api_version: &str, sdk: &str) {
    let Some(python) = python3() else {
        println!(
            "SKIPPED: SDK conformance at api-version {api_version}: python3 is not installed \
             (install Python 3 to run azure-mgmt-network=={sdk} against the emulator)"
        );
        return;
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("sdk-conformance")
        .join(format!("venv-azure-mgmt-network-{sdk}"));
    let mut packages = vec![format!("azure-mgmt-network=={sdk}")];
    packages.extend(COMMON.map(String::from));
    let interpreter = tokio::task::spawn_blocking(move || {
        let packages: Vec<&str> = packages.iter().map(String::as_str).collect();
        venv(&python, &dir, &packages)
    })
    .await
    .expect("venv task");
    for long_running in [false, true] {
        let stats = run(&interpreter, api_version, long_running).await;
        check_statuses(&stats, api_version, long_running);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_sdk_conformance_at_2025_05_01() {
    conformance("2025-05-01", "30.2.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_sdk_conformance_at_2026_03_01() {
    conformance("2026-03-01", "33.1.0").await;
}
