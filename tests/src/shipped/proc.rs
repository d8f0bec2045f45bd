//! The components as processes: the binaries (built once per test process) and [`Proc`], one
//! running component with its log.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::PATIENCE;

/// The binaries' directory (`target/<profile>`), built once per test process: `cargo build` of
/// the three binaries into the target directory the tests run from, so they are never stale.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        // target/<profile>/deps/<test> → target/<profile>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps")
            .to_path_buf();
        let target_dir = profile_dir.parent().expect("target").to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args([
            "build",
            "--locked",
            "-p",
            "clb-state-server",
            "-p",
            "clb-sync-worker",
            "-p",
            "clb-watcher",
            "--bins",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("running cargo build");
        assert!(status.success(), "building the binaries failed: {status}");
        profile_dir
    })
}

/// A component's process: its stderr (the log) is kept line by line.
#[derive(Debug)]
pub struct Proc {
    /// The pod name it runs as.
    pub name: String,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    /// Its gRPC address (state servers).
    pub grpc: Option<SocketAddr>,
    /// Its metrics address (`--metrics-listen`).
    pub metrics: Option<SocketAddr>,
}

/// `key=Some(ADDR)` or `key=ADDR` in a log line.
pub(super) fn addr_in(line: &str, key: &str) -> Option<SocketAddr> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    let rest = line[at..].trim_start_matches("Some(");
    let end = rest
        .find(|c: char| {
            !(c.is_ascii_alphanumeric() || c == '.' || c == ':' || c == '[' || c == ']')
        })
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

impl Proc {
    /// A process that has already ended (`true`), until the real one is started.
    pub(super) fn placeholder() -> Self {
        Self {
            name: String::new(),
            child: Command::new("true")
                .kill_on_drop(true)
                .spawn()
                .expect("true"),
            log: Arc::default(),
            grpc: None,
            metrics: None,
        }
    }

    pub(super) async fn spawn(
        name: &str,
        bin: &str,
        args: &[String],
        env: &[(String, String)],
    ) -> Self {
        let mut cmd = Command::new(bin_dir().join(bin));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin} as {name}: {e}"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped");
        let sink = log.clone();
        let echo = std::env::var("CLB_SHIPPED_LOGS").is_ok();
        let who = name.to_owned();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if echo {
                    eprintln!("[{who}] {line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        Self {
            name: name.to_owned(),
            child,
            log,
            grpc: None,
            metrics: None,
        }
    }

    /// Waits for a log line containing `needle` (at most [`PATIENCE`]).
    pub async fn wait_for_line(&self, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(l) = self.log().into_iter().find(|l| l.contains(needle)) {
                return l;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: no log line with {needle:?} within {PATIENCE:?}; log:\n{}",
                self.name,
                self.log().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its log so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// SIGKILL, as a node failure or an OOM kill: no shutdown of any kind.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// SIGTERM, as the kubelet does on a rollout, then waits for the exit (at most
    /// [`PATIENCE`], then SIGKILL).
    pub async fn terminate(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        if tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .is_err()
        {
            self.kill().await;
        }
    }

    /// `GET path` on its metrics port: the status and the body.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        let addr = self.metrics?;
        let r = reqwest::Client::new()
            .get(format!("http://{addr}{path}"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.text().await.ok()?))
    }

    /// The value of the first sample whose line starts with `prefix` in its `/metrics` (0 when
    /// absent; the Prometheus text is parsed by [`crate::metrics_check`]'s rules elsewhere).
    pub async fn metric(&self, prefix: &str) -> f64 {
        let Some((_, text)) = self.get("/metrics").await else {
            return 0.0;
        };
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}
