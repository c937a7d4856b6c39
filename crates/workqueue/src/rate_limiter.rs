//! Rate limiters: how long to wait before an item is retried.
//!
//! As client-go's `default_rate_limiters.go`: per-item exponential backoff,
//! per-item fast/slow, an overall token bucket, and the max of several.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use governor::clock::Clock;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter as Governor};
use parking_lot::Mutex;
use thiserror::Error;

use crate::queue::{Hasher, QueueItem};

/// Decides how long an item waits before it is retried.
pub trait RateLimiter<T>: Send + Sync {
    /// How long `item` should wait now; records one more failure.
    fn when(&self, item: &T) -> Duration;
    /// Stops tracking `item` (it succeeded, or was given up on).
    fn forget(&self, item: &T);
    /// How many failures of `item` have been recorded since it was last forgotten.
    fn num_requeues(&self, item: &T) -> u32;
}

impl<T, R: RateLimiter<T> + ?Sized> RateLimiter<T> for Arc<R> {
    fn when(&self, item: &T) -> Duration {
        (**self).when(item)
    }
    fn forget(&self, item: &T) {
        (**self).forget(item)
    }
    fn num_requeues(&self, item: &T) -> u32 {
        (**self).num_requeues(item)
    }
}

impl<T, R: RateLimiter<T> + ?Sized> RateLimiter<T> for Box<R> {
    fn when(&self, item: &T) -> Duration {
        (**self).when(item)
    }
    fn forget(&self, item: &T) {
        (**self).forget(item)
    }
    fn num_requeues(&self, item: &T) -> u32 {
        (**self).num_requeues(item)
    }
}

/// A rate limiter was configured with values it cannot work with.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum RateLimiterError {
    /// The token bucket's rate must be a positive, finite number of events per second.
    #[error("token bucket rate must be positive and finite, got {0} qps")]
    InvalidQps(f64),
    /// The token bucket must hold at least one token.
    #[error("token bucket burst must be at least 1")]
    ZeroBurst,
}

/// client-go's default: the max of per-item exponential backoff (5 ms
/// doubling to 1000 s) and an overall token bucket (10 qps, burst 100).
pub fn default_controller_rate_limiter<T: QueueItem>() -> MaxOfRateLimiter<T> {
    let exponential =
        ItemExponentialFailureRateLimiter::new(Duration::from_millis(5), Duration::from_secs(1000));
    let bucket = BucketRateLimiter::new(10.0, 100)
        .unwrap_or_else(|_| unreachable!("10 qps, burst 100 are valid"));
    MaxOfRateLimiter::new(vec![Box::new(exponential), Box::new(bucket)])
}

/// Per-item failure counts, with the time of each item's last failure.
///
/// client-go keeps a count until `forget`; a caller that never forgets would
/// grow the map forever. Here, entries whose last failure is older than
/// `stale_after` are swept whenever the map has doubled since the last sweep,
/// which bounds it by the number of items failing within that window at an
/// amortised O(1) cost.
struct Failures<T> {
    counts: DashMap<T, (u32, Instant), Hasher>,
    stale_after: Duration,
    sweep_at: AtomicUsize,
}

const MIN_SWEEP: usize = 1024;

impl<T: QueueItem> Failures<T> {
    fn new(stale_after: Duration) -> Self {
        Self {
            counts: DashMap::default(),
            stale_after,
            sweep_at: AtomicUsize::new(MIN_SWEEP),
        }
    }

    /// Records a failure and returns the number of failures before it.
    fn record(&self, item: &T) -> u32 {
        let now = Instant::now();
        // The common case (an item failing again) does not clone the item.
        if let Some(mut entry) = self.counts.get_mut(item) {
            let previous = entry.0;
            *entry = (previous.saturating_add(1), now);
            return previous;
        }
        let mut previous = 0;
        self.counts
            .entry(item.clone())
            .and_modify(|entry| {
                previous = entry.0;
                *entry = (previous.saturating_add(1), now);
            })
            .or_insert((1, now));
        if previous == 0 {
            self.maybe_sweep(now);
        }
        previous
    }

    fn maybe_sweep(&self, now: Instant) {
        let len = self.counts.len();
        if len < self.sweep_at.load(Ordering::Relaxed) {
            return;
        }
        let stale_after = self.stale_after;
        self.counts
            .retain(|_, (_, last)| now.saturating_duration_since(*last) < stale_after);
        let next = (self.counts.len() * 2).max(MIN_SWEEP);
        self.sweep_at.store(next, Ordering::Relaxed);
    }

    fn forget(&self, item: &T) {
        self.counts.remove(item);
    }

    fn count(&self, item: &T) -> u32 {
        self.counts.get(item).map_or(0, |e| e.0)
    }

    fn len(&self) -> usize {
        self.counts.len()
    }
}

/// Per-item exponential backoff: `base * 2^failures`, capped at `max`.
///
/// client-go's `ItemExponentialFailureRateLimiter`; huge failure counts
/// saturate at `max` instead of overflowing. Failure records idle for
/// longer than twice `max` are dropped even if never forgotten.
pub struct ItemExponentialFailureRateLimiter<T> {
    base: Duration,
    max: Duration,
    failures: Failures<T>,
}

impl<T: QueueItem> fmt::Debug for ItemExponentialFailureRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ItemExponentialFailureRateLimiter")
            .field("base", &self.base)
            .field("max", &self.max)
            .field("tracked", &self.failures.len())
            .finish()
    }
}

impl<T: QueueItem> ItemExponentialFailureRateLimiter<T> {
    /// Backoff from `base`, doubling per failure, never above `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Failures::new(max.saturating_mul(2).max(Duration::from_secs(60))),
        }
    }

    /// How many items have a failure recorded.
    pub fn tracked(&self) -> usize {
        self.failures.len()
    }
}

/// `base * 2^exp`, capped at `max`, without overflow.
fn exponential(base: Duration, exp: u32, max: Duration) -> Duration {
    if exp >= 64 {
        return max;
    }
    let nanos = base.as_nanos().saturating_mul(1u128 << exp);
    if nanos >= max.as_nanos() {
        return max;
    }
    // nanos < max.as_nanos(), so it fits back into a Duration.
    Duration::new(
        (nanos / 1_000_000_000) as u64,
        (nanos % 1_000_000_000) as u32,
    )
}

impl<T: QueueItem> RateLimiter<T> for ItemExponentialFailureRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        exponential(self.base, self.failures.record(item), self.max)
    }
    fn forget(&self, item: &T) {
        self.failures.forget(item)
    }
    fn num_requeues(&self, item: &T) -> u32 {
        self.failures.count(item)
    }
}

/// `fast` for the first `max_fast_attempts` failures of an item, `slow` after:
/// client-go's `ItemFastSlowRateLimiter`.
pub struct ItemFastSlowRateLimiter<T> {
    fast: Duration,
    slow: Duration,
    max_fast_attempts: u32,
    failures: Failures<T>,
}

impl<T: QueueItem> fmt::Debug for ItemFastSlowRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ItemFastSlowRateLimiter")
            .field("fast", &self.fast)
            .field("slow", &self.slow)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .field("tracked", &self.failures.len())
            .finish()
    }
}

impl<T: QueueItem> ItemFastSlowRateLimiter<T> {
    /// `fast` delays for the first `max_fast_attempts` failures, then `slow`.
    pub fn new(fast: Duration, slow: Duration, max_fast_attempts: u32) -> Self {
        Self {
            fast,
            slow,
            max_fast_attempts,
            failures: Failures::new(
                slow.max(fast)
                    .saturating_mul(2)
                    .max(Duration::from_secs(60)),
            ),
        }
    }
}

impl<T: QueueItem> RateLimiter<T> for ItemFastSlowRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        if self.failures.record(item) < self.max_fast_attempts {
            self.fast
        } else {
            self.slow
        }
    }
    fn forget(&self, item: &T) {
        self.failures.forget(item)
    }
    fn num_requeues(&self, item: &T) -> u32 {
        self.failures.count(item)
    }
}

/// A governor clock whose "now" is set by the caller, so that the GCRA can be
/// asked to conform at a future instant: that is how a token is reserved.
#[derive(Clone)]
struct PinnedClock(Arc<Mutex<Instant>>);

impl Clock for PinnedClock {
    type Instant = Instant;
    fn now(&self) -> Instant {
        *self.0.lock()
    }
}

/// An overall token bucket shared by all items: `qps` tokens a second, at
/// most `burst` at once; client-go's `BucketRateLimiter` on `governor`.
///
/// Like `rate.Limiter.Reserve()` in Go, every call takes a token, and when
/// none is left it takes the next one to come and returns how long until
/// then, so a burst of failures is spread out at `qps` instead of being
/// retried all at once. It tracks no item, so `num_requeues` is always 0.
pub struct BucketRateLimiter {
    /// The rate and burst, kept for `Debug`.
    quota: Quota,
    limiter: Governor<NotKeyed, InMemoryState, PinnedClock>,
    now: Arc<Mutex<Instant>>,
    reserve: Mutex<()>,
}

impl fmt::Debug for BucketRateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BucketRateLimiter")
            .field("burst", &self.quota.burst_size())
            .field("period", &self.quota.replenish_interval())
            .finish_non_exhaustive()
    }
}

impl BucketRateLimiter {
    /// A bucket refilled at `qps` tokens per second holding at most `burst`.
    pub fn new(qps: f64, burst: u32) -> Result<Self, RateLimiterError> {
        if !(qps.is_finite() && qps > 0.0) {
            return Err(RateLimiterError::InvalidQps(qps));
        }
        let burst = NonZeroU32::new(burst).ok_or(RateLimiterError::ZeroBurst)?;
        let period = Duration::from_secs_f64(1.0 / qps).max(Duration::from_nanos(1));
        let quota = Quota::with_period(period)
            .ok_or(RateLimiterError::InvalidQps(qps))?
            .allow_burst(burst);
        let now = Arc::new(Mutex::new(Instant::now()));
        Ok(Self {
            quota,
            limiter: Governor::direct_with_clock(quota, PinnedClock(Arc::clone(&now))),
            now,
            reserve: Mutex::new(()),
        })
    }

    /// Takes a token at `now`, returning the wait until it is available.
    fn reserve_at(&self, now: Instant) -> Duration {
        let _one_at_a_time = self.reserve.lock();
        *self.now.lock() = now;
        let mut at = now;
        // At most a couple of rounds: the GCRA conforms at the instant it named.
        for _ in 0..4 {
            match self.limiter.check() {
                Ok(()) => return at.saturating_duration_since(now),
                Err(not_until) => {
                    at = not_until.earliest_possible().max(at);
                    *self.now.lock() = at;
                }
            }
        }
        at.saturating_duration_since(now)
    }
}

impl<T> RateLimiter<T> for BucketRateLimiter {
    fn when(&self, _item: &T) -> Duration {
        self.reserve_at(Instant::now())
    }
    fn forget(&self, _item: &T) {}
    fn num_requeues(&self, _item: &T) -> u32 {
        0
    }
}

/// The longest wait of several limiters (each records the failure), and the
/// highest requeue count: client-go's `MaxOfRateLimiter`.
pub struct MaxOfRateLimiter<T> {
    limiters: Vec<Box<dyn RateLimiter<T>>>,
}

impl<T> fmt::Debug for MaxOfRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaxOfRateLimiter")
            .field("limiters", &self.limiters.len())
            .finish()
    }
}

impl<T> MaxOfRateLimiter<T> {
    /// The max of `limiters`.
    pub fn new(limiters: Vec<Box<dyn RateLimiter<T>>>) -> Self {
        Self { limiters }
    }
}

impl<T> RateLimiter<T> for MaxOfRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        self.limiters
            .iter()
            .map(|l| l.when(item))
            .max()
            .unwrap_or_default()
    }
    fn forget(&self, item: &T) {
        for l in &self.limiters {
            l.forget(item);
        }
    }
    fn num_requeues(&self, item: &T) -> u32 {
        self.limiters
            .iter()
            .map(|l| l.num_requeues(item))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_backoff_doubles_from_base_and_caps_at_max() {
        let l = ItemExponentialFailureRateLimiter::new(
            Duration::from_millis(1),
            Duration::from_secs(1),
        );
        let got: Vec<_> = (0..5).map(|_| l.when(&"one")).collect();
        assert_eq!(got, [1, 2, 4, 8, 16].map(Duration::from_millis));
        assert_eq!(l.num_requeues(&"one"), 5);
        for _ in 0..20 {
            l.when(&"one");
        }
        assert_eq!(l.when(&"one"), Duration::from_secs(1));
        // Another item has its own count.
        assert_eq!(l.when(&"two"), Duration::from_millis(1));
        l.forget(&"one");
        assert_eq!(l.num_requeues(&"one"), 0);
        assert_eq!(l.when(&"one"), Duration::from_millis(1));
    }

    #[test]
    fn exponential_backoff_does_not_overflow_for_huge_failure_counts() {
        let max = Duration::from_secs(1000);
        for exp in [30, 62, 63, 64, 100, u32::MAX] {
            assert_eq!(
                exponential(Duration::from_millis(5), exp, max),
                max,
                "exp {exp}"
            );
        }
        assert_eq!(
            exponential(Duration::MAX, 1, Duration::MAX),
            Duration::MAX,
            "saturating at the largest Duration"
        );
        let l = ItemExponentialFailureRateLimiter::new(Duration::from_millis(5), max);
        l.failures.counts.insert("x", (u32::MAX, Instant::now()));
        assert_eq!(l.when(&"x"), max);
        assert_eq!(l.num_requeues(&"x"), u32::MAX);
    }

    #[test]
    fn failure_records_never_forgotten_are_swept_once_stale() {
        let l = ItemExponentialFailureRateLimiter::new(
            Duration::from_millis(1),
            Duration::from_secs(1),
        );
        let long_ago = Instant::now() - Duration::from_secs(3600);
        for i in 0..MIN_SWEEP {
            l.failures.counts.insert(i, (3, long_ago));
        }
        // The next new item triggers a sweep of the stale ones.
        l.when(&usize::MAX);
        assert_eq!(l.tracked(), 1);
        assert_eq!(l.num_requeues(&usize::MAX), 1);
    }

    #[test]
    fn fast_slow_switches_after_the_fast_attempts() {
        let l = ItemFastSlowRateLimiter::new(Duration::from_millis(5), Duration::from_secs(10), 3);
        let got: Vec<_> = (0..5).map(|_| l.when(&"k")).collect();
        assert_eq!(got, [5, 5, 5, 10_000, 10_000].map(Duration::from_millis));
        assert_eq!(l.num_requeues(&"k"), 5);
        l.forget(&"k");
        assert_eq!(l.when(&"k"), Duration::from_millis(5));
    }

    #[test]
    fn bucket_grants_the_burst_then_spaces_tokens_at_the_rate() {
        let b = BucketRateLimiter::new(10.0, 3).unwrap();
        let t0 = Instant::now();
        let waits: Vec<_> = (0..6).map(|_| b.reserve_at(t0)).collect();
        let ms: Vec<u128> = waits.iter().map(|w| w.as_millis()).collect();
        assert_eq!(ms, [0, 0, 0, 100, 200, 300]);
        // Half a second later the reserved tokens are still owed: the next is at 400 ms.
        assert_eq!(
            b.reserve_at(t0 + Duration::from_millis(50)).as_millis(),
            350
        );
        // Long after, the bucket is full again.
        assert_eq!(b.reserve_at(t0 + Duration::from_secs(60)), Duration::ZERO);
    }

    #[test]
    fn bucket_refuses_bad_settings_saying_which() {
        for qps in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = BucketRateLimiter::new(qps, 10).err().unwrap();
            assert!(err.to_string().contains("qps"), "{err}");
        }
        assert_eq!(
            BucketRateLimiter::new(1.0, 0).err(),
            Some(RateLimiterError::ZeroBurst)
        );
    }

    #[test]
    fn max_of_takes_the_longest_wait_and_the_highest_count() {
        let fast =
            ItemFastSlowRateLimiter::new(Duration::from_millis(5), Duration::from_secs(3), 1);
        let exp = ItemExponentialFailureRateLimiter::new(
            Duration::from_millis(1),
            Duration::from_secs(1),
        );
        let m: MaxOfRateLimiter<&str> = MaxOfRateLimiter::new(vec![Box::new(fast), Box::new(exp)]);
        assert_eq!(m.when(&"k"), Duration::from_millis(5));
        assert_eq!(m.when(&"k"), Duration::from_secs(3));
        assert_eq!(m.num_requeues(&"k"), 2);
        m.forget(&"k");
        assert_eq!(m.num_requeues(&"k"), 0);
    }

    #[test]
    fn default_controller_limiter_starts_at_5ms_and_is_bounded_by_the_bucket() {
        let l = default_controller_rate_limiter::<String>();
        assert_eq!(l.when(&"a".to_string()), Duration::from_millis(5));
        assert_eq!(l.when(&"a".to_string()), Duration::from_millis(10));
        // The burst of 100 is spent after 100 more failures of new items;
        // the bucket then dominates the 5 ms of a first failure.
        let mut last = Duration::ZERO;
        for i in 0..150 {
            last = l.when(&format!("k{i}"));
        }
        assert!(last > Duration::from_secs(3), "{last:?}");
    }
}
