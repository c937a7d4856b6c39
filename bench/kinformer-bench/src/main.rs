//! kinformer's side of `cargo xtask bench`: one scenario per run, one JSON
//! line of results on stdout. The peers (client-go, kube-runtime) implement
//! the same scenarios with the same arguments and output.
//!
//! Scenarios:
//! - `workqueue KEYS ADDS`: 1 producer, 2 workers, add+get+done.
//! - `ratelimited KEYS ROUNDS`: add_rate_limited/forget churn.
//! - `fifo N`: N add/update/pop cycles, then a replace of N/10 objects.
//! - `real-fifo N`: the same on a RealFifo, where every add and every update
//!   is its own pop (2N pops).
//!
//! The informer scenarios use the queue `KINFORMER_BENCH_FIFO` names
//! (`delta`, `real` or `atomic`; the default atomic one when unset), and run every task on one thread when
//! `KINFORMER_BENCH_RUNTIME=current` (by default on two worker threads).
//! - `relist KUBECONFIG NAMESPACE [compact]`: a synced informer forced to
//!   relist by a 410 on its watch: peak RSS during the relist against the
//!   steady RSS (`compact`: a compact cache of JSON, no decoded cache).
//! - `sync KUBECONFIG NAMESPACE [keep-managed-fields] [json] [compact]`:
//!   informer initial sync of every Pod in NAMESPACE (managedFields stripped
//!   unless kept; protobuf unless `json`; whole objects unless `compact`, a
//!   compact cache of JSON without a decoded-object cache): time to
//!   has_synced, RSS; then the mean time of a Lister `get` over every key.
//!   With `trim`, glibc's `malloc_trim(0)` runs after the sync, before the
//!   RSS is read; with `keep-freed`, a compact cache does not release freed
//!   memory after its list: together, what the allocator keeps, isolated.
//! - `sync-default KUBECONFIG NAMESPACE`: the same sync with nothing but
//!   the defaults: `SharedInformerFactory::new(client)` (what `Manager::new`
//!   builds) scoped to NAMESPACE like the peers, its Pod informer as it
//!   comes (protobuf, managedFields dropped, the atomic queue, whole objects).
//!   `KINFORMER_BENCH_FIFO` does not apply.
//! - `reconcile KUBECONFIG NAMESPACE [compact]`: a controller over the Pods
//!   of NAMESPACE (2 workers) whose reconcile reads its Pod from the cache
//!   and the Pods of its group by a secondary index (10 per group: `pod-NNNNN`
//!   is in group NNNN), writing nothing, so that the cache's part is most
//!   of a reconcile. From the workers' start to the last Pod of the initial list
//!   reconciled: reconciles per second; and the p50 and p99 of the
//!   reconcile's own time (the two reads, timed inside the reconciler; the
//!   rate also includes the workqueue and the workers). `compact`: the
//!   informer keeps a compact cache (JSON, no decoded cache).
//! - `metadata-sync KUBECONFIG NAMESPACE`: a metadata-only informer
//!   (`PartialObjectMeta<Pod>`, managedFields dropped) of every Pod in
//!   NAMESPACE: time to has_synced, RSS per cached object.
//! - `metadata-decode KUBECONFIG NAMESPACE`: diagnostic: the metadata list
//!   fetched once, then decoded offline into `PartialObjectMeta<Pod>`s held
//!   in a Vec: the RSS of the decoded objects alone, without informer or
//!   store, and the inline size of one.
//! - `fetch-pods KUBECONFIG NAMESPACE FILE [json]`: writes the Pod list of
//!   NAMESPACE, as the server sends it (protobuf unless `json`), to FILE.
//! - `decode FILE ROUNDS [keep-managed-fields]`: diagnostic: decodes the
//!   list in FILE (protobuf or JSON, as fetched) ROUNDS times offline on
//!   the main thread (the runtime's workers idle), no informer, the way the
//!   informer decodes a list: the median process CPU per Pod of one
//!   decode, the client's share of a sync isolated from the server and the
//!   network. managedFields are dropped before decoding unless
//!   `keep-managed-fields`. client-go-peer's `decode` takes the same file
//!   (and clears managedFields after decoding).
//! - `shard-sync KUBECONFIG NAMESPACE INDEX COUNT MODE`: one replica of
//!   COUNT splitting the Pods of NAMESPACE by uid (shard INDEX, the hash
//!   range `HashRange::split(INDEX, COUNT)`), protobuf, managedFields
//!   dropped. MODE `server` sends the shard selector (the server filters),
//!   `client` sends none and keeps the shard's objects on the client (what
//!   a server without the `ShardedListAndWatch` gate gives), `none` caches
//!   every Pod. Time to has_synced, RSS growth, bytes of response bodies
//!   received, objects cached.
//! - `raw-watch-list KUBECONFIG NAMESPACE [json]`: the streaming list an
//!   informer opens, read and framed without decoding any object (protobuf
//!   unless `json`), until its end bookmark: the time the server takes to
//!   send it, the floor under every client's sync.
//! - `latency KUBECONFIG NAMESPACE SECONDS`: handler receive time minus the
//!   write time stamped by the writer in the `bench/sent-ns` annotation;
//!   split where the Reflector decoded each update (its transform sees it
//!   then): write to decoded, and decoded to handler.
//! - `crd-lifecycle KUBECONFIG NAMESPACE COUNT`: a Manager whose controller
//!   follows a CRD installed, filled with COUNT objects and deleted while it
//!   runs: RSS at each stage, time to the first reconcile (see its module).

mod crd_lifecycle;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kinformer_fifo::{DeltaFifo, RealFifo, Requeue};
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, Compact, FifoKind, HashRange, InformerOptions, ListPage,
    ListRequest, ListWatchError, ListerWatcher, ResourceEventHandlerFuncs, ShardField,
    ShardSelector, SharedIndexInformer, SharedInformerFactory, WatchRequest, WatchStream,
    WireFormat, strip_managed_fields,
};
use kinformer_workqueue::{ItemExponentialFailureRateLimiter, Queue, RateLimitingQueue};
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kube_client::core::PartialObjectMeta;
use kube_client::{Client, Config};

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// CPU time (user + system) this process has used, in ms.
fn process_cpu_ms() -> f64 {
    let (user, system) = process_cpu_ns();
    (user + system) as f64 / 1e6
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn main() -> Result<()> {
    // RUST_LOG=info shows the Reflector's timings on stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| {
        args.get(i)
            .cloned()
            .with_context(|| format!("missing argument {i}"))
    };
    // KINFORMER_BENCH_RUNTIME=current: one thread for every task
    // (diagnostic: what the wake-ups between worker threads cost).
    let rt = if std::env::var("KINFORMER_BENCH_RUNTIME").as_deref() == Ok("current") {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
    };
    let result = match args.first().map(String::as_str) {
        Some("workqueue") => rt.block_on(workqueue(arg(1)?.parse()?, arg(2)?.parse()?)),
        Some("ratelimited") => rt.block_on(ratelimited(arg(1)?.parse()?, arg(2)?.parse()?)),
        Some("fifo") => rt.block_on(fifo(arg(1)?.parse()?)),
        Some("real-fifo") => rt.block_on(real_fifo(arg(1)?.parse()?)),
        Some("sync") => rt.block_on(sync(
            &arg(1)?,
            &arg(2)?,
            !args[3..].iter().any(|a| a == "keep-managed-fields"),
            if args[3..].iter().any(|a| a == "json") {
                WireFormat::Json
            } else {
                WireFormat::Auto
            },
            args[3..]
                .iter()
                .any(|a| a == "compact")
                .then(|| !args[3..].iter().any(|a| a == "keep-freed")),
            args[3..].iter().any(|a| a == "trim"),
        )),
        Some("sync-default") => rt.block_on(sync_default(&arg(1)?, &arg(2)?)),
        Some("reconcile") => rt.block_on(reconcile(
            &arg(1)?,
            &arg(2)?,
            args[3..].iter().any(|a| a == "compact"),
        )),
        Some("raw-watch-list") => rt.block_on(raw_watch_list(
            &arg(1)?,
            &arg(2)?,
            args.get(3).map(String::as_str) == Some("json"),
        )),
        Some("latency") => rt.block_on(latency(&arg(1)?, &arg(2)?, arg(3)?.parse()?)),
        Some("metadata-sync") => rt.block_on(metadata_sync(
            &arg(1)?,
            &arg(2)?,
            if args.get(3).map(String::as_str) == Some("json") {
                WireFormat::Json
            } else {
                WireFormat::Auto
            },
        )),
        Some("relist") => rt.block_on(relist(
            &arg(1)?,
            &arg(2)?,
            args.get(3).is_some_and(|a| a == "compact"),
        )),
        Some("shard-sync") => rt.block_on(shard_sync(
            &arg(1)?,
            &arg(2)?,
            arg(3)?.parse()?,
            arg(4)?.parse()?,
            &arg(5)?,
        )),
        Some("fetch-pods") => rt.block_on(fetch_pods(
            &arg(1)?,
            &arg(2)?,
            &arg(3)?,
            args.get(4).map(String::as_str) == Some("json"),
        )),
        Some("decode") => decode(
            &arg(1)?,
            arg(2)?.parse()?,
            !args[3..].iter().any(|a| a == "keep-managed-fields"),
        ),
        Some("crd-lifecycle") => rt.block_on(crd_lifecycle::crd_lifecycle(
            &arg(1)?,
            &arg(2)?,
            arg(3)?.parse()?,
        )),
        Some("metadata-decode") => rt.block_on(metadata_decode(&arg(1)?, &arg(2)?)),
        other => bail!("unknown scenario {other:?}; see the module docs"),
    }?;
    println!("{result}");
    Ok(())
}

async fn workqueue(keys: u64, adds: u64) -> Result<serde_json::Value> {
    let q: Queue<u64> = Queue::new();
    let processed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (q, processed) = (q.clone(), Arc::clone(&processed));
            tokio::spawn(async move {
                while let Some(k) = q.get().await {
                    processed.fetch_add(1, Ordering::Relaxed);
                    drop(k);
                }
            })
        })
        .collect();
    // The producer is a thread of its own, as the goroutine in the peer.
    let producer = {
        let q = q.clone();
        std::thread::spawn(move || {
            for i in 0..adds {
                // Every other add repeats the previous key: 50% duplicates.
                q.add((i / 2) % keys);
            }
        })
    };
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer panicked"))?;
    q.shut_down_with_drain().await;
    for w in workers {
        w.await?;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(
        serde_json::json!({"system": "kinformer", "scenario": "workqueue", "adds": adds,
        "processed": processed.load(Ordering::Relaxed), "seconds": secs, "adds_per_sec": adds as f64 / secs}),
    )
}

async fn ratelimited(keys: u64, rounds: u64) -> Result<serde_json::Value> {
    let limiter = ItemExponentialFailureRateLimiter::new(
        Duration::from_secs(3600),
        Duration::from_secs(7200),
    );
    let q = RateLimitingQueue::new(limiter);
    let start = Instant::now();
    for _ in 0..rounds {
        for k in 0..keys {
            q.add_rate_limited(k);
        }
        for k in 0..keys {
            q.forget(&k);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let ops = 2 * keys * rounds;
    q.shut_down();
    Ok(
        serde_json::json!({"system": "kinformer", "scenario": "ratelimited", "ops": ops, "seconds": secs, "ops_per_sec": ops as f64 / secs}),
    )
}

fn pod(i: usize, rv: usize) -> Arc<Pod> {
    let mut p = Pod::default();
    p.metadata.namespace = Some(format!("ns-{}", i % 100));
    p.metadata.name = Some(format!("pod-{i}"));
    p.metadata.resource_version = Some(rv.to_string());
    Arc::new(p)
}

async fn fifo(n: usize) -> Result<serde_json::Value> {
    let pods: Vec<_> = (0..n).map(|i| (pod(i, 1), pod(i, 2))).collect();
    let fifo = DeltaFifo::new();
    let start = Instant::now();
    // The objects stay referenced, as they would by an informer's cache.
    for (a, u) in &pods {
        fifo.add(Arc::clone(a))?;
        fifo.update(Arc::clone(u))?;
    }
    for _ in 0..n {
        fifo.pop(|d, _| Ok::<_, Requeue<()>>(d.len()))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let add_update_pop = start.elapsed().as_secs_f64();
    let list: Vec<_> = (0..n / 10).map(|i| pod(i, 3)).collect();
    let start = Instant::now();
    fifo.replace(list, "3")?;
    let replace = start.elapsed().as_secs_f64();
    drop(pods);
    Ok(
        serde_json::json!({"system": "kinformer", "scenario": "fifo", "n": n,
        "add_update_pop_seconds": add_update_pop, "ops_per_sec": (3 * n) as f64 / add_update_pop,
        "replace_seconds": replace, "replace_objects": n / 10}),
    )
}

async fn real_fifo(n: usize) -> Result<serde_json::Value> {
    let pods: Vec<_> = (0..n).map(|i| (pod(i, 1), pod(i, 2))).collect();
    let fifo = RealFifo::new();
    let start = Instant::now();
    for (a, u) in &pods {
        fifo.add(Arc::clone(a))?;
        fifo.update(Arc::clone(u))?;
    }
    for _ in 0..2 * n {
        fifo.pop(|d, _| Ok::<_, Requeue<()>>(d.len()))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let add_update_pop = start.elapsed().as_secs_f64();
    let list: Vec<_> = (0..n / 10).map(|i| pod(i, 3)).collect();
    let start = Instant::now();
    fifo.replace(list, "3")?;
    let replace = start.elapsed().as_secs_f64();
    drop(pods);
    Ok(
        serde_json::json!({"system": "kinformer", "scenario": "real-fifo", "n": n,
        "add_update_pop_seconds": add_update_pop, "ops_per_sec": (4 * n) as f64 / add_update_pop,
        "replace_seconds": replace, "replace_objects": n / 10}),
    )
}

/// Informer options on the queue `KINFORMER_BENCH_FIFO` names (`delta`,
/// `real` or `atomic`; the default queue when unset).
fn options<K>() -> InformerOptions<K> {
    let fifo = match std::env::var("KINFORMER_BENCH_FIFO").as_deref() {
        Ok("delta") => FifoKind::DeltaFifo,
        Ok("real") => FifoKind::RealFifo,
        Ok("atomic") => FifoKind::AtomicFifo,
        _ => FifoKind::default(),
    };
    InformerOptions::new().fifo(fifo)
}

async fn client(kubeconfig: &str) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

async fn sync(
    kubeconfig: &str,
    ns: &str,
    strip: bool,
    wire: WireFormat,
    compact: Option<bool>,
    trim: bool,
) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let baseline_kb = status_kb("VmRSS:");
    let anon_base_kb = status_kb("RssAnon:");
    let heap_base = heap_bytes();
    let mut lw = ApiListerWatcher::<Pod>::namespaced(client, ns).wire_format(wire);
    let protobuf = lw.uses_protobuf();
    if !strip {
        lw = lw.keep_managed_fields();
    }
    let mut options = options();
    if let Some(release) = compact {
        options = options.compact(Compact::json().release_after_list(release));
    }
    let informer = SharedIndexInformer::new(lw, options);
    if strip {
        informer.set_transform(strip_managed_fields)?;
    }
    let mut v = measure_sync(informer.clone(), baseline_kb, "sync", trim).await?;
    add_heap_per_object(&mut v, heap_base);
    add_anon_per_object(&mut v, anon_base_kb);
    v["strip_managed_fields"] = strip.into();
    v["wire"] = if protobuf { "protobuf" } else { "json" }.into();
    v["compact"] = compact.is_some().into();
    // Lister gets over every key, in an order unrelated to insertion.
    let lister = informer.lister();
    let mut keys = informer.indexer().list_keys();
    keys.sort_by_key(|k| k.bytes().rev().collect::<Vec<_>>());
    let names: Vec<(String, String)> = keys
        .iter()
        .filter_map(|k| k.split_once('/'))
        .map(|(ns, name)| (ns.to_owned(), name.to_owned()))
        .collect();
    let started = Instant::now();
    let mut found = 0;
    for (ns, name) in &names {
        found += usize::from(lister.namespaced(ns).get(name).is_some());
    }
    let per_get = started.elapsed().as_secs_f64() / names.len().max(1) as f64;
    if found != names.len() {
        bail!("the Lister found {found} of {} cached keys", names.len());
    }
    v["lister_get_us"] = (per_get * 1e6).into();
    if let Some(stats) = informer.indexer().compact_stats() {
        v["encoded_bytes_per_pod"] =
            (stats.encoded_bytes as f64 / stats.encoded_objects.max(1) as f64).into();
    }
    Ok(v)
}

/// A sync out of the box: the factory's defaults, nothing set but the
/// namespace.
async fn sync_default(kubeconfig: &str, ns: &str) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let baseline_kb = status_kb("VmRSS:");
    let anon_base_kb = status_kb("RssAnon:");
    let heap_base = heap_bytes();
    let factory = SharedInformerFactory::new(client).namespace(ns);
    let informer = factory.informer::<Pod>();
    let mut v = measure_sync(informer, baseline_kb, "sync-default", false).await?;
    add_heap_per_object(&mut v, heap_base);
    add_anon_per_object(&mut v, anon_base_kb);
    Ok(v)
}

/// The index of `reconcile`'s groups: `pod-NNNNN` is in group `NNNN`.
const GROUP_INDEX: &str = "group";

/// `reconcile`'s reconciler: reads the Pod and its group, timing both.
struct ReadingReconciler {
    cache: kinformer_store::CacheReader<Pod>,
    durations: Arc<Mutex<Vec<u64>>>,
    done: Arc<AtomicU64>,
    /// From the first reconcile's start to the last one's end.
    span: Arc<Mutex<Option<(Instant, Instant)>>>,
}

impl kinformer_controllers::Reconciler for ReadingReconciler {
    fn reconcile<'a>(
        &'a self,
        request: &'a kinformer_controllers::Request,
    ) -> BoxFuture<'a, Result<kinformer_controllers::Action, kinformer_controllers::ReconcileError>>
    {
        let key = request.key.as_str();
        let started = Instant::now();
        let mut read = 0;
        if let Some(pod) = self.cache.get_by_key(key) {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            if let Some(g) = name.strip_prefix("pod-").and_then(|n| n.get(..n.len() - 1)) {
                read = self
                    .cache
                    .by_index(GROUP_INDEX, g)
                    .map(|v| v.len())
                    .unwrap_or(0);
            }
        }
        let ended = Instant::now();
        if let Ok(mut d) = self.durations.lock() {
            d.push((ended - started).as_nanos() as u64);
        }
        if let Ok(mut span) = self.span.lock() {
            *span = Some(span.map_or((started, ended), |(first, last)| {
                (first.min(started), last.max(ended))
            }));
        }
        self.done.fetch_add(1, Ordering::Relaxed);
        std::hint::black_box(read);
        Box::pin(async { Ok(kinformer_controllers::Action::Done) })
    }
}

/// A controller whose reconcile reads its Pod and its group's 10 Pods from
/// the cache, and writes nothing (see the module docs).
async fn reconcile(kubeconfig: &str, ns: &str, compact: bool) -> Result<serde_json::Value> {
    use kinformer_controllers::{Controller, ControllerOptions};
    let client = client(kubeconfig).await?;
    let mut factory = SharedInformerFactory::new(client).namespace(ns);
    if compact {
        factory = factory.compact::<Pod>(Compact::json());
    }
    let informer = factory.informer::<Pod>();
    let group: kinformer_store::IndexFunc<Pod> = Arc::new(|p: &Pod| {
        let name = p.metadata.name.as_deref().unwrap_or_default();
        Ok(name
            .strip_prefix("pod-")
            .and_then(|n| n.get(..n.len().saturating_sub(1)))
            .map(str::to_owned)
            .into_iter()
            .collect())
    });
    informer.add_indexers([(GROUP_INDEX.to_owned(), group)].into())?;
    let cache = informer.indexer();
    let durations = Arc::new(Mutex::new(Vec::<u64>::new()));
    let done = Arc::new(AtomicU64::new(0));
    // The span from the first reconcile's start to the last one's end.
    let span = Arc::new(Mutex::new(None::<(Instant, Instant)>));
    let (d, n, sp) = (Arc::clone(&durations), Arc::clone(&done), Arc::clone(&span));
    let reconciler = ReadingReconciler {
        cache,
        durations: d,
        done: n,
        span: sp,
    };
    let controller = Controller::new(
        "reconcile-bench",
        informer.clone(),
        reconciler,
        ControllerOptions::new().workers(2),
    )?;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(controller.run(shutdown.clone()));
    while !informer.has_synced() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pods = informer.indexer().len() as u64;
    while done.load(Ordering::Relaxed) < pods {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = span
        .lock()
        .ok()
        .and_then(|sp| sp.map(|(first, last)| (last - first).as_secs_f64()))
        .context("no reconcile")?;
    shutdown.cancel();
    run.await??;
    let mut d = durations.lock().map(|d| d.clone()).unwrap_or_default();
    d.sort_unstable();
    let at = |q: f64| {
        d.get(((d.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1e3
    };
    Ok(
        serde_json::json!({"system": "kinformer", "scenario": "reconcile", "pods": pods,
        "compact": compact, "reconciles_per_second": pods as f64 / elapsed,
        "reconcile_p50_us": at(0.5), "reconcile_p99_us": at(0.99)}),
    )
}

/// The Pod lister-watcher, whose open watch ends in 410 Gone when `gone`
/// is notified: the Reflector then relists while the old cache is held.
struct GoneOnDemand {
    inner: ApiListerWatcher<Pod>,
    gone: Arc<tokio::sync::Notify>,
}

impl ListerWatcher<Pod> for GoneOnDemand {
    fn list(&self, request: ListRequest) -> BoxFuture<'_, Result<ListPage<Pod>, ListWatchError>> {
        self.inner.list(request)
    }
    fn watch(
        &self,
        request: WatchRequest,
    ) -> BoxFuture<'_, Result<WatchStream<Pod>, ListWatchError>> {
        Box::pin(async move {
            let events = self.inner.watch(request).await?;
            let gone = Arc::clone(&self.gone);
            let end = futures::stream::once(async move {
                gone.notified().await;
                Err(ListWatchError::Gone("forced by the bench".into()))
            });
            Ok(futures::stream::select(events, end).boxed())
        })
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// The Pods of one shard, filtered here: the lister-watcher sends no
/// selector, as against a server without the gate.
struct ClientFiltered {
    inner: ApiListerWatcher<Pod>,
    shard: ShardSelector,
}

impl ListerWatcher<Pod> for ClientFiltered {
    fn list(&self, request: ListRequest) -> BoxFuture<'_, Result<ListPage<Pod>, ListWatchError>> {
        Box::pin(async move {
            let mut page = self.inner.list(request).await?;
            page.items.retain(|p| self.shard.matches(p));
            Ok(page)
        })
    }
    fn watch(
        &self,
        request: WatchRequest,
    ) -> BoxFuture<'_, Result<WatchStream<Pod>, ListWatchError>> {
        Box::pin(async move {
            let shard = self.shard.clone();
            let events = self.inner.watch(request).await?;
            Ok(events
                .filter(move |e| {
                    let keep = match e {
                        Ok(
                            kube_client::core::WatchEvent::Added(p)
                            | kube_client::core::WatchEvent::Modified(p)
                            | kube_client::core::WatchEvent::Deleted(p),
                        ) => shard.matches(p),
                        _ => true,
                    };
                    futures::future::ready(keep)
                })
                .boxed())
        })
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

async fn shard_sync(
    kubeconfig: &str,
    ns: &str,
    index: u64,
    count: u64,
    mode: &str,
) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let baseline_kb = status_kb("VmRSS:");
    let shard = ShardSelector::new(ShardField::Uid, [HashRange::split(index, count)?])?;
    let lw = ApiListerWatcher::<Pod>::namespaced(client, ns);
    // Clones share the count of bytes received.
    let counter = lw.clone();
    let informer = match mode {
        "server" => SharedIndexInformer::new(lw.shard(shard), options()),
        "client" => SharedIndexInformer::new(ClientFiltered { inner: lw, shard }, options()),
        "none" => SharedIndexInformer::new(lw, options()),
        other => bail!("unknown shard-sync mode {other:?}: server, client or none"),
    };
    let mut v = measure_sync(informer, baseline_kb, "shard-sync", false).await?;
    v["bytes_received"] = counter.bytes_received().into();
    // The RSS growth from before the informer to 2 s after its sync.
    let rss = v["rss_bytes"].as_u64().unwrap_or_default();
    v["cache_bytes"] = rss.saturating_sub(baseline_kb * 1024).into();
    v["mode"] = mode.into();
    Ok(v)
}

/// Relist peak memory: a synced informer (protobuf, managedFields
/// dropped) gets a 410 on its watch and relists everything while its cache
/// is held; the peak RSS during the relist against the steady RSS before.
async fn relist(kubeconfig: &str, ns: &str, compact: bool) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let gone = Arc::new(tokio::sync::Notify::new());
    let lw = GoneOnDemand {
        inner: ApiListerWatcher::<Pod>::namespaced(client, ns),
        gone: Arc::clone(&gone),
    };
    let mut options = options();
    if compact {
        options = options.compact(Compact::json());
    }
    let informer = SharedIndexInformer::new(lw, options);
    informer.add_event_handler(ResourceEventHandlerFuncs::new())?;
    let shutdown = CancellationToken::new();
    let (i, s) = (informer.clone(), shutdown.clone());
    tokio::spawn(async move { i.run(s).await });
    while !informer.has_synced() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let steady_kb = status_kb("VmRSS:");
    // Reset VmHWM to the current RSS, so the peak is the relist's.
    std::fs::write("/proc/self/clear_refs", "5").context("resetting VmHWM")?;
    let stats = informer.reflector_stats().context("no reflector stats")?;
    let lists = stats.lists_completed.load(Ordering::SeqCst);
    let started = Instant::now();
    gone.notify_waiters();
    while stats.lists_completed.load(Ordering::SeqCst) == lists {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let relist_secs = started.elapsed().as_secs_f64();
    // The peak is read 2 s after the list completed: the informer may still
    // be applying the list then, and that is part of the relist.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let peak_kb = status_kb("VmHWM:");
    let after_kb = status_kb("VmRSS:");
    let objects = informer.indexer().len();
    shutdown.cancel();
    Ok(
        serde_json::json!({"system": "kinformer", "scenario": "relist", "pods": objects, "compact": compact,
        "relist_seconds": relist_secs, "steady_rss_bytes": steady_kb * 1024,
        "relist_peak_rss_bytes": peak_kb * 1024, "after_rss_bytes": after_kb * 1024,
        "peak_over_steady": peak_kb as f64 / steady_kb.max(1) as f64}),
    )
}

async fn metadata_sync(kubeconfig: &str, ns: &str, wire: WireFormat) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let baseline_kb = status_kb("VmRSS:");
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<PartialObjectMeta<Pod>>::namespaced(client, ns).wire_format(wire),
        options(),
    );
    measure_sync(informer, baseline_kb, "metadata-sync", false).await
}

/// Runs `informer` with one no-op handler until it has synced, then, 2 s
/// later, reads the RSS: time to synced, RSS and RSS growth per object
/// since `baseline_kb`.
/// Adds to a sync's output its anonymous RSS growth per object since
/// `base_kb`: the RSS growth less the program's own pages read in from its
/// file during the sync (code, a fixed cost, not the cache's).
fn add_anon_per_object(v: &mut serde_json::Value, base_kb: u64) {
    let objects = v["pods"].as_u64().unwrap_or_default().max(1) as f64;
    if let Some(anon) = v["rss_anon_bytes"].as_u64() {
        v["anon_bytes_per_pod"] = (anon.saturating_sub(base_kb * 1024) as f64 / objects).into();
    }
}

/// glibc's heap now, all arenas: bytes in live allocations (mmapped chunks
/// included) and bytes freed but kept by the allocator.
fn heap_bytes() -> (u64, u64) {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let m = unsafe { libc::mallinfo2() };
    ((m.uordblks + m.hblkhd) as u64, m.fordblks as u64)
}

/// Adds to a sync's output its heap growth per object since `base`: live
/// bytes and bytes freed but kept (the RSS growth less both is what lies
/// outside glibc's heap: thread stacks, the binary's pages).
fn add_heap_per_object(v: &mut serde_json::Value, base: (u64, u64)) {
    let objects = v["pods"].as_u64().unwrap_or_default().max(1) as f64;
    let (live, free) = (v["heap_live_bytes"].as_u64(), v["heap_free_bytes"].as_u64());
    if let (Some(live), Some(free)) = (live, free) {
        v["heap_live_per_pod"] = ((live as f64 - base.0 as f64) / objects).into();
        v["heap_free_per_pod"] = ((free as f64 - base.1 as f64) / objects).into();
    }
}

async fn measure_sync<K: kinformer_store::Object + Clone>(
    informer: SharedIndexInformer<K>,
    baseline_kb: u64,
    scenario: &str,
    trim: bool,
) -> Result<serde_json::Value> {
    informer.add_event_handler(ResourceEventHandlerFuncs::new())?;
    let shutdown = CancellationToken::new();
    let start = Instant::now();
    let cpu_start = process_cpu_ms();
    let i = informer.clone();
    let s = shutdown.clone();
    tokio::spawn(async move { i.run(s).await });
    while !informer.has_synced() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let sync_secs = start.elapsed().as_secs_f64();
    let cpu_ms = process_cpu_ms() - cpu_start;
    // Let transient buffers go before measuring the steady state.
    tokio::time::sleep(Duration::from_secs(2)).await;
    if trim {
        // SAFETY: malloc_trim only releases free memory of glibc's heaps.
        unsafe {
            libc::malloc_trim(0);
        }
    }
    let rss_kb = status_kb("VmRSS:");
    let hwm_kb = status_kb("VmHWM:");
    let (heap_live, heap_free) = heap_bytes();
    let anon_kb = status_kb("RssAnon:");
    let objects = informer.indexer().len();
    shutdown.cancel();
    Ok(
        serde_json::json!({"system": "kinformer", "scenario": scenario, "pods": objects,
        "sync_seconds": sync_secs, "cpu_ms": cpu_ms, "rss_bytes": rss_kb * 1024, "peak_rss_bytes": hwm_kb * 1024,
        "rss_anon_bytes": anon_kb * 1024, "heap_live_bytes": heap_live, "heap_free_bytes": heap_free,
        "bytes_per_pod": (rss_kb.saturating_sub(baseline_kb) * 1024) as f64 / objects.max(1) as f64}),
    )
}

async fn metadata_decode(kubeconfig: &str, ns: &str) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let req = kube_client::core::Request::new(format!("/api/v1/namespaces/{ns}/pods"))
        .list_metadata(&Default::default())?;
    let text = client.request_text(req).await?;
    let json = kinformer_informer::strip_managed_fields_json(
        text.as_bytes(),
        kinformer_informer::JsonShape::List,
    )
    .into_owned();
    drop(text);
    #[derive(serde::Deserialize)]
    struct List<'a> {
        #[serde(borrow)]
        items: Vec<&'a serde_json::value::RawValue>,
    }
    let raw: List<'_> = serde_json::from_slice(&json)?;
    let mut objects: Vec<PartialObjectMeta<Pod>> = Vec::with_capacity(raw.items.len());
    let baseline_kb = status_kb("VmRSS:");
    for item in &raw.items {
        objects.push(serde_json::from_str(item.get())?);
    }
    let rss_kb = status_kb("VmRSS:");
    let n = objects.len().max(1);
    Ok(
        serde_json::json!({"system": "kinformer", "scenario": "metadata-decode", "pods": objects.len(),
        "json_bytes_per_object": json.len() as f64 / n as f64,
        "inline_bytes": std::mem::size_of::<PartialObjectMeta<Pod>>(),
        "bytes_per_pod": (rss_kb.saturating_sub(baseline_kb) * 1024) as f64 / n as f64}),
    )
}

async fn fetch_pods(
    kubeconfig: &str,
    ns: &str,
    file: &str,
    json: bool,
) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let accept = if json {
        "application/json"
    } else {
        "application/vnd.kubernetes.protobuf"
    };
    let req = http::Request::get(format!("/api/v1/namespaces/{ns}/pods"))
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())?;
    let response = client
        .send(req.map(kube_client::client::Body::from))
        .await?;
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await?
        .to_bytes();
    if !status.is_success() {
        bail!("listing Pods: {status}: {}", String::from_utf8_lossy(&body));
    }
    std::fs::write(file, &body).with_context(|| format!("writing {file}"))?;
    Ok(serde_json::json!({"system": "kinformer", "scenario": "fetch-pods", "bytes": body.len()}))
}

/// User and system CPU time of the whole process, in nanoseconds (as
/// client-go-peer's `decode` counts its garbage collector's).
fn process_cpu_ns() -> (u64, u64) {
    // SAFETY: an all-zero rusage is valid, and `getrusage` fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid rusage for the call to fill.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    (ns(usage.ru_utime), ns(usage.ru_stime))
}

fn decode(file: &str, rounds: usize, drop_managed_fields: bool) -> Result<serde_json::Value> {
    let body = std::fs::read(file).with_context(|| format!("reading {file}"))?;
    let protobuf = body.starts_with(b"k8s\0");
    // As the informer's lister-watcher decodes: protobuf items each on
    // their own; JSON read as raw items first, then each item decoded.
    let once = || -> Result<usize> {
        if protobuf {
            let list =
                kinformer_informer::protobuf::decode_list::<Pod>(&body, &(), drop_managed_fields)?;
            let pods: Vec<Pod> = list.items.into_iter().collect::<Result<_, _>>()?;
            Ok(pods.len())
        } else {
            let json = if drop_managed_fields {
                kinformer_informer::strip_managed_fields_json(
                    &body,
                    kinformer_informer::JsonShape::List,
                )
            } else {
                std::borrow::Cow::Borrowed(&body[..])
            };
            #[derive(serde::Deserialize)]
            struct RawList<'a> {
                #[serde(borrow)]
                items: Vec<&'a serde_json::value::RawValue>,
            }
            let raw: RawList<'_> = serde_json::from_slice(&json)?;
            let pods = raw
                .items
                .iter()
                .map(|item| serde_json::from_str::<Pod>(item.get()))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(pods.len())
        }
    };
    let (mut per_pod, mut user_per_pod) = (Vec::new(), Vec::new());
    let mut pods = 0;
    for _ in 0..rounds.max(1) {
        let (user, system) = process_cpu_ns();
        pods = once()?;
        let (user_after, system_after) = process_cpu_ns();
        let n = pods.max(1) as f64;
        per_pod.push((user_after + system_after - user - system) as f64 / n);
        user_per_pod.push((user_after - user) as f64 / n);
    }
    per_pod.sort_by(f64::total_cmp);
    user_per_pod.sort_by(f64::total_cmp);
    Ok(
        serde_json::json!({"system": "kinformer", "scenario": "decode",
        "format": if protobuf { "protobuf" } else { "json" }, "pods": pods,
        "bytes_per_pod": body.len() as f64 / pods.max(1) as f64,
        "cpu_us_per_pod": per_pod[per_pod.len() / 2] / 1e3,
        "user_cpu_us_per_pod": user_per_pod[user_per_pod.len() / 2] / 1e3}),
    )
}

async fn latency(kubeconfig: &str, ns: &str, seconds: u64) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let informer =
        SharedIndexInformer::new(ApiListerWatcher::<Pod>::namespaced(client, ns), options());
    // The transform runs in the Reflector as each object is decoded, before
    // it is queued: the time it sees an update splits the latency into the
    // part before kinformer has the object (server, wire, decode) and the
    // part inside it (queue, informer, handler dispatch).
    let decoded_at = Arc::new(Mutex::new(HashMap::<u64, u64>::new()));
    let d = Arc::clone(&decoded_at);
    informer.set_transform(move |p: Pod| {
        if let Some(sent) = sent_ns(&p)
            && let Ok(mut d) = d.lock()
        {
            d.insert(sent, now_ns());
        }
        strip_managed_fields(p)
    })?;
    let samples = Arc::new(samples::Samples::default());
    let record = move |s: &Arc<samples::Samples>, p: &Pod| {
        if let Some(sent) = sent_ns(p) {
            let now = now_ns();
            let decoded = decoded_at.lock().ok().and_then(|mut d| d.remove(&sent));
            s.push(samples::Sample {
                sent,
                total: now.saturating_sub(sent),
                decoded: decoded.map(|at| (at.saturating_sub(sent), now.saturating_sub(at))),
            });
        }
    };
    let (a, u) = (Arc::clone(&samples), Arc::clone(&samples));
    let record_update = record.clone();
    informer.add_event_handler(
        ResourceEventHandlerFuncs::new()
            .on_add(move |p, initial| {
                if !initial {
                    record(&a, p)
                }
            })
            .on_update(move |_, p| record_update(&u, p)),
    )?;
    let shutdown = CancellationToken::new();
    let i = informer.clone();
    let s = shutdown.clone();
    tokio::spawn(async move { i.run(s).await });
    while !informer.has_synced() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Tell the orchestrator we are watching, then collect for `seconds`.
    eprintln!("ready");
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    shutdown.cancel();
    let taken = samples.take();
    // Every update's latency, for `cargo xtask bench` to pair with another
    // client's that watched the same updates.
    if let Some(path) = std::env::var_os("BENCH_LATENCY_SAMPLES") {
        let lines: String = taken
            .iter()
            .map(|s| format!("{} {}\n", s.sent, s.total))
            .collect();
        std::fs::write(&path, lines).context("writing the latency samples")?;
    }
    let pct = |mut v: Vec<u64>, q: f64| {
        v.sort_unstable();
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as f64
            / 1e6
    };
    let total: Vec<u64> = taken.iter().map(|s| s.total).collect();
    let before: Vec<u64> = taken
        .iter()
        .filter_map(|s| s.decoded.map(|d| d.0))
        .collect();
    let inside: Vec<u64> = taken
        .iter()
        .filter_map(|s| s.decoded.map(|d| d.1))
        .collect();
    Ok(
        serde_json::json!({"system": "kinformer", "scenario": "latency", "events": total.len(),
        "p50_ms": pct(total.clone(), 0.50), "p99_ms": pct(total.clone(), 0.99),
        "max_ms": pct(total, 1.0),
        "split_events": before.len(),
        "to_decoded_p50_ms": pct(before.clone(), 0.50), "to_decoded_p99_ms": pct(before, 0.99),
        "decoded_to_handler_p50_ms": pct(inside.clone(), 0.50),
        "decoded_to_handler_p99_ms": pct(inside, 0.99)}),
    )
}

/// The send time the latency writer stamped on a Pod, if any.
fn sent_ns(p: &Pod) -> Option<u64> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("bench/sent-ns"))
        .and_then(|v| v.parse::<u64>().ok())
}

mod samples {
    use std::sync::Mutex;

    /// One update seen by the handler, in nanoseconds: write to handler, and
    /// (write to decoded, decoded to handler) when the transform saw it.
    pub struct Sample {
        pub sent: u64,
        pub total: u64,
        pub decoded: Option<(u64, u64)>,
    }

    /// Latency samples.
    #[derive(Default)]
    pub struct Samples(Mutex<Vec<Sample>>);

    impl Samples {
        pub fn push(&self, v: Sample) {
            if let Ok(mut s) = self.0.lock() {
                s.push(v);
            }
        }
        pub fn take(&self) -> Vec<Sample> {
            self.0
                .lock()
                .map(|mut s| std::mem::take(&mut *s))
                .unwrap_or_default()
        }
    }
}

/// The server's streaming list of the Pods of `ns` read off the wire and
/// framed, no object decoded: the floor under any client's sync, since
/// the server encodes and sends the same events to every client. Protobuf
/// (length-prefixed frames, the event type read from each frame's first
/// field) unless `json` (one event a line). Ends at the first BOOKMARK,
/// which on a streaming list is the end of its initial events.
async fn raw_watch_list(kubeconfig: &str, ns: &str, json: bool) -> Result<serde_json::Value> {
    use futures::{AsyncBufReadExt, AsyncReadExt};
    let client = client(kubeconfig).await?;
    let url = format!(
        "/api/v1/namespaces/{ns}/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion="
    );
    let accept = if json {
        "application/json"
    } else {
        "application/vnd.kubernetes.protobuf;stream=watch"
    };
    let cpu_start = process_cpu_ms();
    let start = Instant::now();
    let req = http::Request::get(url)
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())?;
    let (mut events, mut bytes) = (0u64, 0u64);
    if json {
        let mut lines = client.request_stream(req).await?.lines();
        while let Some(line) = lines.next().await {
            let line = line?;
            bytes += line.len() as u64 + 1;
            events += 1;
            if line.contains("\"BOOKMARK\"") {
                break;
            }
        }
    } else {
        let response = client.send(req.map(Into::into)).await?;
        if !response.status().is_success() {
            bail!("the streaming list was refused: {}", response.status());
        }
        let mut body = kinformer_informer::protobuf::body_reader(response);
        let mut frame = Vec::new();
        loop {
            let mut len = [0u8; 4];
            body.read_exact(&mut len).await?;
            let len = u32::from_be_bytes(len) as usize;
            frame.resize(len, 0);
            body.read_exact(&mut frame).await?;
            bytes += 4 + len as u64;
            events += 1;
            if watch_event_type(&frame)? == b"BOOKMARK" {
                break;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(
        serde_json::json!({"scenario": "raw-watch-list", "events": events, "bytes": bytes,
        "sync_seconds": seconds, "cpu_ms": process_cpu_ms() - cpu_start,
        "mb_per_s": bytes as f64 / seconds / 1e6}),
    )
}

/// The type of a protobuf `WatchEvent` (field 1, a string, which the API
/// server writes first) without decoding the rest of the frame.
fn watch_event_type(frame: &[u8]) -> Result<&[u8]> {
    let Some((&0x0a, rest)) = frame.split_first() else {
        bail!("a watch frame that does not start with its type");
    };
    let (mut len, mut shift, mut i) = (0usize, 0, 0);
    loop {
        let b = *rest.get(i).context("a truncated watch frame")?;
        len |= usize::from(b & 0x7f) << shift;
        i += 1;
        if b & 0x80 == 0 || shift > 28 {
            break;
        }
        shift += 7;
    }
    rest.get(i..i + len).context("a truncated watch frame")
}
