//! The frames around a protobuf object: the `k8s\0` magic and the
//! `runtime.Unknown` envelope that names its kind, a list's items, and a
//! watch event's type and object.

use k8s_openapi::DeepMerge;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::de::DeserializeOwned;

use super::decode::{DecodeError, Fields, Raw, from_message, from_typed_object, go_lossy_utf8};
use super::generated::{KINDS, MESSAGES};
use super::schema::{Kind, Ty};

/// What every protobuf body and watch frame starts with.
pub(crate) const MAGIC: &[u8; 4] = b"k8s\0";

/// The media type of Kubernetes protobuf bodies.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

type Result<T> = std::result::Result<T, DecodeError>;

fn err<T>(what: impl std::fmt::Display) -> Result<T> {
    Err(DecodeError::new(what.to_string()))
}

/// `runtime.Unknown`: an encoded object and what it is.
#[derive(Debug)]
pub(crate) struct Unknown<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub raw: &'a [u8],
}

fn text(bytes: &[u8]) -> Result<&str> {
    std::str::from_utf8(bytes).or_else(|e| err(format!("envelope: {e}")))
}

/// Reads `k8s\0` and the envelope after it.
pub(crate) fn unknown(bytes: &[u8]) -> Result<Unknown<'_>> {
    let Some(body) = bytes.strip_prefix(MAGIC) else {
        return err("not a Kubernetes protobuf message: no k8s\\0 prefix");
    };
    let mut out = Unknown {
        api_version: "",
        kind: "",
        raw: &[],
    };
    for field in Fields::new(body) {
        match field? {
            (1, Raw::Bytes(type_meta)) => {
                for f in Fields::new(type_meta) {
                    match f? {
                        (1, Raw::Bytes(v)) => out.api_version = text(v)?,
                        (2, Raw::Bytes(k)) => out.kind = text(k)?,
                        _ => {}
                    }
                }
            }
            (2, Raw::Bytes(raw)) => out.raw = raw,
            (3, Raw::Bytes(encoding)) if !encoding.is_empty() => {
                return err(format!(
                    "content encoding {:?} is not supported",
                    String::from_utf8_lossy(encoding)
                ));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The built-in kind `api_version`/`kind`, if the schema has it.
pub(crate) fn kind(api_version: &str, kind: &str) -> Option<&'static Kind> {
    KINDS
        .binary_search_by(|k| (k.api_version, k.kind).cmp(&(api_version, kind)))
        .ok()
        .map(|i| &KINDS[i])
}

pub(crate) fn message_named(name: &str) -> Result<u16> {
    MESSAGES
        .binary_search_by(|m| m.name.cmp(name))
        .ok()
        .and_then(|i| u16::try_from(i).ok())
        .map_or_else(|| err(format!("no message {name} in the schema")), Ok)
}

/// Decodes an object of kind `expected` from its envelope.
pub(crate) fn object<K: DeserializeOwned>(
    envelope: &Unknown<'_>,
    expected: &Kind,
    drop_managed_fields: bool,
) -> Result<K> {
    if (envelope.api_version, envelope.kind) != (expected.api_version, expected.kind) {
        return err(format!(
            "expected a {} {}, got a {:?} {:?}",
            expected.api_version, expected.kind, envelope.api_version, envelope.kind
        ));
    }
    from_typed_object(
        expected.message,
        envelope.raw,
        drop_managed_fields,
        type_meta(expected),
    )
}

/// The metadata-only kind: `PartialObjectMetadata`, whose JSON carries
/// `apiVersion` and `kind` on every object, list items included.
pub(crate) fn metadata_kind() -> Option<&'static Kind> {
    static KIND: std::sync::OnceLock<Option<Kind>> = std::sync::OnceLock::new();
    KIND.get_or_init(|| {
        Some(Kind {
            api_version: "meta.k8s.io/v1",
            kind: "PartialObjectMetadata",
            message: message_named("k8s.io.apimachinery.pkg.apis.meta.v1.PartialObjectMetadata")
                .ok()?,
            list: message_named("k8s.io.apimachinery.pkg.apis.meta.v1.PartialObjectMetadataList")
                .ok()?,
        })
    })
    .as_ref()
}

/// What `expected`'s objects carry as `apiVersion` and `kind` in JSON that
/// their protobuf does not.
fn type_meta(expected: &Kind) -> Option<(&'static str, &'static str)> {
    (expected.kind == "PartialObjectMetadata").then_some((expected.api_version, expected.kind))
}

/// `namespace/name` (or `name`) from an object's bytes, for errors and to
/// keep what is cached under it: its `metadata` is field 1 in every kind,
/// name 1 and namespace 3 in it; text as the decoder reads it.
pub(crate) fn object_key(object: &[u8]) -> Option<String> {
    let (mut name, mut namespace) = (None, None);
    for field in Fields::new(object).map_while(|f| f.ok()) {
        if let (1, Raw::Bytes(meta)) = field {
            for f in Fields::new(meta).map_while(|f| f.ok()) {
                match f {
                    (1, Raw::Bytes(n)) => name = Some(go_lossy_utf8(n)),
                    (3, Raw::Bytes(ns)) => namespace = Some(go_lossy_utf8(ns)),
                    _ => {}
                }
            }
        }
    }
    match (namespace.filter(|n| !n.is_empty()), name) {
        (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
        (None, Some(name)) => Some(name.into_owned()),
        _ => None,
    }
}

/// Decodes a `<Kind>List` body of kind `expected`'s list.
pub(crate) fn list<K: DeserializeOwned>(
    body: &[u8],
    expected: &Kind,
    drop_managed_fields: bool,
) -> Result<crate::ProtobufList<K>> {
    let envelope = unknown(body)?;
    let list_name = format!("{}List", expected.kind);
    if (envelope.api_version, envelope.kind) != (expected.api_version, list_name.as_str()) {
        return err(format!(
            "expected a {} {list_name}, got a {:?} {:?}",
            expected.api_version, envelope.api_version, envelope.kind
        ));
    }
    // The metadata's and the items' messages, as the list's own schema says.
    let field_message = |number: u32, what: &str| {
        MESSAGES
            .get(usize::from(expected.list))
            .and_then(|l| l.fields.iter().find(|f| f.number == number))
            .and_then(|f| match f.ty {
                Ty::Message(m) => Some(m),
                _ => None,
            })
            .map_or_else(
                || err(format!("{list_name} has no {what} in the schema")),
                Ok,
            )
    };
    let meta_message = field_message(1, "metadata")?;
    let item_message = field_message(2, "items")?;
    let mut metadata = ListMeta::default();
    let mut items = Vec::new();
    for field in Fields::new(envelope.raw) {
        match field? {
            // Decoded whole, as JSON would be: every field kube-client
            // reads (`remainingItemCount`, `shardInfo`, ...). A repeated
            // message merges into the one before, as in protobuf.
            (1, Raw::Bytes(meta)) => {
                metadata.merge_from(from_message::<ListMeta>(meta_message, meta)?);
            }
            (2, Raw::Bytes(item)) => items.push(
                from_typed_object(item_message, item, drop_managed_fields, type_meta(expected))
                    .map_err(|e| crate::Undecodable::new(object_key(item), e.with_cause())),
            ),
            _ => {}
        }
    }
    Ok(crate::ProtobufList {
        resource_version: metadata.resource_version.clone(),
        continue_token: metadata.continue_.clone(),
        shard_selector: metadata
            .shard_info
            .as_ref()
            .map(|info| info.selector.clone()),
        metadata,
        items,
    })
}

/// A watch event: its type and its object's envelope.
pub(crate) struct Event<'a> {
    pub type_: &'a str,
    pub object: Unknown<'a>,
}

/// Decodes one watch frame (without its length prefix): a bare
/// `WatchEvent` message (the server's raw stream serializer writes no
/// envelope around it) whose object is a full `k8s\0` envelope.
pub(crate) fn event(frame: &[u8]) -> Result<Event<'_>> {
    let event = if frame.starts_with(MAGIC) {
        let envelope = unknown(frame)?;
        if envelope.kind != "WatchEvent" {
            return err(format!(
                "expected a WatchEvent, got a {:?} {:?}",
                envelope.api_version, envelope.kind
            ));
        }
        envelope.raw
    } else {
        frame
    };
    let (mut type_, mut object) = ("", &[][..]);
    for field in Fields::new(event) {
        match field? {
            (1, Raw::Bytes(t)) => type_ = text(t)?,
            // RawExtension: {1: raw}.
            (2, Raw::Bytes(ext)) => {
                for f in Fields::new(ext) {
                    if let (1, Raw::Bytes(raw)) = f? {
                        object = raw;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(Event {
        type_,
        object: unknown(object)?,
    })
}

/// Decodes a `meta/v1 Status` (an ERROR watch event's object, a failed call's body).
pub(crate) fn status(envelope: &Unknown<'_>) -> Result<kube_client::core::Status> {
    if envelope.kind != "Status" {
        return err(format!("expected a Status, got a {:?}", envelope.kind));
    }
    from_message(
        message_named("k8s.io.apimachinery.pkg.apis.meta.v1.Status")?,
        envelope.raw,
    )
}

#[cfg(test)]
mod tests {
    use super::super::schema::REPEATED;
    use super::*;

    #[test]
    fn the_schema_is_sorted_and_every_kind_has_its_list() {
        assert!(MESSAGES.windows(2).all(|w| w[0].name < w[1].name));
        assert!(
            KINDS
                .windows(2)
                .all(|w| (w[0].api_version, w[0].kind) < (w[1].api_version, w[1].kind))
        );
        for m in MESSAGES {
            assert!(
                m.fields.windows(2).all(|w| w[0].number < w[1].number),
                "{}",
                m.name
            );
        }
        let list_meta = message_named("k8s.io.apimachinery.pkg.apis.meta.v1.ListMeta").unwrap();
        for k in KINDS {
            let list = &MESSAGES[usize::from(k.list)];
            let items = list.fields.iter().find(|f| f.number == 2).unwrap();
            assert_eq!(
                (items.ty, items.flags & REPEATED),
                (Ty::Message(k.message), REPEATED),
                "{}",
                list.name
            );
            let meta = list.fields.iter().find(|f| f.number == 1).unwrap();
            assert_eq!(meta.ty, Ty::Message(list_meta), "{}", list.name);
            assert!(
                MESSAGES[usize::from(k.message)]
                    .name
                    .ends_with(&format!(".{}", k.kind))
            );
        }
        for (api_version, k) in [
            ("v1", "Pod"),
            ("apps/v1", "Deployment"),
            ("coordination.k8s.io/v1", "Lease"),
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
        ] {
            assert!(kind(api_version, k).is_some(), "{api_version} {k}");
        }
    }

    #[test]
    fn a_body_without_the_magic_or_with_an_encoding_is_refused() {
        assert!(
            unknown(b"{}")
                .unwrap_err()
                .message()
                .contains("no k8s\\0 prefix")
        );
        // Unknown{3: "gzip"}
        let body = [b'k', b'8', b's', 0, 0x1a, 4, b'g', b'z', b'i', b'p'];
        assert!(unknown(&body).unwrap_err().message().contains("gzip"));
    }
}
