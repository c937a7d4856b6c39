//! How a [`Controller`](crate::Controller) runs: [`ControllerOptions`],
//! [`PanicPolicy`], and the [`Event`]s its filters see.

#[cfg(doc)]
use crate::{Controller, ControllerError};
use std::sync::Arc;
use std::time::Duration;

use kinformer_store::ObjectOrTombstone;
use kinformer_workqueue::DEFAULT_PRIORITY_AGING;

use crate::read_your_writes::DEFAULT_READ_YOUR_WRITES_BOUND;
use crate::{LeaderElector, Metrics, Ring};

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

impl<K> std::fmt::Debug for Event<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Self::Add(_) => "Add",
            Self::Update { .. } => "Update",
            Self::Delete(_) => "Delete",
        };
        f.debug_tuple(kind).finish_non_exhaustive()
    }
}

impl<K> std::fmt::Debug for ControllerOptions<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerOptions")
            .field("workers", &self.workers)
            .field("max_retries", &self.max_retries)
            .field("panic_policy", &self.panic_policy)
            .field("drain_timeout", &self.drain_timeout)
            .field("lost_leadership_grace", &self.lost_leadership_grace)
            .field("reconcile_timeout", &self.reconcile_timeout)
            .field("leader_election", &self.leader_election.is_some())
            .field("ring", &self.ring)
            .field("metrics", &self.metrics.is_some())
            .field("event_filter", &self.event_filter.is_some())
            .field("priority_aging", &self.priority_aging)
            .field("reconcile_initial_list", &self.reconcile_initial_list)
            .field("read_your_writes", &self.read_your_writes)
            .field("read_your_writes_bound", &self.read_your_writes_bound)
            .field("debounce", &self.debounce)
            .finish()
    }
}

pub(crate) type EventFilter<K> = Arc<dyn Fn(Event<'_, K>) -> bool + Send + Sync>;

/// How a [`Controller`] runs. Defaults: 2 workers, a failing key retried
/// until it succeeds (backoff 5 ms doubling up to 1 000 s), recover from
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
    /// Retries of a failing key before it is dropped; `None` (the default):
    /// until it succeeds or returns a terminal error.
    pub max_retries: Option<u32>,
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
    /// How long a key queued at low priority (an initial list, a resync,
    /// a periodic requeue) may be passed over by live changes; see
    /// [`ControllerOptions::priority_aging`].
    pub priority_aging: Duration,
    /// Whether the objects of the informers' first list are reconciled; see
    /// [`ControllerOptions::reconcile_initial_list`].
    pub reconcile_initial_list: bool,
    /// Whether a reconcile waits until the informers it reads have seen
    /// the Manager's own writes to what it reads (default `true`); see
    /// [`ControllerOptions::read_your_writes`].
    pub read_your_writes: bool,
    /// How long a reconcile may be put off for that; see
    /// [`ControllerOptions::read_your_writes_bound`].
    pub read_your_writes_bound: Duration,
    /// How long an event's key waits before it is queued, so that a burst
    /// of events is reconciled once; see [`ControllerOptions::debounce`].
    pub debounce: Option<Duration>,
}

impl<K> Default for ControllerOptions<K> {
    fn default() -> Self {
        Self {
            workers: 2,
            max_retries: None,
            panic_policy: PanicPolicy::Recover,
            drain_timeout: Duration::from_secs(30),
            lost_leadership_grace: Duration::from_secs(1),
            reconcile_timeout: None,
            leader_election: None,
            ring: None,
            metrics: None,
            event_filter: None,
            priority_aging: DEFAULT_PRIORITY_AGING,
            reconcile_initial_list: true,
            read_your_writes: true,
            read_your_writes_bound: DEFAULT_READ_YOUR_WRITES_BOUND,
            debounce: None,
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
    /// Drop a failing key after `n` retries (the seed controllers' `--max-retries 5`).
    ///
    /// A dropped key is logged at error level with its last error and
    /// counted in `kinformer_controller_dropped_keys_total`; it is
    /// reconciled again only when its object (or an owned or watched one)
    /// next changes, or at a resync. Without a limit (the default, as
    /// controller-runtime) a failing key is retried with backoff (5 ms
    /// doubling, capped at 1 000 s, at most 10 retries a second across the
    /// controller after a burst of 100) until it succeeds or returns a
    /// terminal error ([`TerminalError`](crate::TerminalError)).
    #[must_use]
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = Some(n);
        self
    }
    /// Retry a failing key until it succeeds or fails terminally (the
    /// default): undoes [`max_retries`](Self::max_retries).
    #[must_use]
    pub fn retry_forever(mut self) -> Self {
        self.max_retries = None;
        self
    }
    /// What a panic in reconcile does.
    #[must_use]
    pub fn panic_policy(mut self, p: PanicPolicy) -> Self {
        self.panic_policy = p;
        self
    }
    /// How long a key queued at low priority may wait while live changes
    /// are reconciled before it: default 5 s.
    ///
    /// The queue reconciles keys of objects that changed live (adds,
    /// updates, deletes seen by the watch) before keys that only need a
    /// look again: the objects of the initial list, resyncs,
    /// `Action::RequeueAfter`, and the keys of a slot this replica takes
    /// over. So a restart does not bury a new object behind every unchanged
    /// one. Once a low-priority key has waited `aging`, at least every
    /// second key handed to the workers is such an aged key, oldest first,
    /// however many live changes keep coming: a key with `n` low-priority
    /// keys ahead of it is handed to a worker within `aging + 2(n + 1)/R`
    /// of being queued, `R` being the rate the workers take keys at. A failed reconcile is
    /// retried at the priority its key was taken at. Zero shares the
    /// workers between the two from the start.
    #[must_use]
    pub fn priority_aging(mut self, aging: Duration) -> Self {
        self.priority_aging = aging;
        self
    }
    /// Whether every object of the informers' first list is reconciled
    /// (default: yes, at low priority, behind live changes). With `false`
    /// only what changes after a cache's first list is: no burst of every
    /// cached key when the process starts or a standby takes over. Only for
    /// a controller whose objects its previous leader is known to have
    /// reconciled, for what is not reconciled until it changes again (or a
    /// resync, if the informers have one):
    /// - what a dead leader had queued, was retrying or had scheduled with
    ///   `Action::RequeueAfter` (periodic reconciles stop with it);
    /// - what changed while no replica ran (a restart of a single replica,
    ///   a `Recreate` rollout): those changes arrive in the first list;
    /// - on an informer already running, what it replays to a controller
    ///   that registers late, which it marks as its initial list.
    ///
    /// A sharded controller ([`ring`](Self::ring)) reconciles every key of
    /// a slot it takes, so [`Controller::new`] refuses `false` with a ring.
    #[must_use]
    pub fn reconcile_initial_list(mut self, reconcile: bool) -> Self {
        self.reconcile_initial_list = reconcile;
        self
    }

    /// Whether a reconcile of a [`Manager`](crate::Manager)'s controller
    /// waits until the informers it reads have seen the Manager's own
    /// writes to what it reads: its object, the objects it owns, what it
    /// wrote while reconciling the same key, and the kinds it watches
    /// (writes made through [`Manager::client`](crate::Manager::client),
    /// by any of the Manager's controllers). Default `true`: a requeue, a
    /// retry or an event already queued never decides on a cache that
    /// misses the controller's last write (a second child created with a
    /// generated name, a 409 Conflict from an old resourceVersion).
    ///
    /// A key that would wait is parked, the worker goes on with others,
    /// and the key comes back once the informers have seen the writes, or
    /// at [`read_your_writes_bound`](Self::read_your_writes_bound). `false`:
    /// reconciles at once from the cache as it is, as controller-runtime
    /// and kube-runtime do by default; the controller's writes are still
    /// awaited by the Manager's other controllers. To leave one write
    /// unawaited, make it inside [`untracked`](crate::untracked).
    #[must_use]
    pub fn read_your_writes(mut self, wait: bool) -> Self {
        self.read_your_writes = wait;
        self
    }

    /// How long a reconcile may be put off until the informers see the
    /// Manager's own writes (default 5 s,
    /// [`DEFAULT_READ_YOUR_WRITES_BOUND`](crate::DEFAULT_READ_YOUR_WRITES_BOUND)).
    /// Past it the writes are given up as lost (their events may never
    /// come: an object deleted by someone else meanwhile), counted in
    /// `kinformer_controller_stale_sync_skips_total` and logged, and the
    /// key is reconciled from the cache as it is.
    #[must_use]
    pub fn read_your_writes_bound(mut self, bound: Duration) -> Self {
        self.read_your_writes_bound = bound;
        self
    }

    /// Queues the key of each informer event (its own object's, an owned
    /// or watched object's) only `debounce` after the event, so that the
    /// events of a burst (a rollout updating a Deployment's status ten
    /// times in a second, a script patching an object field by field) are
    /// reconciled once, from the state after them: kube-runtime's
    /// `Config::debounce`. Off by default (zero is off too).
    ///
    /// What it trades: every change waits `debounce` before its reconcile,
    /// even a lone one. The wait runs from the first event of a burst, not
    /// the last (a key already waiting keeps its time), so a stream of
    /// events that never pauses is still reconciled every `debounce`, never
    /// starved. A resync is an event too; requeues and retries keep their
    /// own times.
    #[must_use]
    pub fn debounce(mut self, debounce: Duration) -> Self {
        self.debounce = Some(debounce);
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
