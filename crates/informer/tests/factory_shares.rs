//! Counted informers: a factory's informer asked for with `share` runs while
//! a share of it lives; the last share gone, it is stopped, dropped from
//! the factory and its cache emptied, and the next share lists afresh. One
//! asked for with `informer` lives as long as the factory.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_informer::testing::FakeApiServer;
use kinformer_informer::{CancellationToken, SharedIndexInformer, SharedInformerFactory};
use serde_json::json;

fn config_map(name: &str) -> serde_json::Value {
    json!({"metadata": {"namespace": "ns", "name": name}})
}

/// Waits, yielding to the runtime, until `done` holds (for a minute at most).
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The requests made for ConfigMaps (lists and watches).
fn lists(api: &FakeApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|r| {
            r.resource
                .as_ref()
                .is_some_and(|g| g.resource == "configmaps")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_share_stops_the_informer_and_empties_its_cache() {
    let api = FakeApiServer::new();
    api.insert("configmaps", config_map("a"))
        .insert("configmaps", config_map("b"));
    let factory = SharedInformerFactory::new(api.client()).namespace("ns");
    let shutdown = CancellationToken::new();

    let first = factory.share::<ConfigMap>();
    let second = factory.share::<ConfigMap>();
    assert_eq!(first.id(), second.id(), "two shares of one informer");
    factory.start(&shutdown);
    until("synced", || first.has_synced()).await;
    let cache = first.indexer();
    assert_eq!(cache.len(), 2);
    let listed = lists(&api);

    // One share gone: the other still reads a running informer.
    drop(first);
    assert!(!second.is_stopped());
    api.insert("configmaps", config_map("c"));
    until("c seen", || cache.len() == 3).await;

    // The last share gone: stopped, out of the factory, its cache empty
    // although a reader of it is still held.
    let informer: SharedIndexInformer<ConfigMap> = (*second).clone();
    drop(second);
    until("stopped", || informer.is_stopped()).await;
    assert!(cache.is_empty(), "the cache was kept");

    // A new share is a fresh informer that lists again.
    let again = factory.share::<ConfigMap>();
    assert_ne!(again.id(), informer.id());
    factory.start(&shutdown);
    until("synced again", || again.has_synced()).await;
    assert_eq!(again.indexer().len(), 3);
    assert!(lists(&api) > listed, "no fresh list");
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_informer_the_factory_was_asked_for_outlives_its_shares() {
    let api = FakeApiServer::new();
    api.insert("configmaps", config_map("a"));
    let factory = SharedInformerFactory::new(api.client()).namespace("ns");
    let shutdown = CancellationToken::new();

    // Shared first, then asked for for good: pinned.
    let share = factory.share::<ConfigMap>();
    let pinned = factory.informer::<ConfigMap>();
    assert_eq!(share.id(), pinned.id());
    factory.start(&shutdown);
    until("synced", || pinned.has_synced()).await;
    drop(share);
    // A share made and dropped after does not release it either.
    drop(factory.share::<ConfigMap>());
    api.insert("configmaps", config_map("b"));
    until("b seen", || pinned.indexer().len() == 2).await;
    assert!(!pinned.is_stopped());
    assert_eq!(factory.informer::<ConfigMap>().id(), pinned.id());
    shutdown.cancel();
}

#[tokio::test]
async fn an_informer_stopped_before_it_runs_never_lists() {
    let api = FakeApiServer::new();
    let factory = SharedInformerFactory::new(api.client()).namespace("ns");
    let informer = factory.informer::<ConfigMap>();
    informer.stop();
    informer.run(CancellationToken::new()).await.unwrap();
    assert!(informer.is_stopped());
    assert_eq!(lists(&api), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_a_running_informer_whoever_started_it() {
    let api = FakeApiServer::new();
    api.insert("configmaps", config_map("a"));
    let factory = SharedInformerFactory::new(api.client()).namespace("ns");
    let informer = factory.informer::<ConfigMap>();
    let running = tokio::spawn({
        let informer = informer.clone();
        async move { informer.run(CancellationToken::new()).await }
    });
    until("synced", || informer.has_synced()).await;
    informer.stop();
    running.await.unwrap().unwrap();
    assert!(informer.is_stopped());
}
