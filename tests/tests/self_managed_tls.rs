//! `--tls-self-managed` of two replicas against the fake Kubernetes API: they race to create the
//! Secret and the CA bundle (one wins, the other meets `409` and reads again) and end up presenting
//! the same certificate; a deleted Secret is replaced by a new CA, published and presented by both;
//! a replica that did not write follows the other's renewal through its watch.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser as _;
use clb_state_server::config::Args;
use clb_state_server::self_managed::SelfManaged;
use clb_state_server::tls_listener::ServingCertificate;
use clb_tests::PATIENCE;
use clb_tests::deploy::NAMESPACE;
use clb_tests::fake_kube::FakeApi;

fn replica(api: &FakeApi) -> (SelfManaged, Arc<ServingCertificate>) {
    let args = Args::try_parse_from(["clb-state-server", "--tls-self-managed"]).unwrap();
    let mut config = api.kube_config();
    config.default_namespace = NAMESPACE.into();
    let certificate = ServingCertificate::empty();
    let client = kube::Client::try_from(config).unwrap();
    (
        SelfManaged::new(&args.self_managed, client, certificate.clone()),
        certificate,
    )
}

fn bundle(api: &FakeApi) -> String {
    api.get("configmaps", NAMESPACE, "clb-ca-bundle")
        .and_then(|cm| cm.pointer("/data/ca.crt")?.as_str().map(str::to_owned))
        .expect("the CA bundle")
}

fn secret_ca(api: &FakeApi) -> String {
    use base64::Engine as _;
    let s = api
        .get("secrets", NAMESPACE, "clb-state-server-tls")
        .expect("the Secret");
    let ca = s["data"]["ca.crt"].as_str().expect("ca.crt");
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(ca)
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_issue_one_certificate_and_follow_each_others_changes() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let api = FakeApi::start().await;
    let (a, a_cert) = replica(&api);
    let (b, b_cert) = replica(&api);

    // Both at once: one certificate, one bundle, presented by both.
    let (ra, rb) = tokio::join!(a.reconcile(), b.reconcile());
    ra.expect("replica a");
    rb.expect("replica b");
    let first = a_cert.chain().expect("a presents a certificate");
    assert_eq!(b_cert.chain(), Some(first.clone()), "the same certificate");
    assert_eq!(api.objects("secrets").len(), 1);
    assert_eq!(
        bundle(&api),
        secret_ca(&api),
        "the bundle is the Secret's CA"
    );

    // The Secret deleted (an operator replacing a leaked key): replica a makes a new one; b,
    // running, follows through its watch.
    let stop = tokio_util::sync::CancellationToken::new();
    let follower = tokio::spawn(b.clone().run(stop.clone()));
    let old_bundle = bundle(&api);
    api.delete("secrets", NAMESPACE, "clb-state-server-tls");
    a.reconcile().await.expect("replica a after the deletion");
    let renewed = a_cert.chain().expect("a certificate");
    assert_ne!(renewed, first, "a new certificate");
    assert_ne!(bundle(&api), old_bundle, "a new CA published");
    assert_eq!(bundle(&api), secret_ca(&api));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while b_cert.chain().as_ref() != Some(&renewed) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "replica b never presented the new certificate"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    follower.await.unwrap();
}
