//! Errors of the DeltaFifo.

use kinformer_store::KeyError;
use thiserror::Error;

/// A DeltaFifo operation was refused; the queue is left unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FifoError {
    /// An object's key could not be computed; the source names the object.
    #[error("cannot queue object")]
    Key(#[from] KeyError),
    /// `replace` was given an object whose key could not be computed.
    #[error("cannot replace: item {index} of the list")]
    ReplaceKey {
        /// Position of the bad object in the list.
        index: usize,
        /// Why its key could not be computed.
        source: KeyError,
    },
}

/// Returned by a `pop` closure to put the deltas back in the queue (unless
/// the key was queued again meanwhile), carrying the error that caused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeue<E>(pub E);

/// Why `pop` returned without a result.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PopError<E> {
    /// The queue was closed and holds nothing more.
    #[error("DeltaFifo is closed")]
    Closed,
    /// The closure failed; its deltas were put back in the queue.
    #[error("processing failed and the deltas were requeued")]
    Requeued(E),
}
