//! TLS of the gRPC API (`--tls-cert`, `--tls-key`, optionally `--tls-client-ca` for mutual TLS).
//!
//! The PEM files are read and checked at start-up, so that a missing or malformed file, or a key
//! that does not belong to the certificate, is an error naming the flag and the file rather than a
//! failed handshake later; after that the pair is re-read when it changes
//! ([`reload_files`]). The metrics endpoint is not affected: it stays
//! plaintext.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use crate::config::ConfigError;
use crate::tls_listener::{ServerTls, ServingCertificate};

pub use crate::tls_listener::HANDSHAKE_TIMEOUT;

/// The PEM files of the gRPC API's TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `--tls-cert`: the server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// `--tls-key`: the private key of the leaf certificate (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// `--tls-client-ca`: the CA(s) that must sign every client's certificate (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// Why the TLS files cannot be used. Every message names the flag and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file cannot be read.
    #[error("--{flag} {}: cannot read the file: {source}", path.display())]
    Read {
        /// Flag name (without `--`).
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is read but its content is unusable.
    #[error("--{flag} {}: {reason}", path.display())]
    Invalid {
        /// Flag name (without `--`).
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The certificate and the key are each valid but do not make an identity (e.g. the key is not
    /// the certificate's), or the TLS stack refused the combination.
    #[error("--tls-cert {} with --tls-key {}: {reason}", cert.display(), key.display())]
    Identity {
        /// `--tls-cert`.
        cert: PathBuf,
        /// `--tls-key`.
        key: PathBuf,
        /// Why.
        reason: String,
    },
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.to_owned(),
        source,
    })
}

fn invalid(flag: &'static str, path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::Invalid {
        flag,
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Every certificate of a PEM file; at least one.
fn certificates(
    flag: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(flag, path, format!("invalid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(
            flag,
            path,
            "no PEM certificate (-----BEGIN CERTIFICATE-----) found",
        ));
    }
    Ok(certs)
}

impl TlsFiles {
    /// Reads `--tls-cert` and `--tls-key`.
    pub fn read_pair(&self) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
        Ok((read("tls-cert", &self.cert)?, read("tls-key", &self.key)?))
    }

    /// The certified key of the PEM contents of `--tls-cert` and `--tls-key`; errors name the
    /// flags and files.
    pub fn certified_key(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
        let chain = certificates("tls-cert", &self.cert, cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
            invalid(
                "tls-key",
                &self.key,
                format!("no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
            )
        })?;
        CertifiedKey::from_der(chain, key, &rustls::crypto::aws_lc_rs::default_provider()).map_err(
            |e| TlsError::Identity {
                cert: self.cert.clone(),
                key: self.key.clone(),
                reason: e.to_string(),
            },
        )
    }

    /// Reads and checks the files and returns the server's TLS: the identity, and, with
    /// `client_ca`, client certificates required and verified against it.
    pub fn load(&self) -> Result<ServerTls, TlsError> {
        let (cert_pem, key_pem) = self.read_pair()?;
        let certificate = ServingCertificate::new(self.certified_key(&cert_pem, &key_pem)?);
        let client_ca = self.client_ca.as_deref().map(client_roots).transpose()?;
        let mut tls = ServerTls::new(certificate, client_ca).map_err(|e| TlsError::Identity {
            cert: self.cert.clone(),
            key: self.key.clone(),
            reason: chain_of(&e),
        })?;
        tls.files = Some((self.cert.clone(), self.key.clone()));
        Ok(tls)
    }
}

/// The TLS the flags ask for (kept here, next to what it reads).
impl crate::config::Args {
    /// The TLS flags fit together: `--tls-cert` and `--tls-key` both or neither, `--tls-client-ca`
    /// with a certificate, the self-managed flags valid.
    pub(crate) fn validate_tls(&self) -> Result<(), ConfigError> {
        let incomplete = |given, missing| Err(ConfigError::TlsIncomplete { given, missing });
        match (&self.tls_cert, &self.tls_key, &self.tls_client_ca) {
            (Some(_), None, _) => return incomplete("tls-cert", "--tls-key"),
            (None, Some(_), _) => return incomplete("tls-key", "--tls-cert"),
            (None, None, Some(_)) if !self.self_managed.tls_self_managed => {
                return incomplete(
                    "tls-client-ca",
                    "--tls-cert and --tls-key, or --tls-self-managed",
                );
            }
            _ => {}
        }
        self.self_managed
            .validate()
            .map_err(ConfigError::SelfManaged)?;
        Ok(())
    }

    /// The TLS files the flags name (call [`crate::config::Args::validate`] first); `None` is plaintext.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            }),
            _ => None,
        }
    }

    /// Reads and checks the TLS files (call [`crate::config::Args::validate`] first): the server's TLS (with
    /// `--tls-self-managed`, without a certificate until [`crate::self_managed`] sets one), or
    /// `None` for plaintext; the error names the flag and the file.
    pub fn server_tls(&self) -> Result<Option<crate::tls_listener::ServerTls>, TlsError> {
        if self.self_managed.tls_self_managed {
            return without_certificate(self.tls_client_ca.as_deref()).map(Some);
        }
        self.tls_files().map(|f| f.load()).transpose()
    }
}

/// The CA(s) of `--tls-client-ca` `path`.
fn client_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let ca_pem = read("tls-client-ca", path)?;
    let mut roots = RootCertStore::empty();
    for cert in certificates("tls-client-ca", path, &ca_pem)? {
        roots.add(cert).map_err(|e| {
            invalid(
                "tls-client-ca",
                path,
                format!("not a usable CA certificate: {e}"),
            )
        })?;
    }
    Ok(roots)
}

/// The server's TLS without a certificate yet (`--tls-self-managed` sets it), verifying clients
/// against `--tls-client-ca` when given.
pub fn without_certificate(client_ca: Option<&Path>) -> Result<ServerTls, TlsError> {
    let roots = client_ca.map(client_roots).transpose()?;
    ServerTls::new(ServingCertificate::empty(), roots).map_err(|e| TlsError::Invalid {
        flag: "tls-client-ca",
        path: client_ca.map(Path::to_owned).unwrap_or_default(),
        reason: chain_of(&e),
    })
}

/// `error: cause: cause…` (tonic's errors keep the detail in their sources).
fn chain_of(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// Re-reads `--tls-cert`/`--tls-key` every `every` and presents the new pair when their content
/// changed (cert-manager renewed the Secret and the kubelet swapped the files); a pair that does
/// not load is logged and the previous one stays.
pub async fn reload_files(tls: ServerTls, every: Duration) {
    let Some((cert, key)) = tls.files.clone() else {
        return;
    };
    let files = TlsFiles {
        cert,
        key,
        client_ca: None,
    };
    let mut last = files.read_pair().ok();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let read = {
            let files = files.clone();
            tokio::task::spawn_blocking(move || files.read_pair()).await
        };
        let Ok(Ok(pair)) = read else {
            continue;
        };
        if last.as_ref() == Some(&pair) {
            continue;
        }
        match files.certified_key(&pair.0, &pair.1) {
            Ok(key) => {
                tls.certificate.set(key);
                tracing::info!(cert = %files.cert.display(), "serving certificate reloaded");
            }
            Err(e) => tracing::warn!(
                error = %e,
                "the certificate files changed but do not load; the previous certificate stays in use"
            ),
        }
        last = Some(pair);
    }
}
