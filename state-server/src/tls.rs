//! TLS of the gRPC API (`--tls-cert`, `--tls-key`, optionally `--tls-client-ca` for mutual TLS).
//!
//! The PEM files are read and checked once, at start-up, so that a missing or malformed file, or a key
//! that does not belong to the certificate, is an error naming the flag and the file rather than a
//! failed handshake later. The metrics endpoint is not affected: it stays plaintext.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Bound on one TLS handshake, so that a peer that connects and says nothing does not hold a
/// handshake task forever.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Reads and checks the files and returns tonic's server configuration: the identity, and, with
    /// `client_ca`, client certificates required and verified against it.
    pub fn load(&self) -> Result<ServerTlsConfig, TlsError> {
        let cert_pem = read("tls-cert", &self.cert)?;
        let key_pem = read("tls-key", &self.key)?;
        let chain = certificates("tls-cert", &self.cert, &cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            invalid(
                "tls-key",
                &self.key,
                format!("no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
            )
        })?;
        let identity_error = |reason: String| TlsError::Identity {
            cert: self.cert.clone(),
            key: self.key.clone(),
            reason,
        };
        CertifiedKey::from_der(chain, key, &rustls::crypto::aws_lc_rs::default_provider())
            .map_err(|e| identity_error(e.to_string()))?;
        let mut config = ServerTlsConfig::new()
            .identity(Identity::from_pem(&cert_pem, &key_pem))
            .timeout(HANDSHAKE_TIMEOUT);
        if let Some(path) = &self.client_ca {
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
            config = config
                .client_ca_root(Certificate::from_pem(&ca_pem))
                .client_auth_optional(false);
        }
        // What tonic will do at start: anything it refuses is reported here, naming the files.
        tonic::transport::Server::builder()
            .tls_config(config.clone())
            .map_err(|e| identity_error(chain_of(&e)))?;
        Ok(config)
    }
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
