//! The rotation decision and what each step issues, verified as the clients verify (rustls).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use super::*;

const DAY: Duration = Duration::from_secs(86_400);

fn lifetimes() -> Lifetimes {
    Lifetimes {
        ca: 30 * DAY,
        serving: 9 * DAY,
    }
}

fn names() -> Vec<String> {
    service_names("clb-state-server", "clb-system", &["127.0.0.1".into()])
}

fn fresh(now: SystemTime) -> Material {
    let plan = plan(&Err("no Secret".into()), &names(), now);
    assert!(matches!(plan, Plan::RotateCa { .. }), "{plan:?}");
    execute(&plan, None, &names(), lifetimes(), now)
        .unwrap()
        .expect("a new Secret")
}

fn pems(text: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

/// Verifies the serving chain of `m` for `name` at `at` against the CAs of `bundle`, as a client
/// does.
fn verify(m: &Material, bundle: &str, name: &str, at: SystemTime) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in pems(bundle) {
        roots.add(c).unwrap();
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    )
    .build()
    .unwrap();
    let chain = pems(&m.tls_cert);
    let at = UnixTime::since_unix_epoch(at.duration_since(UNIX_EPOCH).unwrap());
    verifier
        .verify_server_cert(
            &chain[0],
            &chain[1..],
            &ServerName::try_from(name.to_owned()).unwrap(),
            &[],
            at,
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn a_missing_secret_gets_a_ca_and_a_serving_certificate_for_the_service_names() {
    let now = SystemTime::now();
    let m = fresh(now);
    let s = inspect(&m).unwrap();
    assert!(s.leaf_is_ca_s);
    assert_eq!(s.leaf.names, names());
    assert_eq!(s.previous, None);
    assert_eq!(pems(&m.bundle(now)).len(), 1, "the bundle is the CA alone");
    for name in [
        "clb-state-server.clb-system.svc",
        "clb-state-server",
        "127.0.0.1",
    ] {
        verify(&m, &m.bundle(now), name, now).unwrap();
    }
    let e = verify(&m, &m.bundle(now), "elsewhere.example", now).unwrap_err();
    assert!(e.contains("not valid for name"), "{e}");
    // Nothing to do until the serving certificate is at 2/3 of its life (before the CA's).
    let Plan::Keep { until } = plan(&Ok(s.clone()), &names(), now) else {
        panic!("a fresh Secret is kept");
    };
    assert_eq!(until, s.leaf.validity.renew_at());
    assert!(until < s.ca.validity.renew_at());
}

#[test]
fn the_serving_certificate_is_renewed_at_two_thirds_of_its_life_by_the_same_ca() {
    let now = SystemTime::now();
    let m = fresh(now);
    let s = inspect(&m).unwrap();
    let due = s.leaf.validity.renew_at();
    assert!(matches!(
        plan(&Ok(s.clone()), &names(), due - Duration::from_secs(1)),
        Plan::Keep { .. }
    ));
    let p = plan(&Ok(s), &names(), due);
    assert!(
        matches!(&p, Plan::RenewServing { reason } if reason.contains("due for renewal")),
        "{p:?}"
    );
    let renewed = execute(&p, Some(&m), &names(), lifetimes(), due)
        .unwrap()
        .unwrap();
    assert_eq!(renewed.ca_cert, m.ca_cert, "same CA");
    assert_ne!(renewed.tls_key, m.tls_key, "a new key");
    assert_eq!(
        renewed.bundle(due),
        m.bundle(due),
        "clients need nothing new"
    );
    verify(
        &renewed,
        &m.bundle(now),
        "clb-state-server.clb-system.svc",
        due,
    )
    .unwrap();
    assert!(matches!(
        plan(&inspect(&renewed), &names(), due),
        Plan::Keep { .. }
    ));
}

#[test]
fn other_names_or_a_certificate_of_another_ca_are_renewed_at_once() {
    let now = SystemTime::now();
    let m = fresh(now);
    let more = service_names("clb-state-server", "clb-system", &["10.0.0.9".into()]);
    let p = plan(&inspect(&m), &more, now);
    assert!(
        matches!(&p, Plan::RenewServing { reason } if reason.contains("10.0.0.9")),
        "{p:?}"
    );
    let other = fresh(now);
    let mixed = Material {
        tls_cert: other.tls_cert.clone(),
        tls_key: other.tls_key.clone(),
        ..m.clone()
    };
    let p = plan(&inspect(&mixed), &names(), now);
    assert!(
        matches!(&p, Plan::RenewServing { reason } if reason.contains("not signed by the CA")),
        "{p:?}"
    );
    let fixed = execute(&p, Some(&mixed), &names(), lifetimes(), now)
        .unwrap()
        .unwrap();
    verify(&fixed, &m.bundle(now), "clb-state-server", now).unwrap();
    // Unreadable content is replaced as a whole.
    let broken = Material {
        ca_cert: "garbage".into(),
        ..m
    };
    assert!(
        matches!(plan(&inspect(&broken), &names(), now), Plan::RotateCa { reason } if reason.contains("ca.crt"))
    );
}

#[test]
fn a_ca_rotation_is_trusted_by_clients_of_the_old_bundle_and_of_the_new_one() {
    let now = SystemTime::now();
    let old = fresh(now);
    let s = inspect(&old).unwrap();
    let due = s.ca.validity.renew_at();
    // Renewed serving certificates in between do not touch the CA.
    let p = plan(&Ok(s), &names(), due);
    assert!(
        matches!(&p, Plan::RotateCa { reason } if reason.contains("the CA is due")),
        "{p:?}"
    );
    let new = execute(&p, Some(&old), &names(), lifetimes(), due)
        .unwrap()
        .unwrap();
    assert_ne!(new.ca_cert, old.ca_cert);
    assert_eq!(new.previous_ca.as_deref(), Some(old.ca_cert.as_str()));
    assert_eq!(
        pems(&new.tls_cert).len(),
        2,
        "leaf and the new CA cross-signed by the old"
    );
    // During the rotation the bundle holds both CAs, the new one first.
    let bundle = new.bundle(due);
    assert_eq!(pems(&bundle).len(), 2);
    assert!(bundle.starts_with(&new.ca_cert));
    let name = "clb-state-server.clb-system.svc";
    // A client whose bundle the kubelet has not refreshed yet (the old CA only) trusts the new
    // certificate through the cross-signed CA; a refreshed one trusts it directly; and either
    // trusts a replica still serving the old certificate.
    verify(&new, &old.bundle(now), name, due).unwrap();
    verify(&new, &new.ca_cert, name, due).unwrap();
    verify(&new, &bundle, name, due).unwrap();
    // (the old CA's latest serving certificate, renewed in between as it is every 2/3 of its life)
    let renew = Plan::RenewServing {
        reason: String::new(),
    };
    let old_latest = execute(&renew, Some(&old), &names(), lifetimes(), due - DAY)
        .unwrap()
        .unwrap();
    verify(&old_latest, &bundle, name, due).unwrap();
    // A renewal while the old CA is kept keeps the cross-signed CA in the chain: a client whose
    // bundle never refreshed still verifies.
    let renewed = execute(&renew, Some(&new), &names(), lifetimes(), due + DAY)
        .unwrap()
        .unwrap();
    assert_eq!(pems(&renewed.tls_cert).len(), 2);
    verify(&renewed, &old.bundle(now), name, due + DAY).unwrap();
    // The new CA is kept until its own renewal; the old one leaves the bundle when it expires.
    let n = inspect(&new).unwrap();
    assert!(n.leaf_is_ca_s);
    let old_end = n.previous.as_ref().unwrap().validity.not_after;
    assert!(
        matches!(plan(&Ok(n.clone()), &names(), due), Plan::Keep { until } if until <= old_end)
    );
    assert_eq!(
        pems(&new.bundle(old_end)).len(),
        1,
        "an expired CA is not trusted"
    );
    // At the old CA's end, the replicas' loop: plan, write, read again, until nothing is due.
    let mut m = new.clone();
    let mut steps = Vec::new();
    loop {
        let p = plan(&inspect(&m), &names(), old_end);
        if let Plan::Keep { .. } = p {
            break;
        }
        steps.push(p.clone());
        m = execute(&p, Some(&m), &names(), lifetimes(), old_end)
            .unwrap()
            .unwrap();
        assert!(steps.len() < 4, "{steps:?}");
    }
    assert!(steps.contains(&Plan::DropPrevious), "{steps:?}");
    assert_eq!(m.previous_ca, None);
    assert_eq!(
        pems(&m.tls_cert).len(),
        1,
        "the cross-signed CA leaves the chain with it"
    );
    assert_eq!(m.ca_cert, new.ca_cert, "the new CA stays");
    verify(&m, &m.bundle(old_end), name, old_end).unwrap();
}

#[test]
fn an_expired_ca_is_replaced_without_cross_signing() {
    let now = SystemTime::now();
    let old = fresh(now);
    let after = now + 31 * DAY;
    let p = plan(&inspect(&old), &names(), after);
    assert!(matches!(p, Plan::RotateCa { .. }));
    let new = execute(&p, Some(&old), &names(), lifetimes(), after)
        .unwrap()
        .unwrap();
    assert_eq!(new.previous_ca, None, "an expired CA is trusted by no one");
    assert_eq!(pems(&new.tls_cert).len(), 1);
    verify(&new, &new.bundle(after), "clb-state-server", after).unwrap();
}

#[test]
fn the_secret_data_round_trips_and_names_what_is_missing() {
    let m = fresh(SystemTime::now());
    assert_eq!(Material::from_data(&m.to_data()).unwrap(), m);
    let mut data = m.to_data();
    data.remove(keys::TLS_KEY);
    assert_eq!(
        Material::from_data(&data).unwrap_err(),
        "key \"tls.key\" is missing"
    );
    assert!(
        !format!("{m:?}").contains("PRIVATE KEY"),
        "Debug shows no key"
    );
}

#[test]
fn the_names_are_the_services_and_the_extra_ones_sorted() {
    assert_eq!(
        service_names("s", "ns", &[" 10.1.2.3 ".into(), "s".into(), String::new()]),
        [
            "10.1.2.3",
            "s",
            "s.ns",
            "s.ns.svc",
            "s.ns.svc.cluster.local"
        ]
    );
}
