//! Retry pacing of the watch streams: a failed connection backs off (exponentially, with jitter), but
//! an expired watch (`410 Gone`) relists at once and any event resets the backoff.
//!
//! kube's `default_backoff()` applies its delay to every error, so after an API-server outage (during
//! which the delay grew to many seconds) the `410 Gone` of the resumed watch waited that long again
//! before the relist: a change written the moment the API server was back took ~15 s to reach NRP.

use std::time::Duration;

use futures::stream::{BoxStream, Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;

/// The backoff between attempts to re-open a failed watch: the policy of
/// [`clb_client::backoff`] from 200 ms (or `max` if smaller), doubling up to `max`, each delay
/// drawn from the upper half of its step (with a seed of its own per stream and process, so that
/// the watchers of a cluster do not retry in lockstep). [`paced`] resets it on any event or
/// `410 Gone`.
pub fn connection_backoff(max: Duration) -> watcher::ExponentialBackoff {
    let max = max.max(Duration::from_millis(1));
    clb_client::backoff::policy(Duration::from_millis(200), max).into()
}

/// Whether `e` is an expired watch (`410 Gone`): the next poll of the watcher relists.
pub fn is_gone(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(s) if s.code == 410)
}

/// `inner` with retries paced by `backoff`: after an error other than `410 Gone` the next poll waits
/// `backoff.next()`; after `410 Gone` or any event it does not wait, and the backoff starts over.
pub fn paced<T, B>(
    inner: impl Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    backoff: B,
) -> impl Stream<Item = Result<T, watcher::Error>> + Send
where
    T: Send + 'static,
    B: Backoff + 'static,
{
    let inner: BoxStream<'static, Result<T, watcher::Error>> = inner.boxed();
    futures::stream::unfold(
        (inner, backoff, None::<Duration>),
        |(mut inner, mut backoff, wait)| async move {
            if let Some(d) = wait {
                tokio::time::sleep(d).await;
            }
            let item = inner.next().await?;
            let wait = match &item {
                Err(e) if !is_gone(e) => backoff.next(),
                _ => {
                    backoff.reset();
                    None
                }
            };
            Some((item, (inner, backoff, wait)))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    /// 1 s, 2 s, 4 s, … (no jitter), reset to 1 s.
    struct Doubling(Duration);

    impl Iterator for Doubling {
        type Item = Duration;
        fn next(&mut self) -> Option<Duration> {
            let d = self.0;
            self.0 *= 2;
            Some(d)
        }
    }

    impl Backoff for Doubling {
        fn reset(&mut self) {
            self.0 = Duration::from_secs(1);
        }
    }

    fn status(code: u16) -> watcher::Error {
        watcher::Error::WatchError(Box::new(Status::failure("test", "Test").with_code(code)))
    }

    /// Virtual time (tokio's paused clock) taken to get each item: deterministic, not a wall clock.
    #[tokio::test(start_paused = true)]
    async fn gone_relists_at_once_after_an_outage_grew_the_backoff() {
        let items: Vec<Result<u32, watcher::Error>> = vec![
            Err(status(503)),
            Err(status(503)),
            Err(status(503)),
            Err(status(410)),
            Ok(1),
            Err(status(503)),
            Ok(2),
        ];
        let mut s = std::pin::pin!(paced(
            futures::stream::iter(items),
            Doubling(Duration::from_secs(1))
        ));
        let mut waits = Vec::new();
        let mut t = tokio::time::Instant::now();
        while let Some(item) = s.next().await {
            let now = tokio::time::Instant::now();
            waits.push((now - t).as_secs());
            t = now;
            let _ = item;
        }
        // Before each item, the wait the previous one earned: 503s back off 1, 2, 4 s; the 410 is
        // followed at once by the relist's event; after an event the backoff starts over at 1 s.
        assert_eq!(waits, vec![0, 1, 2, 4, 0, 0, 1]);
    }

    /// During a long outage the delay between attempts stops growing at the cap (jitter included),
    /// so the first attempt after the API server is back comes within about 1 s of it with the
    /// default cap of 1 s — kube's default grew to 30 s.
    #[test]
    fn the_connection_backoff_stops_growing_at_its_cap() {
        let max = Duration::from_secs(1);
        // backon computes its steps in f32: a few nanoseconds of slack.
        let slack = Duration::from_micros(1);
        let mut b = connection_backoff(max);
        let delays: Vec<Duration> = (0..50).map(|_| b.next().expect("never gives up")).collect();
        assert!(
            delays[0] <= Duration::from_millis(200) + slack,
            "{delays:?}"
        );
        assert!(delays.iter().all(|d| *d <= max + slack), "{delays:?}");
        assert!(
            delays[40..].iter().all(|d| *d + slack >= max / 2),
            "{delays:?}"
        );
        b.reset();
        assert!(b.next().unwrap() <= Duration::from_millis(200) + slack);
    }
}
