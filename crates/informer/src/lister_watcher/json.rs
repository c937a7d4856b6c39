//! JSON lists and watch events, decoded object by object: an object that
//! does not decode is named and skipped, the rest kept; managedFields are
//! dropped from the bytes before decoding when asked; JSON as deep as the
//! API server accepts decodes without overflowing the stack
//! (`kinformer_protobuf::deep`).

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use kube_client::core::WatchEvent;
use serde::de::DeserializeOwned;

use super::{ListPage, Undecodable, WatchStream};
use crate::{Detail, JsonShape, ListWatchError, strip_managed_fields_json};

/// `namespace/name` (or `name`) of an object that does not decode as `K`,
/// read from its JSON as far as it goes.
fn object_key(json: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        #[serde(default)]
        metadata: Meta,
    }
    #[derive(serde::Deserialize, Default)]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
    }
    match kinformer_protobuf::deep::from_json::<Named>(json.as_bytes()).map(|n| n.metadata) {
        Ok(Meta {
            name: Some(name),
            namespace: Some(ns),
        }) if !ns.is_empty() => Some(format!("{ns}/{name}")),
        Ok(Meta {
            name: Some(name), ..
        }) => Some(name),
        _ => None,
    }
}

/// The key of the object inside a watch event's JSON.
fn event_object_key(json: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Event<'a> {
        #[serde(borrow)]
        object: &'a serde_json::value::RawValue,
    }
    match serde_json::from_slice::<Event<'_>>(json) {
        Ok(event) => object_key(event.object.get()),
        Err(_) => None,
    }
}

/// A JSON watch body: one event a line, each read into one reused buffer
/// and decoded from its bytes (no `String` and no UTF-8 pass per line:
/// serde_json checks the strings it decodes).
pub(super) fn events<K: DeserializeOwned + Send + 'static>(
    body: impl futures::AsyncBufRead + Send + 'static,
    drop_managed_fields: bool,
    received: Arc<AtomicU64>,
) -> WatchStream<K> {
    let body: std::pin::Pin<Box<dyn futures::AsyncBufRead + Send>> = Box::pin(body);
    futures::stream::unfold((body, Vec::new()), move |(mut body, mut line)| {
        let received = Arc::clone(&received);
        async move {
            use futures::AsyncBufReadExt;
            loop {
                line.clear();
                match body.read_until(b'\n', &mut line).await {
                    Ok(0) => return None,
                    Ok(n) => {
                        received.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    // A watch the server or the network ended: resumable.
                    Err(e) if kinformer_protobuf::is_resumable_end(&e) => return None,
                    Err(e) => {
                        return Some((Err(ListWatchError::Connect(Detail::of(e))), (body, line)));
                    }
                }
                let json = line.trim_ascii();
                if json.is_empty() {
                    continue;
                }
                let event = if drop_managed_fields {
                    let stripped = strip_managed_fields_json(json, JsonShape::WatchEvent);
                    decode_stripped(json, stripped, decode_event::<K>)
                } else {
                    decode_event::<K>(json)
                };
                return Some((event, (body, line)));
            }
        }
    })
    .boxed()
}

/// What a metadata-only watch asks for (kube-client's value).
pub(super) const METADATA_MIME: &str =
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// A list response, decoded object by object: one object that does not
/// decode is skipped (and named in `skipped`), not the whole page.
pub(super) fn decode_list<K: DeserializeOwned>(json: &[u8]) -> Result<ListPage<K>, ListWatchError> {
    // ListMeta read by hand: k8s-openapi's has shardInfo only from v1_36.
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        resource_version: Option<String>,
        #[serde(rename = "continue")]
        continue_: Option<String>,
        shard_info: Option<ShardInfo>,
    }
    #[derive(serde::Deserialize)]
    struct ShardInfo {
        selector: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct RawList<'a> {
        #[serde(default)]
        metadata: Meta,
        #[serde(borrow, default)]
        items: Vec<&'a serde_json::value::RawValue>,
    }
    // The items are captured raw (serde_json skips a raw value without
    // recursing), so the list's own depth never counts against an item's.
    let raw: RawList<'_> = serde_json::from_slice(json)
        .map_err(|e| ListWatchError::Decode(Detail::caused("the list", e)))?;
    let mut items = Vec::with_capacity(raw.items.len());
    let mut skipped = Vec::new();
    for item in raw.items {
        match kinformer_protobuf::deep::from_json::<K>(item.get().as_bytes()) {
            Ok(obj) => items.push(obj),
            Err(e) => {
                let text = item.get();
                let head: String = text.chars().take(160).collect();
                skipped.push(Undecodable::new(object_key(text), format!("{e} in {head}")));
            }
        }
    }
    Ok(ListPage {
        items,
        resource_version: raw.metadata.resource_version.unwrap_or_default(),
        continue_token: raw.metadata.continue_.filter(|t| !t.is_empty()),
        skipped,
        shard_selector: raw.metadata.shard_info.and_then(|i| i.selector),
    })
}

/// `decode` of the stripped JSON; when that fails, of the original, so that
/// the error is serde's about what the server sent.
pub(super) fn decode_stripped<T>(
    original: &[u8],
    stripped: Cow<'_, [u8]>,
    decode: impl Fn(&[u8]) -> Result<T, ListWatchError>,
) -> Result<T, ListWatchError> {
    match decode(&stripped) {
        Err(_) if matches!(stripped, Cow::Owned(_)) => decode(original),
        decoded => decoded,
    }
}

/// One watch event line, as kube-client decodes it: an event, or a Status
/// error the server sent instead.
pub(super) fn decode_event<K: DeserializeOwned>(
    json: &[u8],
) -> Result<WatchEvent<K>, ListWatchError> {
    match kinformer_protobuf::deep::from_json::<WatchEvent<K>>(json) {
        Ok(event) => Ok(event),
        Err(e) => match serde_json::from_slice::<kube_client::core::Status>(json) {
            Ok(status) if status.code != 0 => Err(ListWatchError::from_status(&status)),
            _ => Err(ListWatchError::Undecodable(Undecodable::new(
                event_object_key(json),
                e,
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn a_stripped_list_that_does_not_decode_reports_serdes_error_about_the_original() {
        // managedFields can go, but the list is broken after them.
        let original = br#"{"items":[{"metadata":{"name":"a","managedFields":[{"manager":"m"}]}}],"metadata":{"resourceVersion":01}}"#;
        let stripped = strip_managed_fields_json(original, JsonShape::List);
        assert!(matches!(stripped, Cow::Owned(_)));
        let err = decode_stripped(original, stripped, decode_list::<Pod>).unwrap_err();
        let direct = decode_list::<Pod>(original).unwrap_err();
        // serde's error, the cause, is in the chain, not in the message.
        assert_eq!(crate::error_chain(&err), crate::error_chain(&direct));
    }

    #[test]
    fn a_stripped_watch_event_decodes_without_the_objects_managed_fields() {
        let line = br#"{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","managedFields":[{"manager":"m"}]},"spec":{"containers":[]}}}"#;
        let stripped = strip_managed_fields_json(line, JsonShape::WatchEvent);
        match decode_stripped(line, stripped, decode_event::<Pod>).unwrap() {
            WatchEvent::Modified(pod) => {
                assert_eq!(pod.metadata.name.as_deref(), Some("a"));
                assert!(pod.metadata.managed_fields.is_none());
            }
            other => panic!("expected MODIFIED, got {other:?}"),
        }
    }
}
