//! What can go wrong getting, listing or watching in protobuf.

use crate::ProtobufError;

/// A get, list or watch in protobuf failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request could not be sent, or the server refused it: its
    /// `Status` is `kube_client::Error::Api`, as kube-client's `Api`
    /// reports it (a 404 is `Api` with code 404).
    #[error(transparent)]
    Kube(#[from] kube_client::Error),
    /// The body is not the protobuf of what was asked for: a malformed
    /// frame or envelope, or another kind.
    #[error("undecodable protobuf: {0}")]
    Decode(#[from] ProtobufError),
    /// One object (an item of a list, the object of a watch event) did not
    /// decode; it is named.
    #[error("undecodable object {0}")]
    Undecodable(Undecodable),
    /// Reading the body failed.
    #[error("reading the response: {0}")]
    Read(#[source] std::io::Error),
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
