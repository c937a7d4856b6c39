//! The Manager against a real kube-apiserver: several controllers on one
//! factory, one admin server, one election and one shutdown order.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kinformer_controllers::{
    Action, ControllerError, ControllerOptions, LeaderElectionConfig, Lookup, Manager,
    ManagerOptions, ObjectKey, PanicPolicy, runnable,
};
use kinformer_informer::{CancellationToken, SharedInformerFactory};
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;

mod common;
use common::{config_map, eventually, http_get, setup};

type Seen = Arc<Mutex<Vec<String>>>;

fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn secret(name: &str) -> Secret {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
}

fn names(lookup: &Lookup<impl kube_client::Resource>) -> String {
    match lookup {
        Lookup::Found(o) => o.meta().name.clone().unwrap_or_default(),
        Lookup::Gone { key } => format!("gone {key}"),
    }
}

/// Holds reconciles until the test opens it.
struct Gate {
    open: tokio::sync::Semaphore,
    /// Reconciles that reached the gate.
    entered: std::sync::atomic::AtomicUsize,
}

/// A Manager on `ns` with a ConfigMap controller and a Secret controller
/// that also watches ConfigMaps (the Secret of the same name); both record
/// what they reconcile as `controller:name` in `seen`. The ConfigMap
/// reconcile waits for `gate` when it is given.
fn two_controllers(
    client: &Client,
    ns: &str,
    options: ManagerOptions,
    seen: &Seen,
    gate: Option<Arc<Gate>>,
) -> Manager {
    let factory = SharedInformerFactory::new(client.clone())
        .namespace(ns)
        .name("manager-test");
    let mut manager = Manager::with_factory(factory, client.clone(), options).unwrap();
    let configmaps = manager.factory().informer::<ConfigMap>();
    let cm_controller = manager
        .controller::<ConfigMap>("cm")
        .reconcile(Arc::new((Arc::clone(seen), gate)), |cm, ctx| async move {
            if let Some(gate) = &ctx.1 {
                gate.entered
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                gate.open.acquire().await?.forget();
            }
            ctx.0.lock().push(format!("cm:{}", names(&cm)));
            Ok(Action::Done)
        })
        .unwrap();
    let secret_controller = manager
        .controller::<Secret>("secret")
        .watches(configmaps, |cm: &ConfigMap| {
            ObjectKey::of(cm).into_iter().collect()
        })
        .reconcile(Arc::clone(seen), |s, seen| async move {
            seen.lock().push(format!("secret:{}", names(&s)));
            Ok(Action::Done)
        })
        .unwrap();
    manager.add(cm_controller).add(secret_controller);
    manager
}

/// One Manager, two controllers sharing the ConfigMap informer: the probes
/// and the metrics on their own addresses, `/readyz` only once both caches
/// have synced and the user's ready check passes, the user's metric served
/// beside the controllers'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_serves_both_controllers_metrics_and_the_users_checks_and_metrics() {
    let (client, ns) = setup("manager").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let (metrics_addr, probe_addr) = (free_addr(), free_addr());
    let options = ManagerOptions::new()
        .metrics_bind_address(metrics_addr)
        .health_probe_bind_address(probe_addr);
    let seen = Seen::default();
    let manager = two_controllers(&client, &ns, options, &seen, None);
    let widgets = Counter::<u64>::default();
    manager
        .metrics()
        .register("widgets", "Widgets made", widgets.clone());
    let warm = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let w = Arc::clone(&warm);
    manager.metrics().add_ready_check("warm", move || {
        if w.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err("still cold".into())
        }
    });
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(manager.run(shutdown.clone()));

    // Both controllers reconcile the ConfigMap's event: one informer, two handlers.
    eventually("both controllers reconciling", async || {
        let seen = seen.lock();
        seen.contains(&"cm:a".to_owned()) && seen.contains(&format!("secret:gone {ns}/a"))
    })
    .await;
    let ready = http_get(probe_addr, "/readyz").await;
    assert!(
        ready.starts_with("HTTP/1.1 503") && ready.contains("[-]warm failed: still cold"),
        "{ready}"
    );
    warm.store(true, std::sync::atomic::Ordering::SeqCst);
    let ready = http_get(probe_addr, "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    widgets.inc();
    let scraped = http_get(metrics_addr, "/metrics").await;
    for line in [
        "widgets_total 1",
        "controller_runtime_reconcile_total{controller=\"cm\",result=\"success\"}",
        "controller_runtime_reconcile_total{controller=\"secret\",result=\"success\"}",
        "workqueue_adds_total{name=\"secret\"}",
    ] {
        assert!(scraped.contains(line), "no {line:?} in\n{scraped}");
    }
    // client-go's informer metrics, for the named factory's informers.
    for resource in ["configmaps", "secrets"] {
        let labels =
            format!("{{name=\"manager-test\",group=\"\",version=\"v1\",resource=\"{resource}\"}}");
        let value = |metric: &str| {
            let prefix = format!("{metric}{labels} ");
            scraped
                .lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .unwrap_or_else(|| panic!("no {prefix:?} in\n{scraped}"))
                .parse::<f64>()
                .unwrap()
        };
        assert_eq!(value("informer_queued_items"), 0.0);
        assert!(value("informer_processing_latency_seconds_count") >= 1.0);
        assert!(value("informer_store_resource_version") > 0.0);
        let inf = format!(
            "informer_processing_latency_seconds_bucket{{le=\"+Inf\",name=\"manager-test\",group=\"\",version=\"v1\",resource=\"{resource}\"}}"
        );
        assert!(scraped.contains(&inf), "no {inf:?} in\n{scraped}");
    }
    assert!(
        http_get(metrics_addr, "/readyz")
            .await
            .starts_with("HTTP/1.1 404")
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get(name)
        .await
        .ok()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

fn election(ns: &str, identity: &str) -> LeaderElectionConfig {
    let mut config = LeaderElectionConfig::new("manager")
        .namespace(ns)
        .identity(identity);
    config.lease_duration = Duration::from_secs(4);
    config.renew_deadline = Duration::from_secs(3);
    config.retry_period = Duration::from_millis(500);
    config
}

/// Two replicas of a two-controller Manager: one Lease for both
/// controllers, so only the leader's two reconcile; on shutdown the leader
/// keeps the lease while a reconcile of either controller still runs,
/// releases it once both have drained, and the standby takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lease_covers_every_controller_and_is_released_only_after_all_have_drained() {
    let (client, ns) = setup("manager-le").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let (seen_a, seen_b) = (Seen::default(), Seen::default());
    let gate = Arc::new(Gate {
        open: tokio::sync::Semaphore::new(0),
        entered: Default::default(),
    });
    let a = two_controllers(
        &client,
        &ns,
        ManagerOptions::new().leader_election(election(&ns, "a")),
        &seen_a,
        Some(Arc::clone(&gate)),
    );
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let task_a = tokio::spawn(a.run(stop_a.clone()));
    eventually("a leads", async || {
        holder(&leases, "manager").await.as_deref() == Some("a")
    })
    .await;
    let b = two_controllers(
        &client,
        &ns,
        ManagerOptions::new().leader_election(election(&ns, "b")),
        &seen_b,
        None,
    );
    let task_b = tokio::spawn(b.run(stop_b.clone()));

    secrets
        .create(&PostParams::default(), &secret("s"))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &config_map("held"))
        .await
        .unwrap();
    eventually("a's Secret controller reconciling", async || {
        seen_a.lock().contains(&"secret:s".to_owned())
    })
    .await;
    // a's ConfigMap reconcile of "held" is now blocked on the gate.
    eventually("a's ConfigMap reconcile to start", async || {
        gate.entered.load(std::sync::atomic::Ordering::SeqCst) > 0
    })
    .await;
    stop_a.cancel();
    // Draining: the lease stays a's for as long as the reconcile runs,
    // across several renew periods and past a lease duration.
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(holder(&leases, "manager").await.as_deref(), Some("a"));
        assert!(!task_a.is_finished());
    }
    assert!(
        seen_b.lock().is_empty(),
        "the standby reconciled: {:?}",
        seen_b.lock()
    );
    gate.open.add_permits(1);
    task_a.await.unwrap().unwrap();
    assert!(seen_a.lock().contains(&"cm:held".to_owned()));

    eventually(
        "b to lead and reconcile with both controllers",
        async || {
            let seen = seen_b.lock();
            seen.contains(&"cm:held".to_owned()) && seen.contains(&"secret:s".to_owned())
        },
    )
    .await;
    assert_eq!(holder(&leases, "manager").await.as_deref(), Some("b"));
    stop_b.cancel();
    task_b.await.unwrap().unwrap();
    assert_eq!(
        holder(&leases, "manager").await,
        None,
        "the lease was not released"
    );
}

/// A controller that crashes (panic policy Crash) stops the Manager and its
/// other controller; `run` returns the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_controller_stops_the_manager_with_its_error() {
    let (client, ns) = setup("manager-crash").await;
    let factory = SharedInformerFactory::new(client.clone()).namespace(&ns);
    let mut manager =
        Manager::with_factory(factory, client.clone(), ManagerOptions::new()).unwrap();
    let calm = manager
        .controller::<Secret>("calm")
        .reconcile(Arc::new(()), |_, _| async { Ok(Action::Done) })
        .unwrap();
    let crash = manager
        .controller::<ConfigMap>("crash")
        .options(
            manager
                .controller_options()
                .panic_policy(PanicPolicy::Crash),
        )
        .reconcile(Arc::new(()), |cm, _| async move {
            if let Lookup::Found(cm) = &cm
                && cm.metadata.name.as_deref() == Some("boom")
            {
                panic!("boom");
            }
            Ok(Action::Done)
        })
        .unwrap();
    manager.add(calm).add(crash);
    let task = tokio::spawn(manager.run(CancellationToken::new()));
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    cms.create(&PostParams::default(), &config_map("boom"))
        .await
        .unwrap();
    match task.await.unwrap() {
        Err(ControllerError::ReconcilePanicked { key, message }) => {
            assert_eq!(key.as_str(), format!("{ns}/boom"));
            assert_eq!(message, "boom");
        }
        other => panic!("expected the crash, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_without_controllers_or_with_a_bad_election_is_refused() {
    let (client, ns) = setup("manager-bad").await;
    let manager = Manager::new(client.clone(), ManagerOptions::new()).unwrap();
    let err = manager.run(CancellationToken::new()).await.unwrap_err();
    assert!(
        err.to_string().contains("no controllers or runnables"),
        "{err}"
    );
    let mut config = election(&ns, "x");
    config.renew_deadline = config.lease_duration;
    let err = Manager::new(client, ManagerOptions::new().leader_election(config)).unwrap_err();
    assert!(
        matches!(err, ControllerError::InvalidLeaderElection { .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managers_metrics_count_the_objects_its_informers_could_not_decode() {
    let (client, ns) = setup("undecodable").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for name in ["fine", "poison"] {
        cms.create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    let factory = SharedInformerFactory::new(client.clone()).namespace(ns.clone());
    let manager = Manager::with_factory(factory, client, ManagerOptions::new()).unwrap();
    let informer = manager.factory().informer::<ConfigMap>();
    // A transform that panics treats its object as undecodable.
    informer
        .set_transform(|cm: ConfigMap| {
            assert_ne!(
                cm.metadata.name.as_deref(),
                Some("poison"),
                "cannot transform"
            );
            cm
        })
        .unwrap();
    let shutdown = CancellationToken::new();
    manager.factory().start(&shutdown);
    eventually("the informer synced", async || informer.has_synced()).await;
    let scraped = manager.metrics().encode();
    let label = format!("{{informer=\"configmaps in namespace {ns}\"}}");
    for line in [
        format!("kinformer_informer_undecodable_objects_total{label} 1"),
        format!("kinformer_informer_transform_panics_total{label} 1"),
    ] {
        assert!(scraped.contains(&line), "{line} in {scraped}");
    }
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_tuned_with_options_keeps_the_managers_election_and_metrics() {
    let (client, ns) = setup("tuned").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    // Another replica holds the Lease for an hour.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let held: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "tuned"},
        "spec": {"holderIdentity": "other", "leaseDurationSeconds": 3600,
                 "renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}
    }))
    .unwrap();
    leases.create(&PostParams::default(), &held).await.unwrap();
    let mut election = LeaderElectionConfig::new("tuned")
        .namespace(&ns)
        .identity("me");
    election.retry_period = Duration::from_millis(200);
    let factory = SharedInformerFactory::new(client.clone()).namespace(ns.clone());
    let options = ManagerOptions::new().leader_election(election);
    let mut manager = Manager::with_factory(factory, client.clone(), options).unwrap();
    let elector = Arc::clone(manager.elector().unwrap());
    let reconciled: Arc<Mutex<Vec<bool>>> = Arc::default();
    let controller = manager
        .controller::<ConfigMap>("tuned")
        // Per-controller tuning: before, this replaced the Manager's
        // election and metrics, and the controller reconciled while the
        // other replica held the Lease.
        .options(ControllerOptions::new().workers(4))
        .reconcile(
            Arc::new((Arc::clone(&reconciled), Arc::clone(&elector))),
            |_cm, ctx| async move {
                ctx.0.lock().push(ctx.1.is_leader());
                Ok(Action::Done)
            },
        )
        .unwrap();
    manager.add(controller);
    let metrics = Arc::clone(manager.metrics());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(manager.run(shutdown.clone()));
    // The Manager has tried for the Lease and lost.
    eventually("the election reported", async || {
        metrics
            .encode()
            .contains("leader_election_master_status{name=\"tuned\"} 0")
    })
    .await;
    assert!(
        reconciled.lock().is_empty(),
        "no reconcile while another replica leads"
    );
    // The other replica gives the Lease up (a release, as client-go writes
    // it): this one takes it and reconciles. (A deleted Lease would stay the
    // other's for its hour.)
    let release = serde_json::json!({"spec": {"holderIdentity": null, "leaseDurationSeconds": 1}});
    leases
        .patch(
            "tuned",
            &kube_client::api::PatchParams::default(),
            &kube_client::api::Patch::Merge(release),
        )
        .await
        .unwrap();
    eventually("a reconcile", async || !reconciled.lock().is_empty()).await;
    assert!(
        reconciled.lock().iter().all(|&leading| leading),
        "{:?}",
        reconciled.lock()
    );
    assert!(
        metrics.encode().contains(
            "controller_runtime_reconcile_total{controller=\"tuned\",result=\"success\"}"
        ),
        "{}",
        metrics.encode()
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_made_without_the_managers_options_is_refused_with_why() {
    let (client, ns) = setup("foreign").await;
    let factory = SharedInformerFactory::new(client.clone()).namespace(ns.clone());
    let options = ManagerOptions::new().leader_election(
        LeaderElectionConfig::new("foreign")
            .namespace(&ns)
            .identity("me"),
    );
    let mut manager = Manager::with_factory(factory, client, options).unwrap();
    let foreign =
        kinformer_controllers::Controller::<ConfigMap>::builder("foreign", manager.factory())
            .reconcile(Arc::new(()), |_, _| async { Ok(Action::Done) })
            .unwrap();
    manager.add(foreign);
    // Refused at once; before, it ran outside the election for ever.
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        manager.run(CancellationToken::new()),
    )
    .await
    .expect("run refuses the controller at once")
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("\"foreign\" does not follow the Manager's leader election")
            && text.contains("Manager::controller"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_managers_event_recorder_reports_its_identity_and_is_flushed_when_it_stops() {
    use k8s_openapi::api::events::v1::Event;
    use kinformer_controllers::{EventType, NewEvent};
    use kube_client::Resource;
    let (client, ns) = setup("recorder").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let factory = SharedInformerFactory::new(client.clone()).namespace(ns.clone());
    let mut manager =
        Manager::with_factory(factory, client.clone(), ManagerOptions::new()).unwrap();
    let identity = manager.identity().to_owned();
    let events = manager.event_recorder("kinformer.dev/test");
    let controller = manager
        .controller::<ConfigMap>("warn")
        .reconcile(events, |cm, events| async move {
            if let Lookup::Found(cm) = cm {
                let regarding = cm.object_ref(&());
                // The first creates the Event; the next two are only counted
                // (the series interval is 30 s).
                for _ in 0..3 {
                    events
                        .publish(
                            &regarding,
                            NewEvent {
                                type_: EventType::Warning,
                                reason: "BadSpec",
                                action: "Check",
                                note: "bad spec",
                            },
                        )
                        .await?;
                }
            }
            Ok(Action::Done)
        })
        .unwrap();
    manager.add(controller);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(manager.run(shutdown.clone()));
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    eventually("the Event", async || {
        !api.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
    let event = api.list(&Default::default()).await.unwrap().items.remove(0);
    assert_eq!(event.reporting_instance.as_deref(), Some(identity.as_str()));
    assert_eq!(
        event.series.map(|s| s.count),
        Some(3),
        "written when the Manager stopped"
    );
}

/// `Manager::new`'s informers resync every `sync_period` (10 hours by
/// default, as controller-runtime's `SyncPeriod`): an object reconciled
/// once and never changed again is reconciled again, and again, with
/// nothing else happening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managers_informers_resync_every_sync_period_so_every_object_is_reconciled_again() {
    use kinformer_controllers::DEFAULT_SYNC_PERIOD;
    assert_eq!(ManagerOptions::new().sync_period, Some(DEFAULT_SYNC_PERIOD));
    assert_eq!(DEFAULT_SYNC_PERIOD, Duration::from_secs(36_000));
    let (client, ns) = setup("sync-period").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    cms.create(&PostParams::default(), &config_map("still"))
        .await
        .unwrap();
    let run = async |options: ManagerOptions, until: usize| {
        let mut manager = Manager::new(client.clone(), options).unwrap();
        let seen = Seen::default();
        let controller = manager
            .controller::<ConfigMap>("resynced")
            .reconcile(
                Arc::new((Arc::clone(&seen), ns.clone())),
                |cm, ctx| async move {
                    if let Lookup::Found(cm) = &cm
                        && cm.metadata.namespace.as_deref() == Some(ctx.1.as_str())
                    {
                        ctx.0.lock().push(names(&Lookup::Found(Arc::clone(cm))));
                    }
                    Ok(Action::Done)
                },
            )
            .unwrap();
        manager.add(controller);
        let stop = CancellationToken::new();
        let task = tokio::spawn(manager.run(stop.clone()));
        eventually("the reconciles", async || seen.lock().len() >= until).await;
        stop.cancel();
        task.await.unwrap().unwrap();
        seen.lock().len()
    };
    let reconciles = run(ManagerOptions::new().sync_period(Duration::from_secs(1)), 3).await;
    assert!(reconciles >= 3);
}

/// A Manager's Event recorder counts the occurrences it had to drop on the
/// Manager's `/metrics`, without the user's help.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managers_event_recorder_counts_its_dropped_occurrences_on_the_managers_metrics() {
    let (client, _ns) = setup("event-metrics").await;
    let manager = Manager::new(client, ManagerOptions::new()).unwrap();
    let _events = manager.event_recorder("example.com/probe");
    let text = manager.metrics().encode();
    assert!(
        text.contains(
            "kinformer_event_dropped_occurrences_total{controller=\"example.com/probe\"} 0"
        ),
        "{text}"
    );
}

/// What a runnable saw: `started`, then `stopped while <holder> held the Lease`.
type Log = Arc<Mutex<Vec<String>>>;

/// A Manager with only runnables: one that needs the lease and one on
/// every replica, each logging when it starts and when it is stopped (the
/// leader one with who held the Lease then).
fn runnables_only(client: &Client, ns: &str, identity: &str, led: &Log, every: &Log) -> Manager {
    let mut manager = Manager::new(
        client.clone(),
        ManagerOptions::new().leader_election(election(ns, identity)),
    )
    .unwrap();
    let (log, leases) = (
        Arc::clone(led),
        Api::<Lease>::namespaced(client.clone(), ns),
    );
    manager.add_runnable(runnable("led", move |stop| async move {
        log.lock().push("started".to_owned());
        stop.cancelled().await;
        let held = holder(&leases, "manager").await.unwrap_or_default();
        log.lock()
            .push(format!("stopped while {held} held the Lease"));
        Ok(())
    }));
    let log = Arc::clone(every);
    manager.add_runnable(
        runnable("every", move |stop| async move {
            log.lock().push("started".to_owned());
            stop.cancelled().await;
            log.lock().push("stopped".to_owned());
            Ok(())
        })
        .on_every_replica(),
    );
    manager
}

/// controller-runtime's `mgr.Add`: a runnable that needs the lease runs
/// only on the leader, from when it leads, and is stopped before the lease
/// is released, so the next leader's never overlaps it; one on every
/// replica runs on the standby too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runnable_runs_only_while_its_replica_leads_and_ends_before_the_lease_is_released() {
    let (client, ns) = setup("manager-runnable").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let (led_a, every_a, led_b, every_b) = (
        Log::default(),
        Log::default(),
        Log::default(),
        Log::default(),
    );
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let a = runnables_only(&client, &ns, "a", &led_a, &every_a);
    let task_a = tokio::spawn(a.run(stop_a.clone()));
    eventually("a leads and its runnables start", async || {
        holder(&leases, "manager").await.as_deref() == Some("a")
            && led_a.lock().len() == 1
            && every_a.lock().len() == 1
    })
    .await;
    let b = runnables_only(&client, &ns, "b", &led_b, &every_b);
    let task_b = tokio::spawn(b.run(stop_b.clone()));
    eventually("the standby's every-replica runnable starts", async || {
        every_b.lock().len() == 1
    })
    .await;
    assert!(
        led_b.lock().is_empty(),
        "the standby ran: {:?}",
        led_b.lock()
    );

    stop_a.cancel();
    task_a.await.unwrap().unwrap();
    assert_eq!(
        *led_a.lock(),
        ["started", "stopped while a held the Lease"],
        "stopped before the lease was released"
    );
    assert_eq!(*every_a.lock(), ["started", "stopped"]);
    eventually("b leads and its runnable starts", async || {
        led_b.lock().len() == 1
    })
    .await;
    assert_eq!(holder(&leases, "manager").await.as_deref(), Some("b"));
    stop_b.cancel();
    task_b.await.unwrap().unwrap();
    assert_eq!(*led_b.lock(), ["started", "stopped while b held the Lease"]);
}

#[derive(Debug, thiserror::Error)]
#[error("the sweep found a loop")]
struct SweepFailed;

/// A runnable starts once the caches have synced; one that finishes leaves
/// the Manager running; one that fails stops it, its controllers too, and
/// `run` returns it, cause kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runnable_that_finishes_leaves_the_manager_running_and_one_that_fails_stops_it() {
    let (client, ns) = setup("manager-runnable-fail").await;
    let factory = SharedInformerFactory::new(client.clone()).namespace(&ns);
    let mut manager =
        Manager::with_factory(factory, client.clone(), ManagerOptions::new()).unwrap();
    let seen = Seen::default();
    let controller = manager
        .controller::<ConfigMap>("cm")
        .reconcile(Arc::clone(&seen), |cm, seen| async move {
            seen.lock().push(names(&cm));
            Ok(Action::Done)
        })
        .unwrap();
    let (fail, failing) = tokio::sync::oneshot::channel::<()>();
    let synced = manager.factory().informer::<ConfigMap>();
    manager
        .add(controller)
        .add_runnable(runnable("warm", move |_| async move {
            // Started once the controllers' caches have synced.
            match synced.has_synced() {
                true => Ok(()),
                false => Err("started before the caches synced".into()),
            }
        }))
        .add_runnable(runnable("sweep", |stop| async move {
            tokio::select! {
                _ = stop.cancelled() => Ok(()),
                _ = failing => Err(SweepFailed.into()),
            }
        }));
    let task = tokio::spawn(manager.run(CancellationToken::new()));
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    cms.create(&PostParams::default(), &config_map("after-warm"))
        .await
        .unwrap();
    eventually(
        "the controller reconciles after `warm` finished",
        async || seen.lock().contains(&"after-warm".to_owned()),
    )
    .await;
    assert!(!task.is_finished());
    fail.send(()).unwrap();
    match task.await.unwrap() {
        Err(e @ ControllerError::RunnableFailed { .. }) => {
            assert_eq!(e.to_string(), "runnable \"sweep\" failed");
            let source = std::error::Error::source(&e).map(ToString::to_string);
            assert_eq!(source.as_deref(), Some("the sweep found a loop"));
        }
        other => panic!("expected the sweep's failure, got {other:?}"),
    }
}

/// Controllers added and removed while the Manager runs: two share the
/// ConfigMap informer; the first removed is never called again while the
/// other goes on; the second removed stops the informer and frees its
/// cache; one added later runs; bad requests are refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_are_added_and_removed_while_the_manager_runs() {
    let (client, ns) = setup("manager-runtime").await;
    let factory = SharedInformerFactory::new(client.clone())
        .namespace(&ns)
        .name("manager-runtime");
    let mut manager =
        Manager::with_factory(factory, client.clone(), ManagerOptions::new()).unwrap();
    let seen = Seen::default();
    let on_configmaps = |name: &'static str, manager: &Manager| {
        let mut builder = manager.controller::<ConfigMap>(name);
        // A clone of the shared informer, which pins nothing.
        let informer = builder.informer();
        let controller = builder
            .reconcile(Arc::clone(&seen), move |cm, seen| async move {
                seen.lock().push(format!("{name}:{}", names(&cm)));
                Ok(Action::Done)
            })
            .unwrap();
        (controller, informer)
    };
    let (first, informer) = on_configmaps("first", &manager);
    let (second, _) = on_configmaps("second", &manager);
    let (duplicate, _) = on_configmaps("second", &manager);
    assert_eq!(informer.event_handlers(), 3);
    let later = manager
        .controller::<Secret>("later")
        .reconcile(Arc::clone(&seen), |s, seen| async move {
            seen.lock().push(format!("later:{}", names(&s)));
            Ok(Action::Done)
        })
        .unwrap();
    manager.add(first).add(second);
    let handle = manager.handle();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(manager.run(shutdown.clone()));

    let (cms, secrets): (Api<ConfigMap>, Api<Secret>) = (
        Api::namespaced(client.clone(), &ns),
        Api::namespaced(client.clone(), &ns),
    );
    let pp = PostParams::default();
    cms.create(&pp, &config_map("a")).await.unwrap();
    eventually("both reconciling a", async || {
        let seen = seen.lock();
        seen.contains(&"first:a".to_owned()) && seen.contains(&"second:a".to_owned())
    })
    .await;

    let refused = handle.remove("nope").await.unwrap_err().to_string();
    assert!(refused.contains("\"nope\""), "{refused}");
    // Refused, and dropped: its handler goes with it.
    let refused = handle.add(duplicate).await.unwrap_err().to_string();
    assert!(refused.contains("runs already"), "{refused}");
    assert_eq!(informer.event_handlers(), 2);
    assert_eq!(informer.event_handlers(), 2);
    handle.remove("first").await.unwrap();
    // Removed: its handler is gone before `remove` returns.
    assert_eq!(informer.event_handlers(), 1);
    cms.create(&pp, &config_map("b")).await.unwrap();
    eventually("the other reconciling b", async || {
        seen.lock().contains(&"second:b".to_owned())
    })
    .await;
    assert!(
        !seen.lock().contains(&"first:b".to_owned()),
        "{:?}",
        seen.lock()
    );
    assert!(!informer.is_stopped(), "still read by the other");
    assert_eq!(informer.indexer().len(), 2);

    handle.remove("second").await.unwrap();
    eventually(
        "the informer no controller reads stopped, its cache freed",
        async || informer.is_stopped() && informer.indexer().is_empty(),
    )
    .await;

    handle.add(later).await.unwrap();
    secrets.create(&pp, &secret("s")).await.unwrap();
    eventually("the controller added later reconciling", async || {
        seen.lock().contains(&"later:s".to_owned())
    })
    .await;
    let again = manager_controller_named_later(&client, &ns);
    let refused = handle.add(again).await.unwrap_err().to_string();
    assert!(
        refused.contains("\"later\"") && refused.contains("runs already"),
        "{refused}"
    );

    shutdown.cancel();
    task.await.unwrap().unwrap();
    let stopped = handle.remove("later").await.unwrap_err().to_string();
    assert!(stopped.contains("not running"), "{stopped}");
}

/// A controller named `later` of another Manager: its name is what counts.
fn manager_controller_named_later(
    client: &Client,
    ns: &str,
) -> kinformer_controllers::Controller<Secret> {
    let factory = SharedInformerFactory::new(client.clone()).namespace(ns);
    let other = Manager::with_factory(factory, client.clone(), ManagerOptions::new()).unwrap();
    other
        .controller::<Secret>("later")
        .reconcile(Arc::new(()), |_, _| async { Ok(Action::Done) })
        .unwrap()
}

/// A controller removed before its caches synced (its list refused, 403)
/// no longer holds the Manager's readiness or its runnables back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_removed_before_it_synced_holds_nothing_back() {
    let (admin, ns) = setup("manager-removed-early").await;
    let user = format!("configmaps-only-{ns}");
    let client = common::client_allowed_only(
        &admin,
        &ns,
        ("cms", &user),
        ("", "configmaps"),
        &["list", "watch"],
    )
    .await;
    let factory = SharedInformerFactory::new(client.clone()).namespace(&ns);
    let addr = free_addr();
    let options = ManagerOptions::new()
        .metrics_bind_address(addr)
        .health_probe_bind_address(addr);
    let mut manager = Manager::with_factory(factory, client, options).unwrap();
    let done = |_: Lookup<ConfigMap>, _: Arc<()>| async { Ok(Action::Done) };
    let cms = manager
        .controller::<ConfigMap>("cms")
        .reconcile(Arc::new(()), done)
        .unwrap();
    let secrets = manager
        .controller::<Secret>("secrets")
        .reconcile(Arc::new(()), |_, _: Arc<()>| async { Ok(Action::Done) })
        .unwrap();
    let (ran, mut started) = tokio::sync::watch::channel(false);
    manager.add(cms).add(secrets).add_runnable(runnable(
        "after-the-caches",
        move |stop| async move {
            ran.send_replace(true);
            stop.cancelled().await;
            Ok(())
        },
    ));
    let handle = manager.handle();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(manager.run(shutdown.clone()));
    eventually("the admin server up", async || {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    eventually("the Secrets list refused", async || {
        http_get(addr, "/readyz")
            .await
            .contains("informers of secrets failed")
    })
    .await;
    assert!(
        !*started.borrow(),
        "the runnable started before the caches synced"
    );

    handle.remove("secrets").await.unwrap();
    eventually("ready without it", async || {
        http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200")
    })
    .await;
    started.wait_for(|ran| *ran).await.unwrap();
    shutdown.cancel();
    task.await.unwrap().unwrap();
}
