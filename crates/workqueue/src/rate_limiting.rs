//! RateLimitingQueue: a DelayingQueue whose re-adds wait as a RateLimiter says.

use std::ops::Deref;
use std::sync::Arc;

use crate::{DelayingQueue, Priority, QueueConfig, QueueItem, RateLimiter, Taken};

/// A [`DelayingQueue`] with per-item retry delays: client-go's
/// `RateLimitingInterface`.
///
/// A worker that fails on an item [`retry`](Taken::retry)s it (the item
/// comes back after the limiter's delay); one that succeeds
/// [`forget`](Taken::forget)s it so the next failure starts from the
/// shortest delay. Both consume the guard [`get`](Self::get) handed out.
pub struct RateLimitingQueue<T> {
    queue: DelayingQueue<T>,
    limiter: Arc<dyn RateLimiter<T>>,
}

impl<T> Clone for RateLimitingQueue<T> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<T> std::fmt::Debug for RateLimitingQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.queue.fmt(f)
    }
}

impl<T> Deref for RateLimitingQueue<T> {
    type Target = DelayingQueue<T>;
    fn deref(&self) -> &DelayingQueue<T> {
        &self.queue
    }
}

impl<T: QueueItem> RateLimitingQueue<T> {
    /// An unnamed queue without metrics, retrying as `limiter` says.
    pub fn new(limiter: impl RateLimiter<T> + 'static) -> Self {
        Self::with_config(limiter, QueueConfig::default())
    }

    /// A queue built from `config`, retrying as `limiter` says.
    pub fn with_config(limiter: impl RateLimiter<T> + 'static, config: QueueConfig) -> Self {
        Self {
            queue: DelayingQueue::with_config(config),
            limiter: Arc::new(limiter),
        }
    }

    /// [`Queue::get`](crate::Queue::get), with a guard that can also
    /// [`forget`](Taken::forget), [`retry`](Taken::retry) and
    /// [`requeue_after`](Taken::requeue_after).
    pub async fn get(&self) -> Option<Taken<T, Self>> {
        let (item, priority) = self.queue.queue().take().await?;
        Some(Taken::new(self.clone(), item, priority))
    }

    /// Adds `item` back after the delay the rate limiter gives for it now.
    pub fn add_rate_limited(&self, item: T) {
        self.add_rate_limited_with_priority(item, Priority::High);
    }

    /// [`add_rate_limited`](Self::add_rate_limited), queued at `priority`
    /// when the delay has passed (a worker retrying an item keeps the
    /// priority it took it at).
    pub fn add_rate_limited_with_priority(&self, item: T, priority: Priority) {
        let delay = self.limiter.when(&item);
        self.queue.add_after_with_priority(item, delay, priority);
    }

    /// Clears the limiter's record of `item` (call it when processing succeeded).
    pub fn forget(&self, item: &T) {
        self.limiter.forget(item);
    }

    /// How many times `item` has been rate-limited since it was last forgotten.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.limiter.num_requeues(item)
    }

    /// The rate limiter.
    pub fn rate_limiter(&self) -> &Arc<dyn RateLimiter<T>> {
        &self.limiter
    }
}
