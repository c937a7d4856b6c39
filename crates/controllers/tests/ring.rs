//! A sharded controller's ring membership against the real server: replicas
//! see each other through their member Leases, one that leaves drops out at
//! once, one that dies drops out once its Lease has not changed for the
//! lease duration; and every replica derives the same slot assignment.
//! Slot Leases: as replicas join, leave and die, no slot is ever worked on
//! by two replicas at overlapping times.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kinformer_controllers::ring::assign_slots;
use kinformer_controllers::{Ring, RingConfig, RingMembership};
use kinformer_envtest::TestEnv;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(2);

/// Polls `members` until it returns `want`, for up to `within`.
async fn until_members(m: &RingMembership, want: &[&str], within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let live = m.live_members().await.unwrap();
        if live == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} sees {live:?}, not {want:?}, after {within:?}",
            m.identity()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_see_each_other_and_drop_those_that_leave_or_die() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("ring").await.unwrap();
    let client = env.client().unwrap();
    let member = |id: &str| RingMembership::new(client.clone(), &ns, "demo", id, LEASE);
    let (a, b, c) = (member("a"), member("b"), member("c"));
    // Another ring in the same namespace is not seen.
    let other = RingMembership::new(client.clone(), &ns, "other", "x", LEASE);
    other.heartbeat().await.unwrap();
    for m in [&a, &b, &c] {
        m.heartbeat().await.unwrap();
    }
    for m in [&a, &b, &c] {
        until_members(m, &["a", "b", "c"], Duration::ZERO).await;
    }
    // Everyone computes the same owners from what they see.
    let seen: Vec<Vec<String>> = futures::future::join_all([&a, &b, &c].map(|m| m.live_members()))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let owners: Vec<Vec<usize>> = seen.iter().map(|s| assign_slots(16, s)).collect();
    assert!(owners.windows(2).all(|w| w[0] == w[1]));

    // c leaves cleanly: gone at the next look (b renewed just before, so
    // a slow machine cannot let its Lease look expired).
    c.leave().await.unwrap();
    b.heartbeat().await.unwrap();
    // b's last renewal is before this, and a first sees it after.
    let b_renewed = tokio::time::Instant::now();
    until_members(&a, &["a", "b"], Duration::ZERO).await;

    // b dies: it stops renewing, and drops out once its Lease has not
    // changed for the lease duration (on a's clock), not before.
    let renewing = async {
        loop {
            a.heartbeat().await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    tokio::select! {
        _ = renewing => unreachable!(),
        _ = until_members(&a, &["a"], LEASE * 5) => {}
    }
    assert!(
        b_renewed.elapsed() >= LEASE,
        "b dropped out {:?} after its last renewal, before the lease duration",
        b_renewed.elapsed()
    );
    // A renewal brings it back.
    b.heartbeat().await.unwrap();
    until_members(&a, &["a", "b"], Duration::ZERO).await;
}

/// One replica in a runtime of its own, so that it can be killed as a
/// process is: every task at once, nothing released.
struct Replica {
    id: String,
    runtime: Option<tokio::runtime::Runtime>,
    ring: Arc<Ring>,
    stop: CancellationToken,
    run: Option<tokio::task::JoinHandle<()>>,
}

impl Replica {
    /// Stops as SIGTERM would: hands its slots over and leaves the ring.
    async fn stop(&mut self) {
        self.stop.cancel();
        if let Some(run) = self.run.take() {
            run.await.unwrap();
        }
        self.kill();
    }

    /// Dies as SIGKILL would: every task at once, nothing released.
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

/// A reconcile-like piece of work on a slot, by replica `id`.
#[derive(Debug, Clone)]
struct Work {
    slot: u32,
    id: String,
    start: std::time::Instant,
    end: std::time::Instant,
}

fn start_replica(env: &'static TestEnv, ns: &str, id: &str, log: Arc<Mutex<Vec<Work>>>) -> Replica {
    start_replica_via(env, ns, id, log, None)
}

/// As [`start_replica`], talking to the server through `proxy` if given.
fn start_replica_via(
    env: &'static TestEnv,
    ns: &str,
    id: &str,
    log: Arc<Mutex<Vec<Work>>>,
    proxy: Option<u16>,
) -> Replica {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut config = RingConfig::new(ns, "work", id);
    config.slots = SLOTS;
    config.lease_duration = Duration::from_secs(3);
    config.renew_deadline = Duration::from_secs(2);
    config.retry_period = Duration::from_millis(500);
    // The client is made inside the replica's runtime: its tasks die with it.
    let ring = {
        let _inside = runtime.enter();
        let client = match proxy {
            Some(port) => env.client_via(port).unwrap(),
            None => env.client().unwrap(),
        };
        Ring::new(client, config).unwrap()
    };
    let stop = CancellationToken::new();
    let (r, s) = (Arc::clone(&ring), stop.clone());
    let run = runtime.spawn(async move { r.run(s).await });
    // A worker per slot, each piece of work as long as a retry period: a
    // Lease released before the work ended would let the next owner start
    // while it runs.
    for slot in 0..SLOTS {
        let (r, who, log) = (Arc::clone(&ring), id.to_owned(), Arc::clone(&log));
        runtime.spawn(async move {
            loop {
                if let Some(guard) = r.enter(slot) {
                    let start = std::time::Instant::now();
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    assert_eq!(guard.slot(), slot);
                    log.lock().push(Work {
                        slot,
                        id: who.clone(),
                        start,
                        end: std::time::Instant::now(),
                    });
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    Replica {
        id: id.to_owned(),
        runtime: Some(runtime),
        ring,
        stop,
        run: Some(run),
    }
}

const SLOTS: u32 = 8;

/// Waits until the replicas hold every slot between them, none twice, none
/// more than its share.
async fn settled(replicas: &[&Replica]) {
    let share = (SLOTS as usize).div_ceil(replicas.len());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        let held: Vec<BTreeSet<u32>> = replicas.iter().map(|r| r.ring.held()).collect();
        let all: BTreeSet<u32> = held.iter().flatten().copied().collect();
        let total: usize = held.iter().map(BTreeSet::len).sum();
        if all.len() == SLOTS as usize
            && total == SLOTS as usize
            && held.iter().all(|h| h.len() <= share)
        {
            return;
        }
        let ids: Vec<&str> = replicas.iter().map(|r| r.id.as_str()).collect();
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ids:?} hold {held:?} after 40 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_slot_is_worked_on_by_two_replicas_at_once_as_replicas_come_and_go() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("slots").await.unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut a = start_replica(env, &ns, "a", Arc::clone(&log));
    settled(&[&a]).await;
    let mut b = start_replica(env, &ns, "b", Arc::clone(&log));
    settled(&[&a, &b]).await;
    let mut c = start_replica(env, &ns, "c", Arc::clone(&log));
    settled(&[&a, &b, &c]).await;
    // b stops: it hands its slots over once its work on them has ended.
    b.stop().await;
    settled(&[&a, &c]).await;
    // c is killed: its slots come back once their Leases expire.
    c.kill();
    settled(&[&a]).await;

    let log = log.lock().clone();
    let mut handovers = 0;
    for slot in 0..SLOTS {
        let mut works: Vec<&Work> = log.iter().filter(|w| w.slot == slot).collect();
        works.sort_by_key(|w| w.start);
        for (i, w) in works.iter().enumerate() {
            for later in &works[i + 1..] {
                if later.id != w.id {
                    assert!(
                        later.start >= w.end,
                        "slot {slot}: {} worked {:?}..{:?} while {} was at it",
                        later.id,
                        later.start,
                        later.end,
                        w.id
                    );
                }
            }
        }
        handovers += works.windows(2).filter(|p| p[0].id != p[1].id).count();
    }
    // Each phase moved slots: a to b, to c, b's to the others, c's to a.
    assert!(handovers >= 4, "{handovers} handovers");
    eprintln!(
        "{} pieces of work over {SLOTS} slots, {handovers} handovers, no overlap",
        log.len()
    );
    a.stop().await;
}

const RETRY: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_whose_lease_was_lost_is_not_taken_again_until_the_work_of_that_tenure_ended() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_client::api::{Api, Patch, PatchParams};

    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("lost").await.unwrap();
    let mut config = RingConfig::new(&ns, "lost", "a");
    config.slots = 1;
    config.lease_duration = Duration::from_secs(3);
    config.renew_deadline = Duration::from_secs(2);
    config.retry_period = RETRY;
    let ring = Ring::new(env.client().unwrap(), config).unwrap();
    let metrics = kinformer_controllers::Metrics::new();
    ring.register_metrics(&metrics);
    let stop = CancellationToken::new();
    let (r, s) = (Arc::clone(&ring), stop.clone());
    let run = tokio::spawn(async move { r.run(s).await });
    let mut held = ring.subscribe();
    held.wait_for(|h| h.contains(&0)).await.unwrap();
    let guard = ring.enter(0).expect("slot 0 is held");

    // Someone else takes the Lease: the renewal finds it taken.
    let leases: Api<Lease> = Api::namespaced(env.client().unwrap(), &ns);
    let take = |holder: &str| {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        );
        serde_json::json!({"spec": {"holderIdentity": holder, "renewTime": now}})
    };
    leases
        .patch(
            "lost-slot-0",
            &PatchParams::default(),
            &Patch::Merge(take("intruder")),
        )
        .await
        .unwrap();
    held.wait_for(|h| !h.contains(&0)).await.unwrap();
    assert!(!guard.may_work());
    // The intruder lets go, but the work of the lost tenure is still on:
    // the slot must not be taken again meanwhile.
    leases
        .patch(
            "lost-slot-0",
            &PatchParams::default(),
            &Patch::Merge(take("")),
        )
        .await
        .unwrap();
    for _ in 0..10 {
        tokio::time::sleep(RETRY).await;
        assert!(
            ring.held().is_empty(),
            "slot 0 taken again while its old work runs"
        );
    }
    drop(guard);
    held.wait_for(|h| h.contains(&0)).await.unwrap();
    assert!(metrics.encode().contains("kinformer_ring_slots_held 1"));
    stop.cancel();
    run.await.unwrap();
    // Taken twice, given up twice (once lost, once at shutdown).
    let text = metrics.encode();
    for line in [
        "kinformer_ring_slot_acquisitions_total 2",
        "kinformer_ring_slot_handovers_total 2",
        "kinformer_ring_slot_acquire_wait_seconds_count 2",
        "kinformer_ring_slots_held 0",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_the_server_ignores_shows_as_filtered_on_the_client_in_the_metrics() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kinformer_informer::{
        ApiListerWatcher, HashRange, ListRequest, ListerWatcher, ShardField, ShardSelector,
    };
    use kube_client::api::{Api, PostParams};

    // The shared server runs without the ShardedListAndWatch gate.
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("shardmetrics").await.unwrap();
    let client = env.client().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for i in 0..40 {
        let cm: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("c{i}")}}))
                .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let half = ShardSelector::new(ShardField::Uid, [HashRange::split(0, 2).unwrap()]).unwrap();
    let lw = ApiListerWatcher::<ConfigMap>::namespaced(client, &ns).shard(half.clone());
    let metrics = kinformer_controllers::Metrics::new();
    metrics.add_shard_stats("configmaps", lw.shard_stats().unwrap());
    let page = lw.list(ListRequest::default()).await.unwrap();
    assert!(page.items.iter().all(|cm| half.matches(cm)));
    let outside = 40 - page.items.len();
    assert!(outside > 0);
    let text = metrics.encode();
    for line in [
        format!("kinformer_shard_filtered_on_client_total{{informer=\"configmaps\"}} {outside}"),
        "kinformer_shard_enforcement{informer=\"configmaps\",enforcement=\"client\"} 1".to_owned(),
        "kinformer_shard_enforcement{informer=\"configmaps\",enforcement=\"server\"} 0".to_owned(),
    ] {
        assert!(text.contains(&line), "no {line:?} in\n{text}");
    }
}

/// Every Lease of the namespace deleted at once (`kubectl delete leases
/// --all`, a clean-up), the ring's slot Leases too, while replica b is cut
/// off from the server: a sees b's member Lease gone and is assigned b's
/// slots, but a slot Lease it never saw and finds missing may have been
/// deleted under a holder still at work, so it waits a lease duration
/// before creating it. No slot may be worked on by two replicas at any
/// instant (sampled every millisecond). Before the fix a created b's slot
/// Leases at once, while b could still work on them for up to 2.5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_every_lease_of_the_ring_under_a_cut_off_replica_never_gives_a_slot_two_workers() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_client::api::{Api, DeleteParams, ListParams};

    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("ring-deleted").await.unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let proxy = kinformer_envtest::Proxy::start(env.api_port())
        .await
        .unwrap();
    let mut a = start_replica(env, &ns, "a", Arc::clone(&log));
    let mut b = start_replica_via(env, &ns, "b", Arc::clone(&log), Some(proxy.port()));
    settled(&[&a, &b]).await;
    let (ring_a, ring_b) = (Arc::clone(&a.ring), Arc::clone(&b.ring));
    let stop = CancellationToken::new();
    let sampler = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut both = 0usize;
            while !stop.is_cancelled() {
                both += (0..SLOTS)
                    .filter(|&s| ring_a.may_work(s) && ring_b.may_work(s))
                    .count();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            both
        }
    });
    proxy.blackhole(true);
    Api::<Lease>::namespaced(env.client().unwrap(), &ns)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    let mut held = a.ring.subscribe();
    tokio::time::timeout(
        Duration::from_secs(30),
        held.wait_for(|h| h.len() == SLOTS as usize),
    )
    .await
    .expect("a takes every slot once b's are over")
    .unwrap();
    stop.cancel();
    assert_eq!(
        sampler.await.unwrap(),
        0,
        "slot-ms sampled with a slot workable by both replicas"
    );
    b.kill();
    a.stop().await;
}
