//! The slots a replica of a sharded controller holds: one Lease per slot,
//! taken and kept by a [`LeaderElector`] each, driven by the ring's
//! assignment, and released only once the replica's work on the slot has
//! ended.
//!
//! Work on a slot goes through [`Ring::enter`], which hands out a
//! [`SlotGuard`] only while the replica holds the slot's Lease safely and is
//! not handing the slot over. Entering counts the guard *before* checking,
//! and a handover marks the slot *before* waiting for the count to reach
//! zero (both sequentially consistent), so either the worker sees the
//! handover and backs off, or the handover waits for the worker: no work on
//! a slot can begin after its Lease is released.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kube_client::Client;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use kinformer_informer::ShardScope;

use crate::reconcile::chain;
use crate::ring::{assign_slots, held_selector};
use crate::{ControllerError, LeaderElectionConfig, LeaderElector, Metrics, RingMembership};

/// A ring's shape and timing. Defaults: 16 slots; client-go's leader
/// election timings (15 s lease, 10 s renew deadline, 2 s retry period) for
/// the slot Leases and the member Leases alike.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RingConfig {
    /// Namespace of the ring's Leases.
    pub namespace: String,
    /// The ring's name: a prefix of its Leases' names.
    pub ring: String,
    /// This replica's identity, unique per process.
    pub identity: String,
    /// How many slots cut the hash space; fixed for the ring's life.
    pub slots: u32,
    /// How long a slot or member Lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// How long a slot holder keeps trying to renew before giving the slot up.
    pub renew_deadline: Duration,
    /// How often Leases are renewed and the assignment is looked at again.
    pub retry_period: Duration,
}

impl RingConfig {
    /// A ring with the defaults.
    pub fn new(namespace: &str, ring: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            ring: ring.to_owned(),
            identity: identity.to_owned(),
            slots: 16,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The leader election of slot `slot`'s Lease.
    fn slot_election(&self, slot: u32) -> LeaderElectionConfig {
        LeaderElectionConfig {
            namespace: self.namespace.clone(),
            lease_name: format!("{}-slot-{slot}", self.ring),
            identity: self.identity.clone(),
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
    }

    /// Checks the timings as the leader election does, and that there are slots.
    pub fn validate(&self) -> Result<(), ControllerError> {
        if self.slots == 0 {
            return Err(ControllerError::InvalidOptions(format!(
                "ring {:?} has no slots",
                self.ring
            )));
        }
        self.slot_election(0).validate()
    }
}

/// One slot this replica holds or is trying to hold.
struct Holder {
    elector: Arc<LeaderElector>,
    stop: CancellationToken,
    /// The election; taken by the handover that waits for it to release.
    task: Option<JoinHandle<()>>,
}

/// Per slot: work in progress and whether the slot is being handed over.
#[derive(Default)]
struct SlotState {
    in_flight: AtomicUsize,
    handing_over: AtomicBool,
    idle: Notify,
}

/// What a replica's ring reports ([`Ring::register_metrics`]).
#[derive(Clone)]
struct RingMetrics {
    slots_held: Gauge,
    rebalances: Counter,
    acquisitions: Counter,
    handovers: Counter,
    acquire_wait: Histogram,
    keys_handed_over: Counter,
}

impl Default for RingMetrics {
    fn default() -> Self {
        Self {
            slots_held: Gauge::default(),
            rebalances: Counter::default(),
            acquisitions: Counter::default(),
            handovers: Counter::default(),
            // 50 ms to about 14 min.
            acquire_wait: Histogram::new(exponential_buckets(0.05, 2.0, 15)),
            keys_handed_over: Counter::default(),
        }
    }
}

/// A replica's part in a sharded controller's ring: its membership, the
/// slots assigned to it, and their Leases.
pub struct Ring {
    client: Client,
    config: RingConfig,
    membership: RingMembership,
    holders: Mutex<BTreeMap<u32, Holder>>,
    states: Vec<SlotState>,
    held: watch::Sender<BTreeSet<u32>>,
    /// The slots assigned to this replica at the last look.
    assigned: Mutex<Option<BTreeSet<u32>>>,
    metrics: RingMetrics,
    /// The shard of the held slots, for the informers of a sharded controller.
    scope: ShardScope,
    /// How many keys a slot has: a sharded controller's count, for the
    /// keys-handed-over metric.
    key_count: Mutex<Option<KeyCount>>,
    /// Whether `run` is running: one run per ring.
    running: AtomicBool,
    /// Work on the slots may never end (stuck reconciles): on stop, leave
    /// the slot Leases to expire instead of waiting to hand them over.
    abandoned: AtomicBool,
    /// Whether a look has ended: the slot Leases exist from then on (a
    /// ring releases them, never deletes them), so one found missing was
    /// deleted, maybe under a holder still at work.
    looked: AtomicBool,
}

type KeyCount = Box<dyn Fn(u32) -> u64 + Send + Sync>;

/// Clears `flag` when dropped.
fn scopeguard(flag: &AtomicBool) -> impl Drop + '_ {
    struct Clear<'a>(&'a AtomicBool);
    impl Drop for Clear<'_> {
        fn drop(&mut self) {
            self.0.store(false, Ordering::SeqCst);
        }
    }
    Clear(flag)
}

impl Drop for Ring {
    fn drop(&mut self) {
        // No guard is left (each holds the ring): stop every election, so
        // that nothing goes on renewing a slot of a ring that is gone.
        for holder in self.holders.get_mut().values() {
            holder.stop.cancel();
        }
    }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("config", &self.config)
            .field("held", &*self.held.borrow())
            .finish_non_exhaustive()
    }
}

/// Work on one slot, counted until dropped: the slot is not handed over
/// while a guard lives.
pub struct SlotGuard {
    state: Arc<Ring>,
    slot: u32,
}

impl std::fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotGuard")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl SlotGuard {
    /// The slot.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Whether the slot is still safely this replica's: check it before
    /// every write; stop when it is not.
    pub fn may_work(&self) -> bool {
        self.state.may_work(self.slot)
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let state = &self.state.states[self.slot as usize];
        if state.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            state.idle.notify_waiters();
        }
    }
}

impl Ring {
    /// A replica of ring `config.ring`; nothing happens until [`run`](Self::run).
    pub fn new(client: Client, config: RingConfig) -> Result<Arc<Self>, ControllerError> {
        config.validate()?;
        let membership = RingMembership::new(
            client.clone(),
            &config.namespace,
            &config.ring,
            &config.identity,
            config.lease_duration,
        );
        Ok(Arc::new(Self {
            scope: ShardScope::new(held_selector([], config.slots)),
            key_count: Mutex::new(None),
            running: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            looked: AtomicBool::new(false),
            states: (0..config.slots).map(|_| SlotState::default()).collect(),
            client,
            membership,
            config,
            holders: Mutex::new(BTreeMap::new()),
            held: watch::channel(BTreeSet::new()).0,
            assigned: Mutex::new(None),
            metrics: RingMetrics::default(),
        }))
    }

    /// Serves this replica's ring metrics with `metrics`:
    /// `kinformer_ring_slots_held`, `kinformer_ring_rebalances_total` (looks
    /// at which the slots assigned to this replica changed),
    /// `kinformer_ring_slot_acquisitions_total`,
    /// `kinformer_ring_slot_handovers_total` (slots released after their
    /// work ended) and `kinformer_ring_slot_acquire_wait_seconds` (from the
    /// start of a campaign for a slot to holding it: how long a slot
    /// assigned here stayed unowned, waiting for its last holder to release
    /// it or for its Lease to expire), and, for a sharded controller,
    /// `kinformer_ring_keys_handed_over_total` (the keys of the slots it
    /// handed over). One ring per registry.
    pub fn register_metrics(&self, metrics: &Metrics) {
        let m = &self.metrics;
        metrics.register(
            "kinformer_ring_slots_held",
            "Slots of the ring this replica holds",
            m.slots_held.clone(),
        );
        metrics.register(
            "kinformer_ring_rebalances",
            "Times the slots assigned to this replica changed",
            m.rebalances.clone(),
        );
        metrics.register(
            "kinformer_ring_slot_acquisitions",
            "Slot Leases this replica took",
            m.acquisitions.clone(),
        );
        metrics.register(
            "kinformer_ring_slot_handovers",
            "Slots this replica released once their work had ended",
            m.handovers.clone(),
        );
        metrics.register(
            "kinformer_ring_slot_acquire_wait_seconds",
            "From the start of a campaign for a slot to holding it",
            m.acquire_wait.clone(),
        );
        metrics.register(
            "kinformer_ring_keys_handed_over",
            "Keys of the slots this replica handed over",
            m.keys_handed_over.clone(),
        );
    }

    /// The shard of the slots this replica holds, updated at every look at
    /// the ring (the range of hash 0 alone while it holds none; see
    /// [`held_selector`]): give it to the primary informer's lister-watcher
    /// ([`ApiListerWatcher::shard_scope`](kinformer_informer::ApiListerWatcher::shard_scope))
    /// so that the replica lists and watches only its slots' objects.
    pub fn scope(&self) -> ShardScope {
        self.scope.clone()
    }

    /// How a sharded controller counts the keys of a slot, for
    /// `kinformer_ring_keys_handed_over_total`.
    pub(crate) fn count_keys_with(&self, count: impl Fn(u32) -> u64 + Send + Sync + 'static) {
        *self.key_count.lock() = Some(Box::new(count));
    }

    /// Work on the slots may never end (reconciles stuck on their threads):
    /// when `run` stops, it leaves the slot Leases to expire rather than
    /// waiting to hand them over, as a leader leaves its Lease.
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
    }

    /// The elector of `slot`'s Lease while this replica holds or seeks it.
    pub(crate) fn slot_elector(&self, slot: u32) -> Option<Arc<LeaderElector>> {
        self.holders
            .lock()
            .get(&slot)
            .map(|h| Arc::clone(&h.elector))
    }

    /// The ring's configuration.
    pub fn config(&self) -> &RingConfig {
        &self.config
    }

    /// The slots whose Lease this replica holds safely and is not handing over.
    pub fn held(&self) -> BTreeSet<u32> {
        (0..self.config.slots)
            .filter(|&s| self.may_work(s))
            .collect()
    }

    /// Follows [`held`](Self::held), updated at every look at the ring.
    pub fn subscribe(&self) -> watch::Receiver<BTreeSet<u32>> {
        self.held.subscribe()
    }

    /// Whether work on `slot` may go on now: its Lease is safely held and
    /// it is not being handed over.
    pub fn may_work(&self, slot: u32) -> bool {
        let Some(state) = self.states.get(slot as usize) else {
            return false;
        };
        !state.handing_over.load(Ordering::SeqCst)
            && self
                .holders
                .lock()
                .get(&slot)
                .is_some_and(|h| h.elector.may_work())
    }

    /// Starts work on `slot`: a guard while the slot may be worked on,
    /// `None` when it may not (not held, or being handed over).
    pub fn enter(self: &Arc<Self>, slot: u32) -> Option<SlotGuard> {
        let state = self.states.get(slot as usize)?;
        // Counted before the check: see the module documentation.
        state.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = SlotGuard {
            state: Arc::clone(self),
            slot,
        };
        self.may_work(slot).then_some(guard)
    }

    /// Takes part in the ring until `shutdown` fires: renews this replica's
    /// member Lease, and every retry period takes the slots assigned to it
    /// and hands over those no longer assigned (each once its work has
    /// ended). On shutdown every slot is handed over that way and the
    /// replica leaves the ring.
    ///
    /// A ring runs once at a time: a second `run` while one is running
    /// logs an error and returns at once. A sharded [`Controller`](crate::Controller)
    /// runs its ring itself; one ring serves one controller.
    pub async fn run(self: &Arc<Self>, shutdown: CancellationToken) {
        if self.running.swap(true, Ordering::SeqCst) {
            tracing::error!(ring = %self.config.ring, "the ring is running already; one run per ring (a sharded controller runs its own)");
            return;
        }
        let _running = scopeguard(&self.running);
        let mut handovers: Vec<JoinHandle<()>> = Vec::new();
        while !shutdown.is_cancelled() {
            self.look(&mut handovers).await;
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
        if self.abandoned.load(Ordering::SeqCst) {
            // Work on the slots may never end: the Leases expire instead.
            for holder in self.holders.lock().values() {
                holder.elector.keep_lease_on_cancel();
                holder.stop.cancel();
            }
            warn!("left the slot Leases to expire: work on them did not end");
            let _ = self.membership.leave().await;
            self.metrics.slots_held.set(0);
            self.scope.set(held_selector([], self.config.slots));
            self.held.send_replace(BTreeSet::new());
            return;
        }
        // Every slot not being handed over already.
        let slots: Vec<u32> = self
            .holders
            .lock()
            .keys()
            .copied()
            .filter(|&s| !self.states[s as usize].handing_over.load(Ordering::SeqCst))
            .collect();
        for slot in slots {
            handovers.push(self.hand_over(slot));
        }
        for h in handovers {
            let _ = h.await;
        }
        if let Err(e) = self.membership.leave().await {
            warn!(error = %chain(&e), "could not leave the ring; the member Lease expires instead");
        }
        self.metrics.slots_held.set(0);
        self.scope.set(held_selector([], self.config.slots));
        self.held.send_replace(BTreeSet::new());
    }

    /// One look at the ring: renew membership, then act on the assignment.
    async fn look(self: &Arc<Self>, handovers: &mut Vec<JoinHandle<()>>) {
        handovers.retain(|h| !h.is_finished());
        if let Err(e) = self.membership.heartbeat().await {
            warn!(error = %chain(&e), "could not renew the member Lease");
        }
        let members = match self.membership.live_members().await {
            Ok(members) => members,
            Err(e) => {
                // Without a view of the ring, take nothing new; held slots
                // stay guarded by their own Leases.
                warn!(error = %chain(&e), "could not list the ring's members");
                return;
            }
        };
        let position = members.iter().position(|m| *m == self.config.identity);
        let is_member = position.is_some();
        let mine: BTreeSet<u32> = match position {
            Some(me) => assign_slots(self.config.slots, &members)
                .into_iter()
                .enumerate()
                .filter(|&(_, owner)| owner == me)
                .map(|(slot, _)| slot as u32)
                .collect(),
            // Not (yet) seen as a member: hold nothing.
            None => BTreeSet::new(),
        };
        if let Some(before) = self.assigned.lock().replace(mine.clone())
            && before != mine
        {
            self.metrics.rebalances.inc();
            info!(assigned = ?mine, "the ring's assignment changed");
        }
        let mut to_hand_over = Vec::new();
        {
            let mut holders = self.holders.lock();
            for (&slot, h) in holders.iter() {
                let state = &self.states[slot as usize];
                if state.handing_over.load(Ordering::SeqCst) {
                    continue;
                }
                if h.task.as_ref().is_some_and(JoinHandle::is_finished) {
                    // The election ended: the Lease was lost. Handled as a
                    // handover, so that a new campaign for the slot starts
                    // only once the work of this tenure has ended.
                    warn!(slot, "lost the slot's Lease");
                    to_hand_over.push(slot);
                } else if !mine.contains(&slot) {
                    to_hand_over.push(slot);
                }
            }
            for &slot in &mine {
                // Only a slot with no holder at all: a holder is removed by
                // its handover, after the work on the slot has ended.
                if let std::collections::btree_map::Entry::Vacant(e) = holders.entry(slot) {
                    self.states[slot as usize]
                        .handing_over
                        .store(false, Ordering::SeqCst);
                    e.insert(self.campaign(slot));
                }
            }
        }
        for slot in to_hand_over {
            handovers.push(self.hand_over(slot));
        }
        let held = self.held();
        self.metrics.slots_held.set(held.len() as i64);
        if self
            .scope
            .set(held_selector(held.iter().copied(), self.config.slots))
        {
            info!(held = ?held, "watching the held slots");
        }
        self.held.send_replace(held);
        if is_member {
            self.looked.store(true, Ordering::SeqCst);
        }
    }

    /// Starts campaigning for `slot`'s Lease.
    fn campaign(&self, slot: u32) -> Holder {
        let elector = Arc::new(LeaderElector::new(
            self.client.clone(),
            self.config.slot_election(slot),
        ));
        // A fresh elector never saw the slot's Lease. After the first look
        // a missing one was deleted (a clean-up of the ring's Leases, which
        // also makes the members look gone and so moves slots), and whoever
        // held it may still work on it until its next renewal: wait a lease
        // duration before creating it, as for a deletion seen.
        if self.looked.load(Ordering::SeqCst) {
            elector.presume_missing_lease_held();
        }
        let stop = CancellationToken::new();
        let (e, s) = (Arc::clone(&elector), stop.clone());
        let task = tokio::spawn(async move { e.run(s).await });
        let (mut leading, s, metrics) = (elector.subscribe(), stop.clone(), self.metrics.clone());
        let started = tokio::time::Instant::now();
        tokio::spawn(async move {
            tokio::select! {
                _ = s.cancelled() => {}
                led = leading.wait_for(|l| *l) => if led.is_ok() {
                    metrics.acquisitions.inc();
                    metrics.acquire_wait.observe(started.elapsed().as_secs_f64());
                    info!(slot, "took the slot's Lease");
                },
            }
        });
        Holder {
            elector,
            stop,
            task: Some(task),
        }
    }

    /// Stops new work on `slot`, waits for the work in progress to end,
    /// then releases the slot's Lease.
    fn hand_over(self: &Arc<Self>, slot: u32) -> JoinHandle<()> {
        let state = &self.states[slot as usize];
        // Marked before the count is read: see the module documentation.
        state.handing_over.store(true, Ordering::SeqCst);
        // Counted now: the informer lets go of the slot's objects soon.
        let keys = self
            .key_count
            .lock()
            .as_ref()
            .map_or(0, |count| count(slot));
        let ring = Arc::clone(self);
        tokio::spawn(async move {
            let state = &ring.states[slot as usize];
            loop {
                let idle = state.idle.notified();
                if state.in_flight.load(Ordering::SeqCst) == 0 {
                    break;
                }
                idle.await;
            }
            // The holder stays in place (handing over, so no new work)
            // until its Lease is released: a new campaign for the slot must
            // not start while the old one still holds it under our name.
            let election = ring.holders.lock().get_mut(&slot).map(|h| {
                h.stop.cancel();
                h.task.take()
            });
            if let Some(Some(task)) = election {
                let _ = task.await;
                ring.metrics.handovers.inc();
                ring.metrics.keys_handed_over.inc_by(keys);
                info!(slot, keys, "handed the slot over");
            }
            ring.holders.lock().remove(&slot);
        })
    }
}
