//! What the informer pops from its queue (a whole relist on the atomic
//! queue, one change otherwise) is applied off the async runtime's threads:
//! while a unit is applied, the other tasks of the runtime run (a lease
//! renewal, a webhook answer), the Reflector reads the watch, and a
//! shutdown or a dropped `run` holds no runtime thread.
//!
//! Each test runs the informer on a runtime of one thread and holds an
//! apply inside an index function until something on that runtime has
//! happened, told through a std channel with a bound of 30 s: were the
//! apply on the runtime's only thread, nothing could happen there, the
//! index function would give up at the bound, and the test fails on that,
//! whatever the timing.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_informer::{
    CancellationToken, Compact, FifoKind, InformerError, InformerOptions, ListPage, ListRequest,
    ListWatchError, ListerWatcher, ReflectorOptions, ResourceEventHandlerFuncs,
    SharedIndexInformer, WatchRequest, WatchStream,
};
use kinformer_store::{BoxError, Codec, IndexFunc, Indexers};
use kube_client::core::WatchEvent;
use parking_lot::Mutex;
use tokio::sync::mpsc;

/// How long a held apply waits for the runtime before it gives up.
const BOUND: Duration = Duration::from_secs(30);

fn cm(name: &str, rv: u64) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            resource_version: Some(rv.to_string()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn page(items: Vec<ConfigMap>, rv: u64) -> ListPage<ConfigMap> {
    ListPage {
        items,
        resource_version: rv.to_string(),
        continue_token: None,
        skipped: Vec::new(),
        shard_selector: None,
    }
}

type WatchTx = mpsc::UnboundedSender<Result<WatchEvent<ConfigMap>, ListWatchError>>;

/// Lists from a script, one page each; each watch hands the test a sender.
struct Scripted {
    lists: Mutex<VecDeque<ListPage<ConfigMap>>>,
    watches: mpsc::UnboundedSender<WatchTx>,
}

impl ListerWatcher<ConfigMap> for Scripted {
    fn list(&self, _: ListRequest) -> BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
        let next = self
            .lists
            .lock()
            .pop_front()
            .ok_or_else(|| ListWatchError::Connect("the script has no more lists".into()));
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
        "configmaps (scripted)".into()
    }
}

/// Holds the apply of the object at one resourceVersion in an index
/// function until the test releases it, or gives up after [`BOUND`].
struct Gate {
    entered: mpsc::UnboundedReceiver<()>,
    release: std::sync::mpsc::Sender<()>,
    /// 0: not reached; 1: released; 2: gave up at the bound.
    outcome: Arc<AtomicU8>,
    index: IndexFunc<ConfigMap>,
}

impl Gate {
    fn at(rv: &'static str) -> Self {
        let (entered_tx, entered) = mpsc::unbounded_channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let held = Mutex::new(Some((entered_tx, released)));
        let outcome = Arc::new(AtomicU8::new(0));
        let index: IndexFunc<ConfigMap> = {
            let outcome = Arc::clone(&outcome);
            Arc::new(move |c: &ConfigMap| {
                // Held once: the first index call for the object at `rv`.
                if c.metadata.resource_version.as_deref() == Some(rv)
                    && let Some((entered, released)) = held.lock().take()
                {
                    let _ = entered.send(());
                    let got = released.recv_timeout(BOUND).is_ok();
                    outcome.store(if got { 1 } else { 2 }, Ordering::SeqCst);
                }
                Ok(vec![String::new()])
            })
        };
        Self {
            entered,
            release,
            outcome,
            index,
        }
    }

    /// Waits, on the runtime, until the apply is held.
    async fn entered(&mut self) {
        self.entered
            .recv()
            .await
            .expect("the index function is gone");
    }

    fn release(&self) {
        let _ = self.release.send(());
    }

    /// Whether the apply is still held: neither released nor given up.
    fn held(&self) -> bool {
        self.outcome.load(Ordering::SeqCst) == 0
    }

    /// Whether the apply was released by the test rather than giving up
    /// at the bound with the runtime's only thread held.
    fn released(&self) -> bool {
        self.outcome.load(Ordering::SeqCst) == 1
    }

    fn indexers(&self) -> Indexers<ConfigMap> {
        Indexers::from([("held".to_owned(), Arc::clone(&self.index))])
    }
}

/// What a handler saw, as lines like "update a 1->5".
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn handler(&self) -> ResourceEventHandlerFuncs<ConfigMap> {
        let (a, u) = (self.clone(), self.clone());
        let rv = |c: &ConfigMap| c.metadata.resource_version.clone().unwrap_or_default();
        let name = |c: &ConfigMap| c.metadata.name.clone().unwrap_or_default();
        ResourceEventHandlerFuncs::new()
            .on_add(move |o, _| a.0.lock().push(format!("add {} {}", name(o), rv(o))))
            .on_update(move |old, new| {
                u.0.lock()
                    .push(format!("update {} {}->{}", name(new), rv(old), rv(new)))
            })
    }

    /// Waits (up to 30 s) until `n` lines have been logged.
    async fn wait_for(&self, n: usize) -> Vec<String> {
        for _ in 0..3000 {
            if self.0.lock().len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.0.lock().clone()
    }
}

struct Harness {
    informer: SharedIndexInformer<ConfigMap>,
    watches: mpsc::UnboundedReceiver<WatchTx>,
    shutdown: CancellationToken,
    log: Log,
}

impl Harness {
    fn new(lists: Vec<ListPage<ConfigMap>>, options: InformerOptions<ConfigMap>) -> Self {
        let (tx, watches) = mpsc::unbounded_channel();
        let lw = Scripted {
            lists: Mutex::new(lists.into()),
            watches: tx,
        };
        let mut reflector = ReflectorOptions::default();
        reflector.use_watch_list = false;
        reflector.backoff.initial = Duration::from_millis(10);
        reflector.backoff.max = Duration::from_millis(50);
        let informer = SharedIndexInformer::new(lw, options.reflector(reflector));
        let log = Log::default();
        informer.add_event_handler(log.handler()).unwrap();
        Self {
            informer,
            watches,
            shutdown: CancellationToken::new(),
            log,
        }
    }

    fn start(&self) -> tokio::task::JoinHandle<Result<(), InformerError>> {
        let (informer, shutdown) = (self.informer.clone(), self.shutdown.clone());
        tokio::spawn(async move { informer.run(shutdown).await })
    }

    async fn next_watch(&mut self) -> WatchTx {
        tokio::time::timeout(BOUND, self.watches.recv())
            .await
            .expect("no watch opened")
            .expect("the lister-watcher is gone")
    }

    /// Waits (up to 30 s) until the first list is applied.
    async fn synced(&self) {
        let synced = self.informer.wait_until(|i| i.has_synced());
        assert!(tokio::time::timeout(BOUND, synced).await.unwrap_or(false));
    }

    /// Waits (up to 30 s) until `key` is cached at `rv` and nothing is queued.
    async fn wait_cached(&self, key: &str, rv: &str) {
        for _ in 0..3000 {
            let cached = self.informer.indexer().get_by_key(key);
            let at = cached.and_then(|c| c.metadata.resource_version.clone());
            if at.as_deref() == Some(rv) && self.informer.queued() == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{key} not cached at {rv} within 30 s");
    }
}

/// Runs a task of the runtime's own, woken by its timer as a lease
/// renewal is, to its end.
async fn another_task_runs() {
    tokio::spawn(async { tokio::time::sleep(Duration::from_millis(1)).await })
        .await
        .unwrap();
}

/// A relist (410 on the watch) whose apply is held until another task of
/// the runtime has run.
async fn relist_leaves_the_runtime_to_other_tasks(fifo: FifoKind) {
    let mut gate = Gate::at("5");
    let mut h = Harness::new(
        vec![
            page(vec![cm("a", 1), cm("b", 1)], 1),
            page(vec![cm("a", 5), cm("b", 5)], 5),
        ],
        InformerOptions::new().fifo(fifo).indexers(gate.indexers()),
    );
    h.start();
    let w = h.next_watch().await;
    h.synced().await;
    w.send(Err(ListWatchError::Gone("too old".into()))).unwrap();
    gate.entered().await;
    another_task_runs().await;
    gate.release();
    h.wait_cached("ns/b", "5").await;
    assert!(
        gate.released(),
        "the relist's apply held the runtime's only thread for {BOUND:?}"
    );
    assert_eq!(
        h.log.wait_for(4).await,
        ["add a 1", "add b 1", "update a 1->5", "update b 1->5"]
    );
    h.shutdown.cancel();
}

#[tokio::test(flavor = "current_thread")]
async fn a_relist_applied_on_the_atomic_queue_leaves_the_runtime_thread_to_other_tasks() {
    relist_leaves_the_runtime_to_other_tasks(FifoKind::AtomicFifo).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_relist_applied_on_the_real_fifo_leaves_the_runtime_thread_to_other_tasks() {
    relist_leaves_the_runtime_to_other_tasks(FifoKind::RealFifo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_relist_applied_leaves_the_one_worker_of_a_multi_thread_runtime_to_other_tasks() {
    relist_leaves_the_runtime_to_other_tasks(FifoKind::AtomicFifo).await;
}

/// One watch event, on each queue: a DeltaFifo applies a relist key by key
/// under its lock, one such unit at a time, as this event.
#[tokio::test(flavor = "current_thread")]
async fn a_watch_event_applied_leaves_the_runtime_thread_to_other_tasks_on_every_queue() {
    for fifo in [
        FifoKind::DeltaFifo,
        FifoKind::RealFifo,
        FifoKind::AtomicFifo,
    ] {
        let mut gate = Gate::at("7");
        let mut h = Harness::new(
            vec![page(vec![cm("a", 1)], 1)],
            InformerOptions::new().fifo(fifo).indexers(gate.indexers()),
        );
        h.start();
        let w = h.next_watch().await;
        w.send(Ok(WatchEvent::Modified(cm("a", 7)))).unwrap();
        gate.entered().await;
        another_task_runs().await;
        gate.release();
        h.wait_cached("ns/a", "7").await;
        assert!(
            gate.released(),
            "{fifo:?}: the event's apply held the runtime's only thread for {BOUND:?}"
        );
        assert_eq!(h.log.wait_for(2).await, ["add a 1", "update a 1->7"]);
        h.shutdown.cancel();
    }
}

/// While a relist is applied, the Reflector opens the next watch and reads
/// its events into the queue; they reach the cache and the handlers after
/// the relist, in order.
#[tokio::test(flavor = "current_thread")]
async fn the_watch_is_read_while_a_relist_is_applied_and_its_events_follow_the_relist() {
    let mut gate = Gate::at("5");
    let mut h = Harness::new(
        vec![
            page(vec![cm("a", 1)], 1),
            page(vec![cm("a", 5), cm("b", 5)], 5),
        ],
        InformerOptions::new()
            .fifo(FifoKind::AtomicFifo)
            .indexers(gate.indexers()),
    );
    h.start();
    let w = h.next_watch().await;
    w.send(Err(ListWatchError::Gone("too old".into()))).unwrap();
    gate.entered().await;
    let w2 = h.next_watch().await;
    w2.send(Ok(WatchEvent::Modified(cm("a", 6)))).unwrap();
    // Read and queued behind the relist being applied.
    let stats = h.informer.reflector_stats().unwrap();
    for _ in 0..3000 {
        if stats.events.load(Ordering::SeqCst) == 1 && h.informer.queued() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.informer.queued(), 2, "the event was not queued");
    gate.release();
    h.informer
        .wait_caught_up_to("6")
        .await
        .expect("caught up to the event");
    assert!(
        gate.released(),
        "the relist's apply held the runtime's only thread for {BOUND:?}"
    );
    assert_eq!(
        h.log.wait_for(4).await,
        ["add a 1", "update a 1->5", "add b 5", "update a 5->6"]
    );
    h.shutdown.cancel();
}

/// A shutdown while a relist is applied: `run` waits for that apply to end
/// (nothing changes the cache once it has returned) without holding the
/// runtime's thread, then returns `Ok`.
#[tokio::test(flavor = "current_thread")]
async fn a_shutdown_during_a_relist_returns_once_the_apply_ends_without_holding_the_runtime() {
    let mut gate = Gate::at("5");
    let mut h = Harness::new(
        vec![page(vec![cm("a", 1)], 1), page(vec![cm("a", 5)], 5)],
        InformerOptions::new()
            .fifo(FifoKind::AtomicFifo)
            .indexers(gate.indexers()),
    );
    let run = h.start();
    let w = h.next_watch().await;
    w.send(Err(ListWatchError::Gone("too old".into()))).unwrap();
    gate.entered().await;
    h.shutdown.cancel();
    another_task_runs().await;
    assert!(gate.held(), "the apply held the runtime's only thread");
    assert!(!run.is_finished(), "run returned with an apply in progress");
    gate.release();
    let ended = tokio::time::timeout(BOUND, run)
        .await
        .expect("run did not return after the apply")
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
    assert!(gate.released(), "the apply held the runtime's only thread");
    let a = h.informer.indexer().get_by_key("ns/a").unwrap();
    assert_eq!(a.metadata.resource_version.as_deref(), Some("5"));
    assert!(h.informer.failure().is_none());
}

/// `run`'s future dropped while a relist is applied: the drop does not wait
/// for the apply, the informer reports the failure at once, and it stops
/// (no handler can be added) once the apply has ended.
#[tokio::test(flavor = "current_thread")]
async fn dropping_run_during_a_relist_fails_the_informer_without_waiting_for_the_apply() {
    let mut gate = Gate::at("5");
    let mut h = Harness::new(
        vec![page(vec![cm("a", 1)], 1), page(vec![cm("a", 5)], 5)],
        InformerOptions::new()
            .fifo(FifoKind::AtomicFifo)
            .indexers(gate.indexers()),
    );
    let run = h.start();
    let w = h.next_watch().await;
    w.send(Err(ListWatchError::Gone("too old".into()))).unwrap();
    gate.entered().await;
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    assert!(h.informer.failure().is_some());
    assert!(!h.informer.has_synced());
    another_task_runs().await;
    gate.release();
    let stopped = tokio::time::timeout(BOUND, h.informer.wait_until(|_| false))
        .await
        .expect("the informer did not stop after the apply");
    assert!(!stopped);
    assert!(gate.released(), "the apply held the runtime's only thread");
    assert!(matches!(
        h.informer.add_event_handler(Log::default().handler()),
        Err(InformerError::Stopped)
    ));
}

/// A codec that panics on the object at resourceVersion 9.
struct PanicsAt9;

impl Codec<ConfigMap> for PanicsAt9 {
    fn encode(&self, obj: &ConfigMap) -> Result<Vec<u8>, BoxError> {
        assert_ne!(
            obj.metadata.resource_version.as_deref(),
            Some("9"),
            "encode"
        );
        Ok(serde_json::to_vec(obj)?)
    }
    fn decode(&self, bytes: &[u8]) -> Result<ConfigMap, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// A panic while a unit is applied (here a compact cache's codec) fails
/// the informer: `run` returns the failure naming the unit, as before the
/// apply moved off the runtime.
#[tokio::test(flavor = "current_thread")]
async fn a_panic_while_applying_fails_the_informer_and_run_names_the_unit() {
    for fifo in [
        FifoKind::DeltaFifo,
        FifoKind::RealFifo,
        FifoKind::AtomicFifo,
    ] {
        let mut h = Harness::new(
            vec![page(vec![cm("a", 1)], 1)],
            InformerOptions::new()
                .fifo(fifo)
                .compact(Compact::with_codec(PanicsAt9)),
        );
        let run = h.start();
        let w = h.next_watch().await;
        h.synced().await;
        w.send(Ok(WatchEvent::Modified(cm("a", 9)))).unwrap();
        let ended = tokio::time::timeout(BOUND, run)
            .await
            .expect("run did not end")
            .unwrap();
        let Err(InformerError::Failed { reason, .. }) = ended else {
            panic!("{fifo:?}: {ended:?}");
        };
        assert!(
            reason.contains("applying the deltas of ns/a to the cache panicked")
                && reason.contains("encode"),
            "{fifo:?}: {reason}"
        );
        assert!(!h.informer.has_synced());
        assert!(h.informer.failure().is_some());
    }
}
