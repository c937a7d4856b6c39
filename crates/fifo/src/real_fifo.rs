//! The RealFifo: an ordered log of deltas, client-go's `RealFIFO`.
//!
//! Where a [`DeltaFifo`](crate::DeltaFifo) merges the changes of one key
//! into one entry, the RealFifo keeps every change as its own entry, in the
//! order it arrived, and hands them out one by one. Locking and waiting are
//! the DeltaFifo's: one `parking_lot` mutex, a tokio `Notify` registered
//! before the queue is looked at; `tests/model.rs` checks them under loom.
//!
//! In its atomic mode ([`RealFifoOptions::atomic`], client-go v0.37's
//! `AtomicFIFO`, on by default there) a relist is one unit, a
//! [`ReplacedAll`] holding the whole list, a resync one `SyncAll` unit, and
//! a watch bookmark a unit of its own, all popped through
//! [`RealFifo::pop_unit`] with the queue's lock released while the consumer
//! works (client-go's `UnlockWhileProcessingFIFO`): the consumer swaps its
//! whole cache at once and works out the deletions itself, so the queue
//! consults no known objects.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::pin::pin;
use std::sync::Arc;

use crate::sync::{Mutex, MutexGuard, Notify};
use crate::{Delta, DeltaType, Deltas, FifoError, PopError, Requeue};
use kinformer_store::{
    KeyError, KeyFunc, KnownObjects, Object, ObjectOrTombstone, meta_namespace_key,
};

type Hasher = foldhash::fast::RandomState;

/// How a [`RealFifo`] is built. Defaults: keys by [`meta_namespace_key`], no
/// known objects.
#[non_exhaustive]
pub struct RealFifoOptions<K> {
    key_func: KeyFunc<K>,
    known_objects: Option<Arc<dyn KnownObjects<K>>>,
    atomic: bool,
}

impl<K> fmt::Debug for RealFifoOptions<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RealFifoOptions")
            .field("known_objects", &self.known_objects.is_some())
            .field("atomic", &self.atomic)
            .finish_non_exhaustive()
    }
}

impl<K: Object> Default for RealFifoOptions<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Object> RealFifoOptions<K> {
    /// The defaults.
    pub fn new() -> Self {
        Self {
            key_func: Arc::new(|obj: &K| meta_namespace_key(obj)),
            known_objects: None,
            atomic: false,
        }
    }
}

impl<K> RealFifoOptions<K> {
    /// Keys objects with `key_func`.
    #[must_use]
    pub fn key_func(mut self, key_func: KeyFunc<K>) -> Self {
        self.key_func = key_func;
        self
    }

    /// What the consumer holds: `replace` finds deletions among these keys,
    /// and `resync` replays them. Not consulted in the atomic mode.
    #[must_use]
    pub fn known_objects(mut self, known: Arc<dyn KnownObjects<K>>) -> Self {
        self.known_objects = Some(known);
        self
    }

    /// The atomic mode of client-go v0.37 (`AtomicFIFO` with
    /// `UnlockWhileProcessingFIFO` and bookmark deltas): a `replace` is
    /// queued as one [`ReplacedAll`] unit, a `resync` as one `SyncAll`, a
    /// [`bookmark`](RealFifo::bookmark) as a unit of its own, and
    /// [`pop_unit`](RealFifo::pop_unit) runs its closure with the queue
    /// unlocked. Known objects are not consulted for deletions or resyncs
    /// (the consumer reconciles a `ReplacedAll` against its own store);
    /// they are only asked for what they hold whole
    /// ([`KnownObjects::get_shared`]): a listed object handed over through
    /// [`begin_replace`](RealFifo::begin_replace) at the version held (same
    /// uid, same non-empty resourceVersion) is queued as the held one, so a
    /// relist holds one copy of what did not change rather than two; one
    /// they hold at that version but not whole
    /// ([`KnownObjects::holds_version`], a compact cache) is not kept at
    /// all, the consumer keeping what it holds, unless a unit queued or
    /// being applied ahead of the list could change it first (then the
    /// listed copy is kept, as without sharing); this assumes the one
    /// listing is the only producer until `finish`, as a Reflector is. Give
    /// no known objects to take every listed object as it came (content the
    /// server changed without a write, such as new CRD defaults, then
    /// reaches the cache on a relist, as in client-go).
    #[must_use]
    pub fn atomic(mut self) -> Self {
        self.atomic = true;
        self
    }
}

/// A queue of every change, in arrival order: client-go's `RealFIFO`, the
/// queue of its informers since v0.33 (GA and locked on in v0.37).
///
/// - Every `add`, `update` and `delete` is its own entry; nothing is merged,
///   so a consumer sees each intermediate state, and a delete of a key it
///   never saw is queued all the same.
/// - `replace` queues first a `Deleted` delta with a
///   [`DeletedFinalStateUnknown`](crate::DeletedFinalStateUnknown) tombstone for every key the list no longer
///   has (among the keys queued, unless their last entry is a delete, and
///   among the known objects with nothing queued), then a `Replaced` delta
///   for every listed object, in list order. In the atomic mode it queues
///   one [`ReplacedAll`] unit instead.
/// - `resync` queues a `Sync` delta for every known object with nothing
///   queued; in the atomic mode one `SyncAll` unit.
/// - [`has_synced`](Self::has_synced) turns true once the first `replace`
///   (or an add, update or delete before it) has arrived and every entry
///   queued by then has been popped; `is_in_initial_list` is true for those
///   entries.
/// - `pop` hands out one entry at a time, as a [`Deltas`] of one delta; its
///   closure runs while the queue is locked, as the DeltaFifo's does.
///   [`pop_unit`](Self::pop_unit) hands out any unit; in the atomic mode its
///   closure runs with the queue unlocked (while fewer than 2000 units
///   wait), so the Reflector is not held up by a consumer applying a whole
///   list, and is once the consumer falls that far behind.
pub struct RealFifo<K> {
    inner: Mutex<Inner<K>>,
    /// Held by the one consumer between taking a unit and putting back
    /// what it requeues, so that units are processed one at a time and in
    /// order even when the queue is unlocked meanwhile.
    consumer: Mutex<()>,
    notify: Notify,
    key_func: KeyFunc<K>,
    known_objects: Option<Arc<dyn KnownObjects<K>>>,
    atomic: bool,
}

/// One queued unit.
enum Item<K> {
    Delta(Arc<str>, Delta<K>),
    ReplacedAll(ReplacedAll<K>),
    SyncAll,
    Bookmark(String),
}

impl<K> Item<K> {
    /// The key of a single object's delta.
    fn key(&self) -> Option<&Arc<str>> {
        match self {
            Self::Delta(key, _) => Some(key),
            _ => None,
        }
    }
}

/// A whole list, queued as one unit by a `replace` in the atomic mode: the
/// consumer swaps its cache for it at once, then tells of the deletions it
/// implies and then of the listed objects, in list order (client-go's
/// `ReplacedAllInfo` and `processReplacedAllInfo`).
pub struct ReplacedAll<K> {
    resource_version: String,
    keys: Vec<Arc<str>>,
    /// `None`: held by the known objects at the listed version.
    objects: Vec<Option<Arc<K>>>,
    kept: Kept,
}

impl<K> fmt::Debug for ReplacedAll<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplacedAll")
            .field("resource_version", &self.resource_version)
            .field("objects", &self.objects.len())
            .field("kept", &self.kept)
            .finish()
    }
}

impl<K> ReplacedAll<K> {
    /// The version the list was read at.
    pub fn resource_version(&self) -> &str {
        &self.resource_version
    }

    /// The listed objects with their keys, in list order. `None` for an
    /// object the known objects hold at the listed version (same uid and
    /// resourceVersion) but not whole (a compact cache): the queue kept no
    /// copy of it, and the consumer keeps what it holds.
    pub fn objects(&self) -> impl ExactSizeIterator<Item = (&Arc<str>, Option<&Arc<K>>)> {
        self.keys
            .iter()
            .zip(self.objects.iter().map(Option::as_ref))
    }

    /// How many objects were listed.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Whether `key`, absent from the objects, must be kept as the consumer
    /// holds it: the list had an object under it that could not be read
    /// (or one whose key could not be read either, which keeps every key).
    pub fn keeps(&self, key: &str) -> bool {
        self.kept.all || self.kept.keys.contains(key)
    }

    /// Whether every key absent from the objects is kept (see
    /// [`keeps`](Self::keeps)): no deletion can be inferred from this list.
    pub fn keeps_all(&self) -> bool {
        self.kept.all
    }

    /// The keys kept one by one (see [`keeps`](Self::keeps)), in no
    /// particular order.
    pub fn kept_keys(&self) -> impl ExactSizeIterator<Item = &Arc<str>> {
        self.kept.keys.iter()
    }
}

/// One unit handed out by [`RealFifo::pop_unit`] (and
/// [`InformerQueue::pop_unit`](crate::InformerQueue::pop_unit)); it only
/// borrows, so copying it is free.
#[derive(Debug)]
pub enum Popped<'a, K> {
    /// Changes to one object: a single delta from a RealFifo, the merged
    /// deltas of the key from a DeltaFifo.
    Deltas {
        /// The object's key.
        key: &'a str,
        /// Its changes, oldest first.
        deltas: &'a Deltas<K>,
    },
    /// A whole list, in the atomic mode.
    ReplacedAll(&'a ReplacedAll<K>),
    /// A resync of every object the consumer holds, in the atomic mode.
    SyncAll,
    /// A watch bookmark at this version, in the atomic mode: the consumer's
    /// content is synced to it without an object changing.
    Bookmark(&'a str),
}

impl<K> Clone for Popped<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Popped<'_, K> {}

/// A queue at least this long is not unlocked while a unit is processed,
/// so a consumer that falls behind holds producers back instead of letting
/// the queue grow without bound (client-go's twice its batch size of 1000).
const UNLOCKED_BELOW: usize = 2000;

struct Inner<K> {
    items: VecDeque<Item<K>>,
    /// A unit taken by a consumer and not yet processed (or put back): it
    /// still counts as queued.
    in_flight: bool,
    /// Whether anything (a replace, an add, an update, a delete) has arrived.
    populated: bool,
    /// How many entries queued by the first replace have yet to be popped.
    initial_population_count: usize,
    /// How many units a consumer has taken, to tell that none was taken
    /// between two looks ([`Inner::quiet`]).
    processed: u64,
    closed: bool,
}

impl<K> fmt::Debug for RealFifo<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.inner.lock();
        f.debug_struct("RealFifo")
            .field("atomic", &self.atomic)
            .field("queued", &inner.items.len())
            .field("populated", &inner.populated)
            .field("closed", &inner.closed)
            .finish()
    }
}

impl<K: Object> Default for RealFifo<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Object> RealFifo<K> {
    /// A RealFifo with the default options and no known objects.
    pub fn new() -> Self {
        Self::with_options(RealFifoOptions::default())
    }

    /// A RealFifo in the atomic mode (see [`RealFifoOptions::atomic`]),
    /// keying objects by [`meta_namespace_key`].
    pub fn atomic() -> Self {
        Self::with_options(RealFifoOptions::default().atomic())
    }
}

impl<K> RealFifo<K> {
    /// A RealFifo built from `options`.
    pub fn with_options(options: RealFifoOptions<K>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                items: VecDeque::new(),
                in_flight: false,
                populated: false,
                initial_population_count: 0,
                processed: 0,
                closed: false,
            }),
            consumer: Mutex::new(()),
            notify: Notify::new(),
            key_func: options.key_func,
            known_objects: options.known_objects,
            atomic: options.atomic,
        }
    }

    /// Whether this queue is in the atomic mode.
    pub fn is_atomic(&self) -> bool {
        self.atomic
    }

    /// The key of an object or tombstone.
    pub fn key_of(&self, obj: &ObjectOrTombstone<K>) -> Result<String, KeyError> {
        match obj {
            ObjectOrTombstone::Object(obj) => (self.key_func)(obj),
            ObjectOrTombstone::Tombstone(t) => Ok(t.key.clone()),
        }
    }

    /// Records that the object was added.
    pub fn add(&self, obj: Arc<K>) -> Result<(), FifoError> {
        self.record(Delta::new(DeltaType::Added, obj))
    }

    /// Records that the object was updated.
    pub fn update(&self, obj: Arc<K>) -> Result<(), FifoError> {
        self.record(Delta::new(DeltaType::Updated, obj))
    }

    /// Records that the object was deleted.
    pub fn delete(&self, obj: impl Into<ObjectOrTombstone<K>>) -> Result<(), FifoError> {
        self.record(Delta {
            kind: DeltaType::Deleted,
            object: obj.into(),
        })
    }

    fn record(&self, delta: Delta<K>) -> Result<(), FifoError> {
        let key: Arc<str> = Arc::from(self.key_of(&delta.object)?);
        let mut inner = self.inner.lock();
        inner.populated = true;
        self.push(&mut inner, Item::Delta(key, delta));
        Ok(())
    }

    /// Records a watch bookmark at `resource_version`: in the atomic mode a
    /// unit of its own, behind everything queued before it, so the consumer
    /// can mark its content synced to that version once it has applied
    /// them (a bookmark right behind another replaces it). Otherwise
    /// nothing, as client-go's RealFIFO without bookmark deltas.
    pub fn bookmark(&self, resource_version: &str) {
        if !self.atomic {
            return;
        }
        let mut inner = self.inner.lock();
        if let Some(Item::Bookmark(last)) = inner.items.back_mut() {
            resource_version.clone_into(last);
            return;
        }
        self.push(&mut inner, Item::Bookmark(resource_version.to_owned()));
    }

    /// Records a full list as of `resource_version`: the deletions it
    /// implies first, then a `Replaced` delta per listed object (see the
    /// type's docs); in the atomic mode one [`ReplacedAll`] unit. The first
    /// replace also fixes the population that
    /// [`has_synced`](Self::has_synced) waits for: everything queued by then.
    ///
    /// If any object has no key, nothing is queued and the error names it.
    pub fn replace(&self, list: Vec<Arc<K>>, resource_version: &str) -> Result<(), FifoError> {
        let keys = list
            .iter()
            .enumerate()
            .map(|(index, obj)| {
                (self.key_func)(obj)
                    .map(Arc::<str>::from)
                    .map_err(|source| FifoError::ReplaceKey { index, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let list = list.into_iter().map(Some).collect();
        self.replace_keyed(keys, list, Kept::default(), resource_version);
        Ok(())
    }

    /// A replace whose objects are handed over one at a time, for a
    /// Reflector reading a list as it arrives. The RealFifo queues the
    /// deletions a list implies *before* its objects (see the type's docs),
    /// which it can only know once the list is complete, and in the atomic
    /// mode the list is one unit: the objects are kept until
    /// [`finish`](RealFifoReplace::finish) and then queued as
    /// [`replace`](Self::replace) does, so a relist on a RealFifo holds the
    /// whole new list beside the old cache (the DeltaFifo's
    /// [`begin_replace`](crate::DeltaFifo::begin_replace) queues each object
    /// at once). Dropped without `finish`, nothing is queued.
    pub fn begin_replace(&self) -> RealFifoReplace<'_, K> {
        RealFifoReplace {
            fifo: self,
            keys: Vec::new(),
            list: Vec::new(),
            kept: Kept::default(),
            pushed: 0,
        }
    }

    fn replace_keyed(
        &self,
        keys: Vec<Arc<str>>,
        list: Vec<Option<Arc<K>>>,
        kept: Kept,
        resource_version: &str,
    ) {
        if self.atomic {
            let mut inner = self.inner.lock();
            let unit = ReplacedAll {
                resource_version: resource_version.to_owned(),
                keys,
                objects: list,
                kept,
            };
            self.push(&mut inner, Item::ReplacedAll(unit));
            inner.populate();
            return;
        }
        let mut listed: HashSet<&str, Hasher> = keys.iter().map(|k| k.as_ref()).collect();
        listed.extend(kept.keys.iter().map(|k| k.as_ref()));
        let listed = |key: &str| kept.all || listed.contains(key);

        let mut inner = self.inner.lock();
        // The last entry queued for each key, in the order keys first appear.
        let mut last: HashMap<Arc<str>, usize, Hasher> = HashMap::default();
        let mut order: Vec<Arc<str>> = Vec::new();
        for (i, item) in inner.items.iter().enumerate() {
            let Some(key) = item.key() else { continue };
            if last.insert(Arc::clone(key), i).is_none() {
                order.push(Arc::clone(key));
            }
        }
        let mut gone: Vec<(Arc<str>, Arc<K>)> = Vec::new();
        for key in &order {
            let Item::Delta(_, delta) = &inner.items[last[key]] else {
                continue;
            };
            if listed(key) || delta.kind == DeltaType::Deleted {
                continue;
            }
            gone.push((Arc::clone(key), Arc::clone(delta.object.object())));
        }
        if let Some(known) = &self.known_objects {
            for key in known.list_keys() {
                if listed(&key) || last.contains_key(key.as_str()) {
                    continue;
                }
                // Gone from the consumer meanwhile: nothing to report.
                if let Some(obj) = known.get_by_key(&key) {
                    gone.push((Arc::from(key), obj));
                }
            }
        }
        for (key, obj) in gone {
            let delta = Delta::tombstone(&key, obj);
            self.push(&mut inner, Item::Delta(key, delta));
        }
        // Every object is whole outside the atomic mode.
        for (key, obj) in keys.into_iter().zip(list) {
            let Some(obj) = obj else { continue };
            self.push(
                &mut inner,
                Item::Delta(key, Delta::new(DeltaType::Replaced, obj)),
            );
        }
        inner.populate();
    }

    /// Queues a `Sync` delta for every known object that has nothing queued
    /// (client-go's periodic resync); does nothing without known objects.
    /// In the atomic mode queues one `SyncAll` unit: the consumer replays
    /// what it holds when it pops it.
    pub fn resync(&self) -> Result<(), FifoError> {
        if self.atomic {
            let mut inner = self.inner.lock();
            self.push(&mut inner, Item::SyncAll);
            return Ok(());
        }
        let Some(known) = &self.known_objects else {
            return Ok(());
        };
        let mut inner = self.inner.lock();
        let queued: HashSet<Arc<str>, Hasher> = inner
            .items
            .iter()
            .filter_map(|item| item.key().map(Arc::clone))
            .collect();
        for key in known.list_keys() {
            if queued.contains(key.as_str()) {
                continue;
            }
            let Some(obj) = known.get_by_key(&key) else {
                continue;
            };
            let key: Arc<str> = Arc::from((self.key_func)(&obj)?);
            self.push(
                &mut inner,
                Item::Delta(key, Delta::new(DeltaType::Sync, obj)),
            );
        }
        Ok(())
    }

    /// Waits for the next entry and hands it to `process` (as a [`Deltas`] of
    /// one delta) together with `is_in_initial_list`.
    ///
    /// `process` runs under the queue's lock and must not call back into the
    /// queue. When it returns `Err(Requeue(e))` the entry goes back to the
    /// head of the queue, so that the order is kept, and `pop` returns
    /// [`PopError::Requeued`]. After [`close`](Self::close), `pop` returns
    /// [`PopError::Closed`] once the queue is empty.
    ///
    /// A queue in the atomic mode also holds units that are not one
    /// object's delta; a consumer of those pops with
    /// [`pop_unit`](Self::pop_unit). Here a `ReplacedAll` is handed out as
    /// the non-atomic mode would have queued it when it is popped: a
    /// tombstone for each key of the known objects the list lacks (none
    /// without known objects), then a `Replaced` delta per listed object;
    /// a `SyncAll` or a bookmark is passed over.
    pub async fn pop<T, E, F>(&self, process: F) -> Result<T, PopError<E>>
    where
        F: FnOnce(&Deltas<K>, bool) -> Result<T, Requeue<E>>,
    {
        self.pop_with_key(|_, deltas, initial| process(deltas, initial))
            .await
    }

    /// Like [`pop`](Self::pop), and also hands `process` the key.
    pub async fn pop_with_key<T, E, F>(&self, process: F) -> Result<T, PopError<E>>
    where
        F: FnOnce(&str, &Deltas<K>, bool) -> Result<T, Requeue<E>>,
    {
        let mut process = Some(process);
        self.consume(|mut inner| {
            while let Some(item) = inner.items.pop_front() {
                let (key, delta) = match item {
                    Item::Delta(key, delta) => (key, delta),
                    other => {
                        self.expand(&mut inner, other);
                        continue;
                    }
                };
                let is_in_initial_list = !inner.has_synced();
                let Some(process) = process.take() else {
                    unreachable!("process is consumed at most once")
                };
                inner.processed += 1;
                let deltas = Deltas(vec![delta]);
                return Some(match process(&key, &deltas, is_in_initial_list) {
                    Ok(value) => {
                        // Counted once processed: has_synced cannot turn
                        // true while the last initial entry is handled.
                        inner.popped();
                        Ok(value)
                    }
                    Err(Requeue(err)) => {
                        if let Some(delta) = deltas.into_vec().pop() {
                            inner.items.push_front(Item::Delta(key, delta));
                        }
                        Err(PopError::Requeued(err))
                    }
                });
            }
            inner.closed.then_some(Err(PopError::Closed))
        })
        .await
    }

    /// Waits for the next unit of any kind and hands it to `process`
    /// together with `is_in_initial_list`.
    ///
    /// In the atomic mode `process` runs with the queue unlocked while
    /// fewer than 2000 units wait, so producers go on adding while a whole
    /// list is applied (client-go's `UnlockWhileProcessingFIFO`, with its
    /// bound: a consumer that far behind holds producers back); consumers
    /// still take units one at a time, in order, and [`has_synced`](Self::has_synced) turns true only
    /// once the last initial unit has been processed. Otherwise it runs
    /// under the lock, as [`pop`](Self::pop)'s. `Err(Requeue(e))` puts the
    /// unit back at the head of the queue and gives
    /// [`PopError::Requeued`]; after [`close`](Self::close), `pop_unit`
    /// returns [`PopError::Closed`] once the queue is empty.
    pub async fn pop_unit<T, E, F>(&self, process: F) -> Result<T, PopError<E>>
    where
        F: FnOnce(Popped<'_, K>, bool) -> Result<T, Requeue<E>>,
    {
        let mut process = Some(process);
        self.consume(|mut inner| {
            let Some(item) = inner.items.pop_front() else {
                return inner.closed.then_some(Err(PopError::Closed));
            };
            let is_in_initial_list = !inner.has_synced();
            // Whether this unit is one the first list's population counts:
            // a unit taken before that list arrived is not, even if it
            // arrives while this one is processed.
            let counted = inner.initial_population_count > 0;
            let Some(process) = process.take() else {
                unreachable!("process is consumed at most once")
            };
            inner.in_flight = true;
            inner.processed += 1;
            let unlock = self.atomic && inner.items.len() < UNLOCKED_BELOW;
            let (item, result, mut inner) = if unlock {
                drop(inner);
                let (item, result) = run_unit(item, is_in_initial_list, process);
                (item, result, self.inner.lock())
            } else {
                let (item, result) = run_unit(item, is_in_initial_list, process);
                (item, result, inner)
            };
            inner.in_flight = false;
            Some(match result {
                Ok(value) => {
                    if counted {
                        inner.popped();
                    }
                    Ok(value)
                }
                Err(Requeue(err)) => {
                    inner.items.push_front(item);
                    Err(PopError::Requeued(err))
                }
            })
        })
        .await
    }

    /// Runs `attempt` with the consumer's lock and the queue's lock held
    /// until it gives an answer, waiting for a push or a close between
    /// attempts (the waiter is registered before each attempt looks, so no
    /// push is missed). One consumer at a time: units are taken and
    /// processed in order even when `attempt` unlocks the queue.
    async fn consume<R>(
        &self,
        mut attempt: impl FnMut(MutexGuard<'_, Inner<K>>) -> Option<R>,
    ) -> R {
        let mut registered = false;
        loop {
            let mut notified = pin!(self.notify.notified());
            if registered {
                notified.as_mut().enable();
            }
            {
                let _consumer = self.consumer.lock();
                if let Some(answer) = attempt(self.inner.lock()) {
                    return answer;
                }
            }
            if registered {
                notified.await;
            }
            registered = true;
        }
    }

    /// Closes the queue: waiting and future `pop`s return
    /// [`PopError::Closed`] once the queue is empty.
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.notify.notify_waiters();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.inner.lock().closed
    }

    /// True once the first `replace` (or an add, update or delete before it)
    /// has arrived and every entry it queued has been popped.
    pub fn has_synced(&self) -> bool {
        self.inner.lock().has_synced()
    }

    /// The number of units queued: entries, and in the atomic mode whole
    /// lists, resyncs and bookmarks, one each. A unit a consumer is
    /// processing counts until it is done, so 0 means everything queued so
    /// far has been processed.
    pub fn len(&self) -> usize {
        let inner = self.inner.lock();
        inner.items.len() + usize::from(inner.in_flight)
    }

    /// Whether nothing is queued or being processed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys of the queued entries, in the order they will be popped (a
    /// key once per entry; the objects of a queued `ReplacedAll` are
    /// listed in list order, a `SyncAll` or bookmark not at all).
    pub fn list_keys(&self) -> Vec<String> {
        let inner = self.inner.lock();
        let mut keys = Vec::new();
        for item in &inner.items {
            match item {
                Item::Delta(key, _) => keys.push(key.to_string()),
                Item::ReplacedAll(all) => keys.extend(all.keys.iter().map(|k| k.to_string())),
                Item::SyncAll | Item::Bookmark(_) => {}
            }
        }
        keys
    }

    /// A unit [`pop`](Self::pop) does not hand out as it is, taken from
    /// the head: a `ReplacedAll` becomes, at the head, a tombstone per known
    /// key it lacks and does not keep, then a `Replaced` delta per object
    /// (all counted in the initial population if it was); anything else is
    /// passed over.
    fn expand(&self, inner: &mut Inner<K>, item: Item<K>) {
        let all = match item {
            Item::ReplacedAll(all) => all,
            Item::Delta(key, delta) => {
                inner.items.push_front(Item::Delta(key, delta));
                return;
            }
            Item::SyncAll | Item::Bookmark(_) => {
                inner.popped();
                return;
            }
        };
        let mut units: Vec<Item<K>> = Vec::new();
        if let Some(known) = &self.known_objects {
            let listed: HashSet<&str, Hasher> = all.keys.iter().map(|k| k.as_ref()).collect();
            for key in known.list_keys() {
                if listed.contains(key.as_str()) || all.keeps(&key) {
                    continue;
                }
                if let Some(obj) = known.get_by_key(&key) {
                    let delta = Delta::tombstone(&key, obj);
                    units.push(Item::Delta(Arc::from(key), delta));
                }
            }
        }
        for (key, obj) in all.keys.into_iter().zip(all.objects) {
            // Held, not whole: read from the known objects now.
            let obj = obj.or_else(|| {
                self.known_objects
                    .as_ref()
                    .and_then(|known| known.get_by_key(&key))
            });
            if let Some(obj) = obj {
                units.push(Item::Delta(key, Delta::new(DeltaType::Replaced, obj)));
            }
        }
        if inner.initial_population_count > 0 {
            inner.initial_population_count += units.len();
        }
        inner.popped();
        for unit in units.into_iter().rev() {
            inner.items.push_front(unit);
        }
    }

    /// Whether the consumer will still hold `key` at `resource_version`
    /// (same uid) when it applies a unit queued now: it holds it now, and
    /// nothing is queued or being applied that could change it first. A
    /// list queued behind another (a relist after a shard scope narrowed,
    /// then one after it widened again) is judged against the store the
    /// first leaves behind, which is not the store as it is now; so only a
    /// quiet queue is asked, before and after, with no unit processed in
    /// between. The Reflector is the one producer while it lists: a change
    /// queued from another thread between this `push` and `finish` and
    /// applied before the list would be judged against too (do not share,
    /// give no known objects, if other threads write to the queue).
    fn still_held(
        &self,
        known: &dyn KnownObjects<K>,
        key: &str,
        resource_version: &str,
        obj: &K,
    ) -> bool
    where
        K: Object,
    {
        let Some(before) = self.inner.lock().quiet() else {
            return false;
        };
        known.holds_version(key, resource_version, obj.uid())
            && self.inner.lock().quiet() == Some(before)
    }

    fn push(&self, inner: &mut Inner<K>, item: Item<K>) {
        let was_empty = inner.items.is_empty();
        inner.items.push_back(item);
        if was_empty {
            self.notify.notify_waiters();
        }
    }
}

/// Whether `held` and `listed` are the same object at the same version: a
/// non-empty resourceVersion, equal, and equal uids. The server gives one
/// content per version of an object, except where it changes what it
/// serves without a write (new CRD defaults or pruning, another conversion,
/// an upgrade that defaults new fields): those reach an informer only by a
/// relist, and sharing keeps the held content (as a watch would) until the
/// object's next write. [`RealFifoOptions::atomic`] says how to turn
/// sharing off.
fn same_version<K: Object>(held: &K, listed: &K) -> bool {
    matches!(held.resource_version(), Some(rv) if !rv.is_empty())
        && held.resource_version() == listed.resource_version()
        && held.uid() == listed.uid()
}

/// Hands `item` to `process` as a [`Popped`], and gives it back (to be
/// requeued) with the result.
fn run_unit<K, T, E>(
    item: Item<K>,
    is_in_initial_list: bool,
    process: impl FnOnce(Popped<'_, K>, bool) -> Result<T, Requeue<E>>,
) -> (Item<K>, Result<T, Requeue<E>>) {
    match item {
        Item::Delta(key, delta) => {
            let deltas = Deltas(vec![delta]);
            let result = process(
                Popped::Deltas {
                    key: &key,
                    deltas: &deltas,
                },
                is_in_initial_list,
            );
            let delta = deltas.into_vec().pop();
            let item = match delta {
                Some(delta) => Item::Delta(key, delta),
                None => unreachable!("a delta's Deltas keeps it"),
            };
            (item, result)
        }
        Item::ReplacedAll(all) => {
            let result = process(Popped::ReplacedAll(&all), is_in_initial_list);
            (Item::ReplacedAll(all), result)
        }
        Item::SyncAll => (Item::SyncAll, process(Popped::SyncAll, is_in_initial_list)),
        Item::Bookmark(rv) => {
            let result = process(Popped::Bookmark(&rv), is_in_initial_list);
            (Item::Bookmark(rv), result)
        }
    }
}

/// A replace in progress on a [`RealFifo`], from
/// [`RealFifo::begin_replace`]: the objects pushed so far, queued by
/// [`finish`](Self::finish).
pub struct RealFifoReplace<'a, K> {
    fifo: &'a RealFifo<K>,
    keys: Vec<Arc<str>>,
    list: Vec<Option<Arc<K>>>,
    kept: Kept,
    pushed: usize,
}

/// Listed keys whose objects could not be read, or `all` when one's key
/// could not be read either: no deletion is inferred for them.
#[derive(Debug, Default)]
struct Kept {
    keys: HashSet<Arc<str>, Hasher>,
    all: bool,
}

impl<K> fmt::Debug for RealFifoReplace<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RealFifoReplace")
            .field("pushed", &self.list.len())
            .finish()
    }
}

impl<K: Object> RealFifoReplace<'_, K> {
    /// Takes the next listed object. An object without a key is refused
    /// with an error naming it and its position among the objects pushed;
    /// the replace goes on without it. In the atomic mode, an object at the
    /// version the known objects hold whole is taken as the held one, and
    /// one they hold at that version but not whole (a compact cache) is not
    /// kept at all (see [`ReplacedAll::objects`]).
    pub fn push(&mut self, obj: Arc<K>) -> Result<(), FifoError> {
        let index = self.pushed;
        self.pushed += 1;
        let key =
            (self.fifo.key_func)(&obj).map_err(|source| FifoError::ReplaceKey { index, source })?;
        let obj = match &self.fifo.known_objects {
            Some(known) if self.fifo.atomic => match known.get_shared(&key) {
                Some(held) if same_version(held.as_ref(), obj.as_ref()) => Some(held),
                Some(_) => Some(obj),
                None => match obj.resource_version() {
                    Some(rv)
                        if !rv.is_empty() && self.fifo.still_held(&**known, &key, rv, &obj) =>
                    {
                        None
                    }
                    _ => Some(obj),
                },
            },
            _ => Some(obj),
        };
        self.keys.push(key.into());
        self.list.push(obj);
        Ok(())
    }

    /// Takes several listed objects; returns the objects refused, each
    /// error naming its object.
    pub fn push_all(&mut self, objs: Vec<Arc<K>>) -> Vec<FifoError> {
        objs.into_iter()
            .filter_map(|obj| self.push(obj).err())
            .collect()
    }
}

impl<K> RealFifoReplace<'_, K> {
    /// A listed object that could not be read (it did not decode) under
    /// `key`: the key counts as listed, so [`finish`](Self::finish) infers
    /// no deletion for it and the version the consumer holds stays.
    /// Nothing is queued for it.
    pub fn keep(&mut self, key: &str) {
        self.kept.keys.insert(Arc::from(key));
    }

    /// A listed object whose key could not be read either: any key might
    /// be its own, so [`finish`](Self::finish) infers no deletion at all.
    pub fn keep_all(&mut self) {
        self.kept.all = true;
    }

    /// How many objects have been taken.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether nothing has been taken.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The list starts again from its beginning (a list that fell back to
    /// another one): the objects taken so far are dropped.
    pub fn restart(&mut self) {
        self.keys.clear();
        self.list.clear();
        self.kept = Kept::default();
    }

    /// The list is complete: queues it as [`RealFifo::replace`] does,
    /// inferring no deletion for the keys [kept](Self::keep).
    pub fn finish(self, resource_version: &str) {
        self.fifo
            .replace_keyed(self.keys, self.list, self.kept, resource_version);
    }
}

impl<K> Inner<K> {
    fn has_synced(&self) -> bool {
        self.populated && self.initial_population_count == 0
    }

    /// How many units have been processed, when nothing is queued or being
    /// processed: the consumer's content cannot change until a unit is.
    fn quiet(&self) -> Option<u64> {
        (self.items.is_empty() && !self.in_flight).then_some(self.processed)
    }

    /// A replace arrived: the first fixes the initial population.
    fn populate(&mut self) {
        if !self.populated {
            self.populated = true;
            self.initial_population_count = self.items.len();
        }
    }

    /// A unit was processed: counted once processed, so `has_synced` cannot
    /// turn true while the last initial unit is handled.
    fn popped(&mut self) {
        self.initial_population_count = self.initial_population_count.saturating_sub(1);
    }
}
