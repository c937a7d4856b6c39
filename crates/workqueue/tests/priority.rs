//! The queue's two priorities and its aging: order, raising, retries at a
//! kept priority, metrics by priority, and the bound on how long a `Low`
//! item can be passed over. Time is paused: every wait is the queue's own
//! or a simulated reconcile's, so the figures are exact, not timed.

use std::sync::Arc;
use std::time::Duration;

use kinformer_workqueue::{
    CounterMetric, DelayingQueue, GaugeMetric, HistogramMetric, ItemExponentialFailureRateLimiter,
    MetricsProvider, Priority, Queue, QueueConfig, QueueItem, RateLimitingQueue,
    SettableGaugeMetric, Taken,
};
use parking_lot::Mutex;
use tokio::time::{Instant, sleep, timeout};

/// The next item's guard, failing the test if none comes within an hour.
async fn take<T: QueueItem>(q: &Queue<T>) -> Taken<T> {
    timeout(Duration::from_secs(3600), q.get())
        .await
        .expect("get timed out")
        .expect("the queue was shut down")
}

/// [`take`], done at once: the item and the priority it was queued at.
async fn take_done<T: QueueItem>(q: &Queue<T>) -> (T, Priority) {
    let taken = take(q).await;
    (taken.item().clone(), taken.priority())
}

#[tokio::test(start_paused = true)]
async fn high_items_go_first_and_each_priority_keeps_its_add_order() {
    let q = Queue::new();
    q.add_with_priority("l1", Priority::Low);
    q.add_with_priority("l2", Priority::Low);
    q.add("h1");
    q.add_with_priority("h2", Priority::High);
    assert_eq!(q.len(), 4);
    assert_eq!((q.len_at(Priority::High), q.len_at(Priority::Low)), (2, 2));
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(take_done(&q).await);
    }
    assert_eq!(
        order,
        [
            ("h1", Priority::High),
            ("h2", Priority::High),
            ("l1", Priority::Low),
            ("l2", Priority::Low)
        ]
    );
    assert!(q.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_high_add_raises_a_queued_low_item_and_a_low_add_never_lowers_one() {
    let q = Queue::new();
    q.add_with_priority("a", Priority::Low);
    q.add_with_priority("b", Priority::Low);
    q.add("c");
    // Raised: taken right after c, ahead of b, and still one item.
    q.add("a");
    // Not lowered: c stays ahead of b.
    q.add_with_priority("c", Priority::Low);
    assert_eq!(q.len(), 3);
    assert_eq!((q.len_at(Priority::High), q.len_at(Priority::Low)), (2, 1));
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(take_done(&q).await);
    }
    assert_eq!(
        order,
        [
            ("c", Priority::High),
            ("a", Priority::High),
            ("b", Priority::Low)
        ]
    );
    // The stale slot a left behind in the Low FIFO hands nothing out.
    assert_eq!(q.len(), 0);
    q.shut_down();
    assert!(q.get().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn an_item_added_while_processed_comes_back_at_the_highest_priority_added_meanwhile() {
    let q = Queue::new();
    q.add_with_priority("x", Priority::Low);
    let x = take(&q).await;
    q.add_with_priority("x", Priority::Low);
    q.add("x");
    q.add_with_priority("y", Priority::Low);
    q.add_with_priority("x", Priority::Low);
    drop(x);
    assert_eq!(take_done(&q).await, ("x", Priority::High));
    assert_eq!(take_done(&q).await, ("y", Priority::Low));
}

#[tokio::test(start_paused = true)]
async fn delayed_and_rate_limited_adds_are_queued_at_the_priority_they_were_given() {
    let q = DelayingQueue::new();
    q.add_after_with_priority("later", Duration::from_secs(1), Priority::Low);
    q.add_after("soon", Duration::from_secs(1));
    sleep(Duration::from_secs(2)).await;
    assert_eq!(take_done(&q).await, ("soon", Priority::High));
    assert_eq!(take_done(&q).await, ("later", Priority::Low));

    // A waiting item keeps its earlier ready time at the higher priority.
    q.add_after_with_priority("w", Duration::from_secs(1), Priority::Low);
    q.add_after_with_priority("w", Duration::from_secs(5), Priority::High);
    q.add_with_priority("other", Priority::Low);
    sleep(Duration::from_millis(1500)).await;
    assert_eq!(take_done(&q).await, ("w", Priority::High));

    let rl = RateLimitingQueue::new(ItemExponentialFailureRateLimiter::new(
        Duration::from_millis(5),
        Duration::from_secs(1),
    ));
    rl.add_with_priority("first", Priority::High);
    rl.add_rate_limited_with_priority("retry", Priority::Low);
    sleep(Duration::from_millis(10)).await;
    assert_eq!(take_done(&rl).await, ("first", Priority::High));
    assert_eq!(take_done(&rl).await, ("retry", Priority::Low));
}

/// One worker takes an item, reconciles it for `work`, and adds two new
/// `High` items per item taken, twice what it can do: without aging the
/// `Low` items would wait forever. Returns, for each of `lows` `Low` items
/// queued at the start, how long it waited, and how many `High` items were
/// taken meanwhile; gives up after `max_takes`.
async fn overloaded(aging: Duration, lows: usize, work: Duration, max_takes: usize) -> Run {
    let q = Queue::with_config(QueueConfig::new().priority_aging(aging));
    let start = Instant::now();
    for i in 0..lows {
        q.add_with_priority(format!("low-{i:04}"), Priority::Low);
    }
    let mut waited = vec![None; lows];
    let (mut highs, mut next_high) = (0, 0);
    for _ in 0..max_takes {
        if waited.iter().all(Option::is_some) {
            break;
        }
        let taken = take(&q).await;
        match taken.priority() {
            Priority::Low => {
                let i: usize = taken.item()["low-".len()..].parse().unwrap();
                waited[i] = Some(start.elapsed());
            }
            Priority::High => highs += 1,
        }
        sleep(work).await;
        drop(taken);
        for _ in 0..2 {
            q.add(format!("high-{next_high}"));
            next_high += 1;
        }
    }
    Run { waited, highs }
}

struct Run {
    waited: Vec<Option<Duration>>,
    highs: usize,
}

#[tokio::test(start_paused = true)]
async fn no_low_item_starves_under_high_adds_above_the_rate_the_workers_take_them() {
    let aging = Duration::from_secs(2);
    let work = Duration::from_millis(10);
    let lows = 500;
    let run = overloaded(aging, lows, work, 20_000).await;
    let starved = run.waited.iter().filter(|w| w.is_none()).count();
    assert_eq!(starved, 0, "{starved} of {lows} low items never taken");
    // The documented bound: A + 2(n + 1)/R, n the Low items ahead of it,
    // R = 1/work here (one worker).
    for (n, waited) in run.waited.iter().enumerate() {
        let waited = waited.unwrap();
        let bound = aging + work * 2 * (n as u32 + 1);
        assert!(
            waited <= bound,
            "low item {n} waited {waited:?}, over its bound {bound:?}"
        );
    }
    // High items were not shut out either: about half the takes meanwhile.
    assert!(run.highs >= lows, "only {} high items taken", run.highs);
}

#[tokio::test(start_paused = true)]
async fn with_zero_aging_the_two_priorities_share_the_workers_from_the_start() {
    let work = Duration::from_millis(10);
    let run = overloaded(Duration::ZERO, 100, work, 1_000).await;
    let last = run.waited.iter().map(|w| w.unwrap()).max().unwrap();
    // Every second take: 100 low items in about 200 takes.
    assert!(last <= work * 201, "the last low item waited {last:?}");
}

#[derive(Default)]
struct Recorded {
    depth: [i64; 2],
    latency: [Vec<f64>; 2],
    /// The queue duration of every priority together.
    total_latency: Vec<f64>,
}

struct Recorder(Arc<Mutex<Recorded>>);
struct Depth(Arc<Mutex<Recorded>>, usize);
struct Latency(Arc<Mutex<Recorded>>, usize);
struct TotalLatency(Arc<Mutex<Recorded>>);
struct Nothing;

impl GaugeMetric for Depth {
    fn inc(&self) {
        self.0.lock().depth[self.1] += 1;
    }
    fn dec(&self) {
        self.0.lock().depth[self.1] -= 1;
    }
}
impl HistogramMetric for Latency {
    fn observe(&self, seconds: f64) {
        self.0.lock().latency[self.1].push(seconds);
    }
}
impl HistogramMetric for TotalLatency {
    fn observe(&self, seconds: f64) {
        self.0.lock().total_latency.push(seconds);
    }
}
impl GaugeMetric for Nothing {
    fn inc(&self) {}
    fn dec(&self) {}
}
impl CounterMetric for Nothing {
    fn inc(&self) {}
}
impl HistogramMetric for Nothing {
    fn observe(&self, _: f64) {}
}
impl SettableGaugeMetric for Nothing {
    fn set(&self, _: f64) {}
}

impl MetricsProvider for Recorder {
    fn new_depth_metric(&self, _: &str) -> Box<dyn GaugeMetric> {
        Box::new(Nothing)
    }
    fn new_adds_metric(&self, _: &str) -> Box<dyn CounterMetric> {
        Box::new(Nothing)
    }
    fn new_latency_metric(&self, _: &str) -> Box<dyn HistogramMetric> {
        Box::new(TotalLatency(Arc::clone(&self.0)))
    }
    fn new_work_duration_metric(&self, _: &str) -> Box<dyn HistogramMetric> {
        Box::new(Nothing)
    }
    fn new_unfinished_work_seconds_metric(&self, _: &str) -> Box<dyn SettableGaugeMetric> {
        Box::new(Nothing)
    }
    fn new_longest_running_processor_seconds_metric(
        &self,
        _: &str,
    ) -> Box<dyn SettableGaugeMetric> {
        Box::new(Nothing)
    }
    fn new_retries_metric(&self, _: &str) -> Box<dyn CounterMetric> {
        Box::new(Nothing)
    }
    fn new_depth_by_priority_metric(&self, _: &str, p: Priority) -> Box<dyn GaugeMetric> {
        Box::new(Depth(Arc::clone(&self.0), p as usize))
    }
    fn new_latency_by_priority_metric(&self, _: &str, p: Priority) -> Box<dyn HistogramMetric> {
        Box::new(Latency(Arc::clone(&self.0), p as usize))
    }
}

#[tokio::test(start_paused = true)]
async fn depth_and_latency_are_reported_by_priority() {
    let rec = Arc::new(Mutex::new(Recorded::default()));
    let q =
        Queue::with_config(QueueConfig::new().metrics_provider(Arc::new(Recorder(rec.clone()))));
    q.add_with_priority("a", Priority::Low);
    q.add_with_priority("b", Priority::Low);
    q.add("c");
    assert_eq!(rec.lock().depth, [2, 1]);
    // Raised: moves from one depth to the other, and its wait at Low (none
    // here) is reported as Low's.
    q.add("a");
    assert_eq!(rec.lock().depth, [1, 2]);
    assert_eq!(rec.lock().latency[0], [0.0]);
    sleep(Duration::from_secs(1)).await;
    for _ in 0..3 {
        take_done(&q).await;
    }
    let r = rec.lock();
    assert_eq!(r.depth, [0, 0]);
    assert_eq!((r.latency[0].len(), r.latency[1].len()), (2, 2));
    assert_eq!(r.latency[0][1], 1.0, "b");
}

#[tokio::test(start_paused = true)]
async fn a_raised_key_reports_high_queue_duration_from_the_raise_and_its_low_wait_as_low() {
    let rec = Arc::new(Mutex::new(Recorded::default()));
    let q =
        Queue::with_config(QueueConfig::new().metrics_provider(Arc::new(Recorder(rec.clone()))));
    // A backlog key (an initial list after a restart) waits 600 s at Low,
    // then a live change raises it, and a worker takes it 1 s later.
    q.add_with_priority("backlog", Priority::Low);
    sleep(Duration::from_secs(600)).await;
    q.add("backlog");
    sleep(Duration::from_secs(1)).await;
    let backlog = take(&q).await;
    assert_eq!((*backlog, backlog.priority()), ("backlog", Priority::High));
    {
        let r = rec.lock();
        assert_eq!(r.latency[1], [1.0], "high: from the raise");
        assert_eq!(r.latency[0], [600.0], "low: the wait at low, when raised");
        assert_eq!(r.total_latency, [601.0], "in all: from the first add");
    }

    // Added at Low while processed, raised 10 s later, queued when its
    // guard drops 1 s after that: the same split.
    q.add_with_priority("backlog", Priority::Low);
    sleep(Duration::from_secs(10)).await;
    q.add("backlog");
    sleep(Duration::from_secs(1)).await;
    drop(backlog);
    assert_eq!(take_done(&q).await, ("backlog", Priority::High));
    let r = rec.lock();
    assert_eq!(r.latency[1], [1.0, 1.0]);
    assert_eq!(r.latency[0], [600.0, 10.0]);
    assert_eq!(r.total_latency, [601.0, 11.0]);
}

/// A model of the queue: for each item, whether it is queued (and at which
/// priority, in which order) or held by a worker and dirty meanwhile.
#[derive(Default)]
struct Model {
    /// (item, priority, order) of queued items.
    queued: Vec<(u8, Priority, u64)>,
    /// Held items, with the priority they come back at if dirty.
    held: std::collections::HashMap<u8, Option<Priority>>,
    clock: u64,
}

impl Model {
    fn add(&mut self, item: u8, p: Priority) {
        self.clock += 1;
        if let Some(dirty) = self.held.get_mut(&item) {
            *dirty = Some(dirty.map_or(p, |d| d.max(p)));
        } else if let Some(q) = self.queued.iter_mut().find(|q| q.0 == item) {
            if p > q.1 {
                *q = (item, p, self.clock);
            }
        } else {
            self.queued.push((item, p, self.clock));
        }
    }

    fn done(&mut self, item: u8) {
        self.clock += 1;
        if let Some(Some(p)) = self.held.remove(&item) {
            self.queued.push((item, p, self.clock));
        }
    }

    fn len_at(&self, p: Priority) -> usize {
        self.queued.iter().filter(|q| q.1 == p).count()
    }
}

/// Random adds at both priorities, takes and dones, against the model:
/// every take hands out a queued item (never a held one) at the priority
/// the model says, a High one whenever one is queued (aging is off here),
/// the oldest of its priority, and the lengths agree after every step.
#[tokio::test(start_paused = true)]
async fn random_operations_agree_with_a_model_of_the_queue() {
    for seed in 0..200 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let q = Queue::with_config(QueueConfig::new().priority_aging(Duration::MAX));
        let mut m = Model::default();
        let mut guards = std::collections::HashMap::new();
        for _ in 0..300 {
            match rng.u8(0..10) {
                0..=3 => {
                    let (item, p) = (
                        rng.u8(0..12),
                        if rng.bool() {
                            Priority::High
                        } else {
                            Priority::Low
                        },
                    );
                    q.add_with_priority(item, p);
                    m.add(item, p);
                }
                4..=6 if !m.queued.is_empty() => {
                    let taken = take(&q).await;
                    let (item, p) = (*taken, taken.priority());
                    let best = m.queued.iter().map(|q| q.1).max().unwrap();
                    let next = m
                        .queued
                        .iter()
                        .filter(|q| q.1 == best)
                        .min_by_key(|q| q.2)
                        .copied()
                        .unwrap();
                    assert_eq!((item, p), (next.0, next.1), "seed {seed}");
                    m.queued.retain(|q| q.0 != item);
                    assert!(
                        m.held.insert(item, None).is_none(),
                        "seed {seed}: {item} held twice"
                    );
                    guards.insert(item, taken);
                }
                _ => {
                    if let Some(&item) = m.held.keys().nth(
                        rng.usize(0..m.held.len().max(1))
                            .min(m.held.len().saturating_sub(1)),
                    ) {
                        guards.remove(&item).expect("held: its guard").done();
                        m.done(item);
                    }
                }
            }
            assert_eq!(
                q.len_at(Priority::High),
                m.len_at(Priority::High),
                "seed {seed}"
            );
            assert_eq!(
                q.len_at(Priority::Low),
                m.len_at(Priority::Low),
                "seed {seed}"
            );
            assert_eq!(q.len(), m.queued.len(), "seed {seed}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_pending_retry_keeps_its_priority_when_the_item_is_added_lower_or_delayed_again() {
    let q = DelayingQueue::new();
    // A High retry waiting for its backoff; a Low add (a resync) comes.
    q.add_after_with_priority("retry", Duration::from_secs(10), Priority::High);
    q.add_with_priority("retry", Priority::Low);
    q.add_with_priority("other", Priority::Low);
    assert_eq!(q.waiting_len(), 0, "queued now");
    assert_eq!(take_done(&q).await, ("retry", Priority::High));

    // An earlier ready time at a lower priority keeps the higher one.
    q.add_after_with_priority("x", Duration::from_secs(10), Priority::High);
    q.add_after_with_priority("x", Duration::from_secs(1), Priority::Low);
    q.add_after_with_priority("y", Duration::from_secs(1), Priority::Low);
    sleep(Duration::from_secs(2)).await;
    assert_eq!(take_done(&q).await, ("x", Priority::High));
    assert_eq!(take_done(&q).await, ("other", Priority::Low));
    assert_eq!(take_done(&q).await, ("y", Priority::Low));
}
