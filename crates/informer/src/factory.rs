//! SharedInformerFactory: one informer per type, kind, namespace and
//! selectors, however many callers ask for it.
//!
//! Informers are shared by (Rust type, API group/version/plural, scope):
//! two callers asking for `DynamicObject`s of the same `ApiResource` get one
//! informer and one watch; a typed informer and a dynamic one of the same
//! kind are two (their caches hold different types).
//!
//! An informer asked for with `informer*`, `metadata` or `dynamic*` lives
//! as long as the factory, as in client-go. One asked for with `share*`
//! is counted ([`InformerShare`]): it is stopped, dropped from the factory
//! and its cache emptied when the last share goes, and the next share
//! makes a fresh one, which lists again. client-go and controller-runtime
//! count no users (`RemoveInformer` stops an informer whoever still reads
//! it); a share is what lets a part that comes and goes (a controller of
//! a kind whose CRD may be deleted) free what it alone used.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Debug;
use std::ops::Deref;
use std::sync::{Arc, Weak};
use std::time::Duration;

use kinformer_fifo::FifoKind;
use kinformer_store::{Compact, Object, namespace_indexers};
use kube_client::core::{ApiResource, ClusterResourceScope, DynamicObject, PartialObjectMeta};
use kube_client::{Client, Resource};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::{
    ApiListerWatcher, GroupResource, HasSynced, InformerOptions, LatencySnapshot, Permissions,
    ReflectorStats, ShardScope, SharedIndexInformer, WireFormat, wait_for_cache_sync,
};

/// Which objects an informer of the factory watches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct InformerScope {
    /// One namespace, or all when `None`.
    pub namespace: Option<String>,
    /// A label selector.
    pub label_selector: Option<String>,
    /// A field selector.
    pub field_selector: Option<String>,
    /// A shard that may change while the informer runs (see
    /// [`ApiListerWatcher::shard_scope`]); scopes are told apart by
    /// identity, not by their shard.
    pub shard: Option<ShardScope>,
}

impl InformerScope {
    /// Every object of the kind, in every namespace.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only the objects of namespace `namespace`.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Only the objects that match the label selector `selector`.
    #[must_use]
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = Some(selector.into());
        self
    }

    /// Only the objects that match the field selector `selector`.
    #[must_use]
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.field_selector = Some(selector.into());
        self
    }

    /// Only the objects in `shard`'s current shard.
    #[must_use]
    pub fn shard(mut self, shard: ShardScope) -> Self {
        self.shard = Some(shard);
        self
    }
}

trait Startable: Send + Sync {
    fn start(&self, runtime: &Handle, shutdown: CancellationToken);
    fn synced(&self) -> bool;
    fn describe(&self) -> String;
    fn reflector_stats(&self) -> Option<Arc<ReflectorStats>>;
    fn queued(&self) -> usize;
    fn processing_latency(&self) -> LatencySnapshot;
    fn store_resource_version(&self) -> Option<String>;
    /// What it lists and watches, and in which namespace (`None`: all).
    fn reads(&self) -> (Option<GroupResource>, Option<String>);
    /// Stops it for good and empties its cache: its last share went.
    fn release(&self);
}

impl<K: Object + Clone> Startable for SharedIndexInformer<K> {
    fn start(&self, runtime: &Handle, shutdown: CancellationToken) {
        if self.is_started() {
            return;
        }
        let informer = self.clone();
        runtime.spawn(async move { informer.run(shutdown).await });
    }
    fn synced(&self) -> bool {
        self.has_synced()
    }
    fn describe(&self) -> String {
        SharedIndexInformer::describe(self).to_owned()
    }
    fn reflector_stats(&self) -> Option<Arc<ReflectorStats>> {
        SharedIndexInformer::reflector_stats(self)
    }
    fn queued(&self) -> usize {
        SharedIndexInformer::queued(self)
    }
    fn processing_latency(&self) -> LatencySnapshot {
        SharedIndexInformer::processing_latency(self)
    }
    fn store_resource_version(&self) -> Option<String> {
        self.last_store_sync_resource_version()
    }
    fn reads(&self) -> (Option<GroupResource>, Option<String>) {
        (self.resource(), self.namespace().map(str::to_owned))
    }
    fn release(&self) {
        self.stop();
        self.clear_cache();
    }
}

/// The Reflector counters of a factory's informers, read when asked (a
/// metrics collector holds one and reads it at every scrape): from
/// [`SharedInformerFactory::stats`].
#[derive(Clone)]
pub struct FactoryStats(Arc<Mutex<HashMap<InformerKey, Entry>>>);

impl Debug for FactoryStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FactoryStats").finish_non_exhaustive()
    }
}

impl FactoryStats {
    /// Each informer of the factory that has started, by what it lists
    /// (`pods in all namespaces`), with its Reflector's counters; sorted.
    pub fn reflectors(&self) -> Vec<(String, Arc<ReflectorStats>)> {
        let mut out: Vec<_> = self
            .0
            .lock()
            .values()
            .filter_map(|e| Some((e.startable.describe(), e.startable.reflector_stats()?)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The metrics of each informer of a named factory
    /// ([`SharedInformerFactory::name`]) that reports them (the first made
    /// for its group, version and resource), as client-go's informer
    /// metrics provider gives them; sorted by resource. Empty for a factory
    /// without a name, as client-go's informers without an `InformerName`.
    pub fn informers(&self) -> Vec<InformerMetrics> {
        // Read with the factory unlocked: a queue may be locked while it
        // applies a unit, and nobody should wait on the factory meanwhile.
        let named: Vec<(MetricsId, Arc<dyn Startable>)> = self
            .0
            .lock()
            .values()
            .filter_map(|e| Some((e.metrics.clone()?, Arc::clone(&e.startable))))
            .collect();
        let mut out: Vec<InformerMetrics> = named
            .into_iter()
            .map(|(id, informer)| InformerMetrics {
                name: id.name,
                group: id.group,
                version: id.version,
                resource: id.resource,
                queued: informer.queued(),
                processing_latency: informer.processing_latency(),
                store_resource_version: informer.store_resource_version(),
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.group, &a.version, &a.resource).cmp(&(&b.group, &b.version, &b.resource))
        });
        out
    }
}

/// One informer's metrics, under client-go's names (component-base's
/// `informer_queued_items`, `informer_processing_latency_seconds` and
/// `informer_store_resource_version`, labelled `name`, `group`, `version`
/// and `resource`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InformerMetrics {
    /// The factory's name.
    pub name: String,
    /// The API group ("" for the core group).
    pub group: String,
    /// The API version.
    pub version: String,
    /// The resource (plural).
    pub resource: String,
    /// Units waiting in its queue ([`SharedIndexInformer::queued`]).
    pub queued: usize,
    /// How long it took to apply each unit.
    pub processing_latency: LatencySnapshot,
    /// What its cache is synced to
    /// ([`SharedIndexInformer::last_store_sync_resource_version`]).
    pub store_resource_version: Option<String>,
}

/// The identity an informer reports its metrics under.
#[derive(Clone)]
struct MetricsId {
    name: String,
    group: String,
    version: String,
    resource: String,
}

struct Entry {
    any: Box<dyn Any + Send + Sync>,
    startable: Arc<dyn Startable>,
    /// Set for the one informer per group, version and resource of a named
    /// factory that reports metrics.
    metrics: Option<MetricsId>,
    /// Asked for other than by a share: it lives as long as the factory.
    pinned: bool,
    /// What its live shares hold (dead when none is left).
    shares: Weak<Shares>,
    /// The generation of `shares`: the token of an older generation, dropped
    /// late, releases nothing.
    generation: u64,
}

type Informers = Arc<Mutex<HashMap<InformerKey, Entry>>>;

/// What every share of one informer holds: when the last one drops, the
/// informer is released, unless it is pinned or shared again meanwhile.
struct Shares {
    informers: Weak<Mutex<HashMap<InformerKey, Entry>>>,
    key: InformerKey,
    generation: u64,
}

impl Drop for Shares {
    fn drop(&mut self) {
        let Some(informers) = self.informers.upgrade() else {
            return;
        };
        let released = {
            let mut informers = informers.lock();
            match informers.get(&self.key) {
                Some(e) if !e.pinned && e.generation == self.generation => {
                    informers.remove(&self.key)
                }
                _ => None,
            }
        };
        // Outside the factory's lock: emptying a large cache takes a while.
        if let Some(entry) = released {
            tracing::debug!(informer = %entry.startable.describe(), "the last share of the informer went; stopped and emptied");
            entry.startable.release();
        }
    }
}

/// A counted share of one of a factory's informers
/// ([`SharedInformerFactory::share`]): the informer runs for as long as a
/// share of it lives (or the factory itself holds it, when it was also
/// asked for with [`informer`](SharedInformerFactory::informer)). When the
/// last share is dropped, the informer is stopped, dropped from the
/// factory and its cache emptied, so its memory is freed even while a
/// Lister of it is still held; the next share lists afresh.
///
/// It dereferences to the informer. A clone is one more share. A clone of
/// the informer taken out of it (`(*share).clone()`) is not: it sees the
/// informer stop with the last share.
pub struct InformerShare<K> {
    informer: SharedIndexInformer<K>,
    _shares: Arc<Shares>,
}

impl<K> Clone for InformerShare<K> {
    fn clone(&self) -> Self {
        Self {
            informer: self.informer.clone(),
            _shares: Arc::clone(&self._shares),
        }
    }
}

impl<K> Deref for InformerShare<K> {
    type Target = SharedIndexInformer<K>;

    fn deref(&self) -> &SharedIndexInformer<K> {
        &self.informer
    }
}

impl<K> Debug for InformerShare<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InformerShare")
            .field("informer", &self.informer)
            .field("shares", &Arc::strong_count(&self._shares))
            .finish()
    }
}

/// What makes two informers the same: the Rust type, the kind (its URL path:
/// API group, version and plural, from the dynamic type) and the scope.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct InformerKey {
    type_id: TypeId,
    /// The kind's path (group, version, plural, namespace).
    url_path: String,
    scope: InformerScope,
}

/// Hands out shared informers: client-go's `SharedInformerFactory`.
///
/// Asking twice for the same type with the same scope returns the same
/// informer; [`start`](Self::start) runs every informer made so far that is
/// not running yet, and [`wait_for_cache_sync`](Self::wait_for_cache_sync)
/// waits for all of them. Informers carry the namespace index.
pub struct SharedInformerFactory {
    client: Client,
    default_namespace: Option<String>,
    default_resync: Option<Duration>,
    drop_managed_fields: bool,
    wire_format: WireFormat,
    fifo: FifoKind,
    /// The name its informers report metrics under (client-go's
    /// `InformerName`); none: no metrics.
    name: Option<String>,
    /// Per type: the `Compact<K>` its informers keep their cache with.
    compact: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
    informers: Informers,
}

impl Debug for SharedInformerFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedInformerFactory")
            .field("namespace", &self.default_namespace)
            .field("informers", &self.informers.lock().len())
            .finish()
    }
}

impl SharedInformerFactory {
    /// A factory whose informers watch all namespaces.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            default_namespace: None,
            default_resync: None,
            drop_managed_fields: true,
            wire_format: WireFormat::default(),
            fifo: FifoKind::default(),
            name: None,
            compact: HashMap::new(),
            informers: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A handle on the Reflector counters of this factory's informers, made
    /// now or later ([`FactoryStats::reflectors`]); the Manager exports
    /// them as metrics.
    pub fn stats(&self) -> FactoryStats {
        FactoryStats(Arc::clone(&self.informers))
    }

    /// The RBAC rules its informers made so far need: list and watch of
    /// each one's resource, in its namespace, or cluster-wide for one over
    /// all namespaces or of a cluster-scoped resource. Render them with
    /// [`Permissions::manifests`]. (`list` is there for a server that
    /// refuses the streaming list; on one that serves it, `watch` alone
    /// lists.)
    pub fn permissions(&self) -> Permissions {
        let mut permissions = Permissions::new();
        for entry in self.informers.lock().values() {
            if let (Some(read), namespace) = entry.startable.reads() {
                permissions.allow_reads(namespace.as_deref(), &read);
            }
        }
        permissions
    }

    /// Informers of this factory watch only `namespace` (unless a scope says otherwise).
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.default_namespace = Some(namespace.into());
        self
    }

    /// Default resync period of the informers' handlers.
    #[must_use]
    pub fn default_resync(mut self, period: Duration) -> Self {
        self.default_resync = Some(period);
        self
    }

    /// The name this factory's informers report their metrics under
    /// ([`FactoryStats::informers`]), as client-go's `WithInformerName`
    /// (kube-controller-manager's is `kube-controller-manager`): the first
    /// informer made for each group, version and resource reports them (a
    /// second, of another scope, would repeat its labels).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The queue of this factory's informers ([`InformerOptions::fifo`]).
    #[must_use]
    pub fn fifo(mut self, kind: FifoKind) -> Self {
        self.fifo = kind;
        self
    }

    /// Informers of this factory keep `metadata.managedFields`, which by
    /// default they drop before decoding (see
    /// [`ApiListerWatcher::keep_managed_fields`]): for a controller that
    /// reads field ownership. A deliberate difference from client-go, whose
    /// informers keep them unless a transform drops them: they are often
    /// half of what an object costs to decode and to cache.
    #[must_use]
    pub fn keep_managed_fields(mut self) -> Self {
        self.drop_managed_fields = false;
        self
    }

    /// The factory's informers of `K` keep a compact cache
    /// ([`InformerOptions::compact`]): objects encoded, decoded on read.
    ///
    /// ```no_run
    /// # fn demo(client: kube_client::Client) {
    /// use k8s_openapi::api::core::v1::Pod;
    /// use kinformer_informer::{Compact, SharedInformerFactory};
    ///
    /// let factory = SharedInformerFactory::new(client)
    ///     .compact::<Pod>(Compact::json().decoded_cache(1000));
    /// let pods = factory.informer::<Pod>();
    /// # }
    /// ```
    #[must_use]
    pub fn compact<K: 'static>(mut self, compact: Compact<K>) -> Self {
        self.compact.insert(TypeId::of::<K>(), Box::new(compact));
        self
    }

    /// How the factory's informers receive objects (see [`WireFormat`]).
    #[must_use]
    pub fn wire_format(mut self, format: WireFormat) -> Self {
        self.wire_format = format;
        self
    }

    /// The shared informer for `K` in the factory's namespace (in all, for
    /// a cluster-scoped `K` such as `Node`).
    pub fn informer<K>(&self) -> SharedIndexInformer<K>
    where
        K: Resource + Object + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
        K::Scope: 'static,
    {
        self.informer_with(&K::DynamicType::default(), self.default_scope::<K>())
    }

    /// The shared informer for `K` in `scope`.
    pub fn informer_for<K>(&self, scope: InformerScope) -> SharedIndexInformer<K>
    where
        K: Resource + Object + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
    {
        self.informer_with(&K::DynamicType::default(), scope)
    }

    /// The shared metadata-only informer for `K` in the factory's namespace:
    /// its cache holds `PartialObjectMeta<K>` (the server sends no spec or
    /// status), with the same Lister, indexes and handlers as any other.
    pub fn metadata<K>(&self) -> SharedIndexInformer<PartialObjectMeta<K>>
    where
        K: Resource + Clone + Debug + Send + Sync + 'static,
        K::DynamicType: Default,
        K::Scope: 'static,
    {
        self.informer_with(&K::DynamicType::default(), self.default_scope::<K>())
    }

    /// The shared informer for `DynamicObject`s of the kind `resource`
    /// names, in the factory's namespace. For a cluster-scoped kind use
    /// [`dynamic_for`](Self::dynamic_for) with a scope without namespace.
    pub fn dynamic(&self, resource: &ApiResource) -> SharedIndexInformer<DynamicObject> {
        self.dynamic_for(resource, self.default_scope::<DynamicObject>())
    }

    /// The shared informer for `DynamicObject`s of `resource` in `scope`.
    pub fn dynamic_for(
        &self,
        resource: &ApiResource,
        scope: InformerScope,
    ) -> SharedIndexInformer<DynamicObject> {
        self.informer_with(resource, scope)
    }

    /// The namespace the factory's informers watch by default (`None`:
    /// all).
    pub fn namespace_of(&self) -> Option<&str> {
        self.default_namespace.as_deref()
    }

    /// The namespace the factory's informer of `K` watches by default: the
    /// factory's ([`namespace_of`](Self::namespace_of)), or none for a
    /// cluster-scoped `K`.
    pub fn namespace_for<K: Resource>(&self) -> Option<&str>
    where
        K::Scope: 'static,
    {
        self.namespace_of().filter(|_| !is_cluster_scoped::<K>())
    }

    /// The factory's namespace, or none for a cluster-scoped `K`.
    fn default_scope<K: Resource>(&self) -> InformerScope
    where
        K::Scope: 'static,
    {
        InformerScope {
            namespace: self.namespace_for::<K>().map(str::to_owned),
            ..InformerScope::default()
        }
    }

    /// The shared informer for `K` of the kind `dyntype` names, in `scope`.
    pub fn informer_with<K>(
        &self,
        dyntype: &K::DynamicType,
        scope: InformerScope,
    ) -> SharedIndexInformer<K>
    where
        K: Resource + Object + Clone + DeserializeOwned + Debug,
    {
        let key = Self::key::<K>(dyntype, scope);
        let mut informers = self.informers.lock();
        let informer = self.entry(&mut informers, dyntype, &key);
        if let Some(entry) = informers.get_mut(&key) {
            entry.pinned = true;
        }
        informer
    }

    /// A counted share of the informer for `K` in the factory's namespace
    /// (in all, for a cluster-scoped `K`): see [`InformerShare`].
    ///
    /// ```no_run
    /// # async fn demo(client: kinformer_informer::kube::Client) {
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kinformer_informer::{CancellationToken, SharedInformerFactory};
    ///
    /// let factory = SharedInformerFactory::new(client);
    /// let configmaps = factory.share::<ConfigMap>();
    /// factory.start(&CancellationToken::new());
    /// // ... read configmaps.lister() ...
    /// drop(configmaps); // the last share: stopped, its cache emptied
    /// # }
    /// ```
    pub fn share<K>(&self) -> InformerShare<K>
    where
        K: Resource + Object + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
        K::Scope: 'static,
    {
        self.share_with(&K::DynamicType::default(), self.default_scope::<K>())
    }

    /// A counted share of the informer for `K` of the kind `dyntype` names
    /// (a `DynamicObject`'s `ApiResource`), in `scope`: see
    /// [`InformerShare`].
    pub fn share_with<K>(&self, dyntype: &K::DynamicType, scope: InformerScope) -> InformerShare<K>
    where
        K: Resource + Object + Clone + DeserializeOwned + Debug,
    {
        let key = Self::key::<K>(dyntype, scope);
        let mut informers = self.informers.lock();
        let informer = self.entry(&mut informers, dyntype, &key);
        let entry = informers
            .get_mut(&key)
            .expect("the entry was made under this lock");
        let shares = match entry.shares.upgrade() {
            Some(shares) => shares,
            None => {
                entry.generation += 1;
                let shares = Arc::new(Shares {
                    informers: Arc::downgrade(&self.informers),
                    key,
                    generation: entry.generation,
                });
                entry.shares = Arc::downgrade(&shares);
                shares
            }
        };
        InformerShare {
            informer,
            _shares: shares,
        }
    }

    fn key<K: Resource + 'static>(dyntype: &K::DynamicType, scope: InformerScope) -> InformerKey {
        InformerKey {
            type_id: TypeId::of::<K>(),
            url_path: K::url_path(dyntype, scope.namespace.as_deref()),
            scope,
        }
    }

    /// The informer under `key`, made (unpinned, unshared) if there is none.
    // A scope's shard is told apart by identity (see `InformerScope`): its
    // interior mutability does not change the key's hash.
    #[allow(clippy::mutable_key_type)]
    fn entry<K>(
        &self,
        informers: &mut HashMap<InformerKey, Entry>,
        dyntype: &K::DynamicType,
        key: &InformerKey,
    ) -> SharedIndexInformer<K>
    where
        K: Resource + Object + Clone + DeserializeOwned + Debug,
    {
        if let Some(entry) = informers.get(key)
            && let Some(informer) = entry.any.downcast_ref::<SharedIndexInformer<K>>()
        {
            return informer.clone();
        }
        let scope = &key.scope;
        let mut lw = ApiListerWatcher::<K>::new_with(
            self.client.clone(),
            scope.namespace.as_deref(),
            dyntype,
        );
        if let Some(l) = &scope.label_selector {
            lw = lw.labels(l);
        }
        if let Some(f) = &scope.field_selector {
            lw = lw.fields(f);
        }
        if let Some(shard) = &scope.shard {
            lw = lw.shard_scope(shard.clone());
        }
        if !self.drop_managed_fields {
            lw = lw.keep_managed_fields();
        }
        lw = lw.wire_format(self.wire_format);
        let mut options = InformerOptions::new()
            .indexers(namespace_indexers())
            .fifo(self.fifo);
        if let Some(p) = self.default_resync {
            options = options.default_resync(p);
        }
        if let Some(compact) = self
            .compact
            .get(&TypeId::of::<K>())
            .and_then(|c| c.downcast_ref::<Compact<K>>())
        {
            options = options.compact(compact.clone());
        }
        let informer = SharedIndexInformer::new(lw, options);
        let metrics = self.name.as_ref().and_then(|name| {
            let id = MetricsId {
                name: name.clone(),
                group: K::group(dyntype).into_owned(),
                version: K::version(dyntype).into_owned(),
                resource: K::plural(dyntype).into_owned(),
            };
            let taken = informers
                .values()
                .filter_map(|e| e.metrics.as_ref())
                .any(|m| {
                    (&m.group, &m.version, &m.resource) == (&id.group, &id.version, &id.resource)
                });
            (!taken).then_some(id)
        });
        informers.insert(
            key.clone(),
            Entry {
                any: Box::new(informer.clone()),
                startable: Arc::new(informer.clone()),
                metrics,
                pinned: false,
                shares: Weak::new(),
                generation: 0,
            },
        );
        informer
    }

    /// Starts every informer made so far that is not running, on the
    /// current Tokio runtime; they stop when `shutdown` fires.
    ///
    /// # Panics
    /// Outside a Tokio runtime; [`start_on`](Self::start_on) is given one.
    pub fn start(&self, shutdown: &CancellationToken) {
        self.start_on(&Handle::current(), shutdown);
    }

    /// Starts every informer made so far that is not running, each
    /// [`run`](SharedIndexInformer::run) a task of `runtime` (each applies
    /// what it lists and watches on a thread of its own); they stop when
    /// `shutdown` fires.
    ///
    /// ```no_run
    /// # fn demo(client: kinformer_informer::kube::Client) {
    /// use k8s_openapi::api::core::v1::Pod;
    /// use kinformer_informer::{CancellationToken, SharedInformerFactory};
    ///
    /// let runtime = tokio::runtime::Runtime::new().unwrap();
    /// let factory = SharedInformerFactory::new(client);
    /// let pods = factory.informer::<Pod>();
    /// factory.start_on(runtime.handle(), &CancellationToken::new());
    /// # }
    /// ```
    pub fn start_on(&self, runtime: &Handle, shutdown: &CancellationToken) {
        for entry in self.informers.lock().values() {
            entry.startable.start(runtime, shutdown.clone());
        }
    }

    /// Waits until every informer made so far has synced; returns each one's
    /// description and whether it synced before `shutdown` fired.
    pub async fn wait_for_cache_sync(&self, shutdown: &CancellationToken) -> Vec<(String, bool)> {
        let all: Vec<Arc<dyn Startable>> = self
            .informers
            .lock()
            .values()
            .map(|e| Arc::clone(&e.startable))
            .collect();
        let mut out = Vec::new();
        for informer in all {
            let synced = {
                let i = Arc::clone(&informer);
                let check = move || i.synced();
                let checks: [&dyn HasSynced; 1] = [&check];
                wait_for_cache_sync(shutdown, &checks).await
            };
            out.push((informer.describe(), synced));
        }
        out
    }
}

/// Whether `K` is cluster-scoped (its `Resource::Scope` is
/// `ClusterResourceScope`), as opposed to namespaced or dynamic.
pub fn is_cluster_scoped<K: Resource>() -> bool
where
    K::Scope: 'static,
{
    TypeId::of::<K::Scope>() == TypeId::of::<ClusterResourceScope>()
}
