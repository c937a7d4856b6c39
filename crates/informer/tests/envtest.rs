//! The informer against a real kube-apiserver and etcd: churn, a server
//! restart, a compaction that forces 410 and a relist with missed deletes,
//! and a paged initial list. Each ends with the cache and every handler's
//! last view equal to a fresh list from the server, by UID and resourceVersion.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kinformer_envtest::{Proxy, TestEnv, TestEnvOptions};
use kinformer_informer::consistency::LastSeen;
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, ReflectorOptions, SharedIndexInformer,
    strip_managed_fields,
};
use kube_client::Client;
use kube_client::api::{Api, Patch, PatchParams};

mod common;
use common::{create_pods, delete_pods, no_difference, wait_synced};

fn start(
    client: Client,
    ns: &str,
    reflector: ReflectorOptions,
) -> (SharedIndexInformer<Pod>, [LastSeen; 2], CancellationToken) {
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<Pod>::namespaced(client, ns),
        common::options().reflector(reflector),
    );
    informer.set_transform(strip_managed_fields).unwrap();
    let seen = [LastSeen::default(), LastSeen::default()];
    for s in &seen {
        informer.add_event_handler(s.clone()).unwrap();
    }
    let shutdown = CancellationToken::new();
    let i = informer.clone();
    let s = shutdown.clone();
    tokio::spawn(async move { i.run(s).await });
    (informer, seen, shutdown)
}

async fn label_pods(api: &Api<Pod>, names: impl Iterator<Item = String>, generation: u32) {
    stream::iter(names)
        .for_each_concurrent(16, |name| {
            let api = api.clone();
            async move {
                let patch =
                    serde_json::json!({"metadata": {"labels": {"gen": generation.to_string()}}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .unwrap();
            }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_pods_created_updated_and_deleted_end_with_the_cache_equal_to_the_server() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("churn").await.unwrap();
    let client = env.client().unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Some pods exist before the informer starts.
    create_pods(&api, (0..100).map(|i| format!("p{i}"))).await;
    let (informer, seen, shutdown) = start(client, &ns, ReflectorOptions::default());
    wait_synced(&informer).await;
    create_pods(&api, (100..1000).map(|i| format!("p{i}"))).await;
    // A handler added mid-churn: the cache replayed as adds, then every
    // change, with no add, update or delete out of sequence.
    let late = LastSeen::default();
    informer.add_event_handler(late.clone()).unwrap();
    label_pods(&api, (0..1000).step_by(2).map(|i| format!("p{i}")), 1).await;
    delete_pods(&api, (0..1000).step_by(3).map(|i| format!("p{i}"))).await;
    label_pods(&api, (1..1000).step_by(3).map(|i| format!("p{i}")), 2).await;
    no_difference(
        &api,
        &informer,
        seen.iter().chain([&late]),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(informer.indexer().len(), 666);
    let stats = informer.reflector_stats().unwrap();
    assert_eq!(
        stats.lists_completed.load(Ordering::Relaxed),
        1,
        "no relist was needed"
    );
    // managedFields were stripped by the transform.
    assert!(
        informer
            .indexer()
            .list()
            .iter()
            .all(|p| p.metadata.managed_fields.is_none())
    );
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_apiserver_restart_mid_watch_loses_nothing() {
    let mut env = TestEnv::start().await.unwrap();
    let ns = env.create_namespace("restart").await.unwrap();
    let client = env.client().unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create_pods(&api, (0..50).map(|i| format!("p{i}"))).await;
    let mut fast = ReflectorOptions::default();
    fast.backoff.initial = Duration::from_millis(100);
    fast.backoff.max = Duration::from_secs(1);
    let (informer, seen, shutdown) = start(client, &ns, fast);
    wait_synced(&informer).await;
    env.restart_apiserver().await.unwrap();
    // Writes after the restart, through a fresh client.
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    create_pods(&api, (50..80).map(|i| format!("p{i}"))).await;
    delete_pods(&api, (0..20).map(|i| format!("p{i}"))).await;
    label_pods(&api, (20..80).map(|i| format!("p{i}")), 1).await;
    no_difference(&api, &informer, &seen, Duration::from_secs(60)).await;
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_forces_410_and_the_relist_delivers_missed_deletes_as_tombstones() {
    // Without the watch cache, an etcd compaction makes the old version 410 at once.
    let env = TestEnv::start_with(TestEnvOptions::new().without_watch_cache())
        .await
        .unwrap();
    let ns = env.create_namespace("gone").await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    create_pods(&api, (0..60).map(|i| format!("p{i}"))).await;
    let proxy = Proxy::start(env.api_port()).await.unwrap();
    let mut fast = ReflectorOptions::default();
    fast.backoff.initial = Duration::from_millis(100);
    fast.backoff.max = Duration::from_millis(500);
    let (informer, seen, shutdown) = start(env.client_via(proxy.port()).unwrap(), &ns, fast);
    wait_synced(&informer).await;
    no_difference(&api, &informer, &seen, Duration::from_secs(30)).await;

    // The informer loses its connection; meanwhile pods are deleted and
    // created, and etcd forgets the history it would need to catch up.
    let errors_before = informer
        .reflector_stats()
        .unwrap()
        .errors
        .load(Ordering::SeqCst);
    proxy.refuse(true);
    proxy.cut_all();
    delete_pods(&api, (0..25).map(|i| format!("p{i}"))).await;
    create_pods(&api, (60..70).map(|i| format!("p{i}"))).await;
    env.compact_etcd().await.unwrap();
    // Until the Reflector has noticed that the server is gone.
    for _ in 0..300 {
        let errors = informer
            .reflector_stats()
            .unwrap()
            .errors
            .load(Ordering::SeqCst);
        if errors > errors_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.refuse(false);

    no_difference(&api, &informer, &seen, Duration::from_secs(60)).await;
    for s in &seen {
        assert_eq!(
            s.tombstones(),
            25,
            "each missed delete arrives as a tombstone"
        );
    }
    let stats = informer.reflector_stats().unwrap();
    assert!(
        stats.lists_completed.load(Ordering::Relaxed) >= 2,
        "a relist happened"
    );
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initial_list_of_2500_pods_is_paged_by_100() {
    // Served from etcd, where limit and continue apply (the watch cache may
    // answer a resourceVersion=0 list in one piece).
    let env = TestEnv::start_with(TestEnvOptions::new().without_watch_cache())
        .await
        .unwrap();
    let ns = env.create_namespace("paged").await.unwrap();
    let client = env.client().unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create_pods(&api, (0..2500).map(|i| format!("p{i:04}"))).await;
    let mut reflector = ReflectorOptions::default();
    reflector.page_size = Some(100);
    reflector.use_watch_list = false;
    let (informer, seen, shutdown) = start(client, &ns, reflector);
    wait_synced(&informer).await;
    let stats = informer.reflector_stats().unwrap();
    assert_eq!(stats.list_calls.load(Ordering::Relaxed), 25);
    no_difference(&api, &informer, &seen, Duration::from_secs(30)).await;
    assert_eq!(informer.indexer().len(), 2500);
    shutdown.cancel();
}
