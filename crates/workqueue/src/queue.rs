//! The core work queue: dirty and processing sets, FIFO order within two
//! priorities, async `get`.
//!
//! One `parking_lot` mutex guards all state, including the delayed items of a
//! [`DelayingQueue`](crate::DelayingQueue), so that a direct `add` can cancel
//! a pending `add_after` in the same step. Each item has one map entry with
//! two flags: *dirty* (needs processing) and *processing* (a worker holds it).
//! An item sits in the FIFO only while it is dirty and not processing, which
//! is what keeps one item from ever reaching two workers.
//!
//! Priorities: one FIFO per [`Priority`]. Raising a queued item's priority
//! pushes it onto the higher FIFO and leaves a stale slot behind in the
//! lower one, recognised by a sequence number that no longer matches the
//! item's and skipped when reached (so a raise is O(1), never a search).
//! Low items are taken in their add order, so the one that has waited
//! longest is always at the front of its FIFO: aging needs no scan, only a
//! look at that front.
//!
//! Waiting uses tokio `Notify`: a getter registers (`enable`) before looking
//! at the queue, and every push notifies one getter if any is counted in
//! `getters_waiting`, so no wake-up is lost between the check and the wait.
//! The getter counts itself in the critical section that found nothing to
//! take (counted later, an add in between would not notify), and registers
//! before, not after (two adds to getters not yet registered store a
//! single permit between them). A notified getter whose future is dropped
//! passes the wake-up on (tokio's `notify_one` guarantee). `tests/model.rs`
//! checks this protocol under loom, in every interleaving of a few threads
//! (the primitives are swapped in `sync`).

use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::pin::pin;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::MetricsProvider;
use crate::Taken;
use crate::metrics::QueueMetrics;
use crate::sync::{AtomicBool, Handle, Mutex, Notify};

pub(crate) type Hasher = foldhash::fast::RandomState;

/// What a queue can hold: a cheap-to-compare key, typically `String` or a
/// `namespace/name` pair.
pub trait QueueItem: Clone + Eq + Hash + Send + Sync + 'static {}
impl<T: Clone + Eq + Hash + Send + Sync + 'static> QueueItem for T {}

/// How urgently an item is wanted. [`Queue::add`] adds at `High`.
///
/// A controller adds what changed live at `High`, and at `Low` what only
/// needs to be looked at again: the objects of an initial list, resyncs and
/// periodic requeues. `High` items are taken first, in their add order;
/// a `Low` item that has waited [`QueueConfig::priority_aging`] shares the
/// workers with them from then on (see [`Queue`]), so no item starves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Wanted eventually: taken when no `High` item waits, or once aged.
    Low,
    /// Wanted now.
    #[default]
    High,
}

impl Priority {
    /// `"low"` or `"high"`, the `priority` label of metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::High => "high",
        }
    }
}

/// How long a `Low` item waits before it shares the workers with `High`
/// ones, by default: [`QueueConfig::priority_aging`].
pub const DEFAULT_PRIORITY_AGING: Duration = Duration::from_secs(5);

/// How a queue is built: a name (for metrics), an optional metrics
/// provider, and how long a `Low` item may be passed over.
#[derive(Clone)]
#[non_exhaustive]
pub struct QueueConfig {
    name: String,
    metrics_provider: Option<Arc<dyn MetricsProvider>>,
    priority_aging: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            metrics_provider: None,
            priority_aging: DEFAULT_PRIORITY_AGING,
        }
    }
}

impl fmt::Debug for QueueConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueConfig")
            .field("name", &self.name)
            .field("metrics", &self.metrics_provider.is_some())
            .field("priority_aging", &self.priority_aging)
            .finish()
    }
}

impl QueueConfig {
    /// No name, no metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// The queue's name, the `name` label of its metrics.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How long a [`Priority::Low`] item may wait while `High` items are
    /// taken before it: from then on, at least every second item taken is
    /// an aged `Low` one while any waits. Default
    /// [`DEFAULT_PRIORITY_AGING`]; zero shares the workers between the two
    /// priorities from the start. The bound it gives is on [`Queue`].
    #[must_use]
    pub fn priority_aging(mut self, aging: Duration) -> Self {
        self.priority_aging = aging.min(MAX_DELAY);
        self
    }

    /// Reports the queue's metrics to `provider`. Unfinished-work gauges are
    /// refreshed every 500 ms by a task on the current Tokio runtime.
    #[must_use]
    pub fn metrics_provider(mut self, provider: Arc<dyn MetricsProvider>) -> Self {
        self.metrics_provider = Some(provider);
        self
    }
}

/// A work queue with client-go's guarantees.
///
/// - An item added while it is queued is not queued twice.
/// - An item is handed to at most one worker at a time: while a worker holds
///   it (from [`get`](Self::get) until its [`Taken`] guard drops), adds
///   only mark it dirty, and it is queued again when the guard drops.
/// - After [`shut_down`](Self::shut_down), adds are ignored and `get` hands
///   out what is still queued, then returns `None`.
/// - Items are taken by [`Priority`], in add order within one. Adding a
///   queued item at a higher priority raises it (it keeps the one it has
///   otherwise); an item added while processed is queued again at the
///   highest priority it was added at meanwhile.
/// - No item starves. A `Low` item that has waited the queue's
///   [`priority_aging`](QueueConfig::priority_aging) `A` is taken before
///   any `High` item once the previous item taken was a `High` one; so
///   while aged `Low` items wait, at least every second item taken is one
///   of them, oldest first. A `Low` item with `n` `Low` items ahead of it
///   is therefore taken within `A + 2(n + 1)/R` of entering the queue, `R`
///   being the rate at which the workers take items, however many `High`
///   items keep arriving. (An item added while it is processed enters the
///   queue when its guard drops.)
/// - Queue duration by priority (a [`MetricsProvider`]'s
///   `new_latency_by_priority_metric`) is the time an item waited at each
///   priority. A raised item reports its wait at `Low` as `Low`'s when it
///   is raised, and its `High` duration counts from the raise: so the `High`
///   histogram shows how promptly live changes are handled, even for keys
///   of a `Low` backlog (an initial list after a restart or a takeover),
///   and the two histograms' sums add up to that of the queue duration of
///   all priorities, which counts from the add, as client-go's.
/// - [`shut_down_with_drain`](Self::shut_down_with_drain) also waits until
///   every queued item has been taken and every taken item is done.
///
/// `Queue` is a cheap handle: clones share the same queue.
pub struct Queue<T> {
    pub(crate) shared: Arc<Shared<T>>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.state.lock();
        f.debug_struct("Queue")
            .field("name", &self.shared.name)
            .field("len", &state.len())
            .field("processing", &state.processing)
            .field("waiting", &state.waiting.len())
            .field("shutting_down", &state.shutting_down)
            .finish()
    }
}

pub(crate) struct Shared<T> {
    pub(crate) state: Mutex<State<T>>,
    name: String,
    item_ready: Notify,
    drained: Notify,
    /// Wakes the delaying loop: a new earliest deadline, a shutdown, or a drop.
    pub(crate) delay_changed: Arc<Notify>,
    /// A `DelayingQueue`'s: its timer task is wanted.
    pub(crate) delaying: AtomicBool,
    /// The background tasks (timer, metrics) were started: see
    /// `start_background`.
    started: AtomicBool,
    pub(crate) metrics: Option<QueueMetrics>,
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // The delaying loop holds only a Weak; wake it so it can exit.
        self.delay_changed.notify_waiters();
    }
}

#[derive(Default)]
struct ItemState {
    dirty: bool,
    processing: bool,
    /// The priority it is queued at, or will be when `done` queues it.
    priority: Priority,
    /// The sequence number of its live slot; other slots are stale.
    slot: u64,
    /// When the item was queued (metrics only).
    added: Option<Instant>,
    /// Since when it has waited at its current priority: the add, or the
    /// raise (metrics by priority only).
    at_priority_since: Option<Instant>,
    /// When a worker took the item (metrics only).
    started: Option<Instant>,
}

/// One place in a priority's FIFO.
struct Slot<T> {
    item: T,
    seq: u64,
    /// When a `Low` item was queued (aging); `High` slots never read it.
    added: Option<Instant>,
}

pub(crate) struct State<T> {
    high: VecDeque<Slot<T>>,
    low: VecDeque<Slot<T>>,
    /// Items queued (live slots), by priority: `[low, high]`.
    queued: [usize; 2],
    /// The last item taken was an aged `Low` one: a `High` one goes next.
    took_aged_low: bool,
    aging: Duration,
    slot_seq: u64,
    items: HashMap<T, ItemState, Hasher>,
    processing: usize,
    /// Getters registered with `item_ready` and waiting.
    getters_waiting: usize,
    shutting_down: bool,
    drain: bool,
    /// Ready time and priority of each delayed item; the heap may hold
    /// stale entries, recognised by a ready time that differs from this map's.
    pub(crate) waiting: HashMap<T, (Instant, Priority), Hasher>,
    pub(crate) heap: BinaryHeap<Waiting<T>>,
    seq: u64,
}

pub(crate) struct Waiting<T> {
    pub(crate) ready: Instant,
    seq: u64,
    pub(crate) item: T,
}

impl<T> PartialEq for Waiting<T> {
    fn eq(&self, other: &Self) -> bool {
        self.ready == other.ready && self.seq == other.seq
    }
}
impl<T> Eq for Waiting<T> {}
impl<T> PartialOrd for Waiting<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Waiting<T> {
    /// Reversed, so that `BinaryHeap` (a max-heap) yields the earliest first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .ready
            .cmp(&self.ready)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

impl<T: QueueItem> Default for Queue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: QueueItem> Queue<T> {
    /// An unnamed queue without metrics.
    pub fn new() -> Self {
        Self::with_config(QueueConfig::default())
    }

    /// A queue built from `config`.
    pub fn with_config(config: QueueConfig) -> Self {
        let metrics = config
            .metrics_provider
            .as_deref()
            .map(|p| QueueMetrics::new(p, &config.name));
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    high: VecDeque::new(),
                    low: VecDeque::new(),
                    queued: [0; 2],
                    took_aged_low: false,
                    aging: config.priority_aging,
                    slot_seq: 0,
                    items: HashMap::default(),
                    processing: 0,
                    getters_waiting: 0,
                    shutting_down: false,
                    drain: false,
                    waiting: HashMap::default(),
                    heap: BinaryHeap::new(),
                    seq: 0,
                }),
                name: config.name,
                item_ready: Notify::new(),
                drained: Notify::new(),
                delay_changed: Arc::new(Notify::new()),
                delaying: AtomicBool::new(false),
                started: AtomicBool::new(false),
                metrics,
            }),
        }
    }

    /// Marks `item` as needing processing, at [`Priority::High`]. Ignored
    /// after shutdown. Cancels a pending `add_after` of the same item: it is
    /// queued now.
    pub fn add(&self, item: T) {
        self.add_with_priority(item, Priority::High);
    }

    /// [`add`](Self::add) at `priority`; an item queued at a lower one is
    /// raised to it, and one waiting for an `add_after` at a higher one is
    /// queued now at that higher one.
    pub fn add_with_priority(&self, item: T, priority: Priority) {
        let mut state = self.shared.state.lock();
        if state.shutting_down {
            return;
        }
        let priority = take_waiting(&mut state, &item).map_or(priority, |p| p.max(priority));
        self.shared.add_locked(&mut state, item, priority);
    }

    /// The number of items queued at `priority` and not yet taken.
    pub fn len_at(&self, priority: Priority) -> usize {
        self.shared.state.lock().queued[priority as usize]
    }

    /// Waits for an item and takes it for processing; `None` once the queue
    /// is shut down and empty. The item is done when the returned guard
    /// drops (see [`Taken`]).
    pub async fn get(&self) -> Option<Taken<T>> {
        let (item, priority) = self.take().await?;
        Some(Taken::new(self.clone(), item, priority))
    }

    /// Waits for an item and marks it processing: the item and the priority
    /// it was queued at. Its guard (made by the `get` of the layer asked)
    /// calls `done`.
    pub(crate) async fn take(&self) -> Option<(T, Priority)> {
        self.shared.start_background();
        loop {
            // Fast path: an item is ready, no registration with the Notify.
            if let Some(taken) = self.try_take() {
                return taken;
            }
            let mut notified = pin!(self.shared.item_ready.notified());
            notified.as_mut().enable();
            let _waiting = {
                let mut state = self.shared.state.lock();
                if let Some(taken) = self.shared.take_locked(&mut state) {
                    return taken;
                }
                // Counted so that adds notify only when a getter waits.
                state.getters_waiting += 1;
                WaitingGetter(&self.shared)
            };
            notified.await;
        }
    }

    /// `Some(Some(item))`: taken; `Some(None)`: shut down and empty; `None`: wait.
    fn try_take(&self) -> Option<Option<(T, Priority)>> {
        let mut state = self.shared.state.lock();
        self.shared.take_locked(&mut state)
    }

    /// Marks `item` as done (its [`Taken`] guard dropped). If it was added
    /// again while being processed, it is queued again now.
    pub(crate) fn done(&self, item: &T) {
        let mut state = self.shared.state.lock();
        let Some(entry) = state.items.get_mut(item) else {
            return;
        };
        if !entry.processing {
            return;
        }
        entry.processing = false;
        if let Some(m) = &self.shared.metrics
            && let Some(started) = entry.started.take()
        {
            m.work_duration.observe(started.elapsed().as_secs_f64());
        }
        let requeue = entry.dirty.then_some(entry.priority);
        state.processing -= 1;
        if let Some(priority) = requeue {
            if let Some(m) = &self.shared.metrics {
                // Queued from now; its latency runs from the re-add.
                m.depth.inc();
                m.depth_at(priority).inc();
            }
            push_slot(&mut state, item.clone(), priority);
            if state.getters_waiting > 0 {
                self.shared.item_ready.notify_one();
            }
        } else {
            state.items.remove(item);
        }
        if state.drain && state.processing == 0 && state.len() == 0 {
            self.shared.drained.notify_waiters();
        }
    }

    /// The number of items queued and not yet taken.
    pub fn len(&self) -> usize {
        self.shared.state.lock().len()
    }

    /// Whether no item is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops the queue: later adds are ignored, delayed items are dropped,
    /// and getters receive what is queued, then `None`.
    pub fn shut_down(&self) {
        let mut state = self.shared.state.lock();
        state.shutting_down = true;
        state.drain = false;
        self.shared.stop_delaying(&mut state);
        drop(state);
        self.shared.item_ready.notify_waiters();
        self.shared.drained.notify_waiters();
    }

    /// Stops the queue like [`shut_down`](Self::shut_down), then waits until
    /// every queued item has been taken and every taken item is
    /// done. A concurrent `shut_down` ends the wait.
    ///
    /// Workers must keep calling `get` for the queue to drain; bound the wait
    /// with `tokio::time::timeout` if they might not.
    pub async fn shut_down_with_drain(&self) {
        {
            let mut state = self.shared.state.lock();
            state.shutting_down = true;
            state.drain = true;
            self.shared.stop_delaying(&mut state);
        }
        self.shared.item_ready.notify_waiters();
        loop {
            let mut notified = pin!(self.shared.drained.notified());
            notified.as_mut().enable();
            {
                let state = self.shared.state.lock();
                if !state.drain || (state.processing == 0 && state.len() == 0) {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Whether the queue is shutting down.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.state.lock().shutting_down
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Recomputes the unfinished-work and longest-running-processor gauges;
    /// done every 500 ms automatically when a metrics provider is set.
    pub fn update_unfinished_work(&self) {
        self.shared.update_unfinished_work();
    }

    /// Queues `item` at `priority` once `delay` has passed; see
    /// `DelayingQueue::add_after`.
    pub(crate) fn add_after_locked(&self, item: T, delay: Duration, priority: Priority) {
        self.shared.start_background();
        let mut state = self.shared.state.lock();
        if state.shutting_down {
            return;
        }
        if let Some(m) = &self.shared.metrics {
            m.retries.inc();
        }
        if delay.is_zero() {
            let priority = take_waiting(&mut state, &item).map_or(priority, |p| p.max(priority));
            self.shared.add_locked(&mut state, item, priority);
            return;
        }
        let ready = ready_at(Instant::now(), delay);
        // The earlier ready time stays, at the higher priority.
        let priority = match state.waiting.get_mut(&item) {
            Some((existing, p)) if *existing <= ready => {
                *p = (*p).max(priority);
                return;
            }
            Some((_, p)) => (*p).max(priority),
            None => priority,
        };
        state.waiting.insert(item.clone(), (ready, priority));
        state.seq += 1;
        let seq = state.seq;
        state.heap.push(Waiting { ready, seq, item });
        compact_heap(&mut state);
        if state.heap.peek().is_some_and(|top| top.seq == seq) {
            self.shared.delay_changed.notify_one();
        }
    }
}

/// The longest delay honoured: about 30 years, as tokio's own far future.
/// Longer delays (up to `Duration::MAX`, which a reconcile or a rate limiter
/// may ask for) saturate here instead of overflowing `Instant`.
pub const MAX_DELAY: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `now + delay`, saturated at [`MAX_DELAY`] so it cannot overflow.
fn ready_at(now: Instant, delay: Duration) -> Instant {
    now + delay.min(MAX_DELAY)
}

/// Un-counts a waiting getter when its wait ends, however it ends.
struct WaitingGetter<'a, T>(&'a Shared<T>);

impl<T> Drop for WaitingGetter<'_, T> {
    fn drop(&mut self) {
        self.0.state.lock().getters_waiting -= 1;
    }
}

/// Rebuilds the heap from the live entries when stale ones outnumber them,
/// so cancelled or superseded delays cannot pile up.
fn compact_heap<T: QueueItem>(state: &mut State<T>) {
    if state.heap.len() <= 64 || state.heap.len() <= 2 * state.waiting.len() {
        return;
    }
    let heap = std::mem::take(&mut state.heap);
    let waiting = &state.waiting;
    state.heap = heap
        .into_iter()
        .filter(|w| waiting.get(&w.item).map(|(ready, _)| ready) == Some(&w.ready))
        .collect();
}

/// Removes `item`'s pending `add_after`, if any: the priority it was to be
/// queued at.
fn take_waiting<T: QueueItem>(state: &mut State<T>, item: &T) -> Option<Priority> {
    if state.waiting.is_empty() {
        return None;
    }
    state.waiting.remove(item).map(|(_, p)| p)
}

/// Queues `item` at `priority`: a new live slot at the back of its FIFO.
fn push_slot<T: QueueItem>(state: &mut State<T>, item: T, priority: Priority) {
    state.slot_seq += 1;
    let seq = state.slot_seq;
    if let Some(entry) = state.items.get_mut(&item) {
        entry.slot = seq;
    }
    state.queued[priority as usize] += 1;
    let added = (priority == Priority::Low).then(Instant::now);
    let slot = Slot { item, seq, added };
    match priority {
        Priority::High => state.high.push_back(slot),
        Priority::Low => state.low.push_back(slot),
    }
}

/// Whether `slot` is its item's live slot (the item queued, not taken,
/// not raised to another FIFO since).
fn is_live<T: QueueItem>(items: &HashMap<T, ItemState, Hasher>, slot: &Slot<T>) -> bool {
    items
        .get(&slot.item)
        .is_some_and(|e| e.dirty && !e.processing && e.slot == slot.seq)
}

/// Pops the slot to take next: `High` first, except that an aged `Low`
/// front goes first when the last item taken was not one (see [`Queue`]).
fn next_slot<T: QueueItem>(state: &mut State<T>) -> Option<Slot<T>> {
    while state
        .high
        .front()
        .is_some_and(|s| !is_live(&state.items, s))
    {
        state.high.pop_front();
    }
    while state.low.front().is_some_and(|s| !is_live(&state.items, s)) {
        state.low.pop_front();
    }
    let take_low = match (state.high.is_empty(), state.low.front()) {
        (_, None) => false,
        (true, Some(_)) => true,
        (false, Some(front)) => {
            !state.took_aged_low
                && front
                    .added
                    .is_some_and(|added| added.elapsed() >= state.aging)
        }
    };
    let slot = if take_low {
        state.low.pop_front()
    } else {
        state.high.pop_front()
    };
    // Only a Low slot taken ahead of waiting High ones counts as aged.
    state.took_aged_low = take_low && !state.high.is_empty();
    slot
}

impl<T> State<T> {
    fn len(&self) -> usize {
        self.queued.iter().sum()
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }
}

impl<T: QueueItem> Shared<T> {
    /// Starts the timer task of a `DelayingQueue` and the metrics task of
    /// a queue with metrics, once, on the runtime of the first `add_after`
    /// made on one, or else of the first `get`: no constructor spawns, so a
    /// queue can be made anywhere, and its tasks run where it is used.
    pub(crate) fn start_background(self: &Arc<Self>) {
        if self.started.load(AtomicOrdering::Acquire) {
            return;
        }
        let Ok(runtime) = Handle::try_current() else {
            return;
        };
        if self.started.swap(true, AtomicOrdering::AcqRel) {
            return;
        }
        if self.delaying.load(AtomicOrdering::Relaxed) {
            let (shared, wake) = (Arc::downgrade(self), Arc::clone(&self.delay_changed));
            // Made out here: a task dropped before it is first polled drops
            // what it captured, not what its body would have made.
            let restart = Restart(shared.clone());
            runtime.spawn(async move {
                let _restart = restart;
                crate::delaying::waiting_loop(shared, wake).await;
            });
        }
        if self.metrics.is_some() {
            runtime.spawn(unfinished_work_loop(Arc::downgrade(self)));
        }
    }

    pub(crate) fn add_locked(&self, state: &mut State<T>, item: T, priority: Priority) {
        let metrics = self.metrics.as_ref();
        // One hash lookup, and no clone of an item that is already dirty.
        let queued = match state.items.entry(item) {
            Entry::Occupied(mut e) => {
                let entry = e.get_mut();
                if entry.dirty {
                    if priority <= entry.priority {
                        return;
                    }
                    let was = entry.priority;
                    entry.priority = priority;
                    // The wait so far was at the old priority (see `Queue`).
                    if let Some(m) = metrics
                        && let Some(since) = entry.at_priority_since
                    {
                        let now = Instant::now();
                        m.latency_at(was).observe((now - since).as_secs_f64());
                        entry.at_priority_since = Some(now);
                    }
                    // Being processed: `done` queues it at the new priority.
                    if entry.processing {
                        return;
                    }
                    // Raised: a new slot in the higher FIFO; the old one
                    // goes stale (its sequence number no longer matches).
                    if let Some(m) = metrics {
                        m.depth_at(was).dec();
                        m.depth_at(priority).inc();
                    }
                    let item = e.key().clone();
                    state.queued[was as usize] -= 1;
                    push_slot(state, item, priority);
                    return;
                }
                entry.dirty = true;
                entry.priority = priority;
                if let Some(m) = metrics {
                    m.adds.inc();
                    // Queue latency counts from this add, also for an item
                    // being processed (client-go's `addTimes`).
                    let now = Instant::now();
                    entry.added = Some(now);
                    entry.at_priority_since = Some(now);
                }
                // Being processed: `done` queues it again (and counts it in
                // depth then).
                if entry.processing {
                    return;
                }
                if let Some(m) = metrics {
                    m.depth.inc();
                    m.depth_at(priority).inc();
                }
                e.key().clone()
            }
            Entry::Vacant(e) => {
                let key = e.key().clone();
                let added = metrics.map(|m| {
                    m.adds.inc();
                    m.depth.inc();
                    m.depth_at(priority).inc();
                    Instant::now()
                });
                e.insert(ItemState {
                    dirty: true,
                    priority,
                    added,
                    at_priority_since: added,
                    ..ItemState::default()
                });
                key
            }
        };
        push_slot(state, queued, priority);
        if state.getters_waiting > 0 {
            self.item_ready.notify_one();
        }
    }

    /// Takes the next item for processing, under the lock.
    fn take_locked(&self, state: &mut State<T>) -> Option<Option<(T, Priority)>> {
        let Some(slot) = next_slot(state) else {
            return state.shutting_down.then_some(None);
        };
        let item = slot.item;
        let mut priority = Priority::High;
        if let Some(entry) = state.items.get_mut(&item) {
            entry.dirty = false;
            entry.processing = true;
            priority = entry.priority;
            if let Some(m) = &self.metrics {
                let now = Instant::now();
                m.depth.dec();
                m.depth_at(priority).dec();
                if let Some(added) = entry.added.take() {
                    m.latency.observe((now - added).as_secs_f64());
                }
                if let Some(since) = entry.at_priority_since.take() {
                    m.latency_at(priority).observe((now - since).as_secs_f64());
                }
                entry.started = Some(now);
            }
        }
        state.queued[priority as usize] -= 1;
        state.processing += 1;
        Some(Some((item, priority)))
    }

    fn stop_delaying(&self, state: &mut State<T>) {
        state.waiting.clear();
        state.heap.clear();
        self.delay_changed.notify_waiters();
    }

    fn update_unfinished_work(&self) {
        let Some(m) = &self.metrics else { return };
        let now = Instant::now();
        let (total, longest) = {
            let state = self.state.lock();
            state
                .items
                .values()
                .filter_map(|e| e.started)
                .map(|s| (now - s).as_secs_f64())
                .fold((0.0, 0.0_f64), |(t, l), s| (t + s, l.max(s)))
        };
        m.unfinished_work.set(total);
        m.longest_running.set(longest);
    }
}

/// Lets the next `add_after` or `get` start the timer again if its task
/// ends while the queue still runs: dropped unrun or cut short, its runtime
/// shut down (a test's, a short-lived one), delayed items would otherwise
/// never be queued.
struct Restart<T>(Weak<Shared<T>>);

impl<T> Drop for Restart<T> {
    fn drop(&mut self) {
        if let Some(shared) = self.0.upgrade()
            && !shared.state.lock().is_shutting_down()
        {
            shared.started.store(false, AtomicOrdering::Release);
        }
    }
}

async fn unfinished_work_loop<T: QueueItem>(shared: Weak<Shared<T>>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.update_unfinished_work();
        if shared.state.lock().shutting_down {
            return;
        }
    }
}
