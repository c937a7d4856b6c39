//! Consistency checking (test support): is an informer's cache, and what each
//! handler saw last, equal to the server's state?
//!
//! [`diff_cache`] lists from the server (a quorum read) and compares by UID
//! and resourceVersion; [`LastSeen`] is a handler that records the last state
//! it saw per key, to compare the same way.
//!
//! An end state equal to the server's does not prove the notifications on
//! the way were right: a lost delete followed by a re-create, a duplicate
//! add, or an update whose `old` is not what the handler had all end in the
//! right state. So [`LastSeen`] also checks each notification against the
//! one before it for the same key and records every [`Violation`]:
//! - an add is only for a key it does not have;
//! - an update's `old` is the object it saw last (same UID and
//!   resourceVersion); a resync's update, whose `old` and `new` are the
//!   cached object, passes;
//! - a delete (a tombstone from a relist too) is only for a key it has, and
//!   of the same object (UID; the resourceVersion of a watch's DELETED is the
//!   deletion's, newer than the one it had).
//!
//! A handler added after the informer started gets the cache as adds first,
//! so it starts from an empty view like any other.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use kinformer_store::{Object, meta_namespace_key};
use kube_client::Resource;
use kube_client::api::{Api, ListParams};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;

use crate::{ResourceEventHandler, SharedIndexInformer};

/// (uid, resourceVersion) per key.
pub type ObjectVersions = BTreeMap<String, (String, String)>;

/// One way in which a view differs from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// On the server, not in the view.
    Missing {
        /// The object's key.
        key: String,
    },
    /// In the view, gone from the server.
    Extra {
        /// The object's key.
        key: String,
    },
    /// In both, with another UID or resourceVersion.
    Stale {
        /// The object's key.
        key: String,
        /// (uid, resourceVersion) on the server.
        server: (String, String),
        /// (uid, resourceVersion) in the view.
        view: (String, String),
    },
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { key } => write!(f, "{key}: on the server, missing from the view"),
            Self::Extra { key } => write!(f, "{key}: in the view, gone from the server"),
            Self::Stale { key, server, view } => write!(
                f,
                "{key}: server has uid {} rv {}, view has uid {} rv {}",
                server.0, server.1, view.0, view.1
            ),
        }
    }
}

/// The versions of `objects`, keyed `namespace/name`.
pub fn versions<'a, K: Object + 'a>(objects: impl IntoIterator<Item = &'a K>) -> ObjectVersions {
    objects
        .into_iter()
        .filter_map(|o| {
            let key = meta_namespace_key(o).ok()?;
            Some((
                key,
                (
                    o.uid().unwrap_or_default().to_owned(),
                    o.resource_version().unwrap_or_default().to_owned(),
                ),
            ))
        })
        .collect()
}

/// Every difference between `server` and `view`.
pub fn diff(server: &ObjectVersions, view: &ObjectVersions) -> Vec<Difference> {
    let mut out = Vec::new();
    for (key, s) in server {
        match view.get(key) {
            None => out.push(Difference::Missing { key: key.clone() }),
            Some(v) if v != s => out.push(Difference::Stale {
                key: key.clone(),
                server: s.clone(),
                view: v.clone(),
            }),
            Some(_) => {}
        }
    }
    for key in view.keys().filter(|k| !server.contains_key(*k)) {
        out.push(Difference::Extra { key: key.clone() });
    }
    out
}

/// The server's current objects behind `api` (a quorum list, not from the cache).
pub async fn server_versions<K>(api: &Api<K>) -> Result<ObjectVersions, kube_client::Error>
where
    K: Resource + Object + Clone + DeserializeOwned + fmt::Debug,
{
    let list = api.list(&ListParams::default()).await?;
    Ok(versions(&list.items))
}

/// Every difference between the informer's cache and the server.
pub async fn diff_cache<K>(
    informer: &SharedIndexInformer<K>,
    api: &Api<K>,
) -> Result<Vec<Difference>, kube_client::Error>
where
    K: Resource + Object + Clone + DeserializeOwned + fmt::Debug,
{
    let server = server_versions(api).await?;
    let cached = informer.indexer().list();
    Ok(diff(&server, &versions(cached.iter().map(|o| o.as_ref()))))
}

/// A notification that does not follow from the ones before it for its key.
/// Versions are (uid, resourceVersion).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// An add for a key the handler already had: a duplicate add, or a lost
    /// delete followed by a re-create.
    AddOfPresent {
        /// The object's key.
        key: String,
        /// What the handler had.
        present: (String, String),
        /// What was added.
        added: (String, String),
    },
    /// An update whose `old` is not the object the handler saw last for the
    /// key (`None`: the handler did not have the key).
    UpdateOfOther {
        /// The object's key.
        key: String,
        /// What the handler had.
        last_seen: Option<(String, String)>,
        /// The update's `old`.
        old: (String, String),
    },
    /// A delete of a key the handler did not have.
    DeleteOfAbsent {
        /// The object's key.
        key: String,
        /// The deleted object.
        deleted: (String, String),
    },
    /// A delete of another object (UID) than the one the handler had.
    DeleteOfOther {
        /// The object's key.
        key: String,
        /// What the handler had.
        present: (String, String),
        /// The deleted object.
        deleted: (String, String),
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = |v: &(String, String)| format!("uid {} rv {}", v.0, v.1);
        match self {
            Self::AddOfPresent {
                key,
                present,
                added,
            } => write!(f, "{key}: add of {} while holding {}", v(added), v(present)),
            Self::UpdateOfOther {
                key,
                last_seen: Some(last),
                old,
            } => write!(f, "{key}: update from {} but last saw {}", v(old), v(last)),
            Self::UpdateOfOther {
                key,
                last_seen: None,
                old,
            } => write!(f, "{key}: update from {} of a key it did not have", v(old)),
            Self::DeleteOfAbsent { key, deleted } => {
                write!(
                    f,
                    "{key}: delete of {} of a key it did not have",
                    v(deleted)
                )
            }
            Self::DeleteOfOther {
                key,
                present,
                deleted,
            } => write!(
                f,
                "{key}: delete of {} while holding {}",
                v(deleted),
                v(present)
            ),
        }
    }
}

/// A handler recording the last state it saw per key (deletes remove the
/// key), how many deletes arrived as tombstones, and every notification that
/// did not follow from the one before it ([`violations`](Self::violations)).
#[derive(Clone, Default)]
pub struct LastSeen {
    state: Arc<Mutex<SeenState>>,
    tombstones: Arc<std::sync::atomic::AtomicU64>,
}

#[derive(Default)]
struct SeenState {
    objects: ObjectVersions,
    violations: Vec<Violation>,
}

impl fmt::Debug for LastSeen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        f.debug_struct("LastSeen")
            .field("keys", &state.objects.len())
            .field("violations", &state.violations.len())
            .finish()
    }
}

/// The key and (uid, resourceVersion) of `obj`.
fn version_of<K: Object>(obj: &K) -> Option<(String, (String, String))> {
    versions([obj]).into_iter().next()
}

impl LastSeen {
    /// A copy of what was seen.
    pub fn snapshot(&self) -> ObjectVersions {
        self.state.lock().objects.clone()
    }

    /// Deletes that arrived as tombstones.
    pub fn tombstones(&self) -> u64 {
        self.tombstones.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every notification so far that did not follow from the one before it
    /// for its key, in the order they arrived.
    pub fn violations(&self) -> Vec<Violation> {
        self.state.lock().violations.clone()
    }
}

impl<K: Object> ResourceEventHandler<K> for LastSeen {
    fn on_add(&self, obj: &Arc<K>, _: bool) {
        let Some((key, added)) = version_of(obj.as_ref()) else {
            return;
        };
        let mut state = self.state.lock();
        if let Some(present) = state.objects.insert(key.clone(), added.clone()) {
            state.violations.push(Violation::AddOfPresent {
                key,
                present,
                added,
            });
        }
    }
    fn on_update(&self, old: &Arc<K>, new: &Arc<K>) {
        let (Some((key, new)), Some((_, old))) =
            (version_of(new.as_ref()), version_of(old.as_ref()))
        else {
            return;
        };
        let mut state = self.state.lock();
        let last_seen = state.objects.insert(key.clone(), new);
        if last_seen.as_ref() != Some(&old) {
            state.violations.push(Violation::UpdateOfOther {
                key,
                last_seen,
                old,
            });
        }
    }
    fn on_delete(&self, obj: &kinformer_store::ObjectOrTombstone<K>) {
        if obj.is_tombstone() {
            self.tombstones
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let Ok(key) = kinformer_store::deletion_handling_meta_namespace_key(obj) else {
            return;
        };
        let deleted = (
            obj.object().uid().unwrap_or_default().to_owned(),
            obj.object()
                .resource_version()
                .unwrap_or_default()
                .to_owned(),
        );
        let mut state = self.state.lock();
        match state.objects.remove(&key) {
            None => state
                .violations
                .push(Violation::DeleteOfAbsent { key, deleted }),
            Some(present) if present.0 != deleted.0 => {
                state.violations.push(Violation::DeleteOfOther {
                    key,
                    present,
                    deleted,
                })
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kinformer_store::{DeletedFinalStateUnknown, ObjectOrTombstone};

    use super::*;

    fn cm(name: &str, uid: &str, rv: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        })
    }

    fn v(uid: &str, rv: &str) -> (String, String) {
        (uid.to_owned(), rv.to_owned())
    }

    fn handler(seen: &LastSeen) -> &dyn ResourceEventHandler<ConfigMap> {
        seen
    }

    #[test]
    fn a_faithful_sequence_of_notifications_has_no_violation() {
        let seen = LastSeen::default();
        let h = handler(&seen);
        let a1 = cm("a", "u1", "1");
        h.on_add(&a1, true);
        let a2 = cm("a", "u1", "2");
        h.on_update(&a1, &a2);
        // A resync: old and new are the cached object.
        h.on_update(&a2, &a2);
        // A watch's DELETED carries the deletion's resourceVersion.
        h.on_delete(&ObjectOrTombstone::Object(cm("a", "u1", "3")));
        h.on_add(&cm("a", "u2", "4"), false);
        // A relist's tombstone carries the cached object.
        h.on_delete(&ObjectOrTombstone::Tombstone(DeletedFinalStateUnknown {
            key: "ns/a".into(),
            obj: cm("a", "u2", "4"),
        }));
        assert_eq!(seen.violations(), []);
        assert!(seen.snapshot().is_empty());
        assert_eq!(seen.tombstones(), 1);
    }

    #[test]
    fn a_duplicate_add_is_a_violation() {
        let seen = LastSeen::default();
        let h = handler(&seen);
        h.on_add(&cm("a", "u1", "1"), true);
        h.on_add(&cm("a", "u1", "1"), false);
        assert_eq!(
            seen.violations(),
            [Violation::AddOfPresent {
                key: "ns/a".into(),
                present: v("u1", "1"),
                added: v("u1", "1"),
            }]
        );
    }

    #[test]
    fn a_lost_delete_followed_by_a_re_create_is_a_violation() {
        let seen = LastSeen::default();
        let h = handler(&seen);
        h.on_add(&cm("a", "u1", "1"), true);
        // The delete of u1 never came; the re-created object is added.
        h.on_add(&cm("a", "u2", "5"), false);
        assert_eq!(
            seen.violations(),
            [Violation::AddOfPresent {
                key: "ns/a".into(),
                present: v("u1", "1"),
                added: v("u2", "5"),
            }]
        );
        // The end state alone would not tell.
        assert_eq!(seen.snapshot()["ns/a"], v("u2", "5"));
    }

    #[test]
    fn an_update_whose_old_is_not_what_the_handler_saw_last_is_a_violation() {
        let seen = LastSeen::default();
        let h = handler(&seen);
        h.on_add(&cm("a", "u1", "1"), true);
        // The update to rv 2 was lost.
        h.on_update(&cm("a", "u1", "2"), &cm("a", "u1", "3"));
        // An update of a key it never had.
        h.on_update(&cm("b", "u9", "4"), &cm("b", "u9", "5"));
        assert_eq!(
            seen.violations(),
            [
                Violation::UpdateOfOther {
                    key: "ns/a".into(),
                    last_seen: Some(v("u1", "1")),
                    old: v("u1", "2"),
                },
                Violation::UpdateOfOther {
                    key: "ns/b".into(),
                    last_seen: None,
                    old: v("u9", "4"),
                },
            ]
        );
    }

    #[test]
    fn a_delete_of_an_absent_key_is_a_violation() {
        let seen = LastSeen::default();
        let h = handler(&seen);
        h.on_delete(&ObjectOrTombstone::Tombstone(DeletedFinalStateUnknown {
            key: "ns/a".into(),
            obj: cm("a", "u1", "1"),
        }));
        assert_eq!(
            seen.violations(),
            [Violation::DeleteOfAbsent {
                key: "ns/a".into(),
                deleted: v("u1", "1"),
            }]
        );
    }

    #[test]
    fn a_delete_of_another_object_than_the_one_held_is_a_violation() {
        let seen = LastSeen::default();
        let h = handler(&seen);
        h.on_add(&cm("a", "u1", "1"), true);
        h.on_delete(&ObjectOrTombstone::Object(cm("a", "u2", "7")));
        let violations = seen.violations();
        assert_eq!(
            violations,
            [Violation::DeleteOfOther {
                key: "ns/a".into(),
                present: v("u1", "1"),
                deleted: v("u2", "7"),
            }]
        );
        assert_eq!(
            violations[0].to_string(),
            "ns/a: delete of uid u2 rv 7 while holding uid u1 rv 1"
        );
    }
}
