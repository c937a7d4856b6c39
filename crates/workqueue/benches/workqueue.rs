//! Workqueue benchmarks: add+get+done cycles (1 producer, 2 workers, 10 000
//! distinct keys, with and without duplicate adds), rate-limited
//! add/forget churn, and add_after with 100 000 pending items.

use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use kinformer_workqueue::{
    DelayingQueue, ItemExponentialFailureRateLimiter, Queue, RateLimitingQueue,
    default_controller_rate_limiter,
};

const KEYS: u64 = 10_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

/// One producer adds `adds` keys (key i % KEYS, so adds > KEYS means
/// duplicates); two workers get (and drop the guard: done) until the queue
/// drains.
async fn cycle(adds: u64) {
    let q: Queue<u64> = Queue::new();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move {
                while let Some(k) = q.get().await {
                    drop(k);
                }
            })
        })
        .collect();
    let producer = {
        let q = q.clone();
        tokio::spawn(async move {
            for i in 0..adds {
                q.add(i % KEYS);
            }
        })
    };
    producer.await.unwrap();
    q.shut_down_with_drain().await;
    for w in workers {
        w.await.unwrap();
    }
}

fn add_get_done(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("workqueue");
    g.throughput(Throughput::Elements(KEYS));
    g.bench_function("add_get_done_10k_distinct", |b| {
        b.to_async(&rt).iter(|| cycle(KEYS))
    });
    // 1 000 000 adds over 10 000 keys: half are duplicates of a queued key
    // at the rate the workers keep up with, as in the peer benchmark.
    g.throughput(Throughput::Elements(100_000));
    g.bench_function("add_get_done_100k_adds_10k_keys_with_duplicates", |b| {
        b.to_async(&rt).iter(|| cycle(100_000))
    });
    g.finish();
}

fn rate_limited(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("workqueue");
    g.throughput(Throughput::Elements(KEYS));
    g.bench_function("add_rate_limited_forget_10k_keys", |b| {
        b.to_async(&rt).iter(|| async {
            let limiter = ItemExponentialFailureRateLimiter::new(
                Duration::from_secs(3600),
                Duration::from_secs(7200),
            );
            let q = RateLimitingQueue::new(limiter);
            for k in 0..KEYS {
                q.add_rate_limited(k);
            }
            for k in 0..KEYS {
                q.forget(&k);
            }
            q.shut_down();
        })
    });
    g.bench_function("default_controller_rate_limiter_when_forget_10k", |b| {
        let l = default_controller_rate_limiter::<u64>();
        b.iter(|| {
            use kinformer_workqueue::RateLimiter;
            for k in 0..KEYS {
                let _ = l.when(&k);
            }
            for k in 0..KEYS {
                l.forget(&k);
            }
        })
    });
    g.finish();
}

fn add_after(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("workqueue");
    g.throughput(Throughput::Elements(1_000));
    g.bench_function("add_after_1k_with_100k_pending", |b| {
        b.iter_batched(
            || {
                let _guard = rt.enter();
                let q: DelayingQueue<u64> = DelayingQueue::new();
                for i in 0..100_000 {
                    q.add_after(i, Duration::from_secs(3600 + i));
                }
                q
            },
            |q| {
                for i in 0..1_000 {
                    q.add_after(1_000_000 + i, Duration::from_secs(1800 + i));
                }
                q
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, add_get_done, rate_limited, add_after);
criterion_main!(benches);
