//! Sharded list and watch against the real server: with kube-apiserver's
//! `ShardedListAndWatch` gate on, the server's hash is the client's (over
//! thousands of objects, by uid and by namespace), shards split the objects
//! exactly, and sharded informers (list + watch, and the streaming list)
//! hold exactly their shard through creates, updates and deletes. With the
//! gate off (the shared server) the client filters and says so.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_envtest::{TestEnv, TestEnvOptions};
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, FifoKind, HashRange, InformerOptions, ListRequest,
    ListerWatcher, ReflectorOptions, ShardEnforcement, ShardField, ShardScope, ShardSelector,
    ShardStats, SharedIndexInformer,
};
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use tokio::sync::OnceCell;

mod common;

/// One server with the gate on for this test binary.
async fn sharded_env() -> &'static TestEnv {
    static ENV: OnceCell<&'static TestEnv> = OnceCell::const_new();
    ENV.get_or_init(|| async {
        TestEnv::start_with(TestEnvOptions::new().sharded_list_and_watch())
            .await
            .unwrap()
            .into_static()
    })
    .await
}

/// Every ConfigMap of these tests is labelled with the test that made it,
/// so that a test listing all namespaces sees only its own.
const TEST_LABEL: &str = "kinformer.dev/shard-test";

fn config_map(name: &str, test: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {TEST_LABEL: test}},
        "data": {"v": "0"}
    }))
    .unwrap()
}

async fn create_config_maps(api: &Api<ConfigMap>, test: &str, names: impl Iterator<Item = String>) {
    stream::iter(names)
        .for_each_concurrent(32, |name| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &config_map(&name, test))
                    .await
                    .unwrap();
            }
        })
        .await;
}

fn uid_shards(n: u64) -> Vec<ShardSelector> {
    (0..n)
        .map(|i| ShardSelector::new(ShardField::Uid, [HashRange::split(i, n).unwrap()]).unwrap())
        .collect()
}

/// Every page of a list through `lw`, keyed `namespace/name` -> uid.
async fn list_all(lw: &ApiListerWatcher<ConfigMap>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut token = None;
    loop {
        let page = lw
            .list(ListRequest {
                limit: Some(300),
                continue_token: token.take(),
                resource_version: None,
            })
            .await
            .unwrap();
        for cm in page.items {
            let meta = cm.metadata;
            out.insert(
                format!("{}/{}", meta.namespace.unwrap(), meta.name.unwrap()),
                meta.uid.unwrap(),
            );
        }
        match page.continue_token {
            Some(t) => token = Some(t),
            None => return out,
        }
    }
}

/// Lists every ConfigMap once whole and once per shard, and asserts the
/// shards are disjoint, cover the whole, and that the server applied each
/// selector with nothing left for the client to drop: a client hash that
/// differed from the server's would drop objects the server sent.
async fn shards_split_exactly(client: &Client, shards: &[ShardSelector]) -> usize {
    // Only this test's ConfigMaps: the others change while it lists.
    let labels = format!("{TEST_LABEL}=hash");
    let all = || ApiListerWatcher::<ConfigMap>::all(client.clone()).labels(&labels);
    let whole = list_all(&all()).await;
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for shard in shards {
        let lw = all().shard(shard.clone());
        let part = list_all(&lw).await;
        let stats = lw.shard_stats().unwrap();
        assert_eq!(stats.enforcement(), ShardEnforcement::Server, "{shard}");
        assert_eq!(
            stats.filtered_on_client(),
            0,
            "the server sent objects the client hashes outside {shard}"
        );
        for (key, uid) in part {
            assert!(
                seen.insert(key.clone(), uid).is_none(),
                "{key} in two shards"
            );
        }
    }
    assert_eq!(seen, whole, "the shards do not cover every object");
    whole.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_shard_hash_is_the_clients_over_thousands_of_objects() {
    let env = sharded_env().await;
    let client = env.client().unwrap();
    // 3 000 ConfigMaps in 30 namespaces: uids and namespaces to hash.
    let namespaces: Vec<kinformer_envtest::TestNamespace> = stream::iter(0..30)
        .then(|_| env.create_namespace("hash"))
        .map(Result::unwrap)
        .collect()
        .await;
    stream::iter(&namespaces)
        .for_each_concurrent(4, |ns| {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
            async move { create_config_maps(&api, "hash", (0..100).map(|i| format!("c{i}"))).await }
        })
        .await;

    for n in [2, 3, 7] {
        let total = shards_split_exactly(&client, &uid_shards(n)).await;
        assert_eq!(total, 3000);
    }
    // Several ranges in one selector: the even eighths, then the odd ones.
    let eighths = |parity: u64| {
        ShardSelector::new(
            ShardField::Uid,
            (0..8)
                .filter(|i| i % 2 == parity)
                .map(|i| HashRange::split(i, 8).unwrap()),
        )
        .unwrap()
    };
    shards_split_exactly(&client, &[eighths(0), eighths(1)]).await;
    // By namespace: every ConfigMap of a namespace lands in one shard.
    let by_namespace: Vec<ShardSelector> = (0..4)
        .map(|i| {
            ShardSelector::new(ShardField::Namespace, [HashRange::split(i, 4).unwrap()]).unwrap()
        })
        .collect();
    shards_split_exactly(&client, &by_namespace).await;
    // Sanity: the namespaces do spread over the shards.
    let used: BTreeSet<usize> = namespaces
        .iter()
        .map(|ns| {
            by_namespace
                .iter()
                .position(|s| s.contains_value(ns))
                .unwrap()
        })
        .collect();
    assert!(used.len() > 1, "{used:?}");
}

fn start_informer(
    client: Client,
    ns: &str,
    shard: ShardSelector,
    watch_list: bool,
) -> (SharedIndexInformer<ConfigMap>, Arc<ShardStats>) {
    let lw = ApiListerWatcher::<ConfigMap>::namespaced(client, ns).shard(shard);
    let stats = lw.shard_stats().unwrap();
    let mut reflector = ReflectorOptions::default();
    reflector.use_watch_list = watch_list;
    let informer = SharedIndexInformer::new(lw, common::options().reflector(reflector));
    (informer, stats)
}

/// The `namespace/name`s of the server's ConfigMaps in `ns` that `shard` holds.
async fn server_shard(api: &Api<ConfigMap>, shard: &ShardSelector) -> BTreeSet<String> {
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|cm| shard.matches(cm))
        .map(|cm| {
            format!(
                "{}/{}",
                cm.metadata.namespace.unwrap(),
                cm.metadata.name.unwrap()
            )
        })
        .collect()
}

/// Waits until each informer's cache holds exactly its shard of the server,
/// at the server's resource versions.
async fn caches_hold_their_shards(
    api: &Api<ConfigMap>,
    informers: &[(SharedIndexInformer<ConfigMap>, ShardSelector)],
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let server = api.list(&Default::default()).await.unwrap().items;
        let mut ok = true;
        for (informer, shard) in informers {
            let want: BTreeMap<String, Option<String>> = server
                .iter()
                .filter(|cm| shard.matches(*cm))
                .map(|cm| {
                    (
                        cm.metadata.name.clone().unwrap(),
                        cm.metadata.resource_version.clone(),
                    )
                })
                .collect();
            let have: BTreeMap<String, Option<String>> = informer
                .indexer()
                .list()
                .iter()
                .map(|cm| {
                    (
                        cm.metadata.name.clone().unwrap(),
                        cm.metadata.resource_version.clone(),
                    )
                })
                .collect();
            ok &= want == have;
        }
        if ok {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sharded caches do not hold their shards after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn sharded_informers_follow_the_server(env: &TestEnv, watch_list: bool) {
    let client = env.client().unwrap();
    let ns = env.create_namespace("sharded").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    create_config_maps(&api, "informers", (0..300).map(|i| format!("c{i}"))).await;
    let shards = uid_shards(3);
    let shutdown = CancellationToken::new();
    let mut informers = Vec::new();
    let mut stats = Vec::new();
    for shard in &shards {
        let (informer, s) = start_informer(client.clone(), &ns, shard.clone(), watch_list);
        let (i, stop) = (informer.clone(), shutdown.clone());
        tokio::spawn(async move { i.run(stop).await });
        informers.push((informer, shard.clone()));
        stats.push(s);
    }
    for (informer, _) in &informers {
        common::wait_synced(informer).await;
    }
    caches_hold_their_shards(&api, &informers).await;
    // Watched changes: new objects, updates, deletes.
    create_config_maps(&api, "informers", (300..400).map(|i| format!("c{i}"))).await;
    for i in (0..300).step_by(4) {
        let patch = serde_json::json!({"data": {"v": "1"}});
        api.patch(
            &format!("c{i}"),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .unwrap();
    }
    for i in (1..300).step_by(5) {
        api.delete(&format!("c{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    caches_hold_their_shards(&api, &informers).await;
    let sizes: Vec<usize> = informers.iter().map(|(i, _)| i.indexer().len()).collect();
    let total: usize = sizes.iter().sum();
    assert_eq!(total, server_shard(&api, &uid_shards(1)[0]).await.len());
    assert!(sizes.iter().all(|&n| n > 0), "{sizes:?}");
    // The server applied every selector: nothing reached a wrong shard. Only
    // a list echoes the selector; a streaming list never does.
    let expected = if watch_list {
        ShardEnforcement::Unconfirmed
    } else {
        ShardEnforcement::Server
    };
    for s in &stats {
        assert_eq!((s.enforcement(), s.filtered_on_client()), (expected, 0));
    }
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_informers_hold_exactly_their_shards_through_list_and_watch() {
    sharded_informers_follow_the_server(sharded_env().await, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_informers_hold_exactly_their_shards_from_a_streaming_list() {
    sharded_informers_follow_the_server(sharded_env().await, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_gate_is_filtered_on_the_client_and_says_so() {
    // The shared server runs without the feature gate.
    let env = TestEnv::shared().await.unwrap();
    let client = env.client().unwrap();
    let ns = env.create_namespace("unsharded").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    create_config_maps(&api, "unsharded", (0..200).map(|i| format!("c{i}"))).await;
    let shard = uid_shards(2).remove(0);
    let (informer, stats) = start_informer(client, &ns, shard.clone(), false);
    let shutdown = CancellationToken::new();
    let (i, stop) = (informer.clone(), shutdown.clone());
    tokio::spawn(async move { i.run(stop).await });
    common::wait_synced(&informer).await;
    let informers = [(informer, shard.clone())];
    caches_hold_their_shards(&api, &informers).await;
    let outside = 200 - server_shard(&api, &shard).await.len();
    assert!(outside > 0);
    assert_eq!(stats.enforcement(), ShardEnforcement::Client);
    assert_eq!(stats.filtered_on_client(), outside as u64);
    shutdown.cancel();
}

/// An informer on a [`ShardScope`] moved from one shard to another holds
/// exactly the new shard: the watch of the old one ends, the Reflector
/// lists the new one, the objects that left arrive as deletions.
async fn a_rescoped_informer_follows_its_shard(watch_list: bool) {
    let env = sharded_env().await;
    let client = env.client().unwrap();
    let ns = env.create_namespace("rescoped").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    create_config_maps(&api, "rescoped", (0..200).map(|i| format!("c{i}"))).await;
    let quarters = uid_shards(4);
    let scope = ShardScope::new(quarters[0].clone());
    let lw = ApiListerWatcher::<ConfigMap>::namespaced(client, &ns).shard_scope(scope.clone());
    let stats = lw.shard_stats().unwrap();
    let mut reflector = ReflectorOptions::default();
    reflector.use_watch_list = watch_list;
    let informer = SharedIndexInformer::new(lw, common::options().reflector(reflector));
    let deleted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let d = Arc::clone(&deleted);
    informer
        .add_event_handler(
            kinformer_informer::ResourceEventHandlerFuncs::new().on_delete(move |_| {
                d.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }),
        )
        .unwrap();
    let shutdown = CancellationToken::new();
    let (i, stop) = (informer.clone(), shutdown.clone());
    tokio::spawn(async move { i.run(stop).await });
    common::wait_synced(&informer).await;
    caches_hold_their_shards(&api, &[(informer.clone(), quarters[0].clone())]).await;
    let first = informer.indexer().len();
    // Two quarters, one of them new; then a change made after the move.
    let half = ShardSelector::new(
        ShardField::Uid,
        [quarters[0].ranges()[0], quarters[1].ranges()[0]],
    )
    .unwrap();
    assert!(scope.set(half.clone()));
    assert!(!scope.set(half.clone()), "the same shard is no change");
    caches_hold_their_shards(&api, &[(informer.clone(), half.clone())]).await;
    assert!(informer.indexer().len() > first);
    // Then only the second quarter: the first's objects leave as deletions.
    scope.set(quarters[1].clone());
    api.patch(
        "c7",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"v": "1"}})),
    )
    .await
    .unwrap();
    caches_hold_their_shards(&api, &[(informer.clone(), quarters[1].clone())]).await;
    assert_eq!(deleted.load(std::sync::atomic::Ordering::SeqCst), first);
    assert_eq!(stats.filtered_on_client(), 0);
    let errors = informer
        .reflector_stats()
        .unwrap()
        .errors
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(errors, 0, "a change of shard is no error");
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescoped_informer_holds_exactly_its_new_shard_through_list_and_watch() {
    a_rescoped_informer_follows_its_shard(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescoped_informer_holds_exactly_its_new_shard_from_a_streaming_list() {
    a_rescoped_informer_follows_its_shard(true).await;
}

/// A write to an object of another shard moves the cache's resourceVersion
/// past it at once (the filtered event is passed on as a bookmark), so a
/// controller that waits for its cache to catch up with that write is not
/// held until the server's next bookmark, about a minute away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_another_shard_is_caught_up_with_at_once_when_filtered_on_the_client() {
    let env = TestEnv::shared().await.unwrap();
    let client = env.client().unwrap();
    let ns = env.create_namespace("shard-rv").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    create_config_maps(&api, "shard-rv", (0..40).map(|i| format!("c{i}"))).await;
    let shard = uid_shards(2).remove(0);
    // The atomic queue, whichever the suite runs on: only it says which
    // version its cache holds.
    let lw = ApiListerWatcher::<ConfigMap>::namespaced(client, &ns).shard(shard.clone());
    let mut reflector = ReflectorOptions::default();
    reflector.use_watch_list = false;
    let informer = SharedIndexInformer::new(
        lw,
        InformerOptions::new()
            .fifo(FifoKind::AtomicFifo)
            .reflector(reflector),
    );
    let shutdown = CancellationToken::new();
    let (i, stop) = (informer.clone(), shutdown.clone());
    tokio::spawn(async move { i.run(stop).await });
    common::wait_synced(&informer).await;
    let inside = server_shard(&api, &shard).await;
    let outside = (0..40)
        .map(|i| format!("c{i}"))
        .find(|name| !inside.contains(&format!("{ns}/{name}")))
        .expect("an object of the other shard");
    let patch = serde_json::json!({"data": {"v": "1"}});
    let written = api
        .patch(&outside, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    let rv = written.metadata.resource_version.unwrap();
    tokio::time::timeout(Duration::from_secs(10), informer.wait_caught_up_to(&rv))
        .await
        .expect("the cache did not pass another shard's write within 10 s")
        .unwrap();
    assert!(informer.lister().get(&format!("{ns}/{outside}")).is_none());
    shutdown.cancel();
}
