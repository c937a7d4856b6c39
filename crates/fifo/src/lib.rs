//! DeltaFifo and RealFifo: the queues between a Reflector and an informer's
//! cache.
//!
//! [`DeltaFifo`] is client-go's `tools/cache/delta_fifo.go` in Rust (the
//! default here); [`RealFifo`] is its `the_real_fifo.go`, an ordered log that
//! hands out every change on its own, in arrival order, with no merging per
//! key, and on a relist queues the deletions it implies before the listed
//! objects; in its atomic mode (client-go v0.37's `AtomicFIFO`) a relist is
//! one [`ReplacedAll`] unit a consumer swaps its cache for at once. All have
//! the same `has_synced` latch and `is_in_initial_list`;
//! [`InformerQueue`] is either, for a Reflector to feed and an informer to
//! pop ([`FifoKind`] picks one).
//!
//! The queues need no runtime: nothing here spawns, and a pop waits on a
//! tokio `Notify`, which any executor can poll (an informer pops from a
//! thread of its own, off the runtime that feeds the queue).
//!
//! In the DeltaFifo every change the
//! Reflector sees for an object is recorded as a [`Delta`] under the object's
//! key; keys are handed out in FIFO order, each with the whole ordered list of
//! its deltas ([`Deltas`]), so a consumer sees every change and can tell an
//! add from an update from a delete:
//!
//! - [`DeltaFifo::add`], [`update`](DeltaFifo::update) and
//!   [`delete`](DeltaFifo::delete) record a watch event; a key queued already
//!   keeps its place, and two deletes in a row collapse into one.
//! - [`DeltaFifo::replace`] records a full list: `Replaced` for every listed
//!   object and `Deleted` with a [`DeletedFinalStateUnknown`] tombstone for
//!   every known key the list no longer has (a delete missed while the watch
//!   was down).
//! - [`DeltaFifo::resync`] queues a `Sync` for every known object with no
//!   delta pending.
//! - [`DeltaFifo::pop`] waits for a key and hands its deltas to a closure,
//!   which may ask for them to be requeued.
//! - [`DeltaFifo::has_synced`] turns true once everything from the first
//!   `replace` has been popped.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use k8s_openapi::api::core::v1::Pod;
//! use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
//! use kinformer_fifo::{DeltaFifo, DeltaType};
//!
//! let pod = |rv: &str| Arc::new(Pod {
//!     metadata: ObjectMeta {
//!         namespace: Some("web".into()),
//!         name: Some("frontend".into()),
//!         resource_version: Some(rv.into()),
//!         ..ObjectMeta::default()
//!     },
//!     ..Pod::default()
//! });
//! let fifo = DeltaFifo::<Pod>::new();
//! fifo.add(pod("1")).unwrap();
//! fifo.update(pod("2")).unwrap();
//! let kinds = fifo
//!     .pop(|deltas, _| Ok::<_, kinformer_fifo::Requeue<()>>(deltas.iter().map(|d| d.kind).collect::<Vec<_>>()))
//!     .await
//!     .unwrap();
//! assert_eq!(kinds, [DeltaType::Added, DeltaType::Updated]);
//! # });
//! ```

#![deny(missing_docs)]
#![warn(clippy::return_self_not_must_use)]

mod delta;
mod delta_fifo;
mod error;
mod queue;
mod real_fifo;
mod sync;

pub use delta::{Delta, DeltaType, Deltas};
pub use delta_fifo::{DeltaFifo, DeltaFifoOptions, DeltaFifoReplace};
pub use error::{FifoError, PopError, Requeue};
pub use kinformer_store::{DeletedFinalStateUnknown, ObjectOrTombstone};
pub use queue::{FifoKind, InformerQueue, QueueReplace};
pub use real_fifo::{Popped, RealFifo, RealFifoOptions, RealFifoReplace, ReplacedAll};

/// The README's code, compiled (and run, unless marked `no_run`) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
