//! The apply thread: where an informer applies what it pops from its queue,
//! off the async runtime.
//!
//! Applying a unit is CPU work with no await in it, and a relist is a lot
//! of it: on the atomic queue one unit holds the whole list (index
//! functions, with a compact cache the encoding of every object, the swap,
//! a notification per object); on the others the list is as many small
//! units in a row, popped without a wait between them. On a runtime worker
//! that work holds the worker for as long, and what else was to run there
//! waits: a lease renewal, a watch read, a webhook answer. Measured with
//! `cargo bench -p kinformer-informer --bench relist_apply` (two cores, a
//! two-worker runtime, two informers relisting 50 000 objects each at
//! once, as every informer does once the API server has lost the history
//! they watched): with the apply on the workers, a 10 ms tick came up to
//! 485 ms late and an echo task answered up to 486 ms late; with the apply
//! here, 45 and 39 ms, what was left being the Reflector's hand-over of
//! each list, which now yields to the runtime between batches: then 7 and
//! 8 ms, as on an idle runtime. (One informer alone leaves the second
//! worker free: 4 to 7 ms either way.)
//!
//! So each informer has a thread of its own (`kinformer-apply-<id>`), fed
//! by its queue, started by [`SharedIndexInformer::run`](super::SharedIndexInformer::run)
//! and ended with it; it applies every unit, not only relists:
//! - a watch event is a unit too, and most units are one. Here one costs a
//!   thread wake-up more than on the runtime: a change from the watch to
//!   the cache took 18 to 27 µs applied by the informer's task, 29 to
//!   43 µs applied here (`watch_event/modified_to_cached`). `spawn_blocking`
//!   per unit would cost more: its round trip alone is 18 to 21 µs on the
//!   same machine, on top of the task's own wake-up, and the unit would
//!   have to be owned to cross;
//! - a DeltaFifo's or a plain RealFifo's relist is many small units, and
//!   only a thread that takes them all keeps them all off the runtime;
//! - the queue hands a unit out borrowed, inside `pop_unit`'s closure (an
//!   atomic queue unlocked meanwhile): the thread is its one consumer, in
//!   order, with nothing to move or lock across threads;
//! - an idle thread costs a stack and no CPU, as each handler's thread does
//!   (see the processor).
//!
//! The thread waits for the queue as the task did: the queue's wait is a
//! tokio `Notify`, which needs no runtime, so the thread polls `pop_unit`,
//! beside its stop token, and parks until either wakes it.
//!
//! Ending. `run` cancels the thread's stop token when it ends (shutdown, the
//! Reflector's end or a failure) and awaits the thread's last word: the
//! unit in progress is finished, and nothing changes the cache once `run`
//! has returned. A shutdown waits for that one unit, as it did when the
//! unit was applied in `run`'s own poll, but holds no runtime thread
//! meanwhile. When `run`'s future is dropped instead, the drop does not
//! wait: the informer is failed at once, and whichever of the drop and the
//! thread comes last stops the handlers ([`Handover`]): stopping takes the
//! handler list's write lock, which an apply holds for reading.
//!
//! Panics are contained as before: one while applying a unit is caught on
//! the thread, fails the informer at once (the unit counts as popped, its
//! change may be half applied) and ends the thread with the reason `run`
//! returns.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Wake, Waker};

use kinformer_fifo::{PopError, Requeue};
use kinformer_store::Object;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Span;

use super::{Inner, release_freed_memory, unit_name};
use crate::panics::panic_message;
use crate::processor::BATCH;
use crate::reflector::ReflectorStats;

/// Which of a dropped `run` and its apply thread stops the informer: the
/// last of the two to be done.
#[derive(Debug, Default)]
pub(super) struct Handover {
    /// The thread has not ended yet.
    running: bool,
    /// `run` was dropped while the thread ran: the thread stops the
    /// informer when it ends.
    stop_when_done: bool,
}

impl<K> Inner<K> {
    /// Stops the informer for a `run` dropped before its end: now if its
    /// apply thread has ended, otherwise when it does.
    pub(super) fn stop_after_apply(&self) {
        let now = {
            let mut handover = self.handover.lock();
            handover.stop_when_done = handover.running;
            !handover.running
        };
        if now {
            self.stop();
        }
    }
}

/// `run`'s side of its apply thread.
pub(super) struct ApplyThread {
    /// The thread's last word, until it is read.
    ended: Option<oneshot::Receiver<Option<String>>>,
    /// Why the informer failed, said by the thread when it ended.
    failure: Option<String>,
}

impl ApplyThread {
    /// Starts the thread applying `inner`'s queue until `stop` fires or an
    /// apply panics; logs in `span`.
    pub(super) fn spawn<K: Object>(
        inner: Arc<Inner<K>>,
        stop: CancellationToken,
        stats: Arc<ReflectorStats>,
        span: Span,
    ) -> std::io::Result<Self> {
        let (said, ended) = oneshot::channel();
        inner.handover.lock().running = true;
        let thread_inner = Arc::clone(&inner);
        let spawned = std::thread::Builder::new()
            .name(format!("kinformer-apply-{}", inner.id))
            .spawn(move || {
                let inner = thread_inner;
                let _span = span.enter();
                let failure = catch_unwind(AssertUnwindSafe(|| {
                    apply_until_stopped(&inner, &stop, &stats)
                }))
                .unwrap_or_else(|panic| {
                    inner.failed.store(true, Ordering::SeqCst);
                    Some(format!(
                        "the apply thread panicked: {}",
                        panic_message(panic.as_ref())
                    ))
                });
                let stop_now = {
                    let mut handover = inner.handover.lock();
                    handover.running = false;
                    handover.stop_when_done
                };
                if stop_now {
                    inner.stop();
                }
                let _ = said.send(failure);
            });
        match spawned {
            Ok(_) => Ok(Self {
                ended: Some(ended),
                failure: None,
            }),
            Err(e) => {
                inner.handover.lock().running = false;
                Err(e)
            }
        }
    }

    /// Waits until the thread has ended: why the informer failed, if it
    /// did. Cancel-safe; once ended, answers at once.
    pub(super) async fn ended(&mut self) -> Option<String> {
        if let Some(ended) = &mut self.ended {
            self.failure = ended
                .await
                .unwrap_or_else(|_| Some("the apply thread ended without a word".to_owned()));
            self.ended = None;
        }
        self.failure.clone()
    }
}

/// Pops and applies units until `stop` fires (or the queue is closed and
/// empty); the reason the informer failed if applying a unit panicked.
fn apply_until_stopped<K: Object>(
    inner: &Inner<K>,
    stop: &CancellationToken,
    stats: &ReflectorStats,
) -> Option<String> {
    // Pops since the handlers' gathered notifications were last sent.
    let mut unflushed = 0;
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    loop {
        let mut panicked = None;
        let popped = block_on(&waker, async {
            tokio::select! {
                biased;
                _ = stop.cancelled() => None,
                popped = inner.fifo.pop_unit(|unit, initial| {
                    let started = std::time::Instant::now();
                    let applied = catch_unwind(AssertUnwindSafe(|| {
                        inner.handle_unit(unit, initial)
                    }));
                    inner.processing_latency.observe(started.elapsed());
                    if let Err(panic) = applied {
                        // Not synced from here on, though the unit counts
                        // as popped: its change may be half applied.
                        inner.failed.store(true, Ordering::SeqCst);
                        panicked = Some(format!(
                            "applying {} to the cache panicked: {}",
                            unit_name(&unit),
                            panic_message(panic.as_ref())
                        ));
                    }
                    Ok::<_, Requeue<()>>(())
                }) => Some(popped),
            }
        });
        if panicked.is_some() {
            return panicked;
        }
        match popped {
            None | Some(Err(PopError::Closed)) => return None,
            Some(_) => {}
        }
        inner.applied.notify_waiters();
        // Notifications go to the handlers in batches while more units
        // wait (at most BATCH pops apart, whoever they reached), at once
        // when none does.
        unflushed += 1;
        if unflushed >= BATCH || inner.fifo.is_empty() {
            inner.processor.flush();
            unflushed = 0;
        }
        if inner.release_due(stats) {
            release_freed_memory();
        }
    }
}

/// Wakes the thread parked in [`block_on`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` to its end on this thread, parked between polls until
/// `waker` (an [`Unpark`] of this thread) is woken.
fn block_on<F: Future>(waker: &Waker, future: F) -> F::Output {
    let mut cx = Context::from_waker(waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        // A wake before the park leaves a token: the park returns at once.
        std::thread::park();
    }
}
