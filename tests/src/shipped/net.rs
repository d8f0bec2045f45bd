//! The network stand-ins of the shipped system: the Kubernetes Service in front of the state
//! servers ([`ServiceProxy`], routing by readiness) and a gate in front of the Kubernetes API that
//! can go down ([`TcpGate`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;

/// The Kubernetes Service `clb-state-server`: forwards each connection to a replica whose
/// `/readyz` answers 200 (probed every 100 ms); with none ready, the connection is closed at once.
#[derive(Debug)]
pub struct ServiceProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    backends: Arc<Mutex<Vec<(SocketAddr, SocketAddr)>>>,
}

impl ServiceProxy {
    pub(super) async fn start() -> Self {
        let backends: Arc<Mutex<Vec<(SocketAddr, SocketAddr)>>> = Arc::default();
        let ready: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let (b, r) = (backends.clone(), ready.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            loop {
                let list = b.lock().unwrap().clone();
                let mut found = None;
                for (grpc, metrics) in list {
                    let ok = http
                        .get(format!("http://{metrics}/readyz"))
                        .timeout(Duration::from_millis(500))
                        .send()
                        .await
                        .is_ok_and(|r| r.status().is_success());
                    if ok {
                        found = Some(grpc);
                        break;
                    }
                }
                *r.lock().unwrap() = found;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let Some(target) = *ready.lock().unwrap() else {
                    continue; // no ready endpoint: dropped
                };
                tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
            }
        });
        Self { url, backends }
    }

    pub(super) fn set(&self, backends: Vec<(SocketAddr, SocketAddr)>) {
        *self.backends.lock().unwrap() = backends;
    }

    /// Its address, `127.0.0.1:PORT` (a TCP forwarder: TLS passes through it).
    pub fn addr(&self) -> SocketAddr {
        self.url
            .trim_start_matches("http://")
            .parse()
            .expect("the proxy's URL is http://ADDR")
    }

    /// Its IP address.
    pub fn ip(&self) -> std::net::IpAddr {
        self.addr().ip()
    }
}

/// A TCP forwarder to `target` that can refuse connections (its listener closed) and accept
/// them again on the same port: an API server that is down, then back.
#[derive(Debug, Clone)]
pub struct TcpGate {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    open: Arc<AtomicBool>,
    epoch: Arc<AtomicU64>,
}

impl TcpGate {
    pub(super) async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let gate = Self {
            url: format!("http://{addr}"),
            open: Arc::new(AtomicBool::new(true)),
            epoch: Arc::default(),
        };
        gate.serve(listener, target);
        gate
    }

    fn serve(&self, listener: TcpListener, target: SocketAddr) {
        let (open, epoch) = (self.open.clone(), self.epoch.clone());
        let mine = epoch.load(Ordering::SeqCst);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((mut inbound, _)) = accepted else { return };
                        let open = open.clone();
                        tokio::spawn(async move {
                            if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                                // A server that goes down closes its connections too.
                                let closed = async {
                                    while open.load(Ordering::SeqCst) {
                                        tokio::time::sleep(Duration::from_millis(10)).await;
                                    }
                                };
                                tokio::select! {
                                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => {}
                                    () = closed => {}
                                }
                            }
                        });
                    }
                    () = tokio::time::sleep(Duration::from_millis(10)) => {
                        if !open.load(Ordering::SeqCst) || epoch.load(Ordering::SeqCst) != mine {
                            return; // the listener is dropped: connections are refused
                        }
                    }
                }
            }
        });
    }

    /// Closes every connection and refuses new ones until [`TcpGate::open`].
    pub async fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        // The listener and every forwarder look at the flag every 10 ms: once this returns, no
        // connection is left and none is accepted.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }

    /// Accepts connections again, on the same port.
    pub async fn open(&self, target: SocketAddr) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.open.store(true, Ordering::SeqCst);
        let addr: SocketAddr = self
            .url
            .trim_start_matches("http://")
            .parse()
            .expect("addr");
        let listener = TcpListener::bind(addr)
            .await
            .expect("re-bind the gate's port");
        self.serve(listener, target);
    }
}
