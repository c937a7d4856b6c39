//! What can go wrong decoding, getting, listing or watching in protobuf:
//! one [`Error`], and [`Undecodable`], an object named and skipped.

use crate::decode::DecodeError;

/// Decoding protobuf, or a get, list or watch in protobuf, failed.
///
/// Each variant says what failed; the cause, when there is one, is its
/// `source()`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request could not be sent, or the server refused it: the source
    /// is kube-client's error, and a refusal is `kube_client::Error::Api`
    /// with the server's `Status`, as kube-client's `Api` reports it (a 404
    /// is `Api` with code 404).
    #[error("the request to the API server failed")]
    Kube(#[from] kube_client::Error),
    /// The bytes are not the protobuf of what was asked for (a malformed
    /// frame or envelope, another kind), or `K` has no known protobuf.
    #[error("undecodable protobuf: {message}")]
    Decode {
        /// What is wrong with the bytes, or with the kind.
        message: String,
        /// The error of JSON embedded in the protobuf (a custom resource's
        /// schema, a `RawExtension`) that did not decode.
        #[source]
        json: Option<serde_json::Error>,
    },
    /// One object (an item of a list, the object of a watch event) did not
    /// decode; the source names it and says why.
    #[error("undecodable object")]
    Undecodable(#[source] Undecodable),
    /// Reading the body failed.
    #[error("reading the response failed")]
    Read(#[source] std::io::Error),
}

impl Error {
    /// A [`Error::Decode`] with no cause.
    pub(crate) fn decode(message: impl Into<String>) -> Self {
        Self::Decode {
            message: message.into(),
            json: None,
        }
    }
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        let (message, json) = e.into_parts();
        Self::Decode { message, json }
    }
}

/// An object of a list or a watch that could not be decoded, named as far
/// as its bytes allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    /// `namespace/name` (or `name`) as read from its bytes; `None` when
    /// even that could not be read.
    pub key: Option<String>,
    /// What was wrong, naming the object.
    pub reason: String,
}

impl Undecodable {
    /// The object under `key` (if known) could not be decoded because of `why`.
    pub fn new(key: Option<String>, why: impl std::fmt::Display) -> Self {
        let name = key
            .as_deref()
            .unwrap_or("an object without a readable name");
        Self {
            reason: format!("{name}: {why}"),
            key,
        }
    }
}

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Undecodable {}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_wrapped_error_says_its_own_text_and_its_cause_is_its_source() {
        let reset = std::io::Error::other("connection reset");
        let e = Error::Read(reset);
        assert_eq!(e.to_string(), "reading the response failed");
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("connection reset")
        );

        let forbidden = kube_client::Error::Api(
            kube_client::core::Status::failure("pods is forbidden", "Forbidden").boxed(),
        );
        let e = Error::from(forbidden);
        assert!(!e.to_string().contains("forbidden"), "{e}");
        let kube = e
            .source()
            .and_then(|s| s.downcast_ref::<kube_client::Error>());
        assert!(matches!(kube, Some(kube_client::Error::Api(_))), "{e:?}");

        let e = Error::Undecodable(Undecodable::new(Some("ns/a".into()), "truncated varint"));
        assert_eq!(e.to_string(), "undecodable object");
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("ns/a: truncated varint")
        );
    }
}
