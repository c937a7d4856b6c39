//! Kubernetes protobuf (`application/vnd.kubernetes.protobuf`) decoded into
//! the k8s-openapi types, for the built-in kinds.
//!
//! Informers use it on their own ([`WireFormat::Auto`](crate::WireFormat));
//! [`decode()`] and [`decode_list()`] decode bodies a caller fetched itself.
//!
//! Written by hand rather than generated with prost: k8s-openapi's types
//! are what users hold, and a second family of generated types would need
//! a conversion as large as the types themselves. Instead one serde
//! `Deserializer` (`decode.rs`) walks the protobuf bytes with a schema
//! (`generated.rs`, written by `cargo xtask proto-schema` from the Go types
//! of the pinned k8s.io modules) and feeds k8s-openapi's own `Deserialize`
//! impls the map its JSON would be.

pub(crate) mod decode;
pub(crate) mod envelope;
#[allow(clippy::all)]
pub(crate) mod generated;
pub(crate) mod schema;

use kube_client::Resource;
use serde::de::DeserializeOwned;

pub use decode::{MAX_DECODED_BYTES, MAX_NESTING, ProtobufError};

/// The built-in kind `K` is, if it is one whose protobuf the schema knows:
/// `None` for custom resources and `DynamicObject`.
pub(crate) fn kind_of<K: Resource + 'static>(
    dyntype: &K::DynamicType,
) -> Option<&'static schema::Kind> {
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

fn known<K: Resource + 'static>(
    dyntype: &K::DynamicType,
) -> Result<&'static schema::Kind, ProtobufError> {
    if is_dynamic_object::<K>() {
        return Err(ProtobufError::new(format!(
            "DynamicObject ({} {}) is decoded from JSON only: decode protobuf into the \
             k8s-openapi type of the kind",
            K::api_version(dyntype),
            K::kind(dyntype)
        )));
    }
    kind_of::<K>(dyntype).ok_or_else(|| {
        ProtobufError::new(format!(
            "{} {} is not a built-in kind kinformer knows the protobuf of (custom \
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
) -> Result<K, ProtobufError> {
    let kind = known::<K>(dyntype)?;
    envelope::object(&envelope::unknown(body)?, kind, drop_managed_fields)
}

/// A `<Kind>List` decoded from protobuf: its items, each decoded alone.
#[derive(Debug)]
pub struct ProtobufList<K> {
    /// `metadata.resourceVersion`: where a watch of the list starts.
    pub resource_version: Option<String>,
    /// `metadata.continue`: the token of the next page, if any.
    pub continue_token: Option<String>,
    /// The items in order; one that does not decode is its error (naming
    /// the item), and the others are kept.
    pub items: Vec<Result<K, ProtobufError>>,
}

/// Decodes a `<Kind>List` protobuf body, with `metadata.managedFields` left
/// out (never decoded) when `drop_managed_fields`. The list must be of
/// kind `K`; an item that does not decode is reported in its place.
pub fn decode_list<K: Resource + DeserializeOwned + 'static>(
    body: &[u8],
    dyntype: &K::DynamicType,
    drop_managed_fields: bool,
) -> Result<ProtobufList<K>, ProtobufError> {
    let kind = known::<K>(dyntype)?;
    let list = envelope::list::<K>(body, kind, drop_managed_fields)?;
    Ok(ProtobufList {
        resource_version: list.resource_version,
        continue_token: list.continue_token,
        items: list
            .items
            .into_iter()
            .map(|item| item.map_err(|e| ProtobufError::new(e.reason)))
            .collect(),
    })
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
}
