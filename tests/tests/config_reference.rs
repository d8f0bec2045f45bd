//! docs/configuration.md, the configuration reference of every binary, is generated from the
//! binaries' own clap definitions (`clap::CommandFactory` on each `Args` type, exported by its
//! library crate) and compared here with the checked-in file, so the reference never drifts from the
//! flags. After changing a flag, regenerate it with
//!
//! ```text
//! CLB_REGENERATE=1 cargo test -p clb-tests --test config_reference
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

/// The command that rewrites docs/configuration.md.
const REGENERATE: &str = "CLB_REGENERATE=1 cargo test -p clb-tests --test config_reference";

fn reference_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md")
}

/// `(binary, what it is, its command)` of every binary, in the order of the reference.
fn binaries() -> Vec<(&'static str, &'static str, clap::Command)> {
    vec![
        (
            "clb-state-server",
            "the state server (Deployment clb-state-server)",
            clb_state_server::config::Args::command(),
        ),
        (
            "clb-sync-worker",
            "the sync workers (Deployment clb-sync-worker)",
            clb_sync_worker::cli::Args::command(),
        ),
        (
            "clb-watcher",
            "the cluster watcher (Deployment clb-watcher) and the node agents (DaemonSet \
             clb-node-agent, with --node)",
            clb_watcher::cli::Args::command(),
        ),
        (
            "clb-webhook",
            "the readiness-gate admission webhook (Deployment clb-webhook, \
             deploy/components/readiness-gate)",
            clb_watcher::webhook::Args::command(),
        ),
        (
            "nrp-emulator",
            "the NRP emulator (demo, benchmarks, end-to-end tests; not deployed)",
            clb_nrp_emulator::cli::Args::command(),
        ),
        (
            "clbctl",
            "the command line (operators)",
            clbctl::cli::Cli::command(),
        ),
    ]
}

/// Help text as Markdown: clap's paragraphs, each line indented by `indent`.
fn paragraphs(text: &str, indent: &str) -> String {
    let mut out = String::new();
    for line in text.trim().lines() {
        if line.trim().is_empty() {
            out.push('\n');
        } else {
            let _ = writeln!(out, "{indent}{}", line.trim_end());
        }
    }
    out
}

/// `--flag <VALUE>`, `-s, --flag`, or `<POSITIONAL>`.
fn signature(arg: &clap::Arg) -> String {
    let values = arg
        .get_value_names()
        .map(|v| v.iter().map(|n| format!("<{n}>")).collect::<Vec<_>>())
        .unwrap_or_else(|| vec![format!("<{}>", arg.get_id().as_str().to_uppercase())]);
    let takes_value = arg.get_action().takes_values();
    let mut s = String::new();
    if let Some(short) = arg.get_short() {
        let _ = write!(s, "-{short}");
        if arg.get_long().is_some() {
            s.push_str(", ");
        }
    }
    match arg.get_long() {
        Some(long) => {
            let _ = write!(s, "--{long}");
            if takes_value {
                let _ = write!(s, " {}", values.join(" "));
            }
        }
        None if arg.get_short().is_none() => s.push_str(&values.join(" ")),
        None => {
            if takes_value {
                let _ = write!(s, " {}", values.join(" "));
            }
        }
    }
    s
}

/// One bullet per argument: signature, then env variable, default, possible values, required,
/// then the help text.
fn render_args<'a>(out: &mut String, args: impl Iterator<Item = &'a clap::Arg>) {
    let mut any = false;
    for arg in args {
        let id = arg.get_id().as_str();
        if arg.is_hide_set() || id == "help" || id == "version" {
            continue;
        }
        any = true;
        let mut facts = Vec::new();
        if arg.is_required_set() {
            facts.push("required".to_owned());
        }
        if let Some(env) = arg.get_env()
            && !arg.is_hide_env_set()
        {
            facts.push(format!("env `{}`", env.to_string_lossy()));
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect();
        if !defaults.is_empty() && !arg.is_hide_default_value_set() {
            let shown: Vec<String> = defaults
                .iter()
                .map(|d| {
                    if d.is_empty() {
                        "\"\"".to_owned()
                    } else {
                        d.clone()
                    }
                })
                .collect();
            facts.push(format!("default `{}`", shown.join(",")));
        }
        let possible: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|p| !p.is_hide_set())
            .map(|p| format!("`{}`", p.get_name()))
            .collect();
        if !possible.is_empty() && arg.get_action().takes_values() {
            facts.push(format!("one of {}", possible.join(", ")));
        }
        if arg.is_global_set() {
            facts.push("global: also after a subcommand".to_owned());
        }
        let _ = write!(out, "- `{}`", signature(arg));
        if !facts.is_empty() {
            let _ = write!(out, " — {}", facts.join("; "));
        }
        out.push('\n');
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        if !help.trim().is_empty() {
            out.push('\n');
            out.push_str(&paragraphs(&help, "  "));
        }
        out.push('\n');
    }
    if !any {
        out.push_str("No options.\n\n");
    }
}

/// A command and, recursively, its subcommands (`path` is how it is invoked).
fn render_command(out: &mut String, cmd: &clap::Command, path: &str, depth: usize) {
    if depth > 0 {
        let _ = writeln!(out, "{} `{path}`\n", "#".repeat((depth + 2).min(6)));
        if let Some(about) = cmd.get_long_about().or_else(|| cmd.get_about()) {
            out.push_str(&paragraphs(&about.to_string(), ""));
            out.push('\n');
        }
    }
    // Global options are listed once, where they are defined.
    let own = cmd
        .get_arguments()
        .filter(|a| depth == 0 || !a.is_global_set());
    render_args(out, own);
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() {
            continue;
        }
        render_command(out, sub, &format!("{path} {}", sub.get_name()), depth + 1);
    }
}

fn render() -> String {
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from the binaries' clap definitions by tests/tests/config_reference.rs: \
         do not edit by hand.\n     Regenerate: ",
    );
    out.push_str(REGENERATE);
    out.push_str(" -->\n\n");
    out.push_str("# Configuration reference\n\n");
    out.push_str(
        "Every flag of every clb binary, generated from the binaries' own flag definitions (and \
         checked by `cargo test`, so it matches the code it is shipped with). A flag with an \
         environment variable can be set either way; the flag wins. Boolean flags shown with a \
         value (`--pods <PODS>`) take `true` or `false` (`--pods=false`); the others are \
         switches. A `<DURATION>` is a number with a unit, `us`, `ms`, `s`, `m`, `h` or `d` \
         (24 h), or several (`50us`, `200ms`, `0.5s`, `30s`, `3m`, `1h 30m`, `365d`); a number \
         without a unit is \
         refused (`--lease=30000` could be seconds or milliseconds), `0` alone excepted. \
         `<binary> --help` prints the same text.\n\n",
    );
    out.push_str("| Binary | Runs as |\n|---|---|\n");
    for (bin, what, _) in binaries() {
        let _ = writeln!(out, "| [`{bin}`](#{bin}) | {what} |");
    }
    out.push('\n');
    for (bin, _, cmd) in binaries() {
        let _ = writeln!(out, "## {bin}\n");
        if let Some(about) = cmd.get_long_about().or_else(|| cmd.get_about()) {
            out.push_str(&paragraphs(&about.to_string(), ""));
            out.push('\n');
        }
        render_command(&mut out, &cmd, bin, 0);
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

#[test]
fn the_configuration_reference_matches_the_flags() {
    let rendered = render();
    let path = reference_path();
    if std::env::var_os("CLB_REGENERATE").is_some_and(|v| v == "1") {
        std::fs::write(&path, &rendered)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != rendered {
        let first = on_disk
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| on_disk.lines().count().min(rendered.lines().count()));
        panic!(
            "docs/configuration.md does not match the binaries' flags (first difference at line \
             {}:\n  checked in: {:?}\n  generated:  {:?}).\nRegenerate it with:\n  {REGENERATE}",
            first + 1,
            on_disk.lines().nth(first).unwrap_or("<end of file>"),
            rendered.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}

#[test]
fn every_flag_of_every_binary_is_in_the_reference() {
    // Independent of the rendering: each long flag and each environment variable appears, in the
    // section of its binary.
    let rendered = render();
    for (bin, _, cmd) in binaries() {
        let start = rendered
            .find(&format!("\n## {bin}\n"))
            .unwrap_or_else(|| panic!("no section for {bin}"));
        let end = rendered[start + 1..]
            .find("\n## ")
            .map_or(rendered.len(), |e| start + 1 + e);
        let section = &rendered[start..end];
        let mut stack = vec![cmd];
        while let Some(c) = stack.pop() {
            for arg in c.get_arguments().filter(|a| !a.is_hide_set()) {
                if let Some(long) = arg.get_long() {
                    assert!(
                        section.contains(&format!("`--{long}"))
                            || section.contains(&format!(", --{long}")),
                        "{bin}: --{long} is missing"
                    );
                }
                if let Some(env) = arg.get_env() {
                    assert!(
                        section.contains(&format!("env `{}`", env.to_string_lossy())),
                        "{bin}: {} is missing",
                        env.to_string_lossy()
                    );
                }
            }
            stack.extend(c.get_subcommands().cloned());
        }
    }
}
