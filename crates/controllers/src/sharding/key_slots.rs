//! A sharded controller's bookkeeping: the slot of each primary key
//! ([`KeySlots`]), the priming of a slot just taken (its keys enqueued once
//! the cache holds it), and what its workers check before a reconcile
//! ([`Sharding`]).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kinformer_informer::SharedIndexInformer;
use kinformer_store::{Object, ObjectKey};
use kinformer_workqueue::{Priority, RateLimitingQueue};
use parking_lot::Mutex;
use tokio::sync::watch;
use tracing::{error, info};

use crate::gate::{Admission, Gate, Outcome};
use crate::leader::lease_lost;
use crate::options::{Event, EventFilter};
use crate::reason::{Reason, Reasons};
use crate::reconcile::panic_message;
use crate::ring::slot_of_uid;
use crate::{Ring, SlotGuard};

/// The slot of each primary key of a sharded controller, from the primary
/// informer's events (a delete's from the object's last state): what a
/// worker enters before reconciling the key. Each record carries a
/// generation, bumped by every event, whether the key is queued (or
/// scheduled again) here, and whether an event the filter passed has not
/// been worked on since (`pending`): a worker that handled a key forgets
/// its record only if no event came meanwhile, the object is not cached
/// and the key was not scheduled again; a delete the event filter drops
/// forgets it only if the key is not queued.
pub(crate) struct KeySlots {
    pub(crate) slots: u32,
    pub(crate) map: Mutex<std::collections::HashMap<ObjectKey, KeyRecord>>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyRecord {
    pub(crate) slot: u32,
    pub(crate) generation: u64,
    pub(crate) queued: bool,
    /// The generation of the latest event the filter passed, while no
    /// reconcile here has settled since: cleared only when a reconcile of
    /// the key, taken at that generation or later, ends done (not
    /// scheduled again, not aborted).
    pub(crate) pending: Option<u64>,
}

impl KeySlots {
    /// Records an event of `obj`; `enqueued` when its key is being enqueued.
    pub(crate) fn record<K: Object>(&self, key: &ObjectKey, obj: &K, enqueued: bool) {
        let slot = slot_of_uid(obj.uid().unwrap_or_default(), self.slots);
        let mut map = self.map.lock();
        let record = map.entry(key.clone()).or_insert(KeyRecord {
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
    pub(crate) fn worked(&self, key: &str, generation: u64) {
        if let Some(record) = self.map.lock().get_mut(key)
            && record.pending.is_some_and(|at| at <= generation)
        {
            record.pending = None;
        }
    }

    /// A worker takes `key` from the queue: its slot and generation.
    pub(crate) fn take(&self, key: &str) -> Option<(u32, u64)> {
        let mut map = self.map.lock();
        let record = map.get_mut(key)?;
        record.queued = false;
        Some((record.slot, record.generation))
    }

    /// `key` is queued or scheduled again.
    pub(crate) fn queued(&self, key: &str) {
        if let Some(record) = self.map.lock().get_mut(key) {
            record.queued = true;
        }
    }

    /// Forgets `key` if it is still at `generation` and its object is not
    /// cached. Under the map's lock: the informer updates its cache before
    /// its handlers record an event, so an object added meanwhile is either
    /// cached here or recorded after, at a new generation.
    pub(crate) fn forget(&self, key: &str, generation: u64, cached: impl Fn(&str) -> bool) {
        let mut map = self.map.lock();
        if map.get(key).is_some_and(|r| r.generation == generation) && !cached(key) {
            map.remove(key);
        }
    }

    /// Forgets `key` (its object deleted) unless it is queued.
    pub(crate) fn forget_unless_queued(&self, key: &str) {
        let mut map = self.map.lock();
        if map.get(key).is_some_and(|r| !r.queued) {
            map.remove(key);
        }
    }

    /// The keys of `slot`, for a slot just made ready: those with an event
    /// the filter passed and no reconcile here settled since (queued or
    /// pending), and the others, whose events the filter turned down or
    /// were reconciled here already.
    pub(crate) fn slot_keys(&self, slot: u32) -> (Vec<ObjectKey>, Vec<ObjectKey>) {
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
    pub(crate) fn mark_queued(&self, keys: &[ObjectKey]) {
        let mut map = self.map.lock();
        for key in keys {
            if let Some(record) = map.get_mut(key) {
                record.queued = true;
            }
        }
    }

    pub(crate) fn count(&self, slot: u32) -> u64 {
        self.map.lock().values().filter(|r| r.slot == slot).count() as u64
    }
}

/// How often a sharded controller looks whether the cache holds a slot
/// just taken.
pub(crate) const PRIME_POLL: Duration = Duration::from_millis(20);

/// How many keys of a slot just taken `prime` runs the event filter on
/// before it yields.
pub(crate) const PRIME_BATCH: usize = 256;

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
pub(crate) async fn prime(
    ring: Arc<Ring>,
    key_slots: Arc<KeySlots>,
    ready: Arc<parking_lot::RwLock<std::collections::BTreeSet<u32>>>,
    queued: impl Fn() -> usize,
    wanted: impl Fn(&str) -> bool,
    queue: RateLimitingQueue<ObjectKey>,
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
                keys.extend(batch.iter().filter(|key| wanted(key.as_str())).cloned());
                tokio::task::yield_now().await;
            }
            key_slots.mark_queued(&keys);
            info!(slots = ?taken, keys = keys.len(), "the cache holds the slots taken; working on them");
            for key in keys {
                reasons.now(&key, || Reason::SlotTaken);
                // A replay of the cache, like an initial list: behind live
                // changes.
                queue.add_with_priority(key, kinformer_workqueue::Priority::Low);
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
pub(crate) fn wanted_on_taking<K: Object + Clone>(
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

/// What a sharded controller's workers need.
pub(crate) struct Sharding {
    pub(crate) ring: Arc<Ring>,
    pub(crate) key_slots: Arc<KeySlots>,
    /// Whether the primary cache holds a key.
    pub(crate) cache: Box<dyn Fn(&str) -> bool + Send + Sync>,
    /// The held slots whose objects the primary cache holds: the only slots
    /// workers enter (see `prime`).
    pub(crate) ready: Arc<parking_lot::RwLock<std::collections::BTreeSet<u32>>>,
    /// The ring's held slots as last sent.
    pub(crate) held: watch::Receiver<std::collections::BTreeSet<u32>>,
    /// The slot guard and generation of each key being reconciled, from
    /// `admit` to `settle`.
    pub(crate) entered: Mutex<std::collections::HashMap<String, (SlotGuard, u64)>>,
}

/// Whether a worker may reconcile a key of a sharded controller now.
pub(crate) enum Entry {
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
    pub(crate) fn enter(&self, key: &str) -> Entry {
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
    pub(crate) fn forget(&self, key: &str, generation: u64) {
        self.key_slots.forget(key, generation, &self.cache);
    }
}

/// Sharded key slots as a gate: a key is reconciled only inside its slot's
/// guard, in a slot held and primed here; its reconcile is interrupted when
/// the slot's Lease is lost; a key of a slot not (yet) worked here is
/// skipped, and its record forgotten unless its object is cached.
impl Gate for Sharding {
    fn admit(&self, key: &ObjectKey, _priority: Priority) -> Admission {
        let key = key.as_str();
        match self.enter(key) {
            Entry::Entered(guard, generation) => {
                self.entered
                    .lock()
                    .insert(key.to_owned(), (guard, generation));
                Admission::Admit
            }
            Entry::NotReady => Admission::Skip,
            Entry::NotHeld(generation) => {
                if let Some(generation) = generation {
                    self.forget(key, generation);
                }
                Admission::Skip
            }
        }
    }

    /// Resolves once the Lease of the key's slot is lost (or no longer
    /// safely held by our clock); never while it is held, handed over or
    /// not.
    fn interrupted(&self, key: &ObjectKey) -> Option<BoxFuture<'static, String>> {
        let slot = self.entered.lock().get(key.as_str())?.0.slot();
        let elector = self.ring.slot_elector(slot);
        Some(Box::pin(async move {
            if let Some(elector) = elector {
                lease_lost(&elector, &mut elector.subscribe()).await;
            }
            format!("the Lease of slot {slot} was lost")
        }))
    }

    /// Leaves the slot (its handover may go on while the queue takes the
    /// key again), then records what became of the key.
    fn settle(&self, key: &ObjectKey, outcome: Outcome) {
        let key = key.as_str();
        let Some((guard, generation)) = self.entered.lock().remove(key) else {
            return;
        };
        drop(guard);
        match outcome {
            Outcome::Finished => {
                self.key_slots.worked(key, generation);
                self.forget(key, generation);
            }
            Outcome::Interrupted | Outcome::Skipped => self.forget(key, generation),
            Outcome::Requeued => self.key_slots.queued(key),
            Outcome::Aborted => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        slots.record(&"ns/a".parse().unwrap(), &cm, true);
        let (_, generation) = slots.take("ns/a").unwrap();
        // A status write of the reconcile comes back, turned down.
        slots.record(&"ns/a".parse().unwrap(), &cm, false);
        slots.worked("ns/a", generation);
        let (passed, others) = slots.slot_keys(slot);
        assert!(passed.is_empty(), "{passed:?}");
        assert_eq!(others, ["ns/a"]);
    }

    #[test]
    fn an_event_the_filter_passed_during_a_reconcile_keeps_the_key_pending() {
        let (slots, cm, slot) = key_slots_with_one_key();
        slots.record(&"ns/a".parse().unwrap(), &cm, true);
        let (_, generation) = slots.take("ns/a").unwrap();
        slots.record(&"ns/a".parse().unwrap(), &cm, true);
        slots.take("ns/a");
        slots.worked("ns/a", generation);
        let (passed, _) = slots.slot_keys(slot);
        assert_eq!(passed, ["ns/a"]);
    }
}
