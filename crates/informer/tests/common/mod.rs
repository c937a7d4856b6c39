//! Helpers shared by the tests that run against the real API server.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kinformer_informer::consistency::{Difference, LastSeen, diff, diff_cache, server_versions};
use kinformer_informer::{FifoKind, InformerOptions, SharedIndexInformer};
use kinformer_store::Object;
use kube_client::Resource;
use kube_client::api::{Api, DeleteParams, PostParams};
use serde::de::DeserializeOwned;

/// The queue the informers of these tests use: a RealFifo when
/// `KINFORMER_TEST_FIFO=real` (`cargo xtask test` runs the informer tests
/// once per queue), otherwise the default DeltaFifo.
pub fn fifo() -> FifoKind {
    match std::env::var("KINFORMER_TEST_FIFO").as_deref() {
        Ok("real") => FifoKind::RealFifo,
        _ => FifoKind::DeltaFifo,
    }
}

/// Informer options on the queue of [`fifo`].
pub fn options<K>() -> InformerOptions<K> {
    InformerOptions::new().fifo(fifo())
}

/// Every list and watch error an informer reported, with when.
#[derive(Clone, Default)]
pub struct Reported(Arc<parking_lot::Mutex<Vec<(Instant, String)>>>);

impl Reported {
    /// Whether any reported error contains `needle`.
    pub fn any(&self, needle: &str) -> bool {
        self.0.lock().iter().any(|(_, e)| e.contains(needle))
    }

    /// The messages so far.
    pub fn messages(&self) -> Vec<String> {
        self.0.lock().iter().map(|(_, e)| e.clone()).collect()
    }

    /// The errors so far, with when they were reported.
    pub fn all(&self) -> Vec<(Instant, String)> {
        self.0.lock().clone()
    }
}

/// Collects the errors `informer` reports (set before it starts).
pub fn errors_seen<K: Object + Clone>(informer: &SharedIndexInformer<K>) -> Reported {
    let reported = Reported::default();
    let sink = Arc::clone(&reported.0);
    informer
        .set_watch_error_handler(move |e| sink.lock().push((Instant::now(), e.to_string())))
        .unwrap();
    reported
}

/// A Pod that the API server accepts without nodes.
pub fn pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"gen": "0"}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]}
    }))
    .unwrap()
}

/// Creates the Pods, 16 at a time.
pub async fn create_pods(api: &Api<Pod>, names: impl Iterator<Item = String>) {
    stream::iter(names)
        .for_each_concurrent(16, |name| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &pod(&name))
                    .await
                    .unwrap();
            }
        })
        .await;
}

/// Deletes the Pods, 16 at a time.
pub async fn delete_pods(api: &Api<Pod>, names: impl Iterator<Item = String>) {
    stream::iter(names)
        .for_each_concurrent(16, |name| {
            let api = api.clone();
            async move {
                api.delete(&name, &DeleteParams::default()).await.unwrap();
            }
        })
        .await;
}

/// Waits up to 30 s for the informer to sync.
pub async fn wait_synced<K: Object + Clone>(informer: &SharedIndexInformer<K>) {
    for _ in 0..300 {
        if informer.has_synced() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("informer did not sync in 30 s");
}

/// Waits until the cache and every handler agree with the server; panics
/// with the differences otherwise, and if any handler got a notification
/// that did not follow from the one before it (a sequence violation).
pub async fn no_difference<'a, K>(
    api: &Api<K>,
    informer: &SharedIndexInformer<K>,
    seen: impl IntoIterator<Item = &'a LastSeen>,
    within: Duration,
) where
    K: Resource + Object + Clone + DeserializeOwned + std::fmt::Debug,
{
    let seen: Vec<&LastSeen> = seen.into_iter().collect();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let cache = diff_cache(informer, api).await.unwrap();
        let server = server_versions(api).await.unwrap();
        let handler: Vec<Difference> = seen
            .iter()
            .flat_map(|s| diff(&server, &s.snapshot()))
            .collect();
        if cache.is_empty() && handler.is_empty() {
            assert_no_violations(&seen);
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let show = |d: &[Difference]| {
                d.iter()
                    .take(10)
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            panic!(
                "after {within:?}: cache differs in {} ({}); handlers differ in {} ({})",
                cache.len(),
                show(&cache),
                handler.len(),
                show(&handler)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Panics with the sequence violations any of the handlers recorded.
pub fn assert_no_violations(seen: &[&LastSeen]) {
    let violations: Vec<String> = seen
        .iter()
        .flat_map(|s| s.violations())
        .map(|v| v.to_string())
        .collect();
    assert!(
        violations.is_empty(),
        "{} sequence violations: {}",
        violations.len(),
        violations
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ")
    );
}
