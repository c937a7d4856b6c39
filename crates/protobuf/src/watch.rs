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
/// come. A frame longer than [`MAX_FRAME`] or a failed read loses the
/// framing: the stream yields that error, then ends. Each frame's bytes
/// are added to `received`, if given.
pub fn events<K>(
    body: impl futures::AsyncRead + Send + Unpin + 'static,
    kind: &'static Kind,
    drop_managed_fields: bool,
    received: Option<Arc<AtomicU64>>,
) -> BoxStream<'static, Result<WatchEvent<K>, Error>>
where
    K: Resource + DeserializeOwned + Send + 'static,
{
    // `None` once the framing is lost: the bytes after a frame too large to
    // read, or after a failed read, are not frames, whatever they look like.
    futures::stream::unfold(Some((body, Vec::new())), move |state| {
        let received = received.clone();
        async move {
            use futures::AsyncReadExt;
            let (mut body, mut frame) = state?;
            let mut len = [0u8; 4];
            if let Err(e) = body.read_exact(&mut len).await {
                return resumable_or(e).map(|e| (Err(e), None));
            }
            let len = u32::from_be_bytes(len) as usize;
            if len > MAX_FRAME {
                let e = Error::decode(format!(
                    "a watch frame of {len} bytes, over the {MAX_FRAME} byte limit"
                ));
                return Some((Err(e), None));
            }
            frame.resize(len, 0);
            if let Err(e) = body.read_exact(&mut frame).await {
                return resumable_or(e).map(|e| (Err(e), None));
            }
            if let Some(received) = &received {
                received.fetch_add(4 + len as u64, Ordering::Relaxed);
            }
            let event = decode_event::<K>(&frame, kind, drop_managed_fields);
            Some((event, Some((body, frame))))
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
            let key = envelope::object_key(event.object.raw);
            Error::Undecodable(Undecodable::new(key, e.with_cause()))
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
            return Err(Error::decode(format!(
                "a watch event of unknown type {other:?}"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    /// A length-delimited protobuf field.
    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![number << 3 | 2];
        let mut len = bytes.len();
        while len >= 0x80 {
            out.push((len as u8) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(bytes);
        out
    }

    /// A watch frame, its length prefix first: `type_` of a ConfigMap `name`.
    fn frame(type_: &str, name: &str) -> Vec<u8> {
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let config_map = field(1, &field(1, name.as_bytes()));
        let object = [&b"k8s\0"[..], &field(1, &type_meta), &field(2, &config_map)].concat();
        let event = [field(1, type_.as_bytes()), field(2, &field(1, &object))].concat();
        [&(event.len() as u32).to_be_bytes()[..], &event].concat()
    }

    /// What a watch body of `bytes` yields: each event's type and name, or
    /// the error.
    async fn read_all(bytes: Vec<u8>) -> Vec<Result<String, String>> {
        let kind = crate::kind_of::<ConfigMap>(&()).unwrap();
        events::<ConfigMap>(futures::io::Cursor::new(bytes), kind, false, None)
            .map(|event| match event {
                Ok(WatchEvent::Added(cm)) => Ok(format!("ADDED {}", cm.metadata.name.unwrap())),
                Ok(other) => Ok(format!("{other:?}")),
                Err(e) => Err(e.to_string()),
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn the_stream_ends_at_a_frame_over_the_limit_and_never_reads_its_payload_as_frames() {
        let smuggled = frame("ADDED", "smuggled");
        let body = [
            frame("ADDED", "first"),
            (MAX_FRAME as u32 + 1).to_be_bytes().to_vec(),
            smuggled.clone(),
            smuggled,
        ]
        .concat();
        let read = read_all(body).await;
        assert_eq!(read.len(), 2, "{read:?}");
        assert_eq!(read[0], Ok("ADDED first".to_owned()));
        let e = read[1].as_ref().unwrap_err();
        assert!(e.contains("over the 67108864 byte limit"), "{e}");
    }

    /// A body read in the pieces given, each its bytes or a read error.
    struct Pieces(std::collections::VecDeque<std::io::Result<Vec<u8>>>);

    impl futures::AsyncRead for Pieces {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut [u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let Some(piece) = self.0.pop_front() else {
                return std::task::Poll::Ready(Ok(0));
            };
            let mut piece = piece?;
            let n = piece.len().min(buf.len());
            buf[..n].copy_from_slice(&piece[..n]);
            if n < piece.len() {
                self.0.push_front(Ok(piece.split_off(n)));
            }
            std::task::Poll::Ready(Ok(n))
        }
    }

    #[tokio::test]
    async fn a_failed_read_ends_the_stream_after_its_error() {
        let kind = crate::kind_of::<ConfigMap>(&()).unwrap();
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let first = frame("ADDED", "first");
        // Cut inside the frame: what follows is the rest of it, not a frame.
        let (head, tail) = first.split_at(10);
        let body = Pieces(
            [
                Ok(frame("ADDED", "before")),
                Ok(head.to_vec()),
                Err(reset),
                Ok(tail.to_vec()),
                Ok(frame("ADDED", "second")),
            ]
            .into(),
        );
        let read: Vec<_> = events::<ConfigMap>(body, kind, false, None).collect().await;
        assert_eq!(read.len(), 2, "{read:?}");
        assert!(matches!(read[0], Ok(WatchEvent::Added(_))), "{read:?}");
        assert!(matches!(read[1], Err(Error::Read(_))), "{read:?}");
    }

    #[tokio::test]
    async fn a_body_cut_inside_a_length_prefix_or_a_frame_ends_like_a_network_cut() {
        // Resumable, as kube-client's watch ends on a cut line: no error,
        // nothing after it; a watch from the last version seen resends it.
        let second = frame("ADDED", "second");
        for cut in [1, 3, 4, 5, second.len() - 1] {
            let body = [frame("ADDED", "first"), second[..cut].to_vec()].concat();
            assert_eq!(
                read_all(body).await,
                [Ok("ADDED first".to_owned())],
                "cut after {cut} bytes"
            );
        }
    }

    #[tokio::test]
    async fn a_zero_length_frame_is_an_error_and_the_frames_after_it_still_come() {
        let body = [vec![0; 4], frame("ADDED", "next")].concat();
        let read = read_all(body).await;
        assert_eq!(read.len(), 2, "{read:?}");
        let e = read[0].as_ref().unwrap_err();
        assert!(e.contains("no k8s\\0 prefix"), "{e}");
        assert_eq!(read[1], Ok("ADDED next".to_owned()));
    }
}
