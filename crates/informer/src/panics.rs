//! Helpers for containing panics of user callbacks and for tying spawned
//! tasks to the future that spawned them.

use std::any::Any;

use tokio::task::JoinHandle;

/// The message of a caught panic, for the log.
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Aborts the task when dropped, so that it cannot outlive its owner (even
/// one whose future is dropped or that unwinds).
pub(crate) struct AbortOnDrop<T>(pub(crate) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
