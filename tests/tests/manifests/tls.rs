//! TLS on the gRPC port as deploy/ ships it (docs/security.md, "Transport"): the state server's
//! own certificate and what it may touch for it, every client on `https://` trusting the bundle it
//! publishes, and the cert-manager component.

use super::*;
use clb_state_server::pki;
use k8s_openapi::api::core::v1::Volume;

/// The calls `--tls-self-managed` makes (group, resource, verb).
pub const STATE_SERVER_TLS_CALLS: &[(&str, &str, &str)] = &[
    ("", "secrets", "create"),
    ("", "secrets", "get"),
    ("", "secrets", "update"),
    ("", "secrets", "list"),
    ("", "secrets", "watch"),
    ("", "configmaps", "create"),
    ("", "configmaps", "get"),
    ("", "configmaps", "update"),
];

const NS: &str = clb_tests::deploy::NAMESPACE;

fn server_args(m: &Rendered) -> clb_state_server::config::Args {
    let argv = m.command_line(
        m.container("clb-state-server"),
        &clb_state_server::config::Args::command(),
    );
    let args = <clb_state_server::config::Args as clap::Parser>::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    args.validate().expect("valid flags");
    args
}

#[test]
fn the_state_server_may_keep_only_its_own_certificate() {
    let m = load();
    let args = server_args(&m);
    assert!(args.self_managed.tls_self_managed, "deploy/ ships TLS");
    let (secret, bundle) = (
        args.self_managed.tls_secret.as_str(),
        args.self_managed.tls_ca_bundle.as_str(),
    );
    assert_eq!((secret, bundle), ("clb-state-server-tls", "clb-ca-bundle"));
    let rbac = m.rbac();
    let server = UserInfo::service_account(NS, "clb-state-server");
    let allowed = |verb: &str, resource: &str, ns: &str, name: &str| {
        let mut a = Attributes::new(verb, "", resource).namespace(ns);
        if !name.is_empty() {
            a = a.name(name);
        }
        rbac.authorize(&server, &a).allowed
    };
    for &(_, resource, verb) in STATE_SERVER_TLS_CALLS {
        let own = if resource == "secrets" {
            secret
        } else {
            bundle
        };
        if verb == "create" {
            assert!(allowed(verb, resource, NS, ""), "create {resource}");
            assert!(
                !allowed(verb, resource, "default", ""),
                "create {resource} elsewhere"
            );
            continue;
        }
        // get, update, and list/watch by name (a metadata.name field selector).
        assert!(allowed(verb, resource, NS, own), "{verb} {resource} {own}");
        assert!(
            !allowed(verb, resource, NS, "another"),
            "{verb} {resource} of another object"
        );
        assert!(
            !allowed(verb, resource, "default", own),
            "{verb} {resource} elsewhere"
        );
    }
    // Not a list of every Secret, not a delete.
    assert!(!allowed("list", "secrets", NS, ""));
    assert!(!allowed("delete", "secrets", NS, secret));
    assert!(!allowed("update", "configmaps", NS, "clb-gateways"));
}

/// The volume of `workload` mounted at the directory of `path`, and the file's name in it.
fn volume_of(m: &Rendered, workload: &str, path: &str) -> (Volume, String) {
    let c = m.container(workload);
    let (dir, file) = path.rsplit_once('/').expect("a path");
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|v| v.mount_path.trim_end_matches('/') == dir)
        .unwrap_or_else(|| panic!("{workload}: nothing is mounted at {dir}"));
    let (_, t) = m
        .workloads()
        .into_iter()
        .find(|(n, _)| n == workload)
        .expect("workload");
    let v = t
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == mount.name)
        .expect("the mount's volume");
    (v, file.to_owned())
}

const CLIENTS: [(&str, &str); 3] = [
    ("clb-watcher", "clb-watcher"),
    ("clb-node-agent", "clb-watcher"),
    ("clb-sync-worker", "clb-sync-worker"),
];

fn flag<'a>(m: &'a Rendered, workload: &str, name: &str) -> &'a str {
    m.container(workload)
        .args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
        .unwrap_or_else(|| panic!("{workload}: no --{name}"))
}

#[test]
fn every_client_reaches_the_state_server_over_tls_trusting_the_published_bundle() {
    let m = load();
    let names = pki::service_names("clb-state-server", NS, &[]);
    assert!(m.find("Service", "clb-state-server").is_some());
    for (workload, _) in CLIENTS {
        let server = flag(&m, workload, "server");
        let host = server
            .strip_prefix("https://")
            .unwrap_or_else(|| panic!("{workload}: --server={server} is not https://"))
            .rsplit_once(':')
            .expect("host:port")
            .0;
        assert!(
            names.iter().any(|n| n == host),
            "{workload}: the server's certificate names {names:?}, not {host}"
        );
        let (volume, file) = volume_of(&m, workload, flag(&m, workload, "tls-ca"));
        let cm = volume
            .config_map
            .unwrap_or_else(|| panic!("{workload}: --tls-ca is not on the CA bundle's ConfigMap"));
        assert_eq!(cm.name, "clb-ca-bundle", "{workload}");
        assert_eq!(
            file,
            pki::keys::BUNDLE,
            "{workload}: the key the server publishes"
        );
        assert!(
            cm.optional != Some(true),
            "{workload}: the pod must wait for the bundle"
        );
        assert!(
            !m.container(workload)
                .args
                .iter()
                .flatten()
                .any(|a| a.starts_with("--insecure-plaintext")),
            "{workload}"
        );
    }
}

#[test]
fn the_cert_manager_component_gives_the_server_files_and_the_clients_only_the_ca() {
    let with = Rendered::load(&["cert-manager"]);
    let args = server_args(&with);
    assert!(!args.self_managed.tls_self_managed);
    let (cert, key) = (
        args.tls_cert.clone().expect("--tls-cert"),
        args.tls_key.clone().expect("--tls-key"),
    );
    for path in [&cert, &key] {
        let (v, _) = volume_of(&with, "clb-state-server", path.to_str().expect("utf-8"));
        assert_eq!(
            v.secret.and_then(|s| s.secret_name).as_deref(),
            Some("clb-state-server-cert")
        );
    }
    assert!(with.find("Role", "clb-state-server-tls").is_none());
    assert!(with.find("RoleBinding", "clb-state-server-tls").is_none());
    let certificate = with
        .find("Certificate", "clb-state-server")
        .expect("the Certificate");
    let dns: Vec<String> = certificate.value["spec"]["dnsNames"]
        .as_array()
        .expect("dnsNames")
        .iter()
        .map(|n| n.as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(dns, pki::service_names("clb-state-server", NS, &[]));
    for (workload, _) in CLIENTS {
        let (v, file) = volume_of(&with, workload, flag(&with, workload, "tls-ca"));
        assert!(v.config_map.is_none(), "{workload}");
        let s = v.secret.expect("the Secret");
        assert_eq!(s.secret_name.as_deref(), Some("clb-state-server-cert"));
        let items: Vec<_> = s
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|i| (i.key, i.path))
            .collect();
        assert_eq!(
            items,
            [("ca.crt".to_owned(), file)],
            "{workload}: only the CA, never the key"
        );
    }
}
