//! Reads from a plain store against a compact one (JSON, with and without
//! a decoded-object cache of 1 000): `get`, `list()` of a store of 1 000
//! Pods, and `by_index` answering 1 000 of 10 000 Pods. The Pods are as the
//! server returns `cargo xtask bench`'s (defaults filled in, managedFields
//! dropped): what a controller reading many objects per reconcile pays for
//! the compact cache's memory.

use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use kinformer_store::{Compact, IndexFunc, Indexer, Indexers};

/// A Pod as kube-apiserver stores `cargo xtask bench`'s, defaults filled in.
fn pod(i: usize) -> Arc<Pod> {
    let pod = serde_json::json!({
        "metadata": {
            "name": format!("pod-{i:05}"),
            "namespace": "bench",
            "uid": format!("6f1c2a4e-0000-4000-8000-{i:012}"),
            "resourceVersion": (1000 + i).to_string(),
            "creationTimestamp": "2026-12-05T07:00:00Z",
            "labels": {"app": "bench", "tier": "web", "group": format!("g{}", i % 10)}
        },
        "spec": {
            "containers": [{
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300}
            ],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"}
    });
    Arc::new(serde_json::from_value(pod).expect("a valid Pod"))
}

const GROUP: &str = "group";

fn indexers() -> Indexers<Pod> {
    let f: IndexFunc<Pod> = Arc::new(|p: &Pod| {
        Ok(p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("group").cloned())
            .into_iter()
            .collect())
    });
    Indexers::from([(GROUP.to_owned(), f)])
}

/// The three caches compared, holding `n` Pods.
fn caches(n: usize) -> Vec<(&'static str, Indexer<Pod>)> {
    let caches = vec![
        ("plain", Indexer::with_indexers(indexers())),
        ("compact", Indexer::compact(indexers(), Compact::json())),
        (
            "compact_decoded_1000",
            Indexer::compact(indexers(), Compact::json().decoded_cache(1000)),
        ),
    ];
    for (_, cache) in &caches {
        for i in 0..n {
            cache.add(pod(i)).expect("added");
        }
    }
    caches
}

fn reads(c: &mut Criterion) {
    let mut g = c.benchmark_group("reads");
    for (name, cache) in caches(10_000) {
        g.throughput(Throughput::Elements(1));
        // Strided, so that a decoded cache of 1 000 mostly misses; the keys
        // are made before the clock runs.
        let keys: Vec<String> = (0..10_000)
            .map(|i| format!("bench/pod-{:05}", (i * 7919) % 10_000))
            .collect();
        let mut i = 0usize;
        g.bench_function(format!("get_of_10k/{name}"), |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                cache.get_by_key(&keys[i]).is_some()
            })
        });
        g.throughput(Throughput::Elements(1000));
        let groups: Vec<String> = (0..10).map(|g| format!("g{g}")).collect();
        let mut group = 0usize;
        g.bench_function(format!("by_index_1000_of_10k/{name}"), |b| {
            b.iter(|| {
                group = (group + 1) % groups.len();
                cache
                    .by_index(GROUP, &groups[group])
                    .expect("indexed")
                    .len()
            })
        });
    }
    for (name, cache) in caches(1000) {
        g.throughput(Throughput::Elements(1000));
        g.bench_function(format!("list_of_1000/{name}"), |b| {
            b.iter(|| cache.list().len())
        });
    }
    g.finish();
}

criterion_group!(benches, reads);
criterion_main!(benches);
