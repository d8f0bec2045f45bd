//! The flags of the manifests in `deploy/`, parsed by the binaries' own parsers, for tests that must
//! run what is shipped.

use std::path::Path;

use clap::{CommandFactory, Parser};
use clb_state_server::config::Args;

/// The state server's arguments as `deploy/state-server.yaml` runs it: the container's args, then
/// the `CLB_*` environment entries with literal values (values from the downward API are left
/// out), parsed and validated by `clb-state-server`'s own parser.
pub fn state_server_args() -> Args {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/state-server.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/state-server.yaml");
    let mut argv = vec!["clb-state-server".to_owned()];
    let cmd = Args::command();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let doc = <serde_yaml::Value as serde::Deserialize>::deserialize(doc).expect("YAML");
        if doc["kind"].as_str() != Some("Deployment") {
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
    let args = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    args.validate().expect("valid flags");
    args
}
