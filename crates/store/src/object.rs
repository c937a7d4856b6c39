//! What the store can hold, and the tombstone a relist leaves behind.

use std::sync::Arc;

/// Anything with Kubernetes object metadata: the store needs its name,
/// namespace and resource version; the uid helps consistency checks.
///
/// Every [`kube_core::Resource`] implements it: k8s-openapi types,
/// `#[derive(CustomResource)]` types, `DynamicObject` and
/// `PartialObjectMeta<K>`. Implement it by hand for types of your own.
pub trait Object: Send + Sync + 'static {
    /// `metadata.name`.
    fn name(&self) -> Option<&str>;
    /// `metadata.namespace`; `None` or empty for cluster-scoped objects.
    fn namespace(&self) -> Option<&str>;
    /// `metadata.resourceVersion`.
    fn resource_version(&self) -> Option<&str>;
    /// `metadata.uid`.
    fn uid(&self) -> Option<&str> {
        None
    }
}

impl<K> Object for K
where
    K: kube_core::Resource + Send + Sync + 'static,
{
    fn name(&self) -> Option<&str> {
        self.meta().name.as_deref()
    }
    fn namespace(&self) -> Option<&str> {
        self.meta().namespace.as_deref()
    }
    fn resource_version(&self) -> Option<&str> {
        self.meta().resource_version.as_deref()
    }
    fn uid(&self) -> Option<&str> {
        self.meta().uid.as_deref()
    }
}

/// An object that was deleted while the watch was down: a relist found its
/// key gone, so its final state is unknown and `obj` is the last state seen.
///
/// client-go's `DeletedFinalStateUnknown`. Delete handlers receive it inside
/// [`ObjectOrTombstone::Tombstone`].
#[derive(Debug)]
pub struct DeletedFinalStateUnknown<K> {
    /// The key the object was stored under.
    pub key: String,
    /// The last state of the object that the cache knew.
    pub obj: Arc<K>,
}

impl<K> Clone for DeletedFinalStateUnknown<K> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            obj: Arc::clone(&self.obj),
        }
    }
}

/// An object as a delta or a delete handler sees it: either the object itself
/// or the tombstone of an object whose deletion was missed.
#[derive(Debug)]
pub enum ObjectOrTombstone<K> {
    /// The object as the server sent it.
    Object(Arc<K>),
    /// The object was found missing on relist; its last known state.
    Tombstone(DeletedFinalStateUnknown<K>),
}

impl<K> Clone for ObjectOrTombstone<K> {
    fn clone(&self) -> Self {
        match self {
            Self::Object(obj) => Self::Object(Arc::clone(obj)),
            Self::Tombstone(t) => Self::Tombstone(t.clone()),
        }
    }
}

impl<K> ObjectOrTombstone<K> {
    /// The object, or the last known state inside the tombstone.
    pub fn object(&self) -> &Arc<K> {
        match self {
            Self::Object(obj) => obj,
            Self::Tombstone(t) => &t.obj,
        }
    }

    /// Whether this is a tombstone (the final state is unknown).
    pub fn is_tombstone(&self) -> bool {
        matches!(self, Self::Tombstone(_))
    }

    /// The object, giving up the tombstone wrapper.
    pub fn into_object(self) -> Arc<K> {
        match self {
            Self::Object(obj) => obj,
            Self::Tombstone(t) => t.obj,
        }
    }
}

impl<K> From<Arc<K>> for ObjectOrTombstone<K> {
    fn from(obj: Arc<K>) -> Self {
        Self::Object(obj)
    }
}
