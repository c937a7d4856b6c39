//! The controller builder: a primary resource, the resources it owns or
//! watches, event filters and options, all informers from one factory.

use std::fmt::Debug;
use std::sync::Arc;

use kinformer_informer::{
    InformerScope, SharedIndexInformer, SharedInformerFactory, is_cluster_scoped,
};
use kinformer_store::{Object, ObjectKey};
use kube_client::Resource;
use serde::de::DeserializeOwned;

use crate::options::EventFilter;
use crate::rbac::Permissions;
use crate::runtime::Share;
use crate::{
    Action, Controller, ControllerError, ControllerOptions, Event, FnReconciler, LeaderElector,
    Lookup, Metrics, ReconcileError, Reconciler, Ring,
};

type Wiring<K> = Box<dyn FnOnce(Controller<K>) -> Result<Controller<K>, ControllerError>>;

/// Builds a [`Controller`] for the primary resource `K`; made by
/// [`Controller::builder`] and finished by [`reconcile`](Self::reconcile)
/// or [`reconciler`](Self::reconciler).
///
/// Every informer comes from the factory, so a Manager's controllers share
/// one watch per kind, and every one of them has synced before any worker
/// starts.
#[must_use = "a builder does nothing until `reconcile` builds its controller"]
pub struct ControllerBuilder<'f, K> {
    name: String,
    factory: &'f SharedInformerFactory,
    /// The primary informer, made when first needed: the factory's
    /// informer of `K`, or its sharded one after `sharded`; and its share.
    informer: Option<(SharedIndexInformer<K>, Share)>,
    /// The shares of the informers of `owns`.
    shares: Vec<Share>,
    options: ControllerOptions<K>,
    filters: Vec<EventFilter<K>>,
    wiring: Vec<Wiring<K>>,
    ring: Option<Arc<Ring>>,
    /// The Manager's metrics and election, when the Manager made this
    /// builder: kept whatever [`options`](ControllerBuilder::options) says.
    managed: Option<(Arc<Metrics>, Option<Arc<LeaderElector>>)>,
    /// What the reconciler writes (see [`writes`](Self::writes)).
    writes: Permissions,
}

impl<K> std::fmt::Debug for ControllerBuilder<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerBuilder")
            .field("name", &self.name)
            .field("options", &self.options)
            .field("filters", &self.filters.len())
            .field("wiring", &self.wiring.len())
            .field("sharded", &self.ring.is_some())
            .field("writes", &self.writes)
            .finish_non_exhaustive()
    }
}

impl<K> Controller<K>
where
    K: Resource + Object + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
    K::Scope: 'static,
{
    /// A builder for a controller named `name` over the factory's informer of `K`.
    pub fn builder<'f>(name: &str, factory: &'f SharedInformerFactory) -> ControllerBuilder<'f, K> {
        ControllerBuilder {
            name: name.to_owned(),
            factory,
            informer: None,
            shares: Vec::new(),
            options: ControllerOptions::new(),
            filters: Vec::new(),
            wiring: Vec::new(),
            ring: None,
            managed: None,
            writes: Permissions::new(),
        }
    }
}

impl<K> ControllerBuilder<'_, K>
where
    K: Resource + Object + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
    K::Scope: 'static,
{
    /// Reconcile the owner of every `C` whose controller ownerReference
    /// names a `K` (see [`Controller::owns`]). The controller's
    /// permissions then let it set those ownerReferences where the server
    /// enforces them: `update` of `K`'s `finalizers` (for
    /// `blockOwnerDeletion`) and `delete` of `C` (to adopt one).
    ///
    /// ```no_run
    /// # async fn demo(manager: &kinformer_controllers::Manager) -> Result<(), kinformer_controllers::ControllerError> {
    /// # use std::sync::Arc;
    /// # use kinformer_controllers::Action;
    /// use k8s_openapi::api::apps::v1::Deployment;
    /// use k8s_openapi::api::core::v1::Service;
    /// // A Deployment's reconcile runs again when the Service it owns changes.
    /// let controller = manager
    ///     .controller::<Deployment>("web")
    ///     .owns::<Service>()
    ///     .reconcile(Arc::new(()), |_deployment, _ctx| async { Ok(Action::Done) })?;
    /// # Ok(()) }
    /// ```
    pub fn owns<C>(mut self) -> Self
    where
        C: Resource + Object + Clone + DeserializeOwned + Debug,
        C::DynamicType: Default,
        C::Scope: 'static,
    {
        let share = self.factory.share::<C>();
        let informer = (*share).clone();
        self.shares.push(Box::new(share));
        self.wiring.push(Box::new(move |c| c.owns(informer)));
        self
    }

    /// Reconcile the keys `mapper` returns for every event of `informer`
    /// (see [`Controller::watches`]); take `informer` from the same factory.
    ///
    /// ```no_run
    /// # async fn demo(manager: &kinformer_controllers::Manager) -> Result<(), kinformer_controllers::ControllerError> {
    /// # use std::sync::Arc;
    /// # use kinformer_controllers::Action;
    /// use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    /// use kinformer_controllers::ObjectKey;
    /// // Each ConfigMap's Secret of the same name is reconciled when it changes.
    /// let configmaps = manager.factory().informer::<ConfigMap>();
    /// let controller = manager
    ///     .controller::<Secret>("secrets")
    ///     .watches(configmaps, |cm: &ConfigMap| {
    ///         ObjectKey::of(cm).into_iter().collect()
    ///     })
    ///     .reconcile(Arc::new(()), |_secret, _ctx| async { Ok(Action::Done) })?;
    /// # Ok(()) }
    /// ```
    pub fn watches<C: Object + Clone>(
        mut self,
        informer: SharedIndexInformer<C>,
        mapper: impl Fn(&C) -> Vec<ObjectKey> + Send + Sync + 'static,
    ) -> Self {
        self.wiring
            .push(Box::new(move |c| c.watches(informer, mapper)));
        self
    }

    /// Enqueue only the events of `K` that pass `filter` (see
    /// [`predicate`](crate::predicate)); several filters must all pass.
    ///
    /// ```no_run
    /// # async fn demo(manager: &kinformer_controllers::Manager) -> Result<(), kinformer_controllers::ControllerError> {
    /// # use std::sync::Arc;
    /// # use kinformer_controllers::Action;
    /// use k8s_openapi::api::apps::v1::Deployment;
    /// use kinformer_controllers::predicate;
    /// // Status-only updates do not reconcile.
    /// let controller = manager
    ///     .controller::<Deployment>("web")
    ///     .with_event_filter(predicate::generation_changed)
    ///     .reconcile(Arc::new(()), |_deployment, _ctx| async { Ok(Action::Done) })?;
    /// # Ok(()) }
    /// ```
    pub fn with_event_filter(
        mut self,
        filter: impl Fn(Event<'_, K>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.filters.push(Arc::new(filter));
        self
    }

    /// Shards the controller over `ring` (see [`ControllerOptions::ring`]):
    /// its primary informer becomes the factory's informer of `K` in the
    /// ring's scope, which lists and watches only the slots this replica
    /// holds. Owned and watched kinds stay whole.
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     manager: &kinformer_controllers::Manager,
    /// #     ring: std::sync::Arc<kinformer_controllers::Ring>,
    /// # ) -> Result<(), kinformer_controllers::ControllerError> {
    /// # use std::sync::Arc;
    /// # use kinformer_controllers::Action;
    /// use k8s_openapi::api::core::v1::Pod;
    /// // This replica lists, watches and reconciles only the slots it holds.
    /// let controller = manager
    ///     .controller::<Pod>("pods")
    ///     .sharded(ring)
    ///     .reconcile(Arc::new(()), |_pod, _ctx| async { Ok(Action::Done) })?;
    /// # Ok(()) }
    /// ```
    pub fn sharded(mut self, ring: Arc<Ring>) -> Self {
        let dt = K::DynamicType::default();
        let mut scope = InformerScope::all().shard(ring.scope());
        if let Some(ns) = self.factory.namespace_for::<K>() {
            scope = scope.namespace(ns);
        }
        let share = self.factory.share_with::<K>(&dt, scope);
        self.informer = Some(((*share).clone(), Box::new(share)));
        self.ring = Some(ring);
        self
    }

    /// Declares that the reconciler writes `C` with `verbs` (RBAC verbs:
    /// `create`, `update`, `patch`, `delete`, ...), in the factory's
    /// namespace (every namespace if it has none; cluster-scoped kinds
    /// cluster-wide), for [`Manager::permissions`](crate::Manager::permissions):
    /// the rules a Manager derives cover what it reads and runs, and what
    /// reconcile code does with the client only the code knows. The
    /// [`finalizer`](crate::finalizer) helper patches its object;
    /// [`apply_status`](crate::apply_status) patches the status
    /// subresource ([`writes_status`](Self::writes_status)). A server-side
    /// apply ([`apply`](crate::apply)) of an object that may not exist yet
    /// needs `create` as well as `patch` (the server creates it). Reads
    /// through the client (a `get` the cache does not serve) are declared
    /// here too.
    pub fn writes<C>(mut self, verbs: &[&str]) -> Self
    where
        C: Resource,
        C::DynamicType: Default,
        C::Scope: 'static,
    {
        self.allow::<C>("", verbs);
        self
    }

    /// Declares that the reconciler patches the `status` subresource of
    /// `C` (as [`apply_status`](crate::apply_status) does); see
    /// [`writes`](Self::writes).
    pub fn writes_status<C>(mut self) -> Self
    where
        C: Resource,
        C::DynamicType: Default,
        C::Scope: 'static,
    {
        self.allow::<C>("/status", &["patch"]);
        self
    }

    fn allow<C>(&mut self, subresource: &str, verbs: &[&str])
    where
        C: Resource,
        C::DynamicType: Default,
        C::Scope: 'static,
    {
        let dt = C::DynamicType::default();
        let namespace = self.factory.namespace_for::<C>();
        let resource = format!("{}{subresource}", C::plural(&dt));
        self.writes
            .allow(namespace, &C::group(&dt), &resource, verbs);
    }

    /// The primary informer, for a Lister the reconciler reads: the
    /// factory's informer of `K`, or the sharded one after
    /// [`sharded`](Self::sharded) (call `sharded` first). The controller
    /// holds a share of it ([`SharedInformerFactory::share`]), as of each
    /// informer of [`owns`](Self::owns): once no controller or other
    /// share holds it, it is stopped and its cache freed (a Manager lets
    /// go of a controller's shares when the controller is removed or the
    /// Manager has stopped). The informer returned is not a share: a
    /// Lister of it read by something that outlives this controller (a
    /// webhook handler, another controller) should come from a share of
    /// its own ([`SharedInformerFactory::share`], kept as long as it
    /// reads), or from [`SharedInformerFactory::informer`], which the
    /// factory keeps for good.
    ///
    /// ```no_run
    /// # async fn demo(manager: &kinformer_controllers::Manager) -> Result<(), kinformer_controllers::ControllerError> {
    /// # use std::sync::Arc;
    /// # use kinformer_controllers::Action;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// let mut builder = manager.controller::<ConfigMap>("configmaps");
    /// let lister = builder.informer().lister();
    /// let controller = builder.reconcile(Arc::new(lister), |_cm, lister| async move {
    ///     let _settings = lister.get("default/settings");
    ///     Ok(Action::Done)
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn informer(&mut self) -> SharedIndexInformer<K> {
        let factory = self.factory;
        let (informer, _) = self.informer.get_or_insert_with(|| {
            let share = factory.share::<K>();
            ((*share).clone(), Box::new(share))
        });
        informer.clone()
    }

    /// How the controller runs (workers, retries, timeouts, leader
    /// election, metrics...). On a builder from
    /// [`Manager::controller`](crate::Manager::controller) the Manager's
    /// leader election and metrics stay, whatever `options` says: they
    /// are the Manager's to set, and a controller of a Manager never runs
    /// outside its election or unseen by its metrics.
    ///
    /// ```no_run
    /// # async fn demo(client: kube_client::Client) -> Result<(), kinformer_controllers::ControllerError> {
    /// use std::sync::Arc;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kinformer_controllers::{Action, ControllerOptions, Manager, ManagerOptions};
    ///
    /// let mut manager = Manager::new(client, ManagerOptions::new())?;
    /// let controller = manager
    ///     .controller::<ConfigMap>("configmaps")
    ///     .options(ControllerOptions::new().workers(4).max_retries(10))
    ///     .reconcile(Arc::new(()), |_cm, _ctx| async { Ok(Action::Done) })?;
    /// manager.add(controller);
    /// # Ok(()) }
    /// ```
    pub fn options(mut self, mut options: ControllerOptions<K>) -> Self {
        if let Some((metrics, elector)) = &self.managed {
            options.metrics = Some(Arc::clone(metrics));
            options.leader_election = elector.clone();
        }
        self.options = options;
        self
    }

    /// Marks the builder as the Manager's: its metrics and election are
    /// set now and kept by [`options`](Self::options).
    pub(crate) fn managed(
        mut self,
        metrics: Arc<Metrics>,
        elector: Option<Arc<LeaderElector>>,
    ) -> Self {
        self.managed = Some((metrics, elector));
        let options = std::mem::take(&mut self.options);
        self.options(options)
    }

    /// Finishes the controller with an async reconcile that receives the
    /// object read from the cache at reconcile time (or [`Lookup::Gone`])
    /// and `context`, kube-runtime's `Arc<Ctx>`.
    ///
    /// ```no_run
    /// # async fn demo(manager: &kinformer_controllers::Manager) -> Result<(), kinformer_controllers::ControllerError> {
    /// # use std::sync::Arc;
    /// # use kinformer_controllers::Action;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kinformer_controllers::Lookup;
    /// let controller = manager
    ///     .controller::<ConfigMap>("configmaps")
    ///     .reconcile(Arc::new("context"), |cm, ctx| async move {
    ///         match cm {
    ///             Lookup::Found(cm) => println!("{ctx}: {:?}", cm.metadata.name),
    ///             Lookup::Gone { key } => println!("{ctx}: {key} is gone"),
    ///         }
    ///         Ok(Action::Done)
    ///     })?;
    /// # Ok(()) }
    /// ```
    pub fn reconcile<C, F, Fut>(
        self,
        context: Arc<C>,
        f: F,
    ) -> Result<Controller<K>, ControllerError>
    where
        C: Send + Sync + 'static,
        F: Fn(Lookup<K>, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
    {
        let mut this = self;
        let cache = this.informer().indexer();
        let f = move |lookup| f(lookup, Arc::clone(&context));
        this.reconciler(FnReconciler { cache, f })
    }

    /// Finishes the controller with a [`Reconciler`] that receives
    /// [`Request`](crate::Request)s: a key and why it was queued.
    ///
    /// ```no_run
    /// # async fn demo(manager: &kinformer_controllers::Manager) -> Result<(), kinformer_controllers::ControllerError> {
    /// # use std::sync::Arc;
    /// # use kinformer_controllers::Action;
    /// use futures::future::BoxFuture;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kinformer_controllers::{ReconcileError, Reconciler, Request};
    /// struct Log;
    /// impl Reconciler for Log {
    ///     fn reconcile<'a>(
    ///         &'a self,
    ///         request: &'a Request,
    ///     ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
    ///         Box::pin(async move {
    ///             println!("{} ({})", request.key, request.reason);
    ///             Ok(Action::Done)
    ///         })
    ///     }
    /// }
    /// let controller = manager.controller::<ConfigMap>("configmaps").reconciler(Log)?;
    /// # Ok(()) }
    /// ```
    pub fn reconciler(
        mut self,
        reconciler: impl Reconciler,
    ) -> Result<Controller<K>, ControllerError> {
        if !self.filters.is_empty() {
            let mut filters = std::mem::take(&mut self.filters);
            filters.extend(self.options.event_filter.take());
            self.options.event_filter = Some(Arc::new(move |e: Event<'_, K>| {
                filters.iter().all(|f| f(e))
            }));
        }
        if let Some(ring) = self.ring.take() {
            self.options.ring = Some(ring);
        }
        let informer = self.informer();
        let mut controller = Controller::new(&self.name, informer, reconciler, self.options)?;
        controller.writes = self.writes;
        controller.cluster_scoped = is_cluster_scoped::<K>();
        if let Some((_, share)) = self.informer.take() {
            controller.hold(share);
        }
        for share in self.shares {
            controller.hold(share);
        }
        for wire in self.wiring {
            controller = wire(controller)?;
        }
        Ok(controller)
    }
}

#[cfg(test)]
mod tests {
    //! The builder's wiring, deterministic: an in-process API, paused time,
    //! and the queue read without workers (what each event queued, and why).

    use std::collections::BTreeMap;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kinformer_informer::testing::FakeApiServer;
    use serde_json::{Value, json};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::reason::Reason;
    use crate::{LeaderElectionConfig, Manager, ManagerOptions};

    fn object(name: &str, owners: Value) -> Value {
        json!({"metadata": {
            "namespace": "ns",
            "name": name,
            "resourceVersion": "1",
            "ownerReferences": owners,
        }})
    }

    fn owner(api_version: &str, kind: &str, name: &str, controller: bool) -> Value {
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "uid": format!("uid-{name}"),
            "controller": controller,
        })
    }

    async fn done(_: Lookup<ConfigMap>, _: Arc<()>) -> Result<Action, ReconcileError> {
        Ok(Action::Done)
    }

    /// Whether `informer` has synced and every change it received has
    /// been handled by every handler (handlers run on threads of their own).
    fn settled<K: Object + Clone>(informer: SharedIndexInformer<K>) -> Box<dyn Fn() -> bool> {
        Box::new(move || {
            informer.has_synced() && informer.queued() == 0 && informer.pending_notifications() == 0
        })
    }

    /// Starts the factory's informers, waits until every one of them has
    /// `settled`, and takes each queued key with why it was queued.
    async fn queued(
        factory: &SharedInformerFactory,
        informers: &[Box<dyn Fn() -> bool>],
        controller: &Controller<ConfigMap>,
    ) -> BTreeMap<ObjectKey, Reason> {
        let shutdown = CancellationToken::new();
        factory.start(&shutdown);
        // The handlers run on threads of their own: give them real time,
        // and give up after a minute of it.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !informers.iter().all(|settled| settled()) {
            assert!(
                std::time::Instant::now() < deadline,
                "the informers never settled"
            );
            std::thread::sleep(Duration::from_millis(1));
            tokio::task::yield_now().await;
        }
        let mut keys = BTreeMap::new();
        while !controller.queue().is_empty() {
            let key = controller.queue().get().await.expect("a key");
            let reason = controller.reasons().take(&key);
            keys.insert(key.item().clone(), reason);
            drop(key);
        }
        shutdown.cancel();
        keys
    }

    fn related(kind: &str, key: &str) -> Reason {
        Reason::Related {
            kind: kind.into(),
            key: key.parse().unwrap(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn options_under_a_manager_keep_its_metrics_and_leader_election() {
        let api = FakeApiServer::new();
        let election = LeaderElectionConfig::new("wiring")
            .namespace("ns")
            .identity("me");
        let manager = Manager::new(
            api.client(),
            ManagerOptions::new().leader_election(election),
        )
        .unwrap();
        let controller = manager
            .controller::<ConfigMap>("tuned")
            .options(ControllerOptions::new().workers(4).max_retries(2))
            .reconcile(Arc::new(()), done)
            .unwrap();

        let options = controller.options();
        assert_eq!(
            (options.workers, options.max_retries),
            (4, Some(2)),
            "tuned"
        );
        let metrics = options.metrics.as_ref().expect("the Manager's metrics");
        assert!(Arc::ptr_eq(metrics, manager.metrics()));
        let elector = options
            .leader_election
            .as_ref()
            .expect("the Manager's elector");
        assert!(Arc::ptr_eq(elector, manager.elector().unwrap()));
    }

    #[tokio::test(start_paused = true)]
    async fn owns_queues_the_owner_named_by_each_controller_reference_of_the_primary_kind() {
        let api = FakeApiServer::new();
        // No ConfigMap at all: every key queued comes from a Secret.
        api.insert(
            "secrets",
            object("web-tls", json!([owner("v1", "ConfigMap", "web", true)])),
        )
        .insert(
            "secrets",
            object("orphan", json!([owner("v1", "ConfigMap", "gone", true)])),
        )
        .insert(
            "secrets",
            object("shared", json!([owner("v1", "ConfigMap", "ref", false)])),
        )
        .insert(
            "secrets",
            object(
                "deployed",
                json!([owner("apps/v1", "Deployment", "dep", true)]),
            ),
        )
        .insert(
            "secrets",
            object(
                "custom",
                json!([owner("example.com/v1", "ConfigMap", "cr", true)]),
            ),
        );
        let factory = SharedInformerFactory::new(api.client());
        let controller = Controller::<ConfigMap>::builder("owner", &factory)
            .owns::<Secret>()
            .reconcile(Arc::new(()), done)
            .unwrap();

        let informers = [
            settled(factory.informer::<ConfigMap>()),
            settled(factory.informer::<Secret>()),
        ];
        let keys = queued(&factory, &informers, &controller).await;
        assert_eq!(
            keys.keys().collect::<Vec<_>>(),
            ["ns/gone", "ns/web"],
            "only controller references to a core/v1 ConfigMap: {keys:?}"
        );
        assert_eq!(keys["ns/gone"], related("Secret", "ns/orphan"));
        assert_eq!(keys["ns/web"], related("Secret", "ns/web-tls"));
    }

    #[tokio::test(start_paused = true)]
    async fn watches_queues_what_its_mapper_returns_for_each_object() {
        let api = FakeApiServer::new();
        api.insert("secrets", object("a", json!([])))
            .insert("secrets", object("b", json!([])));
        let factory = SharedInformerFactory::new(api.client());
        let secrets = factory.informer::<Secret>();
        let informers = [
            settled(factory.informer::<ConfigMap>()),
            settled(secrets.clone()),
        ];
        let controller = Controller::<ConfigMap>::builder("mapped", &factory)
            .watches(secrets, |s: &Secret| {
                let name = s.metadata.name.clone().unwrap_or_default();
                let key = |name: &str| ObjectKey::namespaced("ns", name).unwrap();
                vec![key(&format!("for-{name}")), key("all")]
            })
            .reconcile(Arc::new(()), done)
            .unwrap();

        let keys = queued(&factory, &informers, &controller).await;
        assert_eq!(
            keys.keys().collect::<Vec<_>>(),
            ["ns/all", "ns/for-a", "ns/for-b"]
        );
        assert_eq!(keys["ns/for-b"], related("Secret", "ns/b"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_debounced_controller_queues_each_events_key_only_after_the_debounce() {
        let api = FakeApiServer::new();
        api.insert("configmaps", object("web", json!([]))).insert(
            "secrets",
            object("web-tls", json!([owner("v1", "ConfigMap", "web", true)])),
        );
        let factory = SharedInformerFactory::new(api.client());
        let debounce = Duration::from_secs(10);
        let controller = Controller::<ConfigMap>::builder("debounced", &factory)
            .owns::<Secret>()
            .options(ControllerOptions::new().debounce(debounce))
            .reconcile(Arc::new(()), done)
            .unwrap();
        let informers = [
            settled(factory.informer::<ConfigMap>()),
            settled(factory.informer::<Secret>()),
        ];
        let shutdown = CancellationToken::new();
        factory.start(&shutdown);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !informers.iter().all(|settled| settled()) {
            assert!(std::time::Instant::now() < deadline, "never settled");
            std::thread::sleep(Duration::from_millis(1));
            tokio::task::yield_now().await;
        }
        let queue = controller.queue();
        assert_eq!(
            (queue.len(), queue.waiting_len()),
            (0, 1),
            "both events wait as one key"
        );
        tokio::time::advance(debounce - Duration::from_millis(1)).await;
        assert_eq!(queue.len(), 0, "queued before the debounce passed");
        tokio::time::advance(Duration::from_millis(1)).await;
        let key = tokio::time::timeout(Duration::from_secs(1), queue.get())
            .await
            .expect("queued once the debounce passed")
            .unwrap();
        assert_eq!(*key, "ns/web");
        let reason = controller.reasons().take(&key);
        // Whichever informer delivered first: the two run apart.
        assert!(
            matches!(reason, Reason::Added | Reason::Related { .. }),
            "the first event's reason: {reason:?}"
        );
        drop(key);
        assert_eq!((queue.len(), queue.waiting_len()), (0, 0));
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn every_event_filter_and_the_options_filter_must_pass() {
        let api = FakeApiServer::new();
        for name in ["a1", "a2", "b1", "a-bad1"] {
            api.insert("configmaps", object(name, json!([])));
        }
        let factory = SharedInformerFactory::new(api.client());
        let name = |e: &Event<'_, ConfigMap>| match e {
            Event::Add(o) => o.metadata.name.clone().unwrap_or_default(),
            _ => String::new(),
        };
        let options = ControllerOptions::new()
            .event_filter(move |e: Event<'_, ConfigMap>| !name(&e).contains("bad"));
        let controller = Controller::<ConfigMap>::builder("filtered", &factory)
            .with_event_filter(move |e| name(&e).starts_with('a'))
            .with_event_filter(move |e| name(&e).ends_with('1'))
            .options(options)
            .reconcile(Arc::new(()), done)
            .unwrap();

        let informers = [settled(factory.informer::<ConfigMap>())];
        let keys = queued(&factory, &informers, &controller).await;
        assert_eq!(keys.keys().collect::<Vec<_>>(), ["ns/a1"]);
        assert_eq!(keys["ns/a1"], Reason::Added);
    }
}
