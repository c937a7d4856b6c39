//! Informers: a local, indexed cache of Kubernetes objects kept in step with
//! the API server, and a stream of add/update/delete callbacks.
//!
//! client-go's `tools/cache` (reflector.go, shared_informer.go,
//! controller.go, listers) on kube-client and k8s-openapi:
//!
//! - [`ListerWatcher`] is the seam to the server; [`ApiListerWatcher`] lists
//!   and watches any kube `Resource` through kube-client: k8s-openapi types,
//!   custom resources (`#[derive(CustomResource)]`), `DynamicObject` with an
//!   `ApiResource`, and `PartialObjectMeta<K>` for metadata only.
//! - [`Reflector`] lists (paged), then watches with bookmarks, re-watches,
//!   relists on 410 Gone, and backs off on errors, feeding client-go v0.37's
//!   in-order atomic queue (or, by [`InformerOptions::fifo`], a plain
//!   RealFifo or a DeltaFifo).
//! - [`SharedIndexInformer`] applies the changes to an Indexer in watch
//!   order, a relist in one step, and fans them out to any number of
//!   [`ResourceEventHandler`]s, each with its own buffer;
//!   [`SharedIndexInformer::last_store_sync_resource_version`] says which
//!   version the cache holds.
//! - [`SharedInformerFactory`] shares informers by type, kind and scope;
//!   [`Lister`] reads the cache; [`wait_for_cache_sync`] waits for it.
//! - [`InformerOptions::compact`] keeps the cache compact: objects encoded
//!   ([`Compact`]), decoded when read.
//! - [`ApiListerWatcher::shard`] lists and watches one shard of the objects
//!   ([`ShardSelector`], kube-apiserver's sharded list and watch), filtering
//!   on the client where the server does not.
//! - With the `testing` feature (for dev-dependencies), `testing`: a
//!   scripted `ListerWatcher` and an in-process API server (a kube
//!   `Client` over an in-memory service), for unit tests without a cluster.
//! - Errors say what failed in their own words; the cause is their
//!   `source()`. [`error_chain`] says an error and its causes in one line,
//!   for logs.
//!
//! On the wire, built-in kinds and metadata-only informers travel as
//! Kubernetes protobuf ([`WireFormat::Auto`], the default; what
//! client-go's typed and metadata clients ask for), decoded straight into
//! the same k8s-openapi types a JSON decode gives by the
//! `kinformer-protobuf` crate ([`protobuf`]): one serde `Deserializer`
//! walks the protobuf bytes with a schema generated from the Go types of
//! the pinned k8s.io modules (`cargo xtask proto-schema`), which knows what
//! the `.proto` files do not: which zero values JSON leaves out
//! (`omitempty` on a non-pointer field), which fields it inlines, how
//! `Time`, `MicroTime`, `IntOrString`, `Quantity`, raw extensions and the
//! apiextensions unions read. Custom resources and `DynamicObject` use
//! JSON, as does any answer the server sends in JSON.
//! [`WireFormat::Json`] forces JSON.
//!
//! Unlike client-go, informers drop `metadata.managedFields` before
//! decoding (skipped in protobuf, cut from JSON), unless
//! [`SharedInformerFactory::keep_managed_fields`] or
//! [`ApiListerWatcher::keep_managed_fields`] asks to keep them: few
//! controllers read field ownership, and managedFields are often half of
//! what an object costs to decode and to cache (a Pod with them kept took
//! 1.8x the bytes per cached object in `cargo xtask bench`).
//!
//! ```no_run
//! # async fn demo(client: kube_client::Client) {
//! use k8s_openapi::api::core::v1::Pod;
//! use kinformer_informer::{ResourceEventHandlerFuncs, SharedInformerFactory};
//! use tokio_util::sync::CancellationToken;
//!
//! let factory = SharedInformerFactory::new(client).namespace("default");
//! let pods = factory.informer::<Pod>();
//! pods.add_event_handler(
//!     ResourceEventHandlerFuncs::new().on_add(|pod: &std::sync::Arc<Pod>, _| {
//!         println!("added {:?}", pod.metadata.name)
//!     }),
//! )
//! .unwrap();
//! let shutdown = CancellationToken::new();
//! factory.start(&shutdown);
//! factory.wait_for_cache_sync(&shutdown).await;
//! let cached = pods.lister().namespaced("default").list(&Default::default());
//! # }
//! ```
//!
//! A custom resource needs nothing beyond kube's derive (the
//! CustomResourceDefinition must be installed and Established):
//!
//! ```no_run
//! # async fn demo(client: kube_client::Client) {
//! use kinformer_informer::{CancellationToken, SharedInformerFactory};
//! use kube::CustomResource;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(CustomResource, Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
//! #[kube(group = "example.com", version = "v1", kind = "Widget", namespaced)]
//! struct WidgetSpec {
//!     size: i32,
//! }
//!
//! let factory = SharedInformerFactory::new(client).namespace("default");
//! let widgets = factory.informer::<Widget>();
//! let shutdown = CancellationToken::new();
//! factory.start(&shutdown);
//! factory.wait_for_cache_sync(&shutdown).await;
//! for w in widgets.lister().list(&Default::default()) {
//!     println!("{:?} has size {}", w.metadata.name, w.spec.size);
//! }
//! # }
//! ```
//!
//! A kind known only at run time, and metadata only (the server sends no
//! spec or status, so the cache stays small):
//!
//! ```no_run
//! # async fn demo(client: kube_client::Client) {
//! use k8s_openapi::api::core::v1::Pod;
//! use kinformer_informer::{CancellationToken, SharedInformerFactory};
//! use kube_client::core::{ApiResource, GroupVersionKind};
//!
//! let factory = SharedInformerFactory::new(client).namespace("default");
//! let gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
//! let widgets = factory.dynamic(&ApiResource::from_gvk(&gvk));
//! let pod_metadata = factory.metadata::<Pod>();
//! let shutdown = CancellationToken::new();
//! factory.start(&shutdown);
//! factory.wait_for_cache_sync(&shutdown).await;
//! if let Some(w) = widgets.lister().namespaced("default").get("w1") {
//!     println!("size {}", w.data["spec"]["size"]);
//! }
//! println!("{} pods", pod_metadata.indexer().len());
//! # }
//! ```

#![deny(missing_docs)]
#![warn(clippy::return_self_not_must_use)]

mod backoff;
pub mod consistency;
mod error;
mod factory;
mod handler;
mod informer;
mod latency;
mod lister;
mod lister_watcher;
mod panics;
mod processor;
pub mod rbac;
mod reflector;
mod shard;
mod strip;
mod sync;
#[cfg(feature = "testing")]
pub mod testing;

/// Kubernetes protobuf: the `kinformer-protobuf` crate, which informers use
/// for the built-in kinds ([`WireFormat::Auto`]).
pub use kinformer_protobuf as protobuf;
/// The Kubernetes client kinformer is built on (kube-rs's `kube-client`),
/// so that a program needs no dependency of its own to make a
/// [`Client`](kube::Client) or an [`Api`](kube::Api): its paths are those of
/// the `kube` crate (`kube::Client`, `kube::api::PatchParams`,
/// `kube::ResourceExt`). To derive `CustomResource`, depend on `kube` itself
/// with its `derive` feature, of the same version; its client is this one.
pub use kube_client as kube;

pub use backoff::BackoffConfig;
pub use error::{CatchUpError, Detail, InformerError, ListWatchError, error_chain};
pub use factory::{
    FactoryStats, InformerMetrics, InformerScope, InformerShare, SharedInformerFactory,
    is_cluster_scoped,
};
pub use handler::{ResourceEventHandler, ResourceEventHandlerFuncs};
pub use informer::{
    InformerOptions, MIN_RESYNC_PERIOD, ResourceEventHandlerRegistration, SharedIndexInformer,
    Transform, WatchErrorHandler, strip_managed_fields,
};
pub use kinformer_fifo::FifoKind;
pub use kinformer_protobuf::deep::MAX_JSON_NESTING;
pub use kinformer_store::{
    Codec, Compact, CompactStats, InvalidResourceVersion, JsonCodec, compare_resource_version,
};
pub use latency::{LatencySnapshot, PROCESSING_LATENCY_BUCKETS};
pub use lister::{Lister, NamespaceLister};
pub use lister_watcher::{
    ApiListerWatcher, GroupResource, ListPage, ListRequest, ListerWatcher, ShardScope, Undecodable,
    WatchRequest, WatchStream, WireFormat,
};
pub use rbac::Permissions;
pub use reflector::{
    DEFAULT_PAGE_SIZE, LIST_BATCH, MIN_WATCH_TIMEOUT, Reflector, ReflectorOptions, ReflectorStats,
    default_watch_error_handler,
};
pub use shard::{
    HASH_SPACE_END, HashRange, ShardEnforcement, ShardField, ShardSelector, ShardSelectorError,
    ShardStats, shard_hash,
};
pub use strip::{JsonShape, strip_managed_fields_json};
pub use sync::{HasSynced, wait_for_cache_sync};
pub use tokio_util::sync::CancellationToken;

/// The README's code, compiled (and run, unless marked `no_run`) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
