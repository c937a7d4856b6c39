//! A controller's worker: takes a key, reconciles it in its span (within
//! its slot's guard when sharded), and schedules it again, forgets it or
//! drops it by the outcome and the retry policy.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use kinformer_workqueue::{Priority, RateLimitingQueue};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info_span, warn};

use crate::key_slots::{Entry, Sharding};
use crate::options::PanicPolicy;
use crate::read_your_writes::{Consistency, Readiness};
use crate::reason::{Reason, Reasons};
use crate::reconcile::{Action, Reconciler, chain, denied_in_chain, is_terminal, panic_message};
use crate::{ControllerError, LeaderElector, Metrics, SlotGuard};

pub(crate) struct Worker {
    pub(crate) name: String,
    pub(crate) queue: RateLimitingQueue<String>,
    pub(crate) reconciler: Arc<dyn Reconciler>,
    /// `None`: retried until it succeeds or fails terminally.
    pub(crate) max_retries: Option<u32>,
    pub(crate) panic_policy: PanicPolicy,
    pub(crate) reconcile_timeout: Option<Duration>,
    pub(crate) metrics: Option<Arc<Metrics>>,
    pub(crate) fatal: Arc<Mutex<Option<ControllerError>>>,
    /// Cancelled on a Crash panic: the controller stops.
    pub(crate) stop: CancellationToken,
    /// Cancelled when no further key may be taken (lost lease, end of drain).
    pub(crate) halt: CancellationToken,
    /// Cancelled when in-flight reconciles must end now: they are dropped.
    pub(crate) abort: CancellationToken,
    pub(crate) elector: Option<Arc<LeaderElector>>,
    pub(crate) sharding: Option<Sharding>,
    pub(crate) reasons: Arc<Reasons>,
    /// Read-your-writes, for a controller of a Manager.
    pub(crate) consistency: Option<Arc<Consistency>>,
}

/// Whether a reconcile left its key unscheduled (`Yes`), scheduled it
/// again (a retry, a `RequeueAfter`: `No`), or was aborted because its
/// slot's Lease was lost (`LeaseLost`: not scheduled again here, and not
/// done either).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    Yes,
    No,
    LeaseLost,
}

impl Worker {
    pub(crate) async fn run(self: Arc<Self>) {
        loop {
            let key = tokio::select! {
                biased;
                _ = self.halt.cancelled() => return,
                key = self.queue.get_with_priority() => key,
            };
            let Some((key, priority)) = key else { return };
            // `get` may have raced the halt: a key taken after it stays
            // unworked. The elector's own flag turns false the instant the
            // lease is lost, and a crash is recorded in `fatal`, both before
            // the runtime gets to cancel `halt`.
            let leading = self.elector.as_ref().is_none_or(|e| e.may_work());
            if self.halt.is_cancelled() || !leading || self.fatal.lock().is_some() {
                self.queue.done(&key);
                return;
            }
            let mut entered = None;
            if let Some(sharding) = &self.sharding {
                match sharding.enter(&key) {
                    Entry::Entered(guard, generation) => entered = Some((guard, generation)),
                    other => {
                        // Not now: the slot's holder reconciles the key from
                        // its own cache, or, for a slot not yet ready here,
                        // this replica once it is.
                        self.queue.forget(&key);
                        self.reasons.forget(&key);
                        self.queue.done(&key);
                        if let Entry::NotHeld(Some(generation)) = other {
                            sharding.forget(&key, generation);
                        }
                        continue;
                    }
                }
            }
            let outcome = self
                .process(&key, entered.as_ref().map(|(guard, _)| guard), priority)
                .await;
            let aborted = outcome.is_none();
            if let (Some(sharding), Some((guard, generation))) = (&self.sharding, entered) {
                // The slot is left before the key is done: its handover may
                // go on while the queue takes the key again.
                drop(guard);
                match outcome {
                    Some(Settled::Yes) => {
                        sharding.key_slots.worked(&key, generation);
                        sharding.forget(&key, generation);
                    }
                    Some(Settled::LeaseLost) => sharding.forget(&key, generation),
                    Some(Settled::No) => sharding.key_slots.queued(&key),
                    None => {}
                }
            }
            self.queue.done(&key);
            if aborted {
                return;
            }
        }
    }

    /// Reconciles `key` (in `slot`'s guard when sharded): whether the key
    /// was scheduled again, or `None` if the reconcile was aborted and the
    /// worker must end.
    /// A failed reconcile is retried at `priority`, the one the key was
    /// taken at.
    pub(crate) async fn process(
        &self,
        key: &str,
        slot: Option<&SlotGuard>,
        priority: Priority,
    ) -> Option<Settled> {
        // Every log line of the reconcile (the user's included) names the
        // controller, the object, whether it is a retry and which
        // reconcile it is, as controller-runtime's and kube-runtime's do.
        let span = info_span!(
            "reconcile",
            controller = %self.name,
            object = %key,
            reason = %self.reasons.take(key),
            retries = self.queue.num_requeues(&key.to_owned()),
            reconcile_id = %format_args!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
        );
        self.process_in_span(key, slot, priority)
            .instrument(span)
            .await
    }

    pub(crate) async fn process_in_span(
        &self,
        key: &str,
        slot: Option<&SlotGuard>,
        priority: Priority,
    ) -> Option<Settled> {
        if let Some(consistency) = &self.consistency {
            let readiness =
                consistency.before_reconcile(key, priority, &self.queue, &self.reasons, &self.halt);
            if readiness == Readiness::Parked {
                return Some(Settled::No);
            }
        }
        let started = Instant::now();
        // Writes made through the Manager's client are credited to this reconcile.
        let reconciling = self.consistency.as_ref().map(|c| c.reconciling(key));
        // Inside the guard: a reconciler may panic before returning its future.
        let reconcile = AssertUnwindSafe(async {
            match reconciling {
                Some(reconciling) => reconciling.scope(self.reconciler.reconcile(key)).await,
                None => self.reconciler.reconcile(key).await,
            }
        })
        .catch_unwind();
        let outcome = tokio::select! {
            biased;
            _ = self.abort.cancelled() => {
                warn!(key, running = ?started.elapsed(), "reconcile aborted");
                return None;
            }
            _ = async {
                match (&self.sharding, slot) {
                    (Some(sharding), Some(guard)) => sharding.lost(guard).await,
                    _ => std::future::pending().await,
                }
            } => {
                // Another replica may take the slot once the Lease expires:
                // this reconcile must not outlive that. Not retried here (the
                // key stays pending, for this replica to take up again if
                // it takes the slot back).
                warn!(key, slot = slot.map(SlotGuard::slot), running = ?started.elapsed(), "the slot's Lease was lost; reconcile aborted");
                self.record(key, "error", started.elapsed().as_secs_f64());
                self.queue.forget(&key.to_owned());
                return Some(Settled::LeaseLost);
            }
            outcome = with_timeout(self.reconcile_timeout, reconcile) => outcome,
        };
        let seconds = started.elapsed().as_secs_f64();
        let key_owned = key.to_owned();
        let Some(outcome) = outcome else {
            self.record(key, "error", seconds);
            if let Some(m) = &self.metrics {
                m.reconcile_error(&self.name);
            }
            let limit = self.reconcile_timeout.unwrap_or_default();
            return Some(self.retry_or_drop(
                key_owned,
                format!("reconcile timed out after {limit:?}"),
                priority,
            ));
        };
        let settled = match outcome {
            Ok(Ok(Action::Done)) => {
                self.record(key, "success", seconds);
                self.queue.forget(&key_owned);
                Settled::Yes
            }
            Ok(Ok(Action::RequeueAfter(after))) => {
                self.record(key, "requeue_after", seconds);
                self.queue.forget(&key_owned);
                self.reasons.scheduled(&key_owned, Reason::Requeued);
                // A periodic look at an object that did not change.
                self.queue
                    .add_after_with_priority(key_owned, after, Priority::Low);
                Settled::No
            }
            Ok(Err(e)) => {
                self.record(key, "error", seconds);
                if let Some(m) = &self.metrics {
                    m.reconcile_error(&self.name);
                    if denied_in_chain(e.as_ref()) {
                        m.reconcile_denied(&self.name);
                    }
                }
                if is_terminal(e.as_ref()) {
                    error!(key, error = %chain(e.as_ref()), "terminal reconcile error; not retrying");
                    if let Some(m) = &self.metrics {
                        m.terminal_error(&self.name);
                    }
                    self.queue.forget(&key_owned);
                    Settled::Yes
                } else {
                    self.retry_or_drop(key_owned, chain(e.as_ref()), priority)
                }
            }
            Err(panic) => {
                let message = panic_message(&panic);
                error!(key, panic = %message, "reconcile panicked");
                self.record(key, "error", seconds);
                if let Some(m) = &self.metrics {
                    m.reconcile_panic(&self.name);
                    m.reconcile_error(&self.name);
                }
                if self.panic_policy == PanicPolicy::Crash {
                    *self.fatal.lock() = Some(ControllerError::ReconcilePanicked {
                        key: key_owned,
                        message,
                    });
                    self.stop.cancel();
                    return Some(Settled::Yes);
                }
                self.retry_or_drop(key_owned, format!("panic: {message}"), priority)
            }
        };
        Some(settled)
    }

    pub(crate) fn record(&self, _key: &str, result: &str, seconds: f64) {
        if let Some(m) = &self.metrics {
            m.reconciled(&self.name, result, seconds);
        }
    }

    pub(crate) fn retry_or_drop(&self, key: String, error: String, priority: Priority) -> Settled {
        let retries = self.queue.num_requeues(&key);
        if self.max_retries.is_none_or(|max| retries < max) {
            warn!(key = %key, retries, error = %error, "reconcile failed; retrying with backoff");
            self.reasons.scheduled(&key, Reason::Retry);
            self.queue.add_rate_limited_with_priority(key, priority);
            Settled::No
        } else {
            error!(key = %key, retries, error = %error, "dropping the key: it failed as many times as the controller's max_retries allows; it is reconciled again when its object next changes");
            if let Some(m) = &self.metrics {
                m.dropped_key(&self.name);
            }
            self.queue.forget(&key);
            Settled::Yes
        }
    }
}

/// `future`'s output, or `None` if it did not finish within `limit`.
pub(crate) async fn with_timeout<F: Future>(
    limit: Option<Duration>,
    future: F,
) -> Option<F::Output> {
    match limit {
        Some(limit) => tokio::time::timeout(limit, future).await.ok(),
        None => Some(future.await),
    }
}
