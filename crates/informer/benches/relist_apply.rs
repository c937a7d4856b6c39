//! What applying a relist costs the rest of the runtime, and what one watch
//! event costs from the watch to the cache.
//!
//! - `relist_50000/{whole,compact,2_informers_whole}/{tick,echo}`: on a
//!   Tokio runtime of two worker threads, an informer over 50 000
//!   ConfigMaps (namespace and label indexes, one handler; whole objects,
//!   or a compact cache of JSON), or two such informers at once (as every
//!   informer relists after the API server lost the history they watched),
//!   relists, forced by a 410 on its watch, once per iteration, with every
//!   object changed. Meanwhile a task of the runtime ticks every 10 ms (a
//!   lease renewal) and a thread outside it sends a request every
//!   millisecond to a task of the runtime that answers it (a webhook
//!   answer). The time reported for an iteration is the worst delay seen
//!   during that relist, from the 410 to the cache at the new version:
//!   how late a tick came (`tick`), how long a request waited for its
//!   answer (`echo`). Both are about 1 ms on an idle runtime (the timer's
//!   granularity, a round trip).
//! - `watch_event/modified_to_cached`: one change sent on the watch of an
//!   informer over 1 000 objects, until `wait_caught_up_to` sees it
//!   applied; the round trip through the Reflector, the queue and the apply.
//!
//! The list is built before each iteration and handed over whole, so the
//! time is the Reflector's hand-over and the informer's apply, not the
//! making of objects. Run with
//! `cargo bench -p kinformer-informer --bench relist_apply`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_informer::{
    CancellationToken, Compact, InformerOptions, ListPage, ListRequest, ListWatchError,
    ListerWatcher, ReflectorOptions, ResourceEventHandlerFuncs, SharedIndexInformer, WatchRequest,
    WatchStream,
};
use kinformer_store::{IndexFunc, namespace_indexers};
use kube_client::core::WatchEvent;
use parking_lot::Mutex;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

type WatchTx = mpsc::UnboundedSender<Result<WatchEvent<ConfigMap>, ListWatchError>>;

/// Lists the page it was last given; each watch hands its sender over.
struct InMemory {
    next_list: Mutex<Option<ListPage<ConfigMap>>>,
    watches: mpsc::UnboundedSender<WatchTx>,
}

impl ListerWatcher<ConfigMap> for InMemory {
    fn list(&self, _: ListRequest) -> BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
        let next = self
            .next_list
            .lock()
            .take()
            .ok_or_else(|| ListWatchError::Connect("no list prepared".into()));
        Box::pin(async move { next })
    }

    fn watch(
        &self,
        _: WatchRequest,
    ) -> BoxFuture<'_, Result<WatchStream<ConfigMap>, ListWatchError>> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _ = self.watches.send(tx);
        Box::pin(async move { Ok(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()) })
    }

    fn describe(&self) -> String {
        "configmaps (in memory)".into()
    }
}

fn config_map(i: usize, rv: u64) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            namespace: Some(format!("ns-{}", i % 50)),
            name: Some(format!("cm-{i:05}")),
            uid: Some(format!("uid-{i:05}")),
            resource_version: Some(rv.to_string()),
            labels: Some(BTreeMap::from([("app".into(), format!("app-{}", i % 100))])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "key".into(),
            format!("value {i} at {rv}"),
        )])),
        ..ConfigMap::default()
    }
}

fn list(n: usize, rv: u64) -> ListPage<ConfigMap> {
    ListPage {
        items: (0..n).map(|i| config_map(i, rv)).collect(),
        resource_version: rv.to_string(),
        continue_token: None,
        skipped: Vec::new(),
        shard_selector: None,
    }
}

/// A running informer over `n` objects at resourceVersion 1.
struct Running {
    informer: SharedIndexInformer<ConfigMap>,
    lw: Arc<InMemory>,
    watches: mpsc::UnboundedReceiver<WatchTx>,
    watch: WatchTx,
    rv: u64,
    n: usize,
    shutdown: CancellationToken,
}

impl Running {
    fn start(rt: &Runtime, n: usize, compact: bool) -> Self {
        let (tx, mut watches) = mpsc::unbounded_channel();
        let lw = Arc::new(InMemory {
            next_list: Mutex::new(Some(list(n, 1))),
            watches: tx,
        });
        let app: IndexFunc<ConfigMap> = Arc::new(|c: &ConfigMap| {
            Ok(c.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app").cloned())
                .into_iter()
                .collect())
        });
        let mut indexers = namespace_indexers();
        indexers.insert("app".into(), app);
        let mut reflector = ReflectorOptions::default();
        reflector.use_watch_list = false;
        reflector.backoff.initial = Duration::from_millis(1);
        reflector.backoff.max = Duration::from_millis(1);
        let mut options = InformerOptions::new()
            .indexers(indexers)
            .reflector(reflector);
        if compact {
            options = options.compact(Compact::json());
        }
        let informer = SharedIndexInformer::from_arc(lw.clone(), options);
        informer
            .add_event_handler(ResourceEventHandlerFuncs::new())
            .unwrap();
        let shutdown = CancellationToken::new();
        let watch = rt.block_on(async {
            let (i, s) = (informer.clone(), shutdown.clone());
            tokio::spawn(async move { i.run(s).await });
            let watch = watches.recv().await.unwrap();
            informer.wait_caught_up_to("1").await.unwrap();
            watch
        });
        Self {
            informer,
            lw,
            watches,
            watch,
            rv: 1,
            n,
            shutdown,
        }
    }

    fn next_list(&mut self) -> ListPage<ConfigMap> {
        self.rv += 1;
        list(self.n, self.rv)
    }
}

/// The worst delays seen since the last `take`, in nanoseconds.
#[derive(Default)]
struct Worst {
    tick: AtomicU64,
    echo: AtomicU64,
}

impl Worst {
    fn see(slot: &AtomicU64, delay: Duration) {
        slot.fetch_max(delay.as_nanos() as u64, Ordering::Relaxed);
    }

    fn take(slot: &AtomicU64) -> Duration {
        Duration::from_nanos(slot.swap(0, Ordering::Relaxed))
    }
}

/// The 10 ms tick on the runtime and the echo answered on it, asked from a
/// thread outside it; both record their worst delay into `worst`.
fn probes(rt: &Runtime, worst: &Arc<Worst>, stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let w = Arc::clone(worst);
    rt.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let due = tick.tick().await;
            Worst::see(&w.tick, due.elapsed());
        }
    });
    let (requests, mut answering) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
    rt.spawn(async move {
        while let Some(answer) = answering.recv().await {
            let _ = answer.send(());
        }
    });
    let (w, stop) = (Arc::clone(worst), Arc::clone(stop));
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let (answer, answered) = oneshot::channel();
            let sent = Instant::now();
            if requests.send(answer).is_err() || answered.blocking_recv().is_err() {
                return;
            }
            Worst::see(&w.echo, sent.elapsed());
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

/// Relists every informer of `fleet` at once, each every object at a new
/// version, and waits until each has cached its list.
fn relist_all(rt: &Runtime, fleet: &mut [Running]) {
    let prepared: Vec<_> = fleet.iter_mut().map(Running::next_list).collect();
    let versions: Vec<String> = prepared
        .iter()
        .map(|l| l.resource_version.clone())
        .collect();
    for (running, list) in fleet.iter().zip(prepared) {
        *running.lw.next_list.lock() = Some(list);
    }
    for running in fleet.iter() {
        let _ = running
            .watch
            .send(Err(ListWatchError::Gone("too old".into())));
    }
    for (running, rv) in fleet.iter_mut().zip(versions) {
        running.watch = rt.block_on(async {
            running.informer.wait_caught_up_to(&rv).await.unwrap();
            running.watches.recv().await.unwrap()
        });
    }
}

fn relist(c: &mut Criterion) {
    const N: usize = 50_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let worst = Arc::new(Worst::default());
    let stop = Arc::new(AtomicBool::new(false));
    let asker = probes(&rt, &worst, &stop);
    let mut g = c.benchmark_group(format!("relist_{N}"));
    g.sample_size(10);
    g.sampling_mode(SamplingMode::Flat);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(5));
    // One informer, whole or compact; then two relisting at once, as every
    // informer does after the API server lost the history they watched.
    for (informers, compact) in [(1, false), (1, true), (2, false)] {
        let cache = if compact { "compact" } else { "whole" };
        let name = match informers {
            1 => cache.to_owned(),
            n => format!("{n}_informers_{cache}"),
        };
        let mut fleet: Vec<Running> = (0..informers)
            .map(|_| Running::start(&rt, N, compact))
            .collect();
        for (probe, slot) in [("tick", &worst.tick), ("echo", &worst.echo)] {
            let mut worst_of_all = Duration::ZERO;
            g.bench_function(format!("{name}/{probe}"), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        Worst::take(slot);
                        relist_all(&rt, &mut fleet);
                        let seen = Worst::take(slot);
                        worst_of_all = worst_of_all.max(seen);
                        total += seen;
                    }
                    total
                })
            });
            // Zero: filtered out.
            if !worst_of_all.is_zero() {
                eprintln!("relist_{N}/{name}/{probe}: worst of all relists {worst_of_all:?}");
            }
        }
        for running in &fleet {
            running.shutdown.cancel();
        }
    }
    g.finish();
    stop.store(true, Ordering::Relaxed);
    let _ = asker.join();
}

fn watch_event(c: &mut Criterion) {
    const N: usize = 1_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut running = Running::start(&rt, N, false);
    let mut g = c.benchmark_group("watch_event");
    g.bench_function("modified_to_cached", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                running.rv += 1;
                let rv = running.rv.to_string();
                let changed = config_map(i as usize % N, running.rv);
                let sent = Instant::now();
                running
                    .watch
                    .send(Ok(WatchEvent::Modified(changed)))
                    .unwrap();
                rt.block_on(running.informer.wait_caught_up_to(&rv))
                    .unwrap();
                total += sent.elapsed();
            }
            total
        })
    });
    g.finish();
    running.shutdown.cancel();
}

criterion_group!(benches, relist, watch_event);
criterion_main!(benches);
