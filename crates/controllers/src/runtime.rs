//! The generic controller: informer events become keys in a rate-limited
//! workqueue; workers reconcile keys, reading state from the Lister.
//!
//! The worker loop is client-go's: `get` a key, reconcile it, `done` it. On
//! success the key's failures are forgotten; on error (or a caught panic) it
//! is re-added with per-item backoff while it has been retried fewer than
//! `max_retries` times, then dropped with a log line naming it and its error.
//! The workqueue guarantees that no key is reconciled by two workers at once.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kinformer_informer::{
    HasSynced, ResourceEventHandlerFuncs, SharedIndexInformer, wait_for_cache_sync,
};
use kinformer_store::{
    Object, ObjectOrTombstone, deletion_handling_meta_namespace_key, meta_namespace_key,
};
use kinformer_workqueue::{QueueConfig, RateLimitingQueue, default_controller_rate_limiter};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use crate::{ControllerError, LeaderElector, Metrics};

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Done until the next event for this key.
    Done,
    /// Reconcile this key again after the duration (its failures are forgotten).
    RequeueAfter(Duration),
}

/// The error of a failed reconcile; the key is retried with backoff.
pub type ReconcileError = Box<dyn std::error::Error + Send + Sync>;

/// Brings the world in line with the cached state of one object.
///
/// `reconcile` receives a key (`namespace/name`) and must read the object
/// from a Lister, not from the event: it is level-based, so it must do the
/// right thing whatever happened before, including nothing.
pub trait Reconciler: Send + Sync + 'static {
    /// Reconciles the object under `key`.
    fn reconcile<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Action, ReconcileError>>;
}

impl<R: Reconciler + ?Sized> Reconciler for Arc<R> {
    fn reconcile<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        (**self).reconcile(key)
    }
}

/// What to do when a reconcile panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PanicPolicy {
    /// Log it with the key, count it, and retry the key with backoff
    /// (controller-runtime's `RecoverPanic`, the default).
    #[default]
    Recover,
    /// Stop the controller: `run` returns [`ControllerError::ReconcilePanicked`],
    /// for those who prefer crash-and-restart.
    Crash,
}

/// An informer event, for [`ControllerOptions::event_filter`].
pub enum Event<'a, K> {
    /// An object appeared.
    Add(&'a K),
    /// An object changed (or was resynced, with the same resource version).
    Update {
        /// Before.
        old: &'a K,
        /// After.
        new: &'a K,
    },
    /// An object was deleted.
    Delete(&'a ObjectOrTombstone<K>),
}

type EventFilter<K> = Arc<dyn Fn(Event<'_, K>) -> bool + Send + Sync>;

/// How a [`Controller`] runs. Defaults: 2 workers, 5 retries, recover from
/// panics, 30 s to drain on shutdown, no leader election, no metrics.
pub struct ControllerOptions<K> {
    /// Concurrent reconciles (distinct keys).
    pub workers: usize,
    /// Retries of a failing key before it is dropped.
    pub max_retries: u32,
    /// What a panic in reconcile does.
    pub panic_policy: PanicPolicy,
    /// How long shutdown waits for in-flight reconciles.
    pub drain_timeout: Duration,
    /// Only the leader of this election reconciles.
    pub leader_election: Option<Arc<LeaderElector>>,
    /// Where metrics go.
    pub metrics: Option<Arc<Metrics>>,
    /// Which events enqueue their key (all by default).
    pub event_filter: Option<EventFilter<K>>,
}

impl<K> Default for ControllerOptions<K> {
    fn default() -> Self {
        Self {
            workers: 2,
            max_retries: 5,
            panic_policy: PanicPolicy::Recover,
            drain_timeout: Duration::from_secs(30),
            leader_election: None,
            metrics: None,
            event_filter: None,
        }
    }
}

impl<K> ControllerOptions<K> {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Concurrent reconciles (at least 1).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }
    /// Retries before a key is dropped.
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }
    /// What a panic in reconcile does.
    pub fn panic_policy(mut self, p: PanicPolicy) -> Self {
        self.panic_policy = p;
        self
    }
    /// How long shutdown waits for in-flight reconciles.
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }
    /// Reconcile only while leading this election.
    pub fn leader_election(mut self, elector: Arc<LeaderElector>) -> Self {
        self.leader_election = Some(elector);
        self
    }
    /// Report metrics to `metrics`.
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
    /// Enqueue only the events for which `filter` is true.
    pub fn event_filter(
        mut self,
        filter: impl Fn(Event<'_, K>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.event_filter = Some(Arc::new(filter));
        self
    }
}

/// A named controller over one informer: see the module docs.
///
/// Must be created inside a Tokio runtime (its workqueue runs a timer task).
pub struct Controller<K> {
    name: String,
    informer: SharedIndexInformer<K>,
    queue: RateLimitingQueue<String>,
    reconciler: Arc<dyn Reconciler>,
    options: ControllerOptions<K>,
    fatal: Arc<Mutex<Option<ControllerError>>>,
}

impl<K: Object + Clone> Controller<K> {
    /// A controller named `name` reconciling the keys of `informer`'s objects.
    pub fn new(
        name: &str,
        informer: SharedIndexInformer<K>,
        reconciler: impl Reconciler,
        options: ControllerOptions<K>,
    ) -> Result<Self, ControllerError> {
        let mut config = QueueConfig::new().name(name);
        if let Some(m) = &options.metrics {
            config = config.metrics_provider(m.workqueue_provider());
        }
        let queue = RateLimitingQueue::with_config(default_controller_rate_limiter(), config);
        let filter = options.event_filter.clone();
        let pass = move |e: Event<'_, K>| filter.as_ref().is_none_or(|f| f(e));
        let (qa, qu, qd) = (queue.clone(), queue.clone(), queue.clone());
        let (pa, pu, pd) = (pass.clone(), pass.clone(), pass);
        let handler = ResourceEventHandlerFuncs::new()
            .on_add(move |obj: &Arc<K>, _| {
                if pa(Event::Add(obj)) {
                    enqueue(&qa, meta_namespace_key(obj.as_ref()));
                }
            })
            .on_update(move |old: &Arc<K>, new: &Arc<K>| {
                if pu(Event::Update { old, new }) {
                    enqueue(&qu, meta_namespace_key(new.as_ref()));
                }
            })
            .on_delete(move |obj: &ObjectOrTombstone<K>| {
                if pd(Event::Delete(obj)) {
                    enqueue(&qd, deletion_handling_meta_namespace_key(obj));
                }
            });
        informer.add_event_handler(handler)?;
        Ok(Self {
            name: name.to_owned(),
            informer,
            queue,
            reconciler: Arc::new(reconciler),
            options,
            fatal: Arc::new(Mutex::new(None)),
        })
    }

    /// The workqueue (for inspection and tests).
    pub fn queue(&self) -> &RateLimitingQueue<String> {
        &self.queue
    }

    /// Runs until `shutdown` fires: starts the informer if nobody did, waits
    /// for its cache, waits for leadership if elected, then reconciles with
    /// `workers` workers. On shutdown it stops taking keys, waits up to the
    /// drain timeout for in-flight reconciles and releases the lease.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ControllerError> {
        let span = info_span!("controller", name = %self.name);
        self.run_inner(shutdown).instrument(span).await
    }

    async fn run_inner(self, shutdown: CancellationToken) -> Result<(), ControllerError> {
        let stop = shutdown.child_token();
        if !self.informer.is_started() {
            let informer = self.informer.clone();
            let stop = stop.clone();
            tokio::spawn(async move { informer.run(stop).await });
        }
        info!("waiting for the cache to sync");
        let synced: [&dyn HasSynced; 1] = [&self.informer];
        if !wait_for_cache_sync(&stop, &synced).await {
            self.queue.shut_down();
            return Ok(());
        }
        info!(cached = self.informer.indexer().len(), "cache synced");
        if let Some(m) = &self.options.metrics {
            m.set_ready(true);
        }

        let mut leadership = None;
        if let Some(elector) = &self.options.leader_election {
            let elector = Arc::clone(elector);
            let mut leading = elector.subscribe();
            let election_stop = stop.clone();
            let task = tokio::spawn(async move { elector.run(election_stop).await });
            info!("waiting to become the leader");
            loop {
                if *leading.borrow_and_update() {
                    break;
                }
                tokio::select! {
                    _ = stop.cancelled() => {
                        self.queue.shut_down();
                        let _ = task.await;
                        return Ok(());
                    }
                    changed = leading.changed() => if changed.is_err() { break },
                }
            }
            info!("leading; starting workers");
            leadership = Some((leading, task));
        }

        let shared = Arc::new(Worker {
            name: self.name.clone(),
            queue: self.queue.clone(),
            reconciler: Arc::clone(&self.reconciler),
            max_retries: self.options.max_retries,
            panic_policy: self.options.panic_policy,
            metrics: self.options.metrics.clone(),
            fatal: Arc::clone(&self.fatal),
            stop: stop.clone(),
        });
        let workers: Vec<_> = (0..self.options.workers)
            .map(|_| tokio::spawn(Arc::clone(&shared).run()))
            .collect();
        info!(workers = self.options.workers, "started workers");

        let mut result = Ok(());
        match &mut leadership {
            Some((leading, _)) => loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    changed = leading.changed() => {
                        if changed.is_err() || !*leading.borrow() {
                            error!("lost the leader lease; stopping");
                            result = Err(ControllerError::LostLeadership);
                            break;
                        }
                    }
                }
            },
            None => stop.cancelled().await,
        }

        info!("shutting down: draining in-flight reconciles");
        if tokio::time::timeout(
            self.options.drain_timeout,
            self.queue.shut_down_with_drain(),
        )
        .await
        .is_err()
        {
            warn!(timeout = ?self.options.drain_timeout, "drain timed out; abandoning in-flight reconciles");
            self.queue.shut_down();
        }
        for w in workers {
            let _ = w.await;
        }
        stop.cancel();
        if let Some((_, task)) = leadership {
            let _ = task.await;
        }
        if let Some(e) = self.fatal.lock().take() {
            return Err(e);
        }
        result
    }
}

fn enqueue(queue: &RateLimitingQueue<String>, key: Result<String, kinformer_store::KeyError>) {
    match key {
        Ok(key) => queue.add(key),
        Err(e) => warn!(error = %e, "ignoring an object without a key"),
    }
}

struct Worker {
    name: String,
    queue: RateLimitingQueue<String>,
    reconciler: Arc<dyn Reconciler>,
    max_retries: u32,
    panic_policy: PanicPolicy,
    metrics: Option<Arc<Metrics>>,
    fatal: Arc<Mutex<Option<ControllerError>>>,
    stop: CancellationToken,
}

impl Worker {
    async fn run(self: Arc<Self>) {
        while let Some(key) = self.queue.get().await {
            self.process(&key).await;
            self.queue.done(&key);
        }
    }

    async fn process(&self, key: &str) {
        let started = Instant::now();
        let outcome = AssertUnwindSafe(self.reconciler.reconcile(key))
            .catch_unwind()
            .await;
        let seconds = started.elapsed().as_secs_f64();
        let key_owned = key.to_owned();
        match outcome {
            Ok(Ok(Action::Done)) => {
                self.record(key, "success", seconds);
                self.queue.forget(&key_owned);
            }
            Ok(Ok(Action::RequeueAfter(after))) => {
                self.record(key, "requeue_after", seconds);
                self.queue.forget(&key_owned);
                self.queue.add_after(key_owned, after);
            }
            Ok(Err(e)) => {
                self.record(key, "error", seconds);
                if let Some(m) = &self.metrics {
                    m.reconcile_error(&self.name);
                }
                self.retry_or_drop(key_owned, e.to_string());
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
                    return;
                }
                self.retry_or_drop(key_owned, format!("panic: {message}"));
            }
        }
    }

    fn record(&self, _key: &str, result: &str, seconds: f64) {
        if let Some(m) = &self.metrics {
            m.reconciled(&self.name, result, seconds);
        }
    }

    fn retry_or_drop(&self, key: String, error: String) {
        let retries = self.queue.num_requeues(&key);
        if retries < self.max_retries {
            warn!(key = %key, retries, error = %error, "reconcile failed; retrying with backoff");
            self.queue.add_rate_limited(key);
        } else {
            error!(key = %key, retries, error = %error, "dropping the key after too many failed reconciles");
            self.queue.forget(&key);
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".to_owned())
}
