//! What a reconcile returns: [`Action`], [`ReconcileError`] and
//! [`TerminalError`]; the [`Reconciler`] trait and [`Lookup`], the object a
//! closure reconciler receives.

#[cfg(doc)]
use crate::{Controller, ControllerError};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kinformer_store::{CacheReader, Object};

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Done until the next event for this key.
    Done,
    /// Reconcile this key again after the duration (its failures are forgotten).
    RequeueAfter(Duration),
}

/// The error of a failed reconcile; the key is retried with backoff, unless
/// it is, or its `source()` chain holds, a [`TerminalError`].
pub type ReconcileError = Box<dyn std::error::Error + Send + Sync>;

/// A reconcile error that retrying cannot fix (an invalid spec, say): the
/// key is not retried until its next event, and the error is counted in
/// `controller_runtime_terminal_reconcile_errors_total`, as
/// controller-runtime's `reconcile.TerminalError`. Its `source()` is the
/// error it wraps.
#[derive(Debug)]
pub struct TerminalError(pub ReconcileError);

impl TerminalError {
    /// Marks `error` terminal, as a [`ReconcileError`].
    pub fn boxed(error: impl Into<ReconcileError>) -> ReconcileError {
        Box::new(Self(error.into()))
    }
}

impl std::fmt::Display for TerminalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "terminal: {}", self.0)
    }
}

impl std::error::Error for TerminalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

/// Whether `error` or any error in its `source()` chain is a
/// [`TerminalError`], as controller-runtime's `errors.Is`: one returned
/// from inside a finalizer's closure, or wrapped by the user's own error
/// type, is terminal too.
pub(crate) fn is_terminal(error: &(dyn std::error::Error + 'static)) -> bool {
    // Bounded: a source chain that loops must not hang a worker.
    std::iter::successors(Some(error), |e| e.source())
        .take(64)
        .any(|e| e.is::<TerminalError>())
}

/// Brings the world in line with the cached state of one object.
///
/// `reconcile` receives a key (`namespace/name`) and must read the object
/// from a Lister, not from the event: it is level-based, so it must do the
/// right thing whatever happened before, including nothing.
pub trait Reconciler: Send + Sync + 'static {
    /// Reconciles the object under `key`.
    fn reconcile<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Action, ReconcileError>>;
}

impl<R: Reconciler + ?Sized> Reconciler for Arc<R> {
    fn reconcile<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        (**self).reconcile(key)
    }
}

/// What a reconcile finds in the cache for its key.
#[derive(Debug)]
pub enum Lookup<K> {
    /// The object as cached now.
    Found(Arc<K>),
    /// No such object any more: it was deleted (run cleanup here).
    Gone {
        /// Its `namespace/name` key.
        key: String,
    },
}

/// A [`Reconciler`] from an async closure that receives the object read
/// from the cache at reconcile time (or that it is gone); see
/// [`Controller::from_fn`].
pub struct FnReconciler<K, F> {
    pub(crate) cache: CacheReader<K>,
    pub(crate) f: F,
}

impl<K, F, Fut> Reconciler for FnReconciler<K, F>
where
    K: Object,
    F: Fn(Lookup<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    fn reconcile<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let lookup = match self.cache.get_by_key(key) {
            Some(obj) => Lookup::Found(obj),
            None => Lookup::Gone {
                key: key.to_owned(),
            },
        };
        Box::pin((self.f)(lookup))
    }
}

/// `error` and its `source()`s, outermost first: `a: b: c`. The server's
/// answer reads "403 Forbidden: its message": kube's own text of it adds
/// a dump of the whole Status, which repeats the message, and is replaced
/// wherever it shows (a wrapper often prints its source in its message).
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut next = Some(error);
    for _ in 0..64 {
        let Some(e) = next else { break };
        let (mut text, mut source) = (e.to_string(), e.source());
        if let Some(kube_client::Error::Api(s)) = e.downcast_ref() {
            let short = format!("{} {}: {}", s.code, s.reason, s.message);
            out = out.replace(&text, &short);
            // Its source is that Status, said now.
            (text, source) = (short, None);
        }
        // Many errors repeat their source in their own message.
        if out.is_empty() {
            out = text;
        } else if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = source;
    }
    out
}

/// Whether the server refused a request for the credentials: a kube API
/// error 401 Unauthorized or 403 Forbidden (RBAC), whose message names the
/// verb, resource and namespace.
pub(crate) fn is_denied(error: &kube_client::Error) -> bool {
    matches!(error, kube_client::Error::Api(s) if matches!(s.code, 401 | 403))
}

/// Whether `error`, or an error it wraps, is a refusal ([`is_denied`]).
pub(crate) fn denied_in_chain(error: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(error), |e| e.source())
        .take(64)
        .filter_map(|e| e.downcast_ref::<kube_client::Error>())
        .any(is_denied)
}

/// What a caught panic said: its `&str` or `String` payload.
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("writing the Service")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_terminal_error_anywhere_in_the_source_chain_is_terminal() {
        let bad_spec = || TerminalError(Box::new(std::io::Error::other("bad spec")));
        let outermost: ReconcileError = Box::new(bad_spec());
        let in_finalizer: ReconcileError = Box::new(crate::finalizer::FinalizerError::Reconcile(
            Box::new(bad_spec()),
        ));
        let plain: ReconcileError = Box::new(Outer(std::io::Error::other("reset")));
        assert!(is_terminal(outermost.as_ref()));
        assert!(is_terminal(in_finalizer.as_ref()));
        assert!(!is_terminal(plain.as_ref()));
    }

    #[test]
    fn a_logged_error_names_its_whole_source_chain() {
        let inner = std::io::Error::other("connection reset");
        let terminal = TerminalError::boxed(Outer(inner));
        // TerminalError's message already holds Outer's: said once.
        assert_eq!(
            chain(terminal.as_ref()),
            "terminal: writing the Service: connection reset"
        );
    }

    #[test]
    fn a_refusal_is_found_in_the_chain_and_nothing_else_is_one() {
        let status = |code: u16| {
            let mut s = kube_client::core::Status::failure("nope", "Forbidden");
            s.code = code;
            kube_client::Error::Api(s.boxed())
        };
        let direct: ReconcileError = Box::new(status(403));
        assert!(denied_in_chain(direct.as_ref()));
        let unauthorized: ReconcileError = Box::new(status(401));
        assert!(denied_in_chain(unauthorized.as_ref()));
        let wrapped: ReconcileError = Box::new(TerminalError(Box::new(status(403))));
        assert!(denied_in_chain(wrapped.as_ref()));
        let conflict: ReconcileError = Box::new(status(409));
        assert!(!denied_in_chain(conflict.as_ref()));
        assert_eq!(chain(direct.as_ref()), "403 Forbidden: nope");
        // A wrapper printing its source in its own message.
        assert_eq!(chain(wrapped.as_ref()), "terminal: 403 Forbidden: nope");
        let other: ReconcileError = "no".into();
        assert!(!denied_in_chain(other.as_ref()));
    }
}
