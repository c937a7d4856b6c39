//! The Indexer: a [`ThreadSafeStore`] keyed by a key function, as client-go's `cache`.

use std::fmt;
use std::sync::Arc;

use crate::{
    Compact, CompactStats, Indexers, KeyError, Object, StoreError, Swapped, ThreadSafeStore,
    Upserted, meta_namespace_key,
};

/// Computes an object's key; [`meta_namespace_key`] by default.
pub type KeyFunc<K> = Arc<dyn Fn(&K) -> Result<String, KeyError> + Send + Sync>;

/// What a DeltaFifo needs to know of the objects it feeds: their keys and the
/// last state of each. client-go's `KeyListerGetter`.
pub trait KnownObjects<K>: Send + Sync {
    /// Every key held.
    fn list_keys(&self) -> Vec<String>;
    /// The object held under `key`.
    fn get_by_key(&self, key: &str) -> Option<Arc<K>>;
    /// The object held under `key` when it is held whole, so that sharing
    /// it costs nothing (a compact store decodes on every read: `None`).
    /// A queue holding a new list beside the consumer's cache uses it to
    /// keep one copy of what did not change. `None` by default.
    fn get_shared(&self, key: &str) -> Option<Arc<K>> {
        let _ = key;
        None
    }
    /// Whether the object held under `key` is at `resource_version` with
    /// `uid`, for a store that does not hold it whole ([`get_shared`](Self::get_shared)
    /// gives `None`): a queue then need not hold a listed copy of it at
    /// all. `false` by default.
    fn holds_version(&self, key: &str, resource_version: &str, uid: Option<&str>) -> bool {
        let _ = (key, resource_version, uid);
        false
    }
}

/// A thread-safe, indexed store of `Arc<K>` keyed by a key function: the cache
/// behind an informer and its Listers.
///
/// Semantics are client-go's `Indexer`: `add` and `update` both upsert,
/// `delete` of an absent object is not an error, `replace` swaps the whole
/// content atomically and rebuilds the indexes, and indexes added to a
/// populated store index what it holds. Unlike client-go, an object without a key is an
/// error naming the object (and the store is left unchanged), and an index
/// function that fails or panics does not panic the caller: the object is
/// stored, left out of that index only, and the write returns
/// [`StoreError::Unindexed`] naming the index and the key.
pub struct Indexer<K> {
    store: ThreadSafeStore<K>,
    key_func: KeyFunc<K>,
}

impl<K: Object> Default for Indexer<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> fmt::Debug for Indexer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Indexer")
            .field("len", &self.store.len())
            .field("indexes", &self.store.indexer_names())
            .finish()
    }
}

impl<K: Object> Indexer<K> {
    /// An empty indexer keyed by [`meta_namespace_key`], without indexes.
    pub fn new() -> Self {
        Self::with_key_func(Arc::new(|obj: &K| meta_namespace_key(obj)), Indexers::new())
    }

    /// An empty indexer keyed by [`meta_namespace_key`] with the given indexes.
    pub fn with_indexers(indexers: Indexers<K>) -> Self {
        Self::with_key_func(Arc::new(|obj: &K| meta_namespace_key(obj)), indexers)
    }

    /// An empty compact indexer keyed by [`meta_namespace_key`] with the
    /// given indexes: objects are kept encoded and decoded on read (see
    /// [`Compact`]).
    pub fn compact(indexers: Indexers<K>, compact: Compact<K>) -> Self {
        Self::compact_with_key_func(
            Arc::new(|obj: &K| meta_namespace_key(obj)),
            indexers,
            compact,
        )
    }
}

impl<K> Indexer<K> {
    /// An empty indexer with a key function of your own.
    pub fn with_key_func(key_func: KeyFunc<K>, indexers: Indexers<K>) -> Self {
        Self {
            store: ThreadSafeStore::with_indexers(indexers),
            key_func,
        }
    }

    /// An empty compact indexer with a key function of your own.
    pub fn compact_with_key_func(
        key_func: KeyFunc<K>,
        indexers: Indexers<K>,
        compact: Compact<K>,
    ) -> Self {
        Self {
            store: ThreadSafeStore::compact(indexers, compact),
            key_func,
        }
    }

    /// What a compact indexer holds and how its reads went; `None` when it
    /// keeps whole objects.
    pub fn compact_stats(&self) -> Option<CompactStats> {
        self.store.compact_stats()
    }

    /// The key of `obj` under this indexer's key function.
    pub fn key_of(&self, obj: &K) -> Result<String, KeyError> {
        (self.key_func)(obj)
    }

    /// The key function, for layers above that key objects the same way.
    pub fn key_func(&self) -> &KeyFunc<K> {
        &self.key_func
    }

    /// Removes the object under `key`; returns it.
    pub fn delete_by_key(&self, key: &str) -> Option<Arc<K>> {
        self.store.delete(key)
    }

    /// Removes the object under `key` without handing it back (a compact
    /// indexer need not decode it); whether there was one.
    pub fn remove_by_key(&self, key: &str) -> bool {
        self.store.remove(key)
    }

    /// [`remove_by_key`](Self::remove_by_key), and the store is synced to
    /// `resource_version` (the deleted object's last) if one is given.
    pub fn remove_by_key_at(&self, key: &str, resource_version: Option<&str>) -> bool {
        self.store.remove_at(key, resource_version)
    }

    /// The stored object with `obj`'s key.
    pub fn get(&self, obj: &K) -> Result<Option<Arc<K>>, StoreError> {
        let key = self.key_of(obj)?;
        Ok(self.store.get(&key))
    }

    /// The stored object under `key`.
    pub fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        self.store.get(key)
    }

    /// Every object, in no particular order.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.store.list()
    }

    /// Every key, in no particular order.
    pub fn list_keys(&self) -> Vec<String> {
        self.store.list_keys()
    }

    /// The number of objects.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether the indexer is empty.
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// The resourceVersion the content was last synced to: that of the last
    /// object written or deleted through [`update`](Self::update) and the
    /// like, of the last [`replace`](Self::replace)'s list, or the last
    /// [`bookmark`](Self::bookmark); `None` before any (client-go's
    /// `LastStoreSyncResourceVersion`). It moves under the same lock as the
    /// content: once it is seen at a version, every later read sees that
    /// version's content or newer. Versions are the server's and meant to
    /// be compared by it; they grow in the order writes reach the store only
    /// when they are applied in watch order (client-go gives it only with
    /// its in-order queue).
    pub fn last_store_sync_resource_version(&self) -> Option<String> {
        self.store.last_store_sync_resource_version()
    }

    /// Records that the content is synced to `resource_version` without an
    /// object changing (a watch bookmark), as client-go's `Bookmark`.
    pub fn bookmark(&self, resource_version: &str) {
        self.store.bookmark(resource_version);
    }

    /// Nothing to do for a store held in memory; kept for client-go parity.
    pub fn resync(&self) {
        self.store.resync()
    }

    /// Adds indexes and indexes the objects already held; refused when a
    /// name is taken. See [`ThreadSafeStore::add_indexers`].
    pub fn add_indexers(&self, indexers: Indexers<K>) -> Result<(), StoreError> {
        self.store.add_indexers(indexers)
    }

    /// Objects sharing at least one value of index `index_name` with `obj`.
    pub fn index(&self, index_name: &str, obj: &K) -> Result<Vec<Arc<K>>, StoreError> {
        self.store.index(index_name, obj)
    }

    /// Objects whose index `index_name` includes `value`.
    pub fn by_index(&self, index_name: &str, value: &str) -> Result<Vec<Arc<K>>, StoreError> {
        self.store.by_index(index_name, value)
    }

    /// Keys of the objects whose index `index_name` includes `value`, sorted.
    pub fn index_keys(&self, index_name: &str, value: &str) -> Result<Vec<String>, StoreError> {
        self.store.index_keys(index_name, value)
    }

    /// Every value of index `index_name` that some object has.
    pub fn list_index_func_values(&self, index_name: &str) -> Vec<String> {
        self.store.list_index_func_values(index_name)
    }

    /// The names of the indexes.
    pub fn indexer_names(&self) -> Vec<String> {
        self.store.indexer_names()
    }
}

/// Writes that carry objects sync the Indexer to their resourceVersion, as
/// client-go's store does since v0.36 (`LastStoreSyncResourceVersion`).
impl<K: Object> Indexer<K> {
    /// Inserts or replaces the object; the store is synced to its
    /// resourceVersion.
    pub fn add(&self, obj: Arc<K>) -> Result<(), StoreError> {
        self.update(obj)
    }

    /// Inserts or replaces the object; the store is synced to its
    /// resourceVersion.
    pub fn update(&self, obj: Arc<K>) -> Result<(), StoreError> {
        let key = self.key_of(&obj)?;
        self.update_by_key(&key, obj).into_result().map(|_| ())
    }

    /// Inserts or replaces the object under `key`, which the caller computed
    /// with this indexer's key function (saves computing it again); says what
    /// it replaced and which index functions failed for it. The store is
    /// synced to the object's resourceVersion.
    pub fn update_by_key(&self, key: &str, obj: Arc<K>) -> Upserted<K> {
        let held = Arc::clone(&obj);
        self.store.upsert_at(key, obj, held.resource_version())
    }

    /// Removes the object with `obj`'s key; returns what was stored. The
    /// store is synced to `obj`'s resourceVersion (a deleted object's last).
    pub fn delete(&self, obj: &K) -> Result<Option<Arc<K>>, StoreError> {
        let key = self.key_of(obj)?;
        Ok(self.store.delete_at(&key, obj.resource_version()))
    }

    /// Swaps the whole content for `list` at once, and syncs the store to
    /// the list's `resource_version` in the same step (an empty one leaves
    /// the version as it was). An object without a key refuses the whole
    /// list (the store is left unchanged); failing index functions give
    /// [`StoreError::Unindexed`] after the swap.
    pub fn replace(&self, list: Vec<Arc<K>>, resource_version: &str) -> Result<(), StoreError> {
        let items = list
            .into_iter()
            .map(|obj| Ok((self.key_of(&obj)?, obj)))
            .collect::<Result<Vec<_>, KeyError>>()?;
        self.store.replace_at(items, resource_version)
    }
}

impl<K> Indexer<K> {
    /// [`replace`](Self::replace) with the keys the caller computed with
    /// this indexer's key function (a queue's, saving computing them
    /// again): swaps the whole content at once and syncs the store to
    /// `resource_version` in the same step.
    pub fn replace_by_key(
        &self,
        items: Vec<(Arc<str>, Arc<K>)>,
        resource_version: &str,
    ) -> Result<(), StoreError> {
        self.store.replace_at(items, resource_version)
    }

    /// [`replace_by_key`](Self::replace_by_key), giving back what each key
    /// held before the swap; see [`ThreadSafeStore::swap_at`].
    pub fn swap_by_key(
        &self,
        items: Vec<(Arc<str>, Arc<K>)>,
        keep: &dyn Fn(&str) -> bool,
        resource_version: &str,
    ) -> Swapped<'_, K> {
        self.store.swap_at(items, keep, resource_version)
    }
}

impl<K: Object> KnownObjects<K> for Indexer<K> {
    fn list_keys(&self) -> Vec<String> {
        self.store.list_keys()
    }
    fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        self.store.get(key)
    }
    fn get_shared(&self, key: &str) -> Option<Arc<K>> {
        if self.store.is_compact() {
            None
        } else {
            self.store.get(key)
        }
    }
    fn holds_version(&self, key: &str, resource_version: &str, uid: Option<&str>) -> bool {
        // A compact store decodes it to see (dropped at once).
        self.store.is_compact()
            && self.store.get(key).is_some_and(|held| {
                held.resource_version() == Some(resource_version) && held.uid() == uid
            })
    }
}
