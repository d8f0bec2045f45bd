//! The optional component `deploy/components/readiness-gate` (docs/readiness-gate.md), checked as
//! `tests/tests/manifests.rs` checks the base: rendered with `clb_tests::deploy`, every object
//! parses as its typed Kubernetes object; the webhook's command line parses with `clb-webhook`'s
//! own flag parser and agrees with the watcher's class rules, its certificate files, ports and
//! Service; its pods are set up as every clb workload is (Pod Security `restricted`, probes on the
//! metrics port, Linux nodes, an image from the registry that the Dockerfile builds the binary
//! into); the `MutatingWebhookConfiguration` asks what the webhook answers, never blocks a pod and
//! trusts cert-manager's certificate, whose DNS name is the Service's; the webhook may read
//! Services and Namespaces and nothing more; the watcher may set the gate on pods.

use std::collections::{BTreeMap, BTreeSet};

use clap::{CommandFactory, Parser};
use clb_tests::deploy::{Document, NAMESPACE, Rendered, deploy_dir, watcher_args};
use clb_tests::rbac::{Attributes, Rbac, UserInfo};
use clb_watcher::webhook::{self, Args};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

const COMPONENT: &str = "readiness-gate";
const WORKLOAD: &str = "clb-webhook";

fn load() -> Rendered {
    Rendered::load(&[COMPONENT])
}

/// The documents the component adds.
fn own(m: &Rendered) -> Vec<&Document> {
    let prefix = format!("components/{COMPONENT}/");
    m.documents
        .iter()
        .filter(|d| d.source.starts_with(&prefix))
        .collect()
}

fn template<'a>(m: &'a Rendered, workload: &str) -> &'a PodTemplateSpec {
    m.workloads()
        .into_iter()
        .find(|(n, _)| n == workload)
        .unwrap_or_else(|| panic!("workload {workload} is not rendered"))
        .1
}

fn pod_spec<'a>(m: &'a Rendered, workload: &str) -> &'a PodSpec {
    template(m, workload).spec.as_ref().expect("pod spec")
}

fn labels(t: &PodTemplateSpec) -> BTreeMap<String, String> {
    t.metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The webhook's flags, parsed by `clb-webhook`'s own parser.
fn args(m: &Rendered) -> Args {
    let argv = m.container_argv(WORKLOAD, &Args::command());
    Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

fn port_named(c: &Container, name: &str) -> i32 {
    c.ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{}: no port named {name}", c.name))
        .container_port
}

#[test]
fn the_component_renders_alone_and_with_the_others_and_changes_nothing_of_the_base() {
    let base = Rendered::load(&[]);
    let m = load();
    let kinds: BTreeSet<(String, String)> = own(&m)
        .iter()
        .map(|d| (d.kind().to_owned(), d.name().to_owned()))
        .collect();
    let want: BTreeSet<(String, String)> = [
        ("ServiceAccount", "clb-webhook"),
        ("ClusterRole", "clb-webhook"),
        ("ClusterRoleBinding", "clb-webhook"),
        ("Deployment", "clb-webhook"),
        ("Service", "clb-webhook"),
        ("PodDisruptionBudget", "clb-webhook"),
        ("NetworkPolicy", "clb-webhook"),
        ("Issuer", "clb-webhook-selfsigned"),
        ("Certificate", "clb-webhook"),
        ("MutatingWebhookConfiguration", "clb-readiness-gate"),
        ("ClusterRole", "clb-watcher-readiness-gate"),
        ("ClusterRoleBinding", "clb-watcher-readiness-gate"),
    ]
    .iter()
    .map(|(k, n)| ((*k).to_owned(), (*n).to_owned()))
    .collect();
    assert_eq!(kinds, want);
    // The base's objects are untouched but for one flag: the component turns the watcher's
    // readiness gate on (`--readiness-gate=true`, appended to its args).
    assert_eq!(m.documents.len(), base.documents.len() + want.len());
    for (b, c) in base.documents.iter().zip(&m.documents) {
        let mut c = c.value.clone();
        if b.kind() == "Deployment" && b.name() == "clb-watcher" {
            let args = c["spec"]["template"]["spec"]["containers"][0]["args"]
                .as_array_mut()
                .expect("the watcher's args");
            assert_eq!(
                args.pop().as_ref().and_then(|a| a.as_str()),
                Some("--readiness-gate=true"),
                "the component turns the watcher's gate on"
            );
        }
        assert_eq!(b.value, c, "{} {} changed", b.kind(), b.name());
    }
    let watcher = m.container_argv("clb-watcher", &clb_watcher::cli::Args::command());
    let args = clb_watcher::cli::Args::try_parse_from(&watcher).expect("the watcher's flags");
    assert!(args.readiness_gate, "{watcher:?}");
    for d in own(&m) {
        let cluster_scoped = matches!(
            d.kind(),
            "ClusterRole" | "ClusterRoleBinding" | "MutatingWebhookConfiguration"
        );
        assert_eq!(
            d.namespace(),
            if cluster_scoped { "" } else { NAMESPACE },
            "{}: {} {}",
            d.source,
            d.kind(),
            d.name()
        );
        assert_eq!(
            d.value["metadata"]["labels"]["app.kubernetes.io/part-of"],
            "clb",
            "{}: {} {}",
            d.source,
            d.kind(),
            d.name()
        );
    }
    // With the other components.
    let all = Rendered::load(&[COMPONENT, "watcher-pods", "poolservice", "monitoring"]);
    assert!(
        all.find("MutatingWebhookConfiguration", "clb-readiness-gate")
            .is_some()
    );
}

#[test]
fn the_webhook_command_line_parses_and_agrees_with_the_watcher_and_the_pod() {
    let m = load();
    let c = m.container(WORKLOAD);
    assert_eq!(c.command.as_deref(), Some(&["clb-webhook".to_owned()][..]));
    let a = args(&m);
    // The same class rules as the watcher (the Services the watcher programs are the ones that
    // gate pods).
    let w = watcher_args("watcher.yaml", &[]);
    assert_eq!(
        (a.class.as_str(), a.claim_unclassed),
        (w.class.as_str(), w.claim_unclassed)
    );
    // HTTPS on the port named `webhook`, which the Service's 443 targets.
    assert_eq!(a.listen.ip().to_string(), "0.0.0.0");
    assert_eq!(i32::from(a.listen.port()), port_named(c, "webhook"));
    assert_eq!(a.listen.port(), 9443);
    let svc = m
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("clb-webhook"))
        .expect("Service clb-webhook");
    let spec = svc.spec.as_ref().expect("spec");
    let p443 = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.port == 443)
        .expect("port 443");
    assert_eq!(
        p443.target_port,
        Some(IntOrString::String("webhook".to_owned()))
    );
    assert!(selects(
        spec.selector.as_ref().expect("a selector"),
        &labels(template(&m, WORKLOAD))
    ));
    // The certificate files are in the volume of the Secret the Certificate writes.
    let cert = m.find("Certificate", "clb-webhook").expect("Certificate");
    let secret = cert.value["spec"]["secretName"]
        .as_str()
        .expect("secretName");
    let spec = pod_spec(&m, WORKLOAD);
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.secret
                .as_ref()
                .is_some_and(|s| s.secret_name.as_deref() == Some(secret))
        })
        .unwrap_or_else(|| panic!("no volume of the Secret {secret}"));
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|vm| vm.name == volume.name)
        .expect("the Secret is mounted");
    assert_eq!(mount.read_only, Some(true));
    let dir = std::path::Path::new(&mount.mount_path);
    assert_eq!(a.tls_cert, dir.join("tls.crt"));
    assert_eq!(a.tls_key, dir.join("tls.key"));
    // cert-manager's keys.
    assert_eq!(a.certificate_files().cert.file_name().unwrap(), "tls.crt");
}

#[test]
fn the_webhook_runs_as_every_clb_workload_does() {
    let m = load();
    let d = m
        .deployments
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some(WORKLOAD))
        .expect("Deployment");
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(2));
    let spec = pod_spec(&m, WORKLOAD);
    let watcher = pod_spec(&m, "clb-watcher");
    // The patterns of deploy/watcher.yaml: the pod's and the container's security contexts, the
    // node selector.
    assert_eq!(spec.security_context, watcher.security_context);
    assert_eq!(spec.node_selector, watcher.node_selector);
    assert_eq!(
        spec.node_selector
            .as_ref()
            .and_then(|s| s.get("kubernetes.io/os"))
            .map(String::as_str),
        Some("linux")
    );
    assert_eq!(spec.service_account_name.as_deref(), Some("clb-webhook"));
    assert!(
        m.service_accounts
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some("clb-webhook"))
    );
    assert_ne!(spec.host_network, Some(true));
    let psc = spec.security_context.clone().unwrap_or_default();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(psc.run_as_user, Some(65532), "the image's user");
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    for v in spec.volumes.iter().flatten() {
        assert!(
            v.secret.is_some(),
            "{}: restricted allows secret volumes",
            v.name
        );
    }
    assert_eq!(spec.containers.len(), 1);
    let c = &spec.containers[0];
    assert_eq!(c.security_context, watcher.containers[0].security_context);
    let sc = c.security_context.clone().unwrap_or_default();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert!(
        sc.capabilities
            .and_then(|c| c.drop)
            .is_some_and(|d| d == ["ALL"])
    );
    let requests = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.clone())
        .unwrap_or_default();
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));
    assert!(
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| l.contains_key("memory"))
    );
    // Probes: /healthz and /readyz on the metrics port that --metrics-listen binds.
    let a = args(&m);
    let metrics = a.metrics_listen.expect("--metrics-listen");
    assert_eq!(metrics.ip().to_string(), "0.0.0.0");
    assert_eq!(i32::from(metrics.port()), port_named(c, "metrics"));
    for (probe, path) in [
        (&c.liveness_probe, "/healthz"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let h = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("no {path} probe"));
        assert_eq!(h.path.as_deref(), Some(path));
        assert_eq!(h.port, IntOrString::String("metrics".to_owned()));
        assert_ne!(h.scheme.as_deref(), Some("HTTPS"));
    }
    let window = |p: &k8s_openapi::api::core::v1::Probe| {
        p.period_seconds.unwrap_or(10) * p.failure_threshold.unwrap_or(3)
    };
    assert!(
        window(c.liveness_probe.as_ref().unwrap()) > window(c.readiness_probe.as_ref().unwrap())
    );
    // The image: the kustomization's, and the Dockerfile builds and copies the binary.
    assert_eq!(c.image, m.container("clb-watcher").image);
    let dockerfile = std::fs::read_to_string(deploy_dir().join("Dockerfile")).unwrap();
    let joined = dockerfile.replace("\\\n", " ");
    let build = joined
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("cargo build");
    assert!(build.contains("--bin clb-webhook"), "{build}");
    assert!(dockerfile.contains("target/dist/clb-webhook"));
    // A budget and a policy that select the webhook's pods.
    let pod_labels = labels(template(&m, WORKLOAD));
    let pdb = m
        .pdbs
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(WORKLOAD))
        .expect("PodDisruptionBudget");
    let sel = pdb
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    assert!(selects(&sel, &pod_labels));
}

#[test]
fn the_api_server_reaches_the_webhook_port_from_anywhere() {
    let m = load();
    let policy = m
        .network_policies
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(WORKLOAD))
        .expect("NetworkPolicy clb-webhook");
    let spec = policy.spec.as_ref().expect("spec");
    let sel = spec
        .pod_selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    assert!(selects(&sel, &labels(template(&m, WORKLOAD))));
    let mut open = BTreeSet::new();
    for rule in spec.ingress.iter().flatten() {
        let anywhere = rule.from.as_ref().is_none_or(|f| f.is_empty());
        for p in rule.ports.iter().flatten() {
            if let (true, Some(IntOrString::Int(n))) = (anywhere, &p.port) {
                open.insert(*n);
            }
        }
    }
    let a = args(&m);
    assert!(open.contains(&i32::from(a.listen.port())), "{open:?}");
    assert!(
        open.contains(&i32::from(a.metrics_listen.unwrap().port())),
        "{open:?}"
    );
}

#[test]
fn the_mutating_webhook_configuration_never_blocks_and_asks_what_the_webhook_answers() {
    let m = load();
    let doc = m
        .find("MutatingWebhookConfiguration", "clb-readiness-gate")
        .expect("MutatingWebhookConfiguration clb-readiness-gate");
    assert_eq!(doc.value["apiVersion"], "admissionregistration.k8s.io/v1");
    let config: MutatingWebhookConfiguration =
        serde_json::from_value(doc.value.clone()).expect("a valid MutatingWebhookConfiguration");
    let annotations = config.metadata.annotations.clone().unwrap_or_default();
    let inject = annotations
        .get("cert-manager.io/inject-ca-from")
        .expect("cert-manager injects the CA");
    assert_eq!(inject, "clb-system/clb-webhook");
    let (ns, name) = inject.split_once('/').unwrap();
    let cert = m
        .find("Certificate", name)
        .expect("the injected Certificate");
    assert_eq!(cert.namespace(), ns);
    let hooks = config.webhooks.expect("webhooks");
    assert_eq!(hooks.len(), 1);
    let h = &hooks[0];
    assert!(
        h.name.split('.').count() >= 3,
        "a qualified name: {}",
        h.name
    );
    assert_eq!(h.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(h.side_effects, "None");
    assert_eq!(h.admission_review_versions, ["v1"]);
    assert_eq!(h.timeout_seconds, Some(5));
    assert_eq!(h.reinvocation_policy.as_deref(), Some("Never"));
    // CREATE of v1 pods only.
    let rules = h.rules.clone().unwrap_or_default();
    assert_eq!(rules.len(), 1);
    let r = &rules[0];
    assert_eq!(r.operations.as_deref(), Some(&["CREATE".to_owned()][..]));
    assert_eq!(r.api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(r.api_versions.as_deref(), Some(&["v1".to_owned()][..]));
    assert_eq!(r.resources.as_deref(), Some(&["pods".to_owned()][..]));
    // The Service, its port and the path the webhook serves.
    let service = h
        .client_config
        .service
        .as_ref()
        .expect("a Service reference");
    assert_eq!(
        (service.namespace.as_str(), service.name.as_str()),
        (NAMESPACE, "clb-webhook")
    );
    assert_eq!(service.path.as_deref(), Some(webhook::MUTATE_PATH));
    let port = service.port.unwrap_or(443);
    let svc = m
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("clb-webhook"))
        .unwrap();
    assert!(
        svc.spec
            .as_ref()
            .unwrap()
            .ports
            .iter()
            .flatten()
            .any(|p| p.port == port)
    );
    assert!(h.client_config.url.is_none());
    // Only namespaces that ask for the gate.
    let ns_sel = h.namespace_selector.clone().expect("namespaceSelector");
    assert_eq!(
        ns_sel.match_labels,
        Some(BTreeMap::from([(
            webhook::INJECT_LABEL.to_owned(),
            webhook::INJECT_LABEL_VALUE.to_owned()
        )]))
    );
    assert!(ns_sel.match_expressions.is_none());
    // Pods that already carry the label (gated by hand, or opted out) are not sent.
    let obj_sel = h.object_selector.clone().expect("objectSelector");
    assert!(obj_sel.match_labels.is_none());
    let exprs = obj_sel.match_expressions.unwrap_or_default();
    assert_eq!(exprs.len(), 1);
    assert_eq!(exprs[0].key, webhook::GATE_LABEL);
    assert_eq!(exprs[0].operator, "DoesNotExist");
    // And the webhook's own pods are never sent to it (their namespace is not labelled).
    assert!(
        !m.namespaces[0]
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .contains_key(webhook::INJECT_LABEL)
    );
}

#[test]
fn the_certificate_is_for_the_service_from_a_self_signed_issuer() {
    let m = load();
    let cert = m.find("Certificate", "clb-webhook").expect("Certificate");
    assert_eq!(cert.value["apiVersion"], "cert-manager.io/v1");
    let names: Vec<&str> = cert.value["spec"]["dnsNames"]
        .as_array()
        .expect("dnsNames")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let svc = m
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("clb-webhook"))
        .unwrap();
    let dns = format!(
        "{}.{}.svc",
        svc.metadata.name.as_deref().unwrap(),
        svc.metadata.namespace.as_deref().unwrap()
    );
    assert_eq!(dns, "clb-webhook.clb-system.svc");
    assert!(names.contains(&dns.as_str()), "{names:?}");
    assert_eq!(cert.value["spec"]["secretName"], "clb-webhook-tls");
    let usages = &cert.value["spec"]["usages"];
    assert!(
        usages.as_array().unwrap().contains(&json!("server auth")),
        "{usages}"
    );
    let issuer_ref = &cert.value["spec"]["issuerRef"];
    assert_eq!(issuer_ref["kind"], "Issuer");
    let issuer = m
        .find("Issuer", issuer_ref["name"].as_str().unwrap())
        .expect("the Issuer");
    assert_eq!(issuer.namespace(), cert.namespace());
    assert_eq!(issuer.value["apiVersion"], "cert-manager.io/v1");
    assert_eq!(issuer.value["spec"], json!({"selfSigned": {}}));
}

/// `(group, resource, verb)` of the cluster-wide rules bound to `account`.
fn grants(rbac: &Rbac, account: &str) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in rbac.rules_for(&UserInfo::service_account(NAMESPACE, account), "") {
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    out
}

fn may(rbac: &Rbac, account: &str, (resource, sub, verb): (&str, &str, &str)) -> bool {
    let mut attrs = Attributes::new(verb, "", resource).subresource(sub);
    if !matches!(verb, "list" | "watch") {
        attrs = attrs.namespace("default").name("x");
    }
    rbac.authorize(&UserInfo::service_account(NAMESPACE, account), &attrs)
        .allowed
}

#[test]
fn the_webhook_reads_services_and_namespaces_and_nothing_more() {
    let m = load();
    let rbac = m.rbac();
    let want: BTreeSet<(String, String, String)> = ["services", "namespaces"]
        .iter()
        .flat_map(|r| {
            ["get", "list", "watch"]
                .iter()
                .map(move |v| (String::new(), (*r).to_owned(), (*v).to_owned()))
        })
        .collect();
    assert_eq!(grants(&rbac, "clb-webhook"), want);
    assert!(
        rbac.namespaced_rules_for(
            &UserInfo::service_account(NAMESPACE, "clb-webhook"),
            NAMESPACE
        )
        .is_empty(),
        "no namespaced role"
    );
    // Evaluated: what the reflectors call is allowed, a write is not.
    for call in [
        ("services", "", "list"),
        ("services", "", "watch"),
        ("namespaces", "", "list"),
        ("namespaces", "", "watch"),
    ] {
        assert!(may(&rbac, "clb-webhook", call), "{call:?}");
    }
    for call in [
        ("pods", "", "list"),
        ("services", "", "patch"),
        ("namespaces", "", "patch"),
        ("secrets", "", "get"),
    ] {
        assert!(!may(&rbac, "clb-webhook", call), "{call:?}");
    }
}

#[test]
fn the_watcher_may_read_pods_and_set_the_gate_with_the_component_only() {
    let with = load().rbac();
    let without = Rendered::load(&[]).rbac();
    for call in [
        ("pods", "status", "patch"),
        ("pods", "", "get"),
        ("pods", "", "list"),
        ("pods", "", "watch"),
    ] {
        assert!(may(&with, "clb-watcher", call), "{call:?}");
    }
    assert!(!may(&without, "clb-watcher", ("pods", "status", "patch")));
    // What the component adds to the watcher: exactly that (the base lists pods already: the egress
    // pods a NAT gateway Event regards).
    assert!(may(&without, "clb-watcher", ("pods", "", "list")));
    let added: BTreeSet<_> = grants(&with, "clb-watcher")
        .difference(&grants(&without, "clb-watcher"))
        .cloned()
        .collect();
    let want: BTreeSet<(String, String, String)> =
        [("pods", "get"), ("pods", "watch"), ("pods/status", "patch")]
            .iter()
            .map(|(r, v)| (String::new(), (*r).to_owned(), (*v).to_owned()))
            .collect();
    assert_eq!(added, want);
    // Not the pods themselves: the condition is status.
    assert!(!may(&with, "clb-watcher", ("pods", "", "patch")));
    // The binding names the watcher's ServiceAccount.
    let binding = load()
        .find("ClusterRoleBinding", "clb-watcher-readiness-gate")
        .expect("binding")
        .value
        .clone();
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "clb-watcher", "namespace": NAMESPACE}])
    );
    assert_eq!(binding["roleRef"]["name"], "clb-watcher-readiness-gate");
}
