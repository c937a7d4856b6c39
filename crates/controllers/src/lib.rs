//! The top layer of kinformer: a controller runtime and two controllers.
//!
//! - [`Controller`] turns an informer's events into keys in a rate-limited
//!   workqueue and runs [`Reconciler`]s on them with several workers,
//!   recovering from panics ([`PanicPolicy`]), retrying failures with backoff
//!   up to a limit, reconciling only while leading a [`LeaderElector`]'s
//!   Lease, and reporting [`Metrics`] with controller-runtime's names.
//! - [`pod_stdout`] prints every Pod add, update and delete.
//! - [`service_strategy`] sets a Service's `app` selector from its
//!   `kinformer.dev/strategy` annotation.

mod error;
mod leader;
mod metrics;
pub mod pod_stdout;
mod runtime;
pub mod service_strategy;

pub use error::ControllerError;
pub use leader::{LeaderElectionConfig, LeaderElector};
pub use metrics::Metrics;
pub use runtime::{
    Action, Controller, ControllerOptions, Event, PanicPolicy, ReconcileError, Reconciler,
};
