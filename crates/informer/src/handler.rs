//! Event handlers: what an informer calls for each add, update and delete.

use std::sync::Arc;
use std::time::Duration;

use kinformer_store::ObjectOrTombstone;

/// How long a handler waits after a panic unless it says otherwise: client-go's.
pub(crate) const DEFAULT_PANIC_PAUSE: Duration = Duration::from_secs(1);

/// Receives an informer's notifications: client-go's `ResourceEventHandler`.
///
/// Each handler runs on a thread of its own with an unbounded buffer, so a
/// slow handler delays only itself; it may block. A handler that panics is
/// logged, and gets its next notification after a pause
/// ([`panic_pause`](Self::panic_pause), 1 s by default, as client-go), so
/// that a handler panicking on every object cannot keep a core busy; its
/// notifications meanwhile stay buffered, and the other handlers and the
/// watch go on.
pub trait ResourceEventHandler<K>: Send + Sync + 'static {
    /// An object appeared. `is_in_initial_list` is true for the objects of
    /// the first list (and for the current cache replayed to a handler added
    /// after the informer started).
    fn on_add(&self, obj: &Arc<K>, is_in_initial_list: bool) {
        let _ = (obj, is_in_initial_list);
    }
    /// An object changed, or a resync replayed it (then `old` and `new` are
    /// the same object).
    fn on_update(&self, old: &Arc<K>, new: &Arc<K>) {
        let _ = (old, new);
    }
    /// An object was deleted; a tombstone when the deletion was found on relist.
    fn on_delete(&self, obj: &ObjectOrTombstone<K>) {
        let _ = obj;
    }
    /// How long this handler waits after one of its callbacks panicked
    /// before it gets its next notification: 1 s, as client-go's
    /// processorListener (restarted by `wait.Until` a second after a
    /// panic). Zero: at once. Read once, when the handler is added.
    fn panic_pause(&self) -> Duration {
        DEFAULT_PANIC_PAUSE
    }
}

type AddFn<K> = Box<dyn Fn(&Arc<K>, bool) + Send + Sync>;
type UpdateFn<K> = Box<dyn Fn(&Arc<K>, &Arc<K>) + Send + Sync>;
type DeleteFn<K> = Box<dyn Fn(&ObjectOrTombstone<K>) + Send + Sync>;

/// A handler made of closures, any of which may be left out:
/// client-go's `ResourceEventHandlerDetailedFuncs`.
///
/// ```
/// use k8s_openapi::api::core::v1::Pod;
/// use kinformer_informer::ResourceEventHandlerFuncs;
/// let handler = ResourceEventHandlerFuncs::<Pod>::new()
///     .on_add(|pod, _initial| println!("add {:?}", pod.metadata.name))
///     .on_delete(|pod| println!("delete {:?}", pod.object().metadata.name));
/// ```
pub struct ResourceEventHandlerFuncs<K> {
    add: Option<AddFn<K>>,
    update: Option<UpdateFn<K>>,
    delete: Option<DeleteFn<K>>,
    panic_pause: Duration,
}

impl<K> std::fmt::Debug for ResourceEventHandlerFuncs<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceEventHandlerFuncs")
            .field("on_add", &self.add.is_some())
            .field("on_update", &self.update.is_some())
            .field("on_delete", &self.delete.is_some())
            .field("panic_pause", &self.panic_pause)
            .finish()
    }
}

impl<K> Default for ResourceEventHandlerFuncs<K> {
    fn default() -> Self {
        Self {
            add: None,
            update: None,
            delete: None,
            panic_pause: DEFAULT_PANIC_PAUSE,
        }
    }
}

impl<K> ResourceEventHandlerFuncs<K> {
    /// A handler that does nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Called on add.
    #[must_use]
    pub fn on_add(mut self, f: impl Fn(&Arc<K>, bool) + Send + Sync + 'static) -> Self {
        self.add = Some(Box::new(f));
        self
    }

    /// Called on update.
    #[must_use]
    pub fn on_update(mut self, f: impl Fn(&Arc<K>, &Arc<K>) + Send + Sync + 'static) -> Self {
        self.update = Some(Box::new(f));
        self
    }

    /// Called on delete.
    #[must_use]
    pub fn on_delete(mut self, f: impl Fn(&ObjectOrTombstone<K>) + Send + Sync + 'static) -> Self {
        self.delete = Some(Box::new(f));
        self
    }

    /// How long to wait after a panic of one of the closures before the
    /// next notification ([`ResourceEventHandler::panic_pause`]); 1 s
    /// unless set, zero for none.
    #[must_use]
    pub fn panic_pause(mut self, pause: Duration) -> Self {
        self.panic_pause = pause;
        self
    }
}

impl<K: Send + Sync + 'static> ResourceEventHandler<K> for ResourceEventHandlerFuncs<K> {
    fn on_add(&self, obj: &Arc<K>, is_in_initial_list: bool) {
        if let Some(f) = &self.add {
            f(obj, is_in_initial_list)
        }
    }
    fn on_update(&self, old: &Arc<K>, new: &Arc<K>) {
        if let Some(f) = &self.update {
            f(old, new)
        }
    }
    fn on_delete(&self, obj: &ObjectOrTombstone<K>) {
        if let Some(f) = &self.delete {
            f(obj)
        }
    }
    fn panic_pause(&self) -> Duration {
        self.panic_pause
    }
}
