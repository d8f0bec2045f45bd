//! The webhook's serving certificate (`--tls-cert`, `--tls-key`: PEM files, in the cluster the
//! cert-manager Secret `clb-webhook-tls` mounted as a volume), re-read when the files change.
//!
//! cert-manager renews the certificate before it expires and rewrites the Secret; the kubelet then
//! swaps the mounted files (both at once). [`ReloadingCertificate::run_reloads`] reads the two
//! files every `--tls-reload-interval` (default 10 s) and, when their content differs from what
//! was last read, loads the new pair; every handshake after that presents the new certificate
//! (open connections keep theirs). A new pair that does not load (a key that is not the
//! certificate's, a half-written file) is logged once and the previous one stays in use.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Bound on one TLS handshake, so that a peer that connects and says nothing does not hold a
/// task forever.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The PEM files of the serving certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    /// `--tls-cert`: the certificate chain, leaf first (cert-manager's `tls.crt`).
    pub cert: PathBuf,
    /// `--tls-key`: the leaf's private key, PKCS#8, PKCS#1 or SEC1 (cert-manager's `tls.key`).
    pub key: PathBuf,
}

/// Why the certificate files do not make a serving certificate; each names the flag and the file.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// A file cannot be read.
    #[error("--{flag} {}: cannot read the file: {source}", path.display())]
    Read {
        /// `tls-cert` or `tls-key`.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate file is not PEM.
    #[error("--tls-cert {}: invalid PEM: {reason}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The certificate file holds no certificate.
    #[error("--tls-cert {}: no PEM certificate (-----BEGIN CERTIFICATE-----) found", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no usable key.
    #[error("--tls-key {}: no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {reason}", path.display())]
    Key {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The key is not the certificate's (or rustls refuses the pair).
    #[error("--tls-cert {} with --tls-key {}: {reason}", cert.display(), key.display())]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        reason: String,
    },
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, CertificateError> {
    std::fs::read(path).map_err(|source| CertificateError::Read {
        flag,
        path: path.to_owned(),
        source,
    })
}

impl CertificateFiles {
    /// Reads both files.
    fn read(&self) -> Result<(Vec<u8>, Vec<u8>), CertificateError> {
        Ok((read("tls-cert", &self.cert)?, read("tls-key", &self.key)?))
    }

    /// The certified key of PEM contents `cert_pem` and `key_pem` (read from these files); every
    /// error names the flag and the file.
    fn parse(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, CertificateError> {
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CertificateError::Pem {
                path: self.cert.clone(),
                reason: e.to_string(),
            })?;
        if chain.is_empty() {
            return Err(CertificateError::NoCertificate {
                path: self.cert.clone(),
            });
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| CertificateError::Key {
            path: self.key.clone(),
            reason: e.to_string(),
        })?;
        CertifiedKey::from_der(chain, key, &rustls::crypto::aws_lc_rs::default_provider()).map_err(
            |e| CertificateError::Pair {
                cert: self.cert.clone(),
                key: self.key.clone(),
                reason: e.to_string(),
            },
        )
    }
}

/// What was last read from the files.
#[derive(Debug, Default)]
struct LastRead {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// The serving certificate, reloaded from its files; a rustls certificate resolver (every
/// handshake gets the current one).
#[derive(Debug)]
pub struct ReloadingCertificate {
    files: CertificateFiles,
    current: RwLock<Arc<CertifiedKey>>,
    last: Mutex<LastRead>,
}

impl ReloadingCertificate {
    /// Reads and checks the files; an error (naming the flag and the file) if they do not make a
    /// certificate and its key.
    pub fn load(files: CertificateFiles) -> anyhow::Result<Arc<Self>> {
        let (cert, key) = files.read()?;
        let certified = files.parse(&cert, &key)?;
        Ok(Arc::new(Self {
            files,
            current: RwLock::new(Arc::new(certified)),
            last: Mutex::new(LastRead { cert, key }),
        }))
    }

    /// The files.
    pub fn files(&self) -> &CertificateFiles {
        &self.files
    }

    /// The certificate chain presented now (leaf first).
    pub fn current_chain(&self) -> Vec<CertificateDer<'static>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .cert
            .clone()
    }

    /// Re-reads the files: `Ok(true)` when their content changed and the new pair is in use,
    /// `Ok(false)` when nothing changed, an error when the files cannot be read or the new pair
    /// does not load (the previous one stays in use; the same content is not tried again).
    pub fn reload(&self) -> Result<bool, CertificateError> {
        let (cert, key) = self.files.read()?;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.cert == cert && last.key == key {
            return Ok(false);
        }
        let parsed = self.files.parse(&cert, &key);
        *last = LastRead { cert, key };
        let certified = parsed?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(certified);
        Ok(true)
    }

    /// Calls [`ReloadingCertificate::reload`] every `every`, forever; logs each change and each
    /// failure.
    pub async fn run_reloads(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let me = self.clone();
            match tokio::task::spawn_blocking(move || me.reload()).await {
                Ok(Ok(true)) => tracing::info!(
                    cert = %self.files.cert.display(),
                    key = %self.files.key.display(),
                    "serving certificate reloaded"
                ),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(
                    error = %e,
                    "the certificate files changed but do not load; the previous certificate stays in use"
                ),
                Err(e) => tracing::warn!(error = %e, "certificate reload task failed"),
            }
        }
    }

    /// A rustls server configuration (aws-lc-rs, TLS 1.2 and 1.3, no client certificate, ALPN
    /// `http/1.1`) that presents this certificate.
    pub fn server_config(self: &Arc<Self>) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}
