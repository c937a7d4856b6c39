//! A sharded controller against the real server (kube-apiserver with the
//! `ShardedListAndWatch` gate on): 1 000 ConfigMaps under continuous
//! updates, replicas going 1 -> 2 -> 4 -> 3 (one killed) -> 1 (one stopped,
//! one killed). Each replica runs in a runtime of its own, so that killing
//! it stops every task at once and releases nothing, as SIGKILL would;
//! stopping it is its shutdown token, as SIGTERM would be.
//!
//! Checked: no key is reconciled by two replicas at overlapping times;
//! after each change the ring settles with every slot held once and no
//! replica above its share, each replica's cache holding exactly the
//! objects of its slots; every object updated after the last change is
//! reconciled within the slot lease duration plus a few seconds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_controllers::ring::slot_of_uid;
use kinformer_controllers::{
    Action, Controller, ControllerError, ControllerOptions, Event, Lookup, Metrics, ObjectKey,
    Ring, RingConfig,
};
use kinformer_envtest::TestNamespace;
use kinformer_envtest::{TestEnv, TestEnvOptions};
use kinformer_informer::{ApiListerWatcher, InformerOptions, SharedIndexInformer};
use kube_client::Client;
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

mod common;

const OBJECTS: usize = 1_000;
const SLOTS: u32 = 8;
const LEASE: Duration = Duration::from_secs(3);

/// What a reconcile of a deleted object records as the state it saw.
const GONE: &str = "<gone>";

/// One reconcile: who, which key, the `data.v` it saw, when.
#[derive(Debug, Clone)]
struct Reconcile {
    replica: String,
    key: String,
    seen: String,
    start: Instant,
    end: Option<Instant>,
}

type Log = Arc<Mutex<Vec<Reconcile>>>;

/// Records a reconcile's end when dropped: also when a killed replica's
/// reconcile is dropped mid-way.
struct Ending {
    log: Log,
    index: usize,
}

impl Drop for Ending {
    fn drop(&mut self) {
        self.log.lock()[self.index].end = Some(Instant::now());
    }
}

struct Replica {
    id: String,
    runtime: Option<tokio::runtime::Runtime>,
    ring: Arc<Ring>,
    informer: SharedIndexInformer<ConfigMap>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    run: Option<tokio::task::JoinHandle<Result<(), ControllerError>>>,
}

/// What a replica may have besides the plain controller.
#[derive(Default)]
struct Extras {
    /// A secondary informer of every ConfigMap.
    secondary: bool,
    /// A reconcile of an object at `data.v == "hold"` waits for this to
    /// be notified.
    hold: Arc<tokio::sync::Notify>,
    /// The controller's event filter.
    filter: Option<fn(Event<'_, ConfigMap>) -> bool>,
}

/// A ConfigMap's `data.v`.
fn v_of(cm: &ConfigMap) -> &str {
    cm.data
        .as_ref()
        .and_then(|d| d.get("v"))
        .map_or("", String::as_str)
}

impl Replica {
    /// A replica whose primary informer watches its slots (`scoped`) or
    /// every object.
    fn start(env: &TestEnv, ns: &str, id: &str, log: &Log, scoped: bool) -> Self {
        Self::start_with(env, ns, id, log, scoped, Extras::default())
    }

    /// As `start`, with `extras`.
    fn start_with(
        env: &TestEnv,
        ns: &str,
        id: &str,
        log: &Log,
        scoped: bool,
        extras: Extras,
    ) -> Self {
        let Extras {
            secondary,
            hold,
            filter,
        } = extras;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let _inside = runtime.enter();
        let client = env.client().unwrap();
        let mut config = RingConfig::new(ns, "sharded", id);
        config.slots = SLOTS;
        config.lease_duration = LEASE;
        config.renew_deadline = Duration::from_secs(2);
        config.retry_period = Duration::from_millis(500);
        let ring = Ring::new(client.clone(), config).unwrap();
        let metrics = Metrics::new();
        ring.register_metrics(&metrics);
        let mut lw = ApiListerWatcher::<ConfigMap>::namespaced(client, ns);
        if scoped {
            lw = lw.shard_scope(ring.scope());
        }
        let informer = SharedIndexInformer::new(lw, InformerOptions::default());
        let (who, log) = (id.to_owned(), Arc::clone(log));
        let mut options = ControllerOptions::new()
            .workers(2)
            .ring(Arc::clone(&ring))
            .metrics(Arc::clone(&metrics));
        if let Some(filter) = filter {
            options = options.event_filter(filter);
        }
        let controller = Controller::from_fn(
            "sharded",
            informer.clone(),
            move |lookup: Lookup<ConfigMap>| {
                let (who, log, hold) = (who.clone(), Arc::clone(&log), Arc::clone(&hold));
                async move {
                    let (key, seen) = match lookup {
                        Lookup::Found(cm) => (
                            format!(
                                "{}/{}",
                                cm.metadata.namespace.as_deref().unwrap_or_default(),
                                cm.metadata.name.as_deref().unwrap_or_default()
                            ),
                            v_of(&cm).to_owned(),
                        ),
                        Lookup::Gone { key } => (key.into_string(), GONE.to_owned()),
                    };
                    let index = {
                        let mut log = log.lock();
                        log.push(Reconcile {
                            replica: who,
                            key,
                            seen: seen.clone(),
                            start: Instant::now(),
                            end: None,
                        });
                        log.len() - 1
                    };
                    let _ending = Ending { log, index };
                    if seen == "block" {
                        // Until aborted.
                        std::future::pending::<()>().await;
                    }
                    if seen == "hold" {
                        hold.notified().await;
                    }
                    // Long enough for an overlap to show if there were one.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok(Action::Done)
                }
            },
            options,
        )
        .unwrap();
        // A secondary informer, whole as secondaries stay: every change of
        // any ConfigMap enqueues its key on every replica, also while a
        // slot just taken is not in the primary cache yet.
        let controller = if secondary {
            controller
                .watches(
                    SharedIndexInformer::new(
                        ApiListerWatcher::<ConfigMap>::namespaced(env.client().unwrap(), ns),
                        InformerOptions::default(),
                    ),
                    |cm: &ConfigMap| ObjectKey::of(cm).into_iter().collect(),
                )
                .unwrap()
        } else {
            controller
        };
        let shutdown = CancellationToken::new();
        let run = runtime.spawn(controller.run(shutdown.clone()));
        drop(_inside);
        Self {
            id: id.to_owned(),
            runtime: Some(runtime),
            ring,
            informer,
            metrics,
            shutdown,
            run: Some(run),
        }
    }

    /// Stops as on SIGTERM: drains, hands its slots over, leaves the ring.
    async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(run) = self.run.take() {
            run.await.unwrap().unwrap();
        }
        self.kill();
    }

    /// Dies as on SIGKILL: every task at once, nothing released.
    fn kill(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Extras with a secondary informer.
fn secondary() -> Extras {
    Extras {
        secondary: true,
        ..Extras::default()
    }
}

/// The slot of every object on the server, by key.
async fn server_slots(api: &Api<ConfigMap>) -> BTreeMap<String, u32> {
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|cm| {
            let key = format!(
                "{}/{}",
                cm.metadata.namespace.unwrap(),
                cm.metadata.name.unwrap()
            );
            (key, slot_of_uid(cm.metadata.uid.as_deref().unwrap(), SLOTS))
        })
        .collect()
}

/// Waits until every slot is held once, none by a replica above its share,
/// and each replica's cache holds exactly the objects of its slots.
async fn settled(replicas: &[&Replica], slots: &BTreeMap<String, u32>) {
    settled_with(replicas, slots, true).await;
}

async fn settled_with(replicas: &[&Replica], slots: &BTreeMap<String, u32>, scoped: bool) {
    let share = (SLOTS as usize).div_ceil(replicas.len());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let held: Vec<BTreeSet<u32>> = replicas.iter().map(|r| r.ring.held()).collect();
        let all: BTreeSet<u32> = held.iter().flatten().copied().collect();
        let total: usize = held.iter().map(BTreeSet::len).sum();
        let caches_match = !scoped
            || replicas.iter().zip(&held).all(|(r, mine)| {
                let want: BTreeSet<&String> = slots
                    .iter()
                    .filter(|(_, s)| mine.contains(s))
                    .map(|(k, _)| k)
                    .collect();
                let have: BTreeSet<String> = r.informer.indexer().list_keys().into_iter().collect();
                have.len() == want.len() && want.iter().all(|k| have.contains(*k))
            });
        if all.len() == SLOTS as usize
            && total == SLOTS as usize
            && held.iter().all(|h| h.len() <= share)
            && caches_match
        {
            return;
        }
        let ids: Vec<&str> = replicas.iter().map(|r| r.id.as_str()).collect();
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ids:?} hold {held:?} after 60 s (caches match: {caches_match})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn patch_v(api: &Api<ConfigMap>, name: &str, v: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"v": v}})),
    )
    .await
    .unwrap();
}

fn name(i: usize) -> String {
    format!("cm-{i:04}")
}

/// One server with the gate on for this test binary.
async fn sharded_env() -> &'static TestEnv {
    static ENV: tokio::sync::OnceCell<&'static TestEnv> = tokio::sync::OnceCell::const_new();
    ENV.get_or_init(|| async {
        TestEnv::start_with(TestEnvOptions::new().sharded_list_and_watch())
            .await
            .unwrap()
            .into_static()
    })
    .await
}

/// `count` ConfigMaps in a new namespace, and the slot of each.
async fn config_maps(
    env: &TestEnv,
    prefix: &str,
    count: usize,
) -> (Api<ConfigMap>, BTreeMap<String, u32>, TestNamespace) {
    let client: Client = env.client().unwrap();
    let ns = env.create_namespace(prefix).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    stream::iter(0..count)
        .for_each_concurrent(32, |i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &common::config_map(&name(i)))
                    .await
                    .unwrap();
            }
        })
        .await;
    let slots = server_slots(&api).await;
    assert_eq!(slots.len(), count);
    (api, slots, ns)
}

/// Waits (up to 30 s) until every key of `slots` has been reconciled at
/// `data.v == v`; returns those reconciles.
async fn reconciled_at(log: &Log, slots: &BTreeMap<String, u32>, v: &str) -> Vec<Reconcile> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let done: Vec<Reconcile> = log
            .lock()
            .iter()
            .filter(|r| r.seen == v && r.end.is_some())
            .cloned()
            .collect();
        let keys: BTreeSet<&String> = done.iter().map(|r| &r.key).collect();
        if keys.len() == slots.len() {
            return done;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} keys reconciled at {v:?} after 30 s",
            keys.len(),
            slots.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_whole_caches_each_replica_reconciles_only_the_keys_of_its_slots() {
    let env = sharded_env().await;
    let (api, slots, _ns) = config_maps(env, "whole", 200).await;
    let ns = api.namespace().unwrap().to_owned();
    let log: Log = Arc::default();
    // Unscoped informers: both replicas cache and get events for every key.
    let mut a = Replica::start(env, &ns, "a", &log, false);
    let mut b = Replica::start(env, &ns, "b", &log, false);
    settled_with(&[&a, &b], &slots, false).await;
    let held: BTreeMap<String, BTreeSet<u32>> = [&a, &b]
        .iter()
        .map(|r| (r.id.clone(), r.ring.held()))
        .collect();
    stream::iter(slots.keys())
        .for_each_concurrent(32, |key| {
            let api = api.clone();
            async move { patch_v(&api, key.rsplit('/').next().unwrap(), "final").await }
        })
        .await;
    let done = reconciled_at(&log, &slots, "final").await;
    // The ring did not move while the keys were worked.
    for r in [&a, &b] {
        assert_eq!(r.ring.held(), held[&r.id], "{}", r.id);
    }
    for r in &done {
        assert!(
            held[&r.replica].contains(&slots[&r.key]),
            "{} reconciled {} of slot {}, holding {:?}",
            r.replica,
            r.key,
            slots[&r.key],
            held[&r.replica]
        );
    }
    let by: BTreeSet<&str> = done.iter().map(|r| r.replica.as_str()).collect();
    assert_eq!(by.len(), 2, "both replicas worked: {by:?}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_is_reconciled_by_two_replicas_at_once_as_replicas_come_go_and_die() {
    let env = sharded_env().await;
    let (api, slots, _ns) = config_maps(env, "sharded", OBJECTS).await;
    let ns = api.namespace().unwrap().to_owned();

    // Continuous updates, a few dozen a second, across all objects.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (api, writing) = (api.clone(), Arc::clone(&writing));
        tokio::spawn(async move {
            let mut n = 0usize;
            while writing.load(Ordering::SeqCst) {
                n += 1;
                patch_v(&api, &name(fastrand::usize(..OBJECTS)), &n.to_string()).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            n
        })
    };

    let log: Log = Arc::default();
    let mut a = Replica::start_with(env, &ns, "a", &log, true, secondary());
    settled(&[&a], &slots).await;
    let mut b = Replica::start_with(env, &ns, "b", &log, true, secondary());
    settled(&[&a, &b], &slots).await;
    let mut c = Replica::start_with(env, &ns, "c", &log, true, secondary());
    let mut d = Replica::start_with(env, &ns, "d", &log, true, secondary());
    settled(&[&a, &b, &c, &d], &slots).await;
    // Four replicas: each caches about a quarter.
    for r in [&a, &b, &c, &d] {
        assert!(r.informer.indexer().len() < OBJECTS / 2, "{}", r.id);
    }
    d.kill();
    settled(&[&a, &b, &c], &slots).await;
    c.stop().await;
    b.kill();
    settled(&[&a], &slots).await;
    let changed = Instant::now();

    let writes = {
        writing.store(false, Ordering::SeqCst);
        writer.await.unwrap()
    };
    // Every object updated after the last change is reconciled, by the one
    // replica left, within the lease duration plus a few seconds.
    stream::iter(0..OBJECTS)
        .for_each_concurrent(32, |i| {
            let api = api.clone();
            async move { patch_v(&api, &name(i), "final").await }
        })
        .await;
    let written = Instant::now();
    reconciled_at(&log, &slots, "final").await;
    let reconciled_in = written.elapsed();
    assert!(
        reconciled_in < LEASE + Duration::from_secs(10),
        "the final state took {reconciled_in:?} to be reconciled"
    );

    let log = log.lock().clone();
    let mut by_key: BTreeMap<&str, Vec<&Reconcile>> = BTreeMap::new();
    for r in &log {
        by_key.entry(&r.key).or_default().push(r);
    }
    let (mut overlaps, mut handovers) = (0, 0);
    for (key, mut rs) in by_key {
        rs.sort_by_key(|r| r.start);
        for (i, r) in rs.iter().enumerate() {
            let end = r.end.expect("every reconcile ended");
            for later in &rs[i + 1..] {
                if later.replica != r.replica && later.start < end {
                    overlaps += 1;
                    eprintln!(
                        "{key}: {} started while {} was reconciling it",
                        later.replica, r.replica
                    );
                }
            }
        }
        handovers += rs
            .windows(2)
            .filter(|p| p[0].replica != p[1].replica)
            .count();
    }
    let by_replica: BTreeMap<&str, usize> = log.iter().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(r.replica.as_str()).or_default() += 1;
        m
    });
    eprintln!(
        "{} reconciles ({by_replica:?}) of {OBJECTS} keys under {writes} random updates; \
         {handovers} keys moved between replicas; {overlaps} overlaps; \
         all reconciled at their final state {reconciled_in:?} after the last write, \
         {:?} after the last membership change",
        log.len(),
        changed.elapsed()
    );
    assert_eq!(overlaps, 0);
    // No object was deleted: a reconcile that found none read a cache that
    // did not hold its slot yet.
    let gone: Vec<&Reconcile> = log.iter().filter(|r| r.seen == GONE).collect();
    assert!(gone.is_empty(), "reconciled as deleted: {gone:?}");
    // Every replica took part, and keys moved between them.
    assert_eq!(by_replica.len(), 4, "{by_replica:?}");
    assert!(handovers > 0);
    let text = a.metrics.encode();
    assert!(
        text.contains("kinformer_ring_keys_handed_over_total"),
        "{text}"
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_whose_slot_lease_is_lost_is_aborted() {
    use k8s_openapi::api::coordination::v1::Lease;

    let env = sharded_env().await;
    let (api, slots, _ns) = config_maps(env, "lost", 1).await;
    let ns = api.namespace().unwrap().to_owned();
    let log: Log = Arc::default();
    let mut a = Replica::start(env, &ns, "a", &log, true);
    settled(&[&a], &slots).await;
    patch_v(&api, &name(0), "block").await;
    let blocked = || {
        log.lock()
            .iter()
            .find(|r| r.seen == "block")
            .map(|r| r.end.is_some())
    };
    common::eventually("the blocking reconcile to start", async || {
        blocked().is_some()
    })
    .await;
    // Someone else takes the slot's Lease: the next renewal finds it taken,
    // and the reconcile must end before the intruder could start work.
    let slot = slots[&format!("{ns}/{}", name(0))];
    let leases: Api<Lease> = Api::namespaced(env.client().unwrap(), &ns);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    leases
        .patch(
            &format!("sharded-slot-{slot}"),
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"holderIdentity": "intruder", "renewTime": now}}),
            ),
        )
        .await
        .unwrap();
    common::eventually("the reconcile to be aborted", async || {
        blocked() == Some(true)
    })
    .await;
    a.stop().await;
}

/// The value of the controller's workqueue metric `name`, if reported.
fn queue_metric(replica: &Replica, name: &str) -> Option<u64> {
    replica
        .metrics
        .encode()
        .lines()
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{'))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The count of adds to the controller's workqueue, from its metrics.
fn queue_adds(replica: &Replica) -> u64 {
    queue_metric(replica, "workqueue_adds_total").unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_deleted_while_its_key_is_reconciled_has_its_deletion_reconciled() {
    let env = sharded_env().await;
    let (api, slots, _ns) = config_maps(env, "deleted", 1).await;
    let ns = api.namespace().unwrap().to_owned();
    let key = format!("{ns}/{}", name(0));
    let log: Log = Arc::default();
    let hold = Arc::new(tokio::sync::Notify::new());
    let mut a = Replica::start_with(
        env,
        &ns,
        "a",
        &log,
        true,
        Extras {
            hold: Arc::clone(&hold),
            ..Extras::default()
        },
    );
    settled(&[&a], &slots).await;
    patch_v(&api, &name(0), "hold").await;
    common::eventually("the held reconcile to start", async || {
        log.lock().iter().any(|r| r.seen == "hold")
    })
    .await;
    // Deleted while reconciled: the delete enqueues the key again.
    let adds = queue_adds(&a);
    api.delete(&name(0), &Default::default()).await.unwrap();
    common::eventually("the delete to be enqueued", async || queue_adds(&a) > adds).await;
    hold.notify_one();
    common::eventually("the deletion to be reconciled", async || {
        log.lock().iter().any(|r| r.key == key && r.seen == GONE)
    })
    .await;
    a.stop().await;
}

/// The depth of the controller's workqueue, from its metrics (`u64::MAX`
/// until it is reported).
fn queue_depth(replica: &Replica) -> u64 {
    queue_metric(replica, "workqueue_depth").unwrap_or(u64::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_the_event_filter_turned_down_are_not_reconciled_when_their_slot_is_taken() {
    let env = sharded_env().await;
    let (api, slots, _ns) = config_maps(env, "filtered", 100).await;
    let ns = api.namespace().unwrap().to_owned();
    // Every other key of each slot is at "skip" before the replica starts:
    // the filter turns its add down. Each slot keeps a key that passes, so
    // that its reconcile shows the slot was taken and primed.
    let mut by_slot: BTreeMap<u32, Vec<&String>> = BTreeMap::new();
    for (key, slot) in &slots {
        by_slot.entry(*slot).or_default().push(key);
    }
    let skipped: BTreeSet<String> = by_slot
        .values()
        .flat_map(|keys| keys.iter().skip(1).step_by(2))
        .map(|key| (*key).clone())
        .collect();
    assert!(!skipped.is_empty());
    for key in &skipped {
        patch_v(&api, key.rsplit('/').next().unwrap(), "skip").await;
    }
    let log: Log = Arc::default();
    // Adds and updates of objects at "skip" are turned down.
    let extras = Extras {
        filter: Some(|e| match e {
            Event::Add(cm) | Event::Update { new: cm, .. } => v_of(cm) != "skip",
            Event::Delete(_) => true,
        }),
        ..Extras::default()
    };
    let mut a = Replica::start_with(env, &ns, "a", &log, true, extras);
    settled(&[&a], &slots).await;
    let wanted: BTreeSet<&String> = slots.keys().filter(|k| !skipped.contains(*k)).collect();
    common::eventually(
        "the keys the filter passes to be reconciled and the queue to drain",
        async || {
            let log = log.lock();
            let done: BTreeSet<&String> = log.iter().map(|r| &r.key).collect();
            wanted.iter().all(|k| done.contains(*k))
                && log.iter().all(|r| r.end.is_some())
                && queue_depth(&a) == 0
        },
    )
    .await;
    let wrong: Vec<String> = log
        .lock()
        .iter()
        .filter(|r| skipped.contains(&r.key))
        .map(|r| r.key.clone())
        .collect();
    assert!(
        wrong.is_empty(),
        "keys the filter turned down were reconciled: {wrong:?}"
    );
    // An update the filter passes is reconciled.
    let key = skipped.iter().next().unwrap();
    patch_v(&api, key.rsplit('/').next().unwrap(), "go").await;
    common::eventually("the passed update to be reconciled", async || {
        log.lock().iter().any(|r| &r.key == key && r.seen == "go")
    })
    .await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_the_filter_passed_whose_reconcile_died_with_its_replica_is_reconciled_by_the_next_holder()
 {
    let env = sharded_env().await;
    let (api, slots, _ns) = config_maps(env, "passed", 100).await;
    let ns = api.namespace().unwrap().to_owned();
    let log: Log = Arc::default();
    // Updates pass; adds of objects at "hold" are turned down, so only the
    // update itself can bring the key to a new holder's workers.
    let hold = Arc::new(tokio::sync::Notify::new());
    let filtered = || Extras {
        filter: Some(|e| match e {
            Event::Add(cm) => v_of(cm) != "hold",
            _ => true,
        }),
        hold: Arc::clone(&hold),
        ..Extras::default()
    };
    let mut a = Replica::start_with(env, &ns, "a", &log, false, filtered());
    let mut b = Replica::start_with(env, &ns, "b", &log, false, filtered());
    settled_with(&[&a, &b], &slots, false).await;
    let (key, _) = slots
        .iter()
        .find(|(_, s)| b.ring.held().contains(s))
        .expect("b holds a slot with a key");
    let key = key.clone();
    // b starts reconciling the update and dies before it ends; a saw the
    // update too (whole caches) and left it to b.
    patch_v(&api, key.rsplit('/').next().unwrap(), "hold").await;
    common::eventually("b to start reconciling the update", async || {
        log.lock()
            .iter()
            .any(|r| r.replica == "b" && r.key == key && r.seen == "hold")
    })
    .await;
    b.kill();
    common::eventually(
        "a to reconcile the update once it holds the slot",
        async || {
            log.lock()
                .iter()
                .any(|r| r.replica == "a" && r.key == key && r.seen == "hold")
        },
    )
    .await;
    hold.notify_one();
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_whole_caches_the_keys_of_a_dead_replicas_slots_are_reconciled_without_a_write() {
    let env = sharded_env().await;
    let (api, slots, _ns) = config_maps(env, "takeover", 100).await;
    let ns = api.namespace().unwrap().to_owned();
    let log: Log = Arc::default();
    let mut a = Replica::start(env, &ns, "a", &log, false);
    let mut b = Replica::start(env, &ns, "b", &log, false);
    settled_with(&[&a, &b], &slots, false).await;
    let lost = b.ring.held();
    b.kill();
    let killed = Instant::now();
    settled_with(&[&a], &slots, false).await;
    // No object changes: the keys of b's slots are enqueued as a takes them.
    let theirs: BTreeSet<&String> = slots
        .iter()
        .filter(|(_, s)| lost.contains(s))
        .map(|(k, _)| k)
        .collect();
    assert!(!theirs.is_empty());
    common::eventually("a to reconcile the keys of b's slots", async || {
        let done: BTreeSet<String> = log
            .lock()
            .iter()
            .filter(|r| r.replica == "a" && r.start > killed && r.end.is_some())
            .map(|r| r.key.clone())
            .collect();
        theirs.iter().all(|k| done.contains(*k))
    })
    .await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_built_sharded_from_a_factory_caches_only_its_slots() {
    use kinformer_informer::SharedInformerFactory;

    let env = sharded_env().await;
    let (api, slots, _ns) = config_maps(env, "builder", 60).await;
    let ns = api.namespace().unwrap().to_owned();
    let shutdown = CancellationToken::new();
    let mut replicas = Vec::new();
    for id in ["a", "b"] {
        let client = env.client().unwrap();
        let mut config = RingConfig::new(&ns, "built", id);
        config.slots = SLOTS;
        config.lease_duration = LEASE;
        config.renew_deadline = Duration::from_secs(2);
        config.retry_period = Duration::from_millis(500);
        let ring = Ring::new(client.clone(), config).unwrap();
        let factory = SharedInformerFactory::new(client).namespace(&ns);
        let mut builder =
            Controller::<ConfigMap>::builder("built", &factory).sharded(Arc::clone(&ring));
        let informer = builder.informer();
        let controller = builder
            .reconcile(Arc::new(()), |_, _| async { Ok(Action::Done) })
            .unwrap();
        tokio::spawn(controller.run(shutdown.clone()));
        replicas.push((ring, informer));
    }
    // Each caches exactly the objects of the slots it holds, all slots held.
    common::eventually("the replicas to split the objects", async || {
        let held: Vec<BTreeSet<u32>> = replicas.iter().map(|(r, _)| r.held()).collect();
        let all: BTreeSet<u32> = held.iter().flatten().copied().collect();
        all.len() == SLOTS as usize
            && held.iter().all(|h| h.len() <= SLOTS as usize / 2)
            && replicas.iter().zip(&held).all(|((_, informer), mine)| {
                let want: BTreeSet<&String> = slots
                    .iter()
                    .filter(|(_, s)| mine.contains(s))
                    .map(|(k, _)| k)
                    .collect();
                let have: BTreeSet<String> = informer.indexer().list_keys().into_iter().collect();
                have.len() == want.len() && want.iter().all(|k| have.contains(*k))
            })
    })
    .await;
    for (_, informer) in &replicas {
        assert!(informer.indexer().len() < slots.len());
    }
    shutdown.cancel();
}
