//! The generic controller: informer events become keys in a rate-limited
//! workqueue; workers reconcile keys, reading state from the Lister.
//!
//! The worker loop is client-go's: `get` a key, reconcile it, `done` it. On
//! success the key's failures are forgotten; on error (or a caught panic) it
//! is re-added with per-item backoff (5 ms doubling, capped at 1 000 s, as
//! controller-runtime) until it succeeds or fails terminally. With a
//! `max_retries` limit set it is dropped after that many retries, with a log
//! line naming it and its last error, counted in
//! `kinformer_controller_dropped_keys_total`.
//! The workqueue guarantees that no key is reconciled by two workers at once.

use std::sync::Arc;
use std::time::Duration;

use kinformer_informer::{
    GroupResource, HasSynced, ResourceEventHandlerFuncs, SharedIndexInformer, wait_for_cache_sync,
};
use kinformer_store::{
    Object, ObjectKey, ObjectOrTombstone, deletion_handling_meta_namespace_key, meta_namespace_key,
};
use kinformer_workqueue::{
    Priority, QueueConfig, RateLimitingQueue, default_controller_rate_limiter,
};
use kube_client::Resource;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use crate::gate::{Debounce, Gate, Leader};
use crate::key_slots::{KeySlots, Sharding, prime, wanted_on_taking};
use crate::leader::lease_lost;
use crate::options::{ControllerOptions, Event};
use crate::rbac::{self, Permissions};
use crate::read_your_writes::{
    Consistency, Read, ReadYourWrites, Relation, WriteTracker, api_group,
};
use crate::reason::{self, Reason, Reasons};
use crate::reconcile::{Action, FnReconciler, Lookup, ReconcileError, Reconciler};
use crate::worker::{Life, Policy, Worker};
use crate::{ControllerError, LeaderElector};

/// A named controller over one informer: see the module docs.
#[must_use = "a controller does nothing until it is added to a Manager or run"]
pub struct Controller<K> {
    name: String,
    informer: SharedIndexInformer<K>,
    /// Informers whose events enqueue keys (`owns`, `watches`): started if
    /// nobody did and synced before any worker starts.
    dependencies: Vec<Box<dyn Dependency>>,
    queue: RateLimitingQueue<ObjectKey>,
    reconciler: Arc<dyn Reconciler>,
    options: ControllerOptions<K>,
    fatal: Arc<Mutex<Option<ControllerError>>>,
    /// The slot of each primary key, when sharded.
    key_slots: Option<Arc<KeySlots>>,
    /// Why each queued key is queued.
    reasons: Arc<Reasons>,
    /// What its reconciler writes, as its builder declared it (RBAC).
    pub(crate) writes: Permissions,
    /// Whether its primary kind is cluster-scoped, when its builder knew.
    pub(crate) cluster_scoped: bool,
    /// The informers it reads and how, for read-your-writes.
    reads: Vec<Read>,
    /// How events queue keys.
    enqueue: Enqueue,
    /// Removes its event handlers from the informers it reads once its
    /// run has ended, or once it is dropped unrun: a controller that is
    /// gone is never called again.
    detach: Detach,
    /// Whether it marks its metrics' process as stopping when it stops:
    /// on its own, yes; a Manager's controller, no (the Manager does, when
    /// it stops: one controller removed is not the process stopping).
    reports_stopping: bool,
    /// The factory's informer shares its builder took, kept while it
    /// lives (a [`Manager`](crate::Manager) takes them over: see
    /// [`take_shares`](Self::take_shares)).
    shares: Vec<Share>,
}

/// A share of a factory's informer
/// ([`InformerShare`](kinformer_informer::InformerShare)), of any kind:
/// the informer runs while one lives.
pub(crate) type Share = Box<dyn std::any::Any + Send + Sync>;

/// Removes a controller's event handlers when dropped: at the end of its
/// run however it ends (a panic, its future dropped), or with the
/// controller if it never ran (refused by a Manager, never added).
#[derive(Default)]
struct Detach(Vec<Box<dyn FnOnce() + Send + Sync>>);

impl Drop for Detach {
    fn drop(&mut self) {
        for detach in self.0.drain(..) {
            detach();
        }
    }
}

/// Removes the handler of `registration` from `informer` when called.
fn detacher<C: Object + Clone>(
    informer: &SharedIndexInformer<C>,
    registration: kinformer_informer::ResourceEventHandlerRegistration,
) -> Box<dyn FnOnce() + Send + Sync> {
    let informer = informer.clone();
    Box::new(move || {
        if let Err(e) = informer.remove_event_handler(&registration) {
            warn!(error = %e, "could not remove an event handler");
        }
    })
}

impl<K> std::fmt::Debug for Controller<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.name)
            .field("queued", &self.queue.len())
            .field("dependencies", &self.dependencies.len())
            .field("options", &self.options)
            .finish_non_exhaustive()
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
        if options.ring.is_some() && !options.reconcile_initial_list {
            return Err(ControllerError::InvalidOptions(format!(
                "controller {name:?}: sharded over a ring and reconcile_initial_list(false): a replica \
                 reconciles every key of a slot it takes, so there is no initial list to skip"
            )));
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
        let mut config = QueueConfig::new()
            .name(name)
            .priority_aging(options.priority_aging);
        if let Some(m) = &options.metrics {
            config = config.metrics_provider(m.workqueue_provider());
        }
        let queue = RateLimitingQueue::with_config(default_controller_rate_limiter(), config);
        let reasons = Arc::new(Reasons::default());
        let enqueue = Enqueue {
            queue: queue.clone(),
            reasons: Arc::clone(&reasons),
            gates: options
                .debounce
                .filter(|d| !d.is_zero())
                .map(|d| Arc::new(Debounce(d)) as Arc<dyn Gate>)
                .into_iter()
                .collect(),
        };
        let (ea, eu, ed) = (enqueue.clone(), enqueue.clone(), enqueue.clone());
        let filter = options.event_filter.clone();
        let pass = move |e: Event<'_, K>| filter.as_ref().is_none_or(|f| f(e));
        let replay = options.reconcile_initial_list;
        let (pa, pu, pd) = (pass.clone(), pass.clone(), pass);
        let (sa, su, sd) = (key_slots.clone(), key_slots.clone(), key_slots.clone());
        // A sharded controller records each key's slot before enqueueing it.
        let handler = ResourceEventHandlerFuncs::new()
            .on_add(move |obj: &Arc<K>, initial| {
                let key = ObjectKey::of(obj.as_ref());
                let pass = pa(Event::Add(obj));
                if let (Some(s), Ok(key)) = (&sa, &key) {
                    s.record(key, obj.as_ref(), pass);
                }
                if pass && (replay || !initial) {
                    // What a (re)list replays waits behind live changes.
                    let priority = if initial {
                        Priority::Low
                    } else {
                        Priority::High
                    };
                    ea.add_result(key, Reason::Added, priority);
                }
            })
            .on_update(move |old: &Arc<K>, new: &Arc<K>| {
                let key = ObjectKey::of(new.as_ref());
                let pass = pu(Event::Update { old, new });
                if let (Some(s), Ok(key)) = (&su, &key) {
                    s.record(key, new.as_ref(), pass);
                }
                if pass {
                    let resync = old.resource_version().is_some()
                        && old.resource_version() == new.resource_version();
                    let (reason, priority) = if resync {
                        (Reason::Resynced, Priority::Low)
                    } else {
                        (Reason::Updated, Priority::High)
                    };
                    eu.add_result(key, reason, priority);
                }
            })
            .on_delete(move |obj: &ObjectOrTombstone<K>| {
                let key = deletion_handling_meta_namespace_key(obj).and_then(|k| k.parse());
                let pass = pd(Event::Delete(obj));
                if let (Some(s), Ok(key)) = (&sd, &key) {
                    s.record(key, obj.object().as_ref(), pass);
                    if !pass {
                        // Nothing will handle the key unless it is queued
                        // already; its object is no longer cached.
                        s.forget_unless_queued(key.as_str());
                    }
                }
                if pass {
                    ed.add_result(key, Reason::Deleted, Priority::High);
                }
            });
        let detach = Detach(vec![detacher(
            &informer,
            informer.add_event_handler(handler)?,
        )]);
        let reads = Read::new(Arc::new(informer.clone()), Relation::Primary)
            .into_iter()
            .collect();
        Ok(Self {
            name: name.to_owned(),
            reads,
            informer,
            dependencies: Vec::new(),
            writes: Permissions::new(),
            cluster_scoped: false,
            queue,
            reconciler: Arc::new(reconciler),
            options,
            fatal: Arc::new(Mutex::new(None)),
            key_slots,
            reasons,
            enqueue,
            detach,
            reports_stopping: true,
            shares: Vec::new(),
        })
    }

    /// Keeps `share` (a factory's informer share) while the controller
    /// lives, or until a Manager takes it over.
    pub(crate) fn hold(&mut self, share: Share) {
        self.shares.push(share);
    }

    /// The informer shares it holds, for the Manager to keep until the
    /// controller is removed or the Manager has stopped: a controller's own
    /// end must not free the caches that webhooks may still read while
    /// the Manager stops.
    pub(crate) fn take_shares(&mut self) -> Vec<Share> {
        std::mem::take(&mut self.shares)
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
    /// owners found through a secondary index (`ObjectKey::namespaced(ns,
    /// name)`, `ObjectKey::cluster(name)`, or an index's string key
    /// parsed). The informer is started if nobody did, and synced before
    /// any worker starts.
    pub fn watches<C: Object + Clone>(
        self,
        informer: SharedIndexInformer<C>,
        mapper: impl Fn(&C) -> Vec<ObjectKey> + Send + Sync + 'static,
    ) -> Result<Self, ControllerError> {
        self.watches_kind(
            informer,
            mapper,
            reason::type_name::<C>(),
            Relation::Watched,
        )
    }

    /// [`watches`](Self::watches), naming `C` `kind` in the reasons of the
    /// keys it queues, reading its informer as `relation` says.
    fn watches_kind<C: Object + Clone>(
        mut self,
        informer: SharedIndexInformer<C>,
        mapper: impl Fn(&C) -> Vec<ObjectKey> + Send + Sync + 'static,
        kind: Arc<str>,
        relation: Relation,
    ) -> Result<Self, ControllerError> {
        let mapper = Arc::new(mapper);
        let (ma, mu, md) = (Arc::clone(&mapper), Arc::clone(&mapper), mapper);
        let queue_for = |enqueue: Enqueue| {
            let kind = Arc::clone(&kind);
            move |related: &C, keys: Vec<ObjectKey>, priority: Priority| {
                for key in keys {
                    let reason = || match ObjectKey::of(related) {
                        Ok(related) => Reason::Related {
                            kind: Arc::clone(&kind),
                            key: related,
                        },
                        Err(_) => Reason::Unknown,
                    };
                    enqueue.add(key, reason, priority);
                }
            }
        };
        let qa = queue_for(self.enqueue.clone());
        let qu = queue_for(self.enqueue.clone());
        let qd = queue_for(self.enqueue.clone());
        let replay = self.options.reconcile_initial_list;
        let handler = ResourceEventHandlerFuncs::new()
            .on_add(move |obj: &Arc<C>, initial| {
                if initial && !replay {
                    return;
                }
                let priority = if initial {
                    Priority::Low
                } else {
                    Priority::High
                };
                qa(obj, ma(obj), priority)
            })
            .on_update(move |old: &Arc<C>, new: &Arc<C>| {
                let resync = old.resource_version().is_some()
                    && old.resource_version() == new.resource_version();
                let priority = if resync {
                    Priority::Low
                } else {
                    Priority::High
                };
                let mut keys = mu(old);
                keys.extend(mu(new));
                qu(new, keys, priority);
            })
            .on_delete(move |obj: &ObjectOrTombstone<C>| {
                let obj = obj.object();
                qd(obj, md(obj), Priority::High);
            });
        let registration = informer.add_event_handler(handler)?;
        self.detach.0.push(detacher(&informer, registration));
        self.reads
            .extend(Read::new(Arc::new(informer.clone()), relation));
        self.dependencies.push(Box::new(informer));
        Ok(self)
    }

    /// Also reconciles the owner of every object of `informer` whose
    /// controller ownerReference names a `K`: client-go's
    /// `EnqueueRequestForOwner` with `OnlyControllerOwner`. An update that
    /// moves the object to another owner reconciles both.
    ///
    /// Its [`permissions`](Self::permissions) then hold what setting those
    /// ownerReferences takes where the server enforces them
    /// (`OwnerReferencesPermissionEnforcement`): `update` of `K`'s
    /// `finalizers` and `delete` of the informer's kind, in its namespace
    /// (a cluster-scoped `K`'s finalizers cluster-wide).
    pub fn owns<C: Object + Clone + Resource>(
        mut self,
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
        let cluster_scoped = kinformer_informer::is_cluster_scoped::<K>();
        if let Some(child) = informer.resource() {
            let owner = GroupResource::new(group.as_str(), K::plural(&dt));
            let namespace = informer.namespace();
            rbac::owner_references(&mut self.writes, namespace, &owner, cluster_scoped, &child);
        }
        let child_kind = reason::type_name::<C>();
        let relation = Relation::Owned {
            group: group.clone(),
            kind: kind.clone(),
        };
        self.watches_kind(
            informer,
            move |child: &C| {
                // An empty namespace is none, as `meta_namespace_key` reads it.
                let namespace = child
                    .meta()
                    .namespace
                    .as_deref()
                    .filter(|ns| !cluster_scoped && !ns.is_empty());
                child
                    .meta()
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|r| r.controller == Some(true) && r.kind == kind)
                    .filter(|r| api_group(&r.api_version) == group)
                    .filter_map(|r| match ObjectKey::new(namespace, &r.name) {
                        Ok(key) => Some(key),
                        Err(e) => {
                            warn!(error = %e, child = %meta_namespace_key(child).unwrap_or_default(), "ignoring an ownerReference whose name cannot be an object's");
                            None
                        }
                    })
                    .collect()
            },
            child_kind,
            relation,
        )
    }

    /// Why each queued key is queued.
    #[cfg(test)]
    pub(crate) fn reasons(&self) -> &Reasons {
        &self.reasons
    }

    /// The workqueue (for inspection and tests).
    pub fn queue(&self) -> &RateLimitingQueue<ObjectKey> {
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

    /// The RBAC rules it needs (see [`Permissions`]): list and watch of
    /// each informer it reads, in that informer's namespace (or
    /// cluster-wide), what its builder declared it writes
    /// ([`ControllerBuilder::writes`](crate::ControllerBuilder::writes)),
    /// what setting ownerReferences on the children it
    /// [`owns`](Self::owns) takes, and its sharding ring's Leases. An
    /// informer over a lister-watcher of your own names no resource: add
    /// its rules yourself.
    pub fn permissions(&self) -> Permissions {
        let mut permissions = self.writes.clone();
        for dependency in self.informers() {
            if let (Some(read), namespace) = dependency.reads() {
                permissions.allow_reads(namespace.as_deref(), &read);
            }
        }
        if let Some(ring) = &self.options.ring {
            rbac::ring(&mut permissions, &ring.config().namespace);
        }
        permissions
    }

    /// A readiness check over its informers: failing while the server
    /// refuses its list or watch (401, 403; the message names the verb,
    /// resource and namespace), even after it synced (a controller over a
    /// cache the server no longer updates is not ready), and while one has
    /// not synced, unless `needs_us` says its listing needs this process
    /// to be ready first (a custom resource whose conversion it serves) or
    /// the server does not serve its resource (a CRD not installed: see
    /// the [`Manager`](crate::Manager)'s docs for why that leaves the
    /// process ready).
    pub(crate) fn informers_check(
        &self,
        needs_us: Arc<dyn Fn(&GroupResource) -> bool + Send + Sync>,
    ) -> crate::Check {
        let informers: Vec<(Box<dyn Dependency>, bool)> = self
            .informers()
            .map(|i| (i.boxed(), i.reads().0.is_some_and(|r| needs_us(&r))))
            .collect();
        Arc::new(move || {
            let problems: Vec<String> = informers
                .iter()
                .filter_map(|(i, needs_us)| match i.denied() {
                    Some(denied) => Some(format!("{}: {denied}", i.what())),
                    None => (!needs_us && !i.has_synced() && i.not_served().is_none())
                        .then(|| format!("{}: not synced yet", i.what())),
                })
                .collect();
            match problems.is_empty() {
                true => Ok(()),
                false => Err(crate::CheckFailed::new(problems)),
            }
        })
    }

    /// Its primary informer, then those it depends on.
    fn informers(&self) -> impl Iterator<Item = &dyn Dependency> {
        std::iter::once(&self.informer as &dyn Dependency)
            .chain(self.dependencies.iter().map(|d| d.as_ref()))
    }

    /// Where its primary objects are, for the rules of Events about them:
    /// the primary informer's namespace (`None`: all), and whether its kind
    /// is cluster-scoped.
    pub(crate) fn primary_scope(&self) -> (Option<String>, bool) {
        (
            self.informer.namespace().map(str::to_owned),
            self.cluster_scoped,
        )
    }

    pub(crate) fn options(&self) -> &ControllerOptions<K> {
        &self.options
    }

    /// Runs as [`run`](Self::run) does, or as one of a [`Manager`](crate::Manager)'s
    /// controllers when `managed` is given.
    pub(crate) async fn run_managed(
        mut self,
        shutdown: CancellationToken,
        managed: Option<Managed>,
    ) -> Result<(), ControllerError> {
        // Whatever the end: its handlers gone, then its shares (those a
        // Manager has not taken) let go.
        let detach = std::mem::take(&mut self.detach);
        let shares = std::mem::take(&mut self.shares);
        self.reports_stopping = managed.is_none();
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
        drop(detach);
        drop(shares);
        result
    }

    /// A controller's life, in phases: its caches synced, leadership won
    /// (if elected), workers running until stop, a drain, the workers
    /// stopped, leadership released.
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
        if !self
            .sync(&stop, &informer_stop, &tasks, managed.as_ref())
            .await
        {
            self.stopping();
            return self.fatal.lock().take().map_or(Ok(()), Err);
        }
        let external_election = managed.as_ref().is_some_and(|m| m.external_election);
        let mut leadership = match self.lead(&stop, external_election).await {
            Ok(leadership) => leadership,
            Err(ended) => return ended,
        };
        let life = Life {
            fatal: Arc::clone(&self.fatal),
            stop: stop.clone(),
            halt: CancellationToken::new(),
            abort: CancellationToken::new(),
        };
        let (halt, abort) = (life.halt.clone(), life.abort.clone());
        let (worker, _priming) = self.worker(managed.as_ref(), life);
        let mut workers: JoinSet<()> = JoinSet::new();
        for _ in 0..self.options.workers {
            workers.spawn(Arc::clone(&worker).run());
        }
        info!(workers = self.options.workers, "started workers");
        let lost = self.until_stopped(&stop, &mut leadership).await;
        // Whatever the path, no key is handed out from here on.
        halt.cancel();
        self.queue.shut_down();
        self.stop_workers(workers, leadership, lost, abort).await
    }

    /// Starts the informers nobody runs and waits for every cache: whether
    /// they synced before `stop`.
    async fn sync(
        &self,
        stop: &CancellationToken,
        informer_stop: &CancellationToken,
        tasks: &InformerTasks,
        managed: Option<&Managed>,
    ) -> bool {
        let informers: Vec<&dyn Dependency> = self.informers().collect();
        for informer in &informers {
            informer.start_unless_running(informer_stop, &self.fatal, stop, tasks);
        }
        info!(
            informers = informers.len(),
            "waiting for the caches to sync"
        );
        // Ready once each cache has synced or waits for a resource the
        // server does not serve (a CRD not installed); the workers start
        // once every one has synced.
        let settled: Vec<Settled<'_>> = informers.iter().map(|i| Settled(*i)).collect();
        let settled: Vec<&dyn HasSynced> = settled.iter().map(|s| s as &dyn HasSynced).collect();
        if !wait_for_cache_sync(stop, &settled).await {
            return false;
        }
        match managed {
            Some(m) => (m.ready)(),
            None => {
                if let Some(m) = &self.options.metrics {
                    m.set_ready(true);
                }
            }
        }
        let synced: Vec<&dyn HasSynced> = informers.iter().map(|i| *i as &dyn HasSynced).collect();
        if !synced.iter().all(|i| i.has_synced()) {
            let waiting: Vec<String> = informers
                .iter()
                .filter(|i| !i.has_synced())
                .map(|i| i.what())
                .collect();
            info!(
                ?waiting,
                "waiting for resources the server does not serve before starting the workers"
            );
        }
        if !wait_for_cache_sync(stop, &synced).await {
            return false;
        }
        info!(cached = self.informer.indexer().len(), "cache synced");
        if let Some(m) = managed {
            (m.synced)();
        }
        true
    }

    /// Waits to lead, when elected (running the election unless the
    /// Manager does): the leadership, `None` when not elected, or, the
    /// controller stopping, how it ends if it stopped or the election
    /// ended first.
    async fn lead(
        &self,
        stop: &CancellationToken,
        external_election: bool,
    ) -> Result<Option<Leadership>, Result<(), ControllerError>> {
        let Some(elector) = &self.options.leader_election else {
            return Ok(None);
        };
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
                return Err(Ok(()));
            }
            led = async { leading.wait_for(|leading| *leading).await.is_ok() } => if !led {
                self.stopping();
                return Err(Err(ControllerError::LostLeadership));
            },
        }
        info!("leading; starting workers");
        Ok(Some(Leadership {
            elector: Arc::clone(elector),
            leading,
            stop: election_stop,
            task,
        }))
    }

    /// The worker every worker task runs, with the controller's gates (see
    /// `gate`), and the task priming a sharded controller's slots.
    fn worker(&self, managed: Option<&Managed>, life: Life) -> (Arc<Worker>, Option<AbortOnDrop>) {
        let sharding =
            self.options
                .ring
                .clone()
                .zip(self.key_slots.clone())
                .map(|(ring, key_slots)| {
                    Arc::new(Sharding {
                        held: ring.subscribe(),
                        ring,
                        key_slots,
                        cache: Box::new({
                            let cache = self.informer.indexer();
                            move |key: &str| cache.get_by_key(key).is_some()
                        }),
                        ready: Arc::default(),
                        entered: Mutex::default(),
                    })
                });
        // A sharded controller's workers enter only the slots whose objects
        // are cached.
        let priming = sharding.as_ref().map(|sharding| {
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
        let read_your_writes = managed
            .as_ref()
            .and_then(|m| m.tracker.clone())
            .map(|tracker| ReadYourWrites {
                consistency: Arc::new(Consistency::new(
                    tracker,
                    &self.name,
                    self.reads.clone(),
                    self.options.read_your_writes,
                    self.options.read_your_writes_bound,
                    self.options.metrics.clone(),
                )),
                queue: self.queue.clone(),
                reasons: Arc::clone(&self.reasons),
                halt: life.halt.clone(),
            });
        // The order a worker asks them in: see `gate`.
        let leader = self.options.leader_election.clone().map(Leader);
        let gates: Vec<Arc<dyn Gate>> = [
            leader.map(|g| Arc::new(g) as Arc<dyn Gate>),
            sharding.map(|g| g as Arc<dyn Gate>),
            read_your_writes.map(|g| Arc::new(g) as Arc<dyn Gate>),
        ]
        .into_iter()
        .flatten()
        .collect();
        let shared = Arc::new(Worker {
            name: self.name.clone(),
            queue: self.queue.clone(),
            reconciler: Arc::clone(&self.reconciler),
            policy: Policy {
                max_retries: self.options.max_retries,
                panic_policy: self.options.panic_policy,
                reconcile_timeout: self.options.reconcile_timeout,
            },
            metrics: self.options.metrics.clone(),
            reasons: Arc::clone(&self.reasons),
            gates,
            life,
        });
        (shared, priming)
    }

    /// Runs until `stop` or a lost lease, then drains the queue unless the
    /// controller crashed: whether the lease was lost.
    async fn until_stopped(
        &self,
        stop: &CancellationToken,
        leadership: &mut Option<Leadership>,
    ) -> bool {
        let lost = tokio::select! {
            _ = stop.cancelled() => false,
            _ = lost_leadership(leadership) => true,
        };
        if let Some(m) = self
            .options
            .metrics
            .as_ref()
            .filter(|_| self.reports_stopping)
        {
            m.set_stopping();
        }
        // A Crash panic or a failed informer: nothing more is worked, as
        // after a crash; in-flight reconciles are aborted.
        let fatal = self.fatal.lock().is_some();
        lost || (!fatal && {
            info!(timeout = ?self.options.drain_timeout, "shutting down: draining queued and in-flight reconciles");
            tokio::select! {
                drained = tokio::time::timeout(self.options.drain_timeout, self.queue.shut_down_with_drain()) => {
                    if drained.is_err() {
                        warn!(timeout = ?self.options.drain_timeout, "drain timed out; aborting the reconciles still running");
                    }
                    false
                }
                _ = lost_leadership(leadership) => true,
            }
        })
        // A loss at the very end of the drain still counts.
        || leadership.as_ref().is_some_and(|l| !l.elector.may_work())
    }

    /// Ends the workers (after a lost lease, within its grace and while
    /// the lease is safely held), aborts what still runs, then releases
    /// the leadership: how the controller ends.
    async fn stop_workers(
        &self,
        mut workers: JoinSet<()>,
        leadership: Option<Leadership>,
        lost: bool,
        abort: CancellationToken,
    ) -> Result<(), ControllerError> {
        let mut result = Ok(());
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
        if let Some(m) = self
            .options
            .metrics
            .as_ref()
            .filter(|_| self.reports_stopping)
        {
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
    /// Called once each of the controller's caches has synced or waits
    /// for a resource the server does not serve: it is as ready as it can be.
    pub(crate) ready: Box<dyn Fn() + Send + Sync>,
    /// Called once the controller's caches have synced.
    pub(crate) synced: Box<dyn Fn() + Send + Sync>,
    /// Where the controller puts the informer tasks it starts, for the
    /// Manager to wait for once it has stopped them.
    pub(crate) informer_tasks: InformerTasks,
    /// The Manager's writes, for read-your-writes.
    pub(crate) tracker: Option<Arc<WriteTracker>>,
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
    /// What it lists and watches, and in which namespace (`None`: all).
    fn reads(&self) -> (Option<GroupResource>, Option<String>);
    /// What it is, for messages.
    fn what(&self) -> String;
    /// The server's refusal of its list or watch, while it lasts.
    fn denied(&self) -> Option<String>;
    /// The server's 404 while it does not serve the resource.
    fn not_served(&self) -> Option<String>;
    fn boxed(&self) -> Box<dyn Dependency>;
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
    fn reads(&self) -> (Option<GroupResource>, Option<String>) {
        (self.resource(), self.namespace().map(str::to_owned))
    }
    fn what(&self) -> String {
        self.describe().to_owned()
    }
    fn denied(&self) -> Option<String> {
        self.reflector_stats()?.denied_now()
    }
    fn not_served(&self) -> Option<String> {
        SharedIndexInformer::not_served(self)
    }
    fn boxed(&self) -> Box<dyn Dependency> {
        Box::new(self.clone())
    }

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

/// An informer that has synced, or waits for a resource the server does
/// not serve: as ready as it can be.
struct Settled<'a>(&'a dyn Dependency);

impl HasSynced for Settled<'_> {
    fn has_synced(&self) -> bool {
        self.0.has_synced() || self.0.not_served().is_some()
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
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

async fn join_all(workers: &mut JoinSet<()>) {
    while workers.join_next().await.is_some() {}
}

/// How an informer event queues a key: at once, or after the longest
/// delay its gates ask for (debounce).
#[derive(Clone)]
struct Enqueue {
    queue: RateLimitingQueue<ObjectKey>,
    reasons: Arc<Reasons>,
    /// The gates that act when an event queues a key.
    gates: Arc<[Arc<dyn Gate>]>,
}

impl Enqueue {
    fn add(&self, key: ObjectKey, reason: impl FnOnce() -> Reason, priority: Priority) {
        self.reasons.now(&key, reason);
        match self.gates.iter().filter_map(|g| g.delay()).max() {
            // A key already waiting keeps its earlier time: the events of
            // a burst join the first one's reconcile.
            Some(delay) => self.queue.add_after_with_priority(key, delay, priority),
            None => self.queue.add_with_priority(key, priority),
        }
    }

    fn add_result(
        &self,
        key: Result<ObjectKey, kinformer_store::KeyError>,
        reason: Reason,
        priority: Priority,
    ) {
        match key {
            Ok(key) => self.add(key, || reason, priority),
            Err(e) => {
                warn!(error = %e, "ignoring an object whose key is not a namespace and a name")
            }
        }
    }
}
