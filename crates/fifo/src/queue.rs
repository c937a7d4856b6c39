//! Either queue, behind one type: what a Reflector feeds and an informer pops.

use std::sync::Arc;

use kinformer_store::{KeyFunc, KnownObjects, Object, ObjectOrTombstone};

use crate::{
    DeltaFifo, DeltaFifoOptions, DeltaFifoReplace, Deltas, FifoError, PopError, Popped, RealFifo,
    RealFifoOptions, RealFifoReplace, Requeue,
};

/// Which queue an informer puts between its Reflector and its cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FifoKind {
    /// [`DeltaFifo`]: the changes of one key merged into one pop; client-go's
    /// queue before v0.33.
    DeltaFifo,
    /// [`RealFifo`]: every change its own pop, in arrival order; a relist
    /// applied key by key (client-go's `InOrderInformers` without
    /// `AtomicFIFO`).
    RealFifo,
    /// [`RealFifo`] in its atomic mode ([`RealFifoOptions::atomic`]),
    /// client-go v0.37's default and kinformer's: every change its own pop
    /// in arrival order, a relist one unit the consumer swaps its cache for
    /// at once, a resync one unit, and bookmarks passed on.
    #[default]
    AtomicFifo,
}

/// A [`DeltaFifo`] or a [`RealFifo`], shared: the operations a Reflector and
/// an informer use, dispatched to whichever it is. Clones share the queue.
#[derive(Debug)]
pub enum InformerQueue<K> {
    /// A DeltaFifo.
    DeltaFifo(Arc<DeltaFifo<K>>),
    /// A RealFifo.
    RealFifo(Arc<RealFifo<K>>),
}

impl<K> Clone for InformerQueue<K> {
    fn clone(&self) -> Self {
        match self {
            Self::DeltaFifo(f) => Self::DeltaFifo(Arc::clone(f)),
            Self::RealFifo(f) => Self::RealFifo(Arc::clone(f)),
        }
    }
}

impl<K> From<Arc<DeltaFifo<K>>> for InformerQueue<K> {
    fn from(fifo: Arc<DeltaFifo<K>>) -> Self {
        Self::DeltaFifo(fifo)
    }
}

impl<K> From<Arc<RealFifo<K>>> for InformerQueue<K> {
    fn from(fifo: Arc<RealFifo<K>>) -> Self {
        Self::RealFifo(fifo)
    }
}

impl<K: Object> InformerQueue<K> {
    /// A new queue of `kind`, keying objects with `key_func` and finding
    /// deletions and resyncs among `known`.
    pub fn new(kind: FifoKind, key_func: KeyFunc<K>, known: Arc<dyn KnownObjects<K>>) -> Self {
        match kind {
            FifoKind::DeltaFifo => Self::DeltaFifo(Arc::new(DeltaFifo::with_options(
                DeltaFifoOptions::new()
                    .key_func(key_func)
                    .known_objects(known),
            ))),
            FifoKind::RealFifo => Self::RealFifo(Arc::new(RealFifo::with_options(
                RealFifoOptions::new()
                    .key_func(key_func)
                    .known_objects(known),
            ))),
            FifoKind::AtomicFifo => Self::RealFifo(Arc::new(RealFifo::with_options(
                RealFifoOptions::new()
                    .key_func(key_func)
                    .known_objects(known)
                    .atomic(),
            ))),
        }
    }
}

impl<K> InformerQueue<K> {
    /// Which queue this is.
    pub fn kind(&self) -> FifoKind {
        match self {
            Self::DeltaFifo(_) => FifoKind::DeltaFifo,
            Self::RealFifo(f) if f.is_atomic() => FifoKind::AtomicFifo,
            Self::RealFifo(_) => FifoKind::RealFifo,
        }
    }

    /// Records that the object was added.
    pub fn add(&self, obj: Arc<K>) -> Result<(), FifoError> {
        match self {
            Self::DeltaFifo(f) => f.add(obj),
            Self::RealFifo(f) => f.add(obj),
        }
    }

    /// Records that the object was updated.
    pub fn update(&self, obj: Arc<K>) -> Result<(), FifoError> {
        match self {
            Self::DeltaFifo(f) => f.update(obj),
            Self::RealFifo(f) => f.update(obj),
        }
    }

    /// Records that the object was deleted.
    pub fn delete(&self, obj: impl Into<ObjectOrTombstone<K>>) -> Result<(), FifoError> {
        match self {
            Self::DeltaFifo(f) => f.delete(obj),
            Self::RealFifo(f) => f.delete(obj),
        }
    }

    /// Records a full list as of `resource_version`.
    pub fn replace(&self, list: Vec<Arc<K>>, resource_version: &str) -> Result<(), FifoError> {
        match self {
            Self::DeltaFifo(f) => f.replace(list, resource_version),
            Self::RealFifo(f) => f.replace(list, resource_version),
        }
    }

    /// A replace whose objects are handed over one at a time: see
    /// [`DeltaFifo::begin_replace`] (each object queued at once) and
    /// [`RealFifo::begin_replace`] (the list kept until it is complete).
    pub fn begin_replace(&self) -> QueueReplace<'_, K> {
        match self {
            Self::DeltaFifo(f) => QueueReplace::DeltaFifo(f.begin_replace()),
            Self::RealFifo(f) => QueueReplace::RealFifo(f.begin_replace()),
        }
    }

    /// Records a watch bookmark: a unit of its own on an atomic RealFifo
    /// (see [`RealFifo::bookmark`]), nothing on the others.
    pub fn bookmark(&self, resource_version: &str) {
        match self {
            Self::DeltaFifo(_) => {}
            Self::RealFifo(f) => f.bookmark(resource_version),
        }
    }

    /// Queues a `Sync` for every known object with nothing queued (one
    /// `SyncAll` unit on an atomic RealFifo).
    pub fn resync(&self) -> Result<(), FifoError> {
        match self {
            Self::DeltaFifo(f) => f.resync(),
            Self::RealFifo(f) => f.resync(),
        }
    }

    /// Waits for the next pop and hands it to `process` with its key and
    /// `is_in_initial_list`; see [`DeltaFifo::pop_with_key`] and
    /// [`RealFifo::pop_with_key`].
    pub async fn pop_with_key<T, E, F>(&self, process: F) -> Result<T, PopError<E>>
    where
        F: FnOnce(&str, &Deltas<K>, bool) -> Result<T, Requeue<E>>,
    {
        match self {
            Self::DeltaFifo(f) => f.pop_with_key(process).await,
            Self::RealFifo(f) => f.pop_with_key(process).await,
        }
    }

    /// Waits for the next unit and hands it to `process` with
    /// `is_in_initial_list`: a key's deltas from a DeltaFifo, any unit from
    /// a RealFifo (see [`RealFifo::pop_unit`]; an atomic one runs `process`
    /// with the queue unlocked).
    pub async fn pop_unit<T, E, F>(&self, process: F) -> Result<T, PopError<E>>
    where
        F: FnOnce(Popped<'_, K>, bool) -> Result<T, Requeue<E>>,
    {
        match self {
            Self::DeltaFifo(f) => {
                f.pop_with_key(|key, deltas, initial| {
                    process(Popped::Deltas { key, deltas }, initial)
                })
                .await
            }
            Self::RealFifo(f) => f.pop_unit(process).await,
        }
    }

    /// Closes the queue.
    pub fn close(&self) {
        match self {
            Self::DeltaFifo(f) => f.close(),
            Self::RealFifo(f) => f.close(),
        }
    }

    /// True once the first list has been popped entirely.
    pub fn has_synced(&self) -> bool {
        match self {
            Self::DeltaFifo(f) => f.has_synced(),
            Self::RealFifo(f) => f.has_synced(),
        }
    }

    /// Pops waiting: keys for a DeltaFifo, units for a RealFifo.
    pub fn len(&self) -> usize {
        match self {
            Self::DeltaFifo(f) => f.len(),
            Self::RealFifo(f) => f.len(),
        }
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A replace in progress on an [`InformerQueue`], from
/// [`InformerQueue::begin_replace`].
#[derive(Debug)]
pub enum QueueReplace<'a, K> {
    /// On a DeltaFifo.
    DeltaFifo(DeltaFifoReplace<'a, K>),
    /// On a RealFifo.
    RealFifo(RealFifoReplace<'a, K>),
}

impl<K: Object> QueueReplace<'_, K> {
    /// Hands over the next listed object; an object without a key is
    /// refused with an error naming it, and the replace goes on.
    pub fn push(&mut self, obj: Arc<K>) -> Result<(), FifoError> {
        match self {
            Self::DeltaFifo(r) => r.push(obj),
            Self::RealFifo(r) => r.push(obj),
        }
    }

    /// Hands over several listed objects at once (one lock on a
    /// DeltaFifo); returns the objects refused, each error naming its
    /// object.
    pub fn push_all(&mut self, objs: Vec<Arc<K>>) -> Vec<FifoError> {
        match self {
            Self::DeltaFifo(r) => r.push_all(objs),
            Self::RealFifo(r) => r.push_all(objs),
        }
    }
}

impl<K> QueueReplace<'_, K> {
    /// A listed object that could not be read under `key`: no deletion is
    /// inferred for the key, and the version the consumer holds stays (see
    /// [`DeltaFifoReplace::keep`] and [`RealFifoReplace::keep`]).
    pub fn keep(&mut self, key: &str) {
        match self {
            Self::DeltaFifo(r) => r.keep(key),
            Self::RealFifo(r) => r.keep(key),
        }
    }

    /// A listed object whose key could not be read either: no deletion is
    /// inferred from this list at all.
    pub fn keep_all(&mut self) {
        match self {
            Self::DeltaFifo(r) => r.keep_all(),
            Self::RealFifo(r) => r.keep_all(),
        }
    }

    /// How many objects have been taken (distinct keys on a DeltaFifo).
    pub fn len(&self) -> usize {
        match self {
            Self::DeltaFifo(r) => r.len(),
            Self::RealFifo(r) => r.len(),
        }
    }

    /// Whether nothing has been taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The list starts again from its beginning: what was handed over no
    /// longer counts as listed (see [`DeltaFifoReplace::restart`] and
    /// [`RealFifoReplace::restart`]).
    pub fn restart(&mut self) {
        match self {
            Self::DeltaFifo(r) => r.restart(),
            Self::RealFifo(r) => r.restart(),
        }
    }

    /// The list is complete: queues the deletions it implies.
    pub fn finish(self, resource_version: &str) {
        match self {
            Self::DeltaFifo(r) => r.finish(resource_version),
            Self::RealFifo(r) => r.finish(resource_version),
        }
    }
}
