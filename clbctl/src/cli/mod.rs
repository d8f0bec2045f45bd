//! `clbctl`, the clb command line: its arguments ([`Cli`]) and one module per command. The binary
//! only parses the arguments and calls [`run`].
//!
//! | command | module | what it does |
//! |---|---|---|
//! | `status` | [`status`] | the state server's Admin Status as tables (`--watch` refreshes them) |
//! | `state location IP`, `state service ID`, `diff` | [`state`] | desired vs actual side by side; the pending diff |
//! | `apply -f FILE` | [`apply`] | a YAML or JSON list of updates, with per-item errors |
//! | `demo` | [`crate::demo`] | the embedded demo (or `--state-server URL`: external processes) |
//! | `load` | [`load`], [`load_agents`] | the load generator: ingest rate, convergence latency, NRP calls; `--node-agents N`: what N node agents cost the server |
//! | `completions SHELL` | — | shell completion scripts (clap_complete) |
//!
//! Every command that prints data takes the global `--output table|json`; JSON is built from the
//! serde views in [`view`] (enums as names, not numbers). Exit codes: 0 ok, 1 failure, 2 usage.

pub mod apply;
pub mod load;
mod load_agent;
pub mod load_agents;
pub mod load_agents_report;
pub mod load_pacing;
mod load_procstat;
pub mod load_report;
mod load_samples;
pub mod refused_view;
mod settings_view;
pub mod state;
pub mod status;
pub mod time;
pub mod view;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, CommandFactory as _, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;
use clb_core::difftracker::quote;

use crate::demo::{self, DemoConfig};
use clb_client::client::{Client, ConnectOptions, TlsOptions};

/// The default state server URL (`--server`, `CLB_SERVER`).
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:50051";

/// clbctl: operate and exercise a clb state server (Azure Container Load Balancer control plane).
#[derive(Debug, Parser)]
#[command(
    name = "clbctl",
    version,
    about = "clbctl: operate and exercise a clb state server (Azure Container Load Balancer control plane)",
    propagate_version = true
)]
pub struct Cli {
    /// Options shared by every command.
    #[command(flatten)]
    pub global: Global,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Options shared by every command.
#[derive(Debug, Clone, Args)]
pub struct Global {
    /// The state server: a URL (`http://` or `https://`) or `host:port` (`https://` when a TLS flag
    /// is given, else `http://`) [default: http://127.0.0.1:50051]. `load` and `demo` run the
    /// embedded system unless a server is named (here or with their --state-server).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CLB_SERVER",
        value_name = "URL"
    )]
    pub server: Option<String>,
    /// The gateway to read or write; empty is the server's default gateway.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CLB_GATEWAY",
        default_value = ""
    )]
    pub gateway: String,
    /// Output format.
    #[arg(long, short = 'o', global = true, help_heading = "Global options", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// PEM file of the CA bundle that signs the state server's certificate (with an `https://`
    /// URL); read again for each connection when it changed.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CLB_TLS_CA",
        value_name = "FILE"
    )]
    pub tls_ca: Option<std::path::PathBuf>,
    /// PEM certificate of this client, for mutual TLS (needs --tls-key and an `https://` URL).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CLB_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CLB_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<std::path::PathBuf>,
    /// File of the bearer token every call sends (a server with --authentication=kubernetes: a
    /// token for the audience `clb`, e.g. `kubectl create token NAME --audience clb > FILE`);
    /// re-read when it changes. Default: /var/run/secrets/clb/token if it exists.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CLB_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub token_file: Option<std::path::PathBuf>,
    /// Name to verify in the state server's certificate (default: the host of --server), e.g.
    /// clb-state-server.clb-system.svc through `kubectl port-forward`.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CLB_TLS_DOMAIN",
        value_name = "NAME"
    )]
    pub tls_domain: Option<String>,
    /// Send the bearer token over a plaintext (http://) connection to a host that is not loopback
    /// (refused otherwise: the token would cross the network in clear).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "CLB_INSECURE_PLAINTEXT"
    )]
    pub insecure_plaintext: bool,
    /// Connection attempts before giving up (with exponential backoff from 200 ms).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        default_value_t = 3,
        value_name = "N"
    )]
    pub connect_attempts: u32,
}

/// How a command prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable tables.
    Table,
    /// One JSON document (`status --watch`: one per line).
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Prints the state server's status: revision, desired vs programmed counts, work in
    /// flight, workers, writers, initialization gates, last errors.
    Status(status::StatusArgs),
    /// Desired vs actual state of one location or one service.
    #[command(subcommand)]
    State(state::StateCommand),
    /// The changes the state server would still send to NRP.
    Diff(state::DiffArgs),
    /// Applies a YAML or JSON file of updates (see docs/clbctl.md for the format).
    Apply(apply::ApplyArgs),
    /// Plays the demo: a synthetic cluster through create → rollout → scale down → delete a
    /// service → node drained, on the embedded system or on an external state server.
    Demo(DemoArgs),
    /// Generates load (pod churn) and reports ingest rate, convergence latency and NRP calls.
    Load(Box<load::LoadArgs>),
    /// Prints a shell completion script.
    Completions(CompletionsArgs),
}

/// `clbctl demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// A smaller cluster and ~2 ms NRP latency (for CI).
    #[arg(long)]
    pub quick: bool,
    /// Plain progress lines instead of a spinner.
    #[arg(long)]
    pub plain: bool,
    /// Drive the state server at this URL (and whatever workers and NRP it has) instead of the
    /// embedded system (the global `--server`, when given, names it too). The demo then replaces that server's desired state (a resync as
    /// `watcher`) and checks convergence through the Admin API.
    #[arg(long, value_name = "URL")]
    pub state_server: Option<String>,
    /// With an external server: go on even though that server already holds desired state (the
    /// demo would replace it, and its workers would remove from NRP what the demo does not
    /// declare).
    #[arg(long)]
    pub replace_existing_state: bool,
}

/// `clbctl completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: Shell,
}

impl Global {
    /// The server `--server` names, or the default.
    pub fn server(&self) -> &str {
        self.server.as_deref().unwrap_or(DEFAULT_SERVER)
    }

    /// `server` as a URL: `host:port` gets `https://` when a TLS flag is given, else `http://`; a
    /// scheme other than those two is refused.
    pub fn server_url(&self, server: &str) -> anyhow::Result<String> {
        match server.split_once("://") {
            Some(("http" | "https", "")) => anyhow::bail!(
                "--server {}: no host; use http://HOST:PORT, https://HOST:PORT or HOST:PORT",
                quote(server)
            ),
            Some(("http" | "https", _)) => Ok(server.to_owned()),
            Some((scheme, _)) => anyhow::bail!(
                "--server {}: the scheme {} is not supported; use http://HOST:PORT, \
                 https://HOST:PORT or HOST:PORT",
                quote(server),
                quote(scheme)
            ),
            None if server.is_empty() => {
                anyhow::bail!(
                    "--server \"\": empty; use http://HOST:PORT, https://HOST:PORT or HOST:PORT"
                )
            }
            None => {
                let tls = self.tls_ca.is_some() || self.tls_cert.is_some();
                Ok(format!("{}://{server}", if tls { "https" } else { "http" }))
            }
        }
    }

    /// Connection options for `server` with this command line's gateway, TLS and attempts.
    pub fn connect_options(&self, server: &str) -> anyhow::Result<ConnectOptions> {
        let url = self.server_url(server)?;
        let server = url.as_str();
        let mut options = ConnectOptions::new(server);
        options.attempts = self.connect_attempts.max(1);
        options.initial_backoff = Duration::from_millis(200);
        options.max_backoff = Duration::from_secs(2);
        options.connect_timeout = Duration::from_secs(5);
        options.gateway = self.gateway.clone();
        // Read now for a clear error; the client re-reads it for each connection (a rotated bundle).
        let ca = match &self.tls_ca {
            Some(path) => {
                std::fs::read(path)
                    .with_context(|| format!("cannot read the CA file {}", path.display()))?;
                Some(clb_client::tls::CaBundle::File(path.clone()))
            }
            None => None,
        };
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let read = |p: &std::path::PathBuf, what: &str| {
                    std::fs::read(p)
                        .with_context(|| format!("cannot read the {what} file {}", p.display()))
                };
                Some((read(cert, "--tls-cert")?, read(key, "--tls-key")?))
            }
            _ => None,
        };
        let https = server.starts_with("https://");
        if (ca.is_some() || identity.is_some()) && !https {
            anyhow::bail!(
                "--tls-ca/--tls-cert are for TLS: the server URL {server} must start with https://"
            );
        }
        if https {
            options.tls = Some(TlsOptions {
                ca,
                identity,
                domain: self.tls_domain.clone(),
            });
        }
        options.token_file = clb_client::token::token_file_or_default(self.token_file.as_deref());
        options.insecure_plaintext = self.insecure_plaintext;
        Ok(options)
    }

    /// Connects to `--server`.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        self.connect_to(self.server()).await
    }

    /// Connects to the state server at `server`.
    pub async fn connect_to(&self, server: &str) -> anyhow::Result<Client> {
        let options = self.connect_options(server)?;
        Ok(Client::connect(options).await?)
    }
}

/// Runs the command line and returns the process's exit code; errors are printed to stderr.
pub async fn run(cli: Cli) -> ExitCode {
    let Cli { global, command } = cli;
    let result = match command {
        Command::Status(args) => status::run(&global, &args).await,
        Command::State(cmd) => state::run_state(&global, &cmd).await,
        Command::Diff(args) => state::run_diff(&global, &args).await,
        Command::Apply(args) => apply::run(&global, &args).await,
        Command::Demo(args) => run_demo(&global, &args).await,
        Command::Load(args) => load::run(&global, &args).await,
        Command::Completions(args) => {
            let mut cmd = Cli::command();
            let mut script = Vec::new();
            clap_complete::generate(args.shell, &mut cmd, "clbctl", &mut script);
            out(&String::from_utf8_lossy(&script));
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", describe(&e));
            if global.output == Output::Json
                && !JSON_PRINTED.load(std::sync::atomic::Ordering::Relaxed)
            {
                let _ = print_json(&error_json(&e));
            }
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, `a: b: c`, without the repetitions of causes whose
/// message already ends the previous one (tonic's transport errors repeat themselves).
pub fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

async fn run_demo(global: &Global, args: &DemoArgs) -> anyhow::Result<ExitCode> {
    let mut config = if args.quick {
        DemoConfig::quick()
    } else {
        DemoConfig::full()
    };
    config.plain = args.plain;
    config.json = global.output == Output::Json;
    // `--state-server`, else a server named with the global `--server`.
    if let Some(url) = args.state_server.as_ref().or(global.server.as_ref()) {
        let client = global
            .connect_to(url)
            .await
            .with_context(|| format!("demo: cannot reach the state server at {url}"))?;
        if !args.replace_existing_state {
            let status = client
                .status()
                .await
                .with_context(|| format!("demo: status of the state server at {url}"))?;
            // The empty name is the server's default gateway: its first.
            let gateway = match client.gateway() {
                "" => status.gateways.first(),
                name => status.gateways.iter().find(|g| g.name == name),
            };
            if let Some(g) = gateway.filter(|g| {
                g.desired_services > 0 || g.desired_egresses > 0 || g.desired_addresses > 0
            }) {
                anyhow::bail!(
                    "demo: the state server at {url} already holds desired state in gateway {:?} \
                     ({} services, {} egresses, {} addresses); the demo would replace it and its \
                     workers would remove the rest from NRP. Point it at a server of its own, or \
                     pass --replace-existing-state",
                    g.name,
                    g.desired_services,
                    g.desired_egresses,
                    g.desired_addresses
                );
            }
        }
        config.external = Some(client);
    }
    let summary = demo::run(&config).await;
    match global.output {
        Output::Json => print_json(&view::DemoView::from(&summary))?,
        Output::Table => {
            out(&format!("\n{}\n{}\n", summary.table(), demo::LEGEND));
        }
    }
    match summary.failure() {
        None if summary.ok() => {
            if global.output == Output::Table {
                out(&format!("{}\n", summary.verdict()));
            }
            Ok(ExitCode::SUCCESS)
        }
        None => anyhow::bail!("no phase was played"),
        Some(e) => anyhow::bail!("{e}"),
    }
}

/// Prints `value` as `output` asks: pretty JSON, or the text `table` renders of it.
pub fn emit<T: serde::Serialize>(
    output: Output,
    value: &T,
    table: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    match output {
        Output::Json => print_json(value),
        Output::Table => {
            out(&table(value));
            Ok(())
        }
    }
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("cannot encode the output as JSON")?;
    out(&format!("{text}\n"));
    JSON_PRINTED.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Whether this process printed a JSON document: a command that fails after printing its outcome
/// (e.g. `apply` with rejected items) has said it all; one that fails before prints its error as
/// JSON instead, so that `-o json` always yields JSON.
static JSON_PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// An error as `-o json` prints it: `{"error": {"message": …, "causes": […]}}`.
pub fn error_json(e: &anyhow::Error) -> serde_json::Value {
    serde_json::json!({
        "error": {
            "message": describe(e),
            "causes": e.chain().map(|c| c.to_string()).collect::<Vec<_>>(),
        }
    })
}

/// Writes `text` to stdout. A failed write is ignored: it means that the reader has gone (a
/// closed pipe, as with `clbctl … | head`), and there is no one left to tell.
pub fn out(text: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

/// Parses a duration: a number with a unit (`500ms`, `30s`, `2m`, `1h 30m`); a bare number is
/// refused.
pub use clb_telemetry::flags::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit() {
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("1.5").is_err());
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3 parsecs").is_err());
        assert!(parse_duration("-1").is_err());
    }

    #[test]
    fn a_server_without_scheme_gets_http_or_https_with_tls_flags() {
        let global = |args: &[&str]| {
            let mut argv = vec!["clbctl"];
            argv.extend_from_slice(args);
            argv.push("diff");
            Cli::try_parse_from(argv).expect("valid").global
        };
        let plain = global(&[]);
        assert_eq!(plain.server(), DEFAULT_SERVER);
        assert_eq!(
            plain.server_url("127.0.0.1:50051").unwrap(),
            "http://127.0.0.1:50051"
        );
        assert_eq!(
            plain.server_url("https://h:1").unwrap(),
            "https://h:1",
            "a URL is kept"
        );
        let tls = global(&["--tls-ca", "/nonexistent/ca.pem"]);
        assert_eq!(tls.server_url("h:443").unwrap(), "https://h:443");
        let e = plain.server_url("grpc://h:1").unwrap_err().to_string();
        assert!(e.contains(r#"the scheme "grpc" is not supported"#), "{e}");
        let e = plain.server_url("http://").unwrap_err().to_string();
        assert!(e.contains("no host"), "{e}");
        assert!(plain.server_url("").is_err());
        // host:port is connected as http:// (the options carry the URL).
        let o = plain.connect_options("127.0.0.1:9").unwrap();
        assert_eq!(o.endpoint, "http://127.0.0.1:9");
    }

    #[test]
    fn the_writer_flag_has_no_other_name() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["clbctl"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv)
        };
        match parse(&["apply", "-f", "-"]).expect("valid").command {
            Command::Apply(a) => assert_eq!(a.writer, "clbctl"),
            other => panic!("unexpected {other:?}"),
        }
        match parse(&["load", "--writer", "l"]).expect("valid").command {
            Command::Load(l) => assert_eq!(l.writer, "l"),
            other => panic!("unexpected {other:?}"),
        }
        for old in [
            &["apply", "-f", "-", "--source", "ops/b"][..],
            &["load", "--source", "l"],
            &["status", "--ca-cert", "ca.pem"],
        ] {
            let e = parse(old).expect_err("an old name");
            assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument, "{old:?}");
        }
    }

    #[test]
    fn tls_follows_the_url_scheme_and_the_ca_file() {
        let cli = Cli::try_parse_from([
            "clbctl",
            "--gateway",
            "gw-2",
            "--connect-attempts",
            "7",
            "diff",
        ])
        .expect("valid");
        let o = cli
            .global
            .connect_options("http://127.0.0.1:1")
            .expect("options");
        assert!(o.tls.is_none());
        assert_eq!((o.attempts, o.gateway.as_str()), (7, "gw-2"));
        let o = cli
            .global
            .connect_options("https://clb.example:443")
            .expect("options");
        assert!(o.tls.as_ref().is_some_and(|t| t.ca.is_none()));

        let ca = std::env::temp_dir().join(format!("clbctl-ca-{}.pem", std::process::id()));
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").expect("write");
        let path = ca.to_str().expect("utf-8");
        let cli = Cli::try_parse_from(["clbctl", "status", "--tls-ca", path]).expect("valid");
        let o = cli
            .global
            .connect_options("https://clb.example")
            .expect("options");
        assert!(o.tls.as_ref().is_some_and(|t| t.ca.is_some()));
        let e = cli
            .global
            .connect_options("http://clb.example")
            .expect_err("CA without TLS");
        assert!(e.to_string().contains("must start with https://"), "{e}");
        let _ = std::fs::remove_file(&ca);
        let cli = Cli::try_parse_from(["clbctl", "status", "--tls-ca", "/no/such/ca.pem"])
            .expect("valid");
        let e = cli
            .global
            .connect_options("https://x")
            .expect_err("missing CA file");
        assert!(
            format!("{e:#}").contains("cannot read the CA file /no/such/ca.pem"),
            "{e:#}"
        );
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn client_certificate_and_token_flags_reach_the_connection() {
        let dir = std::env::temp_dir().join(format!("clbctl-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = |name: &str| {
            let p = dir.join(name);
            std::fs::write(&p, format!("{name}\n")).expect("write");
            p.to_str().expect("utf-8").to_owned()
        };
        let (ca, cert, key, token) = (file("ca"), file("cert"), file("key"), file("token"));
        let cli = Cli::try_parse_from([
            "clbctl",
            "status",
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--token-file",
            &token,
        ])
        .expect("valid");
        let o = cli
            .global
            .connect_options("https://clb.example")
            .expect("options");
        let tls = o.tls.expect("TLS");
        assert_eq!(
            tls.ca,
            Some(clb_client::tls::CaBundle::File(ca.clone().into()))
        );
        assert_eq!(tls.identity, Some((b"cert\n".to_vec(), b"key\n".to_vec())));
        assert_eq!(o.token_file.as_deref(), Some(std::path::Path::new(&token)));
        let e = cli
            .global
            .connect_options("http://clb.example")
            .expect_err("a client certificate without TLS");
        assert!(e.to_string().contains("must start with https://"), "{e}");
        // --tls-cert needs --tls-key.
        assert!(Cli::try_parse_from(["clbctl", "status", "--tls-cert", &cert]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
