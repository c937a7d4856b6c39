//! Store benchmarks: by_index over 100 000 objects in 100 namespaces, and
//! update throughput with two indexes.

use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_store::{IndexFunc, Indexer, NAMESPACE_INDEX, namespace_indexers};

fn pod(i: usize, rv: usize) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            namespace: Some(format!("ns-{}", i % 100)),
            name: Some(format!("pod-{i}")),
            resource_version: Some(rv.to_string()),
            labels: Some([("app".to_string(), format!("app-{}", i % 1000))].into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    })
}

fn two_indexes() -> Indexer<Pod> {
    let mut indexers = namespace_indexers();
    let by_app: IndexFunc<Pod> = Arc::new(|p: &Pod| {
        Ok(p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app").cloned())
            .into_iter()
            .collect())
    });
    indexers.insert("app".into(), by_app);
    Indexer::with_indexers(indexers)
}

fn by_index(c: &mut Criterion) {
    let idx = Indexer::with_indexers(namespace_indexers());
    for i in 0..100_000 {
        idx.add(pod(i, 1)).unwrap();
    }
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(1));
    let mut n = 0usize;
    g.bench_function("by_index_100k_objects_100_namespaces", |b| {
        b.iter(|| {
            n += 1;
            let ns = format!("ns-{}", n % 100);
            idx.by_index(NAMESPACE_INDEX, &ns).unwrap().len()
        })
    });
    g.finish();
}

fn update(c: &mut Criterion) {
    let mut g = c.benchmark_group("store");
    const N: usize = 10_000;
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("update_10k_two_indexes", |b| {
        b.iter_batched(
            || {
                let idx = two_indexes();
                for i in 0..N {
                    idx.add(pod(i, 1)).unwrap();
                }
                let updates: Vec<_> = (0..N).map(|i| pod(i, 2)).collect();
                (idx, updates)
            },
            |(idx, updates)| {
                for p in updates {
                    idx.update(p).unwrap();
                }
                idx
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, by_index, update);
criterion_main!(benches);
