//! The worker's configuration: where the state server is (and how to reach it: plaintext or TLS), who
//! the worker is, and the limits it applies to NRP calls.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::WorkerError;

/// Everything [`run`](super::run) needs besides the NRP client and the shutdown signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// URL of the state server's gRPC endpoint, e.g. `http://127.0.0.1:50051` (`https://` for TLS).
    pub server: String,
    /// TLS towards the state server. `None` with an `http://` URL is plaintext; `None` with an
    /// `https://` URL is TLS with default settings; `Some` is TLS even if the URL says `http://`
    /// (see [`WorkerConfig::connect_url`]).
    pub tls: Option<WorkerTls>,
    /// File of the bearer token sent with `Sync` (`authorization: Bearer <token>`), read at each
    /// session start; `None` sends none.
    pub token_file: Option<std::path::PathBuf>,
    /// A stable, unique name of the worker (its pod name), sent in `Hello`.
    pub worker_id: String,
    /// The largest number of units in flight at once (at least 1), sent in `Hello`.
    pub capacity: u32,
    /// The gateways this worker serves; empty means every gateway of the server.
    pub gateways: Vec<String>,
    /// Limits on NRP calls and reports.
    pub limits: Limits,
    /// Reconnection backoff after a failed connection or a broken stream.
    pub backoff: Backoff,
    /// Bound on establishing the TCP/HTTP2 connection to the state server.
    pub connect_timeout: Duration,
    /// Bound on waiting for `Welcome` after `Hello`.
    pub welcome_timeout: Duration,
    /// HTTP/2 keep-alive ping interval towards the state server (a dead peer is noticed after about
    /// twice this).
    pub keep_alive_interval: Duration,
    /// Lease used when a unit carries neither a lease deadline nor a lease duration, and the server's
    /// `Welcome` gave none either.
    pub default_lease: Duration,
    /// On shutdown, how long in-flight units may take to finish their current NRP call and report;
    /// they are abandoned after it.
    pub shutdown_grace: Duration,
    /// Azure region used when the worker has to create a missing service gateway (e.g. `eastus`).
    /// Resources of the sagas are created in the gateway's own region.
    pub gateway_region: String,
    /// ARM id of the virtual network to create a missing service gateway in (optional; Azure needs
    /// it, the emulator does not).
    pub virtual_network_id: Option<String>,
    /// Resource group of the NAT gateways egresses may bring, for gateways whose target names none
    /// (the worker without a gateways file); `None`: bringing a NAT gateway is off there.
    pub nat_gateway_resource_group: Option<String>,
    /// Whether service work on a gateway NRP does not have creates it (PUT, in `gateway_region`).
    /// Off, the work fails with NRP's `ResourceNotFound`: the gateway is provisioned by someone else.
    pub create_missing_gateway: bool,
}

impl WorkerConfig {
    /// Defaults for a worker named `worker_id` talking to the state server at `server`.
    pub fn new(server: impl Into<String>, worker_id: impl Into<String>) -> Self {
        Self {
            server: server.into(),
            tls: None,
            token_file: None,
            worker_id: worker_id.into(),
            capacity: 4,
            gateways: Vec::new(),
            limits: Limits::default(),
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(5),
            welcome_timeout: Duration::from_secs(10),
            keep_alive_interval: Duration::from_secs(10),
            default_lease: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            gateway_region: "eastus".into(),
            virtual_network_id: None,
            nat_gateway_resource_group: None,
            create_missing_gateway: true,
        }
    }

    /// Whether the connection to the state server uses TLS: [`WorkerConfig::tls`] is set or the URL is
    /// `https://`.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some() || has_scheme(&self.server, "https://")
    }

    /// The URL the worker connects to: [`WorkerConfig::server`], with `http://` turned into
    /// `https://` when TLS is configured (tonic only speaks TLS to `https://` URLs).
    pub fn connect_url(&self) -> String {
        clb_proto::endpoint_url(&self.server, self.tls.is_some())
    }

    /// The TLS settings the connection uses (defaults for an `https://` URL without settings), or
    /// `None` for plaintext.
    pub fn effective_tls(&self) -> Option<WorkerTls> {
        match &self.tls {
            Some(tls) => Some(tls.clone()),
            None if self.uses_tls() => Some(WorkerTls::default()),
            None => None,
        }
    }
}

fn has_scheme(url: &str, scheme: &str) -> bool {
    url.get(..scheme.len())
        .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
}

/// TLS towards the state server, the PEM contents already read (see [`WorkerTls::from_files`]).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct WorkerTls {
    /// The CA bundle that signs the state server's certificate (a file is re-read when it
    /// changes); required for TLS: this build trusts no system roots.
    pub ca: Option<clb_client::tls::CaBundle>,
    /// The name to verify in the server's certificate; `None` uses the host of the server URL.
    pub domain: Option<String>,
    /// PEM certificate chain and private key of this worker, for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for WorkerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the private key.
        f.debug_struct("WorkerTls")
            .field("ca", &self.ca)
            .field("domain", &self.domain)
            .field(
                "identity",
                &self.identity.as_ref().map(|_| "<certificate and key>"),
            )
            .finish()
    }
}

impl WorkerTls {
    /// Reads and checks the PEM files named by `--tls-ca` and `--tls-cert`/`--tls-key`: the CA file
    /// holds at least one usable CA certificate, the certificate file at least one certificate, the
    /// key file a private key, and the key is the certificate's. Errors name the flag and the file.
    pub fn from_files(
        ca: Option<&Path>,
        identity: Option<(&Path, &Path)>,
        domain: Option<String>,
    ) -> Result<Self, WorkerError> {
        let ca = match ca {
            Some(path) => {
                let pem = read("tls-ca", path)?;
                let mut roots = RootCertStore::empty();
                for cert in certificates("tls-ca", path, &pem)? {
                    roots.add(cert).map_err(|e| {
                        invalid("tls-ca", path, format!("not a usable CA certificate: {e}"))
                    })?;
                }
                Some(clb_client::tls::CaBundle::File(path.to_owned()))
            }
            None => None,
        };
        let identity = match identity {
            Some((cert_path, key_path)) => {
                let cert = read("tls-cert", cert_path)?;
                let key = read("tls-key", key_path)?;
                let chain = certificates("tls-cert", cert_path, &cert)?;
                let key_der = PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
                    invalid(
                        "tls-key",
                        key_path,
                        format!("no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
                    )
                })?;
                CertifiedKey::from_der(
                    chain,
                    key_der,
                    &rustls::crypto::aws_lc_rs::default_provider(),
                )
                .map_err(|e| {
                    WorkerError::InvalidConfig(format!(
                        "--tls-cert {} with --tls-key {}: {e}",
                        cert_path.display(),
                        key_path.display()
                    ))
                })?;
                Some((cert, key))
            }
            None => None,
        };
        if domain.as_deref().is_some_and(|d| d.trim().is_empty()) {
            return Err(WorkerError::InvalidConfig(
                "--tls-domain must not be empty".into(),
            ));
        }
        Ok(Self {
            ca,
            domain,
            identity,
        })
    }
}

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, WorkerError> {
    std::fs::read(path).map_err(|e| {
        WorkerError::InvalidConfig(format!(
            "--{flag} {}: cannot read the file: {e}",
            path.display()
        ))
    })
}

fn invalid(flag: &str, path: &Path, reason: String) -> WorkerError {
    WorkerError::InvalidConfig(format!("--{flag} {}: {reason}", path.display()))
}

/// Every certificate of a PEM file; at least one.
fn certificates(
    flag: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, WorkerError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(flag, path, format!("invalid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(
            flag,
            path,
            "no PEM certificate (-----BEGIN CERTIFICATE-----) found".into(),
        ));
    }
    Ok(certs)
}

/// Limits on what one NRP call or one report carries, and on concurrency per gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most locations in one `updateAddressLocations` call.
    pub max_locations_per_call: usize,
    /// Most addresses in one `updateAddressLocations` call. A partial update of one location that is
    /// larger is split into several calls; a full update of one location is never split (splitting
    /// it would remove live addresses in between), so it goes alone in a call of its own.
    pub max_addresses_per_call: usize,
    /// Most addresses in one `Observed` report part (a location is never split across parts).
    pub max_addresses_per_report: usize,
    /// Upper bound of concurrent mutating NRP calls per gateway; the adaptive limit moves between 1
    /// and this.
    pub max_concurrent_mutations_per_gateway: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_locations_per_call: 1_000,
            max_addresses_per_call: 5_000,
            max_addresses_per_report: 20_000,
            max_concurrent_mutations_per_gateway: 4,
        }
    }
}

impl Limits {
    /// The same limits with every bound at least 1.
    pub fn sanitized(self) -> Self {
        Self {
            max_locations_per_call: self.max_locations_per_call.max(1),
            max_addresses_per_call: self.max_addresses_per_call.max(1),
            max_addresses_per_report: self.max_addresses_per_report.max(1),
            max_concurrent_mutations_per_gateway: self.max_concurrent_mutations_per_gateway.max(1),
        }
    }
}

/// Capped exponential backoff with jitter between reconnection attempts: the policy of
/// [`clb_client::backoff`] (backon's exponential backoff, each delay drawn from the upper half of
/// its step, so that many workers do not reconnect in lockstep).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Cap of the delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// The delays of a sequence of reconnections: retry number `n` (0-based) waits between half of
    /// `min(max, initial * 2^n)` and all of it; a refused session (see
    /// [`clb_client::backoff::Backoff::with_refusal_cap`]) at most `refusal_cap`.
    pub fn delays(&self, refusal_cap: Duration) -> clb_client::backoff::Backoff {
        clb_client::backoff::Backoff::new(self.initial, self.max).with_refusal_cap(refusal_cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_and_jittered() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let mut delays = b.delays(Duration::from_millis(300));
        // backon computes its steps in f32: a few nanoseconds of slack.
        let slack = Duration::from_micros(1);
        for attempt in 0..40 {
            let d = delays.next_delay(false);
            let base = (Duration::from_millis(100) * 2u32.pow(attempt.min(10))).min(b.max);
            assert!(
                d + slack >= base / 2 && d <= base + slack,
                "{attempt}: {d:?}"
            );
        }
        assert!(delays.next_delay(true) <= Duration::from_millis(300) + slack);
    }

    #[test]
    fn tls_follows_the_settings_and_the_url_scheme() {
        let plain = WorkerConfig::new("http://127.0.0.1:1", "w");
        assert!(!plain.uses_tls());
        assert_eq!(plain.effective_tls(), None);
        assert_eq!(plain.connect_url(), "http://127.0.0.1:1");

        let https = WorkerConfig::new("HTTPS://server:1", "w");
        assert!(https.uses_tls());
        assert_eq!(https.effective_tls(), Some(WorkerTls::default()));
        assert_eq!(https.connect_url(), "HTTPS://server:1");

        let mut upgraded = WorkerConfig::new("http://server:1", "w");
        upgraded.tls = Some(WorkerTls {
            domain: Some("clb".into()),
            ..WorkerTls::default()
        });
        assert!(upgraded.uses_tls());
        assert_eq!(upgraded.connect_url(), "https://server:1");
        assert_eq!(
            upgraded.effective_tls().and_then(|t| t.domain).as_deref(),
            Some("clb")
        );
    }

    #[test]
    fn the_private_key_is_not_printed() {
        let tls = WorkerTls {
            ca: Some(clb_client::tls::CaBundle::Pem(b"ca".to_vec())),
            domain: None,
            identity: Some((b"cert".to_vec(), b"SECRET KEY".to_vec())),
        };
        let shown = format!("{tls:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("2 bytes"), "{shown}");
    }

    #[test]
    fn unreadable_or_malformed_tls_files_are_precise_errors() {
        let dir = std::env::temp_dir().join(format!("clb-worker-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let garbage = dir.join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let missing = dir.join("missing.pem");

        let err = WorkerTls::from_files(Some(&missing), None, None).unwrap_err();
        let want = format!("--tls-ca {}: cannot read the file: ", missing.display());
        assert!(err.to_string().contains(&want), "{err}");

        let err = WorkerTls::from_files(Some(&garbage), None, None).unwrap_err();
        let want = format!(
            "--tls-ca {}: no PEM certificate (-----BEGIN CERTIFICATE-----) found",
            garbage.display()
        );
        assert!(err.to_string().ends_with(&want), "{err}");

        let err = WorkerTls::from_files(None, Some((&garbage, &garbage)), None).unwrap_err();
        assert!(
            err.to_string().contains(&format!(
                "--tls-cert {}: no PEM certificate",
                garbage.display()
            )),
            "{err}"
        );

        let err = WorkerTls::from_files(None, None, Some(" ".into())).unwrap_err();
        assert_eq!(
            err,
            WorkerError::InvalidConfig("--tls-domain must not be empty".into())
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn valid_tls_files_load_and_a_key_of_another_certificate_is_refused() {
        let dir = std::env::temp_dir().join(format!("clb-worker-pki-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, content: &str| {
            let p = dir.join(name);
            std::fs::write(&p, content).unwrap();
            p
        };
        let key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = write("ca.pem", &ca.self_signed(&key).unwrap().pem());
        let leaf = rcgen::generate_simple_self_signed(vec!["worker".to_owned()]).unwrap();
        let cert = write("cert.pem", &leaf.cert.pem());
        let leaf_key = write("cert.key", &leaf.signing_key.serialize_pem());
        let other_key = write("other.key", &key.serialize_pem());

        let tls = WorkerTls::from_files(Some(&ca), Some((&cert, &leaf_key)), None).unwrap();
        assert!(tls.ca.is_some() && tls.identity.is_some());

        let err = WorkerTls::from_files(None, Some((&cert, &other_key)), None).unwrap_err();
        let want = format!(
            "invalid worker configuration: --tls-cert {} with --tls-key {}: ",
            cert.display(),
            other_key.display()
        );
        assert!(err.to_string().starts_with(&want), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn limits_are_sanitized() {
        let l = Limits {
            max_locations_per_call: 0,
            max_addresses_per_call: 0,
            max_addresses_per_report: 0,
            max_concurrent_mutations_per_gateway: 0,
        }
        .sanitized();
        assert_eq!(l.max_locations_per_call, 1);
        assert_eq!(l.max_concurrent_mutations_per_gateway, 1);
    }
}
