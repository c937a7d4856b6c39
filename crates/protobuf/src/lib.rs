//! Kubernetes protobuf (`application/vnd.kubernetes.protobuf`) for
//! kube-client users: get, list and watch the built-in kinds in protobuf,
//! decoded straight into the k8s-openapi types they already use.
//!
//! ```no_run
//! # async fn demo(client: kube_client::Client) -> Result<(), kinformer_protobuf::Error> {
//! use futures::TryStreamExt;
//! use k8s_openapi::api::core::v1::Pod;
//! use kinformer_protobuf::ProtobufApi;
//! use kube_client::api::{ListParams, WatchParams};
//!
//! let pods = ProtobufApi::<Pod>::namespaced(client, "web")?.drop_managed_fields(true);
//! let list = pods.list(&ListParams::default()).await?;
//! let version = list.metadata.resource_version.clone().unwrap_or_default();
//! let mut events = pods.watch(&WatchParams::default(), &version).await?;
//! while let Some(event) = events.try_next().await? {
//!     println!("{event:?}");
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The API server encodes and a client decodes protobuf several times
//! faster than JSON, and its bodies are smaller; client-go's typed clients
//! ask for it by default, kube-client has no support for it. Here:
//! - [`ProtobufApi`] gets, lists and watches one built-in kind (or its
//!   metadata only, `PartialObjectMeta<K>`), answering with kube-client's
//!   own types (`ObjectList`, `WatchEvent`), its errors
//!   (`kube_client::Error::Api` with the server's `Status`) and its request
//!   parameters.
//! - [`decode`], [`decode_list`], [`decode_event`] and [`events`] decode
//!   bodies a caller fetched itself; [`send`] and [`accept`] fetch them.
//!   kinformer's informers are built on these.
//! - [`deep`] decodes JSON as deep as the API server accepts without
//!   overflowing a stack; the decoder uses it for JSON embedded in
//!   protobuf (a CustomResourceDefinition's schema, a `RawExtension`).
//!
//! Custom resources have no protobuf (the server sends them as JSON), and
//! `DynamicObject` is decoded from JSON only: [`kind_of`] says which kinds
//! have it.
//!
//! Written by hand rather than generated with prost: k8s-openapi's types
//! are what users hold, and a second family of generated types would need
//! a conversion as large as the types themselves. Instead one serde
//! `Deserializer` (`decode.rs`) walks the protobuf bytes with a schema
//! (`generated.rs`, written by `cargo xtask proto-schema` from the Go types
//! of the pinned k8s.io modules) and feeds k8s-openapi's own `Deserialize`
//! impls the map its JSON would be. Whatever bytes arrive, it answers with
//! a value or an error: no panic, stack overflow or unbounded allocation
//! (see `decode.rs` for the bounds, and the mutation tests and fuzz target).

#![warn(missing_docs)]
#![warn(clippy::return_self_not_must_use)]

mod api;
mod decode;
pub mod deep;
mod envelope;
mod error;
#[allow(clippy::all)]
mod generated;
mod schema;
mod transport;
mod watch;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube_client::Resource;
use serde::de::DeserializeOwned;

pub use api::ProtobufApi;
pub use decode::{MAX_DECODED_BYTES, MAX_NESTING};
pub use envelope::MEDIA_TYPE;
pub use error::{Error, Undecodable};
pub use schema::Kind;
pub use transport::{Call, accept, body_bytes, decode_status, is_protobuf, send};
pub use watch::{MAX_FRAME, body_reader, decode_event, events, is_resumable_end};

/// The built-in kind `K` is, if its protobuf is known: `None` for custom
/// resources and `DynamicObject`. `PartialObjectMeta<K>` is the
/// metadata-only kind (`PartialObjectMetadata`), for any `K`.
pub fn kind_of<K: Resource + 'static>(dyntype: &K::DynamicType) -> Option<&'static Kind> {
    if K::metadata_api() {
        return envelope::metadata_kind();
    }
    if is_dynamic_object::<K>() {
        return None;
    }
    envelope::kind(&K::api_version(dyntype), &K::kind(dyntype))
}

fn is_dynamic_object<K: 'static>() -> bool {
    std::any::TypeId::of::<K>() == std::any::TypeId::of::<kube_client::core::DynamicObject>()
}

/// [`kind_of`], or an error that says why `K` has no protobuf.
pub(crate) fn known<K: Resource + 'static>(
    dyntype: &K::DynamicType,
) -> Result<&'static Kind, Error> {
    if is_dynamic_object::<K>() {
        return Err(Error::decode(format!(
            "DynamicObject ({} {}) is decoded from JSON only: decode protobuf into the \
             k8s-openapi type of the kind",
            K::api_version(dyntype),
            K::kind(dyntype)
        )));
    }
    kind_of::<K>(dyntype).ok_or_else(|| {
        Error::decode(format!(
            "{} {} is not a built-in kind whose protobuf is known (custom \
             resources travel as JSON)",
            K::api_version(dyntype),
            K::kind(dyntype)
        ))
    })
}

/// Decodes one object of kind `K` from a protobuf body as the server sends
/// it (`k8s\0`, then the `runtime.Unknown` envelope naming its kind), with
/// `metadata.managedFields` left out (never decoded) when
/// `drop_managed_fields`.
pub fn decode<K: Resource + DeserializeOwned + 'static>(
    body: &[u8],
    dyntype: &K::DynamicType,
    drop_managed_fields: bool,
) -> Result<K, Error> {
    let kind = known::<K>(dyntype)?;
    Ok(envelope::object(
        &envelope::unknown(body)?,
        kind,
        drop_managed_fields,
    )?)
}

/// A `<Kind>List` decoded from protobuf: its metadata, and its items, each
/// decoded alone.
#[derive(Debug)]
#[non_exhaustive]
pub struct ProtobufList<K> {
    /// The list's metadata whole, as kube-client reads it from JSON
    /// (`remainingItemCount` included); the three fields below are taken
    /// from it.
    pub metadata: ListMeta,
    /// `metadata.resourceVersion`: where a watch of the list starts.
    pub resource_version: Option<String>,
    /// `metadata.continue`: the token of the next page, if any.
    pub continue_token: Option<String>,
    /// `metadata.shardInfo.selector`: the shard selector the server
    /// applied, if any.
    pub shard_selector: Option<String>,
    /// The items in order; one that does not decode is its name and why,
    /// and the others are kept.
    pub items: Vec<Result<K, Undecodable>>,
}

/// Decodes a `<Kind>List` protobuf body, with `metadata.managedFields` left
/// out (never decoded) when `drop_managed_fields`. The list must be of
/// kind `K`; an item that does not decode is reported in its place.
pub fn decode_list<K: Resource + DeserializeOwned + 'static>(
    body: &[u8],
    dyntype: &K::DynamicType,
    drop_managed_fields: bool,
) -> Result<ProtobufList<K>, Error> {
    decode_list_of(body, known::<K>(dyntype)?, drop_managed_fields)
}

/// [`decode_list`] with the kind found already ([`kind_of`]).
pub fn decode_list_of<K: DeserializeOwned>(
    body: &[u8],
    kind: &Kind,
    drop_managed_fields: bool,
) -> Result<ProtobufList<K>, Error> {
    Ok(envelope::list::<K>(body, kind, drop_managed_fields)?)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use kube_client::core::{ApiResource, DynamicObject, GroupVersionKind};

    use super::*;

    #[test]
    fn a_body_that_is_not_protobuf_is_refused_with_why() {
        let e = decode::<Pod>(b"{\"kind\":\"Pod\"}", &(), false).unwrap_err();
        assert!(e.to_string().contains("no k8s\\0 prefix"), "{e}");
        let e = decode_list::<Pod>(b"", &(), false).unwrap_err();
        assert!(e.to_string().contains("no k8s\\0 prefix"), "{e}");
    }

    #[test]
    fn dynamic_objects_are_refused_naming_the_kind() {
        let pods = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Pod"));
        let e = decode::<DynamicObject>(b"k8s\0", &pods, false).unwrap_err();
        assert!(e.to_string().contains("DynamicObject (v1 Pod)"), "{e}");
        let widgets = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
        let e = decode_list::<DynamicObject>(b"k8s\0", &widgets, false).unwrap_err();
        assert!(e.to_string().contains("example.com/v1 Widget"), "{e}");
    }

    #[test]
    fn a_list_of_another_kind_is_refused_naming_both() {
        // k8s\0 + Unknown{typeMeta: {apiVersion: "v1", kind: "ServiceList"}}
        let mut body = b"k8s\0".to_vec();
        let type_meta = [&[0x0a, 2][..], b"v1", &[0x12, 11], b"ServiceList"].concat();
        body.push(0x0a);
        body.push(type_meta.len() as u8);
        body.extend_from_slice(&type_meta);
        let e = decode_list::<Pod>(&body, &(), false).unwrap_err();
        assert!(e.to_string().contains("expected a v1 PodList"), "{e}");
        assert!(e.to_string().contains("ServiceList"), "{e}");
    }

    /// A length-delimited protobuf field (of fewer than 128 bytes).
    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        [&[number << 3 | 2, bytes.len() as u8][..], bytes].concat()
    }

    #[test]
    fn a_lists_metadata_is_decoded_whole_remaining_item_count_included() {
        use k8s_openapi::api::core::v1::ConfigMap;

        // ListMeta{resourceVersion: "42", continue: "", remainingItemCount: 3},
        // then a second ListMeta that protobuf merges into the first.
        let meta = [field(2, b"42"), field(3, b""), vec![4 << 3, 3]].concat();
        let more_meta = [field(3, b"next")].concat();
        let item = field(1, &field(1, b"a"));
        let list = [field(1, &meta), field(2, &item), field(1, &more_meta)].concat();
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMapList")].concat();
        let body = [&b"k8s\0"[..], &field(1, &type_meta), &field(2, &list)].concat();

        let list = decode_list::<ConfigMap>(&body, &(), false).unwrap();
        assert_eq!(
            list.metadata,
            ListMeta {
                resource_version: Some("42".into()),
                continue_: Some("next".into()),
                remaining_item_count: Some(3),
                ..ListMeta::default()
            }
        );
        assert_eq!(list.resource_version.as_deref(), Some("42"));
        assert_eq!(list.continue_token.as_deref(), Some("next"));
        assert_eq!(list.items.len(), 1);
    }
}

/// The README's code, compiled (and run, unless marked `no_run`) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
