//! Prometheus metrics with controller-runtime's names, the health and
//! readiness checks, and the HTTP endpoints serving them: `/metrics`, and
//! `/healthz`, `/livez` and `/readyz`, on one address or on two (as
//! kubebuilder's `--metrics-bind-address` and `--health-probe-bind-address`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kinformer_informer::{
    FactoryStats, InformerMetrics, ReflectorStats, ShardEnforcement, ShardStats,
};
use kinformer_workqueue::{
    CounterMetric, GaugeMetric, HistogramMetric, MetricsProvider, Priority, SettableGaugeMetric,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::reconcile::chain;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabel {
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PriorityLabel {
    name: String,
    priority: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    controller: String,
    result: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;
type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // controller-runtime's workqueue buckets: 1e-8 s to 10^1 s by powers of 10.
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
}

/// A health or readiness check: `Err` says why it fails.
pub type Check = Arc<dyn Fn() -> Result<(), CheckFailed> + Send + Sync>;

/// Why a health or readiness check fails: its problems, in order, each
/// naming what is wrong. `/healthz` and `/readyz` answer 503 with a line
/// `[-]NAME failed: PROBLEMS` per failing check, the problems joined with
/// `"; "` (its `Display`).
///
/// ```
/// use kinformer_controllers::CheckFailed;
///
/// let failed = CheckFailed::new(["pods: not synced yet", "secrets: forbidden"]);
/// assert_eq!(failed.problems().len(), 2);
/// assert_eq!(failed.to_string(), "pods: not synced yet; secrets: forbidden");
/// // A check may also fail with a plain message.
/// assert_eq!(CheckFailed::from("still cold").problems(), ["still cold"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.join("; "))]
pub struct CheckFailed {
    problems: Vec<String>,
}

impl CheckFailed {
    /// A failure with these problems.
    pub fn new(problems: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            problems: problems.into_iter().map(Into::into).collect(),
        }
    }

    /// The problems, in order.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

impl From<String> for CheckFailed {
    fn from(problem: String) -> Self {
        Self {
            problems: vec![problem],
        }
    }
}

impl From<&str> for CheckFailed {
    fn from(problem: &str) -> Self {
        problem.to_owned().into()
    }
}

/// The sharded lister-watchers' stats, read at each scrape.
#[derive(Debug, Default)]
struct ShardCollector {
    informers: parking_lot::Mutex<Vec<(String, Arc<ShardStats>)>>,
}

impl Collector for ShardCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let informers = self.informers.lock();
        if informers.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            "kinformer_shard_filtered_on_client",
            "Objects the server sent outside the shard, dropped by the client (the server ignores the shard selector)",
            None,
            MetricType::Counter,
        )?;
        for (informer, stats) in informers.iter() {
            let labels = [("informer", informer.as_str())];
            ConstCounter::new(stats.filtered_on_client()).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "kinformer_shard_enforcement",
            "Who applies the shard selector: 1 for the enforcement that holds (server, client or unconfirmed)",
            None,
            MetricType::Gauge,
        )?;
        for (informer, stats) in informers.iter() {
            let now = stats.enforcement();
            for (name, which) in [
                ("server", ShardEnforcement::Server),
                ("client", ShardEnforcement::Client),
                ("unconfirmed", ShardEnforcement::Unconfirmed),
            ] {
                let labels = [("informer", informer.as_str()), ("enforcement", name)];
                ConstGauge::new(i64::from(now == which)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The Reflector counters of informer factories, read at each scrape.
#[derive(Debug, Default)]
struct InformerCollector {
    factories: parking_lot::Mutex<Vec<FactoryStats>>,
}

impl Collector for InformerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // prometheus-client writes label values as they are: no quotes,
        // backslashes or line breaks in them (`configmaps in namespace web`).
        let factories = self.factories.lock().clone();
        encode_named_informers(&mut encoder, &factories)?;
        let informers: Vec<_> = factories
            .iter()
            .flat_map(FactoryStats::reflectors)
            .map(|(informer, stats)| (informer.replace(['"', '\\', '\n'], ""), stats))
            .collect();
        if informers.is_empty() {
            return Ok(());
        }
        type Read = fn(&ReflectorStats) -> u64;
        let counters: [(&str, &str, Read); 4] = [
            (
                "kinformer_informer_denied",
                "Lists and watches the server refused for the credentials (401 or 403): the informer retries with back-off, and /readyz fails while it is refused",
                |s| s.denied.load(Ordering::Relaxed),
            ),
            (
                "kinformer_informer_not_served",
                "Times the server was found not to serve the informer's resource (404: a CRD not installed, deleted, or no longer serving the version): each time the informer waits for it",
                |s| s.not_served.load(Ordering::Relaxed),
            ),
            (
                "kinformer_informer_undecodable_objects",
                "Objects of lists and watches that could not be decoded: left out, their cached version kept",
                |s| s.undecodable_objects.load(Ordering::Relaxed),
            ),
            (
                "kinformer_informer_transform_panics",
                "Objects the informer's transform panicked on (each treated as undecodable)",
                |s| s.transform_panics.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, read) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (informer, stats) in &informers {
                let labels = [("informer", informer.as_str())];
                ConstCounter::new(read(stats)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "kinformer_informer_waiting_for_resource",
            "1 while the server does not serve the informer's resource and the informer waits for it (its CRD installed, or serving the version again); 0 otherwise",
            None,
            MetricType::Gauge,
        )?;
        for (informer, stats) in &informers {
            let labels = [("informer", informer.as_str())];
            let waiting = i64::from(stats.not_served_now().is_some());
            ConstGauge::new(waiting).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The 15 least significant digits of a resourceVersion as a number, as
/// client-go's store metric keeps them (so that a float holds them
/// exactly); `None` for a version that is not a decimal number.
fn resource_version_digits(rv: &str) -> Option<i64> {
    // Bytes, not a str slice: a version is opaque and may hold any UTF-8.
    let digits = &rv.as_bytes()[rv.len().saturating_sub(15)..];
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0i64, |n, d| n * 10 + i64::from(d - b'0')),
    )
}

/// client-go's informer metrics (component-base's provider) for the named
/// factories' informers: `informer_queued_items`,
/// `informer_processing_latency_seconds` and `informer_store_resource_version`,
/// labelled `name`, `group`, `version` and `resource`.
fn encode_named_informers(
    encoder: &mut DescriptorEncoder,
    factories: &[FactoryStats],
) -> Result<(), std::fmt::Error> {
    // One series per label set: factories given the same name (or one
    // factory added twice) would repeat one; the first reports it, as
    // client-go reserves a name and resource once per process.
    let mut seen = std::collections::HashSet::new();
    let informers: Vec<InformerMetrics> = factories
        .iter()
        .flat_map(FactoryStats::informers)
        .filter(|m| {
            seen.insert((
                m.name.clone(),
                m.group.clone(),
                m.version.clone(),
                m.resource.clone(),
            ))
        })
        .collect();
    if informers.is_empty() {
        return Ok(());
    }
    let clean = |s: &str| s.replace(['"', '\\', '\n'], "");
    let labels = |m: &InformerMetrics| {
        [
            ("name", clean(&m.name)),
            ("group", clean(&m.group)),
            ("version", clean(&m.version)),
            ("resource", clean(&m.resource)),
        ]
    };
    let mut family = encoder.encode_descriptor(
        "informer_queued_items",
        "Number of items currently queued in the FIFO.",
        None,
        MetricType::Gauge,
    )?;
    for m in &informers {
        let queued = i64::try_from(m.queued).unwrap_or(i64::MAX);
        ConstGauge::new(queued).encode(family.encode_family(&labels(m))?)?;
    }
    let mut family = encoder.encode_descriptor(
        "informer_processing_latency_seconds",
        "Time taken to process events after popping from the queue.",
        None,
        MetricType::Histogram,
    )?;
    for m in &informers {
        let latency = &m.processing_latency;
        let buckets: Vec<(f64, u64)> = latency
            .buckets
            .iter()
            .map(|&(le, n)| (if le.is_finite() { le } else { f64::MAX }, n))
            .collect();
        family
            .encode_family(&labels(m))?
            .encode_histogram::<NoLabelSet>(latency.sum_seconds, latency.count, &buckets, None)?;
    }
    let mut family = encoder.encode_descriptor(
        "informer_store_resource_version",
        "The 15 least significant digits of the resource version of the store.",
        None,
        MetricType::Gauge,
    )?;
    for m in &informers {
        let Some(rv) = m
            .store_resource_version
            .as_deref()
            .and_then(resource_version_digits)
        else {
            continue;
        };
        ConstGauge::new(rv).encode(family.encode_family(&labels(m))?)?;
    }
    Ok(())
}

/// Which endpoints a listener serves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoints {
    Metrics,
    Probes,
    All,
}

/// The metrics of the controllers and their workqueues, in one registry,
/// with the user's own metrics and health checks beside them.
pub struct Metrics {
    registry: parking_lot::Mutex<Registry>,
    health_checks: parking_lot::Mutex<Vec<(String, Check)>>,
    ready_checks: parking_lot::Mutex<Vec<(String, Check)>>,
    depth: Family<NameLabel, Gauge>,
    adds: Family<NameLabel, Counter>,
    queue_duration: HistogramFamily<NameLabel>,
    work_duration: HistogramFamily<NameLabel>,
    unfinished: Family<NameLabel, FloatGauge>,
    longest: Family<NameLabel, FloatGauge>,
    retries: Family<NameLabel, Counter>,
    depth_by_priority: Family<PriorityLabel, Gauge>,
    queue_duration_by_priority: HistogramFamily<PriorityLabel>,
    reconcile_total: Family<ResultLabel, Counter>,
    reconcile_errors: Family<ControllerLabel, Counter>,
    reconcile_panics: Family<ControllerLabel, Counter>,
    terminal_errors: Family<ControllerLabel, Counter>,
    dropped_keys: Family<ControllerLabel, Counter>,
    stale_cache_waits: Family<ControllerLabel, Counter>,
    stale_cache_wait_time: HistogramFamily<ControllerLabel>,
    stale_sync_skips: Family<ControllerLabel, Counter>,
    reconcile_time: HistogramFamily<ControllerLabel>,
    leader: Family<NameLabel, Gauge>,
    event_dropped: Family<ControllerLabel, Counter>,
    event_denied: Family<ControllerLabel, Counter>,
    leader_denied: Family<NameLabel, Counter>,
    reconcile_denied: Family<ControllerLabel, Counter>,
    shards: Arc<ShardCollector>,
    informers: Arc<InformerCollector>,
    ready: AtomicBool,
    stopping: AtomicBool,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A registry holding every metric, none observed yet.
    pub fn new() -> Arc<Self> {
        let mut m = Self {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            work_duration: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            unfinished: Family::default(),
            longest: Family::default(),
            retries: Family::default(),
            depth_by_priority: Family::default(),
            queue_duration_by_priority: Family::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            ),
            reconcile_total: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_panics: Family::default(),
            terminal_errors: Family::default(),
            dropped_keys: Family::default(),
            stale_cache_waits: Family::default(),
            stale_cache_wait_time: Family::new_with_constructor(
                reconcile_histogram as fn() -> Histogram,
            ),
            stale_sync_skips: Family::default(),
            reconcile_time: Family::new_with_constructor(reconcile_histogram as fn() -> Histogram),
            leader: Family::default(),
            event_dropped: Family::default(),
            event_denied: Family::default(),
            leader_denied: Family::default(),
            reconcile_denied: Family::default(),
            shards: Arc::default(),
            informers: Arc::default(),
            ready: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            registry: parking_lot::Mutex::new(Registry::default()),
            health_checks: parking_lot::Mutex::new(Vec::new()),
            ready_checks: parking_lot::Mutex::new(Vec::new()),
        };
        let registry = m.registry.get_mut();
        // Counters get their `_total` suffix from the encoder.
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            m.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            m.adds.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            m.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            m.work_duration.clone(),
        );
        registry.register(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
            m.unfinished.clone(),
        );
        registry.register(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            m.longest.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            m.retries.clone(),
        );
        registry.register(
            "kinformer_workqueue_depth_by_priority",
            "Current depth of workqueue by priority: high (live changes) or low (initial lists, resyncs, requeues)",
            m.depth_by_priority.clone(),
        );
        registry.register(
            "kinformer_workqueue_queue_duration_by_priority_seconds",
            "How long in seconds an item stays in workqueue before being requested, by priority (a key raised from low to high: its wait at low as low, its high wait from the raise)",
            m.queue_duration_by_priority.clone(),
        );
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            m.reconcile_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_panics",
            "Total number of reconciliation panics per controller",
            m.reconcile_panics.clone(),
        );
        registry.register(
            "controller_runtime_terminal_reconcile_errors",
            "Total number of terminal reconciliation errors per controller",
            m.terminal_errors.clone(),
        );
        registry.register(
            "kinformer_reconcile_denied",
            "Reconciles that failed because the server refused a request for the credentials (401 or 403; the log names the verb, resource and namespace), per controller",
            m.reconcile_denied.clone(),
        );
        registry.register(
            "kinformer_controller_dropped_keys",
            "Keys given up after the retry limit the controller was given (ControllerOptions::max_retries), per controller",
            m.dropped_keys.clone(),
        );
        registry.register(
            "kinformer_controller_stale_cache_waits",
            "Reconciles put off because the informers had not yet seen the Manager's own writes to what the controller reads, per controller",
            m.stale_cache_waits.clone(),
        );
        registry.register(
            "kinformer_controller_stale_cache_wait_seconds",
            "How long put-off reconciles waited for the informers to see the Manager's own writes, per controller",
            m.stale_cache_wait_time.clone(),
        );
        registry.register(
            "kinformer_controller_stale_sync_skips",
            "Put-off reconciles whose writes the informers had not seen at the bound: the writes were given up and the key reconciled from the cache as it was (kube-controller-manager's stale_sync_skips_total), per controller",
            m.stale_sync_skips.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            m.reconcile_time.clone(),
        );
        registry.register_collector(Box::new(Arc::clone(&m.shards)));
        registry.register_collector(Box::new(Arc::clone(&m.informers)));
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            m.leader.clone(),
        );
        registry.register(
            "kinformer_event_dropped_occurrences",
            "Event occurrences an EventRecorder counted and never wrote (a series' last write failed, or the series was forgotten to make room)",
            m.event_dropped.clone(),
        );
        registry.register(
            "kinformer_event_denied",
            "Event writes the server refused for the credentials (401 or 403): the recorder logs the refusal and tries again later",
            m.event_denied.clone(),
        );
        registry.register(
            "kinformer_leader_election_denied",
            "Requests for the election's Lease (read, acquire, renew, watch, release) the server refused for the credentials (401 or 403); 'name' is the Lease's",
            m.leader_denied.clone(),
        );
        Arc::new(m)
    }

    /// Reports whether this process leads the election on Lease `lease`
    /// (client-go's `leader_election_master_status`).
    pub fn set_leader(&self, lease: &str, leading: bool) {
        self.leader
            .get_or_create(&label(lease))
            .set(i64::from(leading));
    }

    /// Exports how a sharded lister-watcher's shard goes
    /// ([`ApiListerWatcher::shard_stats`](kinformer_informer::ApiListerWatcher::shard_stats)),
    /// read at every scrape under the label `informer="{informer}"`:
    /// `kinformer_shard_filtered_on_client_total`, the objects the server
    /// sent outside the shard (it ignores the selector), and
    /// `kinformer_shard_enforcement`, 1 for the one of
    /// `enforcement="server"`, `"client"` or `"unconfirmed"` that holds.
    pub fn add_shard_stats(&self, informer: &str, stats: Arc<ShardStats>) {
        self.shards
            .informers
            .lock()
            .push((informer.to_owned(), stats));
    }

    /// Exports the Reflector counters of `factory`'s informers, read at
    /// every scrape under the label `informer="{what it lists}"` (say
    /// `configmaps in namespace web`):
    /// `kinformer_informer_undecodable_objects_total` (objects left out
    /// because they did not decode, their cached version kept) and
    /// `kinformer_informer_transform_panics_total`. For a named factory
    /// ([`SharedInformerFactory::name`](kinformer_informer::SharedInformerFactory::name))
    /// also client-go's informer metrics under component-base's names:
    /// `informer_queued_items`, `informer_processing_latency_seconds` and
    /// `informer_store_resource_version` (the 15 least significant digits),
    /// labelled `name`, `group`, `version` and `resource`. A Manager exports
    /// its own factory's.
    pub fn add_informers(&self, factory: FactoryStats) {
        self.informers.factories.lock().push(factory);
    }

    /// Registers a metric of the user's own in the same registry, served on
    /// `/metrics` with the controllers' (counters get their `_total` suffix
    /// from the encoder).
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        self.registry.lock().register(name, help, metric);
    }

    /// Adds a collector, read at each scrape.
    pub(crate) fn register_collector(&self, collector: impl Collector) {
        self.registry.lock().register_collector(Box::new(collector));
    }

    /// Adds a liveness check, run on every `/healthz` and `/livez`; it
    /// fails with a [`CheckFailed`] (`"why".into()` makes one).
    pub fn add_health_check(
        &self,
        name: &str,
        check: impl Fn() -> Result<(), CheckFailed> + Send + Sync + 'static,
    ) {
        self.health_checks
            .lock()
            .push((name.to_owned(), Arc::new(check)));
    }

    /// Adds a readiness check, run on every `/readyz` (besides the caches
    /// having synced); it fails with a [`CheckFailed`] (`"why".into()`
    /// makes one).
    pub fn add_ready_check(
        &self,
        name: &str,
        check: impl Fn() -> Result<(), CheckFailed> + Send + Sync + 'static,
    ) {
        self.ready_checks
            .lock()
            .push((name.to_owned(), Arc::new(check)));
    }

    /// Removes the readiness checks named `name` (a controller removed
    /// from a running Manager).
    pub(crate) fn remove_ready_check(&self, name: &str) {
        self.ready_checks.lock().retain(|(n, _)| n != name);
    }

    /// The workqueue metrics provider for queues of this registry.
    pub fn workqueue_provider(self: &Arc<Self>) -> Arc<dyn MetricsProvider> {
        Arc::new(WorkqueueMetrics(Arc::clone(self)))
    }

    pub(crate) fn reconciled(&self, controller: &str, result: &str, seconds: f64) {
        self.reconcile_total
            .get_or_create(&ResultLabel {
                controller: controller.to_owned(),
                result: result.to_owned(),
            })
            .inc();
        self.reconcile_time
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .observe(seconds);
    }

    /// The counter of [`EventRecorder::dropped_occurrences`](crate::EventRecorder::dropped_occurrences)
    /// for recorders reporting as `controller`.
    pub(crate) fn event_dropped_occurrences(&self, controller: &str) -> Counter {
        self.event_dropped
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .clone()
    }

    /// The counter of [`EventRecorder::denied_writes`](crate::EventRecorder::denied_writes)
    /// for recorders reporting as `controller`.
    pub(crate) fn event_denied_writes(&self, controller: &str) -> Counter {
        self.event_denied
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .clone()
    }

    /// The counter of [`LeaderElector::denied`](crate::LeaderElector::denied)
    /// for the election on Lease `lease`.
    pub(crate) fn leader_election_denied(&self, lease: &str) -> Counter {
        self.leader_denied.get_or_create(&label(lease)).clone()
    }

    pub(crate) fn reconcile_denied(&self, controller: &str) {
        self.reconcile_denied
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .inc();
    }

    pub(crate) fn reconcile_error(&self, controller: &str) {
        self.reconcile_errors
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .inc();
    }

    pub(crate) fn terminal_error(&self, controller: &str) {
        self.terminal_errors
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .inc();
    }

    pub(crate) fn dropped_key(&self, controller: &str) {
        self.dropped_keys
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .inc();
    }

    pub(crate) fn stale_cache_wait(&self, controller: &str) {
        self.stale_cache_waits
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .inc();
    }

    pub(crate) fn stale_cache_waited(&self, controller: &str, seconds: f64) {
        self.stale_cache_wait_time
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .observe(seconds);
    }

    pub(crate) fn stale_sync_skip(&self, controller: &str) {
        self.stale_sync_skips
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .inc();
    }

    pub(crate) fn reconcile_panic(&self, controller: &str) {
        self.reconcile_panics
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .inc();
    }

    /// Marks the process ready (`/readyz` answers 200 if its checks
    /// pass): its caches have synced, or, for a
    /// [`Manager`](crate::Manager) serving webhooks, its webhook server
    /// serves and its checks wait for the caches (see the Manager's docs).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Whether the process is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.is_stopping()
    }

    /// Marks the process as stopping: from now on `/healthz` and `/readyz`
    /// answer 503, since it only finishes work before it exits.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether the process is stopping.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry.lock()) {
            warn!(error = %e, "encoding metrics failed");
        }
        out
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until `shutdown`
    /// fires. Returns the bound address (useful with port 0).
    pub async fn serve(
        self: &Arc<Self>,
        addr: SocketAddr,
        shutdown: CancellationToken,
    ) -> std::io::Result<SocketAddr> {
        self.serve_endpoints(addr, shutdown, Endpoints::All).await
    }

    /// Serves `/metrics` alone on `addr` until `shutdown` fires.
    pub async fn serve_metrics(
        self: &Arc<Self>,
        addr: SocketAddr,
        shutdown: CancellationToken,
    ) -> std::io::Result<SocketAddr> {
        self.serve_endpoints(addr, shutdown, Endpoints::Metrics)
            .await
    }

    /// Serves `/healthz`, `/livez` and `/readyz` alone on `addr` until
    /// `shutdown` fires.
    pub async fn serve_probes(
        self: &Arc<Self>,
        addr: SocketAddr,
        shutdown: CancellationToken,
    ) -> std::io::Result<SocketAddr> {
        self.serve_endpoints(addr, shutdown, Endpoints::Probes)
            .await
    }

    async fn serve_endpoints(
        self: &Arc<Self>,
        addr: SocketAddr,
        shutdown: CancellationToken,
        endpoints: Endpoints,
    ) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        let what = match endpoints {
            Endpoints::Metrics => "/metrics",
            Endpoints::Probes => "/healthz, /livez and /readyz",
            Endpoints::All => "/metrics, /healthz, /livez and /readyz",
        };
        info!(addr = %bound, "serving {what}");
        let metrics = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => stream,
                        Err(e) => {
                            warn!(error = %e, "metrics endpoint: accept failed");
                            continue;
                        }
                    },
                };
                let metrics = Arc::clone(&metrics);
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let metrics = Arc::clone(&metrics);
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                metrics.respond(req.uri().path(), endpoints),
                            )
                        }
                    });
                    if let Err(e) = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                    {
                        debug!(error = %chain(&e), "metrics connection ended");
                    }
                });
            }
        });
        Ok(bound)
    }

    /// Runs `checks`; the failures as `[-]name failed: why` lines, as the
    /// Kubernetes components' verbose health output.
    fn failed_checks(checks: &parking_lot::Mutex<Vec<(String, Check)>>) -> Vec<String> {
        let checks: Vec<(String, Check)> = checks.lock().clone();
        checks
            .iter()
            .filter_map(|(name, check)| {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check()))
                    .unwrap_or_else(|_| Err("the check panicked".into()));
                outcome.err().map(|why| format!("[-]{name} failed: {why}"))
            })
            .collect()
    }

    fn respond(&self, path: &str, endpoints: Endpoints) -> Response<Full<Bytes>> {
        let probes = endpoints != Endpoints::Metrics;
        let metrics = endpoints != Endpoints::Probes;
        let unavailable = |why: String| (StatusCode::SERVICE_UNAVAILABLE, "text/plain", why);
        let (status, content_type, body) = match path {
            "/metrics" if metrics => (
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.encode(),
            ),
            "/healthz" | "/livez" | "/readyz" if probes && self.is_stopping() => {
                unavailable("shutting down".to_owned())
            }
            "/healthz" | "/livez" if probes => {
                let failed = Self::failed_checks(&self.health_checks);
                if failed.is_empty() {
                    (StatusCode::OK, "text/plain", "ok".to_owned())
                } else {
                    unavailable(failed.join("\n"))
                }
            }
            "/readyz" if probes => {
                let mut failed = Vec::new();
                if !self.is_ready() {
                    failed.push("[-]caches failed: not synced yet".to_owned());
                }
                failed.extend(Self::failed_checks(&self.ready_checks));
                if failed.is_empty() {
                    (StatusCode::OK, "text/plain", "ok".to_owned())
                } else {
                    unavailable(failed.join("\n"))
                }
            }
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                format!("no such endpoint: {path}"),
            ),
        };
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        if let Ok(v) = http::HeaderValue::from_str(content_type) {
            resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
        }
        resp
    }
}

struct WorkqueueMetrics(Arc<Metrics>);
struct PromGauge(Gauge);
struct PromCounter(Counter);
struct PromHistogram(Histogram);
struct PromFloatGauge(FloatGauge);

impl GaugeMetric for PromGauge {
    fn inc(&self) {
        self.0.inc();
    }
    fn dec(&self) {
        self.0.dec();
    }
}
impl CounterMetric for PromCounter {
    fn inc(&self) {
        self.0.inc();
    }
}
impl HistogramMetric for PromHistogram {
    fn observe(&self, seconds: f64) {
        self.0.observe(seconds);
    }
}
impl SettableGaugeMetric for PromFloatGauge {
    fn set(&self, value: f64) {
        self.0.set(value);
    }
}

fn label(name: &str) -> NameLabel {
    NameLabel {
        name: name.to_owned(),
    }
}

impl MetricsProvider for WorkqueueMetrics {
    fn new_depth_metric(&self, name: &str) -> Box<dyn GaugeMetric> {
        Box::new(PromGauge(self.0.depth.get_or_create(&label(name)).clone()))
    }
    fn new_adds_metric(&self, name: &str) -> Box<dyn CounterMetric> {
        Box::new(PromCounter(self.0.adds.get_or_create(&label(name)).clone()))
    }
    fn new_latency_metric(&self, name: &str) -> Box<dyn HistogramMetric> {
        Box::new(PromHistogram(
            self.0.queue_duration.get_or_create(&label(name)).clone(),
        ))
    }
    fn new_work_duration_metric(&self, name: &str) -> Box<dyn HistogramMetric> {
        Box::new(PromHistogram(
            self.0.work_duration.get_or_create(&label(name)).clone(),
        ))
    }
    fn new_unfinished_work_seconds_metric(&self, name: &str) -> Box<dyn SettableGaugeMetric> {
        Box::new(PromFloatGauge(
            self.0.unfinished.get_or_create(&label(name)).clone(),
        ))
    }
    fn new_longest_running_processor_seconds_metric(
        &self,
        name: &str,
    ) -> Box<dyn SettableGaugeMetric> {
        Box::new(PromFloatGauge(
            self.0.longest.get_or_create(&label(name)).clone(),
        ))
    }
    fn new_retries_metric(&self, name: &str) -> Box<dyn CounterMetric> {
        Box::new(PromCounter(
            self.0.retries.get_or_create(&label(name)).clone(),
        ))
    }
    fn new_depth_by_priority_metric(&self, name: &str, priority: Priority) -> Box<dyn GaugeMetric> {
        Box::new(PromGauge(
            self.0
                .depth_by_priority
                .get_or_create(&priority_label(name, priority))
                .clone(),
        ))
    }
    fn new_latency_by_priority_metric(
        &self,
        name: &str,
        priority: Priority,
    ) -> Box<dyn HistogramMetric> {
        Box::new(PromHistogram(
            self.0
                .queue_duration_by_priority
                .get_or_create(&priority_label(name, priority))
                .clone(),
        ))
    }
}

fn priority_label(name: &str, priority: Priority) -> PriorityLabel {
    PriorityLabel {
        name: name.to_owned(),
        priority: priority.as_str().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    async fn probe(metrics: &Metrics, path: &str) -> (StatusCode, String) {
        let response = metrics.respond(path, Endpoints::Probes);
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn a_failed_check_is_a_line_naming_it_and_its_problems() {
        let metrics = Metrics::new();
        metrics.set_ready(true);
        assert_eq!(
            probe(&metrics, "/readyz").await,
            (StatusCode::OK, "ok".into())
        );
        metrics.add_ready_check("informers of web", || {
            Err(CheckFailed::new([
                "pods: not synced yet",
                "secrets: forbidden",
            ]))
        });
        metrics.add_ready_check("warm", || Err("still cold".into()));
        metrics.add_health_check("boom", || panic!("boom"));
        assert_eq!(
            probe(&metrics, "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "[-]informers of web failed: pods: not synced yet; secrets: forbidden\n\
                 [-]warm failed: still cold"
                    .into()
            )
        );
        assert_eq!(
            probe(&metrics, "/healthz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "[-]boom failed: the check panicked".into()
            )
        );
    }

    #[test]
    fn a_resource_version_gauge_keeps_its_15_least_significant_digits() {
        assert_eq!(resource_version_digits("12345"), Some(12345));
        assert_eq!(
            resource_version_digits("98765432109876543210"),
            Some(432_109_876_543_210)
        );
        assert_eq!(resource_version_digits(""), None);
        assert_eq!(resource_version_digits("12a45"), None);
        // Opaque versions: a multi-byte character where the 15 digits
        // would start is refused, not a panic in the middle of a scrape.
        assert_eq!(resource_version_digits("ü12345678901234"), None);
        assert_eq!(
            resource_version_digits("ü123456789012345"),
            Some(123_456_789_012_345)
        );
    }
}
