//! [`ObjectKey`]: an object's namespace and name as one typed value, with
//! client-go's `namespace/name` string form at the edge.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use crate::{KeyError, Object, object_description};

/// An object's key: its namespace (none for a cluster-scoped object) and
/// its name, as controller-runtime's `types.NamespacedName`.
///
/// It holds client-go's string form (`namespace/name`, or `name` alone),
/// so it costs one string as the keys it stands for did, hashes and
/// compares as that string, and a map keyed by `ObjectKey` is looked up
/// with a `&str` ([`Borrow<str>`]). Every way to make one checks it: a name
/// is never empty and neither part holds a `/`, so a malformed key (a
/// cluster-scoped `"/name"`, a `"ns/"`) is an error where it is made, not
/// a key that never matches at run time.
///
/// ```
/// use kinformer_store::ObjectKey;
///
/// let web = ObjectKey::namespaced("default", "web").unwrap();
/// assert_eq!((web.namespace(), web.name()), (Some("default"), "web"));
/// assert_eq!(web.to_string(), "default/web");
/// assert_eq!("default/web".parse::<ObjectKey>().unwrap(), web);
///
/// let node = ObjectKey::cluster("node-1").unwrap();
/// assert_eq!((node.namespace(), node.as_str()), (None, "node-1"));
/// assert!("/node-1".parse::<ObjectKey>().is_err());
/// ```
#[derive(Clone)]
pub struct ObjectKey {
    key: String,
    /// Where the name starts in `key`: 0 when cluster-scoped.
    name_at: usize,
}

impl ObjectKey {
    /// The key of object `name` in `namespace`.
    pub fn namespaced(namespace: &str, name: &str) -> Result<Self, KeyError> {
        Self::new(Some(namespace), name)
    }

    /// The key of the cluster-scoped object `name`.
    pub fn cluster(name: &str) -> Result<Self, KeyError> {
        Self::new(None, name)
    }

    /// The key of object `name` in `namespace`, or cluster-scoped when
    /// `namespace` is `None`.
    pub fn new(namespace: Option<&str>, name: &str) -> Result<Self, KeyError> {
        let invalid = |reason| KeyError::InvalidKey {
            key: match namespace {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_owned(),
            },
            reason,
        };
        if name.is_empty() {
            return Err(invalid("the name is empty"));
        }
        if name.contains('/') {
            return Err(invalid("a name holds no '/'"));
        }
        match namespace {
            None => Ok(Self {
                key: name.to_owned(),
                name_at: 0,
            }),
            Some("") => Err(invalid(
                "the namespace is empty (a cluster-scoped object's key has none: ObjectKey::cluster)",
            )),
            Some(ns) if ns.contains('/') => Err(invalid("a namespace holds no '/'")),
            Some(ns) => {
                let mut key = String::with_capacity(ns.len() + 1 + name.len());
                key.push_str(ns);
                key.push('/');
                key.push_str(name);
                Ok(Self {
                    key,
                    name_at: ns.len() + 1,
                })
            }
        }
    }

    /// The key of `obj` (client-go's `MetaNamespaceKeyFunc`: an empty
    /// namespace is none); fails when it has no name. Built in one
    /// allocation: every informer event of a controller makes one.
    pub fn of<K: Object + ?Sized>(obj: &K) -> Result<Self, KeyError> {
        match obj.name() {
            Some(name) if !name.is_empty() => {
                Self::new(obj.namespace().filter(|ns| !ns.is_empty()), name)
            }
            _ => Err(KeyError::MissingName {
                object: object_description(obj),
            }),
        }
    }

    /// Its namespace; `None` for a cluster-scoped object.
    pub fn namespace(&self) -> Option<&str> {
        self.name_at.checked_sub(1).map(|slash| &self.key[..slash])
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.key[self.name_at..]
    }

    /// Client-go's string form: `namespace/name`, or `name`.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// Client-go's string form, owned.
    pub fn into_string(self) -> String {
        self.key
    }
}

impl FromStr for ObjectKey {
    type Err = KeyError;

    /// Reads client-go's string form: `namespace/name` or `name`. Unlike
    /// client-go's `SplitMetaNamespaceKey`, `"/name"` (an empty namespace)
    /// is refused: a cluster-scoped key is the name alone.
    fn from_str(key: &str) -> Result<Self, KeyError> {
        let invalid = |reason| KeyError::InvalidKey {
            key: key.to_owned(),
            reason,
        };
        match key.split_once('/') {
            None => Self::cluster(key),
            Some(("", _)) => Err(invalid(
                "the namespace before '/' is empty (a cluster-scoped key is the name alone)",
            )),
            Some((_, name)) if name.contains('/') => {
                Err(invalid("a key has at most one '/' (namespace/name)"))
            }
            Some((_, "")) => Err(invalid("the name after '/' is empty")),
            Some((namespace, name)) => Self::namespaced(namespace, name),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectKey({:?})", self.key)
    }
}

/// As its string: `Borrow<str>` needs the same hash and equality.
impl PartialEq for ObjectKey {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for ObjectKey {}

impl Hash for ObjectKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key.hash(state);
    }
}

impl PartialOrd for ObjectKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ObjectKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

impl Borrow<str> for ObjectKey {
    fn borrow(&self) -> &str {
        &self.key
    }
}

impl AsRef<str> for ObjectKey {
    fn as_ref(&self) -> &str {
        &self.key
    }
}

impl PartialEq<str> for ObjectKey {
    fn eq(&self, other: &str) -> bool {
        self.key == other
    }
}

impl PartialEq<&str> for ObjectKey {
    fn eq(&self, other: &&str) -> bool {
        self.key == *other
    }
}

impl From<ObjectKey> for String {
    fn from(key: ObjectKey) -> Self {
        key.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_key_reads_back_from_its_string_form() {
        for (namespace, name) in [(Some("web"), "frontend"), (None, "node-1")] {
            let key = ObjectKey::new(namespace, name).unwrap();
            let again: ObjectKey = key.to_string().parse().unwrap();
            assert_eq!(again, key);
            assert_eq!((again.namespace(), again.name()), (namespace, name));
        }
    }

    #[test]
    fn malformed_keys_are_refused_where_they_are_made_naming_what_is_wrong() {
        for (namespace, name, why) in [
            (Some("ns"), "", "the name is empty"),
            (None, "", "the name is empty"),
            (Some(""), "a", "the namespace is empty"),
            (Some("a/b"), "c", "a namespace holds no '/'"),
            (Some("ns"), "a/b", "a name holds no '/'"),
        ] {
            let err = ObjectKey::new(namespace, name).unwrap_err();
            assert!(err.to_string().contains(why), "{err}");
        }
        for (key, why) in [
            ("/name", "a cluster-scoped key is the name alone"),
            ("ns/", "the name after '/' is empty"),
            ("a/b/c", "at most one '/'"),
            ("", "the name is empty"),
        ] {
            let err = key.parse::<ObjectKey>().unwrap_err();
            assert!(err.to_string().contains(why), "{key:?}: {err}");
        }
    }

    #[test]
    fn a_map_keyed_by_object_keys_is_looked_up_with_the_string_form() {
        let mut map = HashMap::new();
        map.insert(ObjectKey::namespaced("ns", "a").unwrap(), 1);
        map.insert(ObjectKey::cluster("a").unwrap(), 2);
        assert_eq!(map.get("ns/a"), Some(&1));
        assert_eq!(map.get("a"), Some(&2));
        assert_eq!(map.get("ns/b"), None);
    }

    #[test]
    fn the_key_of_an_object_is_its_namespace_and_name() {
        let mut pod = k8s_openapi::api::core::v1::Pod::default();
        pod.metadata.namespace = Some("web".into());
        pod.metadata.name = Some("frontend".into());
        let key = ObjectKey::of(&pod).unwrap();
        assert_eq!((key.namespace(), key.name()), (Some("web"), "frontend"));
        pod.metadata.name = None;
        assert!(matches!(
            ObjectKey::of(&pod),
            Err(KeyError::MissingName { .. })
        ));
    }

    /// `of` reads an object as client-go's key function does.
    #[test]
    fn the_key_of_an_object_is_its_meta_namespace_key() {
        for (namespace, name) in [
            (Some("web"), Some("frontend")),
            (Some(""), Some("frontend")),
            (None, Some("node-1")),
            (Some("web"), Some("")),
            (Some("web"), None),
        ] {
            let mut pod = k8s_openapi::api::core::v1::Pod::default();
            pod.metadata.namespace = namespace.map(str::to_owned);
            pod.metadata.name = name.map(str::to_owned);
            let by_string =
                crate::meta_namespace_key(&pod).map(|k| k.parse::<ObjectKey>().unwrap());
            match (ObjectKey::of(&pod), by_string) {
                (Ok(key), Ok(expected)) => assert_eq!(key, expected),
                (Err(e), Err(expected)) => assert_eq!(e.to_string(), expected.to_string()),
                (got, expected) => panic!("{namespace:?}/{name:?}: {got:?} against {expected:?}"),
            }
        }
    }
}
