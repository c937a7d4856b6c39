//! What a reconcile returns: [`Action`], [`ReconcileError`] and
//! [`TerminalError`]; the [`Reconciler`] trait and [`Lookup`], the object a
//! closure reconciler receives; and what the server answered, read from an
//! error's `source()` chain: [`is_not_found`], [`is_conflict`],
//! [`is_forbidden`].

use crate::reason::Reason;
#[cfg(doc)]
use crate::{Controller, ControllerError};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kinformer_store::{CacheReader, Object, ObjectKey};
use kube_client::core::Status;

/// `error` and its causes in one line, for logs (see
/// [`error_chain`](kinformer_informer::error_chain)).
pub(crate) use kinformer_informer::error_chain as chain;

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
/// controller-runtime's `reconcile.TerminalError`. It reads "terminal";
/// its `source()` is the error it wraps.
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
        f.write_str("terminal")
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

/// What a worker asks a [`Reconciler`] to reconcile: which object, and why
/// its key was queued (controller-runtime's `reconcile.Request`, with
/// kube-runtime's reason beside it).
///
/// The queue folds the events of one key into one request, whatever their
/// reasons: the first since the key was last taken is the one given. It is
/// `#[non_exhaustive]` so that what identifies an object can grow (the
/// cluster it lives in) without breaking a reconciler that reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Request {
    /// The object's key.
    pub key: ObjectKey,
    /// Why it was queued.
    pub reason: Reason,
}

impl Request {
    /// A request for `key`, queued for `reason` (to call a reconciler in
    /// a test, say).
    pub fn new(key: ObjectKey, reason: Reason) -> Self {
        Self { key, reason }
    }
}

impl From<ObjectKey> for Request {
    /// A request for `key`, its reason [`Reason::Unknown`].
    fn from(key: ObjectKey) -> Self {
        Self::new(key, Reason::Unknown)
    }
}

/// Brings the world in line with the cached state of one object.
///
/// `reconcile` receives a [`Request`] naming the object and must read the
/// object from a Lister, not from the event: it is level-based, so it must
/// do the right thing whatever happened before, including nothing.
pub trait Reconciler: Send + Sync + 'static {
    /// Reconciles the object `request` names.
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>>;
}

impl<R: Reconciler + ?Sized> Reconciler for Arc<R> {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        (**self).reconcile(request)
    }
}

/// What a reconcile finds in the cache for its key.
#[derive(Debug)]
pub enum Lookup<K> {
    /// The object as cached now.
    Found(Arc<K>),
    /// No such object any more: it was deleted (run cleanup here).
    Gone {
        /// Its key.
        key: ObjectKey,
    },
}

/// A [`Reconciler`] from an async closure that receives the object read
/// from the cache at reconcile time (or that it is gone); see
/// [`Controller::from_fn`].
pub struct FnReconciler<K, F> {
    pub(crate) cache: CacheReader<K>,
    pub(crate) f: F,
}

impl<K, F> std::fmt::Debug for FnReconciler<K, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnReconciler").finish_non_exhaustive()
    }
}

impl<K, F, Fut> Reconciler for FnReconciler<K, F>
where
    K: Object,
    F: Fn(Lookup<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let lookup = match self.cache.get_by_key(request.key.as_str()) {
            Some(obj) => Lookup::Found(obj),
            None => Lookup::Gone {
                key: request.key.clone(),
            },
        };
        Box::pin((self.f)(lookup))
    }
}

/// Whether the server refused a request for the credentials: a kube API
/// error 401 Unauthorized or 403 Forbidden (RBAC), whose message names the
/// verb, resource and namespace.
pub(crate) fn is_denied(error: &kube_client::Error) -> bool {
    matches!(error, kube_client::Error::Api(s) if matches!(s.code, 401 | 403))
}

/// Whether `error`, or an error it wraps, is a refusal ([`is_denied`]).
pub(crate) fn denied_in_chain(error: &(dyn std::error::Error + 'static)) -> bool {
    statuses(error).any(|s| matches!(s.code, 401 | 403))
}

/// Whether the server answered 404 Not Found to a request that `error`
/// or an error in its `source()` chain reports (a `kube_client::Error::Api`
/// with code 404), as client-go's `apierrors.IsNotFound`.
///
/// ```
/// use kinformer_controllers::kube::{Error, core::Status};
/// use kinformer_controllers::{ReconcileError, TerminalError, is_not_found};
///
/// let gone = Status::failure(r#"configmaps "a" not found"#, "NotFound").with_code(404);
/// let e: ReconcileError = TerminalError::boxed(Error::Api(gone.boxed()));
/// assert!(is_not_found(e.as_ref()));
/// ```
pub fn is_not_found(error: &(dyn std::error::Error + 'static)) -> bool {
    statuses(error).any(|s| s.code == 404)
}

/// Whether the server answered 409 Conflict to a request that `error` or
/// an error in its `source()` chain reports: a write based on a stale
/// `resourceVersion` (read again, then retry), as client-go's
/// `apierrors.IsConflict`, or a create of a name that exists (reason
/// `AlreadyExists`, the same code).
///
/// ```
/// use kinformer_controllers::kube::{Error, core::Status};
/// use kinformer_controllers::{ReconcileError, is_conflict};
///
/// let stale = Status::failure("the object has been modified", "Conflict").with_code(409);
/// let e: ReconcileError = Box::new(Error::Api(stale.boxed()));
/// assert!(is_conflict(e.as_ref()));
/// ```
pub fn is_conflict(error: &(dyn std::error::Error + 'static)) -> bool {
    statuses(error).any(|s| s.code == 409)
}

/// Whether the server answered 403 Forbidden (RBAC refused the verb on
/// the resource) to a request that `error` or an error in its `source()`
/// chain reports, as client-go's `apierrors.IsForbidden`.
///
/// ```
/// use kinformer_controllers::kube::{Error, core::Status};
/// use kinformer_controllers::{ReconcileError, is_forbidden};
///
/// let denied = Status::failure(r#"secrets "a" is forbidden"#, "Forbidden").with_code(403);
/// let e: ReconcileError = Box::new(Error::Api(denied.boxed()));
/// assert!(is_forbidden(e.as_ref()));
/// let other: ReconcileError = "secrets are forbidden here".into();
/// assert!(!is_forbidden(other.as_ref()));
/// ```
pub fn is_forbidden(error: &(dyn std::error::Error + 'static)) -> bool {
    statuses(error).any(|s| s.code == 403)
}

/// The server's answers in `error`'s `source()` chain, outermost first: a
/// `kube_client::Error::Api`'s, or a `Status` found on its own (behind a
/// wrapper that is `#[error(transparent)]` over a `kube_client::Error`).
fn statuses<'a>(error: &'a (dyn std::error::Error + 'static)) -> impl Iterator<Item = &'a Status> {
    // Bounded: a source chain that loops must not hang a worker.
    std::iter::successors(Some(error), |e| (*e).source())
        .take(64)
        .filter_map(|e| match e.downcast_ref::<kube_client::Error>() {
            Some(kube_client::Error::Api(s)) => Some(s.as_ref()),
            // kube-client's source is its `Box<Status>` itself.
            _ => e
                .downcast_ref::<Box<Status>>()
                .map(Box::as_ref)
                .or_else(|| e.downcast_ref::<Status>()),
        })
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
        assert_eq!(
            chain(terminal.as_ref()),
            "terminal: writing the Service: connection reset"
        );
    }

    #[test]
    fn a_terminal_error_says_terminal_and_its_cause_is_its_source_only() {
        let terminal = TerminalError(Box::new(Outer(std::io::Error::other("reset"))));
        assert_eq!(terminal.to_string(), "terminal");
        let finalizer = crate::finalizer::FinalizerError::Reconcile(Box::new(terminal));
        assert_eq!(finalizer.to_string(), "reconcile failed");
        // Each cause once, in order, though two say the same words.
        let twice = Outer(std::io::Error::other("writing the Service"));
        assert_eq!(chain(&twice), "writing the Service: writing the Service");
        assert_eq!(
            chain(&finalizer),
            "reconcile failed: terminal: writing the Service: reset"
        );
    }

    fn api_error(code: u16, reason: &str) -> kube_client::Error {
        let status = Status::failure("the server says no", reason).with_code(code);
        kube_client::Error::Api(status.boxed())
    }

    #[test]
    fn the_servers_answer_is_read_from_anywhere_in_the_source_chain() {
        let finalizer = |e| crate::finalizer::FinalizerError::Add {
            finalizer: "example.com/cleanup".into(),
            object: "ns/a".into(),
            source: e,
        };
        let not_found: ReconcileError = Box::new(finalizer(api_error(404, "NotFound")));
        assert!(is_not_found(not_found.as_ref()));
        assert!(!is_conflict(not_found.as_ref()) && !is_forbidden(not_found.as_ref()));
        let conflict = TerminalError::boxed(finalizer(api_error(409, "Conflict")));
        assert!(is_conflict(conflict.as_ref()));
        assert!(!is_not_found(conflict.as_ref()));
        let forbidden: ReconcileError = Box::new(api_error(403, "Forbidden"));
        assert!(is_forbidden(forbidden.as_ref()));
        // 401 is a refusal, but not Forbidden.
        let unauthorized: ReconcileError = Box::new(api_error(401, "Unauthorized"));
        assert!(!is_forbidden(unauthorized.as_ref()));
        assert!(denied_in_chain(unauthorized.as_ref()));
        // Behind a transparent wrapper, the Status itself is found.
        #[derive(Debug, thiserror::Error)]
        #[error(transparent)]
        struct Transparent(kube_client::Error);
        let hidden = Transparent(api_error(404, "NotFound"));
        assert!(is_not_found(&hidden));
        // Words are not codes.
        let said: ReconcileError = "404 NotFound: 409 Conflict: 403 Forbidden".into();
        assert!(!is_not_found(said.as_ref()) && !is_conflict(said.as_ref()));
        assert!(!is_forbidden(said.as_ref()));
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
        // kube-client's text of it (a dump of the Status) is said in short.
        assert_eq!(chain(wrapped.as_ref()), "terminal: 403 Forbidden: nope");
        let other: ReconcileError = "no".into();
        assert!(!denied_in_chain(other.as_ref()));
    }
}
