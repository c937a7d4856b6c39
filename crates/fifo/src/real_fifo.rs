//! The RealFifo: an ordered log of deltas, client-go's `RealFIFO`.
//!
//! Where a [`DeltaFifo`](crate::DeltaFifo) merges the changes of one key
//! into one entry, the RealFifo keeps every change as its own entry, in the
//! order it arrived, and hands them out one by one. Locking and waiting are
//! the DeltaFifo's: one `parking_lot` mutex, a tokio `Notify` registered
//! before the queue is looked at.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::pin::pin;
use std::sync::Arc;

use kinformer_store::{
    DeletedFinalStateUnknown, KeyError, KeyFunc, KnownObjects, Object, ObjectOrTombstone,
    meta_namespace_key,
};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::{Delta, DeltaType, Deltas, FifoError, PopError, Requeue};

type Hasher = foldhash::fast::RandomState;

/// How a [`RealFifo`] is built. Defaults: keys by [`meta_namespace_key`], no
/// known objects.
#[non_exhaustive]
pub struct RealFifoOptions<K> {
    key_func: KeyFunc<K>,
    known_objects: Option<Arc<dyn KnownObjects<K>>>,
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
    /// and `resync` replays them.
    #[must_use]
    pub fn known_objects(mut self, known: Arc<dyn KnownObjects<K>>) -> Self {
        self.known_objects = Some(known);
        self
    }
}

/// A queue of every change, in arrival order: client-go's `RealFIFO`, the
/// default queue of its informers since v0.33.
///
/// - Every `add`, `update` and `delete` is its own entry; nothing is merged,
///   so a consumer sees each intermediate state, and a delete of a key it
///   never saw is queued all the same.
/// - `replace` queues first a `Deleted` delta with a
///   [`DeletedFinalStateUnknown`] tombstone for every key the list no longer
///   has (among the keys queued, unless their last entry is a delete, and
///   among the known objects with nothing queued), then a `Replaced` delta
///   for every listed object, in list order.
/// - `resync` queues a `Sync` delta for every known object with nothing
///   queued.
/// - [`has_synced`](Self::has_synced) turns true once the first `replace`
///   (or an add, update or delete before it) has arrived and every entry
///   queued by then has been popped; `is_in_initial_list` is true for those
///   entries.
/// - `pop` hands out one entry at a time, as a [`Deltas`] of one delta; its
///   closure runs while the queue is locked, as the DeltaFifo's does.
pub struct RealFifo<K> {
    inner: Mutex<Inner<K>>,
    notify: Notify,
    key_func: KeyFunc<K>,
    known_objects: Option<Arc<dyn KnownObjects<K>>>,
}

struct Inner<K> {
    items: VecDeque<(Arc<str>, Delta<K>)>,
    /// Whether anything (a replace, an add, an update, a delete) has arrived.
    populated: bool,
    /// How many entries queued by the first replace have yet to be popped.
    initial_population_count: usize,
    closed: bool,
}

impl<K> fmt::Debug for RealFifo<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.inner.lock();
        f.debug_struct("RealFifo")
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
}

impl<K> RealFifo<K> {
    /// A RealFifo built from `options`.
    pub fn with_options(options: RealFifoOptions<K>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                items: VecDeque::new(),
                populated: false,
                initial_population_count: 0,
                closed: false,
            }),
            notify: Notify::new(),
            key_func: options.key_func,
            known_objects: options.known_objects,
        }
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
        self.push(&mut inner, key, delta);
        Ok(())
    }

    /// Records a full list as of `resource_version`: the deletions it
    /// implies first, then a `Replaced` delta per listed object (see the
    /// type's docs). The first replace also fixes the population that
    /// [`has_synced`](Self::has_synced) waits for: everything queued by then.
    ///
    /// If any object has no key, nothing is queued and the error names it.
    pub fn replace(&self, list: Vec<Arc<K>>, _resource_version: &str) -> Result<(), FifoError> {
        let keys = list
            .iter()
            .enumerate()
            .map(|(index, obj)| {
                (self.key_func)(obj)
                    .map(Arc::<str>::from)
                    .map_err(|source| FifoError::ReplaceKey { index, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.replace_keyed(keys, list, &Kept::default());
        Ok(())
    }

    /// A replace whose objects are handed over one at a time, for a
    /// Reflector reading a list as it arrives. The RealFifo queues the
    /// deletions a list implies *before* its objects (see the type's docs),
    /// which it can only know once the list is complete: the objects are
    /// kept until [`finish`](RealFifoReplace::finish) and then queued as
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

    fn replace_keyed(&self, keys: Vec<Arc<str>>, list: Vec<Arc<K>>, kept: &Kept) {
        let mut listed: HashSet<&str, Hasher> = keys.iter().map(|k| k.as_ref()).collect();
        listed.extend(kept.keys.iter().map(|k| k.as_ref()));
        let listed = |key: &str| kept.all || listed.contains(key);

        let mut inner = self.inner.lock();
        // The last entry queued for each key, in the order keys first appear.
        let mut last: HashMap<Arc<str>, usize, Hasher> = HashMap::default();
        let mut order: Vec<Arc<str>> = Vec::new();
        for (i, (key, _)) in inner.items.iter().enumerate() {
            if last.insert(Arc::clone(key), i).is_none() {
                order.push(Arc::clone(key));
            }
        }
        let mut gone: Vec<(Arc<str>, Arc<K>)> = Vec::new();
        for key in &order {
            let (_, delta) = &inner.items[last[key]];
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
            let tombstone = DeletedFinalStateUnknown {
                key: key.to_string(),
                obj,
            };
            let delta = Delta {
                kind: DeltaType::Deleted,
                object: ObjectOrTombstone::Tombstone(tombstone),
            };
            self.push(&mut inner, key, delta);
        }
        for (key, obj) in keys.into_iter().zip(list) {
            self.push(&mut inner, key, Delta::new(DeltaType::Replaced, obj));
        }
        if !inner.populated {
            inner.populated = true;
            inner.initial_population_count = inner.items.len();
        }
    }

    /// Queues a `Sync` delta for every known object that has nothing queued
    /// (client-go's periodic resync). Does nothing without known objects.
    pub fn resync(&self) -> Result<(), FifoError> {
        let Some(known) = &self.known_objects else {
            return Ok(());
        };
        let mut inner = self.inner.lock();
        let queued: HashSet<Arc<str>, Hasher> =
            inner.items.iter().map(|(k, _)| Arc::clone(k)).collect();
        for key in known.list_keys() {
            if queued.contains(key.as_str()) {
                continue;
            }
            let Some(obj) = known.get_by_key(&key) else {
                continue;
            };
            let key: Arc<str> = Arc::from((self.key_func)(&obj)?);
            self.push(&mut inner, key, Delta::new(DeltaType::Sync, obj));
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
        let mut registered = false;
        loop {
            let mut notified = pin!(self.notify.notified());
            if registered {
                notified.as_mut().enable();
            }
            {
                let mut inner = self.inner.lock();
                if let Some((key, delta)) = inner.items.pop_front() {
                    let is_in_initial_list = !inner.has_synced();
                    let Some(process) = process.take() else {
                        unreachable!("process is consumed at most once")
                    };
                    let deltas = Deltas(vec![delta]);
                    return match process(&key, &deltas, is_in_initial_list) {
                        Ok(value) => {
                            // Counted once processed: has_synced cannot turn
                            // true while the last initial entry is handled.
                            inner.initial_population_count =
                                inner.initial_population_count.saturating_sub(1);
                            Ok(value)
                        }
                        Err(Requeue(err)) => {
                            if let Some(delta) = deltas.into_vec().pop() {
                                inner.items.push_front((key, delta));
                            }
                            Err(PopError::Requeued(err))
                        }
                    };
                }
                if inner.closed {
                    return Err(PopError::Closed);
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

    /// The number of entries queued.
    pub fn len(&self) -> usize {
        self.inner.lock().items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.inner.lock().items.is_empty()
    }

    /// The keys of the queued entries, in the order they will be popped (a
    /// key once per entry).
    pub fn list_keys(&self) -> Vec<String> {
        self.inner
            .lock()
            .items
            .iter()
            .map(|(k, _)| k.to_string())
            .collect()
    }

    fn push(&self, inner: &mut Inner<K>, key: Arc<str>, delta: Delta<K>) {
        let was_empty = inner.items.is_empty();
        inner.items.push_back((key, delta));
        if was_empty {
            self.notify.notify_waiters();
        }
    }
}

/// A replace in progress on a [`RealFifo`], from
/// [`RealFifo::begin_replace`]: the objects pushed so far, queued by
/// [`finish`](Self::finish).
pub struct RealFifoReplace<'a, K> {
    fifo: &'a RealFifo<K>,
    keys: Vec<Arc<str>>,
    list: Vec<Arc<K>>,
    kept: Kept,
    pushed: usize,
}

/// Listed keys whose objects could not be read, or `all` when one's key
/// could not be read either: no deletion is inferred for them.
#[derive(Debug, Default)]
struct Kept {
    keys: Vec<Arc<str>>,
    all: bool,
}

impl<K> fmt::Debug for RealFifoReplace<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RealFifoReplace")
            .field("pushed", &self.list.len())
            .finish()
    }
}

impl<K> RealFifoReplace<'_, K> {
    /// Takes the next listed object. An object without a key is refused
    /// with an error naming it and its position among the objects pushed;
    /// the replace goes on without it.
    pub fn push(&mut self, obj: Arc<K>) -> Result<(), FifoError> {
        let index = self.pushed;
        self.pushed += 1;
        let key =
            (self.fifo.key_func)(&obj).map_err(|source| FifoError::ReplaceKey { index, source })?;
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

    /// A listed object that could not be read (it did not decode) under
    /// `key`: the key counts as listed, so [`finish`](Self::finish) infers
    /// no deletion for it and the version the consumer holds stays.
    /// Nothing is queued for it.
    pub fn keep(&mut self, key: &str) {
        self.kept.keys.push(Arc::from(key));
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
    pub fn finish(self, _resource_version: &str) {
        self.fifo.replace_keyed(self.keys, self.list, &self.kept);
    }
}

impl<K> Inner<K> {
    fn has_synced(&self) -> bool {
        self.populated && self.initial_population_count == 0
    }
}
