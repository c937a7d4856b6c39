//! The DeltaFifo itself.
//!
//! One `parking_lot` mutex guards the item map and the key order; waiting in
//! `pop` uses a tokio `Notify`. A waiter registers with the `Notify` before it
//! looks at the queue, and every push into an empty queue (and `close`)
//! notifies all registered waiters, so no wake-up can fall between the check
//! and the wait.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::pin::pin;
use std::sync::Arc;

use crate::sync::{Mutex, Notify};
use crate::{Delta, DeltaType, Deltas, FifoError, PopError, Requeue};
use kinformer_store::{
    KeyError, KeyFunc, KnownObjects, Object, ObjectOrTombstone, meta_namespace_key,
};

type Hasher = foldhash::fast::RandomState;

/// How a [`DeltaFifo`] is built. Defaults: keys by
/// [`meta_namespace_key`], no known objects, `Replaced` deltas on replace.
#[non_exhaustive]
pub struct DeltaFifoOptions<K> {
    key_func: KeyFunc<K>,
    known_objects: Option<Arc<dyn KnownObjects<K>>>,
    emit_delta_type_replaced: bool,
}

impl<K> fmt::Debug for DeltaFifoOptions<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeltaFifoOptions")
            .field("known_objects", &self.known_objects.is_some())
            .field("emit_delta_type_replaced", &self.emit_delta_type_replaced)
            .finish_non_exhaustive()
    }
}

impl<K: Object> Default for DeltaFifoOptions<K> {
    fn default() -> Self {
        Self {
            key_func: Arc::new(|obj: &K| meta_namespace_key(obj)),
            known_objects: None,
            emit_delta_type_replaced: true,
        }
    }
}

impl<K: Object> DeltaFifoOptions<K> {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<K> DeltaFifoOptions<K> {
    /// Keys objects with `key_func` instead of `namespace/name`.
    #[must_use]
    pub fn key_func(mut self, key_func: KeyFunc<K>) -> Self {
        self.key_func = key_func;
        self
    }

    /// The store the popped deltas are applied to (normally the informer's
    /// Indexer). `replace` detects deletions against its keys and `resync`
    /// replays its objects; without it only the queue's own keys are known.
    #[must_use]
    pub fn known_objects(mut self, known: Arc<dyn KnownObjects<K>>) -> Self {
        self.known_objects = Some(known);
        self
    }

    /// The legacy mode: `replace` records `Sync` instead of `Replaced` deltas
    /// (client-go's default before `EmitDeltaTypeReplaced`).
    #[must_use]
    pub fn legacy_sync_on_replace(mut self) -> Self {
        self.emit_delta_type_replaced = false;
        self
    }
}

/// A queue of per-key ordered deltas: client-go's `DeltaFIFO`.
///
/// - Keys come out in the order they were first queued; a key queued again
///   before it is popped keeps its place and gains a delta.
/// - Two `Deleted` deltas in a row for a key collapse into one, keeping the
///   one that is not a tombstone.
/// - `delete` of an object neither queued nor known is ignored.
/// - `replace` and `resync` behave as documented on them.
/// - The `pop` closure runs while the queue is locked, as in client-go: the
///   consumer's store is then updated before any `replace` or `resync` can
///   look at it, so neither sees a key that is in neither place. The closure
///   must not call back into the DeltaFifo.
/// - Bad input (an object whose key cannot be computed) is an error naming
///   the object; nothing queued is lost or changed.
pub struct DeltaFifo<K> {
    inner: Mutex<Inner<K>>,
    notify: Notify,
    key_func: KeyFunc<K>,
    known_objects: Option<Arc<dyn KnownObjects<K>>>,
    emit_delta_type_replaced: bool,
}

struct Inner<K> {
    items: HashMap<Arc<str>, Deltas<K>, Hasher>,
    queue: VecDeque<Arc<str>>,
    /// Whether anything (a replace, an add, an update, a delete) has arrived.
    populated: bool,
    /// Whether a replace from `begin_replace` is under way: until the first
    /// one finishes, nothing else marks the queue populated.
    replacing: bool,
    /// How many keys of the first population (queued before the first
    /// replace finished) have yet to be popped.
    initial_population_count: usize,
    closed: bool,
}

impl<K> fmt::Debug for DeltaFifo<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.inner.lock();
        f.debug_struct("DeltaFifo")
            .field("queued", &inner.queue.len())
            .field("populated", &inner.populated)
            .field("closed", &inner.closed)
            .finish()
    }
}

impl<K: Object> Default for DeltaFifo<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Object> DeltaFifo<K> {
    /// A DeltaFifo with the default options and no known objects.
    pub fn new() -> Self {
        Self::with_options(DeltaFifoOptions::default())
    }
}

impl<K> DeltaFifo<K> {
    /// A DeltaFifo built from `options`.
    pub fn with_options(options: DeltaFifoOptions<K>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                items: HashMap::default(),
                queue: VecDeque::new(),
                populated: false,
                replacing: false,
                initial_population_count: 0,
                closed: false,
            }),
            notify: Notify::new(),
            key_func: options.key_func,
            known_objects: options.known_objects,
            emit_delta_type_replaced: options.emit_delta_type_replaced,
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
        let key = (self.key_func)(&obj)?;
        let mut inner = self.inner.lock();
        inner.mark_populated();
        self.queue_action(&mut inner, &key, Delta::new(DeltaType::Added, obj));
        Ok(())
    }

    /// Records that the object was updated.
    pub fn update(&self, obj: Arc<K>) -> Result<(), FifoError> {
        let key = (self.key_func)(&obj)?;
        let mut inner = self.inner.lock();
        inner.mark_populated();
        self.queue_action(&mut inner, &key, Delta::new(DeltaType::Updated, obj));
        Ok(())
    }

    /// Records that the object was deleted. Ignored when the key is neither
    /// queued nor held by the known objects (nothing to tell anyone).
    pub fn delete(&self, obj: impl Into<ObjectOrTombstone<K>>) -> Result<(), FifoError> {
        let obj = obj.into();
        let key = self.key_of(&obj)?;
        let mut inner = self.inner.lock();
        inner.mark_populated();
        let queued = inner.items.contains_key(key.as_str());
        let known = self
            .known_objects
            .as_ref()
            .is_some_and(|k| k.get_by_key(&key).is_some());
        if !queued && !known {
            return Ok(());
        }
        self.queue_action(
            &mut inner,
            &key,
            Delta {
                kind: DeltaType::Deleted,
                object: obj,
            },
        );
        Ok(())
    }

    /// Records a full list as of `resource_version`.
    ///
    /// Every listed object gets a `Replaced` delta (`Sync` in the legacy
    /// mode). Every key that is queued, or held by the known objects with
    /// nothing queued, and is absent from the list gets a `Deleted` delta
    /// whose object is a [`DeletedFinalStateUnknown`](crate::DeletedFinalStateUnknown) tombstone carrying the
    /// last state known. The first replace also fixes the population that
    /// [`has_synced`](Self::has_synced) waits for: the listed keys plus
    /// those deletions.
    ///
    /// If any object has no key, nothing is queued and the error names it.
    /// [`begin_replace`](Self::begin_replace) does the same with the objects
    /// handed over one at a time.
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
        let action = self.replace_action();
        let mut inner = self.inner.lock();
        for (key, obj) in keys.iter().zip(list) {
            self.queue_keyed(&mut inner, key, Delta::new(action, obj));
        }
        let listed: HashSet<&str, Hasher> = keys.iter().map(|k| k.as_ref()).collect();
        self.finish_replace(&mut inner, |key| listed.contains(key));
        Ok(())
    }

    /// A replace whose objects are handed over one at a time, as a list
    /// arrives: each [`push`](DeltaFifoReplace::push) queues its object's
    /// `Replaced` delta at once, so the consumer can apply it (and drop the
    /// object it replaces) while the rest of the list is still arriving, and
    /// [`finish`](DeltaFifoReplace::finish) queues the deletions the whole
    /// list implies and, the first time, completes the population that
    /// [`has_synced`](Self::has_synced) waits for. Queued in the end is what
    /// [`replace`](Self::replace) would have queued for the same list; only
    /// the moment each delta becomes visible differs.
    ///
    /// Dropped without `finish` (the list failed half-way), the objects
    /// pushed stay queued: each is a state the server really had, newer than
    /// the cache's. No deletion is inferred from a partial list, and
    /// `has_synced` stays false until a replace finishes.
    ///
    /// The Reflector feeds its lists through this, so that a relist holds
    /// the old cache and the objects in flight rather than the old cache and
    /// the whole new list.
    pub fn begin_replace(&self) -> DeltaFifoReplace<'_, K> {
        self.inner.lock().replacing = true;
        DeltaFifoReplace {
            fifo: self,
            action: self.replace_action(),
            listed: HashSet::default(),
            kept: HashSet::default(),
            keep_all: false,
            pushed: 0,
        }
    }

    fn replace_action(&self) -> DeltaType {
        if self.emit_delta_type_replaced {
            DeltaType::Replaced
        } else {
            DeltaType::Sync
        }
    }

    /// The end of a replace whose listed objects are queued: a deletion for
    /// every key queued or known that `listed` does not hold, then the
    /// population latch.
    fn finish_replace(&self, inner: &mut Inner<K>, listed: impl Fn(&str) -> bool) {
        // Deletions among the queue's own keys.
        let gone: Vec<(Arc<str>, Arc<K>)> = inner
            .items
            .iter()
            .filter(|(key, _)| !listed(key))
            .filter_map(|(key, deltas)| {
                let newest = deltas.newest()?;
                Some((Arc::clone(key), Arc::clone(newest.object.object())))
            })
            .collect();
        for (key, obj) in gone {
            self.queue_tombstone(inner, &key, obj);
        }

        // Deletions among the known objects that have nothing queued.
        if let Some(known) = &self.known_objects {
            for key in known.list_keys() {
                if listed(&key) || inner.items.get(key.as_str()).is_some_and(|d| !d.is_empty()) {
                    continue;
                }
                // A key that vanished between list_keys and get_by_key has
                // been deleted by the consumer already: nothing to report.
                let Some(obj) = known.get_by_key(&key) else {
                    continue;
                };
                self.queue_tombstone(inner, &key, obj);
            }
        }
        // Every key queued before this point counted towards the first
        // population (see `push_new`).
        inner.populated = true;
        inner.replacing = false;
    }

    /// Queues a `Sync` delta for every known object that has no delta queued
    /// (client-go's periodic resync). Does nothing without known objects.
    pub fn resync(&self) -> Result<(), FifoError> {
        let Some(known) = &self.known_objects else {
            return Ok(());
        };
        let mut inner = self.inner.lock();
        for key in known.list_keys() {
            let Some(obj) = known.get_by_key(&key) else {
                continue;
            };
            let id = (self.key_func)(&obj)?;
            if inner.items.get(id.as_str()).is_some_and(|d| !d.is_empty()) {
                continue;
            }
            self.queue_action(&mut inner, &id, Delta::new(DeltaType::Sync, obj));
        }
        Ok(())
    }

    /// Waits for a queued key and hands its deltas to `process` together with
    /// `is_in_initial_list` (whether the key belongs to the first replace,
    /// i.e. the queue had not synced yet when it was popped).
    ///
    /// `process` runs under the queue's lock (see the type's docs). When it
    /// returns `Err(Requeue(e))` the deltas are put back at the end of the
    /// queue unless the key was queued again meanwhile, and `pop` returns
    /// [`PopError::Requeued`]. After [`close`](Self::close), `pop` returns
    /// [`PopError::Closed`] once the queue is empty.
    pub async fn pop<T, E, F>(&self, process: F) -> Result<T, PopError<E>>
    where
        F: FnOnce(&Deltas<K>, bool) -> Result<T, Requeue<E>>,
    {
        self.pop_with_key(|_, deltas, initial| process(deltas, initial))
            .await
    }

    /// Like [`pop`](Self::pop), and also hands `process` the key, so that a
    /// consumer need not compute it again.
    pub async fn pop_with_key<T, E, F>(&self, process: F) -> Result<T, PopError<E>>
    where
        F: FnOnce(&str, &Deltas<K>, bool) -> Result<T, Requeue<E>>,
    {
        let mut process = Some(process);
        let mut registered = false;
        loop {
            // The first try takes no registration with the Notify: when keys
            // are queued, which is the busy case, popping costs one lock.
            let mut notified = pin!(self.notify.notified());
            if registered {
                notified.as_mut().enable();
            }
            {
                let mut inner = self.inner.lock();
                while let Some(key) = inner.queue.pop_front() {
                    let is_in_initial_list = !inner.has_synced();
                    if inner.initial_population_count > 0 {
                        inner.initial_population_count -= 1;
                    }
                    let Some(deltas) = inner.items.remove(&key) else {
                        continue;
                    };
                    let Some(process) = process.take() else {
                        unreachable!("process is consumed at most once")
                    };
                    return match process(&key, &deltas, is_in_initial_list) {
                        Ok(value) => Ok(value),
                        Err(Requeue(err)) => {
                            self.add_if_not_present(&mut inner, key, deltas);
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
            // Not registered yet: register, then look at the queue again
            // before waiting, so that a push in between is not missed.
            registered = true;
        }
    }

    /// Puts `deltas` back under `key` unless the key is queued already:
    /// client-go's `AddIfNotPresent`, for a consumer that took deltas out by
    /// other means.
    pub fn requeue(&self, key: &str, deltas: Deltas<K>) {
        let mut inner = self.inner.lock();
        self.add_if_not_present(&mut inner, Arc::from(key), deltas);
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
    /// has arrived and every key it queued has been popped.
    pub fn has_synced(&self) -> bool {
        self.inner.lock().has_synced()
    }

    /// The number of keys queued.
    pub fn len(&self) -> usize {
        self.inner.lock().queue.len()
    }

    /// Whether no key is queued.
    pub fn is_empty(&self) -> bool {
        self.inner.lock().queue.is_empty()
    }

    /// The queued keys, in the order they will be popped.
    pub fn list_keys(&self) -> Vec<String> {
        self.inner
            .lock()
            .queue
            .iter()
            .map(|k| k.to_string())
            .collect()
    }

    /// A copy of the deltas queued under `key`.
    pub fn get_by_key(&self, key: &str) -> Option<Deltas<K>> {
        self.inner.lock().items.get(key).cloned()
    }

    fn queue_tombstone(&self, inner: &mut Inner<K>, key: &str, obj: Arc<K>) {
        self.queue_action(inner, key, Delta::tombstone(key, obj));
    }

    fn queue_action(&self, inner: &mut Inner<K>, key: &str, delta: Delta<K>) {
        if let Some(deltas) = inner.items.get_mut(key) {
            deltas.push(delta);
            return;
        }
        // Room for the update that usually follows an add.
        let mut deltas = Vec::with_capacity(2);
        deltas.push(delta);
        self.push_new(inner, Arc::from(key), Deltas(deltas));
    }

    /// As `queue_action`, with the key already shared: a new entry takes
    /// a clone of the `Arc` rather than a copy of the string.
    fn queue_keyed(&self, inner: &mut Inner<K>, key: &Arc<str>, delta: Delta<K>) {
        if let Some(deltas) = inner.items.get_mut(key) {
            deltas.push(delta);
            return;
        }
        let mut deltas = Vec::with_capacity(2);
        deltas.push(delta);
        self.push_new(inner, Arc::clone(key), Deltas(deltas));
    }

    fn add_if_not_present(&self, inner: &mut Inner<K>, key: Arc<str>, deltas: Deltas<K>) {
        inner.mark_populated();
        if inner.items.contains_key(&key) {
            return;
        }
        self.push_new(inner, key, deltas);
    }

    /// Queues a key that is not queued, waking waiters if the queue was empty.
    /// Until the first replace finishes, every key queued belongs to the
    /// first population: `has_synced` waits for it to be popped.
    fn push_new(&self, inner: &mut Inner<K>, key: Arc<str>, deltas: Deltas<K>) {
        if !inner.populated {
            inner.initial_population_count += 1;
        }
        let was_empty = inner.queue.is_empty();
        inner.queue.push_back(Arc::clone(&key));
        inner.items.insert(key, deltas);
        if was_empty {
            self.notify.notify_waiters();
        }
    }
}

/// A replace in progress on a [`DeltaFifo`], from
/// [`DeltaFifo::begin_replace`]: the listed keys so far.
pub struct DeltaFifoReplace<'a, K> {
    fifo: &'a DeltaFifo<K>,
    action: DeltaType,
    listed: HashSet<Arc<str>, Hasher>,
    /// Listed keys whose objects could not be read: no deletion for them.
    kept: HashSet<Arc<str>, Hasher>,
    /// A listed object's key could not be read: no deletion at all.
    keep_all: bool,
    pushed: usize,
}

impl<K> fmt::Debug for DeltaFifoReplace<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeltaFifoReplace")
            .field("listed", &self.listed.len())
            .finish()
    }
}

impl<K> DeltaFifoReplace<'_, K> {
    /// Queues the next listed object's `Replaced` delta (`Sync` in the
    /// legacy mode). An object without a key is refused with an error
    /// naming it and its position among the objects pushed; nothing is
    /// queued for it and the replace goes on.
    pub fn push(&mut self, obj: Arc<K>) -> Result<(), FifoError> {
        self.push_all(vec![obj]).pop().map_or(Ok(()), Err)
    }

    /// Queues several listed objects under one lock (what
    /// [`push`](Self::push) does for each, without a lock and a wake-up of
    /// the consumer per object). Returns the objects refused, each error
    /// naming its object; the others are queued.
    pub fn push_all(&mut self, objs: Vec<Arc<K>>) -> Vec<FifoError> {
        let mut refused = Vec::new();
        let keyed: Vec<(Arc<str>, Arc<K>)> = objs
            .into_iter()
            .filter_map(|obj| {
                let index = self.pushed;
                self.pushed += 1;
                match (self.fifo.key_func)(&obj) {
                    Ok(key) => Some((Arc::from(key), obj)),
                    Err(source) => {
                        refused.push(FifoError::ReplaceKey { index, source });
                        None
                    }
                }
            })
            .collect();
        {
            let mut inner = self.fifo.inner.lock();
            for (key, obj) in &keyed {
                self.fifo
                    .queue_keyed(&mut inner, key, Delta::new(self.action, Arc::clone(obj)));
            }
        }
        self.listed.extend(keyed.into_iter().map(|(key, _)| key));
        refused
    }

    /// A listed object that could not be read (it did not decode) under
    /// `key`: the key counts as listed, so [`finish`](Self::finish) infers
    /// no deletion for it and the version the consumer holds stays, as
    /// it does for a key whose object was pushed. Nothing is queued.
    pub fn keep(&mut self, key: &str) {
        self.kept.insert(Arc::from(key));
    }

    /// A listed object whose key could not be read either: any key might
    /// be its own, so [`finish`](Self::finish) infers no deletion at all.
    pub fn keep_all(&mut self) {
        self.keep_all = true;
    }

    /// How many distinct keys have been pushed.
    pub fn len(&self) -> usize {
        self.listed.len()
    }

    /// Whether nothing has been pushed.
    pub fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }

    /// The list starts again from its beginning (a list that fell back to
    /// another one, say after its continue token expired): the objects
    /// pushed so far stay queued, but no longer count as listed, so a key
    /// the new list lacks is found deleted at [`finish`](Self::finish).
    pub fn restart(&mut self) {
        self.listed.clear();
        self.kept.clear();
        self.keep_all = false;
    }

    /// The list is complete: queues a `Deleted` delta (with a
    /// [`DeletedFinalStateUnknown`](crate::DeletedFinalStateUnknown) tombstone) for every key queued or
    /// known that was neither pushed nor [kept](Self::keep), as
    /// [`DeltaFifo::replace`] does.
    pub fn finish(self, _resource_version: &str) {
        let mut inner = self.fifo.inner.lock();
        self.fifo.finish_replace(&mut inner, |key| {
            self.keep_all || self.listed.contains(key) || self.kept.contains(key)
        });
        // Released before `self` is dropped, whose Drop takes the lock.
        drop(inner);
    }
}

impl<K> Drop for DeltaFifoReplace<'_, K> {
    fn drop(&mut self) {
        // Finished or abandoned: no replace is under way any more.
        self.fifo.inner.lock().replacing = false;
    }
}

impl<K> Inner<K> {
    /// Something other than a replace arrived: the queue is populated, as
    /// client-go's is, unless the first replace is under way, whose
    /// population that would cut short.
    fn mark_populated(&mut self) {
        if !self.replacing {
            self.populated = true;
        }
    }

    fn has_synced(&self) -> bool {
        self.populated && self.initial_population_count == 0
    }
}
