//! Active/standby replicas: leader election with a `coordination.k8s.io/v1` Lease, written on kube's
//! API (GET, create, and replace with the `resourceVersion` precondition: a concurrent writer gets
//! `409 Conflict`), with client-go's algorithm and flag names.
//!
//! * A **standby** tries every `retry_period` to acquire the Lease: it takes it when the Lease does
//!   not exist, is free, or its record has not changed for `lease_duration` as seen on this
//!   replica's own clock (so clock skew between replicas does not matter).
//! * The **leader** renews every `retry_period`. When no renewal has succeeded within
//!   `renew_deadline` of the start of the last successful one, it steps down at once — each API call
//!   is cut at that deadline — and only then goes back to trying as a standby. Since
//!   `renew_deadline < lease_duration`, and another replica needs the record unchanged for
//!   `lease_duration` after it saw it, the old leader has stopped dispatching before a new one can
//!   start: two leaders never dispatch at once.
//! * On a graceful shutdown the leader releases the Lease (empty holder), so that a standby takes
//!   over after one `retry_period` instead of `lease_duration`.
//!
//! The elector reports each change through [`crate::state::StateServer::set_leader`]: becoming
//! leader starts the server afresh, exactly like a restart (empty state, restart gate closed).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tracing::{debug, info, warn};

use crate::state::StateServer;

/// Kubernetes' default `--leader-elect-lease-duration`.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// Kubernetes' default `--leader-elect-renew-deadline`.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Kubernetes' default `--leader-elect-retry-period`.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// How a replica takes part in the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (its holder identity in the Lease): the pod name.
    pub identity: String,
    /// How long a standby waits after the last change of the Lease before it takes it.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the leader renews and a standby tries to acquire.
    pub retry_period: Duration,
}

/// The election's timing makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElectionConfigError {
    /// `renew_deadline` must be shorter than `lease_duration`.
    #[error(
        "--leader-elect-renew-deadline ({renew:?}) must be shorter than --leader-elect-lease-duration ({lease:?})"
    )]
    RenewNotBelowLease {
        /// The renew deadline.
        renew: Duration,
        /// The lease duration.
        lease: Duration,
    },
    /// `retry_period` (with its jitter of 20 %) must be shorter than `renew_deadline`.
    #[error(
        "--leader-elect-retry-period ({retry:?}) × 1.2 must be shorter than --leader-elect-renew-deadline ({renew:?})"
    )]
    RetryNotBelowRenew {
        /// The retry period.
        retry: Duration,
        /// The renew deadline.
        renew: Duration,
    },
    /// A name is empty.
    #[error("{0} must not be empty")]
    Empty(&'static str),
}

impl ElectionConfig {
    /// Checks the timing (as client-go does) and the names.
    pub fn validate(&self) -> Result<(), ElectionConfigError> {
        if self.lease_duration <= self.renew_deadline {
            return Err(ElectionConfigError::RenewNotBelowLease {
                renew: self.renew_deadline,
                lease: self.lease_duration,
            });
        }
        if self.retry_period.mul_f64(1.2) >= self.renew_deadline {
            return Err(ElectionConfigError::RetryNotBelowRenew {
                retry: self.retry_period,
                renew: self.renew_deadline,
            });
        }
        for (what, v) in [
            ("--leader-elect-resource-name", &self.name),
            ("--leader-elect-resource-namespace", &self.namespace),
            ("the replica's identity (--server-id)", &self.identity),
        ] {
            if v.trim().is_empty() {
                return Err(ElectionConfigError::Empty(what));
            }
        }
        Ok(())
    }
}

/// What this replica last saw of the Lease, and when (its own clock).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    holder: String,
    resource_version: Option<String>,
    renew_time: Option<Timestamp>,
    duration: Duration,
}

/// One replica's elector.
struct Elector {
    api: Api<Lease>,
    config: ElectionConfig,
    observed: Option<(Observed, Instant)>,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl Elector {
    fn observe(&mut self, lease: &Lease) {
        let spec = lease.spec.clone().unwrap_or_default();
        let seen = Observed {
            holder: spec.holder_identity.unwrap_or_default(),
            resource_version: lease.metadata.resource_version.clone(),
            renew_time: spec.renew_time.map(|t| t.0),
            duration: spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or(self.config.lease_duration),
        };
        if self.observed.as_ref().map(|(o, _)| o) != Some(&seen) {
            self.observed = Some((seen, Instant::now()));
        }
    }

    /// One attempt: acquires the Lease or renews it. `Ok(false)`: another replica holds it.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let me = self.config.identity.clone();
        let Some(current) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(seconds(self.config.lease_duration)),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            let created = self.api.create(&PostParams::default(), &lease).await?;
            self.observe(&created);
            return Ok(true);
        };
        self.observe(&current);
        let (seen, since) = self.observed.clone().expect("just observed");
        let ours = seen.holder == me;
        if !ours && !seen.holder.is_empty() && since.elapsed() < seen.duration {
            return Ok(false);
        }
        let mut lease = current;
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !ours {
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(me);
        spec.lease_duration_seconds = Some(seconds(self.config.lease_duration));
        spec.renew_time = Some(now());
        // The object carries its resourceVersion: a concurrent writer makes this a 409.
        let replaced = self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await?;
        self.observe(&replaced);
        Ok(true)
    }

    /// Frees the Lease we hold (empty holder), so that a standby takes it at once.
    async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        self.api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::random_range(1.0..1.2))
}

/// Runs the election for `state` until `shutdown` resolves: `state` leads while this replica holds
/// the Lease (see the module documentation). On shutdown a leader steps down and releases the Lease.
pub async fn run(
    api: Api<Lease>,
    config: ElectionConfig,
    state: Arc<StateServer>,
    shutdown: impl Future<Output = ()>,
) {
    let mut elector = Elector {
        api,
        config,
        observed: None,
    };
    let mut shutdown = std::pin::pin!(shutdown);
    let c = elector.config.clone();
    info!(lease = %format!("{}/{}", c.namespace, c.name), identity = %c.identity, "standby: waiting for the leader lease");
    loop {
        // Standby: try to acquire.
        let started = loop {
            let started = Instant::now();
            let attempt =
                tokio::time::timeout(c.renew_deadline, elector.try_acquire_or_renew()).await;
            match attempt {
                Ok(Ok(true)) => break started,
                Ok(Ok(false)) => {}
                Ok(Err(e)) => debug!(error = %e, "leader election: acquiring failed"),
                Err(_) => debug!("leader election: acquiring timed out"),
            }
            tokio::select! {
                () = tokio::time::sleep(jitter(c.retry_period)) => {}
                () = &mut shutdown => return,
            }
        };
        info!(identity = %c.identity, "acquired the leader lease: leading");
        state.set_leader(true);
        let mut last_renew = started;
        // Leader: renew until the deadline passes without a success, or shutdown.
        let stepped_down = loop {
            let deadline = last_renew + c.renew_deadline;
            let wake = (Instant::now() + c.retry_period).min(deadline);
            tokio::select! {
                () = tokio::time::sleep_until(wake.into()) => {}
                () = &mut shutdown => break false,
            }
            if Instant::now() >= deadline {
                break true;
            }
            let started = Instant::now();
            let left = deadline.saturating_duration_since(started);
            match tokio::time::timeout(left, elector.try_acquire_or_renew()).await {
                Ok(Ok(true)) => last_renew = started,
                Ok(Ok(false)) => {
                    warn!("another replica holds the leader lease");
                    break true;
                }
                Ok(Err(e)) => debug!(error = %e, "leader election: renewing failed"),
                Err(_) => debug!("leader election: renewing timed out"),
            }
            if Instant::now() >= last_renew + c.renew_deadline {
                break true;
            }
        };
        // Stop dispatching before anything else: no unit is handed out from here on.
        state.set_leader(false);
        if !stepped_down {
            info!("shutting down: releasing the leader lease");
            let release = tokio::time::timeout(c.retry_period, elector.release()).await;
            if !matches!(release, Ok(Ok(()))) {
                debug!(?release, "the leader lease was not released; it expires");
            }
            return;
        }
        warn!(
            renew_deadline = ?c.renew_deadline,
            "lost the leader lease (no renewal within the renew deadline): standing by"
        );
    }
}
