//! Errors of the controller layer. Each says what failed, naming the
//! controller, address or Lease; the cause is its `source()`.

use thiserror::Error;

/// A controller stopped with an error.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// The informer refused the controller's event handler.
    #[error("cannot register with the informer")]
    Informer(#[from] kinformer_informer::InformerError),
    /// The controller's informer failed: its cache no longer follows the
    /// server, so the controller stopped.
    #[error("the controller's informer failed")]
    InformerFailed(#[source] kinformer_informer::InformerError),
    /// A reconcile panicked and the panic policy is `Crash`.
    #[error("reconcile of {:?} panicked: {message}", key.as_str())]
    ReconcilePanicked {
        /// The key being reconciled.
        key: kinformer_store::ObjectKey,
        /// The panic message.
        message: String,
    },
    /// The controller's options cannot work.
    #[error("invalid controller options: {0}")]
    InvalidOptions(String),
    /// The leader election's settings cannot be safe.
    #[error("invalid leader election on Lease {lease}: {why}")]
    InvalidLeaderElection {
        /// `namespace/name` of the Lease.
        lease: String,
        /// What is wrong.
        why: String,
    },
    /// Workers did not stop when aborted (a reconcile blocks its thread);
    /// the process should exit rather than go on.
    #[error("{running} workers did not stop when aborted (a reconcile blocks its thread)")]
    WorkersStuck {
        /// Workers still running.
        running: usize,
    },
    /// The leader lease was lost; only a leader may reconcile.
    #[error("lost the leader lease")]
    LostLeadership,
    /// The webhook server could not be set up (its certificate, its address).
    #[error("the webhook server could not be set up")]
    Webhook(#[source] kinformer_webhook::WebhookError),
    /// The admin server could not listen on its address.
    #[error("cannot serve {what} on {addr} (choose another address, or none)")]
    Bind {
        /// What was to be served there.
        what: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// Why not.
        source: std::io::Error,
    },
    /// A sharded controller's ring could not read or write its Leases.
    #[error("ring {ring:?}: {what}")]
    Ring {
        /// The ring's name.
        ring: String,
        /// What was being done.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube_client::Error,
    },
    /// SIGTERM and SIGINT could not be handled.
    #[error("cannot install the signal handlers")]
    Signals(#[source] std::io::Error),
    /// A runnable added with [`Manager::add_runnable`](crate::Manager::add_runnable)
    /// failed; the Manager stopped.
    #[error("runnable {name:?} failed")]
    RunnableFailed {
        /// The runnable.
        name: String,
        /// Why.
        #[source]
        source: crate::RunnableError,
    },
    /// A runnable did not end within [`RUNNABLE_STOP_WAIT`](crate::RUNNABLE_STOP_WAIT)
    /// of being told to stop (or, after a lost lease, while the lease was
    /// safely ours): it was dropped, and the lease left to expire.
    #[error("runnable {name:?} did not end when told to stop")]
    RunnableStuck {
        /// The runnable.
        name: String,
    },
    /// A controller's task ended abnormally (a bug in kinformer: panics in
    /// reconciles are caught).
    #[error("controller {name:?} ended abnormally")]
    Aborted {
        /// The controller.
        name: String,
        /// What happened to its task.
        #[source]
        source: tokio::task::JoinError,
    },
}
