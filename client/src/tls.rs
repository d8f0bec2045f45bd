//! TLS to the state server, with a CA bundle that can change while the client runs.
//!
//! The CA bundle is a PEM file (`--tls-ca`; in the cluster the ConfigMap `clb-ca-bundle` mounted by
//! the kubelet, which replaces the file when the state server rotates its CA). [`TlsConnector`]
//! makes each new connection itself: TCP, then a rustls handshake verified against the bundle's
//! **current** content (the file is read per connection, and parsed again only when it changed; a
//! file that does not load keeps the last good bundle, with a warning) and the name of the
//! server's host (or `--tls-domain`). Connections already open are not touched. tonic dials
//! through it ([`Dialer`]): tonic's own TLS holds the CA it was built with for ever.
//!
//! [`check_plaintext`] is the clients' rule for bearer tokens: not in clear over the network.

use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// Where the CA bundle comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum CaBundle {
    /// A PEM file, re-read when it changes (`--tls-ca`).
    File(PathBuf),
    /// PEM content, fixed.
    Pem(Vec<u8>),
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "File({})", p.display()),
            Self::Pem(p) => write!(f, "Pem({} bytes)", p.len()),
        }
    }
}

impl std::fmt::Display for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "--tls-ca {}", p.display()),
            Self::Pem(_) => f.write_str("the given CA bundle"),
        }
    }
}

impl CaBundle {
    fn read(&self) -> Result<Vec<u8>, String> {
        match self {
            Self::File(p) => {
                std::fs::read(p).map_err(|e| format!("{self}: cannot read the file: {e}"))
            }
            Self::Pem(p) => Ok(p.clone()),
        }
    }
}

/// Reads and checks a CA bundle: at least one usable CA certificate.
pub fn roots(source: &CaBundle, pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{source}: invalid PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{source}: no PEM certificate (-----BEGIN CERTIFICATE-----) found"
        ));
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots
            .add(c)
            .map_err(|e| format!("{source}: not a usable CA certificate: {e}"))?;
    }
    Ok(roots)
}

/// A client certificate and key (mutual TLS), PEM.
type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn identity(pem: &(Vec<u8>, Vec<u8>)) -> Result<Identity, String> {
    let chain = CertificateDer::pem_slice_iter(&pem.0)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--tls-cert: invalid PEM: {e}"))?;
    if chain.is_empty() {
        return Err("--tls-cert: no PEM certificate found".into());
    }
    let key = PrivateKeyDer::from_pem_slice(&pem.1)
        .map_err(|e| format!("--tls-key: no usable PEM private key: {e}"))?;
    Ok((chain, key))
}

struct Inner {
    ca: CaBundle,
    server_name: ServerName<'static>,
    identity: Option<Identity>,
    /// The bundle last loaded, and the configuration made of it.
    current: Mutex<(Vec<u8>, Arc<rustls::ClientConfig>)>,
}

/// Dials the state server over TLS (see the module); cheap to clone.
#[derive(Clone)]
pub struct TlsConnector {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("ca", &self.inner.ca)
            .field("server_name", &self.inner.server_name)
            .finish_non_exhaustive()
    }
}

impl Inner {
    fn config(&self, pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, String> {
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(&self.ca, pem)?);
        let mut config = match &self.identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(|e| format!("--tls-cert with --tls-key: {e}"))?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

impl TlsConnector {
    /// For the server `host` (verified in its certificate unless `domain` names another), trusting
    /// `ca`, presenting `client` (certificate and key PEM) when given. The bundle is read now: an
    /// error names the flag and the file.
    pub fn new(
        ca: CaBundle,
        host: &str,
        domain: Option<&str>,
        client: Option<&(Vec<u8>, Vec<u8>)>,
    ) -> Result<Self, String> {
        let name = domain.unwrap_or(host);
        let server_name = ServerName::try_from(name.trim_matches(['[', ']']).to_owned())
            .map_err(|e| format!("{name:?} is not a DNS name or IP address to verify: {e}"))?;
        let mut inner = Inner {
            ca,
            server_name,
            identity: client.map(identity).transpose()?,
            current: Mutex::new((Vec::new(), Arc::new(empty_config()))),
        };
        let pem = inner.ca.read()?;
        let config = inner.config(&pem)?;
        inner.current = Mutex::new((pem, config));
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The configuration for a new connection: the bundle's current content.
    fn current(&self) -> Arc<rustls::ClientConfig> {
        let mut current = self.inner.current.lock().unwrap_or_else(|e| e.into_inner());
        match self.inner.ca.read() {
            Ok(pem) if pem == current.0 => {}
            Ok(pem) => match self.inner.config(&pem) {
                Ok(config) => {
                    tracing::info!(ca = %self.inner.ca, "the CA bundle changed: new connections verify against it");
                    *current = (pem, config);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the CA bundle changed but does not load; the last one stays in use");
                    current.0 = pem;
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "the CA bundle cannot be read; the last one stays in use")
            }
        }
        current.1.clone()
    }

    async fn dial(self, uri: Uri) -> Result<TokioIo<TlsStream<TcpStream>>, DialError> {
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_matches(['[', ']'])
            .to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| DialError(format!("connecting to {host}:{port}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let connector = tokio_rustls::TlsConnector::from(self.current());
        let tls = connector
            .connect(self.inner.server_name.clone(), tcp)
            .await
            .map_err(|e| {
                let refused = e
                    .get_ref()
                    .and_then(|i| i.downcast_ref::<rustls::Error>())
                    .is_some_and(|r| {
                        matches!(
                            r,
                            rustls::Error::InvalidCertificate(_)
                                | rustls::Error::NoCertificatesPresented
                        )
                    });
                let why = if refused {
                    format!(
                        "the server's certificate must be signed by a CA of {} and name {:?}",
                        self.inner.ca,
                        self.inner.server_name.to_str()
                    )
                } else {
                    "the connection ended or was refused before the handshake completed".to_owned()
                };
                DialError(format!(
                    "TLS handshake with {host}:{port} failed: {e} ({why})"
                ))
            })?;
        Ok(TokioIo::new(tls))
    }
}

fn empty_config() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("aws-lc-rs supports the default protocol versions")
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth()
}

/// Why a TLS connection could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DialError(String);

impl tower::Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, DialError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), DialError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(self.clone().dial(uri))
    }
}

/// How to dial the state server: tonic's endpoint (its URL always `http://`: TLS, when used, is
/// the connector's) and the TLS connector.
#[derive(Debug, Clone)]
pub struct Dialer {
    /// The endpoint (timeouts, keep-alive).
    pub endpoint: Endpoint,
    /// TLS; `None` is plaintext.
    pub tls: Option<TlsConnector>,
}

impl Dialer {
    /// Connects once.
    pub async fn connect(&self) -> Result<Channel, tonic::transport::Error> {
        match &self.tls {
            Some(tls) => self.endpoint.connect_with_connector(tls.clone()).await,
            None => self.endpoint.connect().await,
        }
    }
}

/// `url` as tonic dials it when the connector speaks TLS: `https://` becomes `http://` (the
/// connection is TLS all the same), everything else is unchanged.
pub fn tonic_url(url: &str) -> String {
    const HTTPS: &str = "https://";
    match url.get(..HTTPS.len()) {
        Some(s) if s.eq_ignore_ascii_case(HTTPS) => format!("http://{}", &url[HTTPS.len()..]),
        _ => url.to_owned(),
    }
}

/// Whether `host` (of a URL) is this machine.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_matches(['[', ']']);
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The clients' rule: a bearer token never goes in clear to another host. With a token (`token`,
/// the file) and no TLS to a host that is not loopback, an error naming the URL, the token file
/// and the way out, unless `insecure` (`--insecure-plaintext`).
pub fn check_plaintext(
    url: &str,
    tls: bool,
    token: Option<&Path>,
    insecure: bool,
) -> Result<(), String> {
    let Some(token) = token else {
        return Ok(());
    };
    if tls || insecure {
        return Ok(());
    }
    let host = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    if is_loopback(host) {
        return Ok(());
    }
    Err(format!(
        "--server {url:?} is plaintext, and the bearer token of {} would cross the network in \
         clear: use an https:// URL with --tls-ca (the CA bundle, in the cluster the ConfigMap \
         clb-ca-bundle), or pass --insecure-plaintext",
        token.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_goes_in_clear_only_to_loopback_or_when_told() {
        let token = Path::new("/var/run/secrets/clb/token");
        let remote = "http://clb-state-server.clb-system.svc:50051";
        let e = check_plaintext(remote, false, Some(token), false).unwrap_err();
        assert!(
            e.contains(remote) && e.contains("/var/run/secrets/clb/token"),
            "{e}"
        );
        assert!(
            e.contains("--insecure-plaintext") && e.contains("--tls-ca"),
            "{e}"
        );
        assert_eq!(check_plaintext(remote, false, Some(token), true), Ok(()));
        assert_eq!(check_plaintext(remote, true, Some(token), false), Ok(()));
        assert_eq!(check_plaintext(remote, false, None, false), Ok(()));
        for local in [
            "http://127.0.0.1:50051",
            "http://localhost:1",
            "http://[::1]:50051",
            "127.0.0.2:9",
        ] {
            assert_eq!(
                check_plaintext(local, false, Some(token), false),
                Ok(()),
                "{local}"
            );
        }
        assert!(check_plaintext("10.0.0.1:50051", false, Some(token), false).is_err());
    }

    #[test]
    fn tonic_dials_https_urls_as_http_through_the_connector() {
        assert_eq!(tonic_url("https://a:1"), "http://a:1");
        assert_eq!(tonic_url("HTTPS://a:1/x"), "http://a:1/x");
        assert_eq!(tonic_url("http://a:1"), "http://a:1");
    }

    #[test]
    fn a_bundle_without_certificates_is_refused_naming_the_file() {
        let source = CaBundle::File("/etc/clb/ca/ca.crt".into());
        let e = roots(&source, b"nothing").unwrap_err();
        assert_eq!(
            e,
            "--tls-ca /etc/clb/ca/ca.crt: no PEM certificate (-----BEGIN CERTIFICATE-----) found"
        );
    }
}
