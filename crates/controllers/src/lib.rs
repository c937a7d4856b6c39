//! The top layer of kinformer: a controller runtime and two controllers.
//!
//! - [`Controller`] turns an informer's events into keys in a rate-limited
//!   workqueue and runs [`Reconciler`]s on them with several workers,
//!   recovering from panics ([`PanicPolicy`]), retrying failures with backoff
//!   up to a limit, reconciling only while leading a [`LeaderElector`]'s
//!   Lease, and reporting [`Metrics`] with controller-runtime's names.
//! - [`EventRecorder`] publishes events.k8s.io/v1 Events, folding repeats
//!   into an `EventSeries` written at most every 30 s, as client-go does.
//! - [`apply`] writes an object, and [`apply_status`] an object's status,
//!   through server-side apply.
//! - [`finalizer`] wraps a reconcile in a finalizer: add it, run cleanup
//!   when the object is deleted, then remove it.
//! - Errors say what failed in their own words, the cause being their
//!   `source()`: [`error_chain`] says one with its causes, for logs, and
//!   [`is_not_found`], [`is_conflict`] and [`is_forbidden`] read the
//!   server's answer from anywhere in the chain.
//! - [`pod_stdout`] prints every Pod add, update and delete.
//! - [`service_strategy`] sets a Service's `app` selector from its
//!   `kinformer.dev/strategy` annotation.
//!
//! - [`Ring`] is a replica's part in a sharded controller: a member Lease,
//!   the slots of the hash space [`ring::assign_slots`] gives it, one Lease
//!   per slot, and [`Ring::enter`] guarding work on a slot so that a slot is
//!   handed over only once that work has ended (docs/sharding.md). A
//!   [`Controller`] sharded over it ([`ControllerOptions::ring`]) reconciles
//!   a key only inside its slot's guard, and its primary informer watches
//!   only the held slots ([`Ring::scope`]).
//! - [`Manager`] runs several controllers on one informer factory, with one
//!   leader election, one admin server (`/metrics`, `/healthz`, `/readyz`,
//!   with your own metrics and checks), your own [`Runnable`]s and one
//!   start and shutdown order; [`Controller::builder`] (or [`Manager::controller`]) wires a
//!   controller's primary resource, what it [`owns`](ControllerBuilder::owns)
//!   and [`watches`](ControllerBuilder::watches), and its
//!   [`predicate`]s.
//!
//! A [`Manager`] made with [`Manager::new`] drops `metadata.managedFields`
//! before decoding, where controller-runtime's cache keeps them unless a
//! transform drops them: few controllers read field ownership, and they
//! are often half of what an object costs to decode and to cache. To keep
//! them, give [`Manager::with_factory`] a factory made with
//! `SharedInformerFactory::keep_managed_fields()`.
//!
//! A complete controller: for each ConfigMap, a Secret it owns; the Secret's
//! changes bring its owner back, both caches have synced before the first
//! reconcile, and a terminal error is not retried.
//!
//! ```no_run
//! use std::sync::Arc;
//! use k8s_openapi::api::core::v1::{ConfigMap, Secret};
//! use kinformer_controllers::{Action, Lookup, Manager, ManagerOptions, TerminalError};
//!
//! # async fn demo(client: kube_client::Client) -> Result<(), kinformer_controllers::ControllerError> {
//! let mut manager = Manager::new(client, ManagerOptions::kubebuilder())?;
//! let secrets = manager.factory().informer::<Secret>().lister();
//! let controller = manager
//!     .controller::<ConfigMap>("configmap-secret")
//!     .owns::<Secret>()
//!     .reconcile(Arc::new(secrets), |cm, secrets| async move {
//!         let Lookup::Found(cm) = cm else {
//!             return Ok(Action::Done); // deleted: garbage collection removes the Secret
//!         };
//!         let (Some(ns), Some(name)) = (&cm.metadata.namespace, &cm.metadata.name) else {
//!             return Err(TerminalError::boxed("a ConfigMap without a name"));
//!         };
//!         if secrets.namespaced(ns).get(name).is_none() {
//!             // ... create the Secret with a controller ownerReference to `cm` ...
//!         }
//!         Ok(Action::Done)
//!     })?;
//! manager.add(controller);
//! manager.run_until_signal().await
//! # }
//! ```

#![deny(missing_docs)]
#![warn(clippy::return_self_not_must_use)]

mod apply;
mod controller;
mod error;
mod events;
mod finalizer;
mod leader;
#[cfg(feature = "logging")]
pub mod logging;
mod manager;
mod metrics;
pub mod rbac;
mod runnable;
mod seeds;
mod sharding;

/// The Kubernetes client kinformer is built on (kube-rs's `kube-client`),
/// so that a controller needs no dependency of its own to make a
/// [`Client`](kube::Client) or an [`Api`](kube::Api): its paths are those of
/// the `kube` crate (`kube::Client`, `kube::api::PatchParams`,
/// `kube::ResourceExt`). To derive `CustomResource`, depend on `kube` itself
/// with its `derive` feature, of the same version; its client is this one.
pub use kinformer_informer::kube;

/// Admission and conversion webhooks (the `kinformer-webhook` crate),
/// served by [`Manager::webhooks`].
pub use kinformer_webhook as webhook;

pub use controller::predicate;
use controller::{builder, gate, options, read_your_writes, reason, reconcile, runtime, worker};
pub use seeds::{pod_stdout, service_strategy};
pub use sharding::ring;
use sharding::{key_slots, membership, slots};

pub use apply::{apply, apply_status};
pub use builder::ControllerBuilder;
pub use error::ControllerError;
pub use events::{EventRecorder, EventType, NewEvent};
pub use finalizer::{FinalizerError, FinalizerEvent, finalizer};
pub use kinformer_informer::error_chain;
/// An object's namespace and name: the key a [`Request`] names, mappers
/// return and a controller's queue holds.
pub use kinformer_store::ObjectKey;
pub use leader::{LeaderElectionConfig, LeaderElector};
pub use manager::{
    BindAddress, DEFAULT_SYNC_PERIOD, INFORMER_NAME, InvalidBindAddress, Manager, ManagerHandle,
    ManagerOptions, RUNNABLE_STOP_WAIT, ToBindAddress, shutdown_on_signal,
};
pub use membership::{RING_LABEL, ROLE_LABEL, RingMembership, member_lease_name};
pub use metrics::{Check, CheckFailed, Metrics};
pub use options::{ControllerOptions, Event, PanicPolicy};
pub use rbac::Permissions;
pub use read_your_writes::{DEFAULT_READ_YOUR_WRITES_BOUND, untracked};
pub use reason::Reason;
pub use reconcile::{
    Action, FnReconciler, Lookup, ReconcileError, Reconciler, Request, TerminalError, is_conflict,
    is_forbidden, is_not_found,
};
pub use runnable::{FnRunnable, Runnable, RunnableError, runnable};
pub use runtime::Controller;
pub use slots::{Ring, RingConfig, SlotGuard};

/// The README's code, compiled (and run, unless marked `no_run`) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
