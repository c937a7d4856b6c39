//! Errors of the informer layer.

use thiserror::Error;

/// A list or watch call failed. The variants are what the Reflector needs to
/// decide between re-watching, relisting and backing off.
#[derive(Debug, Clone, Error)]
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
    },
    /// The server could not be reached (connection refused, reset, timed out).
    #[error("cannot reach the API server: {0}")]
    Connect(String),
    /// A response or event could not be decoded.
    #[error("cannot decode the server's response: {0}")]
    Decode(String),
    /// A watch saw no event, not even a bookmark, for longer than its idle timeout.
    #[error("watch idle for {0:?}: treating the connection as dead")]
    Idle(std::time::Duration),
}

impl ListWatchError {
    /// Whether the error is 410 Gone.
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::Gone(_))
    }

    /// Whether the call should be retried as it was after a backoff, without
    /// relisting (the server is there but busy or briefly unreachable).
    pub fn is_retryable_in_place(&self) -> bool {
        match self {
            Self::TooManyRequests(_) | Self::Connect(_) => true,
            Self::Api { code, .. } => *code >= 500,
            _ => false,
        }
    }

    pub(crate) fn from_status(status: &kube_client::core::Status) -> Self {
        match status.code {
            410 => Self::Gone(status.message.clone()),
            429 => Self::TooManyRequests(status.message.clone()),
            code => Self::Api {
                code,
                reason: status.reason.clone(),
                message: status.message.clone(),
            },
        }
    }
}

impl From<kube_client::Error> for ListWatchError {
    fn from(e: kube_client::Error) -> Self {
        use kube_client::Error as E;
        match e {
            // kube-client reads a line it cannot decode as an event as a
            // Status, which then has no code: it is a decoding failure.
            E::Api(status) if status.code == 0 => {
                Self::Decode(format!("undecodable watch event ({})", status.message))
            }
            E::Api(status) => Self::from_status(&status),
            E::SerdeError(e) => Self::Decode(e.to_string()),
            other => Self::Connect(other.to_string()),
        }
    }
}

/// Using an informer failed, or a running informer could no longer keep
/// its cache in step with the server.
#[derive(Debug, Clone, Error)]
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
