//! How a writer paces its retries after a failed call to the state server.
//!
//! Two kinds of failure are paced differently. A call that reached a server and failed there (a
//! timeout, an internal error) may have cost the server work: the delay doubles from
//! `backoff_initial` up to `backoff_max` (10 s by default), so that hundreds of node agents do not
//! hammer a struggling server. A *refused* call cost no server anything — no connection could be
//! made (the Kubernetes Service has no ready endpoint while a new leader is elected or the only
//! replica restarts), or a standby answered `UNAVAILABLE` — so its delay stops growing at
//! [`RECONNECT_MAX`]: a writer finds a new leader within about 2 s of its election instead of up to
//! 12 s.

use std::time::Duration;

use clb_client::client::ClientError;

/// The largest delay after a refused call (no connection, or `UNAVAILABLE`).
pub const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// Whether `e` cost the server nothing: no connection was made, the connection was closed before
/// any answer (a server that died or stepped down, or a Service with no ready endpoint), or the
/// server refused at once (`UNAVAILABLE`: a standby). A live server that struggles answers with
/// another code (`DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `INTERNAL`), which keeps the long
/// backoff.
pub fn is_refusal(e: &ClientError) -> bool {
    match e {
        ClientError::Connect { .. } | ClientError::StreamClosed { .. } => true,
        ClientError::Rpc { status, .. } => {
            status.code() == tonic::Code::Unavailable || is_transport_failure(status)
        }
        _ => false,
    }
}

/// Whether the call failed on the connection (reset, closed before any answer: tonic reports it
/// as `UNKNOWN` or `CANCELLED` with a transport error as the source), not with an answer of the
/// server.
fn is_transport_failure(status: &tonic::Status) -> bool {
    std::error::Error::source(status)
        .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some())
}

/// Exponential backoff with ±20 % jitter, capped lower for refusals (see the module docs).
#[derive(Debug)]
pub struct ServerBackoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl ServerBackoff {
    /// Starts at `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// After a success: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }

    /// The delay before the next attempt after `e`.
    pub fn next_delay(&mut self, e: &ClientError) -> Duration {
        let cap = if is_refusal(e) {
            self.max.min(RECONNECT_MAX)
        } else {
            self.max
        };
        let d = self.next.min(cap);
        self.next = (self.next * 2).min(self.max);
        d.mul_f64(rand::random_range(0.8..1.2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> ClientError {
        ClientError::Rpc {
            rpc: "Writer.Resync",
            status: tonic::Status::unavailable("this replica is a standby"),
        }
    }

    /// A call whose connection failed, as tonic reports it: a status with a transport error as
    /// its source.
    async fn closed() -> ClientError {
        let err = tonic::transport::Endpoint::from_static("http://127.0.0.1:1")
            .connect()
            .await
            .expect_err("nothing listens on port 1");
        ClientError::Rpc {
            rpc: "Writer.Resync",
            status: tonic::Status::from_error(Box::new(err)),
        }
    }

    fn failed() -> ClientError {
        ClientError::Rpc {
            rpc: "Writer.Resync",
            status: tonic::Status::deadline_exceeded("timeout"),
        }
    }

    #[tokio::test]
    async fn refusals_stop_growing_at_two_seconds_other_failures_at_the_max() {
        let mut b = ServerBackoff::new(Duration::from_millis(200), Duration::from_secs(10));
        let refusals: Vec<Duration> = (0..10).map(|_| b.next_delay(&refused())).collect();
        assert!(refusals[0] <= Duration::from_millis(240), "{refusals:?}");
        assert!(
            refusals.iter().all(|d| *d <= RECONNECT_MAX.mul_f64(1.2)),
            "{refusals:?}"
        );
        // A failure that reached the server waits the grown delay.
        assert!(b.next_delay(&failed()) >= Duration::from_secs(8));
        b.reset();
        assert!(b.next_delay(&failed()) <= Duration::from_millis(240));
        assert!(!is_refusal(&failed()));
        assert!(is_refusal(&closed().await));
        assert!(!is_refusal(&ClientError::Rpc {
            rpc: "Writer.Resync",
            status: tonic::Status::cancelled("no transport error"),
        }));
    }
}
