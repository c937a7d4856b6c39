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
    CacheReader, Object, ObjectOrTombstone, deletion_handling_meta_namespace_key,
    meta_namespace_key,
};
use kinformer_workqueue::{QueueConfig, RateLimitingQueue, default_controller_rate_limiter};
use kube_client::Resource;
use kube_client::core::ClusterResourceScope;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use crate::reason::{self, Reason, Reasons};
use crate::ring::slot_of_uid;
use crate::{ControllerError, LeaderElector, Metrics, Ring, SlotGuard};

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Done until the next event for this key.
    Done,
    /// Reconcile this key again after the duration (its failures are forgotten).
    RequeueAfter(Duration),
}

/// The error of a failed reconcile; the key is retried with backoff, unless
/// it is, or its `source()` chain holds, a [`TerminalError`].
pub type ReconcileError = Box<dyn std::error::Error + Send + Sync>;

/// A reconcile error that retrying cannot fix (an invalid spec, say): the
/// key is not retried until its next event, and the error is counted in
/// `controller_runtime_terminal_reconcile_errors_total`, as
/// controller-runtime's `reconcile.TerminalError`. Its `source()` is the
/// error it wraps.
#[derive(Debug)]
pub struct TerminalError(pub ReconcileError);

impl TerminalError {
    /// Marks `error` terminal, as a [`ReconcileError`].
    pub fn boxed(error: impl Into<ReconcileError>) -> ReconcileError {
        Box::new(Self(error.into()))
    }
}

impl std::fmt::Display for TerminalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "terminal: {}", self.0)
    }
}

impl std::error::Error for TerminalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

/// Whether `error` or any error in its `source()` chain is a
/// [`TerminalError`], as controller-runtime's `errors.Is`: one returned
/// from inside a finalizer's closure, or wrapped by the user's own error
/// type, is terminal too.
pub(crate) fn is_terminal(error: &(dyn std::error::Error + 'static)) -> bool {
    // Bounded: a source chain that loops must not hang a worker.
    std::iter::successors(Some(error), |e| e.source())
        .take(64)
        .any(|e| e.is::<TerminalError>())
}

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

/// What a reconcile finds in the cache for its key.
#[derive(Debug)]
pub enum Lookup<K> {
    /// The object as cached now.
    Found(Arc<K>),
    /// No such object any more: it was deleted (run cleanup here).
    Gone {
        /// Its `namespace/name` key.
        key: String,
    },
}

/// A [`Reconciler`] from an async closure that receives the object read
/// from the cache at reconcile time (or that it is gone); see
/// [`Controller::from_fn`].
pub struct FnReconciler<K, F> {
    pub(crate) cache: CacheReader<K>,
    pub(crate) f: F,
}

impl<K, F, Fut> Reconciler for FnReconciler<K, F>
where
    K: Object,
    F: Fn(Lookup<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    fn reconcile<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let lookup = match self.cache.get_by_key(key) {
            Some(obj) => Lookup::Found(obj),
            None => Lookup::Gone {
                key: key.to_owned(),
            },
        };
        Box::pin((self.f)(lookup))
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

impl<K> Clone for Event<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Event<'_, K> {}

pub(crate) type EventFilter<K> = Arc<dyn Fn(Event<'_, K>) -> bool + Send + Sync>;

/// How a [`Controller`] runs. Defaults: 2 workers, 5 retries, recover from
/// panics, 30 s to drain on shutdown, 1 s of grace after a lost lease, no
/// reconcile timeout, no leader election, no metrics.
///
/// How it stops:
/// - **Shutdown** (the token passed to [`Controller::run`]): queued and
///   in-flight keys are worked for up to `drain_timeout`; reconciles still
///   running then are aborted (their futures dropped). With leader election
///   the lease is renewed throughout the drain and released only after every
///   worker has ended, so a standby cannot start while this replica still
///   works; a reconcile that does not end even when aborted (it blocks its
///   thread) keeps the lease from being released: it expires instead.
/// - **Lost leadership**: no key is handed out from that instant; in-flight
///   reconciles get `lost_leadership_grace`, but never beyond
///   [`LeaderElector::lease_valid_until`] (the earliest a standby can lead),
///   and are then aborted; `run` returns [`ControllerError::LostLeadership`].
///   The same applies if the lease is lost during a drain.
/// - **A Crash panic or a failed informer**: no drain; no key is handed out
///   and in-flight reconciles are aborted at once, as in a crashed process.
/// - Either way `/healthz` and `/readyz` answer 503 from the start of the stop.
#[non_exhaustive]
pub struct ControllerOptions<K> {
    /// Concurrent reconciles (distinct keys).
    pub workers: usize,
    /// Retries of a failing key before it is dropped.
    pub max_retries: u32,
    /// What a panic in reconcile does.
    pub panic_policy: PanicPolicy,
    /// How long shutdown works queued and in-flight keys.
    pub drain_timeout: Duration,
    /// How long in-flight reconciles may go on after the lease is lost
    /// (bounded by the lease's validity).
    pub lost_leadership_grace: Duration,
    /// A reconcile running longer is dropped and counts as an error.
    pub reconcile_timeout: Option<Duration>,
    /// Only the leader of this election reconciles.
    pub leader_election: Option<Arc<LeaderElector>>,
    /// Sharded: this replica reconciles a key only while it holds the
    /// key's slot of this ring (see [`ControllerOptions::ring`]).
    pub ring: Option<Arc<Ring>>,
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
            lost_leadership_grace: Duration::from_secs(1),
            reconcile_timeout: None,
            leader_election: None,
            ring: None,
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
    /// Concurrent reconciles; 0 is refused by [`Controller::new`].
    #[must_use]
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }
    /// Retries before a key is dropped.
    #[must_use]
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }
    /// Retry a failing key for ever, with backoff (controller-runtime's
    /// default; the seeds drop a key after 5).
    #[must_use]
    pub fn retry_forever(mut self) -> Self {
        self.max_retries = u32::MAX;
        self
    }
    /// What a panic in reconcile does.
    #[must_use]
    pub fn panic_policy(mut self, p: PanicPolicy) -> Self {
        self.panic_policy = p;
        self
    }
    /// How long shutdown works queued and in-flight keys.
    #[must_use]
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }
    /// How long in-flight reconciles may go on after the lease is lost.
    #[must_use]
    pub fn lost_leadership_grace(mut self, d: Duration) -> Self {
        self.lost_leadership_grace = d;
        self
    }
    /// Drop a reconcile that runs longer than `d`, counting it as an error
    /// (retried with backoff like any other).
    #[must_use]
    pub fn reconcile_timeout(mut self, d: Duration) -> Self {
        self.reconcile_timeout = Some(d);
        self
    }
    /// Reconcile only while leading this election.
    #[must_use]
    pub fn leader_election(mut self, elector: Arc<LeaderElector>) -> Self {
        self.leader_election = Some(elector);
        self
    }
    /// Shard the controller over `ring`'s replicas: each reconciles a key
    /// only while it holds the slot of the key's object (by the hash of its
    /// uid), entering the slot for the whole reconcile
    /// ([`Ring::enter`]), so that a slot is handed over only once its
    /// reconciles have ended. A key of a slot not held here is dropped: its
    /// holder reconciles it. A reconcile whose slot Lease is lost is
    /// aborted before another replica can take the slot. The controller runs
    /// the ring ([`Ring::run`]) from its start until its workers have
    /// ended, then hands every slot over.
    ///
    /// Give the primary informer's lister-watcher [`Ring::scope`]
    /// ([`ApiListerWatcher::shard_scope`](kinformer_informer::ApiListerWatcher::shard_scope))
    /// so that the replica caches and watches only its slots' objects, and
    /// relists as slots come and go, which enqueues every key of a slot it
    /// takes. Secondary informers (`owns`, `watches`) stay whole: a key they
    /// enqueue is reconciled by the replica whose cache holds its object.
    /// Not together with leader election.
    #[must_use]
    pub fn ring(mut self, ring: Arc<Ring>) -> Self {
        self.ring = Some(ring);
        self
    }
    /// Report metrics to `metrics`.
    #[must_use]
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
    /// Enqueue only the events for which `filter` is true.
    #[must_use]
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
#[must_use = "a controller does nothing until it is added to a Manager or run"]
pub struct Controller<K> {
    name: String,
    informer: SharedIndexInformer<K>,
    /// Informers whose events enqueue keys (`owns`, `watches`): started if
    /// nobody did and synced before any worker starts.
    dependencies: Vec<Box<dyn Dependency>>,
    queue: RateLimitingQueue<String>,
    reconciler: Arc<dyn Reconciler>,
    options: ControllerOptions<K>,
    fatal: Arc<Mutex<Option<ControllerError>>>,
    /// The slot of each primary key, when sharded.
    key_slots: Option<Arc<KeySlots>>,
    /// Why each queued key is queued.
    reasons: Arc<Reasons>,
}

/// The slot of each primary key of a sharded controller, from the primary
/// informer's events (a delete's from the object's last state): what a
/// worker enters before reconciling the key. Each record carries a
/// generation, bumped by every event, whether the key is queued (or
/// scheduled again) here, and whether an event the filter passed has not
/// been worked on since (`pending`): a worker that handled a key forgets
/// its record only if no event came meanwhile, the object is not cached
/// and the key was not scheduled again; a delete the event filter drops
/// forgets it only if the key is not queued.
struct KeySlots {
    slots: u32,
    map: Mutex<std::collections::HashMap<String, KeyRecord>>,
}

#[derive(Debug, Clone, Copy)]
struct KeyRecord {
    slot: u32,
    generation: u64,
    queued: bool,
    /// The generation of the latest event the filter passed, while no
    /// reconcile here has settled since: cleared only when a reconcile of
    /// the key, taken at that generation or later, ends done (not
    /// scheduled again, not aborted).
    pending: Option<u64>,
}

impl KeySlots {
    /// Records an event of `obj`; `enqueued` when its key is being enqueued.
    fn record<K: Object>(&self, key: &str, obj: &K, enqueued: bool) {
        let slot = slot_of_uid(obj.uid().unwrap_or_default(), self.slots);
        let mut map = self.map.lock();
        let record = map.entry(key.to_owned()).or_insert(KeyRecord {
            slot,
            generation: 0,
            queued: false,
            pending: None,
        });
        record.slot = slot;
        record.generation += 1;
        record.queued |= enqueued;
        if enqueued {
            record.pending = Some(record.generation);
        }
    }

    /// A reconcile of `key`, taken at `generation`, is done (ended without
    /// scheduling the key again): the passed events up to then are worked
    /// on, whatever events the filter turned down came since.
    fn worked(&self, key: &str, generation: u64) {
        if let Some(record) = self.map.lock().get_mut(key)
            && record.pending.is_some_and(|at| at <= generation)
        {
            record.pending = None;
        }
    }

    /// A worker takes `key` from the queue: its slot and generation.
    fn take(&self, key: &str) -> Option<(u32, u64)> {
        let mut map = self.map.lock();
        let record = map.get_mut(key)?;
        record.queued = false;
        Some((record.slot, record.generation))
    }

    /// `key` is queued or scheduled again.
    fn queued(&self, key: &str) {
        if let Some(record) = self.map.lock().get_mut(key) {
            record.queued = true;
        }
    }

    /// Forgets `key` if it is still at `generation` and its object is not
    /// cached. Under the map's lock: the informer updates its cache before
    /// its handlers record an event, so an object added meanwhile is either
    /// cached here or recorded after, at a new generation.
    fn forget(&self, key: &str, generation: u64, cached: impl Fn(&str) -> bool) {
        let mut map = self.map.lock();
        if map.get(key).is_some_and(|r| r.generation == generation) && !cached(key) {
            map.remove(key);
        }
    }

    /// Forgets `key` (its object deleted) unless it is queued.
    fn forget_unless_queued(&self, key: &str) {
        let mut map = self.map.lock();
        if map.get(key).is_some_and(|r| !r.queued) {
            map.remove(key);
        }
    }

    /// The keys of `slot`, for a slot just made ready: those with an event
    /// the filter passed and no reconcile here settled since (queued or
    /// pending), and the others, whose events the filter turned down or
    /// were reconciled here already.
    fn slot_keys(&self, slot: u32) -> (Vec<String>, Vec<String>) {
        let (mut passed, mut others) = (Vec::new(), Vec::new());
        for (key, record) in self.map.lock().iter().filter(|(_, r)| r.slot == slot) {
            if record.queued || record.pending.is_some() {
                passed.push(key.clone());
            } else {
                others.push(key.clone());
            }
        }
        (passed, others)
    }

    /// Marks `keys` queued: the caller enqueues them.
    fn mark_queued(&self, keys: &[String]) {
        let mut map = self.map.lock();
        for key in keys {
            if let Some(record) = map.get_mut(key) {
                record.queued = true;
            }
        }
    }

    fn count(&self, slot: u32) -> u64 {
        self.map.lock().values().filter(|r| r.slot == slot).count() as u64
    }
}

impl<K: Object + Clone> Controller<K> {
    /// A controller named `name` reconciling the keys of `informer`'s objects.
    pub fn new(
        name: &str,
        informer: SharedIndexInformer<K>,
        reconciler: impl Reconciler,
        options: ControllerOptions<K>,
    ) -> Result<Self, ControllerError> {
        if options.workers == 0 {
            return Err(ControllerError::InvalidOptions(format!(
                "controller {name:?}: workers is 0, so no key would ever be reconciled"
            )));
        }
        if let Some(elector) = &options.leader_election {
            elector.config().validate()?;
        }
        if options.ring.is_some() && options.leader_election.is_some() {
            return Err(ControllerError::InvalidOptions(format!(
                "controller {name:?}: sharded over a ring and leader-elected: choose one"
            )));
        }
        let key_slots = options.ring.as_ref().map(|ring| {
            let key_slots = Arc::new(KeySlots {
                slots: ring.config().slots,
                map: Mutex::new(std::collections::HashMap::new()),
            });
            let counted = Arc::clone(&key_slots);
            ring.count_keys_with(move |slot| counted.count(slot));
            key_slots
        });
        let mut config = QueueConfig::new().name(name);
        if let Some(m) = &options.metrics {
            config = config.metrics_provider(m.workqueue_provider());
        }
        let queue = RateLimitingQueue::with_config(default_controller_rate_limiter(), config);
        let reasons = Arc::new(Reasons::default());
        let (ra, ru, rd) = (reasons.clone(), reasons.clone(), reasons.clone());
        let filter = options.event_filter.clone();
        let pass = move |e: Event<'_, K>| filter.as_ref().is_none_or(|f| f(e));
        let (qa, qu, qd) = (queue.clone(), queue.clone(), queue.clone());
        let (pa, pu, pd) = (pass.clone(), pass.clone(), pass);
        let (sa, su, sd) = (key_slots.clone(), key_slots.clone(), key_slots.clone());
        // A sharded controller records each key's slot before enqueueing it.
        let handler = ResourceEventHandlerFuncs::new()
            .on_add(move |obj: &Arc<K>, _| {
                let key = meta_namespace_key(obj.as_ref());
                let pass = pa(Event::Add(obj));
                if let (Some(s), Ok(key)) = (&sa, &key) {
                    s.record(key, obj.as_ref(), pass);
                }
                if pass {
                    enqueue(&qa, &ra, key, Reason::Added);
                }
            })
            .on_update(move |old: &Arc<K>, new: &Arc<K>| {
                let key = meta_namespace_key(new.as_ref());
                let pass = pu(Event::Update { old, new });
                if let (Some(s), Ok(key)) = (&su, &key) {
                    s.record(key, new.as_ref(), pass);
                }
                if pass {
                    let resync = old.resource_version().is_some()
                        && old.resource_version() == new.resource_version();
                    let reason = if resync {
                        Reason::Resynced
                    } else {
                        Reason::Updated
                    };
                    enqueue(&qu, &ru, key, reason);
                }
            })
            .on_delete(move |obj: &ObjectOrTombstone<K>| {
                let key = deletion_handling_meta_namespace_key(obj);
                let pass = pd(Event::Delete(obj));
                if let (Some(s), Ok(key)) = (&sd, &key) {
                    s.record(key, obj.object().as_ref(), pass);
                    if !pass {
                        // Nothing will handle the key unless it is queued
                        // already; its object is no longer cached.
                        s.forget_unless_queued(key);
                    }
                }
                if pass {
                    enqueue(&qd, &rd, key, Reason::Deleted);
                }
            });
        informer.add_event_handler(handler)?;
        Ok(Self {
            name: name.to_owned(),
            informer,
            dependencies: Vec::new(),
            queue,
            reconciler: Arc::new(reconciler),
            options,
            fatal: Arc::new(Mutex::new(None)),
            key_slots,
            reasons,
        })
    }

    /// A controller whose reconcile is the async closure `f`: it receives
    /// the object read from `informer`'s cache at reconcile time, or
    /// [`Lookup::Gone`] once it was deleted.
    pub fn from_fn<F, Fut>(
        name: &str,
        informer: SharedIndexInformer<K>,
        f: F,
        options: ControllerOptions<K>,
    ) -> Result<Self, ControllerError>
    where
        F: Fn(Lookup<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
    {
        let cache = informer.indexer();
        Self::new(name, informer, FnReconciler { cache, f }, options)
    }

    /// Also reconciles the keys `mapper` returns for every event of
    /// `informer` (an add, either side of an update, a delete): typically
    /// owners found through a secondary index. The informer is started if
    /// nobody did, and synced before any worker starts.
    pub fn watches<C: Object + Clone>(
        self,
        informer: SharedIndexInformer<C>,
        mapper: impl Fn(&C) -> Vec<String> + Send + Sync + 'static,
    ) -> Result<Self, ControllerError> {
        self.watches_kind(informer, mapper, reason::type_name::<C>())
    }

    /// [`watches`](Self::watches), naming `C` `kind` in the reasons of the
    /// keys it queues.
    fn watches_kind<C: Object + Clone>(
        mut self,
        informer: SharedIndexInformer<C>,
        mapper: impl Fn(&C) -> Vec<String> + Send + Sync + 'static,
        kind: Arc<str>,
    ) -> Result<Self, ControllerError> {
        let mapper = Arc::new(mapper);
        let (ma, mu, md) = (Arc::clone(&mapper), Arc::clone(&mapper), mapper);
        let queue_for = |queue: RateLimitingQueue<String>, reasons: Arc<Reasons>| {
            let kind = Arc::clone(&kind);
            move |related: &C, keys: Vec<String>| {
                for key in keys {
                    reasons.now(&key, || Reason::Related {
                        kind: Arc::clone(&kind),
                        key: meta_namespace_key(related).unwrap_or_default(),
                    });
                    queue.add(key);
                }
            }
        };
        let qa = queue_for(self.queue.clone(), Arc::clone(&self.reasons));
        let qu = queue_for(self.queue.clone(), Arc::clone(&self.reasons));
        let qd = queue_for(self.queue.clone(), Arc::clone(&self.reasons));
        let handler = ResourceEventHandlerFuncs::new()
            .on_add(move |obj: &Arc<C>, _| qa(obj, ma(obj)))
            .on_update(move |old: &Arc<C>, new: &Arc<C>| {
                let mut keys = mu(old);
                keys.extend(mu(new));
                qu(new, keys);
            })
            .on_delete(move |obj: &ObjectOrTombstone<C>| {
                let obj = obj.object();
                qd(obj, md(obj));
            });
        informer.add_event_handler(handler)?;
        self.dependencies.push(Box::new(informer));
        Ok(self)
    }

    /// Also reconciles the owner of every object of `informer` whose
    /// controller ownerReference names a `K`: client-go's
    /// `EnqueueRequestForOwner` with `OnlyControllerOwner`. An update that
    /// moves the object to another owner reconciles both.
    pub fn owns<C: Object + Clone + Resource>(
        self,
        informer: SharedIndexInformer<C>,
    ) -> Result<Self, ControllerError>
    where
        K: Resource,
        K::DynamicType: Default,
        K::Scope: 'static,
    {
        let dt = K::DynamicType::default();
        let kind = K::kind(&dt).into_owned();
        let group = K::group(&dt).into_owned();
        let cluster_scoped =
            std::any::TypeId::of::<K::Scope>() == std::any::TypeId::of::<ClusterResourceScope>();
        let child_kind = reason::type_name::<C>();
        self.watches_kind(
            informer,
            move |child: &C| {
                let namespace = child
                    .meta()
                    .namespace
                    .as_deref()
                    .filter(|_| !cluster_scoped);
                child
                    .meta()
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|r| r.controller == Some(true) && r.kind == kind)
                    .filter(|r| r.api_version.rsplit_once('/').map_or("", |(g, _)| g) == group)
                    .map(|r| match namespace {
                        Some(ns) => format!("{ns}/{}", r.name),
                        None => r.name.clone(),
                    })
                    .collect()
            },
            child_kind,
        )
    }

    /// The workqueue (for inspection and tests).
    pub fn queue(&self) -> &RateLimitingQueue<String> {
        &self.queue
    }

    /// Runs until `shutdown` fires: starts the informer if nobody did, waits
    /// for its cache, waits for leadership if elected, then reconciles with
    /// `workers` workers. See [`ControllerOptions`] for how it stops.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ControllerError> {
        self.run_managed(shutdown, None).await
    }

    /// The controller's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn options(&self) -> &ControllerOptions<K> {
        &self.options
    }

    /// Runs as [`run`](Self::run) does, or as one of a [`Manager`](crate::Manager)'s
    /// controllers when `managed` is given.
    pub(crate) async fn run_managed(
        self,
        shutdown: CancellationToken,
        managed: Option<Managed>,
    ) -> Result<(), ControllerError> {
        let span = info_span!("controller", name = %self.name);
        // A sharded controller takes part in its ring from the start (its
        // cache is empty until it holds slots) until its workers have ended;
        // then it hands its slots over. Dropped mid-way, it stops the ring
        // all the same.
        let ring_stop = CancellationToken::new();
        let _ring_stop_on_drop = ring_stop.clone().drop_guard();
        let ring = self.options.ring.clone().map(|ring| {
            let stop = ring_stop.clone();
            tokio::spawn(async move { ring.run(stop).await }.instrument(span.clone()))
        });
        // The informers this controller starts: a Manager waits for them
        // once it has stopped them; a controller on its own, here.
        let own_tasks = InformerTasks::default();
        let tasks = managed
            .as_ref()
            .map_or_else(|| own_tasks.clone(), |m| m.informer_tasks.clone());
        let result = self
            .run_inner(shutdown, managed, tasks)
            .instrument(span)
            .await;
        ring_stop.cancel();
        if let Some(ring) = ring {
            let _ = ring.await;
        }
        // Stopped when run_inner returned (its drop guard).
        own_tasks.join(INFORMER_STOP_WAIT).await;
        result
    }

    async fn run_inner(
        self,
        shutdown: CancellationToken,
        managed: Option<Managed>,
        tasks: InformerTasks,
    ) -> Result<(), ControllerError> {
        // A Crash panic cancels `stop` as shutdown does; the informer we start
        // and the elector have tokens of their own, cancelled last (by the
        // Manager, for its controllers: after all of them have ended).
        let stop = shutdown.child_token();
        let informer_stop = managed
            .as_ref()
            .map_or_else(CancellationToken::new, |m| m.informer_stop.clone());
        let _stop_informer = managed
            .is_none()
            .then(|| informer_stop.clone().drop_guard());
        let external_election = managed.as_ref().is_some_and(|m| m.external_election);
        let informers: Vec<&dyn Dependency> = std::iter::once(&self.informer as &dyn Dependency)
            .chain(self.dependencies.iter().map(|d| d.as_ref()))
            .collect();
        for informer in &informers {
            informer.start_unless_running(&informer_stop, &self.fatal, &stop, &tasks);
        }
        info!(
            informers = informers.len(),
            "waiting for the caches to sync"
        );
        let synced: Vec<&dyn HasSynced> = informers.iter().map(|i| *i as &dyn HasSynced).collect();
        if !wait_for_cache_sync(&stop, &synced).await {
            self.stopping();
            return self.fatal.lock().take().map_or(Ok(()), Err);
        }
        info!(cached = self.informer.indexer().len(), "cache synced");
        match &managed {
            Some(m) => (m.synced)(),
            None => {
                if let Some(m) = &self.options.metrics {
                    m.set_ready(true);
                }
            }
        }

        let mut leadership = None;
        if let Some(elector) = &self.options.leader_election {
            let election_stop = CancellationToken::new();
            let mut leading = elector.subscribe();
            // The Manager runs its election itself, for all its controllers.
            let task = (!external_election).then(|| {
                let elector = Arc::clone(elector);
                let election_stop = election_stop.clone();
                tokio::spawn(async move { elector.run(election_stop).await })
            });
            info!("waiting to become the leader");
            tokio::select! {
                _ = stop.cancelled() => {
                    self.stopping();
                    election_stop.cancel();
                    if let Some(task) = task {
                        let _ = task.await;
                    }
                    return Ok(());
                }
                led = async { leading.wait_for(|leading| *leading).await.is_ok() } => if !led {
                    self.stopping();
                    return Err(ControllerError::LostLeadership);
                },
            }
            info!("leading; starting workers");
            leadership = Some(Leadership {
                elector: Arc::clone(elector),
                leading,
                stop: election_stop,
                task,
            });
        }

        let halt = CancellationToken::new();
        let abort = CancellationToken::new();
        let shared = Arc::new(Worker {
            name: self.name.clone(),
            queue: self.queue.clone(),
            reconciler: Arc::clone(&self.reconciler),
            max_retries: self.options.max_retries,
            panic_policy: self.options.panic_policy,
            reconcile_timeout: self.options.reconcile_timeout,
            metrics: self.options.metrics.clone(),
            fatal: Arc::clone(&self.fatal),
            stop: stop.clone(),
            halt: halt.clone(),
            abort: abort.clone(),
            elector: self.options.leader_election.clone(),
            reasons: Arc::clone(&self.reasons),
            sharding: self.options.ring.clone().zip(self.key_slots.clone()).map(
                |(ring, key_slots)| Sharding {
                    held: ring.subscribe(),
                    ring,
                    key_slots,
                    cache: Box::new({
                        let cache = self.informer.indexer();
                        move |key: &str| cache.get_by_key(key).is_some()
                    }),
                    ready: Arc::default(),
                },
            ),
        });
        // A sharded controller's workers enter only the slots whose objects
        // are cached.
        let _priming = shared.sharding.as_ref().map(|sharding| {
            let informer = self.informer.clone();
            AbortOnDrop(tokio::spawn(prime(
                Arc::clone(&sharding.ring),
                Arc::clone(&sharding.key_slots),
                Arc::clone(&sharding.ready),
                move || informer.queued(),
                wanted_on_taking(&self.informer, self.options.event_filter.clone()),
                self.queue.clone(),
                Arc::clone(&self.reasons),
            )))
        });
        let mut workers: JoinSet<()> = JoinSet::new();
        for _ in 0..self.options.workers {
            workers.spawn(Arc::clone(&shared).run());
        }
        info!(workers = self.options.workers, "started workers");

        let lost = tokio::select! {
            _ = stop.cancelled() => false,
            _ = lost_leadership(&mut leadership) => true,
        };
        if let Some(m) = &self.options.metrics {
            m.set_stopping();
        }
        let mut result = Ok(());
        // A Crash panic or a failed informer: nothing more is worked, as
        // after a crash; in-flight reconciles are aborted below.
        let fatal = self.fatal.lock().is_some();
        let lost = lost
            || (!fatal && {
                info!(timeout = ?self.options.drain_timeout, "shutting down: draining queued and in-flight reconciles");
                tokio::select! {
                    drained = tokio::time::timeout(self.options.drain_timeout, self.queue.shut_down_with_drain()) => {
                        if drained.is_err() {
                            warn!(timeout = ?self.options.drain_timeout, "drain timed out; aborting the reconciles still running");
                        }
                        false
                    }
                    _ = lost_leadership(&mut leadership) => true,
                }
            })
            // A loss at the very end of the drain still counts.
            || leadership.as_ref().is_some_and(|l| !l.elector.may_work());
        // Whatever the path, no key is handed out from here on.
        halt.cancel();
        self.queue.shut_down();
        if lost {
            error!("lost the leader lease; stopping at once");
            result = Err(ControllerError::LostLeadership);
            let now = Instant::now();
            let grace = now.checked_add(self.options.lost_leadership_grace);
            let safe = leadership.as_ref().and_then(|l| l.elector.safe_until());
            let deadline = match (grace, safe) {
                (Some(grace), Some(safe)) => grace.min(safe),
                (None, Some(safe)) => safe,
                (_, None) => now,
            };
            if tokio::time::timeout_at(deadline, join_all(&mut workers))
                .await
                .is_err()
            {
                warn!(
                    running = workers.len(),
                    "in-flight reconciles outlived the lease; aborting them"
                );
            }
        }
        abort.cancel();
        let all_joined = tokio::time::timeout(ABORT_WAIT, join_all(&mut workers))
            .await
            .is_ok();
        let stuck = workers.len();
        if !all_joined {
            error!(
                running = stuck,
                "workers did not stop when aborted (a reconcile blocks its thread); leaving them behind"
            );
            workers.abort_all();
            result = Err(ControllerError::WorkersStuck { running: stuck });
            if let Some(ring) = &self.options.ring {
                // Their guards never drop: a handover would wait for ever,
                // whatever error the controller ends with.
                ring.abandon();
            }
        }
        if let Some(mut l) = leadership {
            if !all_joined {
                l.elector.keep_lease_on_cancel();
            }
            // Only now may a standby lead: every reconcile has ended.
            l.stop.cancel();
            if let Some(task) = l.task.take() {
                let _ = task.await;
            }
        }
        if let Some(e) = self.fatal.lock().take() {
            return Err(e);
        }
        result
    }

    /// Stops the queue and fails the probes: the controller is ending.
    fn stopping(&self) {
        self.queue.shut_down();
        if let Some(m) = &self.options.metrics {
            m.set_stopping();
        }
    }
}

/// How a [`Manager`](crate::Manager) runs one of its controllers.
pub(crate) struct Managed {
    /// Stops the informers the controller starts; the Manager cancels it
    /// once every controller has ended.
    pub(crate) informer_stop: CancellationToken,
    /// The controller's elector is the Manager's, which runs and releases it.
    pub(crate) external_election: bool,
    /// Called once the controller's caches have synced.
    pub(crate) synced: Box<dyn Fn() + Send + Sync>,
    /// Where the controller puts the informer tasks it starts, for the
    /// Manager to wait for once it has stopped them.
    pub(crate) informer_tasks: InformerTasks,
}

/// How long a stopped informer gets to end before its task is left behind.
pub(crate) const INFORMER_STOP_WAIT: Duration = Duration::from_secs(5);

/// The tasks of the informers controllers started, waited for once they are
/// stopped: an informer whose task is dropped mid-way (the runtime shutting
/// down) reports itself failed.
#[derive(Clone, Default)]
pub(crate) struct InformerTasks(Arc<Mutex<Vec<JoinHandle<()>>>>);

impl InformerTasks {
    fn push(&self, task: JoinHandle<()>) {
        self.0.lock().push(task);
    }

    /// Waits up to `limit` for every task (their informers must have been
    /// told to stop).
    pub(crate) async fn join(&self, limit: Duration) {
        let tasks = std::mem::take(&mut *self.0.lock());
        let all = futures::future::join_all(tasks);
        if tokio::time::timeout(limit, all).await.is_err() {
            warn!(waited = ?limit, "informers did not stop in time; leaving them behind");
        }
    }
}

/// An informer a controller reads: started unless running, waited for.
trait Dependency: HasSynced + Send + Sync {
    /// Starts it on `informer_stop` unless someone runs it already; if it
    /// fails, the controller stops with `InformerFailed`.
    fn start_unless_running(
        &self,
        informer_stop: &CancellationToken,
        fatal: &Arc<Mutex<Option<ControllerError>>>,
        stop: &CancellationToken,
        tasks: &InformerTasks,
    );
}

impl<C: Object + Clone> Dependency for SharedIndexInformer<C> {
    fn start_unless_running(
        &self,
        informer_stop: &CancellationToken,
        fatal: &Arc<Mutex<Option<ControllerError>>>,
        stop: &CancellationToken,
        tasks: &InformerTasks,
    ) {
        if self.is_started() {
            return;
        }
        let informer = self.clone();
        let (informer_stop, fatal, stop) = (informer_stop.clone(), Arc::clone(fatal), stop.clone());
        // An informer that can no longer follow the server stops the
        // controller: reconciling from a frozen cache would be wrong.
        tasks.push(tokio::spawn(async move {
            if let Err(e) = informer.run(informer_stop).await {
                error!(error = %e, "an informer failed; stopping the controller");
                fatal
                    .lock()
                    .get_or_insert(ControllerError::InformerFailed(e));
                stop.cancel();
            }
        }));
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often a sharded controller looks whether the cache holds a slot
/// just taken.
const PRIME_POLL: Duration = Duration::from_millis(20);

/// How many keys of a slot just taken `prime` runs the event filter on
/// before it yields.
const PRIME_BATCH: usize = 256;

/// Keeps `ready` to the held slots whose objects the primary cache holds.
/// A slot leaves it as soon as the ring no longer holds it. A slot the ring
/// takes joins it once the primary informer has listed a shard including it
/// ([`ShardScope::listed_generation`](kinformer_informer::ShardScope::listed_generation))
/// and its queue has since been empty, so that no key of the slot is
/// reconciled against a cache that lacks its object (it would look
/// deleted); at once when no lister-watcher lists the ring's scope (the
/// cache then holds every object). The slot's keys are then enqueued: they
/// may have arrived, and been dropped, while the slot was not ready, and an
/// object relisted unchanged brings no event. A key with an event the
/// filter passed, and no reconcile here settled since, is enqueued; any
/// other only if `wanted` (its cached object passes the filter as an add,
/// as it would on a replica's first list).
async fn prime(
    ring: Arc<Ring>,
    key_slots: Arc<KeySlots>,
    ready: Arc<parking_lot::RwLock<std::collections::BTreeSet<u32>>>,
    queued: impl Fn() -> usize,
    wanted: impl Fn(&str) -> bool,
    queue: RateLimitingQueue<String>,
    reasons: Arc<Reasons>,
) {
    let mut held = ring.subscribe();
    let scope = ring.scope();
    loop {
        let now = held.borrow_and_update().clone();
        ready.write().retain(|s| now.contains(s));
        let taken: Vec<u32> = {
            let ready = ready.read();
            now.iter().copied().filter(|s| !ready.contains(s)).collect()
        };
        let mut primed = true;
        if !taken.is_empty() {
            let generation = scope.generation();
            loop {
                if held.has_changed().unwrap_or(true) {
                    // Looked at again with the new held slots.
                    primed = false;
                    break;
                }
                if !scope.in_use() || (scope.listed_generation() >= generation && queued() == 0) {
                    break;
                }
                tokio::time::sleep(PRIME_POLL).await;
            }
        }
        if primed && !taken.is_empty() {
            ready.write().extend(taken.iter().copied());
            let (mut keys, mut others) = (Vec::new(), Vec::new());
            for &slot in &taken {
                let (passed, rest) = key_slots.slot_keys(slot);
                keys.extend(passed);
                others.extend(rest);
            }
            // The filter is user code and may decode (a compact cache):
            // let other tasks run between batches.
            for batch in others.chunks(PRIME_BATCH) {
                keys.extend(batch.iter().filter(|key| wanted(key)).cloned());
                tokio::task::yield_now().await;
            }
            key_slots.mark_queued(&keys);
            info!(slots = ?taken, keys = keys.len(), "the cache holds the slots taken; working on them");
            for key in keys {
                reasons.now(&key, || Reason::SlotTaken);
                queue.add(key);
            }
        }
        if primed && held.changed().await.is_err() {
            return;
        }
    }
}

/// Whether a key of a slot just taken, with no event the filter passed
/// waiting, is worth a reconcile: its object is cached and passes the
/// filter as an add (what a replica that starts with the slot would see).
/// A key whose object is not cached is not: its deletion, if the filter
/// passed it, is pending. A filter that panics turns the key down, as it
/// does an event.
fn wanted_on_taking<K: Object + Clone>(
    informer: &SharedIndexInformer<K>,
    filter: Option<EventFilter<K>>,
) -> impl Fn(&str) -> bool + Send + 'static {
    let cache = informer.indexer();
    move |key: &str| {
        match (cache.get_by_key(key), &filter) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(obj), Some(filter)) => {
            std::panic::catch_unwind(AssertUnwindSafe(|| filter(Event::Add(&obj))))
                .unwrap_or_else(|panic| {
                    error!(key, panic = %panic_message(&panic), "the event filter panicked on a cached object of a slot just taken; not enqueued");
                    false
                })
        }
    }
    }
}

/// How long aborted workers get to unwind before they are left behind.
const ABORT_WAIT: Duration = Duration::from_secs(5);

struct Leadership {
    elector: Arc<LeaderElector>,
    leading: watch::Receiver<bool>,
    stop: CancellationToken,
    /// Taken when `run` ends normally; `None` when the Manager runs the election.
    task: Option<JoinHandle<()>>,
}

impl Drop for Leadership {
    /// `run`'s future was dropped mid-way: stop campaigning, and leave the
    /// lease to expire, since aborted workers may not have ended yet.
    fn drop(&mut self) {
        if self.task.is_some() {
            self.elector.keep_lease_on_cancel();
            self.stop.cancel();
        }
    }
}

/// Resolves once leadership is lost, by the elector's word or by our own
/// clock (the lease is no longer safely ours, though the elector has not
/// said so yet: it may be starved); never without leader election.
async fn lost_leadership(leadership: &mut Option<Leadership>) {
    let Some(l) = leadership else {
        return std::future::pending().await;
    };
    lease_lost(&l.elector, &mut l.leading).await;
}

/// Resolves once `elector` has lost its lease, by its word (`leading`
/// turns false) or by our own clock (past [`LeaderElector::safe_until`]
/// without a renewal).
async fn lease_lost(elector: &LeaderElector, leading: &mut watch::Receiver<bool>) {
    loop {
        let Some(safe) = elector.safe_until() else {
            return;
        };
        tokio::select! {
            _ = leading.wait_for(|leading| !*leading) => return,
            _ = tokio::time::sleep_until(safe) => {
                if !elector.may_work() {
                    return;
                }
            }
        }
    }
}

async fn join_all(workers: &mut JoinSet<()>) {
    while workers.join_next().await.is_some() {}
}

fn enqueue(
    queue: &RateLimitingQueue<String>,
    reasons: &Reasons,
    key: Result<String, kinformer_store::KeyError>,
    reason: Reason,
) {
    match key {
        Ok(key) => {
            reasons.now(&key, || reason);
            queue.add(key);
        }
        Err(e) => warn!(error = %e, "ignoring an object without a key"),
    }
}

struct Worker {
    name: String,
    queue: RateLimitingQueue<String>,
    reconciler: Arc<dyn Reconciler>,
    max_retries: u32,
    panic_policy: PanicPolicy,
    reconcile_timeout: Option<Duration>,
    metrics: Option<Arc<Metrics>>,
    fatal: Arc<Mutex<Option<ControllerError>>>,
    /// Cancelled on a Crash panic: the controller stops.
    stop: CancellationToken,
    /// Cancelled when no further key may be taken (lost lease, end of drain).
    halt: CancellationToken,
    /// Cancelled when in-flight reconciles must end now: they are dropped.
    abort: CancellationToken,
    elector: Option<Arc<LeaderElector>>,
    sharding: Option<Sharding>,
    reasons: Arc<Reasons>,
}

/// Whether a reconcile left its key unscheduled (`Yes`), scheduled it
/// again (a retry, a `RequeueAfter`: `No`), or was aborted because its
/// slot's Lease was lost (`LeaseLost`: not scheduled again here, and not
/// done either).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    Yes,
    No,
    LeaseLost,
}

/// What a sharded controller's workers need.
struct Sharding {
    ring: Arc<Ring>,
    key_slots: Arc<KeySlots>,
    /// Whether the primary cache holds a key.
    cache: Box<dyn Fn(&str) -> bool + Send + Sync>,
    /// The held slots whose objects the primary cache holds: the only slots
    /// workers enter (see `prime`).
    ready: Arc<parking_lot::RwLock<std::collections::BTreeSet<u32>>>,
    /// The ring's held slots as last sent.
    held: watch::Receiver<std::collections::BTreeSet<u32>>,
}

/// Whether a worker may reconcile a key of a sharded controller now.
enum Entry {
    /// Yes: in its slot's guard; the key's generation.
    Entered(SlotGuard, u64),
    /// The slot is held but its objects are not all cached yet: the key is
    /// enqueued again once they are (see `prime`).
    NotReady,
    /// The slot is not this replica's now (or no object of the key is
    /// known): its holder reconciles it; the key's generation, if known.
    NotHeld(Option<u64>),
}

impl Sharding {
    /// Enters the slot of `key`'s object, if this replica may work on it
    /// now: a slot in the ring's held set as last sent (the set the
    /// informer's scope follows) whose objects are cached, and whose Lease
    /// is safely held.
    fn enter(&self, key: &str) -> Entry {
        let Some((slot, generation)) = self.key_slots.take(key) else {
            return Entry::NotHeld(None);
        };
        if !self.held.borrow().contains(&slot) {
            return Entry::NotHeld(Some(generation));
        }
        if !self.ready.read().contains(&slot) {
            // Kept, and marked queued: `prime` enqueues the slot's keys.
            self.key_slots.queued(key);
            return Entry::NotReady;
        }
        match self.ring.enter(slot) {
            Some(guard) => Entry::Entered(guard, generation),
            None => Entry::NotHeld(Some(generation)),
        }
    }

    /// Forgets `key` at `generation` unless its object is cached.
    fn forget(&self, key: &str, generation: u64) {
        self.key_slots.forget(key, generation, &self.cache);
    }

    /// Resolves once the Lease of `guard`'s slot is lost (or no longer
    /// safely held by our clock); never while it is held, handed over or
    /// not.
    async fn lost(&self, guard: &SlotGuard) {
        let Some(elector) = self.ring.slot_elector(guard.slot()) else {
            return;
        };
        lease_lost(&elector, &mut elector.subscribe()).await;
    }
}

impl Worker {
    async fn run(self: Arc<Self>) {
        loop {
            let key = tokio::select! {
                biased;
                _ = self.halt.cancelled() => return,
                key = self.queue.get() => key,
            };
            let Some(key) = key else { return };
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
                .process(&key, entered.as_ref().map(|(guard, _)| guard))
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
    async fn process(&self, key: &str, slot: Option<&SlotGuard>) -> Option<Settled> {
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
        self.process_in_span(key, slot).instrument(span).await
    }

    async fn process_in_span(&self, key: &str, slot: Option<&SlotGuard>) -> Option<Settled> {
        let started = Instant::now();
        // Inside the guard: a reconciler may panic before returning its future.
        let reconcile =
            AssertUnwindSafe(async { self.reconciler.reconcile(key).await }).catch_unwind();
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
            return Some(
                self.retry_or_drop(key_owned, format!("reconcile timed out after {limit:?}")),
            );
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
                self.queue.add_after(key_owned, after);
                Settled::No
            }
            Ok(Err(e)) => {
                self.record(key, "error", seconds);
                if let Some(m) = &self.metrics {
                    m.reconcile_error(&self.name);
                }
                if is_terminal(e.as_ref()) {
                    error!(key, error = %chain(e.as_ref()), "terminal reconcile error; not retrying");
                    if let Some(m) = &self.metrics {
                        m.terminal_error(&self.name);
                    }
                    self.queue.forget(&key_owned);
                    Settled::Yes
                } else {
                    self.retry_or_drop(key_owned, chain(e.as_ref()))
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
                self.retry_or_drop(key_owned, format!("panic: {message}"))
            }
        };
        Some(settled)
    }

    fn record(&self, _key: &str, result: &str, seconds: f64) {
        if let Some(m) = &self.metrics {
            m.reconciled(&self.name, result, seconds);
        }
    }

    fn retry_or_drop(&self, key: String, error: String) -> Settled {
        let retries = self.queue.num_requeues(&key);
        if retries < self.max_retries {
            warn!(key = %key, retries, error = %error, "reconcile failed; retrying with backoff");
            self.reasons.scheduled(&key, Reason::Retry);
            self.queue.add_rate_limited(key);
            Settled::No
        } else {
            error!(key = %key, retries, error = %error, "dropping the key after too many failed reconciles");
            self.queue.forget(&key);
            Settled::Yes
        }
    }
}

/// `error` and its `source()`s, outermost first: `a: b: c`.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        // Many errors repeat their source in their own message.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = e.source();
    }
    out
}

/// `future`'s output, or `None` if it did not finish within `limit`.
async fn with_timeout<F: Future>(limit: Option<Duration>, future: F) -> Option<F::Output> {
    match limit {
        Some(limit) => tokio::time::timeout(limit, future).await.ok(),
        None => Some(future.await),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("writing the Service")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn key_slots_with_one_key() -> (KeySlots, k8s_openapi::api::core::v1::ConfigMap, u32) {
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.uid = Some("0b5e0d8e-5a44-4d3a-9f3e-1c2d3e4f5a6b".into());
        let slot = slot_of_uid(cm.metadata.uid.as_deref().unwrap_or_default(), 4);
        let slots = KeySlots {
            slots: 4,
            map: Mutex::default(),
        };
        (slots, cm, slot)
    }

    #[test]
    fn an_event_the_filter_turned_down_during_a_reconcile_does_not_keep_the_key_pending() {
        let (slots, cm, slot) = key_slots_with_one_key();
        slots.record("ns/a", &cm, true);
        let (_, generation) = slots.take("ns/a").unwrap();
        // A status write of the reconcile comes back, turned down.
        slots.record("ns/a", &cm, false);
        slots.worked("ns/a", generation);
        let (passed, others) = slots.slot_keys(slot);
        assert!(passed.is_empty(), "{passed:?}");
        assert_eq!(others, ["ns/a"]);
    }

    #[test]
    fn an_event_the_filter_passed_during_a_reconcile_keeps_the_key_pending() {
        let (slots, cm, slot) = key_slots_with_one_key();
        slots.record("ns/a", &cm, true);
        let (_, generation) = slots.take("ns/a").unwrap();
        slots.record("ns/a", &cm, true);
        slots.take("ns/a");
        slots.worked("ns/a", generation);
        let (passed, _) = slots.slot_keys(slot);
        assert_eq!(passed, ["ns/a"]);
    }

    #[test]
    fn a_terminal_error_anywhere_in_the_source_chain_is_terminal() {
        let bad_spec = || TerminalError(Box::new(std::io::Error::other("bad spec")));
        let outermost: ReconcileError = Box::new(bad_spec());
        let in_finalizer: ReconcileError = Box::new(crate::finalizer::FinalizerError::Reconcile(
            Box::new(bad_spec()),
        ));
        let plain: ReconcileError = Box::new(Outer(std::io::Error::other("reset")));
        assert!(is_terminal(outermost.as_ref()));
        assert!(is_terminal(in_finalizer.as_ref()));
        assert!(!is_terminal(plain.as_ref()));
    }

    #[test]
    fn a_logged_error_names_its_whole_source_chain() {
        let inner = std::io::Error::other("connection reset");
        let terminal = TerminalError::boxed(Outer(inner));
        // TerminalError's message already holds Outer's: said once.
        assert_eq!(
            chain(terminal.as_ref()),
            "terminal: writing the Service: connection reset"
        );
    }
}
