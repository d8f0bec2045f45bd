//! The project's NRP emulator: a real HTTP server speaking the Service Gateway REST API
//! (`Microsoft.Network/serviceGateways`, api-versions 2025-05-01 and 2026-03-01) and the public IP,
//! load balancer and NAT gateway resources the service sagas create, enforcing what Azure enforces and
//! modelling cost and faults (`docs/contract.md` §6, `docs/nrp-emulator.md`).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use clb_nrp_emulator::{Emulator, EmulatorConfig, serve};
//! let emulator = Emulator::new(EmulatorConfig::default()).expect("valid config");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! serve(listener, emulator.clone(), std::future::pending()).await
//! # }
//! ```
//!
//! ARM paths (all need `?api-version=` `2025-05-01` or `2026-03-01`; any other is refused with
//! `400 InvalidApiVersionParameter`), under
//! `/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/`:
//! `serviceGateways/{name}` (PUT/GET/PATCH tags/DELETE), `serviceGateways` (GET, also
//! subscription-wide at `/subscriptions/{sub}/providers/Microsoft.Network/serviceGateways`),
//! `serviceGateways/{name}/services` and `…/addressLocations` (GET), `…/updateServices` and
//! `…/updateAddressLocations` (POST), `publicIPAddresses/{name}`, `loadBalancers/{name}`,
//! `natGateways/{name}` (PUT/GET/DELETE), and `publicIPAddresses` and `loadBalancers` (GET: the
//! resource group's). Listings are paged with a `nextLink` that carries the request's api-version.
//! A gateway exists only once it is PUT (`404 ResourceNotFound` before and after its DELETE) unless
//! [`EmulatorConfig::auto_create_gateways`] is set. A public IP
//! gets its `ipAddress` from the emulator (IPv4 from `20.0.0.0/8`, IPv6 from `2001:db8:c1b::/48`),
//! keeps it across updates and frees it when deleted.
//! In long-running-operation mode, `/subscriptions/{sub}/providers/Microsoft.Network/locations/local/
//! operations/{id}` (status) and `…/operationResults/{id}` (result).
//!
//! With a write budget configured ([`EmulatorConfig::write_bucket_size`],
//! [`EmulatorConfig::writes_per_window`]; off by default), every mutating call takes one write from
//! its subscription's budget, is refused with `429 SubscriptionRequestsThrottled` and `Retry-After`
//! when the budget is spent, and every mutating answer carries [`REMAINING_WRITES_HEADER`].
//!
//! Control endpoints (no api-version): `GET /_emulator/stats`, `GET /_emulator/dump`,
//! `GET /_emulator/removals`, `GET|PUT /_emulator/config`, `POST /_emulator/reset-stats`,
//! `POST /_emulator/reset` (state, statistics and removal log).

mod budget;
pub mod cli;
mod config;
mod dns;
mod error;
mod families;
mod faults;
mod gateway;
mod http;
mod lro;
pub mod metrics;
mod natfamilies;
mod natlink;
mod ops;
mod pip_users;
mod resources;
mod state;
mod stats;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

pub use budget::REMAINING_WRITES_HEADER;
pub use config::{AddressRefusal, ConfigError, EmulatorConfig, ThrottleResponse};
pub use error::EmulatorError;
pub use state::{Dump, GatewayDump, Removal, RemovalCause, ServiceDump};
pub use stats::Stats;

use budget::WriteBudgets;
use faults::{FaultInjector, Limiter};
use lro::Operations;
use ops::{Applied, Mutation};
use state::NrpState;
use stats::RemovalLog;

/// Locks a mutex, ignoring poisoning (no code path panics while holding a lock).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Inner {
    config: RwLock<EmulatorConfig>,
    state: Mutex<NrpState>,
    stats: Mutex<Stats>,
    removals: Mutex<RemovalLog>,
    faults: Mutex<FaultInjector>,
    limiter: Arc<Limiter>,
    operations: Mutex<Operations>,
    budgets: Mutex<WriteBudgets>,
    apply_cost: faults::ApplyCost,
}

/// A handle on one emulated NRP: cheap to clone (an `Arc` inside); every clone sees the same state.
#[derive(Clone)]
pub struct Emulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator")
            .field("config", &self.config())
            .finish_non_exhaustive()
    }
}

impl Default for Emulator {
    fn default() -> Self {
        Self::build(EmulatorConfig::default())
    }
}

impl Emulator {
    /// An empty emulator with `config`.
    pub fn new(config: EmulatorConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self::build(config))
    }

    fn build(config: EmulatorConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                faults: Mutex::new(FaultInjector::new(config.seed)),
                config: RwLock::new(config),
                state: Mutex::new(NrpState::default()),
                stats: Mutex::new(Stats::default()),
                removals: Mutex::new(RemovalLog::default()),
                limiter: Arc::new(Limiter::default()),
                operations: Mutex::new(Operations::default()),
                budgets: Mutex::new(WriteBudgets::default()),
                apply_cost: faults::ApplyCost::default(),
            }),
        }
    }

    /// The current configuration.
    pub fn config(&self) -> EmulatorConfig {
        self.inner
            .config
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the configuration at run time; the fault RNG is re-seeded (from `config.seed`, or from
    /// OS entropy), so that the fault sequence after this call is reproducible. A change of the
    /// write budget's settings starts every subscription's budget afresh (full).
    pub fn set_config(&self, config: EmulatorConfig) -> Result<(), ConfigError> {
        config.validate()?;
        *lock(&self.inner.faults) = FaultInjector::new(config.seed);
        *self
            .inner
            .config
            .write()
            .unwrap_or_else(PoisonError::into_inner) = config;
        Ok(())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let mut s = lock(&self.inner.stats).clone();
        s.max_concurrent_mutations = self.inner.limiter.max_observed();
        s.in_flight_mutations = self.inner.limiter.in_flight();
        let log = lock(&self.inner.removals);
        s.removals = log.total();
        s.removals_dropped = log.dropped();
        s
    }

    /// Zeroes the counters (not the state, not the removal log).
    pub fn reset_stats(&self) {
        *lock(&self.inner.stats) = Stats::default();
        self.inner.limiter.reset_max();
    }

    /// The full state: gateways → services → address locations → addresses → services; and the
    /// public IPs, load balancers and NAT gateways.
    pub fn dump(&self) -> Dump {
        lock(&self.inner.state).dump()
    }

    /// The removal log, oldest first.
    pub fn removals(&self) -> Vec<Removal> {
        lock(&self.inner.removals).entries()
    }

    /// Forgets everything: state, counters, removal log, operations, write budgets (all full
    /// again; the configuration stays).
    pub fn reset(&self) {
        *lock(&self.inner.state) = NrpState::default();
        lock(&self.inner.budgets).clear();
        lock(&self.inner.removals).clear();
        lock(&self.inner.operations).clear();
        self.reset_stats();
    }

    /// The axum router serving this emulator (ARM routes and control endpoints). [`serve`] uses it;
    /// use it directly to embed the emulator in another server.
    pub fn router(&self) -> axum::Router {
        // Never signalled: requests held by latency or injected timeouts end on their own.
        let (_, rx) = watch::channel(false);
        http::router(self.clone(), rx)
    }

    /// Applies a mutation under the state lock and records its removals.
    fn apply(
        &self,
        m: Mutation,
        cfg: &EmulatorConfig,
        version: clb_nrp::wire::ApiVersion,
    ) -> Result<Applied, EmulatorError> {
        let applied = {
            let mut state = lock(&self.inner.state);
            let mut applied = state.apply(m, cfg, version)?;
            let removals = std::mem::take(&mut applied.removals);
            lock(&self.inner.removals).push(removals, cfg.removal_log_capacity);
            applied
        };
        lock(&self.inner.stats).mutations_applied += 1;
        Ok(applied)
    }
}

/// Serves `emulator` on `listener` until `shutdown` completes. Requests held by latency or injected
/// timeouts are answered `503` at shutdown, so shutdown does not wait for them.
pub async fn serve(
    listener: tokio::net::TcpListener,
    emulator: Emulator,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (tx, rx) = watch::channel(false);
    let app = http::router(emulator, rx);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = tx.send(true);
        })
        .await
}

/// An emulator served on a loopback port in a background task (for tests, benchmarks and the demo).
/// Dropping it shuts the server down.
#[derive(Debug)]
pub struct RunningEmulator {
    addr: SocketAddr,
    emulator: Emulator,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl RunningEmulator {
    /// Binds `127.0.0.1:0` and serves `emulator` there.
    pub async fn start(emulator: Emulator) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, emulator.clone(), async move {
            let _ = rx.await;
        }));
        Ok(Self {
            addr,
            emulator,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:{port}` — the ARM endpoint to give a client.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The served emulator (for in-process stats, dump, removals, config).
    pub fn emulator(&self) -> &Emulator {
        &self.emulator
    }

    /// Shuts the server down and waits for it.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(t) => t.await.map_err(std::io::Error::other)?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningEmulator {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}
