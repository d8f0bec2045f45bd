//! The flags of the manifests in `deploy/`, parsed by the binaries' own parsers, for tests that must
//! run what is shipped.

use std::path::Path;

use clap::{CommandFactory, Parser};
use clb_state_server::config::Args;

/// The command line of the first container of the Deployment or DaemonSet in `deploy/<file>`: its
/// args, then its `CLB_*` environment entries with literal values turned into the flags of `cmd`
/// that read them (values from the downward API are left out).
fn container_argv(file: &str, cmd: &clap::Command) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("deploy/{file}: {e}"));
    let mut argv = vec![cmd.get_name().to_owned()];
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let doc = <serde_yaml::Value as serde::Deserialize>::deserialize(doc).expect("YAML");
        if !matches!(doc["kind"].as_str(), Some("Deployment" | "DaemonSet")) {
            continue;
        }
        let container = &doc["spec"]["template"]["spec"]["containers"][0];
        for a in container["args"].as_sequence().into_iter().flatten() {
            argv.push(a.as_str().expect("string arg").to_owned());
        }
        for e in container["env"].as_sequence().into_iter().flatten() {
            let (Some(name), Some(value)) = (e["name"].as_str(), e["value"].as_str()) else {
                continue;
            };
            if let Some(arg) = cmd
                .get_arguments()
                .find(|a| a.get_env().and_then(|v| v.to_str()) == Some(name))
            {
                argv.push(format!("--{}={value}", arg.get_long().expect("long flag")));
            }
        }
    }
    argv
}

/// The state server's arguments as `deploy/state-server.yaml` runs it, parsed and validated by
/// `clb-state-server`'s own parser.
pub fn state_server_args() -> Args {
    let argv = container_argv("state-server.yaml", &Args::command());
    let args = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    args.validate().expect("valid flags");
    args
}

/// The watcher's arguments as `deploy/watcher.yaml` (cluster mode) or `deploy/node-agent.yaml`
/// runs it, parsed by `clb-watcher`'s own parser; `overrides` (`--flag=value`, e.g. the server's
/// URL or the node) replace the manifest's value of the same flag.
pub fn watcher_args(file: &str, overrides: &[String]) -> clb_watcher::cli::Args {
    let mut argv = container_argv(file, &clb_watcher::cli::Args::command());
    for o in overrides {
        let flag = o.split_once('=').map_or(o.as_str(), |(f, _)| f);
        argv.retain(|a| a != flag && !a.starts_with(&format!("{flag}=")));
        argv.push(o.clone());
    }
    clb_watcher::cli::Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}
