//! An adaptive (AIMD) limit on concurrent mutating NRP calls per gateway: halved when NRP pushes back
//! (429, `AnotherOperationInProgress`), raised by one after a run of successes, always in `[1, max]`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Debug)]
struct State {
    limit: usize,
    in_flight: usize,
    successes: usize,
}

/// The concurrency limit of one gateway. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct AimdLimiter {
    max: usize,
    state: Mutex<State>,
    notify: Notify,
}

/// Why no permit was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireError {
    /// The deadline passed while waiting.
    DeadlineExceeded,
}

impl AimdLimiter {
    /// A limiter allowing up to `max` (at least 1) concurrent calls, starting at `max`.
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            max,
            state: Mutex::new(State {
                limit: max,
                in_flight: 0,
                successes: 0,
            }),
            notify: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current limit.
    pub fn limit(&self) -> usize {
        self.state().limit
    }

    /// Calls holding a permit now.
    pub fn in_flight(&self) -> usize {
        self.state().in_flight
    }

    fn try_acquire(&self) -> bool {
        let mut s = self.state();
        if s.in_flight < s.limit {
            s.in_flight += 1;
            true
        } else {
            false
        }
    }

    /// Waits for a permit until `deadline`.
    pub async fn acquire(self: &Arc<Self>, deadline: Instant) -> Result<Permit, AcquireError> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.try_acquire() {
                return Ok(Permit {
                    limiter: Arc::clone(self),
                    done: false,
                });
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(AcquireError::DeadlineExceeded);
            }
        }
    }

    fn release(&self, outcome: Outcome) {
        {
            let mut s = self.state();
            s.in_flight = s.in_flight.saturating_sub(1);
            match outcome {
                Outcome::Success => {
                    s.successes += 1;
                    if s.successes >= s.limit {
                        s.limit = (s.limit + 1).min(self.max);
                        s.successes = 0;
                    }
                }
                Outcome::Throttled => {
                    s.limit = (s.limit / 2).max(1);
                    s.successes = 0;
                }
                Outcome::Neutral => {}
            }
        }
        self.notify.notify_waiters();
    }
}

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Success,
    Throttled,
    Neutral,
}

/// The right to make one mutating call. Report how the call went with [`Permit::success`] or
/// [`Permit::throttled`]; dropping it otherwise releases it without changing the limit.
#[derive(Debug)]
pub struct Permit {
    limiter: Arc<AimdLimiter>,
    done: bool,
}

impl Permit {
    /// The call succeeded: counts towards raising the limit.
    pub fn success(mut self) {
        self.done = true;
        self.limiter.release(Outcome::Success);
    }

    /// NRP pushed back: halves the limit.
    pub fn throttled(mut self) {
        self.done = true;
        self.limiter.release(Outcome::Throttled);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.done {
            self.limiter.release(Outcome::Neutral);
        }
    }
}

/// One [`AimdLimiter`] per gateway, created on first use; shared by every unit of the worker across
/// reconnections, so that what was learnt about NRP's capacity survives them.
#[derive(Debug)]
pub struct GatewayLimiters {
    max: usize,
    limiters: Mutex<HashMap<String, Arc<AimdLimiter>>>,
}

impl GatewayLimiters {
    /// Limiters allowing up to `max` concurrent mutating calls per gateway.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            limiters: Mutex::new(HashMap::new()),
        }
    }

    /// The current limit of every gateway that has a limiter.
    pub fn limits(&self) -> Vec<(String, usize)> {
        let map = self.limiters.lock().unwrap_or_else(PoisonError::into_inner);
        map.iter().map(|(g, l)| (g.clone(), l.limit())).collect()
    }

    /// The limiter of `gateway`.
    pub fn get(&self, gateway: &str) -> Arc<AimdLimiter> {
        let mut map = self.limiters.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(
            map.entry(gateway.to_string())
                .or_insert_with(|| Arc::new(AimdLimiter::new(self.max))),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn halves_on_throttling_and_grows_back() {
        let l = Arc::new(AimdLimiter::new(8));
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(l.limit(), 8);
        l.acquire(far).await.unwrap().throttled();
        assert_eq!(l.limit(), 4);
        l.acquire(far).await.unwrap().throttled();
        l.acquire(far).await.unwrap().throttled();
        l.acquire(far).await.unwrap().throttled();
        assert_eq!(l.limit(), 1, "never below 1");
        l.acquire(far).await.unwrap().success();
        assert_eq!(l.limit(), 2);
        for _ in 0..2 {
            l.acquire(far).await.unwrap().success();
        }
        assert_eq!(l.limit(), 3);
        for _ in 0..100 {
            l.acquire(far).await.unwrap().success();
        }
        assert_eq!(l.limit(), 8, "never above max");
        assert_eq!(l.in_flight(), 0);
    }

    #[tokio::test]
    async fn waits_respect_the_deadline_and_wake_on_release() {
        let l = Arc::new(AimdLimiter::new(1));
        let far = Instant::now() + Duration::from_secs(60);
        let p = l.acquire(far).await.unwrap();
        let past = Instant::now();
        assert_eq!(
            l.acquire(past).await.unwrap_err(),
            AcquireError::DeadlineExceeded
        );
        let l2 = Arc::clone(&l);
        let waiter = tokio::spawn(async move { l2.acquire(far).await.map(drop) });
        tokio::task::yield_now().await;
        drop(p);
        waiter.await.unwrap().unwrap();
        assert_eq!(l.in_flight(), 0);
    }
}
