//! Errors of the store layer, each naming the key, object or index at fault.

use thiserror::Error;

/// The error an index function may return; it is reported with the object's key.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A key could not be computed from an object, or a key string is malformed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
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

/// An index function failed for one object: it returned an error or panicked.
///
/// On a write (add, update, replace) the object is stored all the same and
/// left out of this one index, so the store keeps the newest object and every
/// other index stays complete; the error says which object is missing from
/// which index.
#[derive(Debug, Error)]
#[error("index function {index:?} failed for object {key:?}: {source}")]
pub struct IndexError {
    /// The index whose function failed.
    pub index: String,
    /// The key of the object it failed on.
    pub key: String,
    /// What the index function reported (or how it panicked).
    #[source]
    pub source: BoxError,
}

/// The source of an [`IndexError`] for an index function that panicked.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("the index function panicked: {0}")]
pub struct IndexFuncPanic(pub String);

/// An operation on a [`ThreadSafeStore`](crate::ThreadSafeStore) or
/// [`Indexer`](crate::Indexer) failed. Every variant but
/// [`Unindexed`](Self::Unindexed) leaves the store unchanged.
#[derive(Debug, Error)]
#[non_exhaustive]
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
    /// An index function failed on the object of a query (`index`).
    #[error(transparent)]
    IndexFunc(IndexError),
    /// The write was done, but index functions failed: each object named is
    /// stored and left out of the index named (and only of that one).
    #[error("stored, but {} index function call(s) failed: {}", .0.len(), join(.0))]
    Unindexed(Vec<IndexError>),
}

fn join(errors: &[IndexError]) -> String {
    const SHOWN: usize = 3;
    let mut s = errors
        .iter()
        .take(SHOWN)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if errors.len() > SHOWN {
        s.push_str(&format!("; and {} more", errors.len() - SHOWN));
    }
    s
}
