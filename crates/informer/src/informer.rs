//! SharedIndexInformer: one list+watch, one cache, any number of handlers.
//!
//! No silent freeze: a user callback that panics cannot stop the informer,
//! and an informer that can no longer keep its cache equal to the server
//! says so.
//! - Handlers: a panic is caught on the handler's thread, logged with the
//!   object's key and counted ([`ResourceEventHandlerRegistration::panics`]);
//!   the handler gets the next notification after its
//!   [`panic_pause`](ResourceEventHandler::panic_pause) (1 s by default, as
//!   client-go), so that one panicking on every object cannot keep a core
//!   busy. Its notifications meanwhile stay buffered
//!   ([`ResourceEventHandlerRegistration::pending`]); the other handlers and
//!   the watch are not held up.
//! - Index functions: the object is cached and left out of that index only,
//!   logged with key and index, counted ([`SharedIndexInformer::index_failures`]).
//! - The transform and the watch error handler: caught by the Reflector (see
//!   its module): a transform panic treats that object as undecodable.
//! - The Reflector runs as a task of its own, and what it queues is applied
//!   to the cache on a thread of the informer's own, off the runtime (see
//!   `apply.rs`: a relist's apply delays no lease renewal, watch read or
//!   webhook answer); neither outlives [`SharedIndexInformer::run`]: the
//!   Reflector is aborted when `run` returns, unwinds or is dropped, and
//!   the apply thread ends after the unit in progress. If the Reflector
//!   dies before the shutdown (a panic in it or in the [`ListerWatcher`]), or
//!   applying deltas to the cache panics, `run` stops the handlers and returns
//!   [`InformerError::Failed`], logged at error level; from then on
//!   `has_synced` is false and [`SharedIndexInformer::failure`] says why. The
//!   same holds when `run`'s future is dropped before the shutdown.

mod apply;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kinformer_fifo::{DeltaType, Deltas, FifoKind, InformerQueue, Popped, ReplacedAll};
use kinformer_store::{
    CacheReader, Compact, DeletedFinalStateUnknown, Indexer, Indexers, KnownObjects, Object,
    ObjectOrTombstone, StoreError, compare_resource_version,
};
use parking_lot::{Mutex, RwLock};
use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use crate::latency::{LatencySnapshot, ProcessingLatency};
use crate::panics::{AbortOnDrop, panic_message};
use crate::processor::{Listener, ListenerState, Notification, Processor, unique_id};
use crate::reflector::{Reflector, ReflectorOptions, ReflectorStats, default_watch_error_handler};
use crate::{
    CatchUpError, GroupResource, InformerError, ListWatchError, Lister, ListerWatcher,
    ResourceEventHandler,
};
use apply::{ApplyThread, Handover};

/// Rewrites each object once, before it is cached: client-go's `TransformFunc`.
pub type Transform<K> = Arc<dyn Fn(K) -> K + Send + Sync>;

/// Called with every list and watch error: client-go's `WatchErrorHandler`.
pub type WatchErrorHandler = Arc<dyn Fn(&ListWatchError) + Send + Sync>;

/// The shortest resync period a handler can ask for, as in client-go.
pub const MIN_RESYNC_PERIOD: Duration = Duration::from_secs(1);

/// A transform that drops `metadata.managedFields`, which most controllers
/// never read and which often is the largest part of an object.
pub fn strip_managed_fields<K: kube_client::Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

/// Handle of a registered event handler: names one registration of one
/// informer (ids are unique in the process).
#[derive(Clone)]
pub struct ResourceEventHandlerRegistration {
    id: u64,
    informer: u64,
    state: Arc<ListenerState>,
    informer_synced: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl fmt::Debug for ResourceEventHandlerRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceEventHandlerRegistration")
            .field("id", &self.id)
            .field("informer", &self.informer)
            .field("has_synced", &self.has_synced())
            .finish()
    }
}

impl ResourceEventHandlerRegistration {
    /// The registration's id, unique in the process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The id of the informer the handler is registered with
    /// ([`SharedIndexInformer::id`]).
    pub fn informer_id(&self) -> u64 {
        self.informer
    }

    /// True once the informer has synced and this handler has handled every
    /// add of the initial list (or of the replay it got when added late).
    pub fn has_synced(&self) -> bool {
        (self.informer_synced)() && self.state.pending_initial.load(Ordering::SeqCst) == 0
    }

    /// Notifications buffered for this handler and not yet handled. At 0,
    /// what the handler did for every earlier notification is visible to
    /// the caller.
    pub fn pending(&self) -> usize {
        self.state.depth.load(Ordering::Acquire)
    }

    /// Notifications this handler has handled.
    pub fn handled(&self) -> u64 {
        self.state.handled.load(Ordering::Relaxed)
    }

    /// Panics of this handler that were caught.
    pub fn panics(&self) -> u64 {
        self.state.panics.load(Ordering::Relaxed)
    }
}

/// How a [`SharedIndexInformer`] is built.
#[non_exhaustive]
pub struct InformerOptions<K> {
    /// Indexes of the cache.
    pub indexers: Indexers<K>,
    /// Resync period of handlers added without one (at least 1 s); `None`
    /// or zero: no resync.
    pub default_resync: Option<Duration>,
    /// How the Reflector lists and watches.
    pub reflector: ReflectorOptions,
    /// The queue between the Reflector and the cache. The default,
    /// [`FifoKind::AtomicFifo`], is client-go v0.37's: changes applied one
    /// by one in watch order, a relist swapped into the cache in one step
    /// before handlers hear of its deletions and then of its objects, the
    /// cache's resourceVersion kept
    /// ([`SharedIndexInformer::last_store_sync_resource_version`]). A
    /// [`FifoKind::RealFifo`] applies a relist key by key; a
    /// [`FifoKind::DeltaFifo`] merges the queued changes of a key, applies
    /// a relist key by key as it arrives, and tells the listed objects
    /// before the deletions. Handlers see the same changes on each (but for
    /// a delete of a key the cache never had, which the DeltaFifo drops).
    pub fifo: FifoKind,
    /// Keep the cache compact: each object encoded (stripped JSON with
    /// [`Compact::json`]) with its key and index values, decoded when a
    /// Lister reads it, with an optional bounded cache of decoded objects.
    /// Handlers still receive decoded objects. `None` (the default) keeps
    /// whole objects. Several times less memory per object, for a decode on
    /// each read that the decoded cache does not serve; see
    /// [`Compact`] for what the store checks.
    pub compact: Option<Compact<K>>,
    /// On the atomic queue, a relisted object at the version the cache
    /// holds (same uid, same non-empty resourceVersion) is kept as the
    /// cached one rather than held twice until the swap (a compact cache
    /// keeps its stored form, its index values computed again as every
    /// relisted object's are), so a relist's
    /// memory peak stays near the steady state (default `true`). Such an
    /// object also keeps what the transform made of it before. The server
    /// serves one content per version,
    /// except where it changes what it serves without a write (new CRD
    /// defaults or pruning, another conversion webhook, an upgrade that
    /// defaults new fields): with sharing, such content reaches the cache
    /// at the object's next write, as through a watch; `false` takes it on
    /// a relist, as client-go does.
    pub relist_shares_unchanged: bool,
}

impl<K> fmt::Debug for InformerOptions<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut indexers: Vec<&str> = self.indexers.keys().map(String::as_str).collect();
        indexers.sort_unstable();
        f.debug_struct("InformerOptions")
            .field("indexers", &indexers)
            .field("default_resync", &self.default_resync)
            .field("reflector", &self.reflector)
            .field("fifo", &self.fifo)
            .field("compact", &self.compact)
            .field("relist_shares_unchanged", &self.relist_shares_unchanged)
            .finish()
    }
}

impl<K> Default for InformerOptions<K> {
    fn default() -> Self {
        Self {
            indexers: Indexers::new(),
            default_resync: None,
            reflector: ReflectorOptions::default(),
            fifo: FifoKind::default(),
            compact: None,
            relist_shares_unchanged: true,
        }
    }
}

impl<K> InformerOptions<K> {
    /// No indexes, no resync, default Reflector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Indexes of the cache.
    #[must_use]
    pub fn indexers(mut self, indexers: Indexers<K>) -> Self {
        self.indexers = indexers;
        self
    }

    /// Resync period of handlers added without one.
    #[must_use]
    pub fn default_resync(mut self, period: Duration) -> Self {
        self.default_resync = Some(period);
        self
    }

    /// How the Reflector lists and watches.
    #[must_use]
    pub fn reflector(mut self, options: ReflectorOptions) -> Self {
        self.reflector = options;
        self
    }

    /// The queue between the Reflector and the cache.
    #[must_use]
    pub fn fifo(mut self, kind: FifoKind) -> Self {
        self.fifo = kind;
        self
    }

    /// Keeps the cache compact ([`InformerOptions::compact`](Self#structfield.compact)):
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::Pod;
    /// use kinformer_informer::{Compact, InformerOptions};
    ///
    /// let options = InformerOptions::<Pod>::new().compact(Compact::json().decoded_cache(500));
    /// ```
    #[must_use]
    pub fn compact(mut self, compact: Compact<K>) -> Self {
        self.compact = Some(compact);
        self
    }

    /// Whether a relist on the atomic queue shares unchanged objects with
    /// the cache ([`InformerOptions::relist_shares_unchanged`](Self#structfield.relist_shares_unchanged)).
    #[must_use]
    pub fn relist_shares_unchanged(mut self, share: bool) -> Self {
        self.relist_shares_unchanged = share;
        self
    }
}

/// The cache as the queue's known objects, sharing nothing whole: a
/// relist on the atomic queue then holds every listed object as it came.
struct Unshared<K>(Arc<Indexer<K>>);

impl<K: Send + Sync> KnownObjects<K> for Unshared<K> {
    fn list_keys(&self) -> Vec<String> {
        self.0.list_keys()
    }
    fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        self.0.get_by_key(key)
    }
}

/// An informer shared by many handlers: client-go's `SharedIndexInformer`.
///
/// [`run`](Self::run) lists and watches through its [`ListerWatcher`] into a
/// queue ([`InformerOptions::fifo`]), applies the deltas to its [`Indexer`],
/// and sends every change to every handler:
/// - handlers may be added before or after the informer starts; one added
///   after first receives the whole current cache as adds
///   (`is_in_initial_list` true), then every later change;
/// - each handler has its own unbounded buffer and thread: a slow handler
///   never blocks another or the watch;
/// - each handler may have its own resync period (1 s at least, zero for
///   none); a resync replays the cache to the handlers that are due, as
///   updates whose old and new objects are the same;
/// - a deletion found on relist reaches `on_delete` as a tombstone;
/// - [`set_transform`](Self::set_transform) rewrites each object exactly once
///   before it is cached ([`strip_managed_fields`] is ready-made);
/// - a panicking callback is contained, and an informer that can no longer
///   keep its cache in step says so: [`run`](Self::run) returns
///   [`InformerError::Failed`] and [`has_synced`](Self::has_synced) turns
///   false (see the module documentation).
///
/// The informer is a cheap handle; clones share it.
pub struct SharedIndexInformer<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for SharedIndexInformer<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K> fmt::Debug for SharedIndexInformer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedIndexInformer")
            .field("what", &self.inner.description)
            .field("cached", &self.inner.indexer.len())
            .field("started", &self.inner.started.load(Ordering::Relaxed))
            .finish()
    }
}

struct Inner<K> {
    /// Unique in the process; registrations carry it.
    id: u64,
    indexer: Arc<Indexer<K>>,
    fifo: InformerQueue<K>,
    lw: Arc<dyn ListerWatcher<K>>,
    processor: Processor<K>,
    description: String,
    settings: Mutex<Settings<K>>,
    started: AtomicBool,
    stopped: AtomicBool,
    /// Cancelled by [`SharedIndexInformer::stop`]: ends `run` as its own
    /// shutdown token would.
    halt: CancellationToken,
    last_sync_rv: Arc<RwLock<String>>,
    stats: Mutex<Option<Arc<ReflectorStats>>>,
    /// Set once the cache is no longer kept in step; `failure` says why.
    failed: Arc<AtomicBool>,
    failure: Mutex<Option<InformerError>>,
    index_failures: AtomicU64,
    /// How long each unit popped took to apply.
    processing_latency: ProcessingLatency,
    /// Woken after each unit applied and when the informer stops: what
    /// waits for the cache to reach a version looks again.
    applied: tokio::sync::Notify,
    /// Return freed memory to the system once a list is applied (a compact cache).
    release_after_list: bool,
    /// Lists applied by the time freed memory was last released.
    released_at: AtomicU64,
    /// Waits for the resource begun by the time freed memory was last
    /// released (see [`Inner::release_reasons`]).
    released_waits: AtomicU64,
    /// Which of a dropped `run` and its apply thread stops the informer.
    handover: Mutex<Handover>,
    /// Keys a relist kept at an older version (see [`Stale`]).
    stale: Mutex<Stale>,
}

/// Keys a relist kept as cached because their listed object could not be
/// decoded (or left absent, never cached): the cache holds them older than
/// the list, until each is applied again (an event, a later list) or
/// deleted. [`SharedIndexInformer::is_stale`] names them.
#[derive(Default)]
struct Stale {
    keys: std::collections::HashSet<Arc<str>, foldhash::fast::RandomState>,
}

struct Settings<K> {
    transform: Option<Transform<K>>,
    error_handler: WatchErrorHandler,
    reflector: ReflectorOptions,
    default_resync: Option<Duration>,
    /// How often the Reflector asks whether a handler is due a resync.
    resync_check_period: Option<Duration>,
}

impl<K: Object + Clone> SharedIndexInformer<K> {
    /// An informer over `lw` with `options`.
    pub fn new(lw: impl ListerWatcher<K>, options: InformerOptions<K>) -> Self {
        Self::from_arc(Arc::new(lw), options)
    }

    /// An informer over a shared `lw`.
    pub fn from_arc(lw: Arc<dyn ListerWatcher<K>>, options: InformerOptions<K>) -> Self {
        let release_after_list = options
            .compact
            .as_ref()
            .is_some_and(Compact::releases_after_list);
        let indexer = Arc::new(match options.compact {
            Some(compact) => Indexer::compact(options.indexers, compact),
            None => Indexer::with_indexers(options.indexers),
        });
        let known: Arc<dyn KnownObjects<K>> = if options.relist_shares_unchanged {
            indexer.clone()
        } else {
            Arc::new(Unshared(Arc::clone(&indexer)))
        };
        let fifo = InformerQueue::new(options.fifo, Arc::clone(indexer.key_func()), known);
        // Zero is "no resync", as client-go's defaultEventHandlerResyncPeriod.
        let default_resync = options
            .default_resync
            .filter(|p| !p.is_zero())
            .map(|p| p.max(MIN_RESYNC_PERIOD));
        Self {
            inner: Arc::new(Inner {
                id: unique_id(),
                description: lw.describe(),
                indexer,
                fifo,
                lw,
                processor: Processor::new(),
                settings: Mutex::new(Settings {
                    transform: None,
                    error_handler: Arc::new(default_watch_error_handler),
                    reflector: options.reflector,
                    default_resync,
                    resync_check_period: default_resync,
                }),
                started: AtomicBool::new(false),
                stopped: AtomicBool::new(false),
                halt: CancellationToken::new(),
                last_sync_rv: Arc::new(RwLock::new(String::new())),
                stats: Mutex::new(None),
                failed: Arc::new(AtomicBool::new(false)),
                failure: Mutex::new(None),
                index_failures: AtomicU64::new(0),
                processing_latency: ProcessingLatency::default(),
                applied: tokio::sync::Notify::new(),
                release_after_list,
                released_at: AtomicU64::new(0),
                released_waits: AtomicU64::new(0),
                handover: Mutex::default(),
                stale: Mutex::default(),
            }),
        }
    }

    /// Adds a handler with the informer's default resync period.
    pub fn add_event_handler(
        &self,
        handler: impl ResourceEventHandler<K>,
    ) -> Result<ResourceEventHandlerRegistration, InformerError> {
        let period = self.inner.settings.lock().default_resync;
        self.add_handler(Arc::new(handler), period)
    }

    /// Adds a handler resynced every `period`: at least 1 s, and after the
    /// informer started at least its [resync check
    /// period](Self::resync_check_period) (none at all if it started
    /// without one). Zero means never, whatever the informer's default
    /// resync, and leaves the check period alone (client-go's
    /// `determineResyncPeriod`).
    pub fn add_event_handler_with_resync(
        &self,
        handler: impl ResourceEventHandler<K>,
        period: Duration,
    ) -> Result<ResourceEventHandlerRegistration, InformerError> {
        self.add_handler(Arc::new(handler), Some(period))
    }

    fn add_handler(
        &self,
        handler: Arc<dyn ResourceEventHandler<K>>,
        period: Option<Duration>,
    ) -> Result<ResourceEventHandlerRegistration, InformerError> {
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Err(InformerError::Stopped);
        }
        let period = period
            .filter(|p| !p.is_zero())
            .map(|p| p.max(MIN_RESYNC_PERIOD));
        let period = {
            let mut settings = self.inner.settings.lock();
            match (period, self.inner.started.load(Ordering::SeqCst)) {
                (Some(p), false) => {
                    settings.resync_check_period =
                        Some(settings.resync_check_period.map_or(p, |c| c.min(p)));
                    Some(p)
                }
                (Some(p), true) => match settings.resync_check_period {
                    Some(check) if p < check => {
                        warn!(requested = ?p, used = ?check, "resync period below the informer's resync check period; using the latter");
                        Some(check)
                    }
                    // Started without any resync: handlers cannot get one now.
                    None => None,
                    Some(_) => Some(p),
                },
                (None, _) => None,
            }
        };
        let id = unique_id();
        let listener = Listener::spawn(id, handler, period);
        let state = Arc::clone(&listener.state);
        {
            // The write lock blocks delta processing: the replay below is
            // exactly the cache at this point, and every later change follows.
            let mut listeners = self.inner.processor.listeners.write();
            if self.inner.started.load(Ordering::SeqCst) {
                for obj in self.inner.indexer.list() {
                    listener.send(Notification::Add { obj, initial: true });
                }
                listener.flush();
            }
            listeners.push(listener);
        }
        let fifo = self.inner.fifo.clone();
        let failed = Arc::clone(&self.inner.failed);
        Ok(ResourceEventHandlerRegistration {
            id,
            informer: self.inner.id,
            state,
            informer_synced: Arc::new(move || !failed.load(Ordering::SeqCst) && fifo.has_synced()),
        })
    }

    /// Removes a handler; it gets no further notification.
    ///
    /// Removing a handler that is already removed, or after the informer
    /// stopped, is `Ok` and changes nothing, as in client-go. Unlike
    /// client-go (where that is a silent no-op too), a registration of
    /// another informer is refused with [`InformerError::ForeignHandler`]:
    /// it is always a mix-up of informers, and nothing is removed.
    pub fn remove_event_handler(
        &self,
        registration: &ResourceEventHandlerRegistration,
    ) -> Result<(), InformerError> {
        if registration.informer != self.inner.id {
            return Err(InformerError::ForeignHandler {
                registration: registration.id,
                owner: registration.informer,
                informer: self.inner.id,
                what: self.inner.description.clone(),
            });
        }
        let mut listeners = self.inner.processor.listeners.write();
        if let Some(pos) = listeners.iter().position(|l| l.id == registration.id) {
            let listener = listeners.remove(pos);
            listener.state.stopped.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Rewrites each object once before it is cached. Only before the start.
    pub fn set_transform(
        &self,
        transform: impl Fn(K) -> K + Send + Sync + 'static,
    ) -> Result<(), InformerError> {
        self.before_start("the transform")?;
        self.inner.settings.lock().transform = Some(Arc::new(transform));
        Ok(())
    }

    /// Called with every list and watch error instead of the default logging.
    /// Only before the start.
    pub fn set_watch_error_handler(
        &self,
        handler: impl Fn(&ListWatchError) + Send + Sync + 'static,
    ) -> Result<(), InformerError> {
        self.before_start("the watch error handler")?;
        self.inner.settings.lock().error_handler = Arc::new(handler);
        Ok(())
    }

    fn before_start(&self, what: &'static str) -> Result<(), InformerError> {
        if self.inner.started.load(Ordering::SeqCst) {
            return Err(InformerError::AlreadyStarted(what));
        }
        Ok(())
    }

    /// How often the informer checks whether a handler is due a resync: the
    /// shortest resync period of the handlers added before the start (or
    /// the default resync); `None` when no handler is ever resynced.
    pub fn resync_check_period(&self) -> Option<Duration> {
        self.inner.settings.lock().resync_check_period
    }

    /// True once the first list has been fully delivered to the cache, and
    /// false again for good if the informer failed (see [`failure`](Self::failure)).
    pub fn has_synced(&self) -> bool {
        !self.inner.failed.load(Ordering::SeqCst) && self.inner.fifo.has_synced()
    }

    /// Why the informer stopped keeping its cache in step with the server
    /// before its shutdown; `None` while it works (or after a clean shutdown).
    pub fn failure(&self) -> Option<InformerError> {
        self.inner.failure.lock().clone()
    }

    /// Index function calls that failed or panicked: each left one object
    /// out of one index (the object is cached all the same).
    pub fn index_failures(&self) -> u64 {
        self.inner.index_failures.load(Ordering::Relaxed)
    }

    /// The API group and resource it lists, from its lister-watcher
    /// ([`ListerWatcher::resource`]): every informer of a factory has one.
    pub fn resource(&self) -> Option<GroupResource> {
        self.inner.lw.resource()
    }

    /// The one namespace it lists, if it lists only one
    /// ([`ListerWatcher::namespace`]).
    pub fn namespace(&self) -> Option<&str> {
        self.inner.lw.namespace()
    }

    /// The resource version last seen from the server ("" before the first list).
    pub fn last_sync_resource_version(&self) -> String {
        self.inner.last_sync_rv.read().clone()
    }

    /// The resourceVersion the cache's content is synced to (client-go's
    /// `LastStoreSyncResourceVersion`): that of the last list, watch event
    /// or bookmark applied, moved in the same step as the content. Once
    /// it is seen at or past a version, every later read of the cache sees
    /// that version's content or newer.
    ///
    /// Only an informer whose queue applies changes in watch order and
    /// relists at once ([`FifoKind::AtomicFifo`]) can say it; `None` on the
    /// others (a DeltaFifo merges a key's changes and applies keys out of
    /// watch order, a plain RealFifo applies a relist key by key), and
    /// before the first list. One exception: an object of a relist that
    /// could not be decoded keeps its cached copy (or stays absent), older
    /// than the list's version, until it is applied again (an event, a
    /// later list) or deleted; it is counted and logged (see
    /// [`ReflectorStats`]) and [`is_stale`](Self::is_stale) names it.
    pub fn last_store_sync_resource_version(&self) -> Option<String> {
        self.inner.last_store_sync_resource_version()
    }

    /// Whether the cache holds `key` older than its
    /// [`last_store_sync_resource_version`](Self::last_store_sync_resource_version):
    /// a relist could not decode the object listed under it and kept what
    /// the cache had (or left it absent), until the key is applied again
    /// (an event, a later list) or deleted. After a write to `key`, ask
    /// this after [`has_caught_up_to`](Self::has_caught_up_to): a stale key
    /// is not caught up whatever the version says, and the version
    /// read first is never ahead of what this says.
    pub fn is_stale(&self, key: &str) -> bool {
        let stale = self.inner.stale.lock();
        !stale.keys.is_empty() && stale.keys.contains(key)
    }

    /// Whether its queue applies changes in watch order and relists at
    /// once ([`FifoKind::AtomicFifo`]): only then can it say which version
    /// its cache holds ([`has_caught_up_to`](Self::has_caught_up_to) is an
    /// error on the others).
    pub fn applies_in_order(&self) -> bool {
        self.inner.in_order()
    }

    /// Whether the cache holds the state of `resource_version` or a later
    /// one (its [`last_store_sync_resource_version`](Self::last_store_sync_resource_version)
    /// is at or past it, ordered as apimachinery's `CompareResourceVersion`):
    /// after a write answered with `resource_version`, `true` means every
    /// read of this informer's cache sees that write or something newer,
    /// unless the object written [`is_stale`](Self::is_stale) (ask after
    /// this).
    /// `false` before anything was synced. Versions are ordered within one
    /// resource only: ask the informer of the written resource.
    pub fn has_caught_up_to(&self, resource_version: &str) -> Result<bool, CatchUpError> {
        let what = || self.inner.description.clone();
        if !self.inner.in_order() {
            return Err(CatchUpError::NotInOrder { what: what() });
        }
        let Some(synced) = self.inner.last_store_sync_resource_version() else {
            // Check the version asked for all the same.
            return compare_resource_version(resource_version, resource_version)
                .map(|_| false)
                .map_err(|source| CatchUpError::Incomparable {
                    what: what(),
                    source,
                });
        };
        compare_resource_version(&synced, resource_version)
            .map(|order| order != std::cmp::Ordering::Less)
            .map_err(|source| CatchUpError::Incomparable {
                what: what(),
                source,
            })
    }

    /// Waits until [`has_caught_up_to`](Self::has_caught_up_to) holds,
    /// woken by each change the informer applies (a list, an event or a
    /// bookmark: the server sends one about every minute, so a version
    /// whose own event never comes, an object deleted meanwhile or outside
    /// a selector, is passed all the same). No bound of its own: wrap it in
    /// `tokio::time::timeout`. [`CatchUpError::Stopped`] if the informer
    /// stops first.
    pub async fn wait_caught_up_to(&self, resource_version: &str) -> Result<(), CatchUpError> {
        let mut caught_up = Ok(false);
        let held = self
            .wait_until(|informer| {
                caught_up = informer.has_caught_up_to(resource_version);
                !matches!(caught_up, Ok(false))
            })
            .await;
        match caught_up {
            Ok(false) if !held => Err(CatchUpError::Stopped {
                what: self.inner.description.clone(),
                resource_version: resource_version.to_owned(),
            }),
            other => other.map(|_| ()),
        }
    }

    /// Waits until `condition` holds for this informer, looked at now and
    /// again after each change the informer applies to its cache (a list,
    /// an event, a bookmark): for what [`wait_caught_up_to`](Self::wait_caught_up_to)
    /// does not say, such as a deleted object no longer cached. `true` once
    /// it holds; `false` if the informer stops (or has stopped) with the
    /// condition still false. No bound of its own.
    pub async fn wait_until(&self, mut condition: impl FnMut(&Self) -> bool) -> bool {
        loop {
            let notified = self.inner.applied.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if condition(self) {
                return true;
            }
            if self.inner.stopped.load(Ordering::SeqCst) {
                return false;
            }
            notified.await;
        }
    }

    /// How long the informer took to apply each unit it popped from its
    /// queue (a change, a whole list, a resync or a bookmark) to its cache
    /// and hand it to the handlers' buffers: client-go's
    /// `informer_processing_latency_seconds`.
    pub fn processing_latency(&self) -> LatencySnapshot {
        self.inner.processing_latency.snapshot()
    }

    /// Adds named indexes to the cache (client-go's `AddIndexers`), typically
    /// before the start: a secondary index that a controller's `watches`
    /// mapper looks owners up in. A name already taken is refused.
    pub fn add_indexers(&self, indexers: Indexers<K>) -> Result<(), StoreError> {
        self.inner.indexer.add_indexers(indexers)
    }

    /// Adds one index whose values for an object are what `values` returns
    /// (for an index function that cannot fail); see [`add_indexers`](Self::add_indexers).
    pub fn add_index(
        &self,
        name: &str,
        values: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
    ) -> Result<(), StoreError> {
        let func: kinformer_store::IndexFunc<K> = Arc::new(move |obj: &K| Ok(values(obj)));
        self.add_indexers(Indexers::from([(name.to_owned(), func)]))
    }

    /// The cache, read-only: only the informer writes it.
    pub fn indexer(&self) -> CacheReader<K> {
        CacheReader::new(Arc::clone(&self.inner.indexer))
    }

    /// The informer's id, unique in the process; its handler registrations
    /// carry it ([`ResourceEventHandlerRegistration::informer_id`]).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// What this informer lists and watches.
    pub fn describe(&self) -> &str {
        &self.inner.description
    }

    /// Whether `run` has been called.
    pub fn is_started(&self) -> bool {
        self.inner.started.load(Ordering::SeqCst)
    }

    /// Stops the informer for good, however it was started: `run` ends as
    /// if its shutdown token had fired (the unit being applied is
    /// finished, the handlers are stopped), and a `run` not yet called
    /// returns at once. An informer does not start again (client-go's
    /// neither); ask its factory for a fresh one. The cache keeps what it
    /// holds: [`SharedInformerFactory::share`](crate::SharedInformerFactory::share) clears it when its last
    /// share goes.
    pub fn stop(&self) {
        self.inner.halt.cancel();
    }

    /// Empties the cache of a stopped informer (its last share went), and
    /// returns the freed memory to the system.
    pub(crate) fn clear_cache(&self) {
        if let Err(e) = self.inner.indexer.replace(Vec::new(), "") {
            warn!(error = %e, what = %self.inner.description, "could not empty the cache of a released informer");
        }
        release_freed_memory();
    }

    /// Whether the informer has stopped: its `run` ended (by its shutdown
    /// token, [`stop`](Self::stop) or a failure), or `stop` came before it
    /// ran.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    /// Counters of the Reflector (once started).
    pub fn reflector_stats(&self) -> Option<Arc<ReflectorStats>> {
        self.inner.stats.lock().clone()
    }

    /// While the server does not serve this informer's resource (a custom
    /// resource whose CRD is not installed, was deleted, or no longer
    /// serves the version), its answer: the informer waits for the
    /// resource (see [`Reflector`](crate::Reflector)), and has not synced
    /// if it never listed. `None` otherwise.
    pub fn not_served(&self) -> Option<String> {
        self.reflector_stats()?.not_served_now()
    }

    /// Units waiting in the queue between the Reflector and the cache (a
    /// RealFifo's changes, whole lists, resyncs and bookmarks; a
    /// DeltaFifo's keys), the one being applied included: 0 means every
    /// change queued so far is in the cache. client-go's
    /// `informer_queued_items`, which does not count the unit in flight.
    pub fn queued(&self) -> usize {
        self.inner.fifo.len()
    }

    /// How many event handlers are registered (added and not removed).
    pub fn event_handlers(&self) -> usize {
        self.inner.processor.listeners.read().len()
    }

    /// Notifications buffered for all handlers together. At 0, what the
    /// handlers did for every notification so far is visible to the caller.
    pub fn pending_notifications(&self) -> usize {
        self.inner
            .processor
            .listeners
            .read()
            .iter()
            .map(|l| l.state.depth.load(Ordering::Acquire))
            .sum()
    }

    /// Lists, watches and dispatches until `shutdown` fires; then stops the
    /// handlers and returns `Ok`. A second call returns `Ok` at once.
    ///
    /// [`InformerError::Failed`] when the cache can no longer be kept in step
    /// with the server before `shutdown` fires: the Reflector died or applying
    /// deltas panicked. The handlers are stopped, [`has_synced`](Self::has_synced)
    /// turns false and [`failure`](Self::failure) keeps the error. The
    /// Reflector task never outlives this call, even when its future is dropped.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), InformerError> {
        if self.inner.started.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        if self.inner.halt.is_cancelled() {
            self.inner.fifo.close();
            self.inner.stop();
            return Ok(());
        }
        // Ends on `shutdown` or on `stop`, whichever comes first.
        let (shutdown, _linked) = {
            let linked = self.inner.halt.child_token();
            let cancel = linked.clone();
            let link = tokio::spawn(async move {
                shutdown.cancelled().await;
                cancel.cancel();
            });
            (linked, AbortOnDrop(link))
        };
        let reflector = {
            let settings = self.inner.settings.lock();
            let mut reflector = Reflector::new(
                Arc::clone(&self.inner.lw),
                self.inner.fifo.clone(),
                settings.reflector.clone(),
            )
            .with_transform(settings.transform.clone())
            .with_error_handler(Arc::clone(&settings.error_handler))
            // The informer reports the Reflector's last version as its own.
            .with_last_sync_resource_version(Arc::clone(&self.inner.last_sync_rv));
            if let Some(period) = settings.resync_check_period {
                let inner = Arc::downgrade(&self.inner);
                reflector = reflector.with_resync(
                    period,
                    Arc::new(move || inner.upgrade().is_some_and(|i| i.processor.should_resync())),
                );
            }
            reflector
        };
        let reflector_stats = reflector.stats();
        *self.inner.stats.lock() = Some(Arc::clone(&reflector_stats));
        // Freed memory is released after each pop and every second: the
        // queue may have drained before the Reflector counted the list or
        // the wait (see `Inner::release_reasons`).
        let mut release_tick = tokio::time::interval(Duration::from_secs(1));
        release_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // Declared before the guard, so dropped after it: either way the
        // Reflector is aborted when this future ends, however it ends.
        let mut reflector_task = AbortOnDrop(tokio::spawn(reflector.run(shutdown.clone())));
        // Ends the apply thread with `run`, however `run` ends.
        let stop = shutdown.child_token();
        let mut guard = RunGuard {
            inner: &self.inner,
            stop: stop.clone(),
            done: false,
        };
        let span = info_span!("informer", what = %self.inner.description);
        let mut apply = match ApplyThread::spawn(
            Arc::clone(&self.inner),
            stop.clone(),
            Arc::clone(&reflector_stats),
            span.clone(),
        ) {
            Ok(apply) => apply,
            Err(e) => {
                guard.done = true;
                self.inner.fifo.close();
                self.inner.stop();
                return Err(self.inner.fail(format!(
                    "cannot start the thread that applies the queue: {e}"
                )));
            }
        };
        let inner = &self.inner;
        let end = async {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break End::Shutdown,
                    ended = &mut reflector_task.0 => break End::Reflector(ended),
                    _ = apply.ended() => break End::Applied,
                    _ = release_tick.tick() => {
                        // The queue's lock is taken off the runtime's
                        // threads: the apply thread may hold it for a
                        // whole unit.
                        if inner.release_may_be_due(&reflector_stats) {
                            let (inner, stats) = (Arc::clone(inner), Arc::clone(&reflector_stats));
                            tokio::task::spawn_blocking(move || {
                                if inner.release_due(&stats) {
                                    release_freed_memory();
                                }
                            });
                        }
                    }
                }
            }
        }
        .instrument(span)
        .await;
        stop.cancel();
        // The unit in progress is finished first: nothing changes the cache
        // once `run` has returned.
        let apply_failure = apply.ended().await;
        self.inner.processor.flush();
        self.inner.fifo.close();
        let failure = match end {
            End::Reflector(Ok(())) if shutdown.is_cancelled() => apply_failure,
            End::Reflector(Ok(())) => Some(REFLECTOR_STOPPED.to_owned()),
            End::Reflector(Err(e)) => Some(reflector_death(e)),
            // The Reflector ends on the same token.
            End::Shutdown | End::Applied if apply_failure.is_none() && shutdown.is_cancelled() => {
                let _ = (&mut reflector_task.0).await;
                None
            }
            End::Shutdown | End::Applied => {
                reflector_task.0.abort();
                let _ = (&mut reflector_task.0).await;
                Some(apply_failure.unwrap_or_else(|| APPLY_STOPPED.to_owned()))
            }
        };
        guard.done = true;
        self.inner.stop();
        match failure {
            Some(reason) => Err(self.inner.fail(reason)),
            None => Ok(()),
        }
    }
}

/// Asks the allocator to return freed memory to the system: glibc keeps
/// most of what a decoded list freed (the objects once encoded into a
/// compact cache) until asked. Other allocators return it on their own.
/// It blocks: not on a runtime worker.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: malloc_trim takes no pointers and only releases free pages
    // of glibc's heaps; it is thread-safe and valid at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

const REFLECTOR_STOPPED: &str = "the reflector stopped before shutdown";
const APPLY_STOPPED: &str = "the apply thread stopped before shutdown";

/// Why `run` stopped waiting.
enum End {
    Shutdown,
    Reflector(Result<(), JoinError>),
    /// The apply thread ended (a panic, or the shutdown it shares).
    Applied,
}

fn reflector_death(e: JoinError) -> String {
    if e.is_panic() {
        format!(
            "the reflector panicked: {}",
            panic_message(e.into_panic().as_ref())
        )
    } else {
        "the reflector task was cancelled".to_owned()
    }
}

/// Marks the informer failed if `run` ends without finishing (its future
/// dropped, or unwinding), without waiting for the unit being applied.
struct RunGuard<'a, K> {
    inner: &'a Inner<K>,
    /// The apply thread's.
    stop: CancellationToken,
    done: bool,
}

impl<K> Drop for RunGuard<'_, K> {
    fn drop(&mut self) {
        if !self.done {
            self.stop.cancel();
            self.inner.fifo.close();
            self.inner
                .fail("run() was dropped or unwound before its shutdown token fired".to_owned());
            self.inner.stop_after_apply();
        }
    }
}

impl<K> Inner<K> {
    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.processor.stop_all();
        self.applied.notify_waiters();
    }

    /// Records the failure (the first one wins) and logs it.
    fn fail(&self, reason: String) -> InformerError {
        let e = InformerError::Failed {
            what: self.description.clone(),
            reason,
        };
        self.failed.store(true, Ordering::SeqCst);
        let mut failure = self.failure.lock();
        if failure.is_none() {
            error!(error = %e, "informer failed");
            *failure = Some(e.clone());
        } else {
            info!(error = %e, "informer failed again");
        }
        e
    }
}

impl<K: kube_client::Resource + Object + Clone> SharedIndexInformer<K> {
    /// A Lister over the cache; it tells the cache's resourceVersion when
    /// the informer can ([`last_store_sync_resource_version`](Self::last_store_sync_resource_version)).
    pub fn lister(&self) -> Lister<K> {
        Lister::from_informer(Arc::clone(&self.inner.indexer), self.inner.in_order())
    }
}

/// What a popped unit is, for a message.
fn unit_name<K>(unit: &Popped<'_, K>) -> String {
    match unit {
        Popped::Deltas { key, .. } => format!("the deltas of {key}"),
        Popped::ReplacedAll(all) => format!(
            "a list of {} objects at resourceVersion {}",
            all.len(),
            all.resource_version()
        ),
        Popped::SyncAll => "a resync".to_owned(),
        Popped::Bookmark(rv) => format!("a bookmark at resourceVersion {rv}"),
    }
}

impl<K> Inner<K> {
    /// What asks for freed memory to be returned, each as the count of it
    /// at the last release and the count now: lists applied (a compact
    /// cache, whose decoded list is garbage once encoded), and waits for
    /// the resource begun (a CRD deleted: its objects were deleted from
    /// the cache first, each freed, and glibc would keep the memory of all
    /// of them). Lists are counted after their replace, and waits after
    /// the watch that delivered the deletions ended: once the queue is
    /// empty, everything before them has been applied.
    fn release_reasons<'a>(
        &'a self,
        stats: &ReflectorStats,
    ) -> impl Iterator<Item = (&'a AtomicU64, u64)> {
        let listed = self.release_after_list.then(|| {
            (
                &self.released_at,
                stats.lists_completed.load(Ordering::SeqCst),
            )
        });
        let waited = (
            &self.released_waits,
            stats.not_served.load(Ordering::SeqCst),
        );
        listed.into_iter().chain([waited])
    }

    /// Whether a reason came since freed memory was last released
    /// ([`release_due`](Self::release_due) without the queue's lock).
    fn release_may_be_due(&self, stats: &ReflectorStats) -> bool {
        self.release_reasons(stats)
            .any(|(released, now)| now > released.load(Ordering::SeqCst))
    }

    /// Whether freed memory is to be returned to the system now: a reason
    /// came since it was last released (see
    /// [`release_reasons`](Self::release_reasons)) and nothing is queued.
    /// If so, counts each reason released.
    fn release_due(&self, stats: &ReflectorStats) -> bool {
        if !self.release_may_be_due(stats) || !self.fifo.is_empty() {
            return false;
        }
        // Every reason is counted released, not only the first found.
        self.release_reasons(stats)
            .fold(false, |due, (released, now)| {
                let then = released.load(Ordering::SeqCst);
                let claimed = now > then
                    && released
                        .compare_exchange(then, now, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok();
                due | claimed
            })
    }

    /// Whether the queue applies changes in watch order and relists at once.
    fn in_order(&self) -> bool {
        self.fifo.kind() == FifoKind::AtomicFifo
    }

    fn last_store_sync_resource_version(&self) -> Option<String> {
        if self.in_order() {
            self.indexer.last_store_sync_resource_version()
        } else {
            None
        }
    }
}

impl<K: Object> Inner<K> {
    /// Applies one popped unit to the cache and tells the handlers.
    fn handle_unit(&self, unit: Popped<'_, K>, is_in_initial_list: bool) {
        match unit {
            Popped::Deltas { key, deltas } => self.handle_deltas(key, deltas, is_in_initial_list),
            Popped::ReplacedAll(all) => self.handle_replaced_all(all, is_in_initial_list),
            Popped::SyncAll => self.handle_sync_all(),
            Popped::Bookmark(rv) => self.indexer.bookmark(rv),
        }
    }

    /// Applies a whole list, as client-go v0.37's `processReplacedAllInfo`:
    /// the cache is swapped for the list in one step (synced to its
    /// resourceVersion), then the handlers are told of the deletions it
    /// implies, then of each listed object in list order (an update when
    /// the key was cached, an add otherwise). A key the list kept (its
    /// object could not be read) keeps what the cache holds. What each key
    /// held is read from the swapped-out content one key at a time.
    fn handle_replaced_all(&self, all: &ReplacedAll<K>, is_in_initial_list: bool) {
        let listeners = self.processor.listeners.read();
        let listed: std::collections::HashSet<&str, foldhash::fast::RandomState> =
            all.objects().map(|(key, _)| key.as_ref()).collect();
        // Held at the listed version (a compact cache's): stays as stored.
        let held: std::collections::HashSet<&str, foldhash::fast::RandomState> = all
            .objects()
            .filter(|(_, obj)| obj.is_none())
            .map(|(key, _)| key.as_ref())
            .collect();
        let items: Vec<(Arc<str>, Arc<K>)> = all
            .objects()
            .filter_map(|(key, obj)| Some((Arc::clone(key), Arc::clone(obj?))))
            .collect();
        // A key kept (its listed object could not be read) or held stays
        // as stored (decoded only to index it again).
        let keep = |key: &str| held.contains(key) || (!listed.contains(key) && all.keeps(key));
        // Kept older than the list (or left absent): recorded before the
        // swap makes the list's version visible, so a reader that sees that
        // version and then asks `is_stale` is told (see `has_caught_up_to`).
        let kept_stale: std::collections::HashSet<Arc<str>, foldhash::fast::RandomState> =
            if all.keeps_all() {
                let keys = self.indexer.list_keys().into_iter().map(Arc::from);
                keys.chain(all.kept_keys().cloned())
                    .filter(|k| !listed.contains(k.as_ref()))
                    .collect()
            } else {
                let keys = all.kept_keys().filter(|k| !listed.contains(k.as_ref()));
                keys.cloned().collect()
            };
        if !kept_stale.is_empty() {
            self.stale.lock().keys.extend(kept_stale.iter().cloned());
        }
        let swapped = self
            .indexer
            .swap_by_key(items, &keep, all.resource_version());
        // Every other key is now as this list has it, or gone.
        self.stale.lock().keys.retain(|k| kept_stale.contains(k));
        for e in &swapped.unindexed {
            // Stored, and missing from this one index.
            self.index_failures.fetch_add(1, Ordering::Relaxed);
            error!(key = %e.key, index = %e.index, error = %e.source, "index function failed; the object is cached but left out of the index");
        }
        if listeners.is_empty() {
            return;
        }
        for key in swapped.keys() {
            if listed.contains(key.as_ref()) || all.keeps(key) {
                continue;
            }
            let Some(obj) = swapped.get(key) else {
                continue;
            };
            let tombstone = DeletedFinalStateUnknown {
                key: key.to_string(),
                obj,
            };
            Processor::distribute(
                &listeners,
                Notification::Delete(ObjectOrTombstone::Tombstone(tombstone)),
                false,
            );
        }
        // Only handlers due a resync hear of an unchanged object.
        let resync_due = Processor::resync_due(&listeners);
        for (key, obj) in all.objects() {
            let Some(obj) = obj else {
                if resync_due && let Some(obj) = self.indexer.get_by_key(key) {
                    let update = Notification::Update {
                        old: Arc::clone(&obj),
                        new: obj,
                    };
                    Processor::distribute(&listeners, update, true);
                }
                continue;
            };
            let obj = Arc::clone(obj);
            match swapped.get(key) {
                Some(old) => {
                    // A relist that brought back the same version is a resync.
                    let is_sync = old.resource_version() == obj.resource_version();
                    Processor::distribute(
                        &listeners,
                        Notification::Update { old, new: obj },
                        is_sync,
                    );
                }
                None => Processor::distribute(
                    &listeners,
                    Notification::Add {
                        obj,
                        initial: is_in_initial_list,
                    },
                    false,
                ),
            }
        }
    }

    /// A resync of everything cached, as client-go v0.37's `SyncAll`: an
    /// update from each object to itself, for the handlers due a resync.
    fn handle_sync_all(&self) {
        let listeners = self.processor.listeners.read();
        if !Processor::resync_due(&listeners) {
            return;
        }
        for obj in self.indexer.list() {
            Processor::distribute(
                &listeners,
                Notification::Update {
                    old: Arc::clone(&obj),
                    new: obj,
                },
                true,
            );
        }
    }

    /// Applies one key's deltas to the cache and tells the handlers, as
    /// client-go's `processDeltas`.
    fn handle_deltas(&self, key: &str, deltas: &Deltas<K>, is_in_initial_list: bool) {
        let listeners = self.processor.listeners.read();
        for delta in deltas {
            match delta.kind {
                DeltaType::Sync | DeltaType::Replaced | DeltaType::Added | DeltaType::Updated => {
                    // The queue and the Indexer share the key function.
                    let obj = Arc::clone(delta.object.object());
                    // One write both stores the object and says what it replaced.
                    let upserted = self.indexer.update_by_key(key, Arc::clone(&obj));
                    for e in &upserted.unindexed {
                        // Stored, and missing from this one index.
                        self.index_failures.fetch_add(1, Ordering::Relaxed);
                        error!(key = %e.key, index = %e.index, error = %e.source, "index function failed; the object is cached but left out of the index");
                    }
                    match upserted.previous {
                        Some(old) => {
                            let is_sync = match delta.kind {
                                DeltaType::Sync => true,
                                // A relist that brought back the same version is a resync.
                                DeltaType::Replaced => {
                                    old.resource_version() == obj.resource_version()
                                }
                                _ => false,
                            };
                            Processor::distribute(
                                &listeners,
                                Notification::Update { old, new: obj },
                                is_sync,
                            );
                        }
                        None => {
                            Processor::distribute(
                                &listeners,
                                Notification::Add {
                                    obj,
                                    initial: is_in_initial_list,
                                },
                                false,
                            );
                        }
                    }
                }
                DeltaType::Deleted => {
                    // A tombstone's state is the last known, not the delete's.
                    let version = match &delta.object {
                        ObjectOrTombstone::Object(obj) => obj.resource_version(),
                        ObjectOrTombstone::Tombstone(_) => None,
                    };
                    self.indexer.remove_by_key_at(key, version);
                    Processor::distribute(
                        &listeners,
                        Notification::Delete(delta.object.clone()),
                        false,
                    );
                }
            }
        }
        // After the store: a reader never sees the key fresh before it is.
        let mut stale = self.stale.lock();
        if !stale.keys.is_empty() {
            stale.keys.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ScriptedListerWatcher;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn freed_memory_is_released_once_per_wait_for_the_resource() {
        let informer: SharedIndexInformer<ConfigMap> =
            SharedIndexInformer::new(ScriptedListerWatcher::new(), InformerOptions::new());
        let stats = ReflectorStats::default();
        // Not a compact cache: a list is no reason.
        stats.lists_completed.fetch_add(1, Ordering::SeqCst);
        assert!(!informer.inner.release_due(&stats));
        // A wait for the resource begun (its CRD deleted): once.
        stats.not_served.fetch_add(1, Ordering::SeqCst);
        assert!(informer.inner.release_due(&stats));
        assert!(!informer.inner.release_due(&stats));
        stats.not_served.fetch_add(1, Ordering::SeqCst);
        assert!(informer.inner.release_due(&stats));
    }
}
