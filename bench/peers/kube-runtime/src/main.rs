//! kube-runtime's side of `cargo xtask bench`: the informer scenarios with
//! kube-runtime 5's watcher + reflector, the same arguments and JSON output
//! as kinformer-bench. kube-runtime has no workqueue or DeltaFIFO to compare.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Config, ResourceExt};

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

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

async fn client(kubeconfig: &str) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| {
        args.get(i)
            .cloned()
            .with_context(|| format!("missing argument {i}"))
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = match args.first().map(String::as_str) {
        Some("sync") => rt.block_on(sync(
            &arg(1)?,
            &arg(2)?,
            !args[3..].iter().any(|a| a == "keep-managed-fields"),
            args[3..].iter().any(|a| a == "paged"),
        )),
        Some("latency") => rt.block_on(latency(&arg(1)?, &arg(2)?, arg(3)?.parse()?)),
        Some("metadata-sync") => rt.block_on(metadata_sync(&arg(1)?, &arg(2)?)),
        other => bail!("scenario {other:?} has no kube-runtime counterpart"),
    }?;
    println!("{result}");
    Ok(())
}

/// The Pod watcher + reflector: with the streaming list (as kinformer and
/// client-go list), or with kube-runtime's default paged lists of 500
/// (`paged`); managedFields cleared after decoding, as client-go's
/// transform does.
async fn sync(kubeconfig: &str, ns: &str, strip: bool, paged: bool) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let baseline_kb = status_kb("VmRSS:");
    let anon_base_kb = status_kb("RssAnon:");
    let heap_base = heap_bytes();
    let api: Api<Pod> = Api::namespaced(client, ns);
    let config = if paged {
        watcher::Config::default()
    } else {
        watcher::Config::default().streaming_lists()
    };
    let mut v = measure_sync(api, config, strip, baseline_kb, "sync").await?;
    add_heap_per_object(&mut v, heap_base);
    add_anon_per_object(&mut v, anon_base_kb);
    v["strip_managed_fields"] = strip.into();
    v["paged"] = paged.into();
    Ok(v)
}

/// Metadata-only sync with kube-runtime's watcher over `PartialObjectMeta`
/// (kube 5's replacement for the deprecated `metadata_watcher`; its default
/// config: paged lists of 500, no streaming list), managedFields cleared.
async fn metadata_sync(kubeconfig: &str, ns: &str) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let baseline_kb = status_kb("VmRSS:");
    let api: Api<PartialObjectMeta<Pod>> = Api::namespaced(client, ns);
    measure_sync(
        api,
        watcher::Config::default(),
        true,
        baseline_kb,
        "metadata-sync",
    )
    .await
}

/// Adds to a sync's output its anonymous RSS growth per object since
/// `base_kb`: the RSS growth less the program's own pages read in from its
/// file during the sync (code, a fixed cost, not the cache's).
fn add_anon_per_object(v: &mut serde_json::Value, base_kb: u64) {
    let objects = v["pods"].as_u64().unwrap_or_default().max(1) as f64;
    if let Some(anon) = v["rss_anon_bytes"].as_u64() {
        v["anon_bytes_per_pod"] = (anon.saturating_sub(base_kb * 1024) as f64 / objects).into();
    }
}

/// CPU time (user + system) this process has used, in ms.
fn process_cpu_ms() -> f64 {
    // SAFETY: an all-zero rusage is valid, and `getrusage` fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid rusage for the call to fill.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(usage.ru_utime) + ms(usage.ru_stime)
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

/// Watcher + reflector over `api` until the store is ready, then, 2 s later,
/// the RSS: time to ready, RSS and RSS growth per object since `baseline_kb`.
async fn measure_sync<K>(
    api: Api<K>,
    config: watcher::Config,
    strip: bool,
    baseline_kb: u64,
    scenario: &str,
) -> Result<serde_json::Value>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let start = Instant::now();
    let cpu_start = process_cpu_ms();
    let stream = watcher(api, config).modify(move |p| {
        if strip {
            p.managed_fields_mut().clear();
        }
    });
    let driver = tokio::spawn(reflector(writer, stream).for_each(|_| futures::future::ready(())));
    reader.wait_until_ready().await?;
    let sync_secs = start.elapsed().as_secs_f64();
    let cpu_ms = process_cpu_ms() - cpu_start;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_kb = status_kb("VmRSS:");
    let hwm_kb = status_kb("VmHWM:");
    let (heap_live, heap_free) = heap_bytes();
    let anon_kb = status_kb("RssAnon:");
    let objects = reader.state().len();
    driver.abort();
    Ok(
        serde_json::json!({"system": "kube-runtime", "scenario": scenario, "pods": objects,
        "sync_seconds": sync_secs, "cpu_ms": cpu_ms, "rss_bytes": rss_kb * 1024, "peak_rss_bytes": hwm_kb * 1024,
        "rss_anon_bytes": anon_kb * 1024, "heap_live_bytes": heap_live, "heap_free_bytes": heap_free,
        "bytes_per_pod": (rss_kb.saturating_sub(baseline_kb) * 1024) as f64 / objects.max(1) as f64}),
    )
}

async fn latency(kubeconfig: &str, ns: &str, seconds: u64) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let api: Api<Pod> = Api::namespaced(client, ns);
    let (reader, writer) = reflector::store();
    let samples = Arc::new(Mutex::new(Vec::<u64>::new()));
    let s = Arc::clone(&samples);
    let stream =
        watcher(api, watcher::Config::default()).modify(|p| p.managed_fields_mut().clear());
    let driver = tokio::spawn(
        reflector(writer, stream)
            .touched_objects()
            .try_for_each(move |p| {
                if let Some(sent) = p
                    .annotations()
                    .get("bench/sent-ns")
                    .and_then(|v| v.parse::<u64>().ok())
                    && let Ok(mut s) = s.lock()
                {
                    s.push(now_ns().saturating_sub(sent));
                }
                futures::future::ready(Ok(()))
            }),
    );
    reader.wait_until_ready().await?;
    // Samples from the initial list are not events.
    if let Ok(mut s) = samples.lock() {
        s.clear();
    }
    eprintln!("ready");
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    driver.abort();
    let mut v = samples
        .lock()
        .map(|mut s| std::mem::take(&mut *s))
        .unwrap_or_default();
    v.sort_unstable();
    let pct = |q: f64| {
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as f64
            / 1e6
    };
    Ok(
        serde_json::json!({"system": "kube-runtime", "scenario": "latency", "events": v.len(),
        "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": v.last().copied().unwrap_or(0) as f64 / 1e6}),
    )
}
