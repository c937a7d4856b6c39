//! Work queues for controllers: client-go's `util/workqueue` in Rust.
//!
//! A controller's event handlers add keys; its workers `get` a key (a
//! [`Taken`] guard), reconcile it, and drop the guard, which marks it done.
//! The queue guarantees what makes that loop correct:
//!
//! - a key is never handed to two workers at once;
//! - a key added while it is being processed is handed out again once it
//!   is done, so the latest state is always reconciled;
//! - a key added many times before a worker takes it is handed out once.
//!
//! [`Queue`] is that core. [`DelayingQueue`] adds [`add_after`](DelayingQueue::add_after)
//! (one heap and one timer task for all pending items), and
//! [`RateLimitingQueue`] adds [`add_rate_limited`](RateLimitingQueue::add_rate_limited),
//! [`forget`](RateLimitingQueue::forget) and [`num_requeues`](RateLimitingQueue::num_requeues)
//! (and, on its guard, [`retry`](Taken::retry) and [`forget`](Taken::forget))
//! on top of a [`RateLimiter`]: per-item exponential backoff, a token bucket
//! on `governor`, fast/slow, and the max of several
//! ([`default_controller_rate_limiter`] is client-go's default).
//!
//! Each layer derefs to the one below, so a `RateLimitingQueue` is used like
//! a `Queue`. Metrics go to an optional [`MetricsProvider`]; without one the
//! queue does not even read the clock.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! use kinformer_workqueue::{RateLimitingQueue, default_controller_rate_limiter};
//!
//! let queue = RateLimitingQueue::new(default_controller_rate_limiter());
//! queue.add("default/web".to_string());
//! queue.add("default/web".to_string()); // deduplicated
//! let key = queue.get().await.unwrap();
//! assert_eq!(queue.len(), 0);
//! // The reconcile failed: retry later, with backoff (and done).
//! key.retry();
//! assert_eq!(queue.num_requeues(&"default/web".to_string()), 1);
//! let again = queue.get().await.unwrap();
//! // It succeeded: its failures are forgotten (and it is done).
//! again.forget();
//! queue.shut_down();
//! assert!(queue.get().await.is_none());
//! # });
//! ```

#![deny(missing_docs)]
#![warn(clippy::return_self_not_must_use)]

mod delaying;
mod metrics;
mod queue;
mod rate_limiter;
mod rate_limiting;
mod sync;
mod taken;

pub use delaying::DelayingQueue;
pub use metrics::{
    CounterMetric, GaugeMetric, HistogramMetric, MetricsProvider, SettableGaugeMetric,
};
pub use queue::{DEFAULT_PRIORITY_AGING, MAX_DELAY, Priority, Queue, QueueConfig, QueueItem};
pub use rate_limiter::{
    BucketRateLimiter, ItemExponentialFailureRateLimiter, ItemFastSlowRateLimiter,
    MaxOfRateLimiter, RateLimiter, RateLimiterError, default_controller_rate_limiter,
};
pub use rate_limiting::RateLimitingQueue;
pub use taken::Taken;

/// The README's code, compiled (and run, unless marked `no_run`) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
