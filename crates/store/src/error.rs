//! Errors of the store layer, each naming the key, object or index at fault.

use thiserror::Error;

/// The error an index function may return; it is reported with the object's key.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A key could not be computed from an object, or a key string is malformed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    /// The object has no `metadata.name` (or an empty one), so it has no key.
    #[error("object {object} has no metadata.name, so it has no key")]
    MissingName {
        /// What is known of the object, for example `namespace "web"`.
        object: String,
    },
    /// A key string is not `name` or `namespace/name`.
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// An operation on a [`ThreadSafeStore`](crate::ThreadSafeStore) or
/// [`Indexer`](crate::Indexer) was refused; the store is left unchanged.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The object's key could not be computed.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A query named an index that was never added.
    #[error("index {0:?} does not exist")]
    IndexNotFound(String),
    /// `add_indexers` named an index that already exists.
    #[error("indexer {0:?} already exists")]
    IndexerConflict(String),
    /// `add_indexers` was called on a store that already holds items (as in
    /// client-go, indexes cannot be added to a running store).
    #[error("cannot add indexers to a store that already holds {0} items")]
    IndexersAfterItems(usize),
    /// An index function failed; the object was not stored.
    #[error("index function {index:?} failed for object {key:?}: {source}")]
    IndexFunc {
        /// The index whose function failed.
        index: String,
        /// The key of the object it failed on.
        key: String,
        /// What the index function reported.
        #[source]
        source: BoxError,
    },
}
