//! `clb-webhook` over HTTPS, in process: the webhook's server ([`webhook::serve`]) on loopback
//! with a test certificate (`tests/support/pki.rs`), its Services from the fake Kubernetes API
//! (`clb_tests::fake_kube::FakeApi`, through a kube client and a reflector, as the binary keeps
//! them) and its Namespaces fed to their store directly (the fake API serves no namespaces).
//! AdmissionReviews are posted exactly as the API server posts them; the base64 JSON patch of
//! each answer is applied to the pod with the `json-patch` crate and the result checked. Also:
//! malformed bodies (400), the metrics, and a renewed certificate presented without a restart.

#[path = "../support/pki.rs"]
mod pki;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use clb_tests::fake_kube::FakeApi;
use clb_watcher::translate::TranslatorConfig;
use clb_watcher::webhook::{
    self, CertificateFiles, GATE_CONDITION_TYPE, GATE_LABEL, INJECT_LABEL, ReloadingCertificate,
    Stores, Webhook, WebhookMetrics,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use pki::Pki;
use serde_json::{Value, json};

const UID: &str = "b6c2f5a0-3f7e-4c61-9a53-0d4e2f1c8a77";

/// A pod as the API server has it when it calls mutating webhooks on CREATE: created by a
/// ReplicaSet (no name yet, a `generateName`), defaulted, with the projected token volume.
fn pod(namespace: &str, labels: Value) -> Value {
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "generateName": "web-5d8f7c9b4-",
            "namespace": namespace,
            "creationTimestamp": null,
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f7c9b4",
                "uid": "1f0e9d8c-7b6a-4958-8a7b-6c5d4e3f2a1b", "controller": true,
                "blockOwnerDeletion": true
            }],
            "managedFields": [{
                "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                "time": "2025-06-01T10:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}}}}
            }]
        },
        "spec": {
            "volumes": [{
                "name": "kube-api-access-x7k2p",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt",
                                       "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
                    ],
                    "defaultMode": 420
                }
            }],
            "containers": [{
                "name": "web",
                "image": "nginx:1.27",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "readinessProbe": {"httpGet": {"path": "/", "port": 8080, "scheme": "HTTP"},
                                   "timeoutSeconds": 1, "periodSeconds": 10,
                                   "successThreshold": 1, "failureThreshold": 3},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300}
            ],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {}
    })
}

/// The AdmissionReview the API server posts for the CREATE of `object` in `namespace`.
fn review(namespace: &str, object: &Value) -> Value {
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": UID,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "",
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                           "system:authenticated"]
            },
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

fn service(namespace: &str, name: &str, class: Option<&str>, selector: Value) -> Value {
    let mut spec = json!({
        "type": "LoadBalancer",
        "selector": selector,
        "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    });
    if let Some(c) = class {
        spec["loadBalancerClass"] = json!(c);
    }
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}")},
        "spec": spec
    })
}

fn namespace(name: &str, labels: Value) -> Namespace {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

/// An HTTPS client that trusts only the CA `ca_pem`.
fn client(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()])
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

struct Running {
    url: String,
    client: reqwest::Client,
    webhook: Webhook,
    certificate: Arc<ReloadingCertificate>,
    fake: FakeApi,
    namespaces: reflector::store::Writer<Namespace>,
    pki: Pki,
}

impl Running {
    async fn start(name: &str) -> Self {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let pki = Pki::new(name);
        let fake = FakeApi::start().await;
        // Services: cluster-wide, from the fake API, as the binary watches them.
        fake.put(
            "services",
            service("shop", "web", None, json!({"app": "web"})),
        );
        fake.put(
            "services",
            service("plain", "web", None, json!({"app": "web"})),
        );
        fake.put(
            "services",
            service(
                "shop",
                "aws",
                Some("service.k8s.aws/nlb"),
                json!({"app": "legacy"}),
            ),
        );
        let (services, watch) = webhook::reflect_services(fake.kube_client());
        tokio::spawn(watch);
        // Namespaces: fed here.
        let (namespaces, mut writer) = reflector::store::<Namespace>();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(namespace(
            "shop",
            json!({INJECT_LABEL: "enabled", "kubernetes.io/metadata.name": "shop"}),
        )));
        writer.apply_watcher_event(&Event::InitApply(namespace(
            "plain",
            json!({"kubernetes.io/metadata.name": "plain"}),
        )));
        writer.apply_watcher_event(&Event::InitDone);
        let stores = Stores::new(services, namespaces);
        tokio::time::timeout(Duration::from_secs(10), stores.wait_until_ready())
            .await
            .expect("the Services are listed from the fake API")
            .unwrap();
        let webhook = Webhook::new(
            stores,
            TranslatorConfig::default(),
            Arc::new(WebhookMetrics::new()),
        );
        let certificate = ReloadingCertificate::load(CertificateFiles {
            cert: pki.path("server.pem"),
            key: pki.path("server.key"),
        })
        .expect("the test certificate loads");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(webhook::serve(
            listener,
            certificate.clone(),
            webhook.clone(),
            std::future::pending(),
        ));
        Self {
            url: format!("https://localhost:{port}"),
            client: client(&pki.ca),
            webhook,
            certificate,
            fake,
            namespaces: writer,
            pki,
        }
    }

    /// Posts `body` to `/mutate-pods` as the API server does (with its `timeout` query).
    async fn post(&self, body: Vec<u8>) -> reqwest::Response {
        self.client
            .post(format!("{}/mutate-pods?timeout=5s", self.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, */*")
            .body(body)
            .send()
            .await
            .expect("the webhook answers")
    }

    /// Posts the review of `object` in `ns`; the answer and the object with the answer's patch
    /// applied (the object itself when there is no patch).
    async fn admit(&self, ns: &str, object: &Value) -> (Value, Value) {
        let resp = self
            .post(serde_json::to_vec(&review(ns, object)).unwrap())
            .await;
        assert_eq!(resp.status(), 200);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json")
        );
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1", "{answer}");
        assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
        assert_eq!(answer["response"]["uid"], UID, "{answer}");
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        let mut patched = object.clone();
        match answer["response"]["patch"].as_str() {
            Some(b64) => {
                assert_eq!(answer["response"]["patchType"], "JSONPatch", "{answer}");
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .expect("the patch is base64");
                let patch: json_patch::Patch =
                    serde_json::from_slice(&bytes).expect("the patch is a JSON patch");
                json_patch::patch(&mut patched, &patch).expect("the patch applies to the pod");
            }
            None => assert!(answer["response"].get("patchType").is_none(), "{answer}"),
        }
        (answer, patched)
    }
}

fn gates(pod: &Value) -> Vec<String> {
    pod["spec"]["readinessGates"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| g["conditionType"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_a_clb_service_selects_gets_the_gate_and_the_label_over_https() {
    let r = Running::start("webhook-gate").await;
    let object = pod(
        "shop",
        json!({"app": "web", "pod-template-hash": "5d8f7c9b4"}),
    );
    let (_, patched) = r.admit("shop", &object).await;
    assert_eq!(gates(&patched), [GATE_CONDITION_TYPE]);
    assert_eq!(
        patched["metadata"]["labels"],
        json!({"app": "web", "pod-template-hash": "5d8f7c9b4", GATE_LABEL: "true"})
    );
    // The result is a valid Pod, and only the gate and the label changed.
    let typed: Pod = serde_json::from_value(patched.clone()).expect("a Pod");
    assert_eq!(
        typed.spec.unwrap().readiness_gates.unwrap()[0].condition_type,
        "clb.azure.com/programmed"
    );
    let mut back = patched;
    back["spec"]
        .as_object_mut()
        .unwrap()
        .remove("readinessGates");
    back["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove(GATE_LABEL);
    assert_eq!(back, object);

    // A pod whose template already lists a gate of its own: ours is appended.
    let mut own = pod("shop", json!({"app": "web"}));
    own["spec"]["readinessGates"] = json!([{"conditionType": "example.com/warm"}]);
    let (_, patched) = r.admit("shop", &own).await;
    assert_eq!(gates(&patched), ["example.com/warm", GATE_CONDITION_TYPE]);

    // The namespace `plain` is not labelled: no patch, although a clb Service selects the pod.
    let object = pod("plain", json!({"app": "web"}));
    let (answer, patched) = r.admit("plain", &object).await;
    assert!(answer["response"].get("patch").is_none(), "{answer}");
    assert_eq!(patched, object);

    // In `shop`, a pod only a Service of another class selects, and one no Service selects.
    for labels in [json!({"app": "legacy"}), json!({"app": "batch"})] {
        let object = pod("shop", labels);
        let (answer, _) = r.admit("shop", &object).await;
        assert!(answer["response"].get("patch").is_none(), "{answer}");
    }

    // A Service created later (seen through the watch) selects the next such pod.
    r.fake.put(
        "services",
        service("shop", "batch", None, json!({"app": "batch"})),
    );
    let object = pod("shop", json!({"app": "batch"}));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (answer, patched) = r.admit("shop", &object).await;
        if answer["response"].get("patch").is_some() {
            assert_eq!(gates(&patched), [GATE_CONDITION_TYPE]);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new Service is not seen"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let m = r.webhook.metrics();
    assert_eq!(m.admissions("patched"), 3);
    assert!(m.admissions("unchanged") >= 3);
    assert_eq!(m.admissions("error"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_labelled_later_is_injected_and_malformed_bodies_get_400() {
    let mut r = Running::start("webhook-ns").await;
    let object = pod("plain", json!({"app": "web"}));
    let (answer, _) = r.admit("plain", &object).await;
    assert!(answer["response"].get("patch").is_none(), "{answer}");
    // The namespace gets the label (a MODIFIED event of the namespace watch).
    r.namespaces.apply_watcher_event(&Event::Apply(namespace(
        "plain",
        json!({INJECT_LABEL: "enabled"}),
    )));
    let (_, patched) = r.admit("plain", &object).await;
    assert_eq!(gates(&patched), [GATE_CONDITION_TYPE]);

    // Malformed bodies: 400 with the reason; the webhook keeps serving.
    for (body, want) in [
        (b"".to_vec(), "the body is not JSON"),
        (b"{\"kind\":".to_vec(), "the body is not JSON"),
        (
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#.to_vec(),
            "expected admission.k8s.io/v1 AdmissionReview",
        ),
        (
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            "no request object",
        ),
        (
            serde_json::to_vec(&{
                let mut v = review("plain", &object);
                v["request"]["kind"] = json!("Pod");
                v
            })
            .unwrap(),
            "the AdmissionReview's request does not decode",
        ),
    ] {
        let resp = r.post(body).await;
        assert_eq!(resp.status(), 400);
        let text = resp.text().await.unwrap();
        assert!(text.contains(want), "{text:?} does not contain {want:?}");
    }
    let resp = r
        .client
        .get(format!("{}/mutate-pods", r.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    let (_, patched) = r.admit("plain", &object).await;
    assert_eq!(gates(&patched), [GATE_CONDITION_TYPE]);

    // The metrics endpoint: the counters, and ready (the stores are synced).
    let (addr, _) = clb_telemetry::metrics::spawn(
        "127.0.0.1:0".parse().unwrap(),
        r.webhook.metrics_router(),
        std::future::pending(),
    )
    .await
    .unwrap();
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let text = plain
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "clb_webhook_admissions_total{result=\"patched\"} 2",
        "clb_webhook_admissions_total{result=\"unchanged\"} 1",
        "clb_webhook_admissions_total{result=\"error\"} 5",
        "clb_webhook_stores_synced 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
    }
    let ready = plain
        .get(format!("http://{addr}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_presented_without_a_restart() {
    let r = Running::start("webhook-old").await;
    let object = pod("shop", json!({"app": "web"}));
    r.admit("shop", &object).await;
    let reloads = tokio::spawn(
        r.certificate
            .clone()
            .run_reloads(Duration::from_millis(100)),
    );
    // cert-manager renews: a new key and certificate (here from another CA) in the same files.
    let renewed = Pki::new("webhook-new");
    r.pki.write("server.pem", &renewed.server_cert);
    r.pki.write("server.key", &renewed.server_key);
    let fresh = client(&renewed.ca);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let sent = fresh
            .post(format!("{}/mutate-pods", r.url))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&review("shop", &object)).unwrap())
            .send()
            .await;
        if let Ok(resp) = sent {
            assert_eq!(resp.status(), 200);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the renewed certificate is not presented"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A new connection trusting only the old CA fails now.
    let old = client(&r.pki.ca);
    assert!(
        old.post(format!("{}/mutate-pods", r.url))
            .body("{}")
            .send()
            .await
            .is_err()
    );
    // A key that is not the certificate's: the renewed certificate stays in use.
    r.pki.write("server.key", &r.pki.client_key);
    assert!(r.certificate.reload().is_err());
    assert!(matches!(r.certificate.reload(), Ok(false)), "tried once");
    let resp = client(&renewed.ca)
        .post(format!("{}/mutate-pods", r.url))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&review("shop", &object)).unwrap())
        .send()
        .await
        .expect("still served");
    assert_eq!(resp.status(), 200);
    reloads.abort();
}

/// A free port on 127.0.0.1 (bound, then released for the server to bind).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_webhook_fails_open_until_it_has_listed_namespaces() {
    // `webhook::run` as the binary runs it, against the fake API, which serves Services but no
    // Namespaces: the webhook never completes its lists, so it is not ready and allows every pod
    // as it is.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let pki = Pki::new("webhook-run");
    let fake = FakeApi::start().await;
    fake.put(
        "services",
        service("shop", "web", None, json!({"app": "web"})),
    );
    let (port, metrics_port) = (free_port(), free_port());
    let args = <webhook::Args as clap::Parser>::try_parse_from([
        "clb-webhook".to_owned(),
        format!("--listen=127.0.0.1:{port}"),
        format!("--tls-cert={}", pki.path_str("server.pem")),
        format!("--tls-key={}", pki.path_str("server.key")),
        format!("--metrics-listen=127.0.0.1:{metrics_port}"),
    ])
    .unwrap();
    let certificate = ReloadingCertificate::load(args.certificate_files()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(webhook::run(
        args,
        certificate,
        fake.kube_client(),
        async move {
            let _ = stopped.await;
        },
    ));
    let https = client(&pki.ca);
    let object = pod("shop", json!({"app": "web"}));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let answer: Value = loop {
        let sent = https
            .post(format!("https://localhost:{port}/mutate-pods?timeout=5s"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&review("shop", &object)).unwrap())
            .send()
            .await;
        match sent {
            Ok(resp) => break resp.json().await.unwrap(),
            Err(e) => assert!(tokio::time::Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(answer["response"]["uid"], UID);
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none(), "{answer}");
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let ready = plain
        .get(format!("http://127.0.0.1:{metrics_port}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let text = plain
        .get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "clb_webhook_admissions_total{result=\"unchanged\"} 1",
        "clb_webhook_admissions_total{result=\"patched\"} 0",
        "clb_webhook_stores_synced 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
    }
    // It listed Services (and tried Namespaces) cluster-wide.
    let requests = fake.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("GET /api/v1/services?")),
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("GET /api/v1/namespaces?")),
        "{requests:?}"
    );
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("it stops on shutdown")
        .unwrap()
        .expect("and returns Ok");
}
