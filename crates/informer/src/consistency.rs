//! Consistency checking (test support): is an informer's cache, and what each
//! handler saw last, equal to the server's state?
//!
//! [`diff_cache`] lists from the server (a quorum read) and compares by UID
//! and resourceVersion; [`LastSeen`] is a handler that records the last state
//! it saw per key, to compare the same way.

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

/// A handler recording the last state it saw per key (deletes remove the
/// key), and how many deletes arrived as tombstones.
#[derive(Clone, Default)]
pub struct LastSeen {
    state: Arc<Mutex<ObjectVersions>>,
    tombstones: Arc<std::sync::atomic::AtomicU64>,
}

impl fmt::Debug for LastSeen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LastSeen")
            .field("keys", &self.state.lock().len())
            .finish()
    }
}

impl LastSeen {
    /// A copy of what was seen.
    pub fn snapshot(&self) -> ObjectVersions {
        self.state.lock().clone()
    }

    /// Deletes that arrived as tombstones.
    pub fn tombstones(&self) -> u64 {
        self.tombstones.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn put<K: Object>(&self, obj: &K) {
        self.state.lock().extend(versions([obj]));
    }
}

impl<K: Object> ResourceEventHandler<K> for LastSeen {
    fn on_add(&self, obj: &Arc<K>, _: bool) {
        self.put(obj.as_ref());
    }
    fn on_update(&self, _: &Arc<K>, new: &Arc<K>) {
        self.put(new.as_ref());
    }
    fn on_delete(&self, obj: &kinformer_store::ObjectOrTombstone<K>) {
        if obj.is_tombstone() {
            self.tombstones
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        if let Ok(key) = kinformer_store::deletion_handling_meta_namespace_key(obj) {
            self.state.lock().remove(&key);
        }
    }
}
