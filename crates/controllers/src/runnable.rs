//! Runnables: what a [`Manager`](crate::Manager) starts and stops beside
//! its controllers, as controller-runtime's `manager.Runnable` added with
//! `mgr.Add`: a cache warmer, a periodic sweep, a server of the user's own.
//!
//! The Manager starts them once every part they may use is up (its admin
//! and webhook servers, the election, its controllers, whose caches have
//! all synced), a runnable that needs the lease only once this replica
//! leads, and stops them with its controllers, before it releases the lease
//! and stops the informers: see [`Manager`](crate::Manager) for the whole
//! order. A runnable told to stop has
//! [`RUNNABLE_STOP_WAIT`](crate::RUNNABLE_STOP_WAIT) to end (after a lost
//! lease, only while the lease is safely ours); past it, it is dropped and
//! the Manager ends with [`ControllerError::RunnableStuck`](crate::ControllerError::RunnableStuck),
//! leaving the lease to expire.

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

/// Why a runnable failed; its `source()` chain is kept.
pub type RunnableError = Box<dyn std::error::Error + Send + Sync>;

/// Something a [`Manager`](crate::Manager) runs until it stops: see the
/// module docs and [`Manager::add_runnable`](crate::Manager::add_runnable).
///
/// A runnable that returns `Ok` early has simply finished: the Manager goes
/// on. One that returns an error stops the Manager, as a failed controller
/// does, and [`Manager::run`](crate::Manager::run) returns
/// [`ControllerError::RunnableFailed`](crate::ControllerError::RunnableFailed).
pub trait Runnable: Send + 'static {
    /// Its name, for logs and errors.
    fn name(&self) -> &str;

    /// Whether it runs only while this replica leads (with a leader
    /// election; the default, as controller-runtime's): started once this
    /// replica leads, stopped if the lease is lost.
    fn needs_leader_election(&self) -> bool {
        true
    }

    /// Runs until `stop` is cancelled.
    fn run(
        self: Box<Self>,
        stop: CancellationToken,
    ) -> BoxFuture<'static, Result<(), RunnableError>>;
}

/// A [`Runnable`] made of a name and an async closure: see [`runnable`].
pub struct FnRunnable<F> {
    name: String,
    needs_leader_election: bool,
    f: F,
}

/// A runnable named `name` that runs `f` with the token that stops it;
/// it needs the lease unless [`on_every_replica`](FnRunnable::on_every_replica).
///
/// ```
/// use kinformer_controllers::runnable;
///
/// let sweep = runnable("sweep", |stop| async move {
///     let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
///     loop {
///         tokio::select! {
///             _ = stop.cancelled() => return Ok(()),
///             _ = tick.tick() => { /* sweep what the controllers left */ }
///         }
///     }
/// });
/// # let _ = sweep;
/// ```
pub fn runnable<F, Fut>(name: &str, f: F) -> FnRunnable<F>
where
    F: FnOnce(CancellationToken) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), RunnableError>> + Send + 'static,
{
    FnRunnable {
        name: name.to_owned(),
        needs_leader_election: true,
        f,
    }
}

impl<F> FnRunnable<F> {
    /// Runs on every replica, leader or not (a webhook-side warmer, say).
    #[must_use]
    pub fn on_every_replica(mut self) -> Self {
        self.needs_leader_election = false;
        self
    }
}

impl<F> std::fmt::Debug for FnRunnable<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnRunnable")
            .field("name", &self.name)
            .field("needs_leader_election", &self.needs_leader_election)
            .finish_non_exhaustive()
    }
}

impl<F, Fut> Runnable for FnRunnable<F>
where
    F: FnOnce(CancellationToken) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), RunnableError>> + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn needs_leader_election(&self) -> bool {
        self.needs_leader_election
    }

    fn run(
        self: Box<Self>,
        stop: CancellationToken,
    ) -> BoxFuture<'static, Result<(), RunnableError>> {
        Box::pin((self.f)(stop))
    }
}
