//! Errors of the informer layer.

use std::fmt;
use std::sync::Arc;

use kube_client::core::response::StatusCause;
use thiserror::Error;

/// What a [`ListWatchError`] was doing when it failed, with the error it
/// ran into as its `source()` when there is one (a `kube_client::Error`, an
/// HTTP or decoding error), shared so that the error stays `Clone`.
#[derive(Debug, Clone)]
pub struct Detail {
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    /// Made by [`Detail::of`]: the message is the source's own, so
    /// `source()` goes on from the source's cause, as `io::Error` does.
    transparent: bool,
}

impl Detail {
    /// `context` failed because of `source`: it reads "`context`", and
    /// `source` is its `source()`.
    pub fn caused(
        context: impl fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            message: context.to_string(),
            source: Some(Arc::new(source)),
            transparent: false,
        }
    }

    /// `source` itself, in its own words: its message, and its `source()`
    /// (reach `source` itself with [`Detail::get_ref`]).
    pub fn of(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self {
            message: source.to_string(),
            source: Some(Arc::new(source)),
            transparent: true,
        }
    }

    /// Its own message (for one made by [`Detail::of`], its error's).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error it was made from, if any.
    pub fn get_ref(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Detail {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let source = self.source.as_deref()?;
        match self.transparent {
            true => source.source(),
            false => Some(source),
        }
    }
}

impl From<String> for Detail {
    fn from(message: String) -> Self {
        Self {
            message,
            source: None,
            transparent: false,
        }
    }
}

impl From<&str> for Detail {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// `error` and its `source()`s, outermost first, each in its own words:
/// `a: b: c`. It is what logs show of an error (`error = %error_chain(&e)`),
/// since an error's `Display` is its own text only.
///
/// The server's refusal reads `403 Forbidden: its message`: kube-client's
/// own text of it adds a dump of the whole Status, which repeats the
/// message. An error of another crate that ends its message with its
/// source's (kube-client's do) is said without it, so that each cause
/// shows once.
///
/// ```
/// use kinformer_informer::{ListWatchError, error_chain};
///
/// let reset = std::io::Error::other("connection reset by peer");
/// let e = ListWatchError::from(kube_client::Error::ReadEvents(reset));
/// assert_eq!(e.to_string(), "cannot reach the API server");
/// assert_eq!(
///     error_chain(&e),
///     "cannot reach the API server: Error reading events stream: connection reset by peer"
/// );
/// ```
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = Vec::new();
    let mut next = Some(error);
    // Bounded: a source chain that loops must not hang a logger.
    for _ in 0..64 {
        let Some(e) = next else { break };
        if let Some(kube_client::Error::Api(s)) = e.downcast_ref() {
            // Its source is that Status, said here.
            parts.push(format!("{} {}: {}", s.code, s.reason, s.message));
            break;
        }
        let text = e.to_string();
        next = e.source();
        let own = next
            .map(|source| format!(": {source}"))
            .and_then(|said| text.strip_suffix(&said).map(str::to_owned))
            .unwrap_or(text);
        parts.push(own);
    }
    parts.join(": ")
}

/// A list or watch call failed. The variants are what the Reflector needs to
/// decide between re-watching, relisting and backing off.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum ListWatchError {
    /// 410 Gone: the resource version (or continue token) is too old.
    #[error("410 Gone: {0}")]
    Gone(String),
    /// 429 Too Many Requests: back off, then retry the same call.
    #[error("429 Too Many Requests: {0}")]
    TooManyRequests(String),
    /// Another error status from the API server.
    #[error("API error {code} {reason}: {message}")]
    Api {
        /// HTTP status code.
        code: u16,
        /// The status reason (`Forbidden`, `InternalError`, ...).
        reason: String,
        /// The server's message.
        message: String,
        /// The Status's `details.causes` (for example the
        /// `ResourceVersionTooLarge` cause of a list at a version the
        /// server has not reached); empty when it had none.
        causes: Vec<StatusCause>,
    },
    /// The server could not be reached (connection refused, reset, timed out).
    #[error("cannot reach the API server")]
    Connect(#[source] Detail),
    /// A response or event could not be decoded.
    #[error("cannot decode the server's response")]
    Decode(#[source] Detail),
    /// One object of a watch (or a streaming list) could not be decoded;
    /// its key, when readable, lets the Reflector keep what is cached. Its
    /// `source()` names the object and says why.
    #[error("cannot decode an object")]
    Undecodable(#[source] crate::Undecodable),
    /// A watch saw no event, not even a bookmark, for longer than its idle timeout.
    #[error("watch idle for {0:?}: treating the connection as dead")]
    Idle(std::time::Duration),
    /// What the lister-watcher lists changed (the shard of a
    /// [`ShardScope`](crate::ShardScope)): the cache must be listed again,
    /// at once. Not a failure: the Reflector relists without a backoff.
    #[error("the objects listed changed: {0}")]
    Rescoped(String),
}

impl ListWatchError {
    /// Whether the server answered 404 to a list or watch: asked for a
    /// whole collection, that means it does not serve the resource (its
    /// CustomResourceDefinition is not installed, or does not serve this
    /// version). The Reflector then waits for it (see its module docs).
    pub fn is_not_served(&self) -> bool {
        matches!(self, Self::Api { code: 404, .. })
    }

    /// Whether the error is 410 Gone.
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::Gone(_))
    }

    /// Whether the lister-watcher's scope changed ([`Self::Rescoped`]).
    pub fn is_rescoped(&self) -> bool {
        matches!(self, Self::Rescoped(_))
    }

    /// Whether the call should be retried as it was after a backoff, without
    /// relisting: 429, or the server could not be reached. A 5xx is not: as
    /// client-go, a watch that fails with one relists.
    pub fn is_retryable_in_place(&self) -> bool {
        matches!(self, Self::TooManyRequests(_) | Self::Connect(_))
    }

    /// Whether the server answered with an internal error (reason
    /// `InternalError`, or an unknown reason with code 500): client-go's
    /// `apierrors.IsInternalError`.
    pub fn is_internal_error(&self) -> bool {
        match self {
            Self::Api { code, reason, .. } => {
                reason == "InternalError" || (*code == 500 && !is_known_reason(reason))
            }
            _ => false,
        }
    }

    /// Whether the server refused a list at a resource version it has not
    /// reached yet (typically after failing over to a lagging apiserver):
    /// a cause `ResourceVersionTooLarge`, or a Timeout that says "Too large
    /// resource version" in a cause (servers 1.17.0-1.18.5) or in its
    /// message (servers before 1.17, which send no cause). client-go's
    /// `isTooLargeResourceVersionError`; the Reflector then lists at `""`.
    pub fn is_too_large_resource_version(&self) -> bool {
        const TOO_LARGE: &str = "Too large resource version";
        let Self::Api {
            code,
            reason,
            message,
            causes,
        } = self
        else {
            return false;
        };
        if causes.iter().any(|c| c.reason == "ResourceVersionTooLarge") {
            return true;
        }
        // apimachinery's IsTimeout: the reason, or a 504 whose reason it
        // does not know.
        let timeout = reason == "Timeout" || (*code == 504 && !is_known_reason(reason));
        // client-go also wants the Status to have `details` before it reads
        // causes or message. Whether it had is not kept here; the
        // apiservers that send these words build the Status with
        // `NewTimeoutError`, which always sets details.
        timeout && (causes.iter().any(|c| c.message == TOO_LARGE) || message.contains(TOO_LARGE))
    }

    pub(crate) fn from_status(status: &kube_client::core::Status) -> Self {
        match status.code {
            410 => Self::Gone(status.message.clone()),
            429 => Self::TooManyRequests(status.message.clone()),
            code => Self::Api {
                code,
                reason: status.reason.clone(),
                message: status.message.clone(),
                causes: status
                    .details
                    .as_ref()
                    .map(|d| d.causes.clone())
                    .unwrap_or_default(),
            },
        }
    }
}

/// The Status reasons apimachinery knows (its `knownReasons`): a code is
/// read on its own only for a reason outside this list.
fn is_known_reason(reason: &str) -> bool {
    matches!(
        reason,
        "" | "Unauthorized"
            | "Forbidden"
            | "NotFound"
            | "AlreadyExists"
            | "Conflict"
            | "Gone"
            | "Invalid"
            | "ServerTimeout"
            | "StoreReadError"
            | "Timeout"
            | "TooManyRequests"
            | "BadRequest"
            | "MethodNotAllowed"
            | "NotAcceptable"
            | "RequestEntityTooLarge"
            | "UnsupportedMediaType"
            | "InternalError"
            | "Expired"
            | "ServiceUnavailable"
    )
}

impl From<kube_client::Error> for ListWatchError {
    fn from(e: kube_client::Error) -> Self {
        use kube_client::Error as E;
        match e {
            // kube-client reads a line it cannot decode as an event as a
            // Status, which then has no code: it is a decoding failure.
            E::Api(status) if status.code == 0 => {
                Self::Decode(format!("undecodable watch event ({})", status.message).into())
            }
            E::Api(status) => Self::from_status(&status),
            E::SerdeError(e) => Self::Decode(Detail::of(e)),
            other => Self::Connect(Detail::of(other)),
        }
    }
}

impl From<kinformer_protobuf::Error> for ListWatchError {
    fn from(e: kinformer_protobuf::Error) -> Self {
        use kinformer_protobuf::Error as E;
        match e {
            E::Kube(kube_client::Error::Api(status)) => Self::from_status(&status),
            E::Kube(e) => e.into(),
            e @ E::Decode { .. } => Self::Decode(Detail::of(e)),
            E::Undecodable(u) => Self::Undecodable(u),
            E::Read(e) => Self::Connect(Detail::of(e)),
            // A variant added later: kept whole, as its source.
            e => Self::Connect(Detail::of(e)),
        }
    }
}

/// Why an informer cannot tell, or no longer waits to see, whether its
/// cache has caught up with a resourceVersion.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CatchUpError {
    /// The informer's queue does not apply changes in watch order with
    /// relists at once, so its cache's version says nothing (only
    /// [`FifoKind::AtomicFifo`](crate::FifoKind::AtomicFifo), the default,
    /// keeps it).
    #[error(
        "the informer of {what} cannot say which resourceVersion its cache holds: its queue is not the in-order atomic one"
    )]
    NotInOrder {
        /// What the informer lists.
        what: String,
    },
    /// A version that cannot be ordered: not a positive decimal integer
    /// (an aggregated API server's, say), the cache's or the one asked for.
    #[error("the informer of {what} cannot order resourceVersions")]
    Incomparable {
        /// What the informer lists.
        what: String,
        /// The version that is not well formed.
        source: kinformer_store::InvalidResourceVersion,
    },
    /// The informer stopped before its cache reached the version.
    #[error(
        "the informer of {what} stopped before its cache reached resourceVersion {resource_version}"
    )]
    Stopped {
        /// What the informer lists.
        what: String,
        /// The version waited for.
        resource_version: String,
    },
}

/// Using an informer failed, or a running informer could no longer keep
/// its cache in step with the server.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum InformerError {
    /// The informer was already started, so this can no longer be changed.
    #[error("{0} must be set before the informer starts")]
    AlreadyStarted(&'static str),
    /// The registration handed to `remove_event_handler` belongs to another
    /// informer; nothing was removed.
    #[error(
        "event handler registration {registration} belongs to informer {owner}, not to informer {informer} ({what}); nothing was removed"
    )]
    ForeignHandler {
        /// The registration's id.
        registration: u64,
        /// The id of the informer it belongs to.
        owner: u64,
        /// The id of the informer it was handed to.
        informer: u64,
        /// What that informer lists and watches.
        what: String,
    },
    /// The informer has stopped; no handler can be added.
    #[error("the informer has stopped")]
    Stopped,
    /// The informer stopped keeping its cache in step with the server before
    /// its shutdown token fired: its Reflector died (panicked), applying
    /// deltas to the cache panicked, or `run` was dropped. The cache is
    /// frozen; the informer no longer reports itself synced.
    #[error(
        "the informer of {what} failed: {reason}; its cache is no longer kept in step with the server"
    )]
    Failed {
        /// What the informer lists and watches.
        what: String,
        /// What happened.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_client::core::Status;

    #[test]
    fn a_client_error_stays_in_the_source_chain() {
        use std::error::Error as _;
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let e = ListWatchError::from(kube_client::Error::ReadEvents(reset));
        assert!(e.is_retryable_in_place(), "{e:?}");
        let mut chain =
            std::iter::successors(Some(&e as &dyn std::error::Error), |e| (*e).source());
        let io = chain
            .find_map(|e| e.downcast_ref::<std::io::Error>())
            .expect("the io::Error is a source");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
        // The cause is said by the chain, once, and the error is still Clone.
        assert_eq!(e.clone().to_string(), "cannot reach the API server");
        assert_eq!(error_chain(&e).matches("reset by peer").count(), 1);

        let bad = serde_json::from_str::<u8>("x").unwrap_err();
        let e = ListWatchError::from(kube_client::Error::SerdeError(bad));
        let detail = e.source().and_then(|d| d.downcast_ref::<Detail>());
        let client = detail
            .and_then(Detail::get_ref)
            .expect("the client's error");
        assert!(client.is::<serde_json::Error>(), "{client:?}");
    }

    #[test]
    fn a_wrapped_error_says_its_own_text_and_its_cause_is_its_source() {
        use std::error::Error as _;
        let bad = serde_json::from_str::<u8>("x").unwrap_err();
        let cause = bad.to_string();
        let e = ListWatchError::Decode(Detail::caused("the list", bad));
        assert_eq!(e.to_string(), "cannot decode the server's response");
        let detail = e.source().expect("the detail is the source");
        assert_eq!(detail.to_string(), "the list");
        assert_eq!(detail.source().map(|s| s.to_string()), Some(cause.clone()));
        assert_eq!(
            error_chain(&e),
            format!("cannot decode the server's response: the list: {cause}")
        );

        let e = CatchUpError::Incomparable {
            what: "pods".into(),
            source: kinformer_store::InvalidResourceVersion("x1".into()),
        };
        assert!(!e.to_string().contains("x1"), "{e}");
        assert!(error_chain(&e).ends_with(
            "cannot order resourceVersions: resource version is not well formed: \"x1\""
        ));
    }

    #[test]
    fn the_chain_says_each_cause_once_and_a_refusal_in_short() {
        let reset = std::io::Error::other("connection reset");
        let e = ListWatchError::Connect(Detail::caused(
            "building the list request",
            kube_client::Error::ReadEvents(reset),
        ));
        // kube-client's message repeats its source's: said once here.
        assert_eq!(
            error_chain(&e),
            "cannot reach the API server: building the list request: \
             Error reading events stream: connection reset"
        );
        let mut forbidden = kube_client::core::Status::failure("pods is forbidden", "Forbidden");
        forbidden.code = 403;
        let e = Detail::caused("listing pods", kube_client::Error::Api(forbidden.boxed()));
        assert_eq!(
            error_chain(&e),
            "listing pods: 403 Forbidden: pods is forbidden"
        );
        // A message that merely contains its source's text is its own.
        let e = Detail::caused("reset", std::io::Error::other("reset"));
        assert_eq!(error_chain(&e), "reset: reset");
    }

    fn status(json: serde_json::Value) -> ListWatchError {
        ListWatchError::from_status(&serde_json::from_value::<Status>(json).unwrap())
    }

    /// What a 1.37 apiserver answers to a list at a version its watch cache
    /// has not reached (`NewTooLargeResourceVersionError`).
    fn too_large() -> serde_json::Value {
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "Timeout: Too large resource version: 2000, current: 1000",
            "reason": "Timeout", "code": 504,
            "details": {
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1
            }
        })
    }

    #[test]
    fn an_api_error_keeps_the_causes_of_its_status() {
        match status(too_large()) {
            ListWatchError::Api { code, causes, .. } => {
                assert_eq!(code, 504);
                assert_eq!(causes.len(), 1);
                assert_eq!(causes[0].reason, "ResourceVersionTooLarge");
            }
            other => panic!("expected Api, got {other:?}"),
        }
    }

    #[test]
    fn too_large_resource_version_is_read_from_its_cause_or_from_the_old_timeout_message() {
        assert!(status(too_large()).is_too_large_resource_version());
        // Servers 1.17.0-1.18.5: no cause type, the message in a Timeout.
        let old = serde_json::json!({
            "status": "Failure", "reason": "Timeout", "code": 504, "message": "Timeout",
            "details": {"causes": [{"message": "Too large resource version"}]}
        });
        assert!(status(old).is_too_large_resource_version());
        // Servers before 1.17: no cause at all, only the message
        // (`NewTimeoutError`'s "Timeout: " prefix included).
        let older = serde_json::json!({
            "status": "Failure", "reason": "Timeout", "code": 504,
            "message": "Timeout: Too large resource version: 2000, current: 1000",
            "details": {"retryAfterSeconds": 1}
        });
        assert!(status(older).is_too_large_resource_version());
        // The same read as a 504 with a reason apimachinery does not know.
        let unknown = serde_json::json!({
            "status": "Failure", "reason": "SomethingNew", "code": 504,
            "message": "Too large resource version: 2000, current: 1000"
        });
        assert!(status(unknown).is_too_large_resource_version());
        // A Timeout for any other reason is not one.
        let timeout = serde_json::json!({
            "status": "Failure", "reason": "Timeout", "code": 504,
            "details": {"causes": [{"message": "request did not complete within 60s"}]}
        });
        assert!(!status(timeout).is_too_large_resource_version());
        // Nor is the message in something other than a Timeout.
        let internal = serde_json::json!({
            "status": "Failure", "reason": "InternalError", "code": 500,
            "details": {"causes": [{"message": "Too large resource version"}]}
        });
        assert!(!status(internal).is_too_large_resource_version());
        let internal = serde_json::json!({
            "status": "Failure", "reason": "InternalError", "code": 500,
            "message": "Too large resource version: 2000, current: 1000"
        });
        assert!(!status(internal).is_too_large_resource_version());
        // Nor a 504 whose known reason is not Timeout.
        let unavailable = serde_json::json!({
            "status": "Failure", "reason": "ServiceUnavailable", "code": 504,
            "message": "Too large resource version: 2000, current: 1000"
        });
        assert!(!status(unavailable).is_too_large_resource_version());
    }

    #[test]
    fn an_internal_error_is_its_reason_or_a_500_with_an_unknown_reason() {
        let e = |code, reason: &str| status(serde_json::json!({"code": code, "reason": reason}));
        assert!(e(500, "InternalError").is_internal_error());
        // kube-client's reason for a body that is not a Status.
        assert!(e(500, "Failed to parse error data").is_internal_error());
        assert!(!e(500, "ServiceUnavailable").is_internal_error());
        assert!(!e(503, "ServiceUnavailable").is_internal_error());
        assert!(!e(504, "Timeout").is_internal_error());
    }

    #[test]
    fn a_5xx_is_not_retried_in_place() {
        let e = status(serde_json::json!({"code": 503, "reason": "ServiceUnavailable"}));
        assert!(!e.is_retryable_in_place());
        assert!(ListWatchError::TooManyRequests(String::new()).is_retryable_in_place());
        assert!(ListWatchError::Connect(String::new().into()).is_retryable_in_place());
    }
}
