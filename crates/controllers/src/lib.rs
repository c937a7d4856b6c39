//! The top layer of kinformer: a controller runtime and two controllers.
//!
//! - [`Controller`] turns an informer's events into keys in a rate-limited
//!   workqueue and runs [`Reconciler`]s on them with several workers,
//!   recovering from panics ([`PanicPolicy`]), retrying failures with backoff
//!   up to a limit, reconciling only while leading a [`LeaderElector`]'s
//!   Lease, and reporting [`Metrics`] with controller-runtime's names.
//! - [`EventRecorder`] publishes events.k8s.io/v1 Events, folding repeats
//!   into an `EventSeries` written at most every 30 s, as client-go does.
//! - [`finalizer`] wraps a reconcile in a finalizer: add it, run cleanup
//!   when the object is deleted, then remove it.
//! - [`pod_stdout`] prints every Pod add, update and delete.
//! - [`service_strategy`] sets a Service's `app` selector from its
//!   `kinformer.dev/strategy` annotation.
//!
//! A complete controller: for each ConfigMap, a Secret it owns; the Secret's
//! changes bring its owner back, and both caches have synced before the
//! first reconcile.
//!
//! ```no_run
//! # async fn demo(client: kube_client::Client) -> Result<(), kinformer_controllers::ControllerError> {
//! use k8s_openapi::api::core::v1::{ConfigMap, Secret};
//! use kinformer_controllers::{Action, Controller, ControllerOptions, Lookup, TerminalError};
//! use kinformer_informer::{CancellationToken, SharedInformerFactory};
//!
//! let factory = SharedInformerFactory::new(client).namespace("default");
//! let secrets = factory.informer::<Secret>().lister();
//! let controller = Controller::from_fn(
//!     "configmap-secret",
//!     factory.informer::<ConfigMap>(),
//!     move |lookup: Lookup<ConfigMap>| {
//!         let secrets = secrets.clone();
//!         async move {
//!             let Lookup::Found(cm) = lookup else {
//!                 return Ok(Action::Done); // deleted: garbage collection removes the Secret
//!             };
//!             let Some(name) = cm.metadata.name.as_deref() else {
//!                 return Err(TerminalError::boxed("a ConfigMap without a name"));
//!             };
//!             if secrets.namespaced("default").get(name).is_none() {
//!                 // ... create the Secret with a controller ownerReference to `cm` ...
//!             }
//!             Ok(Action::Done)
//!         }
//!     },
//!     ControllerOptions::new().retry_forever(),
//! )?
//! .owns(factory.informer::<Secret>())?;
//! controller.run(CancellationToken::new()).await
//! # }
//! ```

mod error;
mod events;
mod finalizer;
mod leader;
mod metrics;
pub mod pod_stdout;
mod runtime;
pub mod service_strategy;

pub use error::ControllerError;
pub use events::{EventRecorder, EventType};
pub use finalizer::{FinalizerError, FinalizerEvent, finalizer};
pub use leader::{LeaderElectionConfig, LeaderElector};
pub use metrics::Metrics;
pub use runtime::{
    Action, Controller, ControllerOptions, Event, FnReconciler, Lookup, PanicPolicy,
    ReconcileError, Reconciler, TerminalError,
};
