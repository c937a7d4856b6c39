//! [`Taken`]: an item a worker took from a queue, handed out as a guard
//! (as tokio's semaphore permits are) so that client-go's paired calls
//! cannot be missed.
//!
//! In client-go every `Get` must be followed by exactly one `Done`, and a
//! worker that forgets it (an early `return`, a panic unwound past it, a
//! task aborted mid-reconcile) leaves its item marked as processing for
//! good: later adds only mark it dirty and it is never handed out again.
//! Here the guard marks the item done when it is dropped, however the
//! worker ends; [`forget`](Taken::forget), [`retry`](Taken::retry) and
//! [`requeue_after`](Taken::requeue_after) consume it, so that "forget,
//! then done" or "add rate-limited, then done" is one call that cannot be
//! half made.

use std::fmt;
use std::ops::Deref;
use std::time::Duration;

use crate::{DelayingQueue, Priority, Queue, QueueItem, RateLimitingQueue};

/// An item taken from a queue for processing: [`Queue::get`],
/// [`DelayingQueue::get`] or [`RateLimitingQueue::get`]. Dropping it marks
/// the item done (client-go's `Done`): an item added again meanwhile is
/// queued again then. `Q` is the queue it came from, which decides what
/// else it can do ([`RateLimitingQueue`]'s can [`forget`](Self::forget),
/// [`retry`](Self::retry) and [`requeue_after`](Self::requeue_after)).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use kinformer_workqueue::Queue;
///
/// let queue = Queue::new();
/// queue.add("default/web".to_string());
/// let taken = queue.get().await.unwrap();
/// assert_eq!(*taken, "default/web");
/// queue.add("default/web".to_string()); // while processed: only marked dirty
/// assert_eq!(queue.len(), 0);
/// drop(taken); // done: queued again
/// assert_eq!(queue.len(), 1);
/// # });
/// ```
#[must_use = "the item is done as soon as its guard drops: hold it while the item is processed"]
pub struct Taken<T: QueueItem, Q: AsRef<Queue<T>> = Queue<T>> {
    queue: Q,
    item: T,
    priority: Priority,
}

impl<T: QueueItem, Q: AsRef<Queue<T>>> Taken<T, Q> {
    pub(crate) fn new(queue: Q, item: T, priority: Priority) -> Self {
        Self {
            queue,
            item,
            priority,
        }
    }

    /// The item.
    pub fn item(&self) -> &T {
        &self.item
    }

    /// The priority it was queued at (a worker that retries it keeps it).
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Marks the item done now (the same as dropping the guard).
    pub fn done(self) {}
}

impl<T: QueueItem, Q: AsRef<Queue<T>>> Drop for Taken<T, Q> {
    fn drop(&mut self) {
        self.queue.as_ref().done(&self.item);
    }
}

impl<T: QueueItem, Q: AsRef<Queue<T>>> Deref for Taken<T, Q> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.item
    }
}

impl<T: QueueItem + fmt::Debug, Q: AsRef<Queue<T>>> fmt::Debug for Taken<T, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Taken")
            .field("item", &self.item)
            .field("priority", &self.priority)
            .finish()
    }
}

impl<T: QueueItem> Taken<T, DelayingQueue<T>> {
    /// Queues the item again at `priority` once `delay` has passed (see
    /// [`DelayingQueue::add_after_with_priority`]), then marks it done.
    pub fn requeue_after(self, delay: Duration, priority: Priority) {
        self.queue
            .add_after_with_priority(self.item.clone(), delay, priority);
    }
}

impl<T: QueueItem> Taken<T, RateLimitingQueue<T>> {
    /// Clears the rate limiter's record of the item (processing it
    /// succeeded), then marks it done.
    pub fn forget(self) {
        self.queue.forget(&self.item);
    }

    /// Queues the item again, at the priority it was taken at, after the
    /// delay the rate limiter gives for it now (processing it failed), then
    /// marks it done.
    pub fn retry(self) {
        self.queue
            .add_rate_limited_with_priority(self.item.clone(), self.priority);
    }

    /// Clears the rate limiter's record of the item and queues it again at
    /// `priority` once `delay` has passed (a periodic look: controller-runtime's
    /// `RequeueAfter` forgets and adds after), then marks it done.
    pub fn requeue_after(self, delay: Duration, priority: Priority) {
        self.queue.forget(&self.item);
        self.queue
            .add_after_with_priority(self.item.clone(), delay, priority);
    }

    /// How many times the item has been retried since it was last forgotten.
    pub fn num_requeues(&self) -> u32 {
        self.queue.num_requeues(&self.item)
    }
}

impl<T> AsRef<Queue<T>> for Queue<T> {
    fn as_ref(&self) -> &Queue<T> {
        self
    }
}

impl<T> AsRef<Queue<T>> for DelayingQueue<T> {
    fn as_ref(&self) -> &Queue<T> {
        self
    }
}

impl<T> AsRef<Queue<T>> for RateLimitingQueue<T> {
    fn as_ref(&self) -> &Queue<T> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::default_controller_rate_limiter;

    fn rate_limited() -> RateLimitingQueue<String> {
        RateLimitingQueue::new(default_controller_rate_limiter())
    }

    /// No constructor spawns onto a runtime it was not given: made on a
    /// thread without one, the queue starts its timer on the runtime of its
    /// first `get`.
    #[test]
    fn a_rate_limiting_queue_made_outside_a_runtime_works_inside_one() {
        let queue = rate_limited();
        queue.add_after("ns/a".to_owned(), Duration::from_millis(5));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let taken = runtime.block_on(queue.get()).unwrap();
        assert_eq!(*taken, "ns/a");
        taken.retry();
        assert_eq!(*runtime.block_on(queue.get()).unwrap(), "ns/a");
    }

    /// Its timer task dies with the runtime that started it; the next
    /// runtime to use the queue starts another, so no delayed item is
    /// stranded.
    #[test]
    fn a_queue_outlives_the_runtime_that_started_its_timer() {
        let paused = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
        };
        let queue = rate_limited();
        let first = paused();
        first.block_on(async { queue.add_after("ns/a".to_owned(), Duration::from_secs(1)) });
        drop(first);
        let second = paused();
        let taken = second
            .block_on(async { tokio::time::timeout(Duration::from_secs(3600), queue.get()).await });
        assert_eq!(
            taken.expect("a delayed item stranded").unwrap().as_str(),
            "ns/a"
        );
    }

    #[tokio::test]
    async fn a_worker_aborted_while_it_holds_an_item_leaves_it_done_not_processing() {
        let queue = rate_limited();
        queue.add("ns/a".to_owned());
        let (taken_tx, taken_rx) = tokio::sync::oneshot::channel();
        let worker = tokio::spawn({
            let queue = queue.clone();
            async move {
                let _taken = queue.get().await;
                let _ = taken_tx.send(());
                std::future::pending::<()>().await;
            }
        });
        taken_rx.await.unwrap();
        queue.add("ns/a".to_owned());
        assert_eq!(queue.len(), 0, "held by the worker: only marked dirty");
        worker.abort();
        let _ = worker.await;
        assert_eq!(queue.len(), 1, "the aborted worker's guard marked it done");
        assert_eq!(*queue.get().await.unwrap(), "ns/a");
    }

    #[tokio::test]
    async fn retry_queues_the_item_again_at_the_priority_it_was_taken_at() {
        tokio::time::pause();
        let queue = rate_limited();
        queue.add_with_priority("ns/a".to_owned(), Priority::Low);
        let taken = queue.get().await.unwrap();
        assert_eq!(taken.priority(), Priority::Low);
        taken.retry();
        assert_eq!(queue.num_requeues(&"ns/a".to_owned()), 1);
        let again = queue.get().await.unwrap();
        assert_eq!(again.priority(), Priority::Low);
        assert_eq!(again.num_requeues(), 1);
        again.forget();
        assert_eq!(queue.num_requeues(&"ns/a".to_owned()), 0);
    }

    #[tokio::test]
    async fn requeue_after_forgets_the_failures_and_queues_the_item_after_the_delay() {
        tokio::time::pause();
        let queue = rate_limited();
        queue.add_rate_limited("ns/a".to_owned());
        let taken = queue.get().await.unwrap();
        assert_eq!(taken.num_requeues(), 1);
        taken.requeue_after(Duration::from_secs(30), Priority::Low);
        assert_eq!(queue.num_requeues(&"ns/a".to_owned()), 0);
        assert_eq!((queue.len(), queue.waiting_len()), (0, 1));
        let again = queue.get().await.unwrap();
        assert_eq!(again.priority(), Priority::Low);
    }
}
