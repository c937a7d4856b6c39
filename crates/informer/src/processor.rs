//! Fan-out of notifications to handlers, as client-go's `sharedProcessor`.
//!
//! Each listener owns an unbounded channel and a thread that drains it into
//! its handler: distributing a notification never waits for a handler, so a
//! slow handler cannot hold up the others or the watch. Notifications cross
//! the channel in batches: the informer gathers them while its queue holds
//! more deltas and sends them when it has drained it or every [`BATCH`]
//! pops (a listener also sends its own once [`BATCH`] have gathered), so an
//! initial list of N objects wakes each handler's thread about N /
//! [`BATCH`] times instead of N, while a lone watch event is sent as soon as
//! it is applied. Each listener's depth (gathered and sent, not yet
//! handled) is counted so that it can be exported. After a handler panic
//! the thread waits the handler's `panic_pause` before the next
//! notification, as client-go's listener is restarted by `wait.Until` a
//! second after a panic: a handler that panics on every object cannot keep
//! a core busy.
//!
//! The listener list sits behind a `RwLock`: delta processing takes it for
//! reading while it updates the Indexer and distributes, and adding a handler
//! takes it for writing while it replays the Indexer to the new handler. So a
//! new handler sees exactly the cache as of its registration, then every
//! change after it, with nothing missed or doubled.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use kinformer_store::{
    Object, ObjectOrTombstone, deletion_handling_meta_namespace_key, meta_namespace_key,
};
use parking_lot::{Mutex, RwLock};
use tokio::time::Instant;
use tracing::error;

use crate::ResourceEventHandler;
use crate::handler::DEFAULT_PANIC_PAUSE;
use crate::panics::panic_message;

pub(crate) enum Notification<K> {
    Add { obj: Arc<K>, initial: bool },
    Update { old: Arc<K>, new: Arc<K> },
    Delete(ObjectOrTombstone<K>),
}

impl<K> Clone for Notification<K> {
    fn clone(&self) -> Self {
        match self {
            Self::Add { obj, initial } => Self::Add {
                obj: Arc::clone(obj),
                initial: *initial,
            },
            Self::Update { old, new } => Self::Update {
                old: Arc::clone(old),
                new: Arc::clone(new),
            },
            Self::Delete(o) => Self::Delete(o.clone()),
        }
    }
}

/// Per-listener counters shared with its registration handle.
#[derive(Debug, Default)]
pub(crate) struct ListenerState {
    /// Notifications buffered and not yet handled; decremented (Release)
    /// after the handler returns, read with Acquire.
    pub depth: AtomicUsize,
    /// Initial-list adds not yet handled.
    pub pending_initial: AtomicUsize,
    /// Notifications handled.
    pub handled: AtomicU64,
    /// Batches of notifications sent to the handler's thread.
    pub batches: AtomicU64,
    /// Handler panics caught.
    pub panics: AtomicU64,
    pub stopped: AtomicBool,
}

/// The most notifications a listener gathers before sending them on.
pub(crate) const BATCH: usize = 64;

pub(crate) struct Listener<K> {
    pub id: u64,
    tx: mpsc::Sender<Vec<Notification<K>>>,
    /// Distributed, counted in the depth, not yet sent (see the module docs).
    gathered: Mutex<Vec<Notification<K>>>,
    /// Never sent on: dropping the listener (removed, or the informer
    /// stopped) disconnects it, which ends a pause after a handler panic at
    /// once instead of keeping the thread for the rest of the pause.
    _wake: mpsc::Sender<()>,
    pub state: Arc<ListenerState>,
    resync_period: Option<Duration>,
    next_resync: Mutex<Instant>,
    resync_due: AtomicBool,
}

impl<K: Object> Listener<K> {
    pub(crate) fn spawn(
        id: u64,
        handler: Arc<dyn ResourceEventHandler<K>>,
        resync_period: Option<Duration>,
    ) -> Self {
        let (tx, rx) = mpsc::channel::<Vec<Notification<K>>>();
        let (wake, woken) = mpsc::channel::<()>();
        let state = Arc::new(ListenerState::default());
        let thread_state = Arc::clone(&state);
        let spawned = std::thread::Builder::new()
            .name(format!("kinformer-handler-{id}"))
            .spawn(move || run_listener(rx, woken, handler, thread_state));
        if let Err(e) = spawned {
            error!(handler = id, error = %e, "cannot start the handler thread");
            state.stopped.store(true, Ordering::SeqCst);
        }
        Self {
            id,
            tx,
            gathered: Mutex::new(Vec::new()),
            _wake: wake,
            state,
            resync_period,
            next_resync: Mutex::new(Instant::now() + resync_period.unwrap_or_default()),
            resync_due: AtomicBool::new(false),
        }
    }
}

impl<K> Listener<K> {
    /// Gathers `n` for the handler; it is sent on by [`Listener::flush`], or
    /// here once [`BATCH`] have gathered.
    pub(crate) fn send(&self, n: Notification<K>) {
        if let Notification::Add { initial: true, .. } = n {
            self.state.pending_initial.fetch_add(1, Ordering::SeqCst);
        }
        self.state.depth.fetch_add(1, Ordering::Relaxed);
        let mut gathered = self.gathered.lock();
        gathered.push(n);
        if gathered.len() >= BATCH {
            self.send_gathered(&mut gathered);
        }
    }

    /// Sends what has gathered to the handler's thread.
    pub(crate) fn flush(&self) {
        let mut gathered = self.gathered.lock();
        if !gathered.is_empty() {
            self.send_gathered(&mut gathered);
        }
    }

    fn send_gathered(&self, gathered: &mut Vec<Notification<K>>) {
        // The next batch is likely the size of this one: a lone watch event
        // allocates room for one, an initial list for BATCH.
        let n = gathered.len();
        let batch = std::mem::replace(gathered, Vec::with_capacity(n));
        if self.tx.send(batch).is_err() {
            self.state.depth.fetch_sub(n, Ordering::Relaxed);
        } else {
            self.state.batches.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn run_listener<K: Object>(
    rx: mpsc::Receiver<Vec<Notification<K>>>,
    woken: mpsc::Receiver<()>,
    handler: Arc<dyn ResourceEventHandler<K>>,
    state: Arc<ListenerState>,
) {
    // Asked here rather than by the caller of `spawn`, so that a panic in
    // this user callback is contained like the others.
    let pause = catch_unwind(AssertUnwindSafe(|| handler.panic_pause())).unwrap_or_else(|panic| {
        error!(panic = %panic_message(panic.as_ref()), "the event handler's panic_pause panicked; pausing {DEFAULT_PANIC_PAUSE:?} after a panic");
        DEFAULT_PANIC_PAUSE
    });
    for n in rx.into_iter().flatten() {
        if state.stopped.load(Ordering::SeqCst) {
            return;
        }
        let initial = matches!(n, Notification::Add { initial: true, .. });
        let result = catch_unwind(AssertUnwindSafe(|| match &n {
            Notification::Add { obj, initial } => handler.on_add(obj, *initial),
            Notification::Update { old, new } => handler.on_update(old, new),
            Notification::Delete(obj) => handler.on_delete(obj),
        }));
        let panicked = result.is_err();
        if let Err(panic) = result {
            state.panics.fetch_add(1, Ordering::Relaxed);
            let (what, key) = match &n {
                Notification::Add { obj, .. } => ("add", meta_namespace_key(obj.as_ref())),
                Notification::Update { new, .. } => ("update", meta_namespace_key(new.as_ref())),
                Notification::Delete(obj) => ("delete", deletion_handling_meta_namespace_key(obj)),
            };
            let key = key.unwrap_or_else(|e| e.to_string());
            error!(key = %key, notification = what, panic = %panic_message(panic.as_ref()), pause_ms = pause.as_millis() as u64, "event handler panicked; it gets its next notification after the pause");
        }
        // The notification that panicked is done with (skipped, as in
        // client-go) before the pause: it no longer holds up has_synced.
        state.handled.fetch_add(1, Ordering::Relaxed);
        if initial {
            state.pending_initial.fetch_sub(1, Ordering::SeqCst);
        }
        // Release: whoever reads the depth at 0 (Acquire) also sees what
        // the handler did, such as the keys it queued.
        state.depth.fetch_sub(1, Ordering::Release);
        if panicked {
            pause_after_panic(&woken, pause);
        }
    }
}

/// Waits `pause`, or until the listener is dropped. Notifications sent
/// meanwhile stay buffered in the listener's channel.
fn pause_after_panic(woken: &mpsc::Receiver<()>, pause: Duration) {
    let Some(deadline) = std::time::Instant::now().checked_add(pause) else {
        // Longer than the clock can count: until the listener is dropped.
        while woken.recv().is_ok() {}
        return;
    };
    // A deadline rather than one timed wait: the pause is never cut short,
    // whatever `recv_timeout` makes of an early wake-up.
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        if let Err(RecvTimeoutError::Disconnected) = woken.recv_timeout(left) {
            return;
        }
    }
}

/// Ids of informers and of registrations, unique in the process: a handle
/// names exactly one registration of exactly one informer.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A process-wide unique id.
pub(crate) fn unique_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

pub(crate) struct Processor<K> {
    pub listeners: RwLock<Vec<Listener<K>>>,
}

impl<K: Send + Sync + 'static> Processor<K> {
    pub(crate) fn new() -> Self {
        Self {
            listeners: RwLock::new(Vec::new()),
        }
    }

    /// Sends what every listener has gathered on to its handler.
    pub(crate) fn flush(&self) {
        for l in self.listeners.read().iter() {
            l.flush();
        }
    }

    /// Gives `n` to every listener, or for a resync only to those due one;
    /// the caller flushes.
    pub(crate) fn distribute(listeners: &[Listener<K>], n: Notification<K>, sync: bool) {
        let mut targets = listeners
            .iter()
            .filter(|l| !sync || l.resync_due.load(Ordering::Relaxed))
            .peekable();
        while let Some(l) = targets.next() {
            if targets.peek().is_none() {
                l.send(n);
                return;
            }
            l.send(n.clone());
        }
    }

    /// Whether any of `listeners` is due a resync (would get a resync
    /// notification).
    pub(crate) fn resync_due(listeners: &[Listener<K>]) -> bool {
        listeners
            .iter()
            .any(|l| l.resync_due.load(Ordering::Relaxed))
    }

    /// Marks the listeners whose resync period has passed; true if any is due.
    pub(crate) fn should_resync(&self) -> bool {
        let now = Instant::now();
        let mut any = false;
        for l in self.listeners.read().iter() {
            let Some(period) = l.resync_period else {
                l.resync_due.store(false, Ordering::Relaxed);
                continue;
            };
            let mut next = l.next_resync.lock();
            let due = now >= *next;
            if due {
                *next = now + period;
                any = true;
            }
            l.resync_due.store(due, Ordering::Relaxed);
        }
        any
    }
}

impl<K> Processor<K> {
    pub(crate) fn stop_all(&self) {
        for l in self.listeners.write().drain(..) {
            l.state.stopped.store(true, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    /// Records the names it is given, in order.
    #[derive(Default)]
    struct Names(Mutex<Vec<String>>);

    impl ResourceEventHandler<ConfigMap> for Names {
        fn on_add(&self, obj: &Arc<ConfigMap>, _: bool) {
            self.0
                .lock()
                .push(obj.metadata.name.clone().unwrap_or_default());
        }
    }

    fn add(name: String) -> Notification<ConfigMap> {
        Notification::Add {
            obj: Arc::new(ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            }),
            initial: true,
        }
    }

    /// Waits until only `left` notifications are still to be handled (the
    /// depth is lowered last, after the handler and the other counters).
    fn wait_depth(state: &ListenerState, left: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while state.depth.load(Ordering::Acquire) > left {
            assert!(
                std::time::Instant::now() < deadline,
                "{} notifications still to handle after 30 s, waiting for {left}",
                state.depth.load(Ordering::Acquire)
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn notifications_reach_the_handler_in_order_in_batches_and_a_flush_sends_the_rest() {
        let names = Arc::new(Names::default());
        let listener = Listener::spawn(1, Arc::clone(&names) as _, None);
        let count = 3 * BATCH + 5;
        for i in 0..count {
            listener.send(add(format!("cm-{i:04}")));
        }
        // Three full batches went on by themselves; the last 5 wait.
        wait_depth(&listener.state, 5);
        assert_eq!(listener.state.batches.load(Ordering::SeqCst), 3);
        assert_eq!(
            listener.state.handled.load(Ordering::SeqCst),
            3 * BATCH as u64
        );
        assert_eq!(listener.state.pending_initial.load(Ordering::SeqCst), 5);
        listener.flush();
        wait_depth(&listener.state, 0);
        assert_eq!(listener.state.batches.load(Ordering::SeqCst), 4);
        let expected: Vec<String> = (0..count).map(|i| format!("cm-{i:04}")).collect();
        assert_eq!(*names.0.lock(), expected);
        // Nothing gathered: a flush sends no empty batch.
        listener.flush();
        assert_eq!(listener.state.batches.load(Ordering::SeqCst), 4);
    }
}
