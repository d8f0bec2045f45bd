//! Azure's write budget per subscription, as Azure Resource Manager and NRP throttle writes: a token
//! bucket (ARM: 200 writes, refilled at 10 per second, per subscription and principal) and a cap on
//! the writes of a sliding window (NRP: 1,000 writes per 5 minutes per subscription). Every mutating
//! ARM request takes one write from both; a request that finds either empty is refused with
//! `429 SubscriptionRequestsThrottled` and a `Retry-After` of the seconds until a write is available
//! again, and takes nothing. Every mutating answer carries
//! `x-ms-ratelimit-remaining-subscription-writes`: the smaller of the two remainders.
//!
//! Time is passed in (`now`), so that the model is tested without waiting; the HTTP front passes
//! `tokio::time::Instant::now()`, which tests may pause and advance.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::config::EmulatorConfig;

/// The response header carrying the writes left in the subscription's budget.
pub const REMAINING_WRITES_HEADER: &str = "x-ms-ratelimit-remaining-subscription-writes";

/// The write budget's settings, taken from [`EmulatorConfig`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BudgetConfig {
    /// Token bucket: size and refill per second (`None`: no bucket).
    pub bucket: Option<(u32, f64)>,
    /// Window cap: writes and window length (`None`: no cap).
    pub window: Option<(u32, Duration)>,
}

impl BudgetConfig {
    pub(crate) fn of(cfg: &EmulatorConfig) -> Self {
        Self {
            bucket: cfg
                .write_bucket_size
                .map(|size| (size, cfg.write_refill_per_sec)),
            window: cfg
                .writes_per_window
                .map(|n| (n, Duration::from_secs(cfg.write_window_secs))),
        }
    }

    /// Whether any budget is on.
    pub(crate) fn is_on(&self) -> bool {
        self.bucket.is_some() || self.window.is_some()
    }
}

/// Why a write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exhausted {
    /// The token bucket is empty.
    Bucket,
    /// The window's cap is reached.
    Window,
}

impl Exhausted {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Bucket => "token bucket",
            Self::Window => "writes per window",
        }
    }
}

/// The outcome of one write against a subscription's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// The write may go ahead; this many writes are left after it.
    Granted { remaining: u32 },
    /// The write is refused: `remaining` (0: the exhausted budget has none), the whole seconds
    /// until both budgets have a write again (at least 1), and the budget that decided the wait.
    Throttled {
        remaining: u32,
        retry_after_secs: u64,
        by: Exhausted,
    },
}

#[derive(Debug)]
struct Budget {
    tokens: f64,
    refilled_at: Instant,
    /// Times of the writes of the window, oldest first.
    writes: VecDeque<Instant>,
}

/// The budgets of every subscription seen (lower-cased ids: ARM ids are case-insensitive).
#[derive(Debug, Default)]
pub(crate) struct WriteBudgets {
    config: Option<BudgetConfig>,
    by_subscription: HashMap<String, Budget>,
}

/// Whole seconds to wait for `d` (rounded up, at least 1).
fn whole_secs(d: Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1)
}

impl WriteBudgets {
    /// Forgets every subscription's budget (all full again).
    pub(crate) fn clear(&mut self) {
        self.by_subscription.clear();
    }

    /// Takes one write from `subscription`'s budget at `now`; `None` when no budget is configured.
    /// A change of the settings since the last call starts every budget afresh (full).
    pub(crate) fn take(
        &mut self,
        subscription: &str,
        cfg: BudgetConfig,
        now: Instant,
    ) -> Option<Take> {
        if self.config != Some(cfg) {
            self.config = Some(cfg);
            self.by_subscription.clear();
        }
        if !cfg.is_on() {
            return None;
        }
        let b = self
            .by_subscription
            .entry(subscription.to_ascii_lowercase())
            .or_insert_with(|| Budget {
                tokens: cfg.bucket.map_or(0.0, |(size, _)| f64::from(size)),
                refilled_at: now,
                writes: VecDeque::new(),
            });
        // Refill the bucket, drop the writes that left the window.
        if let Some((size, rate)) = cfg.bucket {
            let elapsed = now.saturating_duration_since(b.refilled_at).as_secs_f64();
            b.tokens = (b.tokens + elapsed * rate).min(f64::from(size));
            b.refilled_at = now.max(b.refilled_at);
        }
        if let Some((_, window)) = cfg.window {
            while b
                .writes
                .front()
                .is_some_and(|&t| now.saturating_duration_since(t) >= window)
            {
                b.writes.pop_front();
            }
        }
        let bucket_left = cfg.bucket.map(|_| b.tokens.floor() as u32);
        let window_left = cfg
            .window
            .map(|(cap, _)| cap.saturating_sub(b.writes.len() as u32));
        // The wait until each budget has a write again.
        let bucket_wait = match cfg.bucket {
            Some((_, rate)) if b.tokens < 1.0 => Some(if rate > 0.0 {
                whole_secs(Duration::from_secs_f64((1.0 - b.tokens) / rate))
            } else {
                u64::MAX
            }),
            _ => None,
        };
        let window_wait = match cfg.window {
            Some((cap, window)) if b.writes.len() as u64 >= u64::from(cap) => {
                // The write that frees a slot is the one `len - cap` from the front (the oldest
                // when the window is exactly full).
                let freeing = b.writes.len() - cap as usize;
                Some(match b.writes.get(freeing) {
                    Some(&t) => whole_secs((t + window).saturating_duration_since(now)),
                    // A cap of 0: never.
                    None => u64::MAX,
                })
            }
            _ => None,
        };
        let left = |bucket: Option<u32>, window: Option<u32>| match (bucket, window) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => 0,
        };
        if bucket_wait.is_some() || window_wait.is_some() {
            let (retry_after_secs, by) = match (bucket_wait, window_wait) {
                (Some(a), Some(w)) if w > a => (w, Exhausted::Window),
                (Some(a), _) => (a, Exhausted::Bucket),
                (None, Some(w)) => (w, Exhausted::Window),
                (None, None) => unreachable!("one budget is exhausted"),
            };
            return Some(Take::Throttled {
                remaining: left(bucket_left, window_left),
                retry_after_secs,
                by,
            });
        }
        if cfg.bucket.is_some() {
            b.tokens -= 1.0;
        }
        if cfg.window.is_some() {
            b.writes.push_back(now);
        }
        Some(Take::Granted {
            remaining: left(
                bucket_left.map(|n| n.saturating_sub(1)),
                window_left.map(|n| n.saturating_sub(1)),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(size: u32, rate: f64) -> BudgetConfig {
        BudgetConfig {
            bucket: Some((size, rate)),
            window: None,
        }
    }

    fn window(cap: u32, secs: u64) -> BudgetConfig {
        BudgetConfig {
            bucket: None,
            window: Some((cap, Duration::from_secs(secs))),
        }
    }

    fn granted(t: Option<Take>) -> u32 {
        match t {
            Some(Take::Granted { remaining }) => remaining,
            other => panic!("not granted: {other:?}"),
        }
    }

    fn throttled(t: Option<Take>) -> (u32, u64, Exhausted) {
        match t {
            Some(Take::Throttled {
                remaining,
                retry_after_secs,
                by,
            }) => (remaining, retry_after_secs, by),
            other => panic!("not throttled: {other:?}"),
        }
    }

    #[test]
    fn off_by_default() {
        let cfg = BudgetConfig::of(&EmulatorConfig::default());
        assert!(!cfg.is_on());
        let mut b = WriteBudgets::default();
        assert_eq!(b.take("sub", cfg, Instant::now()), None);
    }

    #[test]
    fn bucket_drains_refuses_then_refills() {
        let mut b = WriteBudgets::default();
        let cfg = bucket(3, 0.5);
        let t0 = Instant::now();
        assert_eq!(granted(b.take("sub", cfg, t0)), 2);
        assert_eq!(granted(b.take("sub", cfg, t0)), 1);
        assert_eq!(granted(b.take("sub", cfg, t0)), 0);
        // Empty: one token takes 2 s at 0.5 per second.
        assert_eq!(throttled(b.take("sub", cfg, t0)), (0, 2, Exhausted::Bucket));
        // A refused write takes nothing; half a token after 1 s, so 1 s to go.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(throttled(b.take("sub", cfg, t1)), (0, 1, Exhausted::Bucket));
        let t2 = t0 + Duration::from_secs(2);
        assert_eq!(granted(b.take("sub", cfg, t2)), 0);
        // Refilled to the size, never beyond.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(granted(b.take("sub", cfg, later)), 2);
        // Another subscription has its own bucket (ids are case-insensitive).
        assert_eq!(granted(b.take("other", cfg, t0)), 2);
        assert_eq!(granted(b.take("OTHER", cfg, t0)), 1);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let mut b = WriteBudgets::default();
        let cfg = bucket(1, 10.0);
        let t0 = Instant::now();
        assert_eq!(granted(b.take("s", cfg, t0)), 0);
        // A token takes 0.1 s: Retry-After is at least 1.
        assert_eq!(throttled(b.take("s", cfg, t0)).1, 1);
        assert_eq!(
            granted(b.take("s", cfg, t0 + Duration::from_millis(100))),
            0
        );
    }

    #[test]
    fn sliding_window_caps_and_frees_with_the_oldest_write() {
        let mut b = WriteBudgets::default();
        let cfg = window(3, 300);
        let t0 = Instant::now();
        assert_eq!(granted(b.take("s", cfg, t0)), 2);
        assert_eq!(granted(b.take("s", cfg, t0 + Duration::from_secs(10))), 1);
        assert_eq!(granted(b.take("s", cfg, t0 + Duration::from_secs(20))), 0);
        // Full until the first write is 300 s old.
        let (remaining, retry, by) = throttled(b.take("s", cfg, t0 + Duration::from_secs(100)));
        assert_eq!((remaining, retry, by), (0, 200, Exhausted::Window));
        let t300 = t0 + Duration::from_secs(300);
        assert_eq!(granted(b.take("s", cfg, t300)), 0);
        assert_eq!(
            throttled(b.take("s", cfg, t300 + Duration::from_millis(500))).1,
            10,
            "the next slot frees when the write at 10 s leaves (9.5 s, rounded up)"
        );
    }

    #[test]
    fn both_budgets_remaining_is_the_smaller_and_retry_after_the_longer() {
        let mut b = WriteBudgets::default();
        let cfg = BudgetConfig {
            bucket: Some((5, 1.0)),
            window: Some((3, Duration::from_secs(60))),
        };
        let t0 = Instant::now();
        assert_eq!(granted(b.take("s", cfg, t0)), 2, "min(4, 2)");
        assert_eq!(granted(b.take("s", cfg, t0)), 1);
        assert_eq!(granted(b.take("s", cfg, t0)), 0);
        // The window is full (60 s), the bucket is not (2 tokens).
        assert_eq!(throttled(b.take("s", cfg, t0)), (0, 60, Exhausted::Window));
        // Drain the bucket with a larger window: the bucket decides.
        let mut b = WriteBudgets::default();
        let cfg = BudgetConfig {
            bucket: Some((2, 0.25)),
            window: Some((100, Duration::from_secs(60))),
        };
        b.take("s", cfg, t0);
        b.take("s", cfg, t0);
        assert_eq!(throttled(b.take("s", cfg, t0)), (0, 4, Exhausted::Bucket));
    }

    #[test]
    fn new_settings_start_afresh() {
        let mut b = WriteBudgets::default();
        let t0 = Instant::now();
        assert_eq!(granted(b.take("s", bucket(1, 1.0), t0)), 0);
        assert!(matches!(
            b.take("s", bucket(1, 1.0), t0),
            Some(Take::Throttled { .. })
        ));
        assert_eq!(granted(b.take("s", bucket(2, 1.0), t0)), 1);
        b.clear();
        assert_eq!(granted(b.take("s", bucket(2, 1.0), t0)), 1);
    }
}
