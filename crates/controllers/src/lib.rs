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
    Action, Controller, ControllerOptions, Event, PanicPolicy, ReconcileError, Reconciler,
    TerminalError,
};
