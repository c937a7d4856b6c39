//! Key functions: `namespace/name`, as client-go's `MetaNamespaceKeyFunc`.

use crate::{KeyError, Object, ObjectOrTombstone};

/// The key of an object: `namespace/name`, or `name` when it has no namespace.
///
/// Fails when the object has no name, naming what is known of the object.
///
/// ```
/// use k8s_openapi::api::core::v1::{Namespace, Pod};
/// use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
/// let meta = |ns: Option<&str>, name: &str| ObjectMeta {
///     namespace: ns.map(Into::into),
///     name: Some(name.into()),
///     ..ObjectMeta::default()
/// };
/// let pod = Pod { metadata: meta(Some("web"), "frontend"), ..Pod::default() };
/// let ns = Namespace { metadata: meta(None, "web"), ..Namespace::default() };
/// assert_eq!(kinformer_store::meta_namespace_key(&pod).unwrap(), "web/frontend");
/// assert_eq!(kinformer_store::meta_namespace_key(&ns).unwrap(), "web");
/// ```
pub fn meta_namespace_key<K: Object + ?Sized>(obj: &K) -> Result<String, KeyError> {
    let name = match obj.name() {
        Some(name) if !name.is_empty() => name,
        _ => {
            return Err(KeyError::MissingName {
                object: object_description(obj),
            });
        }
    };
    Ok(match obj.namespace() {
        Some(ns) if !ns.is_empty() => {
            let mut key = String::with_capacity(ns.len() + 1 + name.len());
            key.push_str(ns);
            key.push('/');
            key.push_str(name);
            key
        }
        _ => name.to_owned(),
    })
}

/// Like [`meta_namespace_key`], but a tombstone yields the key it was stored
/// under: client-go's `DeletionHandlingMetaNamespaceKeyFunc`, for delete handlers.
pub fn deletion_handling_meta_namespace_key<K: Object>(
    obj: &ObjectOrTombstone<K>,
) -> Result<String, KeyError> {
    match obj {
        ObjectOrTombstone::Object(obj) => meta_namespace_key(obj.as_ref()),
        ObjectOrTombstone::Tombstone(t) => Ok(t.key.clone()),
    }
}

/// Splits a key into `(namespace, name)`; the namespace is `None` for a
/// cluster-scoped key, and for a key with an empty namespace (`"/b"`), which
/// client-go's `SplitMetaNamespaceKey` reads as namespace `""`.
///
/// Rejects keys with more than one `/`, as client-go does. Unlike client-go,
/// it also rejects keys with an empty name (`""`, `"a/"`): no object has one.
///
/// ```
/// use kinformer_store::split_meta_namespace_key;
/// assert_eq!(split_meta_namespace_key("web/frontend").unwrap(), (Some("web"), "frontend"));
/// assert_eq!(split_meta_namespace_key("node-1").unwrap(), (None, "node-1"));
/// assert_eq!(split_meta_namespace_key("/node-1").unwrap(), (None, "node-1"));
/// assert!(split_meta_namespace_key("a/b/c").is_err());
/// ```
pub fn split_meta_namespace_key(key: &str) -> Result<(Option<&str>, &str), KeyError> {
    let invalid = |reason| KeyError::InvalidKey {
        key: key.to_owned(),
        reason,
    };
    match key.split_once('/') {
        Some((_, rest)) if rest.contains('/') => {
            Err(invalid("a key has at most one '/' (namespace/name)"))
        }
        None if key.is_empty() => Err(invalid("the key is empty")),
        None => Ok((None, key)),
        Some((_, "")) => Err(invalid("the name after '/' is empty")),
        Some(("", name)) => Ok((None, name)),
        Some((ns, name)) => Ok((Some(ns), name)),
    }
}

/// A short description of an object for error messages: what of its
/// namespace, name and resource version is set.
pub fn object_description<K: Object + ?Sized>(obj: &K) -> String {
    let mut parts = Vec::new();
    if let Some(ns) = obj.namespace().filter(|s| !s.is_empty()) {
        parts.push(format!("namespace {ns:?}"));
    }
    match obj.name() {
        Some(name) if !name.is_empty() => parts.push(format!("name {name:?}")),
        _ => parts.push("no name".to_owned()),
    }
    if let Some(uid) = obj.uid().filter(|s| !s.is_empty()) {
        parts.push(format!("uid {uid:?}"));
    }
    if let Some(rv) = obj.resource_version().filter(|s| !s.is_empty()) {
        parts.push(format!("resourceVersion {rv:?}"));
    }
    format!("({})", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(ns: Option<&str>, name: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: ns.map(Into::into),
                name: name.map(Into::into),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn namespaced_object_key_is_namespace_slash_name() {
        assert_eq!(
            meta_namespace_key(&pod(Some("a"), Some("b"))).unwrap(),
            "a/b"
        );
    }

    #[test]
    fn object_without_namespace_is_keyed_by_name_alone() {
        assert_eq!(meta_namespace_key(&pod(None, Some("b"))).unwrap(), "b");
        assert_eq!(meta_namespace_key(&pod(Some(""), Some("b"))).unwrap(), "b");
    }

    #[test]
    fn object_without_name_is_refused_with_its_namespace_in_the_error() {
        for p in [pod(Some("web"), None), pod(Some("web"), Some(""))] {
            let err = meta_namespace_key(&p).unwrap_err();
            assert!(matches!(err, KeyError::MissingName { .. }));
            assert!(err.to_string().contains("\"web\""), "{err}");
        }
    }

    #[test]
    fn split_rejects_malformed_keys_saying_why() {
        for (key, why) in [
            ("", "empty"),
            ("x/", "name"),
            ("/", "name"),
            ("a/b/c", "at most one"),
            ("//", "at most one"),
        ] {
            let err = split_meta_namespace_key(key).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(why), "{key:?}: {msg}");
            assert!(msg.contains(&format!("{key:?}")), "{key:?}: {msg}");
        }
    }

    #[test]
    fn split_reads_an_empty_namespace_as_cluster_scoped() {
        assert_eq!(split_meta_namespace_key("/b").unwrap(), (None, "b"));
    }

    #[test]
    fn split_round_trips_the_key_function() {
        for p in [pod(Some("ns"), Some("n")), pod(None, Some("n"))] {
            let key = meta_namespace_key(&p).unwrap();
            let (ns, name) = split_meta_namespace_key(&key).unwrap();
            assert_eq!(ns, p.metadata.namespace.as_deref());
            assert_eq!(Some(name), p.metadata.name.as_deref());
        }
    }

    #[test]
    fn deletion_handling_key_uses_the_tombstone_key() {
        use crate::DeletedFinalStateUnknown;
        use std::sync::Arc;
        let t = ObjectOrTombstone::Tombstone(DeletedFinalStateUnknown {
            key: "old/key".into(),
            obj: Arc::new(pod(Some("other"), Some("x"))),
        });
        assert_eq!(deletion_handling_meta_namespace_key(&t).unwrap(), "old/key");
        let o = ObjectOrTombstone::Object(Arc::new(pod(Some("a"), Some("b"))));
        assert_eq!(deletion_handling_meta_namespace_key(&o).unwrap(), "a/b");
    }
}
