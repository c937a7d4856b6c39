//! A controller's worker: takes a key, asks the controller's gates whether
//! it may be reconciled now (see [`gate`](crate::gate)), reconciles it in
//! its span, lets the gates settle, and schedules the key again, forgets
//! it or drops it by the outcome and the retry policy.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kinformer_store::ObjectKey;
use kinformer_workqueue::{Priority, RateLimitingQueue, Taken};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info_span, warn};

use crate::gate::{Admission, Gate, Outcome, Reconciled};
use crate::options::PanicPolicy;
use crate::reason::{Reason, Reasons};
use crate::reconcile::{
    Action, Reconciler, Request, chain, denied_in_chain, is_terminal, panic_message,
};
use crate::{ControllerError, Metrics};

/// A key a worker holds: done when dropped.
type Key = Taken<ObjectKey, RateLimitingQueue<ObjectKey>>;

pub(crate) struct Worker {
    pub(crate) name: String,
    pub(crate) queue: RateLimitingQueue<ObjectKey>,
    pub(crate) reconciler: Arc<dyn Reconciler>,
    pub(crate) policy: Policy,
    pub(crate) metrics: Option<Arc<Metrics>>,
    pub(crate) reasons: Arc<Reasons>,
    /// Asked in order before each reconcile; see [`gate`](crate::gate).
    pub(crate) gates: Vec<Arc<dyn Gate>>,
    pub(crate) life: Life,
}

/// What a controller does with a reconcile that fails, panics or hangs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// `None`: retried until it succeeds or fails terminally.
    pub(crate) max_retries: Option<u32>,
    pub(crate) panic_policy: PanicPolicy,
    pub(crate) reconcile_timeout: Option<Duration>,
}

/// Where a controller's workers are in its life.
pub(crate) struct Life {
    /// What ended the controller early (a Crash panic, a failed informer).
    pub(crate) fatal: Arc<Mutex<Option<ControllerError>>>,
    /// Cancelled on a Crash panic: the controller stops.
    pub(crate) stop: CancellationToken,
    /// Cancelled when no further key may be taken (lost lease, end of drain).
    pub(crate) halt: CancellationToken,
    /// Cancelled when in-flight reconciles must end now: they are dropped.
    pub(crate) abort: CancellationToken,
}

/// What the queue does with a key once its gates have settled.
enum Next {
    /// Done; its failures forgotten.
    Forget,
    /// Retried after the rate limiter's delay, at the priority it was taken at.
    Retry,
    /// Forgotten and queued again after the delay, at `Low` (a periodic look).
    RequeueAfter(Duration),
    /// Only done: a gate or a crash decides what comes next.
    Done,
}

impl Worker {
    pub(crate) async fn run(self: Arc<Self>) {
        loop {
            let key = tokio::select! {
                biased;
                _ = self.life.halt.cancelled() => return,
                key = self.queue.get() => key,
            };
            let Some(key) = key else { return };
            // `get` may have raced the halt: a key taken after it stays
            // unworked. A crash is recorded in `fatal` before the runtime
            // gets to cancel `halt`.
            if self.life.halt.is_cancelled() || self.life.fatal.lock().is_some() {
                return;
            }
            // Every log line of the reconcile (the user's and the gates'
            // included) names the controller, the object, why it was
            // queued, whether it is a retry and which reconcile it is, as
            // controller-runtime's and kube-runtime's do.
            let request = Request::new(key.item().clone(), self.reasons.take(&key));
            let span = info_span!(
                "reconcile",
                controller = %self.name,
                object = %request.key,
                reason = %request.reason,
                retries = key.num_requeues(),
                reconcile_id = %format_args!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
            );
            if !self.work(key, request).instrument(span).await {
                return;
            }
        }
    }

    /// Runs `key` through the gates and, if they all admit it, reconciles
    /// it as `request`; whether the worker goes on.
    async fn work(&self, key: Key, request: Request) -> bool {
        let name = &request.key;
        // Settles the gates that admitted the key however this ends: a
        // panic past here (a user error's `Display`, a gate) or the task
        // aborted must not leave a slot entered.
        let mut settling = Settling {
            gates: &self.gates[..0],
            key: name,
            outcome: Outcome::Aborted,
        };
        for (admitted, gate) in self.gates.iter().enumerate() {
            match gate.admit(name, key.priority()) {
                Admission::Admit => settling.gates = &self.gates[..=admitted],
                Admission::Park => {
                    settling.settle(Outcome::Requeued);
                    return true;
                }
                Admission::Skip => {
                    // Not now: the slot's holder reconciles the key from its
                    // own cache, or, for a slot not yet ready here, this
                    // replica once it is.
                    settling.settle(Outcome::Skipped);
                    self.reasons.forget(name);
                    key.forget();
                    return true;
                }
                Admission::Stop => {
                    settling.settle(Outcome::Aborted);
                    return false;
                }
            }
        }
        let (outcome, next) = self.reconcile(&request, key.num_requeues()).await;
        // The gates settle before the key is done: a slot is left before
        // the queue may hand the key out again.
        settling.settle(outcome);
        match next {
            Next::Forget => key.forget(),
            Next::Retry => key.retry(),
            Next::RequeueAfter(after) => key.requeue_after(after, Priority::Low),
            Next::Done => drop(key),
        }
        outcome != Outcome::Aborted
    }

    /// Reconciles `request` (after `retries` failures)
    /// within the gates' scopes and interruptions: what became of it, and
    /// what the queue is to do with its key.
    async fn reconcile(&self, request: &Request, retries: u32) -> (Outcome, Next) {
        let key = &request.key;
        let started = Instant::now();
        // Inside the guard: a reconciler may panic before returning its future.
        let reconcile = AssertUnwindSafe(async {
            let mut reconcile: BoxFuture<'_, _> = self.reconciler.reconcile(request);
            for gate in &self.gates {
                reconcile = gate.scope(key, reconcile);
            }
            reconcile.await
        })
        .catch_unwind();
        let interrupted: Vec<_> = self
            .gates
            .iter()
            .filter_map(|g| g.interrupted(key))
            .collect();
        let interrupted = async {
            match interrupted.is_empty() {
                true => std::future::pending().await,
                false => futures::future::select_all(interrupted).await.0,
            }
        };
        let outcome = tokio::select! {
            biased;
            _ = self.life.abort.cancelled() => {
                warn!(key = key.as_str(), running = ?started.elapsed(), "reconcile aborted");
                return (Outcome::Aborted, Next::Done);
            }
            why = interrupted => {
                // Another replica may take the key once the Lease expires:
                // this reconcile must not outlive that. Not retried here (the
                // key stays pending, for this replica to take up again if
                // it takes the slot back).
                warn!(key = key.as_str(), why, running = ?started.elapsed(), "reconcile interrupted");
                self.record("error", started.elapsed().as_secs_f64());
                return (Outcome::Interrupted, Next::Forget);
            }
            outcome = with_timeout(self.policy.reconcile_timeout, reconcile) => outcome,
        };
        self.judge(key, retries, outcome, started.elapsed().as_secs_f64())
    }

    /// What became of a reconcile of `key` (after `retries` failures) that
    /// ran `seconds` and ended with `outcome` (`None`: timed out), and what
    /// the queue is to do with the key, by the controller's policy.
    fn judge(
        &self,
        key: &ObjectKey,
        retries: u32,
        outcome: Option<std::thread::Result<Reconciled>>,
        seconds: f64,
    ) -> (Outcome, Next) {
        let Some(outcome) = outcome else {
            self.record("error", seconds);
            if let Some(m) = &self.metrics {
                m.reconcile_error(&self.name);
            }
            let limit = self.policy.reconcile_timeout.unwrap_or_default();
            return self.retry_or_drop(
                key,
                retries,
                format!("reconcile timed out after {limit:?}"),
            );
        };
        match outcome {
            Ok(Ok(Action::Done)) => {
                self.record("success", seconds);
                (Outcome::Finished, Next::Forget)
            }
            Ok(Ok(Action::RequeueAfter(after))) => {
                self.record("requeue_after", seconds);
                self.reasons.scheduled(key, Reason::Requeued);
                // A periodic look at an object that did not change.
                (Outcome::Requeued, Next::RequeueAfter(after))
            }
            Ok(Err(e)) => {
                self.record("error", seconds);
                if let Some(m) = &self.metrics {
                    m.reconcile_error(&self.name);
                    if denied_in_chain(e.as_ref()) {
                        m.reconcile_denied(&self.name);
                    }
                }
                if is_terminal(e.as_ref()) {
                    error!(key = key.as_str(), error = %chain(e.as_ref()), "terminal reconcile error; not retrying");
                    if let Some(m) = &self.metrics {
                        m.terminal_error(&self.name);
                    }
                    (Outcome::Finished, Next::Forget)
                } else {
                    self.retry_or_drop(key, retries, chain(e.as_ref()))
                }
            }
            Err(panic) => {
                let message = panic_message(&panic);
                error!(key = key.as_str(), panic = %message, "reconcile panicked");
                self.record("error", seconds);
                if let Some(m) = &self.metrics {
                    m.reconcile_panic(&self.name);
                    m.reconcile_error(&self.name);
                }
                if self.policy.panic_policy == PanicPolicy::Crash {
                    *self.life.fatal.lock() = Some(ControllerError::ReconcilePanicked {
                        key: key.clone(),
                        message,
                    });
                    self.life.stop.cancel();
                    return (Outcome::Finished, Next::Done);
                }
                self.retry_or_drop(key, retries, format!("panic: {message}"))
            }
        }
    }

    fn record(&self, result: &str, seconds: f64) {
        if let Some(m) = &self.metrics {
            m.reconciled(&self.name, result, seconds);
        }
    }

    /// A failed reconcile of `key`, after `retries` earlier failures: retried
    /// with backoff, or dropped once the policy's `max_retries` is reached.
    fn retry_or_drop(&self, key: &ObjectKey, retries: u32, error: String) -> (Outcome, Next) {
        if self.policy.max_retries.is_none_or(|max| retries < max) {
            warn!(key = key.as_str(), retries, error = %error, "reconcile failed; retrying with backoff");
            self.reasons.scheduled(key, Reason::Retry);
            (Outcome::Requeued, Next::Retry)
        } else {
            error!(key = key.as_str(), retries, error = %error, "dropping the key: it failed as many times as the controller's max_retries allows; it is reconciled again when its object next changes");
            if let Some(m) = &self.metrics {
                m.dropped_key(&self.name);
            }
            (Outcome::Finished, Next::Forget)
        }
    }
}

/// The gates that admitted a key, told what became of it when dropped
/// (the last admitted first): `Aborted` unless [`settle`](Self::settle)
/// says otherwise.
struct Settling<'a> {
    gates: &'a [Arc<dyn Gate>],
    key: &'a ObjectKey,
    outcome: Outcome,
}

impl Settling<'_> {
    fn settle(mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}

impl Drop for Settling<'_> {
    fn drop(&mut self) {
        for gate in self.gates.iter().rev() {
            gate.settle(self.key, self.outcome);
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

#[cfg(test)]
mod tests {
    use super::*;
    use kinformer_workqueue::default_controller_rate_limiter;

    /// Admits every key and records how each was settled.
    #[derive(Default)]
    struct Recording(Mutex<Vec<(String, Outcome)>>);

    impl Gate for Recording {
        fn admit(&self, _key: &ObjectKey, _priority: Priority) -> Admission {
            Admission::Admit
        }
        fn settle(&self, key: &ObjectKey, outcome: Outcome) {
            self.0.lock().push((key.to_string(), outcome));
        }
    }

    /// An error whose text cannot be shown: the worker panics logging it.
    #[derive(Debug)]
    struct PanicsWhenShown;

    impl std::fmt::Display for PanicsWhenShown {
        fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            panic!("an error's Display panicked")
        }
    }

    impl std::error::Error for PanicsWhenShown {}

    struct Failing;

    impl Reconciler for Failing {
        fn reconcile<'a>(
            &'a self,
            _request: &'a Request,
        ) -> BoxFuture<'a, Result<Action, crate::ReconcileError>> {
            Box::pin(async { Err(PanicsWhenShown.into()) })
        }
    }

    /// A gate's per-key state (a sharded slot's guard) is released however
    /// the worker ends: here a panic past the reconcile, outside its
    /// `catch_unwind`. The key is left done, not processing.
    #[tokio::test]
    async fn a_gate_is_settled_even_when_the_worker_panics_after_the_reconcile() {
        let queue = RateLimitingQueue::new(default_controller_rate_limiter());
        let gate = Arc::new(Recording::default());
        let worker = Arc::new(Worker {
            name: "test".to_owned(),
            queue: queue.clone(),
            reconciler: Arc::new(Failing),
            policy: Policy {
                max_retries: None,
                panic_policy: PanicPolicy::Recover,
                reconcile_timeout: None,
            },
            metrics: None,
            reasons: Arc::default(),
            gates: vec![Arc::clone(&gate) as Arc<dyn Gate>],
            life: Life {
                fatal: Arc::default(),
                stop: CancellationToken::new(),
                halt: CancellationToken::new(),
                abort: CancellationToken::new(),
            },
        });
        queue.add("ns/a".parse().unwrap());
        let ended = tokio::spawn(Arc::clone(&worker).run()).await;
        assert!(ended.is_err_and(|e| e.is_panic()));
        assert_eq!(*gate.0.lock(), [("ns/a".to_owned(), Outcome::Aborted)]);
        queue.add("ns/a".parse().unwrap());
        assert_eq!(queue.len(), 1, "the key was left processing");
    }

    /// Hands the reason of each request it reconciles to the test.
    struct Reasoned(tokio::sync::mpsc::UnboundedSender<Reason>);

    impl Reconciler for Reasoned {
        fn reconcile<'a>(
            &'a self,
            request: &'a Request,
        ) -> BoxFuture<'a, Result<Action, crate::ReconcileError>> {
            let _ = self.0.send(request.reason.clone());
            Box::pin(async { Ok(Action::Done) })
        }
    }

    /// A key's reason is taken when a worker takes the key, whether or not
    /// anything records the reconcile's span: with logging off, a reason
    /// left behind would be the next reconcile's (and one more entry for
    /// every key ever queued).
    #[tokio::test]
    async fn a_reason_is_taken_with_its_key_even_with_logging_off() {
        let _off = tracing::dispatcher::set_default(&tracing::Dispatch::none());
        let queue = RateLimitingQueue::new(default_controller_rate_limiter());
        let reasons = Arc::new(Reasons::default());
        let (sent, mut reconciled) = tokio::sync::mpsc::unbounded_channel();
        let worker = Arc::new(Worker {
            name: "test".to_owned(),
            queue: queue.clone(),
            reconciler: Arc::new(Reasoned(sent)),
            policy: Policy {
                max_retries: None,
                panic_policy: PanicPolicy::Recover,
                reconcile_timeout: None,
            },
            metrics: None,
            reasons: Arc::clone(&reasons),
            gates: Vec::new(),
            life: Life {
                fatal: Arc::default(),
                stop: CancellationToken::new(),
                halt: CancellationToken::new(),
                abort: CancellationToken::new(),
            },
        });
        let key: ObjectKey = "ns/a".parse().unwrap();
        let halt = worker.life.halt.clone();
        let running = tokio::spawn(Arc::clone(&worker).run());
        reasons.now(&key, || Reason::Added);
        queue.add(key.clone());
        assert_eq!(reconciled.recv().await, Some(Reason::Added));
        reasons.now(&key, || Reason::Updated);
        queue.add(key.clone());
        assert_eq!(reconciled.recv().await, Some(Reason::Updated));
        halt.cancel();
        running.await.unwrap();
        assert_eq!(reasons.take(&key), Reason::Unknown, "a reason left behind");
    }
}
