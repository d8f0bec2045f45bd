//! What `clbctl demo` and `clbctl load` drive: the whole system in this process (`clb-embedded`:
//! NRP emulator, state server, sync workers), or an external state server with whatever workers and
//! NRP it has. On the embedded system NRP (the emulator) is visible and convergence means NRP equals
//! the expected state; on an external server it is not, and convergence is judged through the Admin
//! API.

use std::time::Duration;

use clb_client::client::Client;
use clb_embedded::{Expected, Harness};
use clb_nrp_emulator::{Emulator, Stats};
use clb_proto::v1::GatewayStatus;

/// The system a command drives.
pub enum System {
    /// The whole system in this process.
    Embedded(Box<Harness>),
    /// An external state server.
    External(External),
}

/// An external state server, and what to read back from it once it has converged.
pub struct External {
    /// The connection (and the gateway every call names).
    pub client: Client,
    /// How often its status is polled while waiting for convergence.
    pub poll: Duration,
    /// Locations whose actual state is read back (`Admin.GetLocation`) and compared with the
    /// expected state after convergence; empty: none.
    pub locations: Vec<String>,
    /// Services and egresses whose presence in NRP is read back (`Admin.GetService`) and compared
    /// after convergence; empty: none.
    pub services: Vec<String>,
}

impl System {
    /// Whether this is the embedded system.
    pub fn is_embedded(&self) -> bool {
        matches!(self, System::Embedded(_))
    }

    /// The state server, on the embedded system.
    pub fn server_state(&self) -> Option<std::sync::Arc<clb_state_server::state::StateServer>> {
        match self {
            System::Embedded(h) => Some(h.server().state.clone()),
            System::External(_) => None,
        }
    }

    /// The NRP emulator, on the embedded system.
    pub fn emulator(&self) -> Option<&Emulator> {
        match self {
            System::Embedded(h) => Some(h.emulator()),
            System::External(_) => None,
        }
    }

    /// The emulator's counters, on the embedded system.
    pub fn stats(&self) -> Option<Stats> {
        self.emulator().map(Emulator::stats)
    }

    /// Resets the emulator's counters (nothing on an external server).
    pub fn reset_stats(&self) {
        if let Some(e) = self.emulator() {
            e.reset_stats();
        }
    }

    /// The status of the gateway the commands drive.
    pub async fn gateway_status(&self) -> Result<GatewayStatus, String> {
        match self {
            System::Embedded(h) => Ok(h.gateway_status().await),
            System::External(x) => {
                let client = &x.client;
                let s = client.status().await.map_err(|e| e.to_string())?;
                crate::status::gateway_of(client, &s)
                    .cloned()
                    .ok_or_else(|| {
                        format!("the state server has no gateway {:?}", client.gateway())
                    })
            }
        }
    }

    /// Waits (at most `patience`) until the system has nothing left to do, then compares it with
    /// `expected`: NRP itself on the embedded system; on an external server the Admin API's
    /// convergence test, then the listed locations and services read back.
    pub async fn try_converge(
        &self,
        expected: &Expected,
        patience: Duration,
    ) -> Result<(), String> {
        match self {
            System::Embedded(h) => h.try_converge(expected, patience).await,
            System::External(x) => {
                crate::status::wait_converged(&x.client, patience, x.poll).await?;
                compare_through_admin(&x.client, &x.locations, &x.services, expected).await
            }
        }
    }

    /// Stops the embedded system (nothing on an external server).
    pub async fn shutdown(self) {
        if let System::Embedded(h) = self {
            h.shutdown().await;
        }
    }
}

/// Compares the state server's actual state (what NRP confirmed) with `expected`, location by
/// location and service by service, through the Admin API.
async fn compare_through_admin(
    client: &Client,
    locations: &[String],
    services: &[String],
    expected: &Expected,
) -> Result<(), String> {
    let mut errors = Vec::new();
    for location in locations {
        let want: std::collections::BTreeMap<&str, Vec<String>> = expected
            .addresses
            .iter()
            .filter(|((l, _), _)| l == location)
            .map(|((_, a), s)| (a.as_str(), s.iter().map(|x| x.to_lowercase()).collect()))
            .collect();
        let have: std::collections::BTreeMap<String, Vec<String>> =
            match client.location(location).await {
                Ok(l) => l
                    .addresses
                    .into_iter()
                    .filter(|a| a.actual)
                    .map(|a| {
                        let mut s: Vec<String> = a
                            .actual_service_ids
                            .iter()
                            .map(|x| x.to_lowercase())
                            .collect();
                        s.sort();
                        (a.address, s)
                    })
                    .collect(),
                Err(e)
                    if e.status()
                        .is_some_and(|s| s.code() == tonic::Code::NotFound) =>
                {
                    Default::default()
                }
                Err(e) => return Err(format!("location {location}: {e}")),
            };
        for (address, w) in &want {
            match have.get(*address) {
                None => errors.push(format!("missing address {location}/{address} with {w:?}")),
                Some(h) if h != w => {
                    errors.push(format!(
                        "address {location}/{address}: has {h:?}, want {w:?}"
                    ));
                }
                Some(_) => {}
            }
        }
        for (address, h) in &have {
            if !want.contains_key(address.as_str()) {
                errors.push(format!("extra address {location}/{address} with {h:?}"));
            }
        }
    }
    let wanted = expected.services();
    for name in services {
        let actual = match client.service(name).await {
            Ok(s) => s.actual,
            Err(e)
                if e.status()
                    .is_some_and(|s| s.code() == tonic::Code::NotFound) =>
            {
                false
            }
            Err(e) => return Err(format!("service {name}: {e}")),
        };
        match (wanted.contains(name), actual) {
            (true, false) => errors.push(format!("missing service {name}")),
            (false, true) => errors.push(format!("extra service {name}")),
            _ => {}
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let mut msg = format!(
        "the actual state differs from the desired state in {} ways (first 30):\n",
        errors.len()
    );
    for e in errors.iter().take(30) {
        msg.push_str(&format!("  {e}\n"));
    }
    Err(msg)
}
