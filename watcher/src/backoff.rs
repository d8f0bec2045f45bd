//! How a writer paces its retries after a failed call to the state server: the one policy of
//! [`clb_client::backoff`] (backon's exponential backoff, each delay drawn from the upper half of
//! its step), with a lower cap for refusals.
//!
//! Two kinds of failure are paced differently. A call that reached a server and failed there (a
//! timeout, an internal error) may have cost the server work: the delay doubles from
//! `backoff_initial` up to `backoff_max` (10 s by default), so that hundreds of node agents do not
//! hammer a struggling server. A *refused* call cost no server anything — no connection could be
//! made (the Kubernetes Service has no ready endpoint while a new leader is elected or the only
//! replica restarts), or a standby answered `UNAVAILABLE` — so its delay stops growing at
//! [`RECONNECT_MAX`]: a writer finds a new leader within about 2 s of its election instead of up to
//! 10 s.

use std::time::Duration;

use clb_client::backoff::Backoff;
use clb_client::client::ClientError;

pub use clb_client::backoff::RECONNECT_MAX;

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

/// [`clb_client::backoff::Backoff`] with refusals (see [`is_refusal`]) capped at [`RECONNECT_MAX`].
#[derive(Debug)]
pub struct ServerBackoff(Backoff);

impl ServerBackoff {
    /// Starts at `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self(Backoff::new(initial, max).with_refusal_cap(RECONNECT_MAX))
    }

    /// After a success: the next failure waits about `initial` again.
    pub fn reset(&mut self) {
        self.0.reset();
    }

    /// The delay before the next attempt after `e`.
    pub fn next_delay(&mut self, e: &ClientError) -> Duration {
        self.0.next_delay(is_refusal(e))
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
        // backon computes its steps in f32: a few nanoseconds of slack.
        let slack = Duration::from_micros(1);
        assert!(
            refusals[0] <= Duration::from_millis(200) + slack,
            "{refusals:?}"
        );
        assert!(
            refusals.iter().all(|d| *d <= RECONNECT_MAX + slack),
            "{refusals:?}"
        );
        // A failure that reached the server waits the grown delay (the upper half of 10 s).
        assert!(b.next_delay(&failed()) + slack >= Duration::from_secs(5));
        b.reset();
        assert!(b.next_delay(&failed()) <= Duration::from_millis(200) + slack);
        assert!(!is_refusal(&failed()));
        assert!(is_refusal(&closed().await));
        assert!(!is_refusal(&ClientError::Rpc {
            rpc: "Writer.Resync",
            status: tonic::Status::cancelled("no transport error"),
        }));
    }
}
