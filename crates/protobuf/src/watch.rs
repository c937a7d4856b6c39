//! A protobuf watch: length-prefixed frames, each a `WatchEvent` whose
//! object is a `k8s\0` envelope, read off the body one at a time into one
//! reused buffer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use futures::stream::BoxStream;
use kube_client::Resource;
use kube_client::core::WatchEvent;
use serde::de::DeserializeOwned;

use crate::envelope;
use crate::{Error, Kind, Undecodable};

/// The largest watch frame accepted: client-go's default is 100 MiB less
/// a little; one object is at most etcd's 1.5 MiB request limit plus the
/// envelope, so anything near this is a corrupt length.
pub const MAX_FRAME: usize = 64 << 20;

/// A response's body as an async reader, for [`events`].
pub fn body_reader(
    response: http::Response<kube_client::client::Body>,
) -> impl futures::AsyncBufRead + Send + Unpin + 'static {
    futures::TryStreamExt::into_async_read(futures::TryStreamExt::map_err(
        http_body_util::BodyDataStream::new(response.into_body()),
        std::io::Error::other,
    ))
}

/// The events of a protobuf watch body of `kind`'s objects, with
/// `metadata.managedFields` left out (never decoded) when
/// `drop_managed_fields`. The stream ends where the server or the network
/// ended the watch ([`is_resumable_end`]): watch again from the last
/// version seen. An ERROR event is its `Status` as
/// `kube_client::Error::Api` (410 Gone: list again); an object that does
/// not decode is [`Error::Undecodable`], and the events after it still
/// come. Each frame's bytes are added to `received`, if given.
pub fn events<K>(
    body: impl futures::AsyncRead + Send + Unpin + 'static,
    kind: &'static Kind,
    drop_managed_fields: bool,
    received: Option<Arc<AtomicU64>>,
) -> BoxStream<'static, Result<WatchEvent<K>, Error>>
where
    K: Resource + DeserializeOwned + Send + 'static,
{
    futures::stream::unfold((body, Vec::new()), move |(mut body, mut frame)| {
        let received = received.clone();
        async move {
            use futures::AsyncReadExt;
            let mut len = [0u8; 4];
            if let Err(e) = body.read_exact(&mut len).await {
                return resumable_or(e).map(|e| (Err(e), (body, frame)));
            }
            let len = u32::from_be_bytes(len) as usize;
            if len > MAX_FRAME {
                let e = Error::Decode(crate::ProtobufError::new(format!(
                    "a watch frame of {len} bytes, over the {MAX_FRAME} byte limit"
                )));
                return Some((Err(e), (body, frame)));
            }
            frame.resize(len, 0);
            if let Err(e) = body.read_exact(&mut frame).await {
                return resumable_or(e).map(|e| (Err(e), (body, frame)));
            }
            if let Some(received) = &received {
                received.fetch_add(4 + len as u64, Ordering::Relaxed);
            }
            let event = decode_event::<K>(&frame, kind, drop_managed_fields);
            Some((event, (body, frame)))
        }
    })
    .boxed()
}

/// `None` for the end of a watch the server or the network ended
/// (resumable); the error otherwise.
fn resumable_or(e: std::io::Error) -> Option<Error> {
    (!is_resumable_end(&e)).then_some(Error::Read(e))
}

/// Whether a read error is the end of a watch the server or the network
/// ended (resumable at once), as kube-client's own watch decides: an
/// `UnexpectedEof` anywhere in the chain (TLS stacks nest it; a body
/// stream wraps every error in `io::Error::other`), or the chunk decoder's
/// "unexpected EOF during chunk".
pub fn is_resumable_end(e: &std::io::Error) -> bool {
    if e.kind() == std::io::ErrorKind::UnexpectedEof
        || e.to_string().contains("unexpected EOF during chunk")
    {
        return true;
    }
    let mut current: Option<&(dyn std::error::Error + 'static)> = e
        .get_ref()
        .map(|inner| inner as &(dyn std::error::Error + 'static));
    // A bounded walk, in case a `source` chain cycles.
    for _ in 0..16 {
        let Some(err) = current else {
            return false;
        };
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof)
            || err.to_string().contains("unexpected EOF during chunk")
        {
            return true;
        }
        current = err.source();
    }
    false
}

/// One protobuf watch frame (without its length prefix) as an event of
/// `kind`'s objects, or the `Status` the server sent instead (an ERROR
/// event) as `kube_client::Error::Api`.
pub fn decode_event<K: Resource + DeserializeOwned>(
    frame: &[u8],
    kind: &Kind,
    drop_managed_fields: bool,
) -> Result<WatchEvent<K>, Error> {
    let event = envelope::event(frame)?;
    let object = |event: &envelope::Event<'_>| {
        envelope::object::<K>(&event.object, kind, drop_managed_fields).map_err(|e| {
            Error::Undecodable(Undecodable::new(envelope::object_key(event.object.raw), e))
        })
    };
    Ok(match event.type_ {
        "ADDED" => WatchEvent::Added(object(&event)?),
        "MODIFIED" => WatchEvent::Modified(object(&event)?),
        "DELETED" => WatchEvent::Deleted(object(&event)?),
        "BOOKMARK" => {
            let obj: K = object(&event)?;
            let meta = obj.meta();
            WatchEvent::Bookmark(kube_client::core::watch::Bookmark {
                types: kube_client::core::TypeMeta {
                    api_version: kind.api_version.to_owned(),
                    kind: kind.kind.to_owned(),
                },
                metadata: kube_client::core::watch::BookmarkMeta {
                    resource_version: meta.resource_version.clone().unwrap_or_default(),
                    annotations: meta.annotations.clone().unwrap_or_default(),
                },
            })
        }
        "ERROR" => {
            let status = envelope::status(&event.object)?;
            return Err(Error::Kube(kube_client::Error::Api(Box::new(status))));
        }
        other => {
            return Err(Error::Decode(crate::ProtobufError::new(format!(
                "a watch event of unknown type {other:?}"
            ))));
        }
    })
}
