//! The convergence latency of `clbctl load`: followed churn events, read back through
//! `Admin.GetLocation` until each converged, was abandoned (its pod churned away) or timed out.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clb_client::client::Client;

use super::load::lock;

/// A followed churn event.
#[derive(Debug, Clone)]
pub(super) struct Sample {
    pub(super) address: String,
    pub(super) location: String,
    pub(super) service: String,
    pub(super) acked_at: Instant,
}

#[derive(Debug, Default)]
pub(super) struct Samples {
    pub(super) pending: Vec<Sample>,
    pub(super) latencies: Vec<Duration>,
    pub(super) abandoned: u64,
    /// Followed events given up after `--sample-timeout`.
    pub(super) timed_out: u64,
    pub(super) poll_errors: u64,
}

impl Samples {
    /// Gives up the followed events acknowledged more than `timeout` before `now`.
    fn give_up_older_than(&mut self, timeout: Duration, now: Instant) {
        let before = self.pending.len();
        self.pending
            .retain(|s| now.saturating_duration_since(s.acked_at) <= timeout);
        self.timed_out += (before - self.pending.len()) as u64;
    }
}

/// Reads the locations of the pending samples back until each converged or was abandoned.
pub(super) async fn poll_samples(
    client: Client,
    samples: Arc<Mutex<Samples>>,
    every: Duration,
    timeout: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let snapshot: Vec<Sample> = {
            let mut s = lock(&samples);
            s.give_up_older_than(timeout, Instant::now());
            s.pending.clone()
        };
        let mut by_location: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
        for s in snapshot {
            by_location.entry(s.location.clone()).or_default().push(s);
        }
        let reads = by_location.into_iter().map(|(location, group)| {
            let client = client.clone();
            async move {
                let state = client.location(&location).await;
                (Instant::now(), state, group)
            }
        });
        for (at, state, group) in futures::future::join_all(reads).await {
            let mut s = lock(&samples);
            let state = match state {
                Ok(state) => state,
                Err(e)
                    if e.status()
                        .is_some_and(|s| s.code() == tonic::Code::NotFound) =>
                {
                    Default::default()
                }
                Err(_) => {
                    s.poll_errors += 1;
                    continue;
                }
            };
            for sample in group {
                let entry = state.addresses.iter().find(|a| a.address == sample.address);
                let done = entry.is_some_and(|a| {
                    a.actual
                        && a.actual_service_ids
                            .iter()
                            .any(|x| x.eq_ignore_ascii_case(&sample.service))
                });
                let gone = entry.is_none_or(|a| !a.desired);
                if done || gone {
                    s.pending.retain(|p| p.address != sample.address);
                    if done {
                        s.latencies
                            .push(at.saturating_duration_since(sample.acked_at));
                    } else {
                        s.abandoned += 1;
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn followed_events_older_than_the_timeout_are_given_up_and_counted() {
        let t0 = Instant::now();
        let sample = |ms: u64| Sample {
            service: "s".into(),
            address: format!("10.0.0.{ms}"),
            location: "10.1.0.1".into(),
            acked_at: t0 + Duration::from_millis(ms),
        };
        let mut s = Samples {
            pending: vec![sample(0), sample(5), sample(9)],
            ..Samples::default()
        };
        s.give_up_older_than(Duration::from_millis(4), t0 + Duration::from_millis(10));
        assert_eq!(s.timed_out, 2);
        assert_eq!(s.pending.len(), 1);
        assert_eq!(s.pending[0].address, "10.0.0.9");
    }
}
