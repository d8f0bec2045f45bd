//! The shipped system over TLS (issue 37): deploy/ as it is — the state servers with
//! `--tls-self-managed`, every client with `--server=https://…` and `--tls-ca` on the mounted CA
//! bundle the simulated kubelet projects from the ConfigMap `clb-ca-bundle`
//! (`clb_tests::shipped::kubelet`).
//!
//! Shown: every component connects over TLS (the watcher, the node agents and the workers write and
//! work through it); a client trusting another CA, and a plaintext client, are refused with an
//! error that says why; a CA rotation and a serving certificate renewal mid-run — forced by aging
//! what the Secret holds (the same keys, re-signed with a validity that is due), so that the
//! servers' own rotation does the rest — fail no update of a writer that keeps applying, and
//! clients that connect afterwards, with the bundle of before or after, are admitted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use clb_client::client::{Client, ConnectOptions, TlsOptions};
use clb_client::tls::CaBundle;
use clb_client::updates;
use clb_state_server::pki;
use clb_tests::PATIENCE;
use clb_tests::deploy::NAMESPACE;
use clb_tests::shipped::{Options, Shipped};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::json;

const SECRET: &str = "clb-state-server-tls";
const DAY: Duration = Duration::from_secs(86_400);

/// `error: cause: cause…`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

async fn until<T>(what: &str, mut f: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match f().await {
            Ok(t) => return t,
            Err(e) if tokio::time::Instant::now() >= deadline => {
                panic!("{what}: not within {PATIENCE:?}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The Secret's data, decoded.
fn secret_data(s: &Shipped) -> std::collections::BTreeMap<String, String> {
    let secret = s
        .api
        .get("secrets", NAMESPACE, SECRET)
        .expect("the state server made its Secret");
    secret["data"]
        .as_object()
        .expect("data")
        .iter()
        .map(|(k, v)| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap_or_default())
                .expect("base64");
            (k.clone(), String::from_utf8(bytes).expect("PEM"))
        })
        .collect()
}

/// Writes `changes` into the Secret (as an operator or a restore would).
fn write_secret(s: &Shipped, changes: &[(&str, &str)]) {
    let mut secret = s.api.get("secrets", NAMESPACE, SECRET).expect("the Secret");
    for (k, v) in changes {
        secret["data"][*k] = json!(base64::engine::general_purpose::STANDARD.encode(v));
    }
    s.api.put("secrets", secret);
}

fn common_name(pem: &str) -> String {
    let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM");
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("X.509");
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .expect("a CN")
        .to_owned()
}

use rustls::pki_types::pem::PemObject as _;

/// The CA `ca` with its own key, re-signed with a validity that is due for rotation: a client that
/// trusts the original (same name, same key) trusts what it signs.
fn aged_ca(ca: &str, ca_key: &str) -> String {
    let key = KeyPair::from_pem(ca_key).expect("CA key");
    let mut p = CertificateParams::default();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, common_name(ca));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = SystemTime::now();
    p.not_before = (now - 20 * DAY).into();
    p.not_after = (now + 5 * DAY).into();
    p.self_signed(&key).expect("aged CA").pem()
}

/// A serving certificate for `names` from the CA `ca`, due for renewal.
fn aged_leaf(ca: &str, ca_key: &str, names: &[String]) -> (String, String) {
    let issuer =
        Issuer::from_ca_cert_pem(ca, KeyPair::from_pem(ca_key).expect("CA key")).expect("issuer");
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(names.to_vec()).expect("names");
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.use_authority_key_identifier_extension = true;
    let now = SystemTime::now();
    p.not_before = (now - 300 * DAY).into();
    p.not_after = (now + 10 * DAY).into();
    (
        p.signed_by(&key, &issuer).expect("leaf").pem(),
        key.serialize_pem(),
    )
}

fn another_ca() -> String {
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::default();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, "a stranger's CA");
    p.self_signed(&key).expect("CA").pem()
}

/// An operator client trusting `bundle`.
async fn operator_with(s: &mut Shipped, bundle: &str) -> Result<Client, String> {
    let mut options = s.operator_options();
    options.tls = Some(TlsOptions {
        ca: Some(CaBundle::Pem(bundle.as_bytes().to_vec())),
        ..TlsOptions::default()
    });
    options.token_file = Some(s.operator_token());
    options.attempts = 3;
    Client::connect(options).await.map_err(|e| chain(&e))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_system_speaks_tls_refuses_strangers_and_rotates_without_a_failed_update() {
    clb_tests::init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut s = Shipped::start(Options::base(2)).await;
    for workload in ["clb-watcher", "clb-node-agent", "clb-sync-worker"] {
        assert!(
            s.server_url(workload).starts_with("https://"),
            "{workload} does not reach the state server over TLS in deploy/"
        );
    }
    let first = secret_data(&s);
    let bundle_before = s.ca_bundle();
    assert_eq!(bundle_before, first["ca.crt"], "the bundle is the CA");
    let names = pki::read_one(&first["tls.crt"]).expect("leaf").names;
    for want in [
        "clb-state-server",
        "clb-state-server.clb-system",
        "clb-state-server.clb-system.svc",
        "clb-state-server.clb-system.svc.cluster.local",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }

    // Strangers: another CA, and plaintext.
    let e = operator_with(&mut s, &another_ca())
        .await
        .expect_err("a client trusting another CA got in");
    assert!(
        e.contains("TLS handshake") && e.contains("UnknownIssuer") && e.contains("signed by a CA"),
        "{e}"
    );
    let mut plain = ConnectOptions::new(format!("http://{}", s.service.addr()));
    plain.attempts = 1;
    let e = match Client::connect(plain).await {
        Ok(c) => c.status().await.err().map(|e| chain(&e)),
        Err(e) => Some(chain(&e)),
    }
    .expect("a plaintext client got an answer");
    assert!(e.contains("serves TLS only"), "{e}");

    // A writer that keeps applying, on one connection, through the rotations.
    let operator = s.operator().await;
    let stop = Arc::new(AtomicBool::new(false));
    let (applied, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let mut w = operator.writer("operator");
        let (stop, applied, failed) = (stop.clone(), applied.clone(), failed.clone());
        tokio::spawn(async move {
            w.apply(vec![updates::service_add("svc-tls", &[])])
                .await
                .expect("the service");
            let mut i = 0u32;
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let ip = format!("10.9.{}.{}", (i / 250) % 250, i % 250 + 1);
                let update = updates::pod_add(&ip, "10.0.0.1", "", &format!("default/p-{i}"), "");
                match w.apply(vec![update]).await {
                    Ok(o) if o.rejected.is_empty() => {
                        applied.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(o) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        errors.push(o.describe_rejected());
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        errors.push(e.to_string());
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            errors
        })
    };

    // The CA is due: the servers rotate it (the new one cross-signed by the old).
    write_secret(
        &s,
        &[("ca.crt", &aged_ca(&first["ca.crt"], &first["ca.key"]))],
    );
    let rotated = until("the CA rotated", async || {
        let d = secret_data(&s);
        if d["ca.key"] != first["ca.key"] && d.contains_key("previous-ca.crt") {
            Ok(d)
        } else {
            Err(format!("keys {:?}", d.keys().collect::<Vec<_>>()))
        }
    })
    .await;
    let bundle_during = until("the bundle holds the new and the old CA", async || {
        let b = s.ca_bundle();
        if b.starts_with(&rotated["ca.crt"]) && b.matches("BEGIN CERTIFICATE").count() == 2 {
            Ok(b)
        } else {
            Err(b)
        }
    })
    .await;
    // New connections: with the bundle of before (the kubelet has not refreshed it yet), and with
    // the new one.
    operator_with(&mut s, &bundle_before)
        .await
        .expect("a client with the bundle of before the rotation");
    operator_with(&mut s, &bundle_during)
        .await
        .expect("a client with the bundle during the rotation");

    // The serving certificate is due: renewed by the new CA.
    // (the leaf aged, the rest of the chain — the cross-signed CA — as the server wrote it)
    let (leaf, key) = aged_leaf(&rotated["ca.crt"], &rotated["ca.key"], &names);
    let end = "-----END CERTIFICATE-----";
    let rest = &rotated["tls.crt"][rotated["tls.crt"].find(end).expect("a chain") + end.len()..];
    assert!(
        rest.contains("BEGIN CERTIFICATE"),
        "the cross-signed CA follows the leaf"
    );
    let leaf = format!("{}{rest}", leaf.trim_end());
    write_secret(&s, &[("tls.crt", &leaf), ("tls.key", &key)]);
    until("the serving certificate renewed", async || {
        let d = secret_data(&s);
        if d["tls.crt"] != leaf && d["ca.crt"] == rotated["ca.crt"] {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await;
    operator_with(&mut s, &bundle_before)
        .await
        .expect("a client with the bundle of before, after the renewal");
    // Not one update failed while the certificates changed under the open connection.
    stop.store(true, Ordering::Relaxed);
    let errors = writer.await.expect("the writer");
    assert!(applied.load(Ordering::Relaxed) > 0, "nothing applied");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "updates failed during the rotations: {errors:#?}"
    );

    // A fail-over: every component connects again, now to the renewed certificate.
    let old = s.wait_leader().await;
    s.servers[old].kill().await;
    until("a new leader", async || match s.leader().await {
        Some(i) if i != old => Ok(()),
        other => Err(format!("{other:?}")),
    })
    .await;
    let current = s.ca_bundle();
    let fresh = operator_with(&mut s, &current)
        .await
        .expect("a client with the current bundle");
    s.wait_writers_resynced(&fresh).await;

    for p in s
        .workers
        .iter()
        .chain(std::iter::once(&s.watcher))
        .chain(&s.agents)
    {
        let bad: Vec<_> = p
            .log()
            .into_iter()
            .filter(|l| l.contains("invalid peer certificate"))
            .collect();
        assert!(
            bad.is_empty(),
            "{}: a certificate was refused: {bad:#?}",
            p.name
        );
    }
    s.shutdown().await;
}
