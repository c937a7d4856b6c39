//! The Manager: several controllers on one informer factory, one leader
//! election, one admin server and one shutdown order, as
//! controller-runtime's `manager.Manager`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use kinformer_informer::{GroupResource, SharedInformerFactory};
use kinformer_store::Object;
use kinformer_webhook::{CertFiles, Observer, Webhooks};
use kube_client::{Client, Resource};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::leader::lease_lost;
use crate::rbac::{self, Permissions};
use crate::read_your_writes::{TrackerCollector, WriteTracker};
use crate::reconcile::chain;
use crate::runtime::{INFORMER_STOP_WAIT, InformerTasks, Managed, Share};
use crate::{
    CheckFailed, Controller, ControllerBuilder, ControllerError, ControllerOptions, EventRecorder,
    LeaderElectionConfig, LeaderElector, Metrics, Runnable,
};

/// How long a stopping Manager waits for its Event recorders' last writes.
pub const EVENT_FLUSH_WAIT: Duration = Duration::from_secs(5);

/// How a [`Manager`] runs. Defaults: no admin server, no leader election,
/// every cached object reconciled again every 10 hours
/// ([`DEFAULT_SYNC_PERIOD`]).
///
/// kubebuilder's scaffold serves metrics on `:8080` and probes on `:8081`;
/// [`ManagerOptions::kubebuilder`] sets those addresses.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ManagerOptions {
    /// Where `/metrics` is served (`None`: nowhere).
    pub metrics_bind_address: Option<SocketAddr>,
    /// Where `/healthz`, `/livez` and `/readyz` are served (`None`: nowhere).
    /// The same address as the metrics serves all four on one listener.
    pub health_probe_bind_address: Option<SocketAddr>,
    /// One election for every controller of the Manager: only its leader
    /// reconciles. A controller with an elector of its own in its options
    /// runs that one instead.
    pub leader_election: Option<LeaderElectionConfig>,
    /// How often [`Manager::new`]'s informers resync, so every controller
    /// reconciles every cached object again (at low priority, reason
    /// `resync`); see [`sync_period`](Self::sync_period). `None`: never.
    pub sync_period: Option<Duration>,
    /// Where the webhooks given to [`Manager::webhooks`] are served:
    /// kubebuilder's `:9443` by default. See
    /// [`webhook_server`](Self::webhook_server).
    pub webhook_bind_address: SocketAddr,
    /// The directory of the webhooks' serving certificate (`tls.crt`,
    /// `tls.key`): `/tmp/k8s-webhook-server/serving-certs` by default.
    pub webhook_cert_dir: PathBuf,
    /// What a setter was given that is not an address, as
    /// `option: why`: [`Manager::new`] refuses the options with it.
    invalid: Vec<String>,
}

/// A listen address in kubebuilder's syntax, as its `--metrics-bind-address`
/// takes it: `"0"` for none (serve nothing), `":8080"` for every IPv4
/// interface (`0.0.0.0`; Go's `:8080` listens on IPv6 too: give
/// `"[::]:8080"` for that),
/// `"localhost:8080"`, `"127.0.0.1:8080"` or `"[::1]:8080"`; or a
/// [`SocketAddr`]. What the options' address setters take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindAddress(Option<SocketAddr>);

impl BindAddress {
    /// No address: nothing is served (kubebuilder's `"0"`).
    pub const NONE: BindAddress = BindAddress(None);

    /// The address to listen on; `None` for [`NONE`](Self::NONE).
    pub fn socket_addr(self) -> Option<SocketAddr> {
        self.0
    }
}

impl From<SocketAddr> for BindAddress {
    fn from(addr: SocketAddr) -> Self {
        Self(Some(addr))
    }
}

impl std::str::FromStr for BindAddress {
    type Err = InvalidBindAddress;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let invalid = |why: String| InvalidBindAddress {
            value: value.to_owned(),
            why,
        };
        if value == "0" {
            return Ok(Self::NONE);
        }
        let (host, port) = value
            .rsplit_once(':')
            .ok_or_else(|| invalid("it is not HOST:PORT, :PORT or 0".into()))?;
        let port: u16 = port
            .parse()
            .map_err(|_| invalid(format!("{port:?} is not a port number")))?;
        let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) => v6.parse().ok().filter(std::net::IpAddr::is_ipv6),
            None if host.is_empty() => Some(std::net::IpAddr::from([0, 0, 0, 0])),
            None if host == "localhost" => Some(std::net::IpAddr::from([127, 0, 0, 1])),
            None => host.parse().ok().filter(std::net::IpAddr::is_ipv4),
        };
        let ip = ip.ok_or_else(|| {
            invalid(format!(
                "{host:?} is not an IP address or localhost (IPv6 goes in brackets)"
            ))
        })?;
        Ok(Self(Some(SocketAddr::new(ip, port))))
    }
}

/// A string that is not a [`BindAddress`]: the value and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a listen address: {why}")]
pub struct InvalidBindAddress {
    /// What was given.
    pub value: String,
    /// What is wrong with it.
    pub why: String,
}

/// What the options' address setters take: a [`SocketAddr`], a
/// [`BindAddress`], or a string in kubebuilder's syntax (checked when
/// the Manager is made).
pub trait ToBindAddress {
    /// The address, or why the value is not one.
    fn to_bind_address(self) -> Result<BindAddress, InvalidBindAddress>;
}

impl ToBindAddress for BindAddress {
    fn to_bind_address(self) -> Result<BindAddress, InvalidBindAddress> {
        Ok(self)
    }
}

impl ToBindAddress for SocketAddr {
    fn to_bind_address(self) -> Result<BindAddress, InvalidBindAddress> {
        Ok(self.into())
    }
}

impl ToBindAddress for &str {
    fn to_bind_address(self) -> Result<BindAddress, InvalidBindAddress> {
        self.parse()
    }
}

impl ToBindAddress for String {
    fn to_bind_address(self) -> Result<BindAddress, InvalidBindAddress> {
        self.parse()
    }
}

impl ToBindAddress for &String {
    fn to_bind_address(self) -> Result<BindAddress, InvalidBindAddress> {
        self.parse()
    }
}

/// The name [`Manager::new`]'s informers report client-go's informer
/// metrics under (the `name` label of `informer_queued_items` and the like;
/// kube-controller-manager's are `kube-controller-manager`).
pub const INFORMER_NAME: &str = "kinformer-manager";

/// The webhook server's port by default: kubebuilder's.
pub const DEFAULT_WEBHOOK_PORT: u16 = 9443;

/// Where the webhook server's certificate is read from by default:
/// controller-runtime's `CertDir` (cert-manager's Secret is mounted there
/// in kubebuilder's manifests).
pub const DEFAULT_WEBHOOK_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";

/// controller-runtime's `SyncPeriod` default: 10 hours.
pub const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(10 * 60 * 60);

impl Default for ManagerOptions {
    fn default() -> Self {
        Self {
            metrics_bind_address: None,
            health_probe_bind_address: None,
            leader_election: None,
            sync_period: Some(DEFAULT_SYNC_PERIOD),
            webhook_bind_address: SocketAddr::from(([0, 0, 0, 0], DEFAULT_WEBHOOK_PORT)),
            webhook_cert_dir: PathBuf::from(DEFAULT_WEBHOOK_CERT_DIR),
            invalid: Vec::new(),
        }
    }
}

impl ManagerOptions {
    /// No admin server, no leader election.
    pub fn new() -> Self {
        Self::default()
    }

    /// Metrics on `0.0.0.0:8080`, probes on `0.0.0.0:8081`, as kubebuilder scaffolds them.
    pub fn kubebuilder() -> Self {
        Self {
            metrics_bind_address: Some(SocketAddr::from(([0, 0, 0, 0], 8080))),
            health_probe_bind_address: Some(SocketAddr::from(([0, 0, 0, 0], 8081))),
            ..Self::default()
        }
    }

    /// Serve `/metrics` on `addr`: a [`SocketAddr`], or kubebuilder's
    /// syntax (`":8080"`, `"127.0.0.1:8080"`, `"0"` for nowhere; see
    /// [`BindAddress`]). A string that is not an address makes
    /// [`Manager::new`] fail, naming it.
    #[must_use]
    pub fn metrics_bind_address(mut self, addr: impl ToBindAddress) -> Self {
        if let Some(addr) = self.address("metrics_bind_address", addr) {
            self.metrics_bind_address = addr.socket_addr();
        }
        self
    }

    /// Serve the probes on `addr` (as
    /// [`metrics_bind_address`](Self::metrics_bind_address) takes it).
    #[must_use]
    pub fn health_probe_bind_address(mut self, addr: impl ToBindAddress) -> Self {
        if let Some(addr) = self.address("health_probe_bind_address", addr) {
            self.health_probe_bind_address = addr.socket_addr();
        }
        self
    }

    /// `addr`, or none with why kept for [`Manager::new`] (in place of
    /// what an earlier call of the same setter left).
    fn address(&mut self, option: &str, addr: impl ToBindAddress) -> Option<BindAddress> {
        let prefix = format!("{option}: ");
        self.invalid.retain(|e| !e.starts_with(&prefix));
        addr.to_bind_address()
            .map_err(|e| self.invalid.push(format!("{prefix}{e}")))
            .ok()
    }

    /// Reconcile only while leading this election.
    #[must_use]
    pub fn leader_election(mut self, config: LeaderElectionConfig) -> Self {
        self.leader_election = Some(config);
        self
    }

    /// Resync [`Manager::new`]'s informers every `period` (at least 1 s),
    /// so that every controller reconciles every cached object again: the
    /// safety net for what a reconcile depends on but nothing watches, and
    /// for keys given up after a [`max_retries`](ControllerOptions::max_retries)
    /// limit or a terminal error. Default 10 hours, as controller-runtime's
    /// `SyncPeriod`. Resynced keys are queued at low priority, behind live
    /// changes. A Manager on a factory of your own
    /// ([`with_factory`](Manager::with_factory)) resyncs as that factory
    /// says ([`SharedInformerFactory::default_resync`]).
    #[must_use]
    pub fn sync_period(mut self, period: Duration) -> Self {
        self.sync_period = Some(period);
        self
    }

    /// No periodic resync: a key is reconciled only when an object it
    /// follows changes, on a retry or on a requeue it asked for.
    #[must_use]
    pub fn without_sync_period(mut self) -> Self {
        self.sync_period = None;
        self
    }

    /// Serves the Manager's webhooks on `addr` with the certificate in
    /// `cert_dir` (`tls.crt` and `tls.key`, the keys of a
    /// `kubernetes.io/tls` Secret), reloaded when they change. `addr` as
    /// [`metrics_bind_address`](Self::metrics_bind_address) takes it
    /// (`":9443"`, kubebuilder's), but not `"0"`: the server needs one.
    #[must_use]
    pub fn webhook_server(
        mut self,
        addr: impl ToBindAddress,
        cert_dir: impl Into<PathBuf>,
    ) -> Self {
        match self
            .address("webhook_server", addr)
            .map(BindAddress::socket_addr)
        {
            Some(Some(addr)) => self.webhook_bind_address = addr,
            Some(None) => self
                .invalid
                .push("webhook_server: \"0\": the webhook server needs an address".into()),
            None => {}
        }
        self.webhook_cert_dir = cert_dir.into();
        self
    }
}

/// A controller the Manager runs, whatever its resource type.
trait ManagedController: Send + Sync {
    fn name(&self) -> &str;
    fn uses_elector(&self, elector: &Arc<LeaderElector>) -> bool;
    fn has_own_elector(&self) -> bool;
    fn uses_metrics(&self, metrics: &Arc<Metrics>) -> bool;
    fn permissions(&self) -> Permissions;
    fn primary_scope(&self) -> (Option<String>, bool);
    fn informers_check(
        &self,
        needs_us: Arc<dyn Fn(&GroupResource) -> bool + Send + Sync>,
    ) -> crate::Check;
    fn take_shares(&mut self) -> Vec<Share>;
    fn run(
        self: Box<Self>,
        shutdown: CancellationToken,
        managed: Managed,
    ) -> BoxFuture<'static, Result<(), ControllerError>>;
}

impl<K: Object + Clone> ManagedController for Controller<K> {
    fn name(&self) -> &str {
        Controller::name(self)
    }
    fn uses_elector(&self, elector: &Arc<LeaderElector>) -> bool {
        self.options()
            .leader_election
            .as_ref()
            .is_some_and(|e| Arc::ptr_eq(e, elector))
    }
    fn has_own_elector(&self) -> bool {
        self.options().leader_election.is_some()
    }
    fn uses_metrics(&self, metrics: &Arc<Metrics>) -> bool {
        self.options()
            .metrics
            .as_ref()
            .is_some_and(|m| Arc::ptr_eq(m, metrics))
    }
    fn permissions(&self) -> Permissions {
        Controller::permissions(self)
    }
    fn primary_scope(&self) -> (Option<String>, bool) {
        Controller::primary_scope(self)
    }
    fn informers_check(
        &self,
        needs_us: Arc<dyn Fn(&GroupResource) -> bool + Send + Sync>,
    ) -> crate::Check {
        Controller::informers_check(self, needs_us)
    }
    fn take_shares(&mut self) -> Vec<Share> {
        Controller::take_shares(self)
    }
    fn run(
        self: Box<Self>,
        shutdown: CancellationToken,
        managed: Managed,
    ) -> BoxFuture<'static, Result<(), ControllerError>> {
        Box::pin(self.run_managed(shutdown, Some(managed)))
    }
}

/// What a [`ManagerHandle`] asks of the running Manager.
enum Command {
    Add(
        Box<dyn ManagedController>,
        oneshot::Sender<Result<(), ControllerError>>,
    ),
    Remove(String, oneshot::Sender<Result<(), ControllerError>>),
}

/// Adds and removes controllers while their [`Manager`] runs (made by
/// [`Manager::handle`]; clones ask the same Manager). What is asked before
/// [`run`](Manager::run) is done once it has started.
#[derive(Clone)]
pub struct ManagerHandle {
    commands: mpsc::UnboundedSender<Command>,
}

impl std::fmt::Debug for ManagerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagerHandle")
            .field("manager_running", &!self.commands.is_closed())
            .finish()
    }
}

impl ManagerHandle {
    /// Starts `controller` in the running Manager, as those given to
    /// [`Manager::add`] start: made with [`Manager::controller`], it
    /// follows the Manager's election and reports to its metrics. Returns
    /// once it is started (its caches may not have synced yet: its
    /// `informers of NAME` readiness check says when, and `/readyz` fails
    /// until then, as for a controller given to [`Manager::add`]; the
    /// Manager's runnables do not wait for it). Refused, with an
    /// error naming why, if a controller of that name runs, if it was made
    /// with other options than the Manager's, or if the Manager has
    /// stopped.
    pub async fn add<K: Object + Clone>(
        &self,
        controller: Controller<K>,
    ) -> Result<(), ControllerError> {
        self.ask(|reply| Command::Add(Box::new(controller), reply))
            .await
    }

    /// Removes the controller named `name` from the running Manager: it
    /// stops taking keys, its in-flight reconciles finish (within its
    /// drain timeout), its event handlers are removed, and the informers
    /// it alone read are stopped and their caches freed. The others run
    /// on. Returns how it ended, or an error if no controller of that
    /// name runs.
    pub async fn remove(&self, name: &str) -> Result<(), ControllerError> {
        let name = name.to_owned();
        self.ask(|reply| Command::Remove(name, reply)).await
    }

    async fn ask(
        &self,
        command: impl FnOnce(oneshot::Sender<Result<(), ControllerError>>) -> Command,
    ) -> Result<(), ControllerError> {
        let stopped =
            || ControllerError::InvalidOptions("the Manager is not running any more".to_owned());
        let (reply, answer) = oneshot::channel();
        self.commands.send(command(reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Runs several controllers on one [`SharedInformerFactory`] (one watch
/// per kind however many controllers read it), one leader election, one
/// admin server with the metrics of every controller and the user's own
/// metrics and checks, the user's own [`Runnable`]s, and one start and
/// shutdown order.
///
/// It starts, in this order: the admin server (`/metrics`, `/healthz`,
/// `/readyz`), the webhook server ([`webhooks`](Self::webhooks)), the
/// election, the controllers (each starts the informers it reads, and
/// waits for their caches and, if elected, for the lease), then the
/// runnables ([`add_runnable`](Self::add_runnable); those that need the
/// lease once this replica leads). Controllers can be added and removed
/// while it runs, through a [`handle`](Self::handle).
///
/// How it stops, when the token given to [`run`](Self::run) fires (or any
/// controller or runnable fails, which stops the others): every controller
/// stops taking keys and drains its queue while the lease is still
/// renewed, and the runnables are stopped; once all have ended the lease is
/// released (left to expire if a reconcile would not end), then the
/// informers stop, the Events not yet written are written, and the webhook
/// server and the admin server stop. `/healthz` and `/readyz` answer 503
/// from the start of the stop.
///
/// `/readyz` answers 200 once every controller's caches have synced
/// (checks `caches` and `informers of NAME`, which also fails while the
/// server refuses a list or watch: 401, 403), the webhook server serves
/// if there is one (check `webhook`, controller-runtime's
/// `StartedChecker`), and every ready check passes, with one exception:
/// the caches of custom resources whose conversion this Manager's
/// [`webhooks`](Self::webhooks) serve are not waited for. The API server
/// reaches a webhook through a Service, which routes only to ready pods,
/// and listing such a resource in a version other than its storage
/// version needs that conversion: waiting for those caches, the Manager
/// would never become ready. Its controllers still reconcile only from
/// synced caches; a webhook handler reading such a cache may see it
/// before it has synced.
///
/// Nor are the caches of resources the server does not serve (a custom
/// resource whose CRD is not installed, or no longer serves the version):
/// such an informer waits for its resource without a request loop, with
/// one log line when it starts waiting and one when the resource is
/// served, and `kinformer_informer_waiting_for_resource` at 1 on
/// `/metrics`, naming it; the controllers that read it start their workers
/// once it has synced, within seconds of the CRD being established. The
/// process stays ready meanwhile, where controller-runtime fails and
/// restarts it: readiness routes traffic, and an operator whose optional
/// CRD is missing still serves its webhooks (unready, it would make the
/// API server refuse every write they cover) and its other controllers.
/// Alert on the gauge for a CRD that must be there.
pub struct Manager {
    /// The client as given: the Manager's own requests (election, Events).
    client: Client,
    /// The client handed out: writes remembered for read-your-writes.
    tracked: Client,
    tracker: Arc<WriteTracker>,
    factory: SharedInformerFactory,
    metrics: Arc<Metrics>,
    elector: Option<Arc<LeaderElector>>,
    options: ManagerOptions,
    controllers: Vec<Box<dyn ManagedController>>,
    /// The user's own, started after the controllers (in a lock only to
    /// keep the Manager `Sync`: a runnable need only be `Send`).
    runnables: parking_lot::Mutex<Vec<Box<dyn Runnable>>>,
    /// Who this process is: the election's identity, or a default one.
    identity: String,
    /// The Event recorders handed out, flushed when the Manager stops.
    recorders: parking_lot::Mutex<Vec<Arc<EventRecorder>>>,
    /// Served on every replica, leader or not, from the start of
    /// [`run`](Self::run) to its end.
    webhooks: Option<Webhooks>,
    /// What [`ManagerHandle`]s ask, read while it runs.
    commands: mpsc::UnboundedSender<Command>,
    asked: Option<mpsc::UnboundedReceiver<Command>>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("options", &self.options)
            .field(
                "controllers",
                &self
                    .controllers
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Manager {
    /// A Manager whose informers watch every namespace, resync every
    /// [`ManagerOptions::sync_period`] (10 hours by default), drop
    /// `metadata.managedFields` before decoding (see
    /// [`SharedInformerFactory::keep_managed_fields`] and
    /// [`with_factory`](Self::with_factory) to keep them) and report
    /// client-go's informer metrics under the name [`INFORMER_NAME`].
    pub fn new(client: Client, options: ManagerOptions) -> Result<Self, ControllerError> {
        let mut factory = SharedInformerFactory::new(client.clone()).name(INFORMER_NAME);
        if let Some(period) = options.sync_period {
            factory = factory.default_resync(period);
        }
        Self::with_factory(factory, client, options)
    }

    /// A Manager on `factory` (one namespace, managedFields kept, a
    /// default resync: as the factory is configured).
    pub fn with_factory(
        factory: SharedInformerFactory,
        client: Client,
        options: ManagerOptions,
    ) -> Result<Self, ControllerError> {
        if !options.invalid.is_empty() {
            return Err(ControllerError::InvalidOptions(options.invalid.join("; ")));
        }
        let metrics = Metrics::new();
        let elector = match &options.leader_election {
            Some(config) => {
                config.validate()?;
                let denied = metrics.leader_election_denied(&config.lease_name);
                let elector = LeaderElector::new(client.clone(), config.clone());
                Some(Arc::new(elector.count_denied_in(denied)))
            }
            None => None,
        };
        metrics.add_informers(factory.stats());
        let identity = elector
            .as_ref()
            .map_or_else(LeaderElectionConfig::default_identity, |e| {
                e.identity().to_owned()
            });
        let tracker = Arc::new(WriteTracker::default());
        metrics.register_collector(TrackerCollector(Arc::clone(&tracker)));
        let (commands, asked) = mpsc::unbounded_channel();
        Ok(Self {
            commands,
            asked: Some(asked),
            tracked: tracker.client(client.clone()),
            tracker,
            client,
            factory,
            metrics,
            elector,
            options,
            controllers: Vec::new(),
            runnables: parking_lot::Mutex::default(),
            identity,
            recorders: parking_lot::Mutex::new(Vec::new()),
            webhooks: None,
        })
    }

    /// This process's identity: the leader election's, or
    /// [`LeaderElectionConfig::default_identity`] without one.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// An Event recorder reporting as `controller` (for example
    /// `example.com/website`) from this process ([`identity`](Self::identity)).
    /// The Manager owns it: what its series have not written yet is written
    /// when the Manager stops, without the user's help, and the occurrences
    /// it had to drop are counted on `/metrics`
    /// (`kinformer_event_dropped_occurrences_total`).
    ///
    /// ```no_run
    /// # async fn demo(client: kube_client::Client) -> Result<(), kinformer_controllers::ControllerError> {
    /// use kinformer_controllers::{Manager, ManagerOptions};
    /// let manager = Manager::new(client, ManagerOptions::new())?;
    /// let events = manager.event_recorder("example.com/website");
    /// # Ok(()) }
    /// ```
    pub fn event_recorder(&self, controller: &str) -> Arc<EventRecorder> {
        let recorder = Arc::new(EventRecorder::new(
            self.client.clone(),
            controller,
            &self.identity,
        ));
        recorder.export_metrics(&self.metrics);
        self.recorders.lock().push(Arc::clone(&recorder));
        recorder
    }

    /// The client every controller shares: make every write of the
    /// reconciles with it. What it writes is remembered, so that no
    /// controller of this Manager reconciles from a cache that has not yet
    /// seen it (see [`ControllerOptions::read_your_writes`]); a write
    /// through another client is not.
    pub fn client(&self) -> Client {
        self.tracked.clone()
    }

    /// The shared informer factory: take every informer from it.
    pub fn factory(&self) -> &SharedInformerFactory {
        &self.factory
    }

    /// The registry served on `/metrics`: register your own metrics and
    /// health checks here.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The Manager's elector, if it has an election.
    pub fn elector(&self) -> Option<&Arc<LeaderElector>> {
        self.elector.as_ref()
    }

    /// Options for a controller of this Manager: its metrics and its
    /// leader election filled in.
    pub fn controller_options<K>(&self) -> ControllerOptions<K> {
        let mut options = ControllerOptions::new().metrics(Arc::clone(&self.metrics));
        if let Some(e) = &self.elector {
            options = options.leader_election(Arc::clone(e));
        }
        options
    }

    /// A builder for a controller of `K` on this Manager's factory, with
    /// [`controller_options`](Self::controller_options).
    pub fn controller<K>(&self, name: &str) -> ControllerBuilder<'_, K>
    where
        K: Resource + Object + Clone + DeserializeOwned + std::fmt::Debug,
        K::DynamicType: Default,
        K::Scope: 'static,
    {
        Controller::builder(name, &self.factory)
            .managed(Arc::clone(&self.metrics), self.elector.clone())
    }

    /// Adds a controller; built with [`controller`](Self::controller) or
    /// with [`controller_options`](Self::controller_options), it reports to
    /// the Manager's metrics and follows its election.
    pub fn add<K: Object + Clone>(&mut self, controller: Controller<K>) -> &mut Self {
        self.controllers.push(Box::new(controller));
        self
    }

    /// A handle that adds and removes controllers while the Manager runs
    /// (see [`ManagerHandle`]): controller-runtime can add a controller
    /// to a running manager but not remove one, and kube-runtime neither.
    pub fn handle(&self) -> ManagerHandle {
        ManagerHandle {
            commands: self.commands.clone(),
        }
    }

    /// Adds a runnable of your own (controller-runtime's `mgr.Add`): started
    /// after the controllers (once this replica leads, unless it runs
    /// [`on_every_replica`](crate::FnRunnable::on_every_replica)), stopped
    /// with them. See [`Runnable`] for what its end means.
    pub fn add_runnable(&mut self, runnable: impl Runnable) -> &mut Self {
        self.runnables.get_mut().push(Box::new(runnable));
        self
    }

    /// Refuses a controller that would run outside the Manager's election
    /// or unseen by its metrics (made with other options than the
    /// Manager's): the Manager's settings are not the controller's to
    /// replace.
    fn check_controllers(&self) -> Result<(), ControllerError> {
        for c in &self.controllers {
            check_controller(c.as_ref(), self.elector.as_ref(), &self.metrics)?;
        }
        Ok(())
    }

    /// The RBAC rules this Manager needs to run what it has now (see
    /// [`Permissions`]; render them with [`Permissions::manifests`]):
    /// - each controller's ([`Controller::permissions`]): list and watch of
    ///   its informers, what its builder declared it writes, what setting
    ///   ownerReferences on the children it owns takes, its ring's Leases;
    /// - list and watch of every informer made from its
    ///   [`factory`](Self::factory), a controller's or not
    ///   ([`SharedInformerFactory::permissions`]);
    /// - the election's Lease ([`ManagerOptions::leader_election`]);
    /// - if an Events recorder was made ([`event_recorder`](Self::event_recorder)),
    ///   creating and patching events.k8s.io Events where each controller's
    ///   objects are (in `default` for cluster-scoped ones).
    ///
    /// Call it once every controller is added. The Events rule is given
    /// for every controller's objects once any recorder exists (a
    /// recorder is not tied to one controller); a controller made with
    /// [`Controller::new`] rather than a builder is taken to be over a
    /// namespaced kind for it.
    pub fn permissions(&self) -> Permissions {
        let mut permissions = self.factory.permissions();
        let recorded = !self.recorders.lock().is_empty();
        for controller in &self.controllers {
            permissions.merge(&controller.permissions());
            if recorded {
                let (namespace, cluster_scoped) = controller.primary_scope();
                rbac::events(&mut permissions, namespace.as_deref(), cluster_scoped);
            }
        }
        if let Some(elector) = &self.elector {
            let config = elector.config();
            rbac::lease(&mut permissions, &config.namespace, &config.lease_name);
        }
        permissions
    }

    /// Serves `webhooks` (admission and conversion, see
    /// [`kinformer_webhook`]) on [`ManagerOptions::webhook_server`]'s
    /// address while the Manager runs, on every replica (a standby
    /// answers the API server too, as controller-runtime's does). The
    /// certificate must be there when [`run`](Self::run) starts. `/readyz`
    /// waits for the server to serve, and not for the caches of the custom
    /// resources it converts (see the type's docs for why), and fails its
    /// `webhook` check once the server has stopped. They stop last, after
    /// the informers.
    pub fn webhooks(&mut self, webhooks: Webhooks) -> &mut Self {
        self.webhooks = Some(webhooks);
        self
    }

    /// Runs every controller and runnable until `shutdown` fires or one of
    /// them fails; returns the first error. See the type's docs for the
    /// start and shutdown order.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), ControllerError> {
        if self.controllers.is_empty() && self.runnables.get_mut().is_empty() {
            return Err(ControllerError::InvalidOptions(
                "the Manager has no controllers or runnables to run".to_owned(),
            ));
        }
        self.check_controllers()?;
        // Started in this order, each part before what may use it.
        // 1. The admin server: probes and metrics from the very start.
        let serving = CancellationToken::new();
        let _stop_serving = serving.clone().drop_guard();
        self.serve(&serving).await?;
        // 2. The webhook server, on every replica.
        let webhook_stop = CancellationToken::new();
        let _stop_webhooks = webhook_stop.clone().drop_guard();
        let webhooks = self.serve_webhooks(&webhook_stop).await?;
        // 3. The election.
        let election_stop = CancellationToken::new();
        let election = self.campaign(&election_stop);
        // 4. The controllers, each starting its informers; 5. the user's
        // runnables.
        let stop = shutdown.child_token();
        let informer_stop = CancellationToken::new();
        let _stop_informers = informer_stop.clone().drop_guard();
        let informer_tasks = InformerTasks::default();
        let mut running = Running::default();
        let all_synced = Arc::new(watch::channel(false).0);
        let starter = self.starter(&stop, &informer_stop, &informer_tasks);
        let total = self.start_controllers(&mut running, &starter, &all_synced);
        let runnables = self.start_runnables(&mut running, &stop, &all_synced);
        if webhooks.is_some() {
            // Each `informers of NAME` check now waits for its caches but
            // those of what the webhooks convert (see the type's docs).
            self.metrics.set_ready(true);
        }
        info!(controllers = total, runnables, "manager started");

        // Stopped in this order: the controllers and runnables (the first
        // to end ends them all), the election, the informers, the Events
        // not yet written, the webhook server, the admin server.
        let mut asked = self
            .asked
            .take()
            .expect("a Manager runs once: run takes it");
        let (first_error, stuck, shares) = running.until_ended(&starter, &mut asked).await;
        // Only now may a standby lead: every controller's reconciles have ended.
        if let (Some(elector), Some(task)) = (&self.elector, election) {
            if stuck {
                elector.keep_lease_on_cancel();
            }
            election_stop.cancel();
            let _ = task.await;
        }
        informer_stop.cancel();
        informer_tasks.join(INFORMER_STOP_WAIT).await;
        let recorders = std::mem::take(self.recorders.get_mut());
        flush_events(recorders).await;
        if let Some(webhooks) = webhooks {
            webhook_stop.cancel();
            let _ = webhooks.await;
        }
        // Only now are the caches let go: webhooks read them to the end.
        drop(shares);
        first_error.map_or(Ok(()), Err)
    }

    /// Runs the Manager's election, if it has one, reporting who leads.
    fn campaign(&self, election_stop: &CancellationToken) -> Option<tokio::task::JoinHandle<()>> {
        self.elector.as_ref().map(|elector| {
            let (elector, election_stop) = (Arc::clone(elector), election_stop.clone());
            let (metrics, mut leading) = (Arc::clone(&self.metrics), elector.subscribe());
            let lease = elector.config().lease_name.clone();
            metrics.set_leader(&lease, false);
            tokio::spawn(async move {
                let report = async {
                    while leading.changed().await.is_ok() {
                        metrics.set_leader(&lease, *leading.borrow_and_update());
                    }
                };
                tokio::select! {
                    _ = elector.run(election_stop) => {}
                    _ = report => {}
                }
                metrics.set_leader(&lease, elector.is_leader());
            })
        })
    }

    /// What starting a controller of this Manager takes, on `stop`.
    fn starter(
        &self,
        stop: &CancellationToken,
        informer_stop: &CancellationToken,
        informer_tasks: &InformerTasks,
    ) -> Starter {
        // Caches of what the webhooks convert: not waited for by `/readyz`.
        let converted: std::collections::HashSet<GroupResource> = self
            .webhooks
            .iter()
            .flat_map(Webhooks::converted)
            .map(|(group, resource)| GroupResource::new(group, resource))
            .collect();
        Starter {
            metrics: Arc::clone(&self.metrics),
            elector: self.elector.clone(),
            tracker: Arc::clone(&self.tracker),
            informer_stop: informer_stop.clone(),
            informer_tasks: informer_tasks.clone(),
            needs_us: Arc::new(move |resource| converted.contains(resource)),
            stop: stop.clone(),
        }
    }

    /// Starts every controller (each starts its informers) with its
    /// `informers of NAME` readiness check: the Manager is ready once
    /// every one is (its caches synced, or waiting for a resource not
    /// served), and `all_synced` is set, for the runnables, once every
    /// one's caches have synced. How many.
    fn start_controllers(
        &mut self,
        running: &mut Running,
        starter: &Starter,
        all_synced: &Arc<watch::Sender<bool>>,
    ) -> usize {
        let total = self.controllers.len();
        let (ready, synced) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        for controller in std::mem::take(&mut self.controllers) {
            let (ready, metrics) = (Arc::clone(&ready), Arc::clone(&self.metrics));
            let ready = Box::new(move || {
                if ready.fetch_add(1, Ordering::SeqCst) + 1 == total {
                    metrics.set_ready(true);
                }
            });
            let (synced, all_synced) = (Arc::clone(&synced), Arc::clone(all_synced));
            let synced = Box::new(move || {
                if synced.fetch_add(1, Ordering::SeqCst) + 1 == total {
                    all_synced.send_replace(true);
                }
            });
            starter.start(running, controller, (ready, synced));
        }
        if total == 0 {
            // Nothing to sync: ready as soon as the checks pass.
            self.metrics.set_ready(true);
            all_synced.send_replace(true);
        }
        total
    }

    /// Starts the user's runnables on `stop` once every controller's caches
    /// have synced (`all_synced`); those that need the lease once this
    /// replica leads, stopped if it is lost: how many.
    fn start_runnables(
        &mut self,
        running: &mut Running,
        stop: &CancellationToken,
        all_synced: &Arc<watch::Sender<bool>>,
    ) -> usize {
        let runnables = std::mem::take(self.runnables.get_mut());
        let count = runnables.len();
        for runnable in runnables {
            let name = runnable.name().to_owned();
            let elector = self
                .elector
                .clone()
                .filter(|_| runnable.needs_leader_election());
            let started = Started {
                name: name.clone(),
                stop: stop.child_token(),
                synced: all_synced.subscribe(),
                elector,
            };
            running.spawn(name, Part::Runnable, Box::pin(started.run(runnable)));
        }
        count
    }

    /// Binds the webhook server, if there are webhooks, and serves them
    /// until `stop`.
    async fn serve_webhooks(
        &self,
        stop: &CancellationToken,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, ControllerError> {
        let Some(webhooks) = self.webhooks.clone() else {
            return Ok(None);
        };
        let webhooks = webhooks.observe(Arc::new(WebhookMetrics::register(&self.metrics)));
        let dir = &self.options.webhook_cert_dir;
        let tls = CertFiles::new(dir.join("tls.crt"), dir.join("tls.key"))
            .map_err(ControllerError::Webhook)?;
        let addr = self.options.webhook_bind_address;
        let server = webhooks
            .bind(addr, Arc::new(tls))
            .await
            .map_err(ControllerError::Webhook)?;
        info!(addr = %server.local_addr(), "serving webhooks");
        let serving = Arc::new(AtomicBool::new(true));
        let check = Arc::clone(&serving);
        self.metrics.add_ready_check("webhook", move || {
            if check.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(CheckFailed::from("the webhook server has stopped"))
            }
        });
        let stop = stop.clone();
        Ok(Some(tokio::spawn(async move {
            server.run(stop).await;
            serving.store(false, Ordering::SeqCst);
        })))
    }

    /// Runs until SIGTERM or SIGINT (see [`run`](Self::run)); a second
    /// signal exits the process at once with status 130, as
    /// controller-runtime's signal handler does.
    pub async fn run_until_signal(self) -> Result<(), ControllerError> {
        let shutdown = CancellationToken::new();
        let signals = shutdown_on_signal(shutdown.clone()).map_err(ControllerError::Signals)?;
        let result = self.run(shutdown).await;
        signals.abort();
        result
    }

    async fn serve(&self, serving: &CancellationToken) -> Result<(), ControllerError> {
        let bind_error = |what: &'static str, addr: SocketAddr| {
            move |source| ControllerError::Bind { what, addr, source }
        };
        let (metrics, probes) = (
            self.options.metrics_bind_address,
            self.options.health_probe_bind_address,
        );
        match (metrics, probes) {
            (Some(m), Some(p)) if m == p => {
                self.metrics
                    .serve(m, serving.clone())
                    .await
                    .map_err(bind_error("metrics and probes", m))?;
            }
            _ => {
                if let Some(m) = metrics {
                    self.metrics
                        .serve_metrics(m, serving.clone())
                        .await
                        .map_err(bind_error("metrics", m))?;
                }
                if let Some(p) = probes {
                    self.metrics
                        .serve_probes(p, serving.clone())
                        .await
                        .map_err(bind_error("probes", p))?;
                }
            }
        }
        Ok(())
    }
}

/// Refuses a controller that would run outside the Manager's election
/// (`elector`) or unseen by its `metrics`.
fn check_controller(
    c: &dyn ManagedController,
    elector: Option<&Arc<LeaderElector>>,
    metrics: &Arc<Metrics>,
) -> Result<(), ControllerError> {
    let how = "make it with Manager::controller (its options() keep the Manager's election \
               and metrics) or with Manager::controller_options";
    let name = c.name();
    let election = match elector {
        Some(e) if !c.uses_elector(e) => Some("does not follow the Manager's leader election"),
        None if c.has_own_elector() => Some(
            "has a leader election of its own, which a Manager does not run (set ManagerOptions::leader_election)",
        ),
        _ => None,
    };
    if let Some(why) = election {
        return Err(ControllerError::InvalidOptions(format!(
            "controller {name:?} {why}: {how}"
        )));
    }
    if !c.uses_metrics(metrics) {
        return Err(ControllerError::InvalidOptions(format!(
            "controller {name:?} does not report to the Manager's metrics: {how}"
        )));
    }
    Ok(())
}

/// The name of a controller's readiness check over its informers.
fn informers_check_name(controller: &str) -> String {
    format!("informers of {controller}")
}

/// Called once when a controller reaches a point of its start.
type Signal = Box<dyn Fn() + Send + Sync>;

/// A [`Signal`] that acts once, whoever fires it: the controller when it
/// gets there, or the Manager when it removes the controller before (a
/// removed controller must not hold the Manager's readiness or its
/// runnables back for good).
struct Once {
    fired: AtomicBool,
    signal: Signal,
}

impl Once {
    fn new(signal: Signal) -> Arc<Self> {
        Arc::new(Self {
            fired: AtomicBool::new(false),
            signal,
        })
    }

    fn fire(&self) {
        if !self.fired.swap(true, Ordering::SeqCst) {
            (self.signal)();
        }
    }

    /// The signal for the controller to fire.
    fn for_controller(self: &Arc<Self>) -> Signal {
        let once = Arc::clone(self);
        Box::new(move || once.fire())
    }
}

/// What starting one controller of a running Manager takes.
struct Starter {
    metrics: Arc<Metrics>,
    elector: Option<Arc<LeaderElector>>,
    tracker: Arc<WriteTracker>,
    informer_stop: CancellationToken,
    informer_tasks: InformerTasks,
    /// Whether listing a resource needs this process ready first (a
    /// conversion its webhooks serve).
    needs_us: Arc<dyn Fn(&GroupResource) -> bool + Send + Sync>,
    /// The Manager's stop: each controller runs on a child of it.
    stop: CancellationToken,
}

impl Starter {
    /// Starts `controller` with its readiness check; `ready` is called
    /// once each of its caches has synced or waits for a resource not
    /// served, `synced` once all have synced.
    fn start(
        &self,
        running: &mut Running,
        mut controller: Box<dyn ManagedController>,
        (ready, synced): (Signal, Signal),
    ) {
        let name = controller.name().to_owned();
        let check = controller.informers_check(Arc::clone(&self.needs_us));
        self.metrics
            .add_ready_check(&informers_check_name(&name), move || check());
        let external_election = self
            .elector
            .as_ref()
            .is_some_and(|e| controller.uses_elector(e));
        let signals = [Once::new(ready), Once::new(synced)];
        let managed = Managed {
            informer_stop: self.informer_stop.clone(),
            informer_tasks: self.informer_tasks.clone(),
            external_election,
            tracker: Some(Arc::clone(&self.tracker)),
            ready: signals[0].for_controller(),
            synced: signals[1].for_controller(),
        };
        let shares = controller.take_shares();
        let stop = self.stop.child_token();
        let run = controller.run(stop.clone(), managed);
        let task = running.spawn(name.clone(), Part::Controller, run);
        running.controllers.push(RunningController {
            task,
            name,
            stop,
            shares,
            signals,
            removed: None,
        });
    }

    /// Adds `controller` to the running Manager, if it may run in it.
    fn add(
        &self,
        running: &mut Running,
        controller: Box<dyn ManagedController>,
    ) -> Result<(), ControllerError> {
        if self.stop.is_cancelled() {
            return Err(ControllerError::InvalidOptions(
                "the Manager is stopping".to_owned(),
            ));
        }
        let name = controller.name().to_owned();
        if running.controllers.iter().any(|c| c.name == name) {
            return Err(ControllerError::InvalidOptions(format!(
                "a controller named {name:?} runs already"
            )));
        }
        check_controller(controller.as_ref(), self.elector.as_ref(), &self.metrics)?;
        info!(controller = %name, "adding a controller");
        // The Manager's readiness and its runnables do not wait for it: its
        // `informers of NAME` check says when it is ready.
        self.start(running, controller, (Box::new(|| {}), Box::new(|| {})));
        Ok(())
    }
}

/// A controller a Manager runs.
struct RunningController {
    /// Its task: what tells it apart from another of the same name.
    task: tokio::task::Id,
    name: String,
    /// Its `ready` and `synced` signals, fired by the Manager if it is
    /// removed before it fired them.
    signals: [Arc<Once>; 2],
    /// Stops it alone.
    stop: CancellationToken,
    /// Its informer shares, let go once it has ended and is removed, or
    /// once the Manager has stopped.
    shares: Vec<Share>,
    /// Who asked for its removal, told how it ended.
    removed: Option<oneshot::Sender<Result<(), ControllerError>>>,
}

/// What a Manager runs until it stops: its controllers and the user's
/// runnables, each task named.
#[derive(Default)]
struct Running {
    tasks: JoinSet<(String, Part, Result<(), ControllerError>)>,
    names: std::collections::HashMap<tokio::task::Id, (String, Part)>,
    controllers: Vec<RunningController>,
}

/// Which kind of part a task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Controller,
    Runnable,
}

impl Running {
    fn spawn(
        &mut self,
        name: String,
        part: Part,
        run: BoxFuture<'static, Result<(), ControllerError>>,
    ) -> tokio::task::Id {
        let task = name.clone();
        let id = self
            .tasks
            .spawn(async move { (task, part, run.await) })
            .id();
        self.names.insert(id, (name, part));
        id
    }

    /// Waits until every part has ended, stopping them all (the
    /// starter's `stop`) when the first controller ends or any part fails;
    /// a runnable that finished without an error, or a controller removed
    /// through a [`ManagerHandle`], leaves the others running, and the
    /// Manager runs until `stop` even with nothing left. Meanwhile it does
    /// what handles ask (`asked`). The first error, whether some
    /// controller's workers were left stuck, and the informer shares of
    /// the controllers, to let go once nothing reads the caches.
    async fn until_ended(
        mut self,
        starter: &Starter,
        asked: &mut mpsc::UnboundedReceiver<Command>,
    ) -> (Option<ControllerError>, bool, Vec<Share>) {
        let (stop, metrics) = (&starter.stop, &starter.metrics);
        let mut first_error = None;
        let mut stuck = false;
        let mut asking = true;
        let mut stopping = false;
        loop {
            let joined = tokio::select! {
                // `/healthz` and `/readyz` answer 503 from the start of the
                // stop, while the controllers drain.
                _ = stop.cancelled(), if !stopping && !self.tasks.is_empty() => {
                    stopping = true;
                    metrics.set_stopping();
                    continue;
                }
                joined = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => joined,
                command = asked.recv(), if asking => {
                    match command {
                        Some(command) => self.obey(command, starter),
                        None => asking = false,
                    }
                    continue;
                }
                _ = stop.cancelled(), if self.tasks.is_empty() => {
                    metrics.set_stopping();
                    break;
                }
            };
            let Some(joined) = joined else { continue };
            let task = match &joined {
                Ok((id, _)) => *id,
                Err(e) => e.id(),
            };
            let named = self.names.remove(&task);
            let (name, part, result) = match joined {
                Ok((_, ended)) => ended,
                Err(source) => {
                    let (name, part) = named.unwrap_or((String::new(), Part::Controller));
                    // A runnable's panic is the runnable's; a controller's
                    // task catches its reconciles' panics.
                    let result = match part {
                        Part::Controller => Err(ControllerError::Aborted {
                            name: name.clone(),
                            source,
                        }),
                        Part::Runnable => Err(ControllerError::RunnableFailed {
                            name: name.clone(),
                            source: Box::new(source),
                        }),
                    };
                    (name, part, result)
                }
            };
            if part == Part::Runnable && result.is_ok() && !stop.is_cancelled() {
                info!(runnable = %name, "runnable finished");
                continue;
            }
            let result = match part {
                Part::Controller => match self.removed(task, &name, result, metrics) {
                    Ok(()) => continue,
                    Err(result) => result,
                },
                Part::Runnable => result,
            };
            stuck |= matches!(
                result,
                Err(ControllerError::WorkersStuck { .. } | ControllerError::RunnableStuck { .. })
            );
            self.stop_all(stop, metrics, &name, part, result, &mut first_error);
        }
        let shares = self
            .controllers
            .into_iter()
            .flat_map(|c| c.shares)
            .collect();
        (first_error, stuck, shares)
    }

    /// Does what a handle asks.
    fn obey(&mut self, command: Command, starter: &Starter) {
        match command {
            Command::Add(controller, reply) => {
                let _ = reply.send(starter.add(self, controller));
            }
            Command::Remove(name, reply) => {
                let Some(c) = self
                    .controllers
                    .iter_mut()
                    .find(|c| c.name == name && c.removed.is_none())
                else {
                    let _ = reply.send(Err(ControllerError::InvalidOptions(format!(
                        "no controller named {name:?} runs in the Manager"
                    ))));
                    return;
                };
                info!(controller = %name, "removing a controller");
                c.removed = Some(reply);
                c.stop.cancel();
            }
        }
    }

    /// The controller `name` ended with `result`: if it was removed, it is
    /// let go (its readiness check, its shares) and told to who asked
    /// (`Ok`); otherwise `result` is given back, to stop the others.
    fn removed(
        &mut self,
        task: tokio::task::Id,
        name: &str,
        result: Result<(), ControllerError>,
        metrics: &Metrics,
    ) -> Result<(), Result<(), ControllerError>> {
        let Some(at) = self
            .controllers
            .iter()
            .position(|c| c.task == task && c.removed.is_some())
        else {
            return Err(result);
        };
        let started = self.controllers.remove(at);
        // Removed before it was ready or synced: the Manager's readiness
        // and its runnables wait for it no more.
        for signal in &started.signals {
            signal.fire();
        }
        if !self.controllers.iter().any(|c| c.name == name) {
            metrics.remove_ready_check(&informers_check_name(name));
        }
        match &result {
            Ok(()) => info!(controller = %name, "controller removed"),
            Err(e) => {
                warn!(controller = %name, error = %chain(e), "controller removed; it ended with an error")
            }
        }
        // Its informers, unless others read them, stop and free their caches.
        drop(started.shares);
        if let Some(reply) = started.removed {
            let _ = reply.send(result);
        }
        Ok(())
    }

    /// A part ended with `result` (not a removal): every other part is
    /// told to stop, and an error kept if it is the first.
    fn stop_all(
        &self,
        stop: &CancellationToken,
        metrics: &Metrics,
        name: &str,
        part: Part,
        result: Result<(), ControllerError>,
        first_error: &mut Option<ControllerError>,
    ) {
        // Whatever ended one controller ends them all.
        stop.cancel();
        metrics.set_stopping();
        match (part, result) {
            (Part::Controller, Ok(())) => info!(controller = %name, "controller stopped"),
            (Part::Runnable, Ok(())) => info!(runnable = %name, "runnable stopped"),
            (Part::Controller, Err(e)) => {
                error!(controller = %name, error = %chain(&e), "controller failed; stopping the others");
                first_error.get_or_insert(e);
            }
            (Part::Runnable, Err(e)) => {
                error!(runnable = %name, error = %chain(&e), "runnable failed; stopping the others");
                first_error.get_or_insert(e);
            }
        }
    }
}

/// How long a runnable gets to end once told to stop, as controller-runtime's
/// `GracefulShutdownTimeout` (30 s); after a lost lease, no longer than the
/// lease is safely ours. Past it the runnable is dropped and the lease left
/// to expire.
pub const RUNNABLE_STOP_WAIT: Duration = Duration::from_secs(30);

/// A user's runnable as the Manager runs it.
struct Started {
    name: String,
    stop: CancellationToken,
    /// True once every controller's caches have synced.
    synced: watch::Receiver<bool>,
    /// The Manager's, when the runnable needs the lease.
    elector: Option<Arc<LeaderElector>>,
}

impl Started {
    async fn run(mut self, runnable: Box<dyn Runnable>) -> Result<(), ControllerError> {
        tokio::select! {
            _ = self.stop.cancelled() => return Ok(()),
            _ = self.synced.wait_for(|synced| *synced) => {}
        }
        if let Some(elector) = &self.elector {
            let mut leading = elector.subscribe();
            tokio::select! {
                _ = self.stop.cancelled() => return Ok(()),
                led = leading.wait_for(|leading| *leading) => if led.is_err() {
                    return Err(ControllerError::LostLeadership);
                },
            }
        }
        let mut run = runnable.run(self.stop.clone());
        let lost = async {
            match &self.elector {
                Some(e) => lease_lost(e, &mut e.subscribe()).await,
                None => std::future::pending().await,
            }
        };
        let lost = tokio::select! {
            result = &mut run => {
                return result.map_err(|source| ControllerError::RunnableFailed { name: self.name.clone(), source });
            }
            _ = self.stop.cancelled() => false,
            _ = lost => true,
        };
        // Told to stop (or, after a lost lease, stopped: only a leader may
        // run it), it gets a bounded time to end.
        self.stop.cancel();
        let now = tokio::time::Instant::now();
        let limit = now + RUNNABLE_STOP_WAIT;
        let deadline = match (lost, self.elector.as_ref().and_then(|e| e.safe_until())) {
            (true, Some(safe)) => safe.min(limit),
            (true, None) => now,
            (false, _) => limit,
        };
        match tokio::time::timeout_at(deadline, run).await {
            Err(_) => {
                error!(runnable = %self.name, waited = ?deadline.saturating_duration_since(now), "the runnable did not end when told to stop; leaving it behind");
                Err(ControllerError::RunnableStuck { name: self.name })
            }
            Ok(_) if lost => Err(ControllerError::LostLeadership),
            Ok(Err(source)) => Err(ControllerError::RunnableFailed {
                name: self.name,
                source,
            }),
            Ok(Ok(())) => Ok(()),
        }
    }
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT; exits the process
/// with 130 on the second. Returns the task handling them.
pub fn shutdown_on_signal(
    shutdown: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        info!("signal received; shutting down (a second signal exits at once)");
        shutdown.cancel();
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        error!("second signal received; exiting now without finishing the drain");
        eprintln!("error: second signal received; exiting now without finishing the drain");
        std::process::exit(130);
    }))
}

/// Writes what the Event recorders' series have not written yet, for at
/// most [`EVENT_FLUSH_WAIT`] (a stop must not hang on the server).
async fn flush_events(recorders: Vec<Arc<EventRecorder>>) {
    let flush = async {
        for recorder in recorders {
            if let Err(e) = recorder.flush().await {
                warn!(error = %e, "writing the Events' series at shutdown failed");
            }
        }
    };
    if tokio::time::timeout(EVENT_FLUSH_WAIT, flush).await.is_err() {
        warn!(wait = ?EVENT_FLUSH_WAIT, "writing the Events' series at shutdown took too long; gave up");
    }
}

/// The webhook server's requests in the Manager's registry, as
/// controller-runtime's `controller_runtime_webhook_*` metrics.
struct WebhookMetrics {
    requests: Family<WebhookCode, Counter>,
    latency: Family<WebhookLabel, Histogram, fn() -> Histogram>,
    in_flight: Family<WebhookLabel, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabel {
    webhook: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookCode {
    webhook: String,
    code: String,
}

fn webhook_histogram() -> Histogram {
    // controller-runtime's: Prometheus's default buckets, 5 ms to 10 s.
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

impl WebhookMetrics {
    fn register(metrics: &Metrics) -> Self {
        let this = Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(webhook_histogram as fn() -> Histogram),
            in_flight: Family::default(),
        };
        metrics.register(
            "kinformer_webhook_requests",
            "Webhook requests answered, by path and HTTP status",
            this.requests.clone(),
        );
        metrics.register(
            "kinformer_webhook_latency_seconds",
            "How long webhook requests took to answer",
            this.latency.clone(),
        );
        metrics.register(
            "kinformer_webhook_requests_in_flight",
            "Webhook requests being answered",
            this.in_flight.clone(),
        );
        this
    }
}

impl Observer for WebhookMetrics {
    fn started(&self, webhook: &str) {
        let label = WebhookLabel {
            webhook: webhook.to_owned(),
        };
        self.in_flight.get_or_create(&label).inc();
    }

    fn finished(&self, webhook: &str, status: u16, seconds: f64) {
        let label = WebhookLabel {
            webhook: webhook.to_owned(),
        };
        self.in_flight.get_or_create(&label).dec();
        self.latency.get_or_create(&label).observe(seconds);
        let code = WebhookCode {
            webhook: webhook.to_owned(),
            code: status.to_string(),
        };
        self.requests.get_or_create(&code).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubebuilder_addresses_parse_and_others_are_named() {
        let addr = |s: &str| s.parse::<BindAddress>().map(BindAddress::socket_addr);
        assert_eq!(
            addr(":8080"),
            Ok(Some(SocketAddr::from(([0, 0, 0, 0], 8080))))
        );
        let local = Some(SocketAddr::from(([127, 0, 0, 1], 8080)));
        assert_eq!(addr("localhost:8080"), Ok(local));
        assert_eq!(addr("127.0.0.1:8080"), Ok(local));
        assert_eq!(addr("[::1]:9443"), Ok(Some("[::1]:9443".parse().unwrap())));
        assert_eq!(addr("0"), Ok(None));
        for (bad, says) in [
            ("8080", "not HOST:PORT, :PORT or 0"),
            (":http", "\"http\" is not a port number"),
            (":65536", "is not a port number"),
            (
                "example.com:80",
                "\"example.com\" is not an IP address or localhost",
            ),
            ("::1:80", "IPv6 goes in brackets"),
            ("[127.0.0.1]:80", "is not an IP address"),
        ] {
            let e = addr(bad).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{bad:?} is not a listen address")),
                "{e}"
            );
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn options_given_a_string_that_is_no_address_make_no_manager() {
        let config = kube_client::Config::new("https://kubernetes.invalid".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let good = ManagerOptions::new()
            .metrics_bind_address(":8080")
            .health_probe_bind_address(String::from("127.0.0.1:8081"))
            .webhook_server("[::1]:9443", "/certs");
        assert_eq!(
            good.metrics_bind_address,
            Some(SocketAddr::from(([0, 0, 0, 0], 8080)))
        );
        assert_eq!(good.webhook_bind_address, "[::1]:9443".parse().unwrap());
        assert!(Manager::new(client.clone(), good).is_ok());
        let off = ManagerOptions::kubebuilder().metrics_bind_address("0");
        assert_eq!(off.metrics_bind_address, None);
        let bad = ManagerOptions::new()
            .metrics_bind_address("8080")
            .webhook_server("0", "/certs");
        let Err(e) = Manager::new(client, bad) else {
            panic!("a Manager with metrics on \"8080\"");
        };
        let e = e.to_string();
        assert!(
            e.contains("metrics_bind_address: \"8080\" is not a listen address")
                && e.contains("webhook_server: \"0\""),
            "{e}"
        );
        let fixed = ManagerOptions::new()
            .metrics_bind_address("8080")
            .metrics_bind_address(":8080");
        assert!(fixed.invalid.is_empty(), "{:?}", fixed.invalid);
    }
}

#[cfg(test)]
mod runnable_tests {
    use super::*;
    use crate::runnable;

    fn started(stop: &CancellationToken) -> Started {
        Started {
            name: "r".to_owned(),
            stop: stop.clone(),
            synced: watch::channel(true).1,
            elector: None,
        }
    }

    /// A runnable that ignores its stop is dropped after RUNNABLE_STOP_WAIT,
    /// and the Manager says so (and leaves the lease to expire), instead of
    /// waiting for it for ever while it renews the lease.
    #[tokio::test(start_paused = true)]
    async fn a_runnable_that_ignores_its_stop_is_left_behind_after_the_wait() {
        let stop = CancellationToken::new();
        let deaf = runnable("r", |_stop| std::future::pending());
        let running = tokio::spawn(started(&stop).run(Box::new(deaf)));
        tokio::task::yield_now().await;
        let told = tokio::time::Instant::now();
        stop.cancel();
        let ended = running.await.unwrap();
        assert!(
            matches!(ended, Err(ControllerError::RunnableStuck { .. })),
            "{ended:?}"
        );
        assert_eq!(told.elapsed(), RUNNABLE_STOP_WAIT);
    }

    /// A runnable starts only once every controller's caches have synced.
    #[tokio::test(start_paused = true)]
    async fn a_runnable_waits_for_the_caches() {
        let stop = CancellationToken::new();
        let (synced, waiting) = watch::channel(false);
        let (ran, mut seen) = watch::channel(false);
        let r = runnable("r", move |stop| async move {
            ran.send_replace(true);
            stop.cancelled().await;
            Ok(())
        });
        let running = tokio::spawn(
            Started {
                synced: waiting,
                ..started(&stop)
            }
            .run(Box::new(r)),
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!*seen.borrow(), "started before the caches synced");
        synced.send_replace(true);
        seen.wait_for(|ran| *ran).await.unwrap();
        stop.cancel();
        running.await.unwrap().unwrap();
    }
}
