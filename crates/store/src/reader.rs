//! A read-only view of an [`Indexer`]: what an informer hands its users.
//!
//! The informer alone writes its cache, in step with the server; a user who
//! could add, update or delete through the handle they were given would make
//! the cache differ from the server without a word. In client-go that is a
//! convention; here the view has no method that writes.

use std::sync::Arc;

use crate::{CompactStats, Indexer, KeyError, StoreError};

/// Reads an [`Indexer`] that someone else writes: get, list, look up by
/// index. Cheap to clone; clones read the same cache.
///
/// ```
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kinformer_store::{CacheReader, Indexer};
///
/// let reader = CacheReader::new(Arc::new(Indexer::<ConfigMap>::new()));
/// assert!(reader.list().is_empty());
/// ```
///
/// It has no method that writes, so this does not compile:
///
/// ```compile_fail
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kinformer_store::{CacheReader, Indexer};
///
/// let reader = CacheReader::new(Arc::new(Indexer::<ConfigMap>::new()));
/// reader.add(Arc::new(ConfigMap::default()));
/// ```
pub struct CacheReader<K> {
    indexer: Arc<Indexer<K>>,
}

impl<K> Clone for CacheReader<K> {
    fn clone(&self) -> Self {
        Self {
            indexer: Arc::clone(&self.indexer),
        }
    }
}

impl<K> std::fmt::Debug for CacheReader<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheReader").finish_non_exhaustive()
    }
}

impl<K: crate::Object> CacheReader<K> {
    /// A view of `indexer`.
    pub fn new(indexer: Arc<Indexer<K>>) -> Self {
        Self { indexer }
    }

    /// Whether both views read the same cache.
    pub fn same_cache(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.indexer, &other.indexer)
    }

    /// The key the cache files `obj` under.
    pub fn key_of(&self, obj: &K) -> Result<String, KeyError> {
        self.indexer.key_of(obj)
    }

    /// The object under `key`.
    pub fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        self.indexer.get_by_key(key)
    }

    /// The cached object with `obj`'s key.
    pub fn get(&self, obj: &K) -> Result<Option<Arc<K>>, StoreError> {
        self.indexer.get(obj)
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.indexer.list()
    }

    /// Every key.
    pub fn list_keys(&self) -> Vec<String> {
        self.indexer.list_keys()
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.indexer.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.indexer.is_empty()
    }

    /// Objects sharing any value of index `index_name` with `obj`.
    pub fn index(&self, index_name: &str, obj: &K) -> Result<Vec<Arc<K>>, StoreError> {
        self.indexer.index(index_name, obj)
    }

    /// Objects whose index `index_name` has `value`.
    pub fn by_index(&self, index_name: &str, value: &str) -> Result<Vec<Arc<K>>, StoreError> {
        self.indexer.by_index(index_name, value)
    }

    /// Keys of the objects whose index `index_name` has `value`, sorted.
    pub fn index_keys(&self, index_name: &str, value: &str) -> Result<Vec<String>, StoreError> {
        self.indexer.index_keys(index_name, value)
    }

    /// Every value of index `index_name`.
    pub fn list_index_func_values(&self, index_name: &str) -> Vec<String> {
        self.indexer.list_index_func_values(index_name)
    }

    /// The names of the indexes.
    pub fn indexer_names(&self) -> Vec<String> {
        self.indexer.indexer_names()
    }

    /// What a compact cache holds and how its reads went; `None` when the
    /// cache keeps whole objects.
    pub fn compact_stats(&self) -> Option<CompactStats> {
        self.indexer.compact_stats()
    }
}
