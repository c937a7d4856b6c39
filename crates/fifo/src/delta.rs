//! A change to one object, and the ordered changes queued for one key.

use std::ops::Deref;
use std::sync::Arc;

use kinformer_store::ObjectOrTombstone;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeltaType {
    /// The object appeared (watch ADDED).
    Added,
    /// The object changed (watch MODIFIED).
    Updated,
    /// The object went away (watch DELETED, or missing from a relist).
    Deleted,
    /// The object was in a full list (relist); it may or may not have changed.
    Replaced,
    /// A periodic resync, or a full list in the legacy mode.
    Sync,
}

/// One change: its type and the object after it (or a tombstone).
#[derive(Debug)]
pub struct Delta<K> {
    /// What happened.
    pub kind: DeltaType,
    /// The object, or for a delete found on relist its tombstone.
    pub object: ObjectOrTombstone<K>,
}

impl<K> Clone for Delta<K> {
    fn clone(&self) -> Self {
        Self {
            kind: self.kind,
            object: self.object.clone(),
        }
    }
}

impl<K> Delta<K> {
    /// A delta carrying the object itself.
    pub fn new(kind: DeltaType, object: Arc<K>) -> Self {
        Self {
            kind,
            object: ObjectOrTombstone::Object(object),
        }
    }

    /// The `Deleted` delta a relist infers for `key`, last seen as `obj`:
    /// a [`DeletedFinalStateUnknown`](crate::DeletedFinalStateUnknown) tombstone.
    pub(crate) fn tombstone(key: &str, obj: Arc<K>) -> Self {
        Self {
            kind: DeltaType::Deleted,
            object: ObjectOrTombstone::Tombstone(kinformer_store::DeletedFinalStateUnknown {
                key: key.to_owned(),
                obj,
            }),
        }
    }
}

/// The changes queued for one key, oldest first; never empty once queued.
#[derive(Debug)]
pub struct Deltas<K>(pub(crate) Vec<Delta<K>>);

impl<K> Clone for Deltas<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K> Deltas<K> {
    /// The oldest change.
    pub fn oldest(&self) -> Option<&Delta<K>> {
        self.0.first()
    }

    /// The newest change: the latest known state of the object.
    pub fn newest(&self) -> Option<&Delta<K>> {
        self.0.last()
    }

    /// The changes, giving up the wrapper.
    pub fn into_vec(self) -> Vec<Delta<K>> {
        self.0
    }

    /// Appends `delta`, collapsing two deletes in a row into one: the one
    /// that knows the object's final state wins over a tombstone.
    pub(crate) fn push(&mut self, delta: Delta<K>) {
        if delta.kind == DeltaType::Deleted
            && let Some(last) = self.0.last_mut()
            && last.kind == DeltaType::Deleted
        {
            if last.object.is_tombstone() {
                *last = delta;
            }
            return;
        }
        self.0.push(delta);
    }
}

impl<K> Deref for Deltas<K> {
    type Target = [Delta<K>];
    fn deref(&self) -> &[Delta<K>] {
        &self.0
    }
}

impl<'a, K> IntoIterator for &'a Deltas<K> {
    type Item = &'a Delta<K>;
    type IntoIter = std::slice::Iter<'a, Delta<K>>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
