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
#[error("index function {index:?} failed for object {key:?}")]
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

/// The first failures, each with its cause: a list has no `source()`, so
/// each is said whole.
fn join(errors: &[IndexError]) -> String {
    const SHOWN: usize = 3;
    let mut s = errors
        .iter()
        .take(SHOWN)
        .map(|e| format!("{e}: {}", e.source))
        .collect::<Vec<_>>()
        .join("; ");
    if errors.len() > SHOWN {
        s.push_str(&format!("; and {} more", errors.len() - SHOWN));
    }
    s
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    fn failed(key: &str) -> IndexError {
        IndexError {
            index: "by-owner".into(),
            key: key.into(),
            source: "no owner reference".into(),
        }
    }

    #[test]
    fn an_index_error_names_the_index_and_key_and_its_cause_is_its_source() {
        let e = failed("web/a");
        assert_eq!(
            e.to_string(),
            "index function \"by-owner\" failed for object \"web/a\""
        );
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("no owner reference")
        );
    }

    #[test]
    fn unindexed_says_each_failure_with_its_cause_once() {
        let e = StoreError::Unindexed(vec![failed("web/a"), failed("web/b")]);
        let text = e.to_string();
        assert!(
            text.starts_with("stored, but 2 index function call(s) failed: "),
            "{text}"
        );
        assert_eq!(text.matches("no owner reference").count(), 2, "{text}");
        assert!(text.contains("\"web/a\": no owner reference; "), "{text}");
    }
}
