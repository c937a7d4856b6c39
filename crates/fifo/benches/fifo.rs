//! DeltaFifo and RealFifo benchmarks, the same workloads for both: add/pop
//! of 100 000 objects, add+update of 100 000 keys popped after (the DeltaFifo
//! merges the two, the RealFifo pops both), and replace of a 10 000 object
//! list against a 10 000 key store.

use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_fifo::{DeltaFifo, DeltaFifoOptions, RealFifo, RealFifoOptions, Requeue};
use kinformer_store::Indexer;

fn pod(i: usize, rv: usize) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            namespace: Some(format!("ns-{}", i % 100)),
            name: Some(format!("pod-{i}")),
            resource_version: Some(rv.to_string()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    })
}

fn add_pop(c: &mut Criterion) {
    const N: usize = 100_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("fifo");
    g.throughput(Throughput::Elements(N as u64));
    g.sample_size(20);
    g.bench_function("add_pop_100k", |b| {
        b.iter_batched(
            || (0..N).map(|i| pod(i, 1)).collect::<Vec<_>>(),
            |pods| {
                let fifo = DeltaFifo::new();
                for p in pods {
                    fifo.add(p).unwrap();
                }
                rt.block_on(async {
                    for _ in 0..N {
                        fifo.pop(|d, _| Ok::<_, Requeue<()>>(d.len()))
                            .await
                            .unwrap();
                    }
                });
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("real_fifo_add_pop_100k", |b| {
        b.iter_batched(
            || (0..N).map(|i| pod(i, 1)).collect::<Vec<_>>(),
            |pods| {
                let fifo = RealFifo::new();
                for p in pods {
                    fifo.add(p).unwrap();
                }
                rt.block_on(async {
                    for _ in 0..N {
                        fifo.pop(|d, _| Ok::<_, Requeue<()>>(d.len()))
                            .await
                            .unwrap();
                    }
                });
            },
            BatchSize::LargeInput,
        )
    });
    // Each key added then updated before it is popped.
    let add_update = || (0..N).map(|i| (pod(i, 1), pod(i, 2))).collect::<Vec<_>>();
    g.bench_function("add_update_pop_100k_keys", |b| {
        b.iter_batched(
            add_update,
            |pods| {
                let fifo = DeltaFifo::new();
                for (added, updated) in pods {
                    fifo.add(added).unwrap();
                    fifo.update(updated).unwrap();
                }
                rt.block_on(async {
                    while !fifo.is_empty() {
                        fifo.pop(|d, _| Ok::<_, Requeue<()>>(d.len()))
                            .await
                            .unwrap();
                    }
                });
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("real_fifo_add_update_pop_100k_keys", |b| {
        b.iter_batched(
            add_update,
            |pods| {
                let fifo = RealFifo::new();
                for (added, updated) in pods {
                    fifo.add(added).unwrap();
                    fifo.update(updated).unwrap();
                }
                rt.block_on(async {
                    while !fifo.is_empty() {
                        fifo.pop(|d, _| Ok::<_, Requeue<()>>(d.len()))
                            .await
                            .unwrap();
                    }
                });
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn replace(c: &mut Criterion) {
    const N: usize = 10_000;
    let known = Arc::new(Indexer::new());
    for i in 0..N {
        known.add(pod(i, 1)).unwrap();
    }
    let mut g = c.benchmark_group("fifo");
    g.throughput(Throughput::Elements(N as u64));
    // Half the list is new, half of the store's keys are missing from it.
    g.bench_function("replace_10k_against_10k_store", |b| {
        b.iter_batched(
            || (N / 2..N + N / 2).map(|i| pod(i, 2)).collect::<Vec<_>>(),
            |list| {
                let fifo =
                    DeltaFifo::with_options(DeltaFifoOptions::new().known_objects(known.clone()));
                fifo.replace(list, "2").unwrap();
                fifo
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("real_fifo_replace_10k_against_10k_store", |b| {
        b.iter_batched(
            || (N / 2..N + N / 2).map(|i| pod(i, 2)).collect::<Vec<_>>(),
            |list| {
                let fifo =
                    RealFifo::with_options(RealFifoOptions::new().known_objects(known.clone()));
                fifo.replace(list, "2").unwrap();
                fifo
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, add_pop, replace);
criterion_main!(benches);
