//! Black-box tests of the work queues, after client-go's workqueue tests.
//!
//! Concurrency is tested with many iterations on a multi-threaded runtime
//! (not under loom): producers and workers hammer a few keys while every
//! worker checks that no other worker holds its key.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kinformer_workqueue::{
    CounterMetric, DelayingQueue, GaugeMetric, HistogramMetric, ItemExponentialFailureRateLimiter,
    MetricsProvider, Priority, Queue, QueueConfig, QueueItem, RateLimitingQueue,
    SettableGaugeMetric, Taken,
};
use parking_lot::Mutex;
use tokio::time::{Instant, sleep, timeout};

/// `q.get()`, failing the test if nothing comes within 10 s.
async fn get<T: QueueItem>(q: &Queue<T>) -> Option<Taken<T>> {
    timeout(Duration::from_secs(10), q.get())
        .await
        .expect("get timed out")
}

/// [`get`], with the guard that can `forget` and `retry`.
async fn get_rate_limited<T: QueueItem>(
    q: &RateLimitingQueue<T>,
) -> Option<Taken<T, RateLimitingQueue<T>>> {
    timeout(Duration::from_secs(10), q.get())
        .await
        .expect("get timed out")
}

#[tokio::test]
async fn an_item_added_twice_before_get_is_handed_out_once() {
    let q = Queue::new();
    q.add("a");
    q.add("b");
    q.add("a");
    assert_eq!(q.len(), 2);
    assert_eq!(get(&q).await.as_deref(), Some(&"a"));
    assert_eq!(get(&q).await.as_deref(), Some(&"b"));
    assert!(q.is_empty());
}

#[tokio::test]
async fn an_item_added_while_processing_is_handed_out_again_after_done() {
    let q = Queue::new();
    q.add("a");
    let item = get(&q).await.unwrap();
    q.add("a");
    q.add("a");
    // Not handed out while a worker holds it.
    assert_eq!(q.len(), 0);
    assert!(timeout(Duration::from_millis(20), q.get()).await.is_err());
    drop(item);
    assert_eq!(q.len(), 1);
    assert_eq!(get(&q).await.as_deref(), Some(&"a"));
    assert!(q.is_empty());
}

/// Only a guard marks an item done (a `done` for an item not held, which
/// client-go tolerates, cannot be written), and only its own item.
#[tokio::test]
async fn a_guard_marks_only_its_own_item_done() {
    let q = Queue::new();
    q.add("a");
    q.add("b");
    let a = get(&q).await.unwrap();
    let b = get(&q).await.unwrap();
    q.add("c");
    a.done();
    q.add("b");
    // b is still held (only marked dirty), c still queued, a gone.
    assert_eq!(q.len(), 1);
    assert_eq!(get(&q).await.as_deref(), Some(&"c"));
    drop(b);
    assert_eq!(get(&q).await.as_deref(), Some(&"b"));
    assert!(q.is_empty());
}

#[tokio::test]
async fn get_waits_for_an_add() {
    let q = Queue::new();
    let worker = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    sleep(Duration::from_millis(20)).await;
    assert!(!worker.is_finished());
    q.add(7);
    assert_eq!(
        timeout(Duration::from_secs(5), worker)
            .await
            .unwrap()
            .unwrap()
            .as_deref(),
        Some(&7)
    );
}

#[tokio::test]
async fn shut_down_hands_out_what_is_queued_then_none_and_ignores_adds() {
    let q = Queue::new();
    q.add(1);
    q.add(2);
    q.shut_down();
    q.add(3);
    assert!(q.is_shutting_down());
    assert_eq!(get(&q).await.as_deref(), Some(&1));
    assert_eq!(get(&q).await.as_deref(), Some(&2));
    assert!(get(&q).await.is_none());
}

#[tokio::test]
async fn shut_down_wakes_every_waiting_worker() {
    let q: Queue<u32> = Queue::new();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        })
        .collect();
    sleep(Duration::from_millis(20)).await;
    q.shut_down();
    for w in workers {
        assert!(
            timeout(Duration::from_secs(5), w)
                .await
                .unwrap()
                .unwrap()
                .is_none()
        );
    }
}

#[tokio::test]
async fn shut_down_with_drain_waits_for_in_flight_and_queued_items() {
    let q = Queue::new();
    q.add("held");
    q.add("queued");
    let held = get(&q).await.unwrap();
    let drained = Arc::new(AtomicUsize::new(0));
    let drainer = {
        let q = q.clone();
        let drained = Arc::clone(&drained);
        tokio::spawn(async move {
            q.shut_down_with_drain().await;
            drained.store(1, Ordering::SeqCst);
        })
    };
    sleep(Duration::from_millis(20)).await;
    assert_eq!(
        drained.load(Ordering::SeqCst),
        0,
        "returned with work in flight"
    );
    drop(held);
    sleep(Duration::from_millis(20)).await;
    assert_eq!(
        drained.load(Ordering::SeqCst),
        0,
        "returned with an item still queued"
    );
    let last = get(&q).await.unwrap();
    assert_eq!(*last, "queued");
    drop(last);
    timeout(Duration::from_secs(5), drainer)
        .await
        .unwrap()
        .unwrap();
    assert!(get(&q).await.is_none());
}

#[tokio::test]
async fn shut_down_ends_a_drain_wait() {
    let q = Queue::new();
    q.add(1);
    let _held = get(&q).await;
    let drainer = {
        let q = q.clone();
        tokio::spawn(async move { q.shut_down_with_drain().await })
    };
    sleep(Duration::from_millis(20)).await;
    q.shut_down();
    timeout(Duration::from_secs(5), drainer)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_item_is_ever_held_by_two_workers_and_every_add_is_processed() {
    const KEYS: u32 = 8;
    const ADDS: u32 = 20_000;
    const WORKERS: usize = 8;
    // Many iterations of the whole scenario, each on fresh state.
    for _round in 0..5 {
        // One producer adds at High, the other at Low; aging zero, so the
        // queue alternates between its two FIFOs and raises items often.
        let q = Queue::with_config(QueueConfig::new().priority_aging(Duration::ZERO));
        let held = Arc::new(Mutex::new(HashSet::new()));
        let violations = Arc::new(AtomicUsize::new(0));
        // Per key, the highest add number produced and processed. A worker
        // records the newest add it has seen at get time: since every add
        // after a get queues the key again, the final processing of each key
        // must have seen its last add.
        let produced: Arc<Vec<AtomicUsize>> =
            Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
        let seen: Arc<Vec<AtomicUsize>> =
            Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (q, held, violations) = (q.clone(), held.clone(), violations.clone());
                let (produced, seen) = (produced.clone(), seen.clone());
                tokio::spawn(async move {
                    while let Some(taken) = q.get().await {
                        let key = *taken;
                        let k = key as usize;
                        seen[k].fetch_max(produced[k].load(Ordering::SeqCst), Ordering::SeqCst);
                        if !held.lock().insert(key) {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::task::yield_now().await;
                        held.lock().remove(&key);
                        drop(taken);
                    }
                })
            })
            .collect();
        let producers: Vec<_> = (0..2)
            .map(|p| {
                let (q, produced) = (q.clone(), produced.clone());
                tokio::spawn(async move {
                    for i in 0..ADDS {
                        let key = (i * 7 + p) % KEYS;
                        produced[key as usize].fetch_max((i + 1) as usize, Ordering::SeqCst);
                        let priority = if p == 0 {
                            Priority::High
                        } else {
                            Priority::Low
                        };
                        q.add_with_priority(key, priority);
                        if i % 64 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for p in producers {
            p.await.unwrap();
        }
        timeout(Duration::from_secs(30), q.shut_down_with_drain())
            .await
            .unwrap();
        for w in workers {
            w.await.unwrap();
        }
        assert_eq!(
            violations.load(Ordering::SeqCst),
            0,
            "an item reached two workers"
        );
        for k in 0..KEYS as usize {
            let last = produced[k].load(Ordering::SeqCst);
            assert!(last > 0);
            assert_eq!(
                seen[k].load(Ordering::SeqCst),
                last,
                "key {k}: last add never processed"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn add_after_hands_the_item_out_once_the_delay_has_passed() {
    let q = DelayingQueue::new();
    let start = Instant::now();
    q.add_after("x", Duration::from_secs(5));
    assert_eq!(q.len(), 0);
    assert_eq!(q.waiting_len(), 1);
    assert_eq!(get(&q).await.as_deref(), Some(&"x"));
    assert!(start.elapsed() >= Duration::from_secs(5));
    assert_eq!(q.waiting_len(), 0);
}

#[tokio::test(start_paused = true)]
async fn add_after_twice_keeps_the_earliest_ready_time() {
    let q = DelayingQueue::new();
    let start = Instant::now();
    q.add_after("x", Duration::from_secs(10));
    q.add_after("x", Duration::from_secs(2));
    q.add_after("x", Duration::from_secs(30));
    let x = get(&q).await.unwrap();
    assert_eq!(*x, "x");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    drop(x);
    // The superseded entries do not fire later.
    sleep(Duration::from_secs(60)).await;
    assert_eq!(q.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn add_after_items_come_out_in_ready_order() {
    let q = DelayingQueue::new();
    for (item, secs) in [("c", 3), ("a", 1), ("d", 4), ("b", 2)] {
        q.add_after(item, Duration::from_secs(secs));
    }
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(*get(&q).await.unwrap());
    }
    assert_eq!(order, ["a", "b", "c", "d"]);
}

#[tokio::test(start_paused = true)]
async fn add_after_with_the_largest_duration_saturates_instead_of_panicking() {
    let q = DelayingQueue::new();
    q.add_after("forever", Duration::MAX);
    q.add_after("soon", Duration::from_secs(1));
    assert_eq!(q.waiting_len(), 2);
    assert_eq!(get(&q).await.as_deref(), Some(&"soon"));
    // Still waiting a year later, and a direct add still takes it at once.
    sleep(Duration::from_secs(86_400 * 365)).await;
    assert_eq!(q.len(), 0);
    assert_eq!(q.waiting_len(), 1);
    q.add("forever");
    assert_eq!(get(&q).await.as_deref(), Some(&"forever"));
}

#[tokio::test(start_paused = true)]
async fn a_rate_limiter_with_a_huge_max_delay_saturates_instead_of_panicking() {
    let limiter = ItemExponentialFailureRateLimiter::new(Duration::MAX, Duration::MAX);
    let q = RateLimitingQueue::new(limiter);
    q.add_rate_limited("k");
    q.add_rate_limited("k");
    assert_eq!(q.waiting_len(), 1);
    assert_eq!(q.num_requeues(&"k"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_direct_add_cancels_a_pending_add_after() {
    let q = DelayingQueue::new();
    q.add_after("x", Duration::from_secs(5));
    q.add("x");
    assert_eq!(q.waiting_len(), 0);
    assert_eq!(get(&q).await.as_deref(), Some(&"x"));
    sleep(Duration::from_secs(10)).await;
    assert_eq!(q.len(), 0, "the cancelled delay fired anyway");
}

#[tokio::test(start_paused = true)]
async fn add_after_with_zero_delay_adds_at_once() {
    let q = DelayingQueue::new();
    q.add_after(1, Duration::ZERO);
    assert_eq!(q.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn shut_down_drops_delayed_items_and_stops_the_waiting_loop() {
    let q = DelayingQueue::new();
    q.add_after("x", Duration::from_secs(1));
    q.shut_down();
    q.add_after("y", Duration::from_secs(1));
    assert_eq!(q.waiting_len(), 0);
    sleep(Duration::from_secs(5)).await;
    assert!(get(&q).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn many_pending_items_share_one_heap() {
    let q = DelayingQueue::new();
    for i in 0..100_000u32 {
        q.add_after(i, Duration::from_millis(1 + u64::from(i % 1000)));
    }
    assert_eq!(q.waiting_len(), 100_000);
    sleep(Duration::from_secs(2)).await;
    assert_eq!(q.len(), 100_000);
    assert_eq!(q.waiting_len(), 0);
}

#[tokio::test(start_paused = true)]
async fn add_rate_limited_backs_off_and_forget_resets() {
    let limiter =
        ItemExponentialFailureRateLimiter::new(Duration::from_secs(1), Duration::from_secs(60));
    let q = RateLimitingQueue::new(limiter);
    let start = Instant::now();
    q.add_rate_limited("k");
    q.add_rate_limited("k");
    assert_eq!(q.num_requeues(&"k"), 2);
    // The first (1 s) wins over the second (2 s): earliest ready time.
    let k = get_rate_limited(&q).await.unwrap();
    assert_eq!(*k, "k");
    assert!(start.elapsed() >= Duration::from_secs(1));
    drop(k);
    let t = Instant::now();
    q.add_rate_limited("k");
    let k = get_rate_limited(&q).await.unwrap();
    assert_eq!(*k, "k");
    assert!(
        t.elapsed() >= Duration::from_secs(4),
        "third failure waits 4 s"
    );
    k.forget();
    assert_eq!(q.num_requeues(&"k"), 0);
}

#[derive(Default)]
struct Recorded {
    depth: Mutex<i64>,
    adds: AtomicUsize,
    retries: AtomicUsize,
    latency: Mutex<Vec<f64>>,
    work: Mutex<Vec<f64>>,
    unfinished: Mutex<f64>,
    longest: Mutex<f64>,
    names: Mutex<Vec<String>>,
}

struct Recorder(Arc<Recorded>);
struct Depth(Arc<Recorded>);
struct Adds(Arc<Recorded>);
struct Retries(Arc<Recorded>);
struct Latency(Arc<Recorded>);
struct Work(Arc<Recorded>);
struct Unfinished(Arc<Recorded>);
struct Longest(Arc<Recorded>);

impl GaugeMetric for Depth {
    fn inc(&self) {
        *self.0.depth.lock() += 1;
    }
    fn dec(&self) {
        *self.0.depth.lock() -= 1;
    }
}
impl CounterMetric for Adds {
    fn inc(&self) {
        self.0.adds.fetch_add(1, Ordering::SeqCst);
    }
}
impl CounterMetric for Retries {
    fn inc(&self) {
        self.0.retries.fetch_add(1, Ordering::SeqCst);
    }
}
impl HistogramMetric for Latency {
    fn observe(&self, s: f64) {
        self.0.latency.lock().push(s);
    }
}
impl HistogramMetric for Work {
    fn observe(&self, s: f64) {
        self.0.work.lock().push(s);
    }
}
impl SettableGaugeMetric for Unfinished {
    fn set(&self, v: f64) {
        *self.0.unfinished.lock() = v;
    }
}
impl SettableGaugeMetric for Longest {
    fn set(&self, v: f64) {
        *self.0.longest.lock() = v;
    }
}

impl MetricsProvider for Recorder {
    fn new_depth_metric(&self, name: &str) -> Box<dyn GaugeMetric> {
        self.0.names.lock().push(name.to_owned());
        Box::new(Depth(self.0.clone()))
    }
    fn new_adds_metric(&self, _: &str) -> Box<dyn CounterMetric> {
        Box::new(Adds(self.0.clone()))
    }
    fn new_latency_metric(&self, _: &str) -> Box<dyn HistogramMetric> {
        Box::new(Latency(self.0.clone()))
    }
    fn new_work_duration_metric(&self, _: &str) -> Box<dyn HistogramMetric> {
        Box::new(Work(self.0.clone()))
    }
    fn new_unfinished_work_seconds_metric(&self, _: &str) -> Box<dyn SettableGaugeMetric> {
        Box::new(Unfinished(self.0.clone()))
    }
    fn new_longest_running_processor_seconds_metric(
        &self,
        _: &str,
    ) -> Box<dyn SettableGaugeMetric> {
        Box::new(Longest(self.0.clone()))
    }
    fn new_retries_metric(&self, _: &str) -> Box<dyn CounterMetric> {
        Box::new(Retries(self.0.clone()))
    }
}

#[tokio::test(start_paused = true)]
async fn metrics_report_depth_adds_latency_work_retries_and_unfinished_work() {
    let rec = Arc::new(Recorded::default());
    let config = QueueConfig::new()
        .name("pods")
        .metrics_provider(Arc::new(Recorder(rec.clone())));
    let limiter =
        ItemExponentialFailureRateLimiter::new(Duration::from_secs(1), Duration::from_secs(10));
    let q = RateLimitingQueue::with_config(limiter, config);
    assert_eq!(q.name(), "pods");
    assert_eq!(*rec.names.lock(), ["pods"]);

    q.add("a");
    q.add("a"); // a duplicate is not an add
    q.add("b");
    assert_eq!(rec.adds.load(Ordering::SeqCst), 2);
    assert_eq!(*rec.depth.lock(), 2);

    sleep(Duration::from_secs(3)).await;
    let a = get_rate_limited(&q).await.unwrap();
    assert_eq!(*rec.depth.lock(), 1);
    assert_eq!(rec.latency.lock().as_slice(), [3.0]);

    sleep(Duration::from_secs(2)).await;
    q.update_unfinished_work();
    assert_eq!(*rec.unfinished.lock(), 2.0);
    assert_eq!(*rec.longest.lock(), 2.0);

    a.retry();
    assert_eq!(rec.retries.load(Ordering::SeqCst), 1);
    assert_eq!(rec.work.lock().as_slice(), [2.0]);
    q.update_unfinished_work();
    assert_eq!(*rec.unfinished.lock(), 0.0);
}

/// client-go's queue_test metrics case: an item re-added while it is
/// processed waits in the queue from that re-add, not from its done.
#[tokio::test(start_paused = true)]
async fn an_item_re_added_while_processing_counts_its_queue_latency_from_the_re_add() {
    let rec = Arc::new(Recorded::default());
    let q: Queue<&str> =
        Queue::with_config(QueueConfig::new().metrics_provider(Arc::new(Recorder(rec.clone()))));
    q.add("foo");
    sleep(Duration::from_millis(50)).await;
    let foo = get(&q).await.unwrap();
    assert_eq!(rec.latency.lock().as_slice(), [0.05]);

    // Added back while processing; repeated adds are one.
    for _ in 0..5 {
        q.add(*foo);
    }
    assert_eq!(rec.adds.load(Ordering::SeqCst), 2);
    // Not queued yet: depth follows len() (client-go already counts it).
    assert_eq!(*rec.depth.lock(), 0);
    assert_eq!(q.len(), 0);

    sleep(Duration::from_millis(25)).await;
    drop(foo);
    assert_eq!(rec.work.lock().as_slice(), [0.025]);
    // Queued again by done (the guard dropped): in depth now, once.
    assert_eq!(*rec.depth.lock(), 1);
    assert_eq!(q.len(), 1);

    assert_eq!(get(&q).await.as_deref(), Some(&"foo"));
    // 25 ms since the re-add, although done came just before this get.
    assert_eq!(rec.latency.lock().as_slice(), [0.05, 0.025]);
    assert_eq!(*rec.depth.lock(), 0);
}
