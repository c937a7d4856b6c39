//! `cargo xtask soak --minutes N`: steady churn of Pods with a fault every
//! 30 s (connections cut, a silent network, an apiserver restart, an etcd
//! compaction, in turn), checking after each that the informer's cache and
//! its handler's view equal the server's, and that the handler got no
//! notification out of sequence (an add of a key it had, an update whose old
//! is not what it saw last, a delete of a key it did not have). Reports
//! events, relists, divergences, sequence violations and resident memory over
//! time; writes docs/reliability.md. Fails on any divergence, violation, or
//! informer failure.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kinformer_envtest::{Proxy, TestEnv, TestEnvOptions};
use kinformer_informer::consistency::{LastSeen, diff, diff_cache, server_versions};
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, InformerOptions, ReflectorOptions, SharedIndexInformer,
    strip_managed_fields,
};
use kube_client::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const FAULTS: [&str; 4] = [
    "cut every connection",
    "silent network for 8 s",
    "kube-apiserver restart",
    "etcd compaction",
];

fn rss_mib() -> f64 {
    crate::status_mib("self", "VmRSS:").unwrap_or(0.0)
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"gen": "0"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap_or_default()
}

pub async fn run(minutes: u64, root: &Path) -> Result<()> {
    let started = Instant::now();
    // The server alone: what the soak checks is the informers.
    let mut env = TestEnv::start_with(TestEnvOptions::new().without_controller_manager()).await?;
    let ns = env.create_namespace("soak").await?;
    let proxy = Proxy::start(env.api_port()).await?;
    let mut options = ReflectorOptions::default();
    options.idle_timeout = Duration::from_secs(10);
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<Pod>::namespaced(env.client_via(proxy.port())?, &ns),
        InformerOptions::new().reflector(options),
    );
    informer.set_transform(strip_managed_fields)?;
    let seen = LastSeen::default();
    informer.add_event_handler(seen.clone())?;
    let shutdown = CancellationToken::new();
    let informer_task = {
        let (i, s) = (informer.clone(), shutdown.clone());
        tokio::spawn(async move { i.run(s).await })
    };

    // Churn: about 40 writes a second over at most 300 Pods.
    let paused = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let failed_writes = Arc::new(AtomicU64::new(0));
    let noop_writes = Arc::new(AtomicU64::new(0));
    // The fault loop swaps in a new client after an apiserver restart.
    let client = Arc::new(Mutex::new(env.client()?));
    {
        let (paused, writes, failed, noop, client, shutdown, ns) = (
            paused.clone(),
            writes.clone(),
            failed_writes.clone(),
            noop_writes.clone(),
            client.clone(),
            shutdown.clone(),
            ns.clone(),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(25));
            let mut n = 0u64;
            while !shutdown.is_cancelled() {
                tick.tick().await;
                if paused.load(Ordering::SeqCst) {
                    continue;
                }
                n += 1;
                let api: Api<Pod> = Api::namespaced(
                    client.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                    &ns,
                );
                let name = format!("p{}", fastrand::u32(0..300));
                let result = match fastrand::u8(0..10) {
                    0..=3 => api
                        .create(&PostParams::default(), &pod(&name))
                        .await
                        .map(|_| ()),
                    4..=7 => {
                        let patch =
                            serde_json::json!({"metadata": {"labels": {"gen": n.to_string()}}});
                        api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                            .await
                            .map(|_| ())
                    }
                    _ => api
                        .delete(&name, &DeleteParams::default())
                        .await
                        .map(|_| ()),
                };
                match result {
                    Ok(()) => writes.fetch_add(1, Ordering::Relaxed),
                    // Creating a Pod that exists, or changing one that does
                    // not, is part of random churn.
                    Err(kube_client::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                        noop.fetch_add(1, Ordering::Relaxed)
                    }
                    // An unreachable server during a restart is the fault.
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
    }

    let mut memory = vec![(0u64, rss_mib())];
    let mut rows = Vec::new();
    let mut divergences = 0;
    let total = Duration::from_secs(minutes.max(1) * 60);
    let mut fault_no = 0usize;
    println!("soak: {minutes} min of churn in namespace {ns}, a fault every 30 s");
    while started.elapsed() < total {
        // 30 s of churn, sampling memory every 10 s.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            memory.push((started.elapsed().as_secs(), rss_mib()));
        }
        let fault = FAULTS[fault_no % FAULTS.len()];
        fault_no += 1;
        match fault_no % FAULTS.len() {
            1 => proxy.cut_all(),
            2 => {
                proxy.blackhole(true);
                tokio::time::sleep(Duration::from_secs(8)).await;
                proxy.blackhole(false);
            }
            3 => {
                env.restart_apiserver()
                    .await
                    .context("restarting kube-apiserver")?;
                *client.lock().unwrap_or_else(|e| e.into_inner()) = env.client()?;
            }
            _ => {
                env.compact_etcd().await?;
            }
        }
        // Quiesce writes, then the cache must catch up.
        paused.store(true, Ordering::SeqCst);
        let api: Api<Pod> = Api::namespaced(env.client()?, &ns);
        let t = Instant::now();
        let mut converged = false;
        let mut last = String::new();
        while t.elapsed() < Duration::from_secs(30) {
            let cache = diff_cache(&informer, &api).await?;
            let handler = diff(&server_versions(&api).await?, &seen.snapshot());
            if cache.is_empty() && handler.is_empty() {
                converged = true;
                last.clear();
                break;
            }
            last = format!(
                "cache {} / handler {} differences",
                cache.len(),
                handler.len()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if !converged {
            divergences += 1;
        }
        if let Some(e) = informer.failure() {
            last = format!("informer failed: {e}");
        }
        let violations = seen.violations();
        if let Some(v) = violations.last() {
            last = format!("{} sequence violations, last: {v}", violations.len());
        }
        let pods = api.list(&ListParams::default()).await?.items.len();
        let row = format!(
            "| {:>4} | {fault} | {pods} | {} | {} |",
            started.elapsed().as_secs(),
            match (converged, last.is_empty()) {
                (true, true) => format!("{:.1} s", t.elapsed().as_secs_f64()),
                (true, false) => format!("{:.1} s ({last})", t.elapsed().as_secs_f64()),
                (false, _) => format!("no ({last})"),
            },
            memory
                .last()
                .map(|m| format!("{:.1}", m.1))
                .unwrap_or_default()
        );
        println!("{row}");
        rows.push(row);
        paused.store(false, Ordering::SeqCst);
    }
    shutdown.cancel();
    let run_result = informer_task.await.context("the informer task")?;
    let violations = seen.violations();
    let stats = informer.reflector_stats().context("no reflector stats")?;
    let lists = stats.lists_completed.load(Ordering::Relaxed);
    let summary = format!(
        "{} s, {} writes (plus {} that hit a missing or existing Pod, {} failed during faults), {} events processed, {} lists ({} relists), {} watches, {} errors reported, {} divergences, {} sequence violations",
        started.elapsed().as_secs(),
        writes.load(Ordering::Relaxed),
        noop_writes.load(Ordering::Relaxed),
        failed_writes.load(Ordering::Relaxed),
        stats.events.load(Ordering::Relaxed),
        lists,
        lists.saturating_sub(1),
        stats.watches.load(Ordering::Relaxed),
        stats.errors.load(Ordering::Relaxed),
        divergences,
        violations.len()
    );
    println!("soak: {summary}");
    env.stop();
    write_report(root, minutes, &summary, &rows, &memory)?;
    for v in violations.iter().take(20) {
        println!("soak: sequence violation: {v}");
    }
    run_result.context("the informer failed")?;
    if divergences > 0 || !violations.is_empty() {
        anyhow::bail!(
            "{divergences} divergences, {} sequence violations",
            violations.len()
        );
    }
    Ok(())
}

fn write_report(
    root: &Path,
    minutes: u64,
    summary: &str,
    rows: &[String],
    memory: &[(u64, f64)],
) -> Result<()> {
    let path = root.join("docs/reliability.md");
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    const BEGIN: &str = "<!-- BEGIN cargo xtask soak -->";
    const END: &str = "<!-- END cargo xtask soak -->";
    let series = memory
        .iter()
        .map(|(t, m)| format!("{t} s: {m:.1}"))
        .collect::<Vec<_>>()
        .join(", ");
    let section = format!(
        "{BEGIN}\n## Latest soak: `cargo xtask soak --minutes {minutes}`\n\n{summary}.\n\n\
         After each fault the writer pauses and the informer must catch up within 30 s (a divergence otherwise); the handler must get no notification out of sequence (a sequence violation otherwise).\n\n\
         | t (s) | fault | pods | caught up | RSS (MiB) |\n|---|---|---|---|---|\n{}\n\n\
         Resident memory of the soak process (informer, writer and checker) over time, MiB: {series}.\n{END}\n",
        rows.join("\n")
    );
    let updated = match (current.find(BEGIN), current.find(END)) {
        (Some(b), Some(e)) => format!(
            "{}{}{}",
            &current[..b],
            section,
            current[e + END.len()..].trim_start_matches('\n')
        ),
        _ => format!("{}\n{}", current.trim_end(), section),
    };
    std::fs::write(&path, updated).with_context(|| format!("writing {}", path.display()))
}
