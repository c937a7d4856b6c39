//! The bottom layer of kinformer: how objects are keyed and kept in memory.
//!
//! This crate is client-go's `tools/cache` store, `thread_safe_store` and
//! `index` in Rust. It knows nothing of the Kubernetes wire: it holds anything
//! that implements [`Object`] (every k8s-openapi resource does), always as
//! `Arc<K>`, so the objects a cache hands out are shared and immutable by type.
//!
//! - [`ObjectKey`] is an object's namespace and name as one checked value
//!   (its string form client-go's `namespace/name`);
//!   [`meta_namespace_key`] turns an object into that string and
//!   [`split_meta_namespace_key`] takes such a key apart;
//!   [`deletion_handling_meta_namespace_key`] also accepts the tombstones
//!   ([`DeletedFinalStateUnknown`]) that a relist produces.
//! - [`ThreadSafeStore`] is a keyed map with named secondary indexes that
//!   stay consistent on every add, update, delete and replace. An index
//!   function that fails or panics for an object leaves that object out of
//!   that index only: the object itself is stored, and the write reports an
//!   [`IndexError`] naming the index and the key.
//! - [`Indexer`] is the store most callers want: a [`ThreadSafeStore`] plus a
//!   key function, the cache behind every informer and Lister.
//!
//! ```
//! use std::sync::Arc;
//! use k8s_openapi::api::core::v1::Pod;
//! use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
//! use kinformer_store::{Indexer, NAMESPACE_INDEX, namespace_indexers};
//!
//! let indexer = Indexer::<Pod>::with_indexers(namespace_indexers());
//! let pod = Pod {
//!     metadata: ObjectMeta {
//!         namespace: Some("web".into()),
//!         name: Some("frontend-0".into()),
//!         ..ObjectMeta::default()
//!     },
//!     ..Pod::default()
//! };
//! indexer.add(Arc::new(pod)).unwrap();
//! assert!(indexer.get_by_key("web/frontend-0").is_some());
//! assert_eq!(indexer.by_index(NAMESPACE_INDEX, "web").unwrap().len(), 1);
//! ```

#![deny(missing_docs)]
#![warn(clippy::return_self_not_must_use)]

mod compact;
mod error;
mod index;
mod indexer;
mod key;
mod object;
mod object_key;
mod reader;
mod resource_version;
mod thread_safe_store;

pub use compact::{Codec, Compact, CompactStats, JSON_MAX_NESTING, JsonCodec};
pub use error::{BoxError, IndexError, IndexFuncPanic, KeyError, StoreError};
pub use index::{
    IndexFunc, Indexers, NAMESPACE_INDEX, meta_namespace_index_func, namespace_indexers,
};
pub use indexer::{Indexer, KeyFunc, KnownObjects};
pub use key::{
    deletion_handling_meta_namespace_key, meta_namespace_key, object_description,
    split_meta_namespace_key,
};
pub use object::{DeletedFinalStateUnknown, Object, ObjectOrTombstone};
pub use object_key::ObjectKey;
pub use reader::CacheReader;
pub use resource_version::{InvalidResourceVersion, compare_resource_version};
pub use thread_safe_store::{Swapped, ThreadSafeStore, Upserted};

/// The README's code, compiled (and run, unless marked `no_run`) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
