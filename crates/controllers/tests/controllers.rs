//! The controllers and their runtime against a real kube-apiserver.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Pod, Service};
use kinformer_controllers::service_strategy::{STRATEGY_ANNOTATION, ServiceStrategy, event_filter};
use kinformer_controllers::{
    Action, Controller, ControllerError, ControllerOptions, LeaderElectionConfig, LeaderElector,
    Metrics, ObjectKey, PanicPolicy, ReconcileError, Reconciler, Request, pod_stdout::PodStdout,
};
use kinformer_envtest::TestEnv;
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, InformerOptions, SharedIndexInformer,
};
use kinformer_store::namespace_indexers;
use kinformer_workqueue::Priority;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use parking_lot::Mutex;

mod common;
use common::{client_allowed_only, config_map, eventually, http_get, setup};

fn informer<K>(client: &Client, ns: &str) -> SharedIndexInformer<K>
where
    K: kube_client::Resource<DynamicType = ()>
        + kinformer_store::Object
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    SharedIndexInformer::new(
        ApiListerWatcher::<K>::namespaced(client.clone(), ns),
        InformerOptions::new().indexers(namespace_indexers()),
    )
}

async fn bump(api: &Api<ConfigMap>, name: &str, v: usize) {
    let patch = serde_json::json!({"data": {"v": v.to_string()}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_stdout_prints_adds_updates_and_deletes() {
    let (client, ns) = setup("podstdout").await;
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let informer = informer::<Pod>(&client, &ns);
    let out = Arc::clone(&lines);
    let reconciler = PodStdout::with_output(
        informer.lister(),
        Arc::new(move |l: &str| out.lock().push(l.to_owned())),
    );
    let shutdown = CancellationToken::new();
    let controller =
        Controller::new("pod-stdout", informer, reconciler, ControllerOptions::new()).unwrap();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p1"}, "spec": {"containers": [{"name": "c", "image": "x"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("the add", async || {
        lines
            .lock()
            .contains(&"Sync/Add/Update for Pod p1".to_string())
    })
    .await;
    pods.delete("p1", &DeleteParams::default()).await.unwrap();
    let gone = format!("Pod {ns}/p1 does not exist anymore");
    eventually("the delete", async || lines.lock().contains(&gone)).await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// Why pod-stdout (and client-go's workqueue example) may print "does not
/// exist anymore" twice for one deletion: the API server changes a deleted
/// Pod twice, even one on no node (grace period 0): it first marks it
/// (deletionTimestamp), then removes it. Each change queues the key, and a
/// key queued while it is reconciled is reconciled once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_on_no_node_deleted_is_marked_then_removed_two_changes() {
    let (client, ns) = setup("poddelete").await;
    let informer = informer::<Pod>(&client, &ns);
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let (on_update, on_delete) = (Arc::clone(&seen), Arc::clone(&seen));
    informer
        .add_event_handler(
            kinformer_informer::ResourceEventHandlerFuncs::new()
                .on_update(move |_old: &Arc<Pod>, new: &Arc<Pod>| {
                    let marked = new.metadata.deletion_timestamp.is_some();
                    on_update.lock().push(format!("update marked={marked}"));
                })
                .on_delete(move |_: &kinformer_store::ObjectOrTombstone<Pod>| {
                    on_delete.lock().push("delete".to_owned());
                }),
        )
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = {
        let (informer, shutdown) = (informer.clone(), shutdown.clone());
        tokio::spawn(async move { informer.run(shutdown).await })
    };
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p1"}, "spec": {"containers": [{"name": "c", "image": "x"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let lister = informer.lister();
    let key = format!("{ns}/p1");
    eventually("the add", async || lister.get(&key).is_some()).await;
    pods.delete("p1", &DeleteParams::default()).await.unwrap();
    eventually("the delete", async || {
        seen.lock().contains(&"delete".to_owned())
    })
    .await;
    assert_eq!(*seen.lock(), ["update marked=true", "delete"]);
    shutdown.cancel();
    let _ = run.await;
}

fn service(name: &str, strategy: Option<&str>) -> Service {
    let annotations: BTreeMap<String, String> = strategy
        .map(|s| (STRATEGY_ANNOTATION.to_owned(), s.to_owned()))
        .into_iter()
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"ports": [{"port": 80}]}
    }))
    .unwrap()
}

async fn app_of(api: &Api<Service>, name: &str) -> Option<String> {
    api.get(name)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.selector)
        .and_then(|m| m.get("app").cloned())
}

fn strategy_controller(
    client: &Client,
    ns: &str,
    metrics: Option<Arc<Metrics>>,
) -> Controller<Service> {
    let informer = informer::<Service>(client, ns);
    let reconciler = ServiceStrategy::new(informer.lister(), client.clone());
    let mut options = ControllerOptions::new()
        .max_retries(3)
        .event_filter(event_filter);
    if let Some(m) = metrics {
        options = options.metrics(m);
    }
    Controller::new("service-strategy", informer, reconciler, options).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_strategy_sets_the_selector_idempotently_and_reports_bad_values() {
    let (client, ns) = setup("strategy").await;
    let api: Api<Service> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &service("pre", Some("blue")))
        .await
        .unwrap();
    api.create(&PostParams::default(), &service("plain", None))
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(strategy_controller(&client, &ns, None).run(shutdown.clone()));

    eventually("pre gets app=blue", async || {
        app_of(&api, "pre").await.as_deref() == Some("blue")
    })
    .await;
    // Already in the wanted state: no further write.
    let rv = api.get("pre").await.unwrap().metadata.resource_version;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(api.get("pre").await.unwrap().metadata.resource_version, rv);

    let patch = serde_json::json!({"metadata": {"annotations": {STRATEGY_ANNOTATION: "green"}}});
    api.patch("pre", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    eventually("pre gets app=green", async || {
        app_of(&api, "pre").await.as_deref() == Some("green")
    })
    .await;

    api.create(&PostParams::default(), &service("typo", Some("not valid!")))
        .await
        .unwrap();
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), &ns);
    eventually("an InvalidStrategy event", async || {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("InvalidStrategy")
                    && e.involved_object.name.as_deref() == Some("typo")
            })
    })
    .await;
    assert_eq!(app_of(&api, "typo").await, None);
    assert_eq!(app_of(&api, "plain").await, None);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// The `v` of the cached ConfigMap under `key`.
fn cached_value(lister: &kinformer_informer::Lister<ConfigMap>, key: &str) -> Option<String> {
    lister.get(key)?.data.as_ref()?.get("v").cloned()
}

/// How often `ns/name` was reconciled.
fn calls_of(calls: &Mutex<BTreeMap<String, usize>>, name: &str, ns: &str) -> usize {
    calls
        .lock()
        .get(&format!("{ns}/{name}"))
        .copied()
        .unwrap_or(0)
}

/// Reconciles ConfigMaps by recording calls; panics or fails for chosen keys.
#[derive(Default)]
struct Probe {
    calls: Mutex<BTreeMap<String, usize>>,
    /// Keys in the order their reconciles started.
    started: Mutex<Vec<String>>,
    in_flight: Mutex<HashSet<String>>,
    overlaps: AtomicUsize,
    panic_for: Option<String>,
    fail_for: Option<String>,
    /// `fail_for` fails only its first this many reconciles (0: all).
    fail_first: usize,
    delay: Duration,
}

impl Reconciler for Probe {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let key = request.key.as_str();
        Box::pin(async move {
            *self.calls.lock().entry(key.to_owned()).or_default() += 1;
            self.started.lock().push(key.to_owned());
            if !self.in_flight.lock().insert(key.to_owned()) {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(self.delay).await;
            self.in_flight.lock().remove(key);
            let name = key.split('/').nth(1).unwrap_or(key);
            let call = self.calls.lock()[key];
            if self.panic_for.as_deref() == Some(name) {
                panic!("probe panics for {key}");
            }
            if self.fail_for.as_deref() == Some(name)
                && (self.fail_first == 0 || call <= self.fail_first)
            {
                return Err(format!("probe fails for {key}").into());
            }
            Ok(Action::Done)
        })
    }
}

impl Probe {
    fn calls(&self, name: &str, ns: &str) -> usize {
        calls_of(&self.calls, name, ns)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_key_is_retried_up_to_the_limit_while_other_keys_go_on() {
    let (client, ns) = setup("panic").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let probe = Arc::new(Probe {
        panic_for: Some("bad".into()),
        fail_for: Some("failing".into()),
        ..Probe::default()
    });
    let metrics = Metrics::new();
    let options = ControllerOptions::new()
        .max_retries(3)
        .metrics(Arc::clone(&metrics));
    let controller = Controller::new(
        "probe",
        informer::<ConfigMap>(&client, &ns),
        Arc::clone(&probe),
        options,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    for name in ["bad", "failing", "good"] {
        api.create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    // 1 attempt + 3 retries each, then dropped.
    eventually("bad retried 3 times", async || probe.calls("bad", &ns) == 4).await;
    eventually("failing retried 3 times", async || {
        probe.calls("failing", &ns) == 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(probe.calls("bad", &ns), 4, "retries stop after the limit");
    assert_eq!(
        probe.calls("failing", &ns),
        4,
        "retries stop after the limit"
    );
    // Other keys keep being reconciled after the panics.
    for v in 1..=3 {
        bump(&api, "good", v).await;
    }
    eventually("good reconciled again", async || {
        probe.calls("good", &ns) >= 2
    })
    .await;
    let text = metrics.encode();
    assert!(
        text.contains("controller_runtime_reconcile_panics_total{controller=\"probe\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("controller_runtime_reconcile_errors_total{controller=\"probe\"} 8"),
        "{text}"
    );
    assert!(
        text.contains("workqueue_retries_total{name=\"probe\"} 6"),
        "{text}"
    );
    assert!(
        text.contains("kinformer_controller_dropped_keys_total{controller=\"probe\"} 2"),
        "{text}"
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// With the default options a failing key is retried with backoff until it
/// succeeds, as controller-runtime does: a key failing its first 8
/// reconciles (a server restart, say) is reconciled a 9th time and
/// succeeds. Before the fix the default gave it up after 5 retries, 155 ms
/// after its first failure, until its object next changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_failing_key_is_retried_with_backoff_until_it_succeeds() {
    let (client, ns) = setup("retry-default").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let probe = Arc::new(Probe {
        fail_for: Some("flaky".into()),
        fail_first: 8,
        ..Probe::default()
    });
    let metrics = Metrics::new();
    let controller = Controller::new(
        "probe",
        informer::<ConfigMap>(&client, &ns),
        Arc::clone(&probe),
        ControllerOptions::new().metrics(Arc::clone(&metrics)),
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    api.create(&PostParams::default(), &config_map("flaky"))
        .await
        .unwrap();
    eventually("the 9th reconcile, which succeeds", async || {
        metrics.encode().contains(
            "controller_runtime_reconcile_total{controller=\"probe\",result=\"success\"} 1",
        )
    })
    .await;
    assert_eq!(probe.calls("flaky", &ns), 9);
    let text = metrics.encode();
    assert!(
        !text.contains("kinformer_controller_dropped_keys_total{"),
        "{text}"
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_crash_policy_a_panic_stops_the_controller_with_an_error() {
    let (client, ns) = setup("crash").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let probe = Arc::new(Probe {
        panic_for: Some("bad".into()),
        ..Probe::default()
    });
    let options = ControllerOptions::new().panic_policy(PanicPolicy::Crash);
    let controller =
        Controller::new("crash", informer::<ConfigMap>(&client, &ns), probe, options).unwrap();
    let task = tokio::spawn(controller.run(CancellationToken::new()));
    api.create(&PostParams::default(), &config_map("bad"))
        .await
        .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap();
    match result {
        Err(ControllerError::ReconcilePanicked { key, message }) => {
            assert_eq!(key.as_str(), format!("{ns}/bad"));
            assert!(message.contains("probe panics"));
        }
        other => panic!("expected ReconcilePanicked, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_is_reconciled_by_two_of_eight_workers_at_once() {
    let (client, ns) = setup("workers").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for i in 0..4 {
        api.create(&PostParams::default(), &config_map(&format!("k{i}")))
            .await
            .unwrap();
    }
    let probe = Arc::new(Probe {
        delay: Duration::from_millis(15),
        ..Probe::default()
    });
    let options = ControllerOptions::new().workers(8);
    let controller = Controller::new(
        "workers",
        informer::<ConfigMap>(&client, &ns),
        Arc::clone(&probe),
        options,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move {
                for v in 1..=40 {
                    bump(&api, &format!("k{i}"), v).await;
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        probe.overlaps.load(Ordering::SeqCst),
        0,
        "a key was reconciled by two workers at once"
    );
    let total: usize = probe.calls.lock().values().sum();
    assert!(
        total >= 8,
        "every key was reconciled, and again after its updates ({total} calls)"
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// One reconcile of one replica, from its start until it returned or was
/// dropped (aborted).
#[derive(Debug, Clone)]
struct Interval {
    replica: usize,
    key: String,
    start: std::time::Instant,
    end: std::time::Instant,
}

type Intervals = Arc<Mutex<Vec<Interval>>>;

/// Records every reconcile as an interval; `slow` takes far longer than the
/// others, so it is in flight when leadership moves.
struct Recorder {
    replica: usize,
    log: Intervals,
}

/// Pushes the interval when the reconcile future ends, however it ends.
struct Recording {
    replica: usize,
    key: String,
    start: std::time::Instant,
    log: Intervals,
}

impl Drop for Recording {
    fn drop(&mut self) {
        self.log.lock().push(Interval {
            replica: self.replica,
            key: std::mem::take(&mut self.key),
            start: self.start,
            end: std::time::Instant::now(),
        });
    }
}

impl Reconciler for Recorder {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let key = request.key.as_str();
        Box::pin(async move {
            let _recording = Recording {
                replica: self.replica,
                key: key.to_owned(),
                start: std::time::Instant::now(),
                log: Arc::clone(&self.log),
            };
            let slow = key.ends_with("/slow");
            tokio::time::sleep(Duration::from_millis(if slow { 4000 } else { 150 })).await;
            // The slow key keeps coming back, so it is in flight at any moment.
            Ok(if slow {
                Action::RequeueAfter(Duration::ZERO)
            } else {
                Action::Done
            })
        })
    }
}

struct Replica {
    elector: Arc<LeaderElector>,
    proxy: kinformer_envtest::Proxy,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), ControllerError>>,
}

async fn replica(env: &TestEnv, ns: &str, id: usize, log: &Intervals) -> Replica {
    let proxy = kinformer_envtest::Proxy::start(env.api_port())
        .await
        .unwrap();
    let client = env.client_via(proxy.port()).unwrap();
    let mut config = LeaderElectionConfig::new("handover")
        .namespace(ns)
        .identity(&format!("replica-{id}"));
    config.lease_duration = Duration::from_secs(3);
    config.renew_deadline = Duration::from_secs(2);
    config.retry_period = Duration::from_millis(500);
    let elector = Arc::new(LeaderElector::new(client.clone(), config));
    let recorder = Recorder {
        replica: id,
        log: Arc::clone(log),
    };
    let options = ControllerOptions::new()
        .workers(2)
        .drain_timeout(Duration::from_secs(20))
        .leader_election(Arc::clone(&elector));
    let controller = Controller::new(
        "handover",
        informer::<ConfigMap>(&client, ns),
        recorder,
        options,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    Replica {
        elector,
        proxy,
        shutdown,
        task,
    }
}

fn reconciles_of(log: &Intervals, replica: usize) -> usize {
    log.lock().iter().filter(|i| i.replica == replica).count()
}

/// Pairs of reconciles of one key by two replicas whose intervals overlap.
fn overlaps(log: &Intervals) -> Vec<(Interval, Interval)> {
    let log = log.lock();
    let mut found = Vec::new();
    for (n, a) in log.iter().enumerate() {
        for b in &log[n + 1..] {
            if a.replica != b.replica && a.key == b.key && a.start < b.end && b.start < a.end {
                found.push((a.clone(), b.clone()));
            }
        }
    }
    found
}

async fn leader_among(replicas: &[Option<Replica>]) -> usize {
    let mut index = None;
    eventually("a leader", async || {
        index = replicas
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.elector.is_leader()));
        index.is_some()
    })
    .await;
    index.unwrap()
}

/// Campaigns as `standby` for `lease`, trying again every 40 s (a 60 s
/// lease), until the test ends: what it does sooner than 40 s it does on
/// what its watch of the Lease tells it.
fn slow_standby(
    client: &Client,
    ns: &str,
    lease: &str,
) -> (Arc<LeaderElector>, tokio::sync::watch::Receiver<bool>) {
    let mut config = LeaderElectionConfig::new(lease)
        .namespace(ns)
        .identity("standby");
    (config.lease_duration, config.renew_deadline) =
        (Duration::from_secs(60), Duration::from_secs(50));
    config.retry_period = Duration::from_secs(40);
    let standby = Arc::new(LeaderElector::new(client.clone(), config));
    let leads = standby.subscribe();
    tokio::spawn({
        let standby = Arc::clone(&standby);
        async move { standby.run(CancellationToken::new()).await }
    });
    (standby, leads)
}

/// A standby follows the Lease with a watch while it waits: it sees a new
/// holder, then a release, as they are written (its next read is 40 s or
/// more away, the lease 3 600 s long), and takes the released lease at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_sees_lease_changes_as_they_are_written_and_takes_a_released_lease_at_once() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("watched").await.unwrap();
    let client = env.client().unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let held_by = |holder: Option<&str>| LeaseSpec {
        holder_identity: holder.map(str::to_owned),
        lease_duration_seconds: Some(3600),
        renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        ..LeaseSpec::default()
    };
    let mut lease = Lease {
        metadata: kube_client::api::ObjectMeta {
            name: Some("watched".into()),
            ..Default::default()
        },
        spec: Some(held_by(Some("a"))),
    };
    lease = leases.create(&PostParams::default(), &lease).await.unwrap();
    let (standby, mut leads) = slow_standby(&client, &ns, "watched");
    eventually("the standby read the lease", async || {
        standby.leader().as_deref() == Some("a")
    })
    .await;
    lease.spec = Some(held_by(Some("b")));
    lease = leases
        .replace("watched", &PostParams::default(), &lease)
        .await
        .unwrap();
    eventually("the standby saw the new holder", async || {
        standby.leader().as_deref() == Some("b")
    })
    .await;
    assert!(!standby.is_leader());
    lease.spec = Some(held_by(None));
    leases
        .replace("watched", &PostParams::default(), &lease)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), leads.wait_for(|l| *l))
        .await
        .expect("the standby waited for its next retry (40 s or more), not for the release it saw")
        .unwrap();
    assert_eq!(standby.leader().as_deref(), Some("standby"));
}

/// A standby whose retry period is far longer than the lease takes a dead
/// leader's lease when that lease expires, not at its next retry: it waits
/// for the expiry of the lease it saw (whose renewals it follows with a
/// watch). With client-go's polling alone it would wait 40 s or more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_a_dead_leaders_lease_when_it_expires_not_at_its_next_retry() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("expiry").await.unwrap();
    let client = env.client().unwrap();
    let mut leader = LeaderElectionConfig::new("expiry")
        .namespace(&ns)
        .identity("leader");
    (leader.lease_duration, leader.renew_deadline) =
        (Duration::from_secs(3), Duration::from_secs(2));
    leader.retry_period = Duration::from_millis(500);
    let leader = Arc::new(LeaderElector::new(client.clone(), leader));
    let leading = tokio::spawn({
        let leader = Arc::clone(&leader);
        async move { leader.run(CancellationToken::new()).await }
    });
    leader.subscribe().wait_for(|l| *l).await.unwrap();

    let (_standby, mut standby_leads) = slow_standby(&client, &ns, "expiry");
    // Dies: no more renewals, and no release.
    leading.abort();
    tokio::time::timeout(Duration::from_secs(20), standby_leads.wait_for(|l| *l))
        .await
        .expect(
            "the standby waited for its next retry (40 s or more), not for the 3 s lease to expire",
        )
        .unwrap();
}

/// Samples two candidates' `may_work()` every millisecond until `stop`:
/// how many samples found both true.
fn double_work(
    a: &Arc<LeaderElector>,
    b: &Arc<LeaderElector>,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<usize> {
    let (a, b, stop) = (Arc::clone(a), Arc::clone(b), stop.clone());
    tokio::spawn(async move {
        let mut both = 0;
        while !stop.is_cancelled() {
            both += usize::from(a.may_work() && b.may_work());
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        both
    })
}

/// Whether `elector` ever leads, until the test ends.
fn ever_leads(elector: &LeaderElector) -> Arc<std::sync::atomic::AtomicBool> {
    let led = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut leads = elector.subscribe();
    tokio::spawn({
        let led = Arc::clone(&led);
        async move {
            if leads.wait_for(|l| *l).await.is_ok() {
                led.store(true, Ordering::SeqCst);
            }
        }
    });
    led
}

fn candidate(
    client: &Client,
    ns: &str,
    lease: &str,
    id: &str,
    (lease_ms, renew_ms, retry_ms): (u64, u64, u64),
) -> Arc<LeaderElector> {
    let mut config = LeaderElectionConfig::new(lease).namespace(ns).identity(id);
    config.lease_duration = Duration::from_millis(lease_ms);
    config.renew_deadline = Duration::from_millis(renew_ms);
    config.retry_period = Duration::from_millis(retry_ms);
    let elector = Arc::new(LeaderElector::new(client.clone(), config));
    tokio::spawn({
        let elector = Arc::clone(&elector);
        async move { elector.run(CancellationToken::new()).await }
    });
    elector
}

/// A Lease deleted under its leader (`kubectl delete lease`), then deleted
/// again and restored from a backup, stays with that leader: the leader
/// re-creates it at its next renewal, and a standby that saw the deletion
/// on its watch treats it as held instead of creating it at once. The two
/// are never both allowed to work. Before the fix the standby led within
/// milliseconds of the deletion, beside the leader, until the leader's next
/// renewal (up to its 2 s retry period).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_stays_with_its_leader_and_a_watching_standby_never_works_beside_it() {
    use k8s_openapi::api::coordination::v1::Lease;
    let (client, ns) = setup("deleted-lease").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let timings = (15_000, 10_000, 2_000); // client-go's
    let leader = candidate(&client, &ns, "deleted", "leader", timings);
    leader.subscribe().wait_for(|l| *l).await.unwrap();
    let standby = candidate(&client, &ns, "deleted", "standby", timings);
    let standby_led = ever_leads(&standby);
    eventually("the standby saw the leader", async || {
        standby.leader().as_deref() == Some("leader")
    })
    .await;
    let stop = CancellationToken::new();
    let both = double_work(&leader, &standby, &stop);
    let holder = async |leases: &Api<Lease>| {
        leases
            .get_opt("deleted")
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
    };

    // Deleted: the leader re-creates it.
    let backup = leases.get("deleted").await.unwrap();
    leases
        .delete("deleted", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the leader re-created the Lease", async || {
        holder(&leases).await.as_deref() == Some("leader")
    })
    .await;

    // Deleted and at once restored from a backup: the leader renews it.
    leases
        .delete("deleted", &DeleteParams::default())
        .await
        .unwrap();
    let mut restored = backup.clone();
    restored.metadata = kube_client::api::ObjectMeta {
        name: backup.metadata.name.clone(),
        ..Default::default()
    };
    leases
        .create(&PostParams::default(), &restored)
        .await
        .unwrap();
    let stale = backup.spec.as_ref().and_then(|s| s.renew_time.clone());
    eventually("the leader renewed the restored Lease", async || {
        let lease = leases.get("deleted").await.unwrap();
        let spec = lease.spec.unwrap_or_default();
        spec.holder_identity.as_deref() == Some("leader") && spec.renew_time != stale
    })
    .await;

    stop.cancel();
    let both = both.await.unwrap();
    assert_eq!(both, 0, "ms sampled with both candidates allowed to work");
    assert!(
        !standby_led.load(Ordering::SeqCst),
        "the standby led while the leader was renewing"
    );
    assert!(leader.is_leader() && leader.may_work());
}

/// A leader cut off from the server while its Lease is deleted cannot
/// re-create it; a standby that saw the deletion takes over only once the
/// old leader's lease is over (a lease duration after the deletion), never
/// while the old leader may still work, also when the Lease is at once
/// re-created empty (a manifest applied again) or with a stranger's record
/// of one second (a hostile restore). Before the fix the standby took the
/// deleted lease at once; before the second, it took the empty one at once
/// and the stranger's after one second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_a_deleted_lease_only_after_the_cut_off_leader_stopped_working() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    let env = TestEnv::shared().await.unwrap();
    let client = env.client().unwrap();
    let stranger = LeaseSpec {
        holder_identity: Some("stranger".into()),
        lease_duration_seconds: Some(1),
        ..LeaseSpec::default()
    };
    for recreated in [None, Some(LeaseSpec::default()), Some(stranger)] {
        let ns = env.create_namespace("cut-deleted").await.unwrap();
        let proxy = kinformer_envtest::Proxy::start(env.api_port())
            .await
            .unwrap();
        let timings = (3_000, 2_000, 500);
        let leader = candidate(
            &env.client_via(proxy.port()).unwrap(),
            &ns,
            "cut",
            "leader",
            timings,
        );
        leader.subscribe().wait_for(|l| *l).await.unwrap();
        let standby = candidate(&client, &ns, "cut", "standby", timings);
        eventually("the standby saw the leader", async || {
            standby.leader().as_deref() == Some("leader")
        })
        .await;
        let stop = CancellationToken::new();
        let both = double_work(&leader, &standby, &stop);

        proxy.blackhole(true);
        let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
        leases
            .delete("cut", &DeleteParams::default())
            .await
            .unwrap();
        if let Some(spec) = &recreated {
            let lease = Lease {
                metadata: kube_client::api::ObjectMeta {
                    name: Some("cut".into()),
                    ..Default::default()
                },
                spec: Some(spec.clone()),
            };
            leases.create(&PostParams::default(), &lease).await.unwrap();
        }
        tokio::time::timeout(
            Duration::from_secs(20),
            standby.subscribe().wait_for(|l| *l),
        )
        .await
        .expect("the standby takes the deleted lease once it is over")
        .unwrap();
        // The direct proof, whatever the sampling: the standby's acquiring
        // write was sent after the old leader's last safe instant.
        let acquired = standby.lease_valid_until().unwrap() - Duration::from_millis(timings.0);
        let old_safe = leader.safe_until().unwrap();
        stop.cancel();
        let both = both.await.unwrap();
        assert!(
            acquired >= old_safe,
            "re-created as {recreated:?}: the standby acquired {:?} before the old leader's lease was safely over",
            old_safe - acquired
        );
        assert_eq!(
            both, 0,
            "re-created as {recreated:?}: ms sampled with both candidates allowed to work"
        );
    }
}

/// A leader whose renewals the API server refuses (RBAC lets it create and
/// read the Lease, not update it) stops working within its renew deadline,
/// before a standby can take the lease: the two are never both allowed to
/// work, and the refused leader's `run` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_renewals_are_refused_stops_before_a_standby_takes_over() {
    let (admin, ns) = setup("refused-renewal").await;
    let refused = client_allowed_only(
        &admin,
        &ns,
        ("lease-no-update", "kinformer-lease-no-update"),
        ("coordination.k8s.io", "leases"),
        &["create", "get", "list", "watch"],
    )
    .await;

    let timings = (3_000, 2_000, 500);
    let leader = candidate(&refused, &ns, "refused", "leader", timings);
    leader.subscribe().wait_for(|l| *l).await.unwrap();
    let standby = candidate(&admin, &ns, "refused", "standby", timings);
    let stop = CancellationToken::new();
    let both = double_work(&leader, &standby, &stop);
    tokio::time::timeout(
        Duration::from_secs(20),
        standby.subscribe().wait_for(|l| *l),
    )
    .await
    .expect("the standby takes the lease its refused leader could not renew")
    .unwrap();
    assert!(!leader.is_leader(), "the refused leader still leads");
    stop.cancel();
    assert_eq!(
        both.await.unwrap(),
        0,
        "ms sampled with both candidates allowed to work"
    );
}

/// A Lease renewed by a host whose clock is an hour ahead or behind is
/// timed on the candidate's own clock: it is taken no sooner than its
/// duration after the candidate first saw it, and not an hour late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_written_by_a_host_whose_clock_differs_is_timed_on_the_candidates_own_clock() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let (client, ns) = setup("skewed").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    for (name, skew) in [("ahead", 3600), ("behind", -3600)] {
        let written = tokio::time::Instant::now();
        let renewed = k8s_openapi::jiff::Timestamp::now()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(skew))
            .unwrap();
        let lease = Lease {
            metadata: kube_client::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("other-host".into()),
                lease_duration_seconds: Some(2),
                renew_time: Some(MicroTime(renewed)),
                acquire_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
        };
        leases.create(&PostParams::default(), &lease).await.unwrap();
        let standby = candidate(&client, &ns, name, "standby", (3_000, 2_000, 500));
        tokio::time::timeout(
            Duration::from_secs(20),
            standby.subscribe().wait_for(|l| *l),
        )
        .await
        .unwrap_or_else(|_| panic!("a lease renewed {skew} s off was not taken in time"))
        .unwrap();
        let acquired = standby.lease_valid_until().unwrap() - Duration::from_secs(3);
        assert!(
            acquired >= written + Duration::from_secs(2),
            "a lease renewed {skew} s off was taken {:?} after it was written",
            acquired - written
        );
    }
}

/// A candidate that released its lease on shutdown no longer names itself
/// as the leader (client-go records the release as observed). Before the
/// fix `leader()` still named it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_that_released_its_lease_names_no_leader() {
    let (client, ns) = setup("released").await;
    let mut config = LeaderElectionConfig::new("released")
        .namespace(&ns)
        .identity("me");
    config.retry_period = Duration::from_millis(500);
    let elector = Arc::new(LeaderElector::new(client, config));
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (elector, shutdown) = (Arc::clone(&elector), shutdown.clone());
        async move { elector.run(shutdown).await }
    });
    elector.subscribe().wait_for(|l| *l).await.unwrap();
    assert_eq!(elector.leader().as_deref(), Some("me"));
    shutdown.cancel();
    run.await.unwrap();
    assert!(!elector.may_work());
    assert_eq!(elector.leader(), None, "the release was not recorded");
}

/// Two replicas under a steady write load hand leadership over twice: once
/// when the leader gets SIGTERM (it drains, then releases the lease), once
/// when the leader is cut off from the server until its lease expires (it
/// stops taking keys and aborts its in-flight reconciles in time). Then the
/// Lease is deleted under the leader, and deleted and restored from a
/// backup, while another replica waits: leadership stays put. No key is
/// ever reconciled by two replicas at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_hands_over_on_sigterm_on_a_cut_off_leader_and_survives_lease_deletion_without_overlapping_reconciles()
 {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("handover").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().unwrap(), &ns);
    let names: Vec<String> = (0..24)
        .map(|i| format!("k{i}"))
        .chain(["slow".into()])
        .collect();
    for name in &names {
        api.create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    let load_stop = CancellationToken::new();
    let load = {
        let (api, names, load_stop) = (api.clone(), names.clone(), load_stop.clone());
        tokio::spawn(async move {
            let mut v = 0;
            while !load_stop.is_cancelled() {
                v += 1;
                bump(&api, &names[v % names.len()], v).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let log: Intervals = Arc::default();
    let mut replicas = vec![
        Some(replica(env, &ns, 0, &log).await),
        Some(replica(env, &ns, 1, &log).await),
        None,
    ];

    // (a) SIGTERM of the leader under load: it drains its queue while still
    // renewing, then releases the lease; only then may the standby lead.
    let first = leader_among(&replicas).await;
    eventually("the first leader works", async || {
        reconciles_of(&log, first) >= 10
    })
    .await;
    let old = replicas[first].take().unwrap();
    old.shutdown.cancel();
    let second = leader_among(&replicas).await;
    let stopped = tokio::time::timeout(Duration::from_secs(60), old.task)
        .await
        .expect("a leader stopped by SIGTERM returns")
        .unwrap();
    assert!(stopped.is_ok(), "SIGTERM is a clean stop: {stopped:?}");
    eventually("the second leader works", async || {
        reconciles_of(&log, second) >= 10
    })
    .await;

    // (b) The leader is cut off from the server: its renewals hang until the
    // lease expires; a fresh standby takes over.
    replicas[2] = Some(replica(env, &ns, 2, &log).await);
    let cut = replicas[second].take().unwrap();
    cut.proxy.blackhole(true);
    let third = leader_among(&replicas).await;
    assert_eq!(third, 2);
    let lost = tokio::time::timeout(Duration::from_secs(60), cut.task)
        .await
        .expect("a cut-off leader returns")
        .unwrap();
    assert!(
        matches!(lost, Err(ControllerError::LostLeadership)),
        "a cut-off leader reports the lost lease: {lost:?}"
    );
    // The direct proof, whatever the standby's timing: every reconcile of
    // the cut-off leader ended while its lease was still its own.
    let valid_until = cut.elector.lease_valid_until().unwrap().into_std();
    let late: Vec<_> = log
        .lock()
        .iter()
        .filter(|i| i.replica == second && i.end >= valid_until)
        .cloned()
        .collect();
    assert!(late.is_empty(), "reconciles outlived the lease: {late:#?}");
    eventually("the third leader works", async || {
        reconciles_of(&log, third) >= 10
    })
    .await;

    // (c) The Lease is deleted in the middle of leadership, then deleted
    // and at once restored from a backup, while a fourth replica waits:
    // the leader keeps it, and the two are never both allowed to work.
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(env.client().unwrap(), &ns);
    replicas.push(Some(replica(env, &ns, 3, &log).await));
    let (leading, waiting) = (
        Arc::clone(&replicas[2].as_ref().unwrap().elector),
        Arc::clone(&replicas[3].as_ref().unwrap().elector),
    );
    eventually("the fourth replica saw the leader", async || {
        waiting.leader().as_deref() == Some("replica-2")
    })
    .await;
    let stop_sampling = CancellationToken::new();
    let both = double_work(&leading, &waiting, &stop_sampling);
    for restore in [false, true] {
        let mut backup = leases.get("handover").await.unwrap();
        leases
            .delete("handover", &DeleteParams::default())
            .await
            .unwrap();
        if restore {
            // The leader may create the Lease anew between the delete and
            // the restore (409 AlreadyExists): then this restore did not
            // happen, so take a new backup and try again until it does.
            let mut attempts = 0;
            loop {
                let mut restored = backup.clone();
                restored.metadata = kube_client::api::ObjectMeta {
                    name: backup.metadata.name.clone(),
                    ..Default::default()
                };
                match leases.create(&PostParams::default(), &restored).await {
                    Ok(_) => break,
                    Err(kube_client::Error::Api(status)) if status.code == 409 => {
                        attempts += 1;
                        assert!(attempts < 20, "the Lease could not be restored: {status:?}");
                        backup = leases.get("handover").await.unwrap();
                        leases
                            .delete("handover", &DeleteParams::default())
                            .await
                            .unwrap();
                    }
                    Err(e) => panic!("restoring the Lease: {e}"),
                }
            }
        }
        let before = reconciles_of(&log, 2);
        eventually("the leader renewed the Lease again and works", async || {
            let spec = leases
                .get_opt("handover")
                .await
                .unwrap()
                .and_then(|l| l.spec)
                .unwrap_or_default();
            spec.holder_identity.as_deref() == Some("replica-2")
                && spec.renew_time != backup.spec.as_ref().and_then(|s| s.renew_time.clone())
                && reconciles_of(&log, 2) >= before + 5
        })
        .await;
    }
    stop_sampling.cancel();
    assert_eq!(
        both.await.unwrap(),
        0,
        "ms sampled with two replicas allowed to work"
    );
    assert!(leading.is_leader() && !waiting.is_leader());
    assert_eq!(reconciles_of(&log, 3), 0, "the waiting replica reconciled");

    load_stop.cancel();
    load.await.unwrap();
    for last in [3, 2] {
        let last = replicas[last].take().unwrap();
        last.shutdown.cancel();
        last.task.await.unwrap().unwrap();
    }
    let overlapping = overlaps(&log);
    let total = log.lock().len();
    eprintln!(
        "handover: 2 handovers, 2 Lease deletions, {total} reconciles, {} overlapping",
        overlapping.len()
    );
    assert!(
        overlapping.is_empty(),
        "reconciles of one key by two replicas overlapped: {overlapping:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_endpoints_answer() {
    let (client, ns) = setup("metrics").await;
    let metrics = Metrics::new();
    let shutdown = CancellationToken::new();
    let addr = metrics
        .serve("127.0.0.1:0".parse().unwrap(), shutdown.clone())
        .await
        .unwrap();
    let get = |path: &'static str| http_get(addr, path);
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(
        get("/readyz").await.starts_with("HTTP/1.1 503"),
        "not ready before the caches sync"
    );
    let task = tokio::spawn(
        strategy_controller(&client, &ns, Some(Arc::clone(&metrics))).run(shutdown.clone()),
    );
    eventually("ready", async || {
        get("/readyz").await.starts_with("HTTP/1.1 200")
    })
    .await;
    let api: Api<Service> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &service("m", Some("blue")))
        .await
        .unwrap();
    eventually("a reconcile", async || {
        get("/metrics").await.contains("controller_runtime_reconcile_total{controller=\"service-strategy\",result=\"success\"}")
    })
    .await;
    let text = get("/metrics").await;
    for name in [
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds",
        "workqueue_work_duration_seconds",
        "workqueue_retries_total",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "controller_runtime_reconcile_time_seconds",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
    assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// Records how often it ran and the value it read last from the cache.
struct LastValue {
    lister: kinformer_informer::Lister<ConfigMap>,
    calls: AtomicUsize,
    last: Mutex<Option<String>>,
}

impl Reconciler for LastValue {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let key = request.key.as_str();
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let value = cached_value(&self.lister, key);
            *self.last.lock() = value;
            Ok(Action::Done)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_10000_updates_to_one_key_is_coalesced_and_the_final_state_reconciled() {
    use futures::StreamExt;
    let (client, ns) = setup("burst").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &config_map("hot"))
        .await
        .unwrap();
    let informer = informer::<ConfigMap>(&client, &ns);
    let reconciler = Arc::new(LastValue {
        lister: informer.lister(),
        calls: AtomicUsize::new(0),
        last: Mutex::new(None),
    });
    let controller = Controller::new(
        "burst",
        informer,
        Arc::clone(&reconciler),
        ControllerOptions::new(),
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    eventually("the first reconcile", async || {
        reconciler.calls.load(Ordering::SeqCst) >= 1
    })
    .await;
    futures::stream::iter(1..=10_000)
        .for_each_concurrent(16, |v| {
            let api = api.clone();
            async move { bump(&api, "hot", v).await }
        })
        .await;
    let patch = serde_json::json!({"data": {"v": "final"}});
    api.patch("hot", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    eventually("the final state reconciled", async || {
        reconciler.last.lock().as_deref() == Some("final")
    })
    .await;
    let calls = reconciler.calls.load(Ordering::SeqCst);
    assert!(
        calls < 10_000,
        "{calls} reconciles for 10 001 updates: not coalesced"
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// Hangs for ever on the key `stuck`; answers `then` for every other key.
struct Stuck {
    calls: Mutex<BTreeMap<String, usize>>,
    then: Action,
}

impl Stuck {
    fn new(then: Action) -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::default(),
            then,
        })
    }
    fn calls(&self, name: &str, ns: &str) -> usize {
        calls_of(&self.calls, name, ns)
    }
}

impl Reconciler for Stuck {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let key = request.key.as_str();
        Box::pin(async move {
            *self.calls.lock().entry(key.to_owned()).or_default() += 1;
            if key.ends_with("/stuck") {
                std::future::pending::<()>().await;
            }
            Ok(self.then)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_after_the_drain_timeout_even_if_a_reconcile_never_returns() {
    let (client, ns) = setup("stuck").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &config_map("stuck"))
        .await
        .unwrap();
    let stuck = Stuck::new(Action::Done);
    let metrics = Metrics::new();
    let serving = CancellationToken::new();
    let addr = metrics
        .serve("127.0.0.1:0".parse().unwrap(), serving.clone())
        .await
        .unwrap();
    let options = ControllerOptions::new()
        .drain_timeout(Duration::from_millis(500))
        .metrics(Arc::clone(&metrics));
    let controller = Controller::new(
        "stuck",
        informer::<ConfigMap>(&client, &ns),
        Arc::clone(&stuck),
        options,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    eventually("the stuck reconcile", async || {
        stuck.calls("stuck", &ns) == 1
    })
    .await;
    assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("run returns although a reconcile never does")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    for path in ["/healthz", "/readyz"] {
        let answer = http_get(addr, path).await;
        assert!(
            answer.starts_with("HTTP/1.1 503") && answer.ends_with("shutting down"),
            "{path} of a stopped controller: {answer}"
        );
    }
    serving.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_over_its_timeout_is_dropped_and_retried_as_an_error() {
    let (client, ns) = setup("timeout").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &config_map("stuck"))
        .await
        .unwrap();
    let stuck = Stuck::new(Action::Done);
    let metrics = Metrics::new();
    let options = ControllerOptions::new()
        .max_retries(2)
        .reconcile_timeout(Duration::from_millis(100))
        .metrics(Arc::clone(&metrics));
    let controller = Controller::new(
        "timeout",
        informer::<ConfigMap>(&client, &ns),
        Arc::clone(&stuck),
        options,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    // 1 attempt + 2 retries, each timed out, then dropped.
    eventually("three timed-out attempts", async || {
        metrics
            .encode()
            .contains("controller_runtime_reconcile_errors_total{controller=\"timeout\"} 3\n")
    })
    .await;
    assert_eq!(stuck.calls("stuck", &ns), 3);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_after_the_largest_duration_keeps_the_worker_and_the_key_alive() {
    let (client, ns) = setup("forever").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &config_map("k"))
        .await
        .unwrap();
    let forever = Stuck::new(Action::RequeueAfter(Duration::MAX));
    let options = ControllerOptions::new().workers(1);
    let controller = Controller::new(
        "forever",
        informer::<ConfigMap>(&client, &ns),
        Arc::clone(&forever),
        options,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    eventually("the first reconcile", async || forever.calls("k", &ns) == 1).await;
    // The one worker is still there and the key is not stuck "processing".
    bump(&api, "k", 1).await;
    eventually("the key reconciled again", async || {
        forever.calls("k", &ns) == 2
    })
    .await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// Blocks every reconcile until the test opens the gate.
struct Gated {
    lister: kinformer_informer::Lister<ConfigMap>,
    entered: AtomicUsize,
    gate: tokio::sync::Semaphore,
    seen: Mutex<Vec<Option<String>>>,
}

impl Reconciler for Gated {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let key = request.key.as_str();
        Box::pin(async move {
            self.entered.fetch_add(1, Ordering::SeqCst);
            self.gate.acquire().await?.forget();
            let value = cached_value(&self.lister, key);
            self.seen.lock().push(value);
            Ok(Action::Done)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_during_a_reconcile_are_coalesced_into_one_more_reconcile_of_the_latest_state() {
    let (client, ns) = setup("coalesce").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &config_map("k"))
        .await
        .unwrap();
    let informer = informer::<ConfigMap>(&client, &ns);
    let watching = informer.clone();
    let lister = informer.lister();
    let gated = Arc::new(Gated {
        lister: informer.lister(),
        entered: AtomicUsize::new(0),
        gate: tokio::sync::Semaphore::new(0),
        seen: Mutex::default(),
    });
    let controller = Controller::new(
        "coalesce",
        informer,
        Arc::clone(&gated),
        ControllerOptions::new().workers(4),
    )
    .unwrap();
    let queue = controller.queue().clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    eventually("the first reconcile held at the gate", async || {
        gated.entered.load(Ordering::SeqCst) == 1
    })
    .await;
    for v in 1..=20 {
        bump(&api, "k", v).await;
    }
    let key = format!("{ns}/k");
    eventually("every update handled by the controller", async || {
        cached_value(&lister, &key).as_deref() == Some("20")
            && watching.pending_notifications() == 0
    })
    .await;
    assert_eq!(
        queue.len(),
        0,
        "20 updates of a key being processed queue it once, after done"
    );
    gated.gate.add_permits(100);
    eventually("the second reconcile", async || {
        gated.seen.lock().len() == 2
    })
    .await;
    let seen = gated.seen.lock().clone();
    assert_eq!(seen[1].as_deref(), Some("20"), "it saw the latest state");
    assert_eq!(gated.entered.load(Ordering::SeqCst), 2, "{seen:?}");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// Panics while building its future, before any `.await`.
struct PanicsEarly;

impl Reconciler for PanicsEarly {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let key = request.key.as_str();
        if key.ends_with("/bad") {
            panic!("no future for {key}");
        }
        Box::pin(async { Ok(Action::Done) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_that_panics_before_returning_its_future_is_recovered_like_any_panic() {
    let (client, ns) = setup("early").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &config_map("bad"))
        .await
        .unwrap();
    let metrics = Metrics::new();
    let options = ControllerOptions::new()
        .workers(1)
        .max_retries(2)
        .metrics(Arc::clone(&metrics));
    let controller = Controller::new(
        "early",
        informer::<ConfigMap>(&client, &ns),
        PanicsEarly,
        options,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    eventually("three caught panics", async || {
        metrics
            .encode()
            .contains("controller_runtime_reconcile_panics_total{controller=\"early\"} 3\n")
    })
    .await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_crash_policy_no_key_is_started_after_the_panic() {
    let (client, ns) = setup("crashstop").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // Listed in name order: the panicking key comes first, 8 wait behind it.
    for name in ["a-bad", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"] {
        api.create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    let probe = Arc::new(Probe {
        panic_for: Some("a-bad".into()),
        delay: Duration::from_millis(50),
        ..Probe::default()
    });
    let options = ControllerOptions::new()
        .workers(1)
        .panic_policy(PanicPolicy::Crash);
    let controller = Controller::new(
        "crashstop",
        informer::<ConfigMap>(&client, &ns),
        Arc::clone(&probe),
        options,
    )
    .unwrap();
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        controller.run(CancellationToken::new()),
    )
    .await
    .expect("a crash ends run");
    assert!(
        matches!(result, Err(ControllerError::ReconcilePanicked { .. })),
        "{result:?}"
    );
    let started = probe.started.lock().clone();
    let bad = started
        .iter()
        .position(|k| k.ends_with("/a-bad"))
        .expect("the panicking key ran");
    assert_eq!(
        &started[bad + 1..],
        &[] as &[String],
        "keys started after the crash"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_that_cannot_work_are_rejected_with_an_error_naming_them() {
    let (client, ns) = setup("options").await;
    // Through the builder method too: 0 is not quietly turned into 1.
    let options = ControllerOptions::new().workers(0);
    let err = Controller::new(
        "zero",
        informer::<ConfigMap>(&client, &ns),
        Probe::default(),
        options,
    )
    .expect_err("0 workers is rejected");
    assert!(err.to_string().contains("workers is 0"), "{err}");

    let mut config = LeaderElectionConfig::new("lease")
        .namespace(&ns)
        .identity("me");
    config.renew_deadline = config.lease_duration;
    let elector = Arc::new(LeaderElector::new(client.clone(), config));
    let err = Controller::new(
        "lease",
        informer::<ConfigMap>(&client, &ns),
        Probe::default(),
        ControllerOptions::new().leader_election(elector),
    )
    .expect_err("a renew deadline equal to the lease is rejected");
    assert!(err.to_string().contains("renew deadline"), "{err}");

    let ring = kinformer_controllers::Ring::new(
        client.clone(),
        kinformer_controllers::RingConfig::new(&ns, "ring", "me"),
    )
    .unwrap();
    let err = Controller::new(
        "ring",
        informer::<ConfigMap>(&client, &ns),
        Probe::default(),
        ControllerOptions::new()
            .ring(ring)
            .reconcile_initial_list(false),
    )
    .expect_err("a ring without the initial list is rejected");
    assert!(
        err.to_string().contains("reconcile_initial_list(false)"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_event_becomes_one_event_with_a_series_instead_of_a_flood() {
    use k8s_openapi::api::events::v1::Event as EventV1;
    use kinformer_controllers::{EventRecorder, EventType, NewEvent};
    let (client, ns) = setup("events").await;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &config_map("noisy"))
        .await
        .unwrap();
    let regarding = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        namespace: Some(ns.clone()),
        name: Some("noisy".into()),
        uid: cm.metadata.uid.clone(),
        ..Default::default()
    };
    let recorder = EventRecorder::new(client.clone(), "kinformer.dev/test", "test-0")
        .series_interval(Duration::from_secs(3600));
    // A hot loop: 100 identical failures, and one different one.
    for _ in 0..100 {
        recorder
            .publish(
                &regarding,
                NewEvent {
                    type_: EventType::Warning,
                    reason: "SyncFailed",
                    action: "Sync",
                    note: "boom",
                },
            )
            .await
            .unwrap();
    }
    recorder
        .publish(
            &regarding,
            NewEvent {
                type_: EventType::Warning,
                reason: "SyncFailed",
                action: "Sync",
                note: "other",
            },
        )
        .await
        .unwrap();
    assert_eq!(recorder.writes(), 2, "one create per distinct event");
    recorder.flush().await.unwrap();
    assert_eq!(recorder.writes(), 3, "one series write for the 99 repeats");

    let events: Vec<EventV1> = Api::<EventV1>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(events.len(), 2, "{events:#?}");
    let boom = events
        .iter()
        .find(|e| e.note.as_deref() == Some("boom"))
        .unwrap();
    assert_eq!(boom.series.as_ref().map(|s| s.count), Some(100));
    assert_eq!(boom.type_.as_deref(), Some("Warning"));
    assert_eq!(
        boom.reporting_controller.as_deref(),
        Some("kinformer.dev/test")
    );
    assert_eq!(
        boom.regarding.as_ref().and_then(|r| r.uid.clone()),
        cm.metadata.uid
    );
    let other = events
        .iter()
        .find(|e| e.note.as_deref() == Some("other"))
        .unwrap();
    assert!(other.series.is_none(), "a single occurrence has no series");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_finalizer_helper_adds_the_finalizer_applies_then_cleans_up_before_deletion() {
    use kinformer_controllers::{FinalizerEvent, finalizer};
    const NAME: &str = "kinformer.dev/cleanup";
    let (client, ns) = setup("finalizer").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut cm = config_map("guarded");
    // Someone else's finalizer, which must survive our writes.
    cm.metadata.finalizers = Some(vec!["other.dev/keep".into()]);
    api.create(&PostParams::default(), &cm).await.unwrap();
    let log = Mutex::new(Vec::<String>::new());
    let step = async |log: &Mutex<Vec<String>>| {
        let obj = Arc::new(api.get("guarded").await.unwrap());
        finalizer(&api, NAME, obj, async |event| {
            log.lock().push(match event {
                FinalizerEvent::Apply(_) => "apply".into(),
                FinalizerEvent::Cleanup(_) => "cleanup".into(),
            });
            Ok(Action::Done)
        })
        .await
        .unwrap()
    };
    // 1: the finalizer is added, and the object as written applied.
    step(&log).await;
    let finalizers = api.get("guarded").await.unwrap().metadata.finalizers;
    assert_eq!(
        finalizers,
        Some(vec!["other.dev/keep".to_owned(), NAME.to_owned()])
    );
    assert_eq!(*log.lock(), ["apply"]);
    // 2: with it in place, apply.
    step(&log).await;
    assert_eq!(*log.lock(), ["apply", "apply"]);
    // 3: deleted: the object stays (finalizers), cleanup runs, ours goes.
    api.delete("guarded", &DeleteParams::default())
        .await
        .unwrap();
    step(&log).await;
    assert_eq!(*log.lock(), ["apply", "apply", "cleanup"]);
    let left = api.get("guarded").await.unwrap();
    assert!(left.metadata.deletion_timestamp.is_some());
    assert_eq!(
        left.metadata.finalizers,
        Some(vec!["other.dev/keep".to_owned()])
    );
    // 4: still being deleted, our finalizer gone: nothing more runs.
    step(&log).await;
    assert_eq!(log.lock().len(), 3);

    // A write from a stale copy fails instead of overwriting.
    api.create(&PostParams::default(), &config_map("stale"))
        .await
        .unwrap();
    let stale = api.get("stale").await.unwrap();
    bump(&api, "stale", 1).await;
    let err = finalizer(&api, NAME, Arc::new(stale), async |_| Ok(Action::Done))
        .await
        .expect_err("a stale copy conflicts");
    // The object is named in the message; the server's 409 is its source.
    let said = kinformer_controllers::error_chain(&err);
    assert!(
        err.to_string().contains("cannot add finalizer") && !err.to_string().contains("409"),
        "{err}"
    );
    assert!(
        said.contains("409 Conflict") && kinformer_controllers::is_conflict(&err),
        "{said}"
    );
    // Let the guarded object go.
    api.patch(
        "guarded",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

/// Reconciles ConfigMaps; records whether the owned Secret was cached at
/// each reconcile of `parent`, and fails `bad` terminally.
struct Owner {
    secrets: kinformer_informer::Lister<k8s_openapi::api::core::v1::Secret>,
    calls: Mutex<BTreeMap<String, usize>>,
    child_seen: Mutex<Vec<bool>>,
}

impl Reconciler for Owner {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let key = request.key.as_str();
        Box::pin(async move {
            *self.calls.lock().entry(key.to_owned()).or_default() += 1;
            let (ns, name) = key.split_once('/').unwrap();
            if name == "bad" {
                return Err(kinformer_controllers::TerminalError::boxed(
                    "the spec cannot work",
                ));
            }
            if name == "parent" {
                let seen = self.secrets.namespaced(ns).get("child").is_some();
                self.child_seen.lock().push(seen);
            }
            Ok(Action::Done)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_and_watched_objects_enqueue_their_owner_after_every_cache_has_synced() {
    use k8s_openapi::api::core::v1::Secret;
    let (client, ns) = setup("owns").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let parent = cms
        .create(&PostParams::default(), &config_map("parent"))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &config_map("bad"))
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let child: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "child", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "parent",
            "uid": parent.metadata.uid, "controller": true
        }]},
        "stringData": {"k": "0"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &child)
        .await
        .unwrap();

    let secret_informer = informer::<Secret>(&client, &ns);
    let service_informer = informer::<Service>(&client, &ns);
    let owner = Arc::new(Owner {
        secrets: secret_informer.lister(),
        calls: Mutex::default(),
        child_seen: Mutex::default(),
    });
    let metrics = Metrics::new();
    let controller = Controller::new(
        "owns",
        informer::<ConfigMap>(&client, &ns),
        Arc::clone(&owner),
        ControllerOptions::new().metrics(Arc::clone(&metrics)),
    )
    .unwrap()
    .owns(secret_informer)
    .unwrap()
    .watches(service_informer, |svc: &Service| {
        let for_ = svc.metadata.labels.as_ref().and_then(|l| l.get("for"));
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        for_.map(|owner| vec![ObjectKey::namespaced(&ns, owner).unwrap()])
            .unwrap_or_default()
    })
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    let key = format!("{ns}/parent");
    let calls = |k: &str| owner.calls.lock().get(k).copied().unwrap_or(0);
    eventually("the first reconcile", async || calls(&key) >= 1).await;
    assert!(
        owner.child_seen.lock()[0],
        "the owned Secret's cache had synced before the first reconcile"
    );

    // An update of the owned Secret reconciles its owner.
    let before = calls(&key);
    let patch = serde_json::json!({"stringData": {"k": "1"}});
    secrets
        .patch("child", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    eventually("the owner reconciled for its Secret", async || {
        calls(&key) > before
    })
    .await;

    // A watched Service maps to the owner through its label.
    let before = calls(&key);
    let mut svc = service("front", None);
    svc.metadata.labels = Some([("for".to_owned(), "parent".to_owned())].into());
    Api::<Service>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    eventually("the owner reconciled for the Service", async || {
        calls(&key) > before
    })
    .await;

    // A terminal error is counted and not retried.
    eventually("the terminal error counted", async || {
        metrics
            .encode()
            .contains("controller_runtime_terminal_reconcile_errors_total{controller=\"owns\"} 1\n")
    })
    .await;
    let text = metrics.encode();
    assert!(
        text.contains("workqueue_retries_total{name=\"owns\"} 0\n"),
        "a terminal error was retried: {text}"
    );
    assert_eq!(calls(&format!("{ns}/bad")), 1);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closure_reconciler_gets_the_cached_object_and_then_that_it_is_gone() {
    use kinformer_controllers::Lookup;
    let (client, ns) = setup("fn").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &config_map("c"))
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = Arc::clone(&seen);
    let controller = Controller::from_fn(
        "fn",
        informer::<ConfigMap>(&client, &ns),
        move |lookup: Lookup<ConfigMap>| {
            let log = Arc::clone(&log);
            async move {
                log.lock().push(match lookup {
                    Lookup::Found(cm) => format!("found {}", cm.metadata.name.as_deref().unwrap()),
                    Lookup::Gone { key } => format!("gone {key}"),
                });
                Ok(Action::Done)
            }
        },
        ControllerOptions::new(),
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    eventually("found", async || {
        seen.lock().contains(&"found c".to_owned())
    })
    .await;
    api.delete("c", &DeleteParams::default()).await.unwrap();
    let gone = format!("gone {ns}/c");
    eventually("gone", async || seen.lock().contains(&gone)).await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_finalizer_helper_applies_even_when_an_event_filter_drops_its_own_update() {
    use kinformer_controllers::{FinalizerEvent, Lookup, finalizer, predicate};
    use kinformer_informer::SharedInformerFactory;
    let (client, ns) = setup("finalizer-filter").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let factory = SharedInformerFactory::new(client.clone()).namespace(ns.clone());
    let applied: Arc<Mutex<Vec<String>>> = Arc::default();
    // The finalizer's write changes no generation: generation_changed
    // drops the update it causes, which was what brought the object back
    // for Apply.
    let controller = Controller::<ConfigMap>::builder("guarded", &factory)
        .with_event_filter(predicate::generation_changed)
        .reconcile(
            Arc::new((api.clone(), Arc::clone(&applied))),
            |cm, ctx| async move {
                let Lookup::Found(cm) = cm else {
                    return Ok(Action::Done);
                };
                let action = finalizer(&ctx.0, "kinformer.dev/cleanup", cm, async |event| {
                    if let FinalizerEvent::Apply(obj) = event {
                        ctx.1
                            .lock()
                            .push(obj.metadata.name.clone().unwrap_or_default());
                    }
                    Ok(Action::Done)
                })
                .await?;
                Ok(action)
            },
        )
        .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    api.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    eventually("the object applied", async || {
        applied.lock().contains(&"a".to_owned())
    })
    .await;
    let written = api.get("a").await.unwrap();
    assert_eq!(
        written.metadata.finalizers,
        Some(vec!["kinformer.dev/cleanup".to_owned()])
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
    // Let the object go.
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

/// Records the order keys are reconciled in; the first reconcile waits at
/// the gate.
struct InOrder {
    first: Mutex<Option<String>>,
    gate: tokio::sync::Semaphore,
    order: Mutex<Vec<String>>,
}

impl Reconciler for InOrder {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let key = request.key.as_str();
        Box::pin(async move {
            let gated = {
                let mut first = self.first.lock();
                first
                    .is_none()
                    .then(|| *first = Some(key.to_owned()))
                    .is_some()
            };
            if gated {
                self.gate.acquire().await?.forget();
            }
            self.order.lock().push(key.to_owned());
            Ok(Action::Done)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_changes_are_reconciled_before_the_rest_of_the_initial_list() {
    let (client, ns) = setup("priority").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for i in 0..50 {
        api.create(&PostParams::default(), &config_map(&format!("old-{i:02}")))
            .await
            .unwrap();
    }
    let informer = informer::<ConfigMap>(&client, &ns);
    let watching = informer.clone();
    let lister = informer.lister();
    let reconciler = Arc::new(InOrder {
        first: Mutex::default(),
        gate: tokio::sync::Semaphore::new(0),
        order: Mutex::default(),
    });
    // One worker, and an aging far beyond the test's length: the order
    // alone is what is checked.
    let controller = Controller::new(
        "priority",
        informer,
        Arc::clone(&reconciler),
        ControllerOptions::new()
            .workers(1)
            .priority_aging(Duration::from_secs(3600)),
    )
    .unwrap();
    let queue = controller.queue().clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    eventually(
        "the first reconcile held, the rest of the list queued",
        async || {
            reconciler.first.lock().is_some()
                && watching.pending_notifications() == 0
                && queue.len() == 49
        },
    )
    .await;
    assert_eq!(queue.len_at(Priority::Low), 49, "the initial list is low");
    // A new object, and an update of one the initial list queued (raised).
    let first = reconciler.first.lock().clone().unwrap();
    let updated = if first.ends_with("old-49") {
        "old-48"
    } else {
        "old-49"
    };
    api.create(&PostParams::default(), &config_map("new"))
        .await
        .unwrap();
    bump(&api, updated, 1).await;
    let updated_key = format!("{ns}/{updated}");
    eventually("both changes queued by the controller", async || {
        lister.get(&format!("{ns}/new")).is_some()
            && cached_value(&lister, &updated_key).as_deref() == Some("1")
            && watching.pending_notifications() == 0
    })
    .await;
    assert_eq!(
        queue.len(),
        50,
        "the update raised its key, not queued it twice"
    );
    assert_eq!(queue.len_at(Priority::High), 2);
    reconciler.gate.add_permits(1);
    eventually("every key reconciled", async || {
        reconciler.order.lock().len() == 51
    })
    .await;
    let order = reconciler.order.lock().clone();
    assert_eq!(
        order[1..3],
        [format!("{ns}/new"), updated_key],
        "the live changes come right after the reconcile in flight: {order:?}"
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// Logs which replica reconciled which key, in order.
struct Logged {
    replica: usize,
    log: Arc<Mutex<Vec<(usize, String)>>>,
}

impl Reconciler for Logged {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        let key = request.key.as_str();
        self.log.lock().push((self.replica, key.to_owned()));
        Box::pin(async { Ok(Action::Done) })
    }
}

/// A standby keeps its cache synced and its queue filled while it waits for
/// the lease; when the leader is cut off (it stops renewing, as if killed),
/// the standby takes over from its warm cache, and the object written just
/// after the loss is its first reconcile, ahead of the 30 keys its initial
/// list queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_warm_and_reconciles_a_write_made_after_the_loss_first() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("warm").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().unwrap(), &ns);
    for i in 0..30 {
        api.create(&PostParams::default(), &config_map(&format!("k{i:02}")))
            .await
            .unwrap();
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let start = async |id: usize| {
        let proxy = kinformer_envtest::Proxy::start(env.api_port())
            .await
            .unwrap();
        let client = env.client_via(proxy.port()).unwrap();
        let mut config = LeaderElectionConfig::new("warm")
            .namespace(&ns)
            .identity(&format!("replica-{id}"));
        config.lease_duration = Duration::from_secs(3);
        config.renew_deadline = Duration::from_secs(2);
        config.retry_period = Duration::from_millis(500);
        let elector = Arc::new(LeaderElector::new(client.clone(), config));
        let informer = informer::<ConfigMap>(&client, &ns);
        let controller = Controller::new(
            "warm",
            informer.clone(),
            Logged {
                replica: id,
                log: Arc::clone(&log),
            },
            ControllerOptions::new()
                .leader_election(Arc::clone(&elector))
                .priority_aging(Duration::from_secs(3600)),
        )
        .unwrap();
        let queue = controller.queue().clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(controller.run(shutdown.clone()));
        (proxy, elector, informer, queue, shutdown, task)
    };
    let (a_proxy, a_elector, _, _, a_shutdown, a_task) = start(0).await;
    eventually("a leads and reconciles the 30", async || {
        a_elector.is_leader() && log.lock().len() == 30
    })
    .await;
    let (_b_proxy, b_elector, b_informer, b_queue, b_shutdown, b_task) = start(1).await;
    eventually("b synced and its initial list queued", async || {
        b_informer.has_synced() && b_informer.pending_notifications() == 0 && b_queue.len() == 30
    })
    .await;
    assert!(!b_elector.is_leader());
    assert_eq!(b_queue.len_at(Priority::Low), 30);

    // a is cut off: no renewal, no request reaches the server from it.
    a_proxy.blackhole(true);
    api.create(&PostParams::default(), &config_map("after"))
        .await
        .unwrap();
    eventually("b's controller queued the write", async || {
        b_queue.len_at(Priority::High) == 1 && b_informer.pending_notifications() == 0
    })
    .await;
    eventually("b leads and reconciles", async || {
        log.lock().iter().any(|(replica, _)| *replica == 1)
    })
    .await;
    let first_of_b = log
        .lock()
        .iter()
        .find(|(replica, _)| *replica == 1)
        .map(|(_, key)| key.clone());
    assert_eq!(
        first_of_b,
        Some(format!("{ns}/after")),
        "the write made after the loss goes first"
    );
    eventually("b reconciles the rest", async || {
        log.lock()
            .iter()
            .filter(|(replica, _)| *replica == 1)
            .count()
            == 31
    })
    .await;
    a_shutdown.cancel();
    b_shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(60), a_task).await;
    b_task.await.unwrap().unwrap();
}

/// With `reconcile_initial_list(false)` a standby queues nothing for the
/// objects it lists while it waits (its primary's, nor those of what it
/// `watches`), and once it leads it reconciles only what changed after its
/// list: no burst of every cached key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_told_not_to_reconcile_its_initial_list_takes_over_with_only_the_changes() {
    use k8s_openapi::api::core::v1::Secret;
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("no-burst").await.unwrap();
    let client = env.client().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    for i in 0..10 {
        api.create(&PostParams::default(), &config_map(&format!("k{i:02}")))
            .await
            .unwrap();
        let mut secret = Secret::default();
        secret.metadata.name = Some(format!("k{i:02}"));
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let election = |id: &str| {
        let mut config = LeaderElectionConfig::new("no-burst")
            .namespace(&ns)
            .identity(id);
        config.lease_duration = Duration::from_secs(3);
        config.renew_deadline = Duration::from_secs(2);
        config.retry_period = Duration::from_millis(500);
        Arc::new(LeaderElector::new(client.clone(), config))
    };
    let (holder, holding) = (election("holder"), CancellationToken::new());
    let held = tokio::spawn({
        let (holder, holding) = (Arc::clone(&holder), holding.clone());
        async move { holder.run(holding).await }
    });
    holder.subscribe().wait_for(|l| *l).await.unwrap();

    let log = Arc::new(Mutex::new(Vec::new()));
    let secret_informer = informer::<Secret>(&client, &ns);
    let informer = informer::<ConfigMap>(&client, &ns);
    let controller = Controller::new(
        "no-burst",
        informer.clone(),
        Logged {
            replica: 0,
            log: Arc::clone(&log),
        },
        ControllerOptions::new()
            .leader_election(election("standby"))
            .reconcile_initial_list(false),
    )
    .unwrap();
    // Each Secret maps to the ConfigMap of its name.
    let controller = controller
        .watches(secret_informer.clone(), |secret: &Secret| {
            ObjectKey::of(secret).into_iter().collect()
        })
        .unwrap();
    let queue = controller.queue().clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    eventually("the standby synced", async || {
        informer.has_synced()
            && informer.pending_notifications() == 0
            && secret_informer.has_synced()
            && secret_informer.pending_notifications() == 0
    })
    .await;
    assert!(queue.is_empty(), "the initial list was queued");
    api.create(&PostParams::default(), &config_map("after"))
        .await
        .unwrap();
    eventually("the standby queued the change", async || {
        queue.len_at(Priority::High) == 1
    })
    .await;
    holding.cancel(); // released: the standby leads
    held.await.unwrap();
    eventually("the change reconciled", async || {
        !log.lock().is_empty() && queue.is_empty()
    })
    .await;
    let keys: Vec<String> = log.lock().iter().map(|(_, key)| key.clone()).collect();
    assert_eq!(keys, [format!("{ns}/after")]);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}
