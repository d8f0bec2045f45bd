//! The cost of a write: every request but a GET waits the API's write latency (a real API
//! server's etcd commit) and is counted while it is served.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Inner;

/// A write being served (counted in [`Inner::writes_in_flight`] until dropped, and in
/// [`Inner::pod_writes_in_flight`] too if it writes a pod).
pub(super) struct WriteInFlight {
    inner: Arc<Mutex<Inner>>,
    pod: bool,
    pub(super) latency: Duration,
}

impl WriteInFlight {
    pub(super) fn enter(inner: &Arc<Mutex<Inner>>, path: &str) -> Self {
        let mut i = inner.lock().unwrap();
        i.writes_in_flight += 1;
        i.max_writes_in_flight = i.max_writes_in_flight.max(i.writes_in_flight);
        let pod = path.contains("/pods/");
        if pod {
            i.pod_writes_in_flight += 1;
            i.max_pod_writes_in_flight = i.max_pod_writes_in_flight.max(i.pod_writes_in_flight);
        }
        Self {
            inner: inner.clone(),
            pod,
            latency: i.write_latency,
        }
    }
}

impl Drop for WriteInFlight {
    fn drop(&mut self) {
        if let Ok(mut i) = self.inner.lock() {
            i.writes_in_flight -= 1;
            if self.pod {
                i.pod_writes_in_flight -= 1;
            }
        }
    }
}
