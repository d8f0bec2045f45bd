//! The state server's own PKI (`--tls-self-managed`): a CA and a serving certificate it signed, what
//! a Secret holds of them, when they are renewed, and the CA bundle clients trust. Pure: no I/O, the
//! time is a parameter (the Kubernetes side is [`crate::self_managed`]).
//!
//! - **Issue.** A missing or unusable Secret gets a new CA (`--tls-ca-validity`, 10 years) and a
//!   serving certificate it signs (`--tls-serving-validity`, 1 year, never beyond the CA) for the
//!   Service's DNS names.
//! - **Renew the serving certificate** at 2/3 of its lifetime, or when it no longer names what it
//!   must, or is not the CA's: same CA, new key. Clients need nothing new.
//! - **Rotate the CA** at 2/3 of its lifetime: a new CA, and the new serving certificate's chain
//!   carries the new CA **cross-signed by the old one**, so a client that still trusts only the old
//!   CA (its mounted bundle not yet refreshed by the kubelet) verifies the new certificate through
//!   it, and a client that trusts the new one verifies it directly. The old CA stays in the bundle
//!   (`previous-ca.crt`) until it expires, so a replica still serving the old certificate for a
//!   moment is trusted too, and the cross-signed CA stays in the serving chain (renewals included)
//!   for as long, so even a client whose bundle never refreshed verifies. No step needs the clients
//!   to have reloaded first.
//!
//! The Secret's keys: `ca.crt`, `ca.key`, `tls.crt` (leaf first, then the cross-signed CA while the
//! previous CA is kept), `tls.key`, and `previous-ca.crt` while the old CA is valid.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

/// Keys of the Secret.
pub mod keys {
    /// The current CA's certificate (PEM).
    pub const CA_CERT: &str = "ca.crt";
    /// The current CA's private key (PEM).
    pub const CA_KEY: &str = "ca.key";
    /// The serving certificate chain (PEM, leaf first).
    pub const TLS_CERT: &str = "tls.crt";
    /// The serving certificate's private key (PEM).
    pub const TLS_KEY: &str = "tls.key";
    /// The CA before the last rotation, while it is valid (PEM).
    pub const PREVIOUS_CA: &str = "previous-ca.crt";
    /// The key of the CA bundle in the ConfigMap.
    pub const BUNDLE: &str = "ca.crt";
}

/// The fraction of a certificate's lifetime after which it is renewed.
pub const RENEW_AT: (u32, u32) = (2, 3);

/// How far back `notBefore` is set, for clocks a little behind the server's.
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Lifetimes of what the server issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    /// Of a CA (`--tls-ca-validity`).
    pub ca: Duration,
    /// Of a serving certificate (`--tls-serving-validity`; never beyond its CA).
    pub serving: Duration,
}

/// What a certificate is valid for, read from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validity {
    /// `notBefore`.
    pub not_before: SystemTime,
    /// `notAfter`.
    pub not_after: SystemTime,
}

impl Validity {
    /// When it is due for renewal: [`RENEW_AT`] of its lifetime.
    pub fn renew_at(&self) -> SystemTime {
        let life = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_before + life * RENEW_AT.0 / RENEW_AT.1
    }

    /// Whether it has expired at `now`.
    pub fn expired(&self, now: SystemTime) -> bool {
        now >= self.not_after
    }
}

/// The PEM contents of the Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Material {
    /// `ca.crt`.
    pub ca_cert: String,
    /// `ca.key`.
    pub ca_key: String,
    /// `tls.crt` (leaf first).
    pub tls_cert: String,
    /// `tls.key`.
    pub tls_key: String,
    /// `previous-ca.crt`.
    pub previous_ca: Option<String>,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        f.debug_struct("Material")
            .field("ca_cert", &self.ca_cert)
            .field("tls_cert", &self.tls_cert)
            .field("previous_ca", &self.previous_ca)
            .finish_non_exhaustive()
    }
}

impl Material {
    /// The Secret's data.
    pub fn to_data(&self) -> BTreeMap<String, Vec<u8>> {
        let mut data = BTreeMap::from([
            (keys::CA_CERT.to_owned(), self.ca_cert.clone().into_bytes()),
            (keys::CA_KEY.to_owned(), self.ca_key.clone().into_bytes()),
            (
                keys::TLS_CERT.to_owned(),
                self.tls_cert.clone().into_bytes(),
            ),
            (keys::TLS_KEY.to_owned(), self.tls_key.clone().into_bytes()),
        ]);
        if let Some(p) = &self.previous_ca {
            data.insert(keys::PREVIOUS_CA.to_owned(), p.clone().into_bytes());
        }
        data
    }

    /// Reads the Secret's data; an error names the missing or non-UTF-8 key.
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Result<Self, String> {
        let text = |key: &str| -> Result<Option<String>, String> {
            data.get(key)
                .map(|v| {
                    String::from_utf8(v.clone()).map_err(|_| format!("key {key:?} is not UTF-8"))
                })
                .transpose()
        };
        let required = |key: &str| text(key)?.ok_or_else(|| format!("key {key:?} is missing"));
        Ok(Self {
            ca_cert: required(keys::CA_CERT)?,
            ca_key: required(keys::CA_KEY)?,
            tls_cert: required(keys::TLS_CERT)?,
            tls_key: required(keys::TLS_KEY)?,
            previous_ca: text(keys::PREVIOUS_CA)?,
        })
    }

    /// The CA bundle clients trust at `now`: the current CA, then the previous one while it is
    /// valid.
    pub fn bundle(&self, now: SystemTime) -> String {
        let mut bundle = self.ca_cert.clone();
        if let Some(previous) = &self.previous_ca
            && read_one(previous).is_ok_and(|c| !c.validity.expired(now))
        {
            if !bundle.ends_with('\n') {
                bundle.push('\n');
            }
            bundle.push_str(previous);
        }
        bundle
    }

    /// The serving chain and key, as rustls takes them.
    pub fn serving(
        &self,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
        let chain = CertificateDer::pem_slice_iter(self.tls_cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: invalid PEM: {e}", keys::TLS_CERT))?;
        if chain.is_empty() {
            return Err(format!("{}: no certificate", keys::TLS_CERT));
        }
        let key = PrivateKeyDer::from_pem_slice(self.tls_key.as_bytes())
            .map_err(|e| format!("{}: no usable private key: {e}", keys::TLS_KEY))?;
        Ok((chain, key))
    }
}

/// One certificate, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Its validity.
    pub validity: Validity,
    /// Its DNS names and IP addresses (as text), sorted.
    pub names: Vec<String>,
    /// DER.
    der: Vec<u8>,
}

fn time_of(t: x509_parser::time::ASN1Time) -> SystemTime {
    let s = t.timestamp();
    if s >= 0 {
        UNIX_EPOCH + Duration::from_secs(s.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(s.unsigned_abs())
    }
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, c)| c)
        .map_err(|e| format!("not an X.509 certificate: {e}"))
}

fn info(der: &[u8]) -> Result<CertInfo, String> {
    let cert = parse(der)?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => names.push((*d).to_owned()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => names.push(
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())
                            .to_string(),
                    ),
                    16 => names.push(
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())
                            .to_string(),
                    ),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    names.sort();
    Ok(CertInfo {
        validity: Validity {
            not_before: time_of(cert.validity().not_before),
            not_after: time_of(cert.validity().not_after),
        },
        names,
        der: der.to_vec(),
    })
}

/// The first certificate of a PEM text, read.
pub fn read_one(pem: &str) -> Result<CertInfo, String> {
    let der = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or("no PEM certificate")?
        .map_err(|e| format!("invalid PEM: {e}"))?;
    info(&der)
}

/// Whether `cert` was signed by `issuer` (both DER).
fn signed_by(cert: &[u8], issuer: &[u8]) -> bool {
    match (parse(cert), parse(issuer)) {
        (Ok(c), Ok(i)) => c.verify_signature(Some(i.public_key())).is_ok(),
        _ => false,
    }
}

/// The Secret's content, read: what [`plan`] decides on.
#[derive(Debug, Clone)]
pub struct Inspected {
    /// The current CA.
    pub ca: CertInfo,
    /// The serving certificate (the leaf).
    pub leaf: CertInfo,
    /// Whether the leaf is the current CA's and its key is the leaf's.
    pub leaf_is_ca_s: bool,
    /// The previous CA, if the Secret keeps one.
    pub previous: Option<CertInfo>,
}

/// Reads `material`: an error (why it cannot be used at all) means a new CA.
pub fn inspect(material: &Material) -> Result<Inspected, String> {
    let ca = read_one(&material.ca_cert).map_err(|e| format!("{}: {e}", keys::CA_CERT))?;
    KeyPair::from_pem(&material.ca_key).map_err(|e| format!("{}: {e}", keys::CA_KEY))?;
    let (chain, key) = material.serving()?;
    let leaf = info(&chain[0]).map_err(|e| format!("{}: {e}", keys::TLS_CERT))?;
    let key_matches = rustls::sign::CertifiedKey::from_der(
        chain,
        key,
        &rustls::crypto::aws_lc_rs::default_provider(),
    )
    .is_ok();
    let previous = material
        .previous_ca
        .as_deref()
        .map(read_one)
        .transpose()
        .map_err(|e| format!("{}: {e}", keys::PREVIOUS_CA))?;
    Ok(Inspected {
        leaf_is_ca_s: key_matches && signed_by(&leaf.der, &ca.der),
        ca,
        leaf,
        previous,
    })
}

/// What to do with the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing until `until` (the next renewal or expiry).
    Keep {
        /// When to look again.
        until: SystemTime,
    },
    /// A new CA and serving certificate (the old CA cross-signs the new one when it still can).
    RotateCa {
        /// Why.
        reason: String,
    },
    /// A new serving certificate from the current CA.
    RenewServing {
        /// Why.
        reason: String,
    },
    /// Drop `previous-ca.crt`: it has expired.
    DropPrevious,
}

fn when(t: SystemTime) -> String {
    let s = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    time::OffsetDateTime::from_unix_timestamp(i64::try_from(s).unwrap_or(i64::MAX))
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{s} s after the epoch"))
}

/// The rotation decision for the Secret read as `current` (`Err`: missing or unusable, with
/// why), the names the serving certificate must hold (sorted), at `now`.
pub fn plan(current: &Result<Inspected, String>, names: &[String], now: SystemTime) -> Plan {
    let s = match current {
        Err(why) => {
            return Plan::RotateCa {
                reason: format!("no usable certificate: {why}"),
            };
        }
        Ok(s) => s,
    };
    let due = |what: &str, v: &Validity| {
        format!(
            "{what} is due for renewal since {} (valid until {})",
            when(v.renew_at()),
            when(v.not_after)
        )
    };
    if now >= s.ca.validity.renew_at() {
        return Plan::RotateCa {
            reason: due("the CA", &s.ca.validity),
        };
    }
    if !s.leaf_is_ca_s {
        return Plan::RenewServing {
            reason: "the serving certificate is not signed by the CA, or its key is not its own"
                .into(),
        };
    }
    if s.leaf.names != names {
        return Plan::RenewServing {
            reason: format!(
                "the serving certificate names {:?}, not {names:?}",
                s.leaf.names
            ),
        };
    }
    if now >= s.leaf.validity.renew_at() {
        return Plan::RenewServing {
            reason: due("the serving certificate", &s.leaf.validity),
        };
    }
    if let Some(p) = &s.previous
        && p.validity.expired(now)
    {
        return Plan::DropPrevious;
    }
    let mut until = s.ca.validity.renew_at().min(s.leaf.validity.renew_at());
    if let Some(p) = &s.previous {
        until = until.min(p.validity.not_after);
    }
    Plan::Keep { until }
}

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
#[error("making the {what}: {source}")]
pub struct IssueError {
    what: &'static str,
    #[source]
    source: rcgen::Error,
}

fn issue_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> IssueError {
    move |source| IssueError { what, source }
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t)
}

fn ca_params(now: SystemTime, not_after: SystemTime) -> CertificateParams {
    let mut p = CertificateParams::default();
    // Unconstrained: the old CA signs the new one during a rotation (a path of two CAs).
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let mut dn = DistinguishedName::new();
    // A name of its own per CA, so a chain through the old and the new one is never ambiguous.
    dn.push(
        DnType::CommonName,
        format!(
            "clb-state-server CA {}",
            now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
        ),
    );
    p.distinguished_name = dn;
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = offset(now - BACKDATE);
    p.not_after = offset(not_after);
    p
}

fn serving_params(
    names: &[String],
    now: SystemTime,
    not_after: SystemTime,
) -> Result<CertificateParams, IssueError> {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        names.first().cloned().unwrap_or_default(),
    );
    p.distinguished_name = dn;
    for n in names {
        p.subject_alt_names
            .push(match n.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(
                    n.clone()
                        .try_into()
                        .map_err(issue_err("serving certificate's DNS name"))?,
                ),
            });
    }
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.use_authority_key_identifier_extension = true;
    p.not_before = offset(now - BACKDATE);
    p.not_after = offset(not_after);
    Ok(p)
}

fn serving(
    names: &[String],
    issuer: &Issuer<'_, KeyPair>,
    now: SystemTime,
    not_after: SystemTime,
) -> Result<(String, String), IssueError> {
    let key = KeyPair::generate().map_err(issue_err("serving key"))?;
    let cert = serving_params(names, now, not_after)?
        .signed_by(&key, issuer)
        .map_err(issue_err("serving certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Carries out `plan` on `current` (`None`, or unusable: everything new) for `names` at `now`:
/// the new Secret content, or `None` for [`Plan::Keep`].
pub fn execute(
    plan: &Plan,
    current: Option<&Material>,
    names: &[String],
    lifetimes: Lifetimes,
    now: SystemTime,
) -> Result<Option<Material>, IssueError> {
    match plan {
        Plan::Keep { .. } => Ok(None),
        Plan::DropPrevious => Ok(current.map(|m| Material {
            previous_ca: None,
            tls_cert: split_leaf(&m.tls_cert).0.to_owned(),
            ..m.clone()
        })),
        Plan::RenewServing { .. } => {
            let Some(m) = current else {
                return execute(
                    &Plan::RotateCa {
                        reason: String::new(),
                    },
                    None,
                    names,
                    lifetimes,
                    now,
                );
            };
            let ca_key = KeyPair::from_pem(&m.ca_key).map_err(issue_err("CA key"))?;
            let ca_after = read_one(&m.ca_cert)
                .map(|c| c.validity.not_after)
                .unwrap_or(now);
            let issuer =
                Issuer::from_ca_cert_pem(&m.ca_cert, ca_key).map_err(issue_err("CA issuer"))?;
            let (mut tls_cert, tls_key) =
                serving(names, &issuer, now, (now + lifetimes.serving).min(ca_after))?;
            if m.previous_ca.is_some() {
                // The CA cross-signed by the previous one stays in the chain while that one is
                // trusted: a client whose bundle was never refreshed still verifies.
                tls_cert.push_str(split_leaf(&m.tls_cert).1);
            }
            Ok(Some(Material {
                tls_cert,
                tls_key,
                ..m.clone()
            }))
        }
        Plan::RotateCa { .. } => {
            let ca_after = now + lifetimes.ca;
            let ca_key = KeyPair::generate().map_err(issue_err("CA key"))?;
            let params = ca_params(now, ca_after);
            let ca_cert = params.self_signed(&ca_key).map_err(issue_err("CA"))?.pem();
            // The old CA, if it can still sign: it cross-signs the new one.
            let old = current.and_then(|m| {
                let info = read_one(&m.ca_cert)
                    .ok()
                    .filter(|c| !c.validity.expired(now))?;
                let key = KeyPair::from_pem(&m.ca_key).ok()?;
                let issuer = Issuer::from_ca_cert_pem(&m.ca_cert, key).ok()?;
                Some((m.ca_cert.clone(), info, issuer))
            });
            let new_issuer = Issuer::new(params.clone(), ca_key);
            let (mut tls_cert, tls_key) = serving(
                names,
                &new_issuer,
                now,
                (now + lifetimes.serving).min(ca_after),
            )?;
            let previous_ca = match old {
                Some((old_pem, old_info, old_issuer)) => {
                    let mut cross = params;
                    cross.not_after = offset(old_info.validity.not_after.min(ca_after));
                    let cross = cross
                        .signed_by(new_issuer.key(), &old_issuer)
                        .map_err(issue_err("cross-signed CA"))?;
                    tls_cert.push_str(&cross.pem());
                    Some(old_pem)
                }
                None => None,
            };
            Ok(Some(Material {
                ca_cert,
                ca_key: new_issuer.key().serialize_pem(),
                tls_cert,
                tls_key,
                previous_ca,
            }))
        }
    }
}

/// A PEM chain split after its first certificate: (the leaf, the rest).
fn split_leaf(chain: &str) -> (&str, &str) {
    const END: &str = "-----END CERTIFICATE-----";
    match chain.find(END) {
        Some(i) => {
            let mut at = i + END.len();
            if chain[at..].starts_with("\r\n") {
                at += 2;
            } else if chain[at..].starts_with('\n') {
                at += 1;
            }
            chain.split_at(at)
        }
        None => (chain, ""),
    }
}

/// The names the serving certificate holds: the Service `service`'s DNS names in `namespace`
/// (`service`, `service.namespace`, `service.namespace.svc`, `service.namespace.svc.cluster.local`)
/// and `extra`, sorted and without duplicates.
pub fn service_names(service: &str, namespace: &str, extra: &[String]) -> Vec<String> {
    let mut names = vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    names.extend(extra.iter().map(|n| n.trim().to_owned()));
    names.retain(|n| !n.is_empty());
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
#[path = "pki_tests.rs"]
mod tests;
