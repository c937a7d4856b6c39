//! Kubernetes protobuf (`application/vnd.kubernetes.protobuf`) decoded into
//! the k8s-openapi types, for the built-in kinds.
//!
//! Informers use it on their own ([`WireFormat::Auto`](crate::WireFormat));
//! [`decode`] and [`decode_list`] decode bodies a caller fetched itself.
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

pub use decode::ProtobufError;

/// The built-in kind `K` is, if it is one whose protobuf the schema knows:
/// `None` for custom resources and `DynamicObject`.
pub(crate) fn kind_of<K: Resource + 'static>(
    dyntype: &K::DynamicType,
) -> Option<&'static schema::Kind> {
    if K::metadata_api() {
        return envelope::metadata_kind();
    }
    if std::any::TypeId::of::<K>() == std::any::TypeId::of::<kube_client::core::DynamicObject>() {
        return None;
    }
    envelope::kind(&K::api_version(dyntype), &K::kind(dyntype))
}

fn known<K: Resource + 'static>(
    dyntype: &K::DynamicType,
) -> Result<&'static schema::Kind, ProtobufError> {
    kind_of::<K>(dyntype).ok_or_else(|| {
        ProtobufError(format!(
            "{} {} has no protobuf encoding kinformer knows (only built-in kinds do)",
            K::api_version(dyntype),
            K::kind(dyntype)
        ))
    })
}

/// Decodes one object of kind `K` from a protobuf body as the server sends
/// it (`k8s\0`, then the `runtime.Unknown` envelope naming its kind).
pub fn decode<K: Resource + DeserializeOwned + 'static>(
    body: &[u8],
    dyntype: &K::DynamicType,
) -> Result<K, ProtobufError> {
    let kind = known::<K>(dyntype)?;
    envelope::object(&envelope::unknown(body)?, kind, false)
}

/// Decodes a `<Kind>List` protobuf body into its items, with
/// `metadata.managedFields` left out (never decoded) when
/// `drop_managed_fields`. An item that does not decode fails the whole
/// list, naming the item.
pub fn decode_list<K: Resource + DeserializeOwned + 'static>(
    body: &[u8],
    dyntype: &K::DynamicType,
    drop_managed_fields: bool,
) -> Result<Vec<K>, ProtobufError> {
    let kind = known::<K>(dyntype)?;
    envelope::list::<K>(body, kind, drop_managed_fields)?
        .items
        .into_iter()
        .map(|item| item.map_err(ProtobufError))
        .collect()
}
