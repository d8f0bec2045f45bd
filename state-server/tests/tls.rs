//! TLS of the state server's gRPC API, server side: the PEM files named by `--tls-cert`, `--tls-key`
//! and `--tls-client-ca` are checked at start-up with errors that name the flag and the file; the
//! binary exits non-zero (no panic) on a bad file; a server started with them serves TLS (and, with a
//! client CA, only to clients with a certificate it signed) while the metrics endpoint stays
//! plaintext. Certificates are generated here with rcgen; every server binds 127.0.0.1:0.
//!
//! The typed client, clbctl's options and the sync worker over TLS are tested in
//! `clbctl/tests/tls.rs`. The certificates come from `tests/support/pki.rs`, shared with it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clb_proto::v1::StatusRequest;
use clb_proto::v1::admin_client::AdminClient;
use clb_state_server::state::{ServerConfig, StateServer};
use clb_state_server::tls::{TlsError, TlsFiles};
use tokio::sync::oneshot;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

#[path = "../../tests/support/pki.rs"]
mod pki;
use pki::Pki;

/// A guard against hangs, not a timing assertion.
const PATIENCE: Duration = Duration::from_secs(60);

fn init() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

// ---- start-up checks of the files --------------------------------------------------------------------

fn load_err(files: &TlsFiles) -> String {
    match files.load() {
        Ok(_) => panic!("{files:?} loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn valid_files_load_and_bad_ones_are_errors_naming_the_flag_and_the_file() {
    init();
    let pki = Pki::new("load");
    pki.server_files(false).load().expect("server identity");
    pki.server_files(true)
        .load()
        .expect("server identity with a client CA");

    let missing = pki.path("missing.pem");
    let garbage = pki.write("garbage.pem", "this is not PEM\n");
    let d = |p: &Path| p.display().to_string();

    // Unreadable files.
    let e = load_err(&TlsFiles {
        cert: missing.clone(),
        ..pki.server_files(false)
    });
    assert!(
        e.starts_with(&format!(
            "--tls-cert {}: cannot read the file: ",
            d(&missing)
        )),
        "{e}"
    );
    let e = load_err(&TlsFiles {
        key: missing.clone(),
        ..pki.server_files(false)
    });
    assert!(
        e.starts_with(&format!(
            "--tls-key {}: cannot read the file: ",
            d(&missing)
        )),
        "{e}"
    );
    let e = load_err(&TlsFiles {
        client_ca: Some(missing.clone()),
        ..pki.server_files(false)
    });
    assert!(
        e.starts_with(&format!(
            "--tls-client-ca {}: cannot read the file: ",
            d(&missing)
        )),
        "{e}"
    );

    // Files without what they should hold.
    let no_cert = format!(
        "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) found",
        d(&garbage)
    );
    let e = load_err(&TlsFiles {
        cert: garbage.clone(),
        ..pki.server_files(false)
    });
    assert_eq!(e, format!("--tls-cert {no_cert}"));
    let e = load_err(&TlsFiles {
        client_ca: Some(garbage.clone()),
        ..pki.server_files(false)
    });
    assert_eq!(e, format!("--tls-client-ca {no_cert}"));
    let e = load_err(&TlsFiles {
        key: garbage.clone(),
        ..pki.server_files(false)
    });
    assert!(
        e.starts_with(&format!(
            "--tls-key {}: no usable PEM private key",
            d(&garbage)
        )),
        "{e}"
    );
    // A key file that holds a certificate (a classic mix-up) holds no key either.
    let e = load_err(&TlsFiles {
        key: pki.path("server.pem"),
        ..pki.server_files(false)
    });
    assert!(e.starts_with("--tls-key "), "{e}");

    // Each file valid, but the key is not the certificate's.
    let other_key = pki.path("client.key");
    let e = load_err(&TlsFiles {
        key: other_key.clone(),
        ..pki.server_files(false)
    });
    assert!(
        e.starts_with(&format!(
            "--tls-cert {} with --tls-key {}: ",
            d(&pki.path("server.pem")),
            d(&other_key)
        )),
        "{e}"
    );
    assert!(matches!(
        TlsFiles {
            key: other_key,
            ..pki.server_files(false)
        }
        .load(),
        Err(TlsError::Identity { .. })
    ));

    // A PEM block that is not a certificate at all.
    let bad_der = pki.write(
        "bad-der.pem",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    let e = load_err(&TlsFiles {
        client_ca: Some(bad_der.clone()),
        ..pki.server_files(false)
    });
    assert!(
        e.starts_with(&format!("--tls-client-ca {}: ", d(&bad_der))),
        "{e}"
    );
}

/// Runs the binary with `args` and returns its exit code and standard error; it is killed if it has
/// not ended within [`PATIENCE`] (it should end at once: it fails before binding anything).
fn run_binary(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_clb-state-server"))
        .args(["--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0"])
        .args(args)
        .env_remove("CLB_TLS_CERT")
        .env_remove("CLB_TLS_KEY")
        .env_remove("CLB_TLS_CLIENT_CA")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("clb-state-server {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

#[test]
fn the_binary_exits_non_zero_with_a_precise_error_on_bad_tls_flags() {
    let pki = Pki::new("binary");
    let missing = pki.path("missing.pem");
    let key = pki.path("server.key");
    let (code, stderr) = run_binary(&[
        &format!("--tls-cert={}", missing.display()),
        &format!("--tls-key={}", key.display()),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--tls-cert {}: cannot read the file",
            missing.display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    let garbage = pki.write("garbage.key", "nope");
    let (code, stderr) = run_binary(&[
        &format!("--tls-cert={}", pki.path("server.pem").display()),
        &format!("--tls-key={}", garbage.display()),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--tls-key {}: no usable PEM private key",
            garbage.display()
        )),
        "{stderr}"
    );

    // Half a pair is a usage error (clap's status 2), before any file is read.
    let (code, stderr) = run_binary(&[&format!("--tls-cert={}", missing.display())]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--tls-cert requires --tls-key"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

// ---- a server behind TLS ---------------------------------------------------------------------------

/// A state server behind TLS on 127.0.0.1:0.
struct TlsServer {
    port: u16,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsServer {
    async fn start(files: &TlsFiles) -> Self {
        let tls = files.load().expect("valid TLS files");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = StateServer::new(ServerConfig::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            clb_state_server::grpc::serve_tls(listener, Arc::clone(&state), Some(tls), async {
                let _ = stopped.await;
            })
            .await
            .expect("the server runs");
        });
        Self {
            port,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(PATIENCE, &mut self.task).await;
    }
}

/// Connects with `tls` to `url` and calls `Admin.Status`.
async fn status(url: String, tls: Option<ClientTlsConfig>) -> Result<String, String> {
    let mut ep = Endpoint::from_shared(url)
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .timeout(PATIENCE);
    if let Some(tls) = tls {
        ep = ep.tls_config(tls).map_err(|e| format!("config: {e}"))?;
    }
    let channel = ep.connect().await.map_err(|e| format!("connect: {e:?}"))?;
    let r = AdminClient::new(channel)
        .status(StatusRequest::default())
        .await
        .map_err(|s| format!("status: {s:?}"))?;
    Ok(r.into_inner().server_id)
}

/// Connects with `tls` to `url` and lists the services through `grpc.reflection.v1alpha`.
async fn reflected_services(url: String, tls: ClientTlsConfig) -> Vec<String> {
    use tonic_reflection::pb::v1alpha::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let channel = Endpoint::from_shared(url)
        .unwrap()
        .timeout(PATIENCE)
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1alpha reflection behind TLS")
        .into_inner();
    match answers
        .message()
        .await
        .unwrap()
        .and_then(|a| a.message_response)
    {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("not a service list: {other:?}"),
    }
}

#[tokio::test]
async fn a_server_behind_tls_answers_only_tls_clients_that_trust_its_ca() {
    init();
    let pki = Pki::new("serve");
    let server = TlsServer::start(&pki.server_files(false)).await;
    let https = format!("https://localhost:{}", server.port);
    let trust = || ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&pki.ca));

    let id = status(https.clone(), Some(trust()))
        .await
        .expect("TLS works");
    assert_eq!(id, ServerConfig::default().server_id);
    // By IP address: the certificate names 127.0.0.1 too.
    status(format!("https://127.0.0.1:{}", server.port), Some(trust()))
        .await
        .expect("TLS by IP address");

    // A client that does not trust the CA fails the handshake.
    let e = status(https.clone(), Some(ClientTlsConfig::new()))
        .await
        .expect_err("untrusted server certificate");
    assert!(e.starts_with("connect: "), "{e}");
    // A plaintext client gets nothing from a TLS port.
    status(format!("http://127.0.0.1:{}", server.port), None)
        .await
        .expect_err("plaintext to a TLS port");
    // And the server still serves afterwards, reflection (v1alpha as well as v1) included.
    status(https.clone(), Some(trust()))
        .await
        .expect("still serving");
    let services = reflected_services(https, trust()).await;
    assert!(
        services.iter().any(|s| s == "clb.v1.Writer"),
        "{services:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn with_a_client_ca_only_clients_with_a_certificate_it_signed_get_in() {
    init();
    let pki = Pki::new("mtls");
    let server = TlsServer::start(&pki.server_files(true)).await;
    let https = format!("https://localhost:{}", server.port);
    let trust = || ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&pki.ca));

    // No client certificate: refused (during the handshake, or at the first call with TLS 1.3).
    status(https.clone(), Some(trust()))
        .await
        .expect_err("no client certificate");
    // A certificate from another CA: refused.
    let stranger = Pki::new("mtls-stranger");
    let foreign = Identity::from_pem(&stranger.client_cert, &stranger.client_key);
    status(https.clone(), Some(trust().identity(foreign)))
        .await
        .expect_err("a client certificate from another CA");
    // The client certificate the CA signed: in.
    let id = Identity::from_pem(&pki.client_cert, &pki.client_key);
    status(https, Some(trust().identity(id)))
        .await
        .expect("mutual TLS");
    server.stop().await;
}
