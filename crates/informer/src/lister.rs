//! Listers: read-only, typed views of an informer's cache.

use std::sync::Arc;

use kinformer_store::{Indexer, NAMESPACE_INDEX, StoreError};
use kube_client::Resource;
use kube_client::core::{Selector, SelectorExt};

/// Lists and gets objects from a cache: client-go's generated Listers, for
/// any [`Resource`](kube_client::Resource): k8s-openapi types, custom
/// resources, `DynamicObject`, `PartialObjectMeta<K>`. Objects come out as `Arc<K>`: shared, and immutable
/// by type.
///
/// ```
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::Pod;
/// use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
/// use kinformer_informer::Lister;
/// use kinformer_store::{Indexer, namespace_indexers};
///
/// let indexer = Arc::new(Indexer::with_indexers(namespace_indexers()));
/// indexer.add(Arc::new(Pod {
///     metadata: ObjectMeta { namespace: Some("web".into()), name: Some("p".into()), ..Default::default() },
///     ..Default::default()
/// })).unwrap();
/// let lister = Lister::new(indexer);
/// assert!(lister.namespaced("web").get("p").is_some());
/// assert_eq!(lister.list(&Default::default()).len(), 1);
/// ```
pub struct Lister<K> {
    indexer: Arc<Indexer<K>>,
    /// Whether the store's resourceVersion means what it says (see
    /// [`Lister::last_store_sync_resource_version`]).
    versioned: bool,
}

impl<K> Clone for Lister<K> {
    fn clone(&self) -> Self {
        Self {
            indexer: Arc::clone(&self.indexer),
            versioned: self.versioned,
        }
    }
}

impl<K> std::fmt::Debug for Lister<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lister")
            .field("cached", &self.indexer.len())
            .finish()
    }
}

fn matches<K: Resource>(obj: &K, selector: &Selector) -> bool {
    if selector.selects_all() {
        return true;
    }
    static EMPTY: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    selector.matches(obj.meta().labels.as_ref().unwrap_or(&EMPTY))
}

impl<K: Resource + Send + Sync + 'static> Lister<K> {
    /// A Lister over `indexer`.
    pub fn new(indexer: Arc<Indexer<K>>) -> Self {
        Self {
            indexer,
            versioned: true,
        }
    }

    /// A Lister over an informer's cache, whose resourceVersion is told
    /// only when the informer applies changes in order and relists at once.
    pub(crate) fn from_informer(indexer: Arc<Indexer<K>>, versioned: bool) -> Self {
        Self { indexer, versioned }
    }

    /// The resourceVersion the cache's content is synced to (client-go's
    /// `LastStoreSyncResourceVersion`), moved in the same step as the
    /// content: once it is seen at or past a version, every later read
    /// through this Lister sees that version's content or newer. `None`
    /// before anything was synced, and for the Lister of an informer that
    /// cannot say (see
    /// [`SharedIndexInformer::last_store_sync_resource_version`](crate::SharedIndexInformer::last_store_sync_resource_version)).
    pub fn last_store_sync_resource_version(&self) -> Option<String> {
        if self.versioned {
            self.indexer.last_store_sync_resource_version()
        } else {
            None
        }
    }

    /// Every cached object whose labels match `selector` (all for the empty selector).
    pub fn list(&self, selector: &Selector) -> Vec<Arc<K>> {
        let mut all = self.indexer.list();
        all.retain(|o| matches(o.as_ref(), selector));
        all
    }

    /// The cluster-scoped object `name` (or any object by its full key).
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.indexer.get_by_key(key)
    }

    /// The objects of one namespace.
    pub fn namespaced(&self, namespace: &str) -> NamespaceLister<K> {
        NamespaceLister {
            indexer: Arc::clone(&self.indexer),
            namespace: namespace.to_owned(),
        }
    }

    /// Objects whose index `index_name` includes `value`.
    pub fn by_index(&self, index_name: &str, value: &str) -> Result<Vec<Arc<K>>, StoreError> {
        self.indexer.by_index(index_name, value)
    }
}

/// The objects of one namespace in a cache.
pub struct NamespaceLister<K> {
    indexer: Arc<Indexer<K>>,
    namespace: String,
}

impl<K> std::fmt::Debug for NamespaceLister<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceLister")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl<K: Resource + Send + Sync + 'static> NamespaceLister<K> {
    /// The objects of the namespace whose labels match `selector`. Uses the
    /// namespace index when the cache has one.
    pub fn list(&self, selector: &Selector) -> Vec<Arc<K>> {
        let mut objs = match self.indexer.by_index(NAMESPACE_INDEX, &self.namespace) {
            Ok(objs) => objs,
            Err(_) => {
                let mut all = self.indexer.list();
                all.retain(|o| o.meta().namespace.as_deref() == Some(self.namespace.as_str()));
                all
            }
        };
        objs.retain(|o| matches(o.as_ref(), selector));
        objs
    }

    /// The object `name` of the namespace.
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        self.indexer
            .get_by_key(&format!("{}/{}", self.namespace, name))
    }
}
