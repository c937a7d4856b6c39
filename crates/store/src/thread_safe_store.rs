//! A keyed map of `Arc<K>` with secondary indexes, safe to share between threads.
//!
//! One `RwLock` guards the items and every index together, so a reader never
//! sees an object without its index entries or the other way round. Each item
//! remembers the index values computed when it was stored: an update or
//! delete removes exactly those entries, so an object moving from one index
//! value to another leaves nothing stale behind, whatever its index function
//! would say now, and an update whose values did not change touches no index.
//!
//! Index functions are user code. One that returns an error or panics for an
//! object does not stop the write: the object is stored (the store must hold
//! what the server has, or it silently serves a stale object) and it is left
//! out of that one index; the write reports an [`IndexError`] naming the index
//! and the key. A later write of the same key whose index function succeeds
//! indexes it again. A panic is caught before it can unwind through the lock.
//!
//! A store made with [`ThreadSafeStore::compact`] keeps each object encoded
//! (see [`compact`](crate::Compact)): encoding happens before the write lock
//! is taken and decoding after a read lock is released, so the lock is held
//! no longer than for whole objects; `add_indexers` on a populated compact
//! store is the exception (it decodes every object under the lock).
//!
//! The store also keeps the resourceVersion its content was last synced to
//! (client-go's `LastStoreSyncResourceVersion`, since v0.36): set by a write
//! that names one (`*_at`), by [`replace_at`](ThreadSafeStore::replace_at)
//! and by [`bookmark`](ThreadSafeStore::bookmark), under the same lock as
//! the content. So once a reader has seen it at or past a version, every
//! later read sees the content of that version or newer: "has the cache
//! caught up with my write" is one comparison.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::compact::{CompactState, Read, Stored};
use crate::{
    BoxError, Compact, CompactStats, IndexError, IndexFunc, IndexFuncPanic, Indexers, StoreError,
};

type Hasher = foldhash::fast::RandomState;
type Map<K, V> = HashMap<K, V, Hasher>;
type KeySet = HashSet<Arc<str>, Hasher>;
/// A map or set holding fewer than an eighth of what it has room for is
/// shrunk to twice its size (above [`SHRINK_FLOOR`]), so that a cache
/// emptied by deletions (its CRD deleted, a namespace gone) returns the
/// memory of its table: a hash table never shrinks by itself (nor does
/// Go's map, under client-go). Amortized: a shrunk table holds at least
/// twice its entries, so it must lose half of them or more again before
/// the next rehash.
const SHRINK_FLOOR: usize = 1024;

/// Anything [`shrink_if_sparse`] can shrink.
trait Sparse {
    fn len_and_capacity(&self) -> (usize, usize);
    fn shrink_to(&mut self, min: usize);
}

impl<K: Eq + std::hash::Hash, V> Sparse for Map<K, V> {
    fn len_and_capacity(&self) -> (usize, usize) {
        (self.len(), self.capacity())
    }
    fn shrink_to(&mut self, min: usize) {
        HashMap::shrink_to(self, min);
    }
}

impl Sparse for KeySet {
    fn len_and_capacity(&self) -> (usize, usize) {
        (self.len(), self.capacity())
    }
    fn shrink_to(&mut self, min: usize) {
        HashSet::shrink_to(self, min);
    }
}

/// See [`SHRINK_FLOOR`].
fn shrink_if_sparse(table: &mut impl Sparse) {
    let (len, capacity) = table.len_and_capacity();
    if capacity > SHRINK_FLOOR && len < capacity / 8 {
        table.shrink_to((len * 2).max(SHRINK_FLOOR / 2));
    }
}

/// The values of each index for one object, in `Inner::indexers` order.
type IndexValues = Box<[Box<[Arc<str>]>]>;

/// A thread-safe keyed store with named indexes: client-go's `ThreadSafeStore`.
///
/// Keys are given by the caller; [`Indexer`](crate::Indexer) wraps this with a
/// key function. Every mutating call is atomic. When an index function fails
/// (or panics) for an object, the object is stored anyway, left out of that
/// index, and the call reports it ([`StoreError::Unindexed`], or
/// [`Upserted::unindexed`]).
pub struct ThreadSafeStore<K> {
    inner: RwLock<Inner<K>>,
    /// Set for a compact store: its codec and decoded-object cache.
    compact: Option<CompactState<K>>,
}

/// What [`ThreadSafeStore::upsert`] did.
#[derive(Debug)]
#[must_use = "index functions may have failed: check `unindexed`"]
pub struct Upserted<K> {
    /// The object the new one replaced, if the key was taken.
    pub previous: Option<Arc<K>>,
    /// The indexes the new object was left out of, because their index
    /// function failed or panicked for it; empty normally.
    pub unindexed: Vec<IndexError>,
}

impl<K> Upserted<K> {
    /// `Ok(previous)` when every index function succeeded, otherwise
    /// [`StoreError::Unindexed`] (the object is stored all the same).
    pub fn into_result(self) -> Result<Option<Arc<K>>, StoreError> {
        if self.unindexed.is_empty() {
            Ok(self.previous)
        } else {
            Err(StoreError::Unindexed(self.unindexed))
        }
    }
}

struct Entry<K> {
    obj: Stored<K>,
    index_values: IndexValues,
}

/// The content a [`ThreadSafeStore::swap_at`] swapped out: what each key
/// held before the swap, read (and decoded, from a compact store) one key
/// at a time. Dropping it frees the old content.
pub struct Swapped<'a, K> {
    store: &'a ThreadSafeStore<K>,
    old: Map<Arc<str>, Entry<K>>,
    /// The indexes new objects were left out of, because their index
    /// function failed or panicked for them; empty normally.
    pub unindexed: Vec<IndexError>,
}

impl<K> Swapped<'_, K> {
    /// What `key` held before the swap.
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        let (key, entry) = self.old.get_key_value(key)?;
        self.store.finish(self.store.read(key, &entry.obj))
    }

    /// The keys held before the swap and swapped out (not those kept), in
    /// no particular order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &Arc<str>> {
        self.old.keys()
    }

    /// How many keys were swapped out.
    pub fn len(&self) -> usize {
        self.old.len()
    }

    /// Whether nothing was swapped out.
    pub fn is_empty(&self) -> bool {
        self.old.is_empty()
    }
}

impl<K> std::fmt::Debug for ThreadSafeStore<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.read();
        let indexes: Vec<&str> = inner.indexers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("ThreadSafeStore")
            .field("len", &inner.items.len())
            .field("indexes", &indexes)
            .field("compact", &self.compact.is_some())
            .finish()
    }
}

impl<K> std::fmt::Debug for Swapped<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Swapped")
            .field("old", &self.old.len())
            .field("unindexed", &self.unindexed.len())
            .finish()
    }
}

struct Inner<K> {
    items: Map<Arc<str>, Entry<K>>,
    /// The resourceVersion the content was last synced to (client-go's
    /// `LastStoreSyncResourceVersion`), changed under the same lock as the
    /// content it describes.
    resource_version: Option<String>,
    indexers: Vec<(String, IndexFunc<K>)>,
    /// Per index (same order as `indexers`): index value -> keys.
    indices: Vec<Map<Arc<str>, KeySet>>,
}

impl<K> Default for ThreadSafeStore<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> ThreadSafeStore<K> {
    /// An empty store without indexes.
    pub fn new() -> Self {
        Self {
            inner: RwLock::new(Inner {
                items: Map::default(),
                resource_version: None,
                indexers: Vec::new(),
                indices: Vec::new(),
            }),
            compact: None,
        }
    }

    /// An empty compact store with the given indexes: each object is kept
    /// in `compact`'s encoding and decoded when read.
    pub fn compact(indexers: Indexers<K>, compact: Compact<K>) -> Self {
        let store = Self {
            compact: Some(CompactState::new(compact)),
            ..Self::new()
        };
        // Cannot fail: the store is empty and the names of a map are distinct.
        let _ = store.add_indexers(indexers);
        store
    }

    /// Whether objects are kept encoded (a store made with
    /// [`compact`](Self::compact)).
    pub fn is_compact(&self) -> bool {
        self.compact.is_some()
    }

    /// What a compact store holds and how its reads went; `None` for a
    /// store of whole objects.
    pub fn compact_stats(&self) -> Option<CompactStats> {
        let compact = self.compact.as_ref()?;
        let inner = self.inner.read();
        Some(compact.stats(inner.items.values().map(|e| &e.obj)))
    }

    /// The form `obj` is stored in: itself, or its encoding in a compact store.
    fn store_form(&self, key: &str, obj: &Arc<K>) -> Stored<K> {
        match &self.compact {
            Some(compact) => compact.store_form(key, obj),
            None => Stored::Whole(Arc::clone(obj)),
        }
    }

    /// What a read under the lock finds for `key`; see [`finish`](Self::finish).
    fn read(&self, key: &Arc<str>, stored: &Stored<K>) -> Read<K> {
        match (stored, &self.compact) {
            (Stored::Whole(obj), _) => Read::Ready(Arc::clone(obj)),
            (_, Some(compact)) => compact.read(key, stored, None),
            // Only a compact store holds encodings; finish gives None.
            (Stored::Encoded { bytes, version }, None) => Read::Undecoded {
                key: Arc::clone(key),
                bytes: Arc::clone(bytes),
                version: *version,
            },
        }
    }

    /// The object of a read, decoded (with the lock released) if need be.
    fn finish(&self, read: Read<K>) -> Option<Arc<K>> {
        match (read, &self.compact) {
            (Read::Ready(obj), _) => Some(obj),
            (read, Some(compact)) => compact.finish(read),
            (Read::Undecoded { .. }, None) => None,
        }
    }

    fn finish_all(&self, reads: Vec<Read<K>>) -> Vec<Arc<K>> {
        reads.into_iter().filter_map(|r| self.finish(r)).collect()
    }

    /// An empty store with the given indexes.
    pub fn with_indexers(indexers: Indexers<K>) -> Self {
        let store = Self::new();
        // Cannot fail: the store is empty and the names of a map are distinct.
        let _ = store.add_indexers(indexers);
        store
    }

    /// Adds indexes, indexing the objects already stored (as client-go since
    /// v0.30). Refused, changing nothing, when a name is already taken.
    /// [`StoreError::Unindexed`] when a new index function fails for stored
    /// objects: the indexes are added, with those objects left out of them.
    pub fn add_indexers(&self, new: Indexers<K>) -> Result<(), StoreError> {
        let mut inner = self.inner.write();
        if let Some(name) = new
            .keys()
            .find(|name| inner.indexers.iter().any(|(n, _)| n == *name))
        {
            return Err(StoreError::IndexerConflict(name.clone()));
        }
        let mut new: Vec<_> = new.into_iter().collect();
        new.sort_by(|a, b| a.0.cmp(&b.0));
        let mut unindexed = Vec::new();
        for (name, func) in new {
            let mut index: Map<Arc<str>, KeySet> = Map::default();
            for (key, entry) in inner.items.iter_mut() {
                let indexed = match self.finish(self.read(key, &entry.obj)) {
                    Some(obj) => call_index_func(&func, &obj),
                    None => Err("the compact store could not decode the object".into()),
                };
                let values: Box<[Arc<str>]> = match indexed {
                    Ok(values) => normalized(values),
                    Err(source) => {
                        unindexed.push(IndexError {
                            index: name.clone(),
                            key: key.to_string(),
                            source,
                        });
                        Box::default()
                    }
                };
                for value in values.iter() {
                    index
                        .entry(Arc::clone(value))
                        .or_default()
                        .insert(Arc::clone(key));
                }
                // Index values are kept in `indexers` order: append this one.
                let mut all = std::mem::take(&mut entry.index_values).into_vec();
                all.push(values);
                entry.index_values = all.into_boxed_slice();
            }
            inner.indexers.push((name, func));
            inner.indices.push(index);
        }
        if unindexed.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Unindexed(unindexed))
        }
    }

    /// The names of the indexes.
    pub fn indexer_names(&self) -> Vec<String> {
        self.inner
            .read()
            .indexers
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Inserts or replaces the object under `key`, updating every index.
    /// [`StoreError::Unindexed`] when index functions failed: the object is
    /// stored, but missing from those indexes.
    pub fn add(&self, key: &str, obj: Arc<K>) -> Result<(), StoreError> {
        self.update(key, obj)
    }

    /// Inserts or replaces the object under `key`, updating every index.
    /// [`StoreError::Unindexed`] when index functions failed: the object is
    /// stored, but missing from those indexes.
    pub fn update(&self, key: &str, obj: Arc<K>) -> Result<(), StoreError> {
        self.upsert(key, obj).into_result().map(|_| ())
    }

    /// Inserts or replaces the object under `key`, updating every index;
    /// says what it replaced and which index functions failed for it.
    pub fn upsert(&self, key: &str, obj: Arc<K>) -> Upserted<K> {
        self.upsert_at(key, obj, None)
    }

    /// [`upsert`](Self::upsert), and the store is synced to
    /// `resource_version` (the object's) if one is given.
    pub fn upsert_at(&self, key: &str, obj: Arc<K>, resource_version: Option<&str>) -> Upserted<K> {
        let mut stored = self.store_form(key, &obj);
        let mut inner = self.inner.write();
        inner.synced_to(resource_version);
        if let (Some(compact), Stored::Encoded { version, .. }) = (&self.compact, &mut stored) {
            // Versions follow the order writes take the lock in.
            *version = compact.next_version();
        }
        let (values, unindexed) = compute_index_values(&inner.indexers, key, &obj);
        let previous = inner.put(key, stored.clone(), values);
        let previous = match &self.compact {
            // A store of whole objects holds no encodings.
            None => previous.and_then(|old| match old {
                Stored::Whole(obj) => Some(Read::Ready(obj)),
                Stored::Encoded { .. } => None,
            }),
            Some(compact) => {
                // The key as stored: the decoded cache shares it.
                let key = inner
                    .items
                    .get_key_value(key)
                    .map_or_else(|| Arc::from(key), |(k, _)| Arc::clone(k));
                let cached = compact.written(&key, &stored, &obj);
                previous.map(|old| compact.read(&key, &old, cached))
            }
        };
        drop(inner);
        Upserted {
            previous: previous.and_then(|read| self.finish(read)),
            unindexed,
        }
    }

    /// Removes the object under `key` and its index entries; returns it.
    pub fn delete(&self, key: &str) -> Option<Arc<K>> {
        self.delete_at(key, None)
    }

    /// [`delete`](Self::delete), and the store is synced to
    /// `resource_version` (the deleted object's last) if one is given,
    /// whether or not the key was held.
    pub fn delete_at(&self, key: &str, resource_version: Option<&str>) -> Option<Arc<K>> {
        let mut inner = self.inner.write();
        inner.synced_to(resource_version);
        let (key, entry) = self.take(&mut inner, key)?;
        let read = self.read(&key, &entry.obj);
        drop(inner);
        self.finish(read)
    }

    /// Removes the object under `key` and its index entries, without handing
    /// it back (a compact store need not decode it); whether there was one.
    pub fn remove(&self, key: &str) -> bool {
        self.remove_at(key, None)
    }

    /// [`remove`](Self::remove), and the store is synced to
    /// `resource_version` if one is given.
    pub fn remove_at(&self, key: &str, resource_version: Option<&str>) -> bool {
        let mut inner = self.inner.write();
        inner.synced_to(resource_version);
        self.take(&mut inner, key).is_some()
    }

    /// The resourceVersion the content was last synced to: the last one
    /// given to a write, a replace or a bookmark; `None` before any.
    pub fn last_store_sync_resource_version(&self) -> Option<String> {
        self.inner.read().resource_version.clone()
    }

    /// Records that the content is synced to `resource_version` with no
    /// object changed (a watch bookmark).
    pub fn bookmark(&self, resource_version: &str) {
        self.inner.write().synced_to(Some(resource_version));
    }

    /// Takes `key`'s entry out of the items, its indexes and the decoded cache.
    fn take(&self, inner: &mut Inner<K>, key: &str) -> Option<(Arc<str>, Entry<K>)> {
        let (key, entry) = inner.items.remove_entry(key)?;
        shrink_if_sparse(&mut inner.items);
        inner.unindex(&key, &entry.index_values);
        if let Some(compact) = &self.compact {
            compact.removed(&key);
        }
        Some((key, entry))
    }

    /// The object under `key`.
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        let inner = self.inner.read();
        let (key, entry) = inner.items.get_key_value(key)?;
        let read = self.read(key, &entry.obj);
        drop(inner);
        self.finish(read)
    }

    /// Whether an object is stored under `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        self.inner.read().items.contains_key(key)
    }

    /// Every object, in no particular order.
    pub fn list(&self) -> Vec<Arc<K>> {
        let inner = self.inner.read();
        let reads = inner
            .items
            .iter()
            .map(|(key, e)| self.read(key, &e.obj))
            .collect();
        drop(inner);
        self.finish_all(reads)
    }

    /// Every key, in no particular order.
    pub fn list_keys(&self) -> Vec<String> {
        self.inner
            .read()
            .items
            .keys()
            .map(|k| k.to_string())
            .collect()
    }

    /// The number of objects.
    pub fn len(&self) -> usize {
        self.inner.read().items.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.read().items.is_empty()
    }

    /// Swaps the whole content for `items` at once and rebuilds the indexes.
    /// When a key appears twice, the later object wins.
    /// [`StoreError::Unindexed`] when index functions failed: the content is
    /// swapped all the same, with those objects missing from those indexes.
    pub fn replace<I, S>(&self, items: I) -> Result<(), StoreError>
    where
        I: IntoIterator<Item = (S, Arc<K>)>,
        S: Into<Arc<str>>,
    {
        self.replace_at(items, "")
    }

    /// [`replace`](Self::replace) with a list at `resource_version`: the
    /// store is synced to it in the same step as the content is swapped (an
    /// empty one leaves the version as it was). Keys may be given as
    /// `String`s or as `Arc<str>`s (kept as they are).
    pub fn replace_at<I, S>(&self, items: I, resource_version: &str) -> Result<(), StoreError>
    where
        I: IntoIterator<Item = (S, Arc<K>)>,
        S: Into<Arc<str>>,
    {
        let items: Vec<(Arc<str>, Arc<K>)> =
            items.into_iter().map(|(k, o)| (k.into(), o)).collect();
        let swapped = self.swap_at(items, &|_| false, resource_version);
        let unindexed = swapped.unindexed;
        // The old content is freed with the lock released.
        drop(swapped.old);
        if unindexed.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Unindexed(unindexed))
        }
    }

    /// [`replace_at`](Self::replace_at), giving back the content it swapped
    /// out, to read what each key held before the swap (decoded only when
    /// read, from a compact store) after readers already see the new one.
    /// A key held before, absent from `items` and for which `keep` is true
    /// stays as it is held (not encoded again) and is not in the
    /// swapped-out content; its index values are computed again, as
    /// client-go's Replace re-indexes every object (an index function may
    /// read something outside the object), from the object decoded before
    /// the write lock is taken. `keep` runs under the store's lock and
    /// must not read the store.
    pub fn swap_at(
        &self,
        items: Vec<(Arc<str>, Arc<K>)>,
        keep: &dyn Fn(&str) -> bool,
        resource_version: &str,
    ) -> Swapped<'_, K> {
        // Index values are computed before the lock is taken for writing, so
        // readers are blocked only for the swap itself.
        let indexers = self.inner.read().indexers.clone();
        let mut entries: Map<Arc<str>, Entry<K>> =
            Map::with_capacity_and_hasher(items.len(), Hasher::default());
        let mut unindexed = Vec::new();
        for (key, obj) in &items {
            let (values, failed) = compute_index_values(&indexers, key, obj);
            // A key given twice: only the last object's failures count.
            unindexed.retain(|e: &IndexError| *e.key != **key);
            unindexed.extend(failed);
            entries.insert(
                Arc::clone(key),
                Entry {
                    obj: self.store_form(key, obj),
                    index_values: values,
                },
            );
        }
        // The objects kept, indexed again with the lock released; one
        // written meanwhile is indexed under the lock below.
        type Reindexed<K> = (Stored<K>, IndexValues, Vec<IndexError>);
        let mut reindexed: Map<Arc<str>, Reindexed<K>> = Map::default();
        if !indexers.is_empty() {
            let held: Vec<(Arc<str>, Stored<K>)> = {
                let inner = self.inner.read();
                inner
                    .items
                    .iter()
                    .filter(|(key, _)| !entries.contains_key(key.as_ref()) && keep(key))
                    .map(|(key, entry)| (Arc::clone(key), entry.obj.clone()))
                    .collect()
            };
            for (key, stored) in held {
                let Some(obj) = self.finish(self.read(&key, &stored)) else {
                    continue;
                };
                let (values, failed) = compute_index_values(&indexers, &key, &obj);
                reindexed.insert(key, (stored, values, failed));
            }
        }
        let mut indices: Vec<Map<Arc<str>, KeySet>> =
            indexers.iter().map(|_| Map::default()).collect();
        for (key, entry) in &entries {
            for (index, values) in indices.iter_mut().zip(entry.index_values.iter()) {
                for value in values.iter() {
                    index
                        .entry(Arc::clone(value))
                        .or_default()
                        .insert(Arc::clone(key));
                }
            }
        }
        let mut inner = self.inner.write();
        if inner.indexers.len() != indexers.len() {
            // add_indexers ran meanwhile: redo with every index.
            drop(inner);
            drop(entries);
            return self.swap_at(items, keep, resource_version);
        }
        // Asked before anything changes: a `keep` that panics leaves the
        // store as it was.
        let kept: Vec<Arc<str>> = inner
            .items
            .keys()
            .filter(|key| !entries.contains_key(key.as_ref()) && keep(key))
            .cloned()
            .collect();
        let mut old = std::mem::take(&mut inner.items);
        for key in kept {
            let Some((key, mut entry)) = old.remove_entry(key.as_ref()) else {
                continue;
            };
            if !indexers.is_empty() {
                match reindexed.remove(&key) {
                    Some((stored, values, failed)) if stored.same(&entry.obj) => {
                        unindexed.extend(failed);
                        entry.index_values = values;
                    }
                    _ => {
                        // Written since it was read: indexed here.
                        if let Some(obj) = self.finish(self.read(&key, &entry.obj)) {
                            let (values, failed) = compute_index_values(&indexers, &key, &obj);
                            unindexed.extend(failed);
                            entry.index_values = values;
                        }
                    }
                }
            }
            for (index, values) in indices.iter_mut().zip(entry.index_values.iter()) {
                for value in values.iter() {
                    index
                        .entry(Arc::clone(value))
                        .or_default()
                        .insert(Arc::clone(&key));
                }
            }
            entries.insert(key, entry);
        }
        inner.items = entries;
        inner.synced_to(Some(resource_version));
        inner.indices = indices;
        if let Some(compact) = &self.compact {
            compact.cleared();
        }
        drop(inner);
        Swapped {
            store: self,
            old,
            unindexed,
        }
    }

    /// Objects that share at least one value of index `index_name` with `obj`.
    pub fn index(&self, index_name: &str, obj: &K) -> Result<Vec<Arc<K>>, StoreError> {
        let inner = self.inner.read();
        let i = inner.index_position(index_name)?;
        let values = call_index_func(&inner.indexers[i].1, obj).map_err(|source| {
            StoreError::IndexFunc(IndexError {
                index: index_name.to_owned(),
                key: String::from("<query object>"),
                source,
            })
        })?;
        let index = &inner.indices[i];
        let reads = if values.len() == 1 {
            index
                .get(values[0].as_str())
                .map(|keys| self.reads(&inner, keys.iter()))
                .unwrap_or_default()
        } else {
            let mut keys: HashSet<&Arc<str>, Hasher> = HashSet::default();
            for value in &values {
                if let Some(set) = index.get(value.as_str()) {
                    keys.extend(set.iter());
                }
            }
            self.reads(&inner, keys.into_iter())
        };
        drop(inner);
        Ok(self.finish_all(reads))
    }

    /// Objects whose index `index_name` includes `value`.
    pub fn by_index(&self, index_name: &str, value: &str) -> Result<Vec<Arc<K>>, StoreError> {
        let inner = self.inner.read();
        let i = inner.index_position(index_name)?;
        let reads = inner.indices[i]
            .get(value)
            .map(|keys| self.reads(&inner, keys.iter()))
            .unwrap_or_default();
        drop(inner);
        Ok(self.finish_all(reads))
    }

    /// Keys of the objects whose index `index_name` includes `value`, sorted
    /// (client-go's `sets.List`).
    pub fn index_keys(&self, index_name: &str, value: &str) -> Result<Vec<String>, StoreError> {
        let inner = self.inner.read();
        let i = inner.index_position(index_name)?;
        let mut keys: Vec<String> = inner.indices[i]
            .get(value)
            .map(|keys| keys.iter().map(|k| k.to_string()).collect())
            .unwrap_or_default();
        keys.sort_unstable();
        Ok(keys)
    }

    /// Every value of index `index_name` that at least one object has; empty
    /// when the index does not exist, as in client-go.
    pub fn list_index_func_values(&self, index_name: &str) -> Vec<String> {
        let inner = self.inner.read();
        match inner.index_position(index_name) {
            Ok(i) => inner.indices[i].keys().map(|v| v.to_string()).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Nothing to do for a store held in memory; kept for client-go parity.
    pub fn resync(&self) {}

    /// Reads of the objects under `keys`, under the lock `inner` is read with.
    fn reads<'a>(
        &self,
        inner: &Inner<K>,
        keys: impl Iterator<Item = &'a Arc<str>>,
    ) -> Vec<Read<K>> {
        keys.filter_map(|k| inner.items.get_key_value(k))
            .map(|(k, e)| self.read(k, &e.obj))
            .collect()
    }
}

/// Calls one index function; a panic becomes an [`IndexFuncPanic`] error.
fn call_index_func<K>(func: &IndexFunc<K>, obj: &K) -> Result<Vec<String>, BoxError> {
    match catch_unwind(AssertUnwindSafe(|| func(obj))) {
        Ok(result) => result,
        Err(panic) => Err(Box::new(IndexFuncPanic(panic_message(panic.as_ref())))),
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// One index function's values for an object, sorted and without repeats.
fn normalized(mut values: Vec<String>) -> Box<[Arc<str>]> {
    values.sort_unstable();
    values.dedup();
    values.into_iter().map(Arc::from).collect()
}

/// The values of every index for `obj`; an index whose function fails gets
/// no values (the object is left out of it) and an [`IndexError`].
fn compute_index_values<K>(
    indexers: &[(String, IndexFunc<K>)],
    key: &str,
    obj: &K,
) -> (IndexValues, Vec<IndexError>) {
    let mut failed = Vec::new();
    let values = indexers
        .iter()
        .map(|(name, func)| match call_index_func(func, obj) {
            Ok(values) => normalized(values),
            Err(source) => {
                failed.push(IndexError {
                    index: name.clone(),
                    key: key.to_owned(),
                    source,
                });
                Box::default()
            }
        })
        .collect();
    (values, failed)
}

impl<K> Inner<K> {
    /// Records the version the content is synced to, if one is given; an
    /// empty one is none (an object not yet written, a list without one).
    fn synced_to(&mut self, resource_version: Option<&str>) {
        let Some(rv) = resource_version.filter(|rv| !rv.is_empty()) else {
            return;
        };
        // Reuses the buffer: no allocation per write once it is long enough.
        let held = self.resource_version.get_or_insert_with(String::new);
        held.clear();
        held.push_str(rv);
    }

    fn index_position(&self, index_name: &str) -> Result<usize, StoreError> {
        self.indexers
            .iter()
            .position(|(n, _)| n == index_name)
            .ok_or_else(|| StoreError::IndexNotFound(index_name.to_owned()))
    }

    /// Stores `obj` under `key` with its index `values`; returns what was there.
    fn put(&mut self, key: &str, obj: Stored<K>, values: IndexValues) -> Option<Stored<K>> {
        if let Some(entry) = self.items.get_mut(key)
            && entry.index_values == values
        {
            // The common update: same index values, no index work.
            return Some(std::mem::replace(&mut entry.obj, obj));
        }
        let stored_key = self.items.get_key_value(key).map(|(k, _)| Arc::clone(k));
        let key = stored_key.unwrap_or_else(|| Arc::from(key));
        let entry = Entry {
            obj,
            index_values: values.clone(),
        };
        let old = self.items.insert(Arc::clone(&key), entry);
        if let Some(old) = &old {
            self.unindex(&key, &old.index_values);
        }
        self.index(&key, &values);
        old.map(|old| old.obj)
    }

    fn index(&mut self, key: &Arc<str>, values: &[Box<[Arc<str>]>]) {
        for (index, values) in self.indices.iter_mut().zip(values) {
            for value in values.iter() {
                index
                    .entry(Arc::clone(value))
                    .or_default()
                    .insert(Arc::clone(key));
            }
        }
    }

    fn unindex(&mut self, key: &str, values: &[Box<[Arc<str>]>]) {
        for (index, values) in self.indices.iter_mut().zip(values) {
            for value in values.iter() {
                if let Some(set) = index.get_mut(value) {
                    set.remove(key);
                    // Empty sets are dropped so that churn of index values
                    // cannot grow the index without bound.
                    if set.is_empty() {
                        index.remove(value);
                        shrink_if_sparse(index);
                    } else {
                        shrink_if_sparse(set);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace_indexers;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn config_map(name: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        })
    }

    /// The room of the items table, of the namespace index's one set, and
    /// of the name index's table (one value per object).
    fn capacities(store: &ThreadSafeStore<ConfigMap>) -> (usize, usize, usize) {
        let inner = store.inner.read();
        let namespace = inner.indexers.iter().position(|(n, _)| n == "namespace");
        let name = inner.indexers.iter().position(|(n, _)| n == "name");
        let set = inner.indices[namespace.unwrap()]
            .get("ns")
            .map_or(0, HashSet::capacity);
        let names = inner.indices[name.unwrap()].capacity();
        (inner.items.capacity(), set, names)
    }

    #[test]
    fn a_store_emptied_by_deletions_gives_back_its_tables_room() {
        let mut indexers = namespace_indexers();
        let by_name: IndexFunc<ConfigMap> =
            Arc::new(|cm: &ConfigMap| Ok(cm.metadata.name.clone().into_iter().collect()));
        indexers.insert("name".to_owned(), by_name);
        let store = ThreadSafeStore::with_indexers(indexers);
        let keys: Vec<String> = (0..10_000).map(|i| format!("ns/cm-{i}")).collect();
        for key in &keys {
            store.add(key, config_map(key)).unwrap();
        }
        let (items, set, names) = capacities(&store);
        assert!(
            items >= 10_000 && set >= 10_000 && names >= 10_000,
            "{items} {set} {names}"
        );
        for key in &keys[10..] {
            assert!(store.remove(key));
        }
        let (items, set, names) = capacities(&store);
        assert!(
            items <= 2 * SHRINK_FLOOR,
            "items table kept room for {items}"
        );
        assert!(set <= 2 * SHRINK_FLOOR, "index set kept room for {set}");
        assert!(
            names <= 2 * SHRINK_FLOOR,
            "index table kept room for {names}"
        );
        // What is left is all there, and indexed.
        assert_eq!(store.len(), 10);
        assert_eq!(store.index_keys("namespace", "ns").unwrap().len(), 10);
        assert!(keys[..10].iter().all(|k| store.contains_key(k)));
    }
}
