//! Why a key is in a controller's queue: the `reason` field of the
//! reconcile span (kube-runtime's `ReconcileReason`, controller-runtime's
//! event handlers logging their source).
//!
//! The workqueue holds bare keys and folds a key added twice into one, so
//! the reasons live beside it, one per queued key:
//! - a reason that brings the key at once (its own event, a related
//!   object's, a slot just taken) is kept from the first such add after the
//!   key was last taken: the event that queued it, the later ones having
//!   been folded into it;
//! - a retry or a `RequeueAfter` is kept apart, for when its time comes: an
//!   event during the backoff reconciles the key early (reason: the event)
//!   and the scheduled add then finds its own reason still there.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use kinformer_store::ObjectKey;
use parking_lot::Mutex;

/// Why a key was queued: the `reason` of its reconcile's span, and of the
/// [`Request`](crate::Request) a [`Reconciler`](crate::Reconciler) receives
/// (kube-runtime's `ReconcileReason`). Its `Display` is the text logged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The object was added to the cache (listed or created).
    Added,
    /// The object changed.
    Updated,
    /// The informer's periodic resync delivered it unchanged.
    Resynced,
    /// The object was deleted.
    Deleted,
    /// An object the controller owns or watches changed.
    Related {
        /// Its kind (or type name).
        kind: Arc<str>,
        /// Its key.
        key: ObjectKey,
    },
    /// The reconcile asked for it (`Action::RequeueAfter`).
    Requeued,
    /// The last reconcile failed.
    Retry,
    /// A sharded controller took the key's slot.
    SlotTaken,
    /// Parked until the cache saw the Manager's own writes, it has.
    CaughtUp,
    /// Parked until the cache saw the Manager's own writes, it did not in
    /// time: reconciled from the cache as it is.
    StaleCache,
    /// Queued through `Controller::queue` by the user, or a reason lost.
    Unknown,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Added => f.write_str("object added"),
            Self::Updated => f.write_str("object updated"),
            Self::Resynced => f.write_str("resync"),
            Self::Deleted => f.write_str("object deleted"),
            Self::Related { kind, key } => write!(f, "related {kind} {key} changed"),
            Self::Requeued => f.write_str("requeue requested"),
            Self::Retry => f.write_str("retry after an error"),
            Self::SlotTaken => f.write_str("slot taken"),
            Self::CaughtUp => f.write_str("cache caught up with this manager's writes"),
            Self::StaleCache => {
                f.write_str("cache still behind this manager's writes at the bound")
            }
            Self::Unknown => f.write_str("unknown"),
        }
    }
}

/// The reasons of the queued keys.
#[derive(Debug, Default)]
pub(crate) struct Reasons {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    now: HashMap<ObjectKey, Reason>,
    scheduled: HashMap<ObjectKey, Reason>,
}

impl Reasons {
    /// `key` is being added to the queue at once because of `reason`.
    pub(crate) fn now(&self, key: &ObjectKey, reason: impl FnOnce() -> Reason) {
        let mut inner = self.inner.lock();
        if !inner.now.contains_key(key) {
            inner.now.insert(key.clone(), reason());
        }
    }

    /// `key` is being added to the queue later because of `reason` (a
    /// retry or a requeue); the latest schedule is kept.
    pub(crate) fn scheduled(&self, key: &ObjectKey, reason: Reason) {
        self.inner.lock().scheduled.insert(key.clone(), reason);
    }

    /// A worker took `key`: why it was queued.
    pub(crate) fn take(&self, key: &ObjectKey) -> Reason {
        let mut inner = self.inner.lock();
        inner
            .now
            .remove(key)
            .or_else(|| inner.scheduled.remove(key))
            .unwrap_or(Reason::Unknown)
    }

    /// `key` will not be reconciled here: forget why it was queued.
    pub(crate) fn forget(&self, key: &ObjectKey) {
        let mut inner = self.inner.lock();
        inner.now.remove(key);
        inner.scheduled.remove(key);
    }
}

/// The short name of the type `C` (`ConfigMap`, `PartialObjectMeta`), for
/// a related object's reason when its kind is not known.
pub(crate) fn type_name<C>() -> Arc<str> {
    let full = std::any::type_name::<C>();
    let outer = full.split('<').next().unwrap_or(full);
    outer.rsplit("::").next().unwrap_or(outer).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(key: &str) -> ObjectKey {
        key.parse().unwrap()
    }

    #[test]
    fn the_first_event_since_the_key_was_taken_is_its_reason() {
        let reasons = Reasons::default();
        reasons.now(&k("ns/a"), || Reason::Added);
        reasons.now(&k("ns/a"), || Reason::Updated);
        assert_eq!(reasons.take(&k("ns/a")), Reason::Added);
        reasons.now(&k("ns/a"), || Reason::Deleted);
        assert_eq!(reasons.take(&k("ns/a")), Reason::Deleted);
        assert_eq!(reasons.take(&k("ns/a")), Reason::Unknown);
    }

    #[test]
    fn a_retry_keeps_its_reason_when_an_event_comes_first() {
        let reasons = Reasons::default();
        reasons.scheduled(&k("ns/a"), Reason::Retry);
        // An event during the backoff reconciles the key early ...
        reasons.now(&k("ns/a"), || Reason::Updated);
        assert_eq!(reasons.take(&k("ns/a")), Reason::Updated);
        // ... and the retry, when its time comes, is a retry.
        assert_eq!(reasons.take(&k("ns/a")), Reason::Retry);
        reasons.scheduled(&k("ns/b"), Reason::Requeued);
        reasons.forget(&k("ns/b"));
        assert_eq!(reasons.take(&k("ns/b")), Reason::Unknown);
    }

    #[test]
    fn a_type_is_named_without_its_path_or_parameters() {
        use k8s_openapi::api::core::v1::ConfigMap;
        assert_eq!(&*type_name::<ConfigMap>(), "ConfigMap");
        assert_eq!(
            &*type_name::<kube_client::core::PartialObjectMeta<ConfigMap>>(),
            "PartialObjectMeta"
        );
    }
}
