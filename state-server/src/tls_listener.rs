//! The gRPC port behind TLS: the certificate presented now ([`ServingCertificate`], swapped without
//! a restart: by the self-managed PKI, [`crate::self_managed`], or by re-reading `--tls-cert` and
//! `--tls-key`, [`crate::tls::reload_files`]), and the accepted connections ([`incoming`]), each
//! handshake in a task of its own.
//!
//! A connection that opens with something else than a TLS handshake is refused with an answer the
//! client can show: a plaintext HTTP/2 client (a gRPC client with an `http://` URL) gets every call
//! answered with `FAILED_PRECONDITION` and [`PLAINTEXT_REFUSAL`] (until the handshake timeout
//! closes the connection); anything else an HTTP/1.1 `400` saying the same. Connections already
//! open keep the certificate they were made with.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::Stream;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

/// Bound on one TLS handshake, so that a peer that connects and says nothing does not hold a
/// handshake task forever.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a client that speaks plaintext to the TLS port is told.
pub const PLAINTEXT_REFUSAL: &str = "this state server's gRPC port serves TLS only: connect with an \
     https:// URL and the CA bundle (--tls-ca), see docs/security.md";

/// The serving certificate, replaceable at any time; a rustls certificate resolver (each handshake
/// gets the current one). Empty until the first is set: handshakes fail until then.
#[derive(Debug)]
pub struct ServingCertificate {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    ready: watch::Sender<bool>,
}

impl ServingCertificate {
    /// Without a certificate yet.
    pub fn empty() -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(None),
            ready: watch::channel(false).0,
        })
    }

    /// With `key`.
    pub fn new(key: CertifiedKey) -> Arc<Self> {
        let me = Self::empty();
        me.set(key);
        me
    }

    /// Presents `key` from the next handshake on.
    pub fn set(&self, key: CertifiedKey) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(key));
        self.ready.send_replace(true);
    }

    /// The certificate chain presented now (leaf first), if any.
    pub fn chain(&self) -> Option<Vec<rustls::pki_types::CertificateDer<'static>>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|k| k.cert.clone())
    }

    /// Whether a certificate is set (the server is ready to serve TLS).
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The TLS side of the gRPC port: the certificate, rustls' configuration (ALPN `h2`; with
/// `--tls-client-ca`, client certificates required) and, with `--tls-cert`, the files it is
/// re-read from.
#[derive(Clone)]
pub struct ServerTls {
    /// The certificate presented.
    pub certificate: Arc<ServingCertificate>,
    /// rustls' configuration (resolving to [`ServerTls::certificate`]).
    pub config: Arc<rustls::ServerConfig>,
    /// `--tls-cert`/`--tls-key`, re-read by [`crate::tls::reload_files`]; `None` when the self-managed PKI
    /// sets the certificate.
    pub files: Option<(PathBuf, PathBuf)>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("ready", &self.certificate.is_ready())
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// rustls' configuration for `certificate`, verifying clients with `client_ca` when given.
    pub fn new(
        certificate: Arc<ServingCertificate>,
        client_ca: Option<rustls::RootCertStore>,
    ) -> Result<Self, rustls::Error> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match client_ca {
            Some(roots) => builder.with_client_cert_verifier(
                rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?,
            ),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(certificate.clone());
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self {
            certificate,
            config: Arc::new(config),
            files: None,
        })
    }
}

/// Accepts on `listener` (`TCP_NODELAY` on each connection) and hands out the connections whose
/// TLS handshake completed within [`HANDSHAKE_TIMEOUT`]; a failed or plaintext one is logged and
/// closed (see the module). Ends when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a gRPC connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            // No TCP keepalive here (tokio sets none without socket2): the HTTP/2 keepalive pings
            // of `grpc::connection_settings` find a peer that vanished.
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&acceptor, tcp, peer)).await
                {
                    Ok(Some(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(None) => {}
                    Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The first byte of a TLS record carrying a handshake.
const TLS_HANDSHAKE: u8 = 0x16;

async fn handshake(
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
) -> Option<TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await {
        Ok(1..) if first[0] != TLS_HANDSHAKE => {
            refuse_plaintext(tcp, peer, first[0]).await;
            return None;
        }
        Ok(_) => {}
        Err(e) => {
            tracing::debug!(%peer, error = %e, "connection closed before the TLS handshake");
            return None;
        }
    }
    match acceptor.accept(tcp).await {
        Ok(tls) => Some(tls),
        Err(e) => {
            tracing::info!(%peer, error = %e, "TLS handshake failed");
            None
        }
    }
}

async fn refuse_plaintext(mut tcp: TcpStream, peer: SocketAddr, first: u8) {
    tracing::warn!(%peer, "a client spoke plaintext to the TLS port: refused ({PLAINTEXT_REFUSAL})");
    // A plaintext HTTP/2 client opens with "PRI * HTTP/2.0": its calls get a gRPC status.
    if first == b'P' {
        let answer = hyper::service::service_fn(|_request| async {
            Ok::<_, std::convert::Infallible>(
                tonic::Status::failed_precondition(PLAINTEXT_REFUSAL)
                    .into_http::<tonic::body::Body>(),
            )
        });
        let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .serve_connection(hyper_util::rt::TokioIo::new(tcp), answer)
            .await;
        return;
    }
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{PLAINTEXT_REFUSAL}",
        PLAINTEXT_REFUSAL.len()
    );
    let _ = tcp.write_all(answer.as_bytes()).await;
    let _ = tcp.flush().await;
    // Read what the client still sends until it closes (or the handshake timeout), so that the
    // answer is not lost to a reset.
    let mut sink = [0u8; 1024];
    loop {
        match tokio::io::AsyncReadExt::read(&mut tcp, &mut sink).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
