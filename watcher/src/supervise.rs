//! Supervision of the watcher's tasks: nothing dies silently.
//!
//! Every long-running task of [`crate::run`] — the senders (one per gateway), the write-back, the
//! readiness gate, the follower of the lanes' acknowledgements, the kube side (with the
//! PoolService side, which runs inside it) and the node moves it starts — is spawned through
//! `Tasks` and watched by one `Supervisor`. When one of them returns or panics while the
//! watcher is not shutting down, the supervisor logs one error line naming the task and why,
//! aborts every other task and `run` returns a [`WatcherError`], so that the binary exits
//! non-zero and Kubernetes restarts it. A node move that has released its node is done, not
//! failed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use clb_client::client::ClientError;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinHandle};

/// The sender of a gateway (`sender.rs`): resyncs and `Apply` batches.
pub const SENDER: &str = "sender";
/// The write-back (`writeback.rs`): finalizers, ingress, conditions, Events, PoolServices.
pub const WRITE_BACK: &str = "write-back";
/// The pod readiness gate (`gate.rs`, `--readiness-gate`).
pub const READINESS_GATE: &str = "readiness gate";
/// A node moved to another gateway, held at the old one until the new one has it (`moves.rs`).
pub const NODE_MOVE: &str = "node move";
/// The PoolService side of the kube side (`pools.rs`, `--pool-services`).
pub const POOL_SERVICE_SIDE: &str = "PoolService side";
/// The follower of the lanes' acknowledgements (several gateways), read by the write-back.
pub const ACK_FOLLOWER: &str = "acknowledgement follower";
/// The kube side (`lib.rs`): the watch streams, the translators.
pub const KUBE_SIDE: &str = "kube side";

/// Why [`crate::run`] returned without being asked to stop.
#[derive(Debug, thiserror::Error)]
pub enum WatcherError {
    /// The state server's endpoint is invalid: no attempt can ever succeed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A task of the watcher returned or panicked while the watcher was not shutting down.
    #[error("the watcher's {task} task ended: {reason}")]
    TaskEnded {
        /// The task (one of [`SENDER`], [`WRITE_BACK`], [`READINESS_GATE`], [`NODE_MOVE`],
        /// [`POOL_SERVICE_SIDE`], [`ACK_FOLLOWER`], [`KUBE_SIDE`]).
        task: &'static str,
        /// Why: its error, what ended, or the panic's message.
        reason: String,
    },
}

impl WatcherError {
    /// The task that ended (`None`: an invalid endpoint).
    pub fn task(&self) -> Option<&'static str> {
        match self {
            Self::Client(_) => None,
            Self::TaskEnded { task, .. } => Some(task),
        }
    }
}

/// How a supervised task ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// Its work is done (a node move that released its node): not a failure.
    Done,
    /// It (or, for the kube side, a part of it: `task`) stopped working.
    Failed { task: &'static str, reason: String },
    /// A state-server client error no retry can fix (an invalid endpoint).
    Client(ClientError),
    /// It ended because another task did (the write-back's inbox closes when the kube side
    /// ends): reported only if no other task reports its end within [`CAUSE_GRACE`].
    Consequence { task: &'static str, reason: String },
}

/// How long the end of a task that ended because of another one waits for the other's report.
const CAUSE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

impl Ended {
    pub(crate) fn failed(task: &'static str, reason: impl Into<String>) -> Self {
        Self::Failed {
            task,
            reason: reason.into(),
        }
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("it panicked: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("it panicked: {s}")
    } else {
        "it panicked".to_owned()
    }
}

/// A spawned task and its name.
struct Watched {
    task: &'static str,
    handle: JoinHandle<Ended>,
}

impl Future for Watched {
    type Output = (&'static str, Result<Ended, JoinError>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let task = self.task;
        Pin::new(&mut self.handle).poll(cx).map(|r| (task, r))
    }
}

/// Spawns tasks under the [`Supervisor`] (cheap to clone; the kube side keeps one for the node
/// moves).
#[derive(Clone)]
pub(crate) struct Tasks {
    tx: mpsc::UnboundedSender<Watched>,
}

impl Tasks {
    /// Spawns `future` as task `task`, watched from now on.
    pub(crate) fn spawn(
        &self,
        task: &'static str,
        future: impl Future<Output = Ended> + Send + 'static,
    ) {
        let handle = tokio::spawn(future);
        if let Err(mpsc::error::SendError(w)) = self.tx.send(Watched { task, handle }) {
            // The supervisor is gone: the watcher is stopping.
            w.handle.abort();
        }
    }
}

/// Watches every task spawned through its [`Tasks`].
pub(crate) struct Supervisor {
    rx: mpsc::UnboundedReceiver<Watched>,
    running: FuturesUnordered<Watched>,
}

impl Supervisor {
    pub(crate) fn new() -> (Self, Tasks) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Self {
                rx,
                running: FuturesUnordered::new(),
            },
            Tasks { tx },
        )
    }

    /// Until `shutdown` completes (`Ok`) or a task fails (its error, logged); then aborts every
    /// task.
    pub(crate) async fn watch(
        mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), WatcherError> {
        let mut shutdown = std::pin::pin!(shutdown);
        // The end of a task that ended because another did, until that one reports.
        let mut consequence: Option<WatcherError> = None;
        let grace = tokio::time::sleep(CAUSE_GRACE);
        let mut grace = std::pin::pin!(grace);
        let result = loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                Some(w) = self.rx.recv() => self.running.push(w),
                Some((task, r)) = self.running.next() => match failure(task, r) {
                    None => {}
                    Some((e, false)) => break Err(e),
                    Some((e, true)) if consequence.is_none() => {
                        consequence = Some(e);
                        grace.as_mut().reset(tokio::time::Instant::now() + CAUSE_GRACE);
                    }
                    Some((_, true)) => {}
                },
                () = &mut grace, if consequence.is_some() => {
                    break Err(consequence.take().expect("checked"));
                }
            }
        };
        match &result {
            Ok(()) => {}
            Err(WatcherError::TaskEnded { task, reason }) => tracing::error!(
                task,
                reason = %reason,
                "a task of the watcher ended; stopping the watcher (it exits non-zero)"
            ),
            Err(WatcherError::Client(e)) => tracing::error!(
                task = SENDER,
                error = %e,
                "a task of the watcher ended; stopping the watcher (it exits non-zero)"
            ),
        }
        self.rx.close();
        while let Ok(w) = self.rx.try_recv() {
            w.handle.abort();
        }
        for w in self.running.iter() {
            w.handle.abort();
        }
        result
    }
}

/// The error of task `task` that ended with `r` (`None`: it was done), and whether it ended
/// because another task did.
fn failure(task: &'static str, r: Result<Ended, JoinError>) -> Option<(WatcherError, bool)> {
    let (task, reason, consequence) = match r {
        Ok(Ended::Done) => return None,
        Ok(Ended::Failed { task, reason }) => (task, reason, false),
        Ok(Ended::Consequence { task, reason }) => (task, reason, true),
        // Only a sender meets an invalid endpoint it cannot get past.
        Ok(Ended::Client(e)) => return Some((WatcherError::Client(e), false)),
        Err(e) if e.is_panic() => (task, panic_message(e.into_panic().as_ref()), false),
        Err(_) => (task, "it was cancelled".to_owned(), false),
    };
    Some((WatcherError::TaskEnded { task, reason }, consequence))
}

/// A point where a test (feature `test-support`, [`crate::faults`]) makes task `$task` fail:
/// panics there, or evaluates to `true` (the task ends as if its input had ended). `false`, and
/// nothing evaluated, in any other build.
macro_rules! fault_point {
    ($faults:expr, $task:expr) => {{
        #[cfg(any(test, feature = "test-support"))]
        let end = $faults.hit($task);
        #[cfg(not(any(test, feature = "test-support")))]
        let end = {
            let _: &'static str = $task;
            false
        };
        end
    }};
}
pub(crate) use fault_point;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_ends_or_panics_is_named_and_the_others_stop() {
        let (sup, tasks) = Supervisor::new();
        let (_keep, held) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("waits", async move {
            let _ = held.await;
            Ended::Done
        });
        tasks.spawn("done", async { Ended::Done });
        tasks.spawn("boom", async { panic!("kaboom") });
        let e = sup.watch(std::future::pending()).await.unwrap_err();
        assert_eq!(e.task(), Some("boom"));
        assert!(e.to_string().contains("it panicked: kaboom"), "{e}");

        let (sup, tasks) = Supervisor::new();
        tasks.spawn("ends", async { Ended::failed("part", "its stream ended") });
        let e = sup.watch(std::future::pending()).await.unwrap_err();
        assert!(
            matches!(&e, WatcherError::TaskEnded { task: "part", reason } if reason == "its stream ended"),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn a_task_that_ended_because_another_did_waits_for_the_others_report() {
        let (sup, tasks) = Supervisor::new();
        tasks.spawn("follower", async {
            Ended::Consequence {
                task: "follower",
                reason: "its inbox closed".to_owned(),
            }
        });
        tasks.spawn("cause", async {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            Ended::failed("cause", "its stream ended")
        });
        let e = sup.watch(std::future::pending()).await.unwrap_err();
        assert_eq!(e.task(), Some("cause"), "{e}");
        // Alone, it is reported after the grace.
        let (sup, tasks) = Supervisor::new();
        tasks.spawn("follower", async {
            Ended::Consequence {
                task: "follower",
                reason: "its inbox closed".to_owned(),
            }
        });
        let e = sup.watch(std::future::pending()).await.unwrap_err();
        assert_eq!(e.task(), Some("follower"), "{e}");
    }

    #[tokio::test]
    async fn shutdown_is_not_an_error_and_aborts_the_tasks() {
        let (sup, tasks) = Supervisor::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("forever", async move {
            let _tx = tx;
            std::future::pending::<()>().await;
            Ended::Done
        });
        sup.watch(async {}).await.unwrap();
        // The task was aborted: its end of the channel is dropped.
        assert!(rx.await.is_err());
    }
}
