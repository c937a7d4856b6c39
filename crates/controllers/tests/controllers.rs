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
    Metrics, PanicPolicy, ReconcileError, Reconciler, pod_stdout::PodStdout,
};
use kinformer_envtest::TestEnv;
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, InformerOptions, SharedIndexInformer,
};
use kinformer_store::namespace_indexers;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use parking_lot::Mutex;

async fn setup(prefix: &str) -> (Client, String) {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace(prefix).await.unwrap();
    (env.client().unwrap(), ns)
}

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

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": {"v": "0"}}))
        .unwrap()
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

/// Reconciles ConfigMaps by recording calls; panics or fails for chosen keys.
#[derive(Default)]
struct Probe {
    calls: Mutex<BTreeMap<String, usize>>,
    in_flight: Mutex<HashSet<String>>,
    overlaps: AtomicUsize,
    panic_for: Option<String>,
    fail_for: Option<String>,
    delay: Duration,
}

impl Reconciler for Probe {
    fn reconcile<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        Box::pin(async move {
            *self.calls.lock().entry(key.to_owned()).or_default() += 1;
            if !self.in_flight.lock().insert(key.to_owned()) {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(self.delay).await;
            self.in_flight.lock().remove(key);
            let name = key.split('/').nth(1).unwrap_or(key);
            if self.panic_for.as_deref() == Some(name) {
                panic!("probe panics for {key}");
            }
            if self.fail_for.as_deref() == Some(name) {
                return Err(format!("probe fails for {key}").into());
            }
            Ok(Action::Done)
        })
    }
}

impl Probe {
    fn calls(&self, name: &str, ns: &str) -> usize {
        self.calls
            .lock()
            .get(&format!("{ns}/{name}"))
            .copied()
            .unwrap_or(0)
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
            assert_eq!(key, format!("{ns}/bad"));
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
    // Coalescing: fewer reconciles than the 164 events.
    assert!(total < 164, "{total} reconciles for 164 events");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_leader_election_exactly_one_instance_reconciles_and_a_standby_takes_over() {
    let (client, ns) = setup("leader").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &config_map("watched"))
        .await
        .unwrap();
    let mut instances = Vec::new();
    for id in ["one", "two"] {
        let probe = Arc::new(Probe::default());
        let elector = Arc::new(LeaderElector::new(
            client.clone(),
            LeaderElectionConfig::new(&ns, "probe-lease", id),
        ));
        let options = ControllerOptions::new().leader_election(Arc::clone(&elector));
        let controller = Controller::new(
            "leader",
            informer::<ConfigMap>(&client, &ns),
            Arc::clone(&probe),
            options,
        )
        .unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(controller.run(shutdown.clone()));
        instances.push((probe, elector, shutdown, task));
    }
    eventually("a leader", async || {
        instances.iter().any(|i| i.1.is_leader())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let leaders: Vec<_> = instances.iter().filter(|i| i.1.is_leader()).collect();
    assert_eq!(leaders.len(), 1, "exactly one leader");
    let leader = instances.iter().position(|i| i.1.is_leader()).unwrap();
    let standby = 1 - leader;
    bump(&api, "watched", 1).await;
    eventually("the leader reconciles", async || {
        instances[leader].0.calls("watched", &ns) >= 1
    })
    .await;
    assert_eq!(
        instances[standby].0.calls("watched", &ns),
        0,
        "the standby must not reconcile"
    );

    // The leader stops (and releases the lease): the standby takes over
    // within the lease duration.
    let (_, _, shutdown, task) = &instances[leader];
    shutdown.cancel();
    let stopped = tokio::time::Instant::now();
    let _ = task;
    eventually("the standby leads", async || {
        instances[standby].1.is_leader()
    })
    .await;
    assert!(
        stopped.elapsed() < Duration::from_secs(15),
        "took over in {:?}",
        stopped.elapsed()
    );
    bump(&api, "watched", 2).await;
    eventually("the new leader reconciles", async || {
        instances[standby].0.calls("watched", &ns) >= 1
    })
    .await;
    instances[standby].2.cancel();
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
    let get = |path: &'static str| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
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
    fn reconcile<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let value = self
                .lister
                .get(key)
                .and_then(|c| c.data.as_ref().and_then(|d| d.get("v").cloned()));
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
