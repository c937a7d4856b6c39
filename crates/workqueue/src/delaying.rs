//! DelayingQueue: `add_after` on one heap, served by one timer task.

use std::ops::Deref;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::Taken;
use crate::queue::{Priority, Queue, QueueConfig, QueueItem, Shared};
use crate::sync::{Notify, timeout_at};

/// A [`Queue`] that can also add an item after a delay: client-go's
/// `DelayingInterface`.
///
/// - For an item added after a delay twice, the earliest ready time wins.
/// - A plain [`add`](Queue::add) of a delayed item queues it at once and
///   cancels the pending delay.
/// - Pending items live in one heap; one task sleeps until the earliest is
///   ready. Shutdown drops the pending items and stops that task, and so
///   does dropping the last handle.
/// - That task is started by the first `add_after` made on a Tokio
///   runtime, or else by the first [`get`](Self::get), on that runtime: the
///   queue can be made anywhere (no runtime needed, none picked up by its
///   constructor). An item added after a delay from outside a runtime
///   before any `get` is queued at the first `get` if its delay has passed.
pub struct DelayingQueue<T> {
    queue: Queue<T>,
}

impl<T> Clone for DelayingQueue<T> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
        }
    }
}

impl<T> std::fmt::Debug for DelayingQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.queue.fmt(f)
    }
}

impl<T> Deref for DelayingQueue<T> {
    type Target = Queue<T>;
    fn deref(&self) -> &Queue<T> {
        &self.queue
    }
}

impl<T: QueueItem> Default for DelayingQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: QueueItem> DelayingQueue<T> {
    /// An unnamed delaying queue without metrics.
    pub fn new() -> Self {
        Self::with_config(QueueConfig::default())
    }

    /// A delaying queue built from `config`.
    pub fn with_config(config: QueueConfig) -> Self {
        let queue = Queue::with_config(config);
        queue.shared.delaying.store(true, Ordering::Relaxed);
        Self { queue }
    }

    /// Adds `item` once `delay` has passed (at once for a zero delay). If the
    /// item is already waiting with an earlier ready time, that one stays.
    /// Delays beyond [`MAX_DELAY`](crate::MAX_DELAY) (up to `Duration::MAX`)
    /// saturate there. Ignored after shutdown.
    pub fn add_after(&self, item: T, delay: Duration) {
        self.queue.add_after_locked(item, delay, Priority::High);
    }

    /// [`add_after`](Self::add_after), queued at `priority` when ready. An
    /// item already waiting keeps the earlier ready time, at the higher of
    /// the two priorities.
    pub fn add_after_with_priority(&self, item: T, delay: Duration, priority: Priority) {
        self.queue.add_after_locked(item, delay, priority);
    }

    /// [`Queue::get`], with a guard that can also
    /// [`requeue_after`](Taken::requeue_after).
    pub async fn get(&self) -> Option<Taken<T, Self>> {
        let (item, priority) = self.queue.take().await?;
        Some(Taken::new(self.clone(), item, priority))
    }

    /// The number of items waiting for their delay to pass.
    pub fn waiting_len(&self) -> usize {
        self.queue.shared.state.lock().waiting.len()
    }

    /// The plain queue underneath (shared, not a copy).
    pub fn queue(&self) -> &Queue<T> {
        &self.queue
    }
}

/// Moves ready items into the queue and sleeps until the next one is due.
/// Holds the queue only weakly, so dropping every handle ends it.
pub(crate) async fn waiting_loop<T: QueueItem>(shared: Weak<Shared<T>>, wake: Arc<Notify>) {
    loop {
        let mut notified = pin!(wake.notified());
        notified.as_mut().enable();
        let next = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let mut state = shared.state.lock();
            if state.is_shutting_down() {
                return;
            }
            let now = tokio::time::Instant::now();
            let mut next = None;
            while let Some(top) = state.heap.peek() {
                if state.waiting.get(&top.item).map(|(ready, _)| ready) != Some(&top.ready) {
                    state.heap.pop();
                    continue;
                }
                if top.ready > now {
                    next = Some(top.ready);
                    break;
                }
                if let Some(w) = state.heap.pop() {
                    let priority = state.waiting.remove(&w.item).map(|(_, p)| p);
                    shared.add_locked(&mut state, w.item, priority.unwrap_or_default());
                }
            }
            next
        };
        match next {
            Some(deadline) => {
                let _ = timeout_at(deadline, notified).await;
            }
            None => notified.await,
        }
    }
}
