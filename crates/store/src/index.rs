//! Index functions: named ways of grouping objects by a derived value.

use std::collections::HashMap;
use std::sync::Arc;

use crate::{BoxError, Object};

/// Computes the values under which an object is indexed (none, one or many).
///
/// Unlike client-go, a failing index function returns an error, which the
/// store reports with the object's key instead of panicking. A failing (or
/// panicking) index function keeps the object out of that index only; the
/// object is stored all the same.
pub type IndexFunc<K> = Arc<dyn Fn(&K) -> Result<Vec<String>, BoxError> + Send + Sync>;

/// Index functions by index name.
pub type Indexers<K> = HashMap<String, IndexFunc<K>>;

/// The name of the ready-made namespace index.
pub const NAMESPACE_INDEX: &str = "namespace";

/// Indexes an object by its namespace (cluster-scoped objects by `""`), as
/// client-go's `MetaNamespaceIndexFunc`.
pub fn meta_namespace_index_func<K: Object>(obj: &K) -> Result<Vec<String>, BoxError> {
    Ok(vec![obj.namespace().unwrap_or_default().to_owned()])
}

/// The indexers map with only the namespace index, under [`NAMESPACE_INDEX`].
pub fn namespace_indexers<K: Object>() -> Indexers<K> {
    let mut indexers: Indexers<K> = HashMap::new();
    indexers.insert(
        NAMESPACE_INDEX.to_owned(),
        Arc::new(meta_namespace_index_func::<K>),
    );
    indexers
}
