//! `cargo xtask bench --controllers`: whole controllers, not informers. The
//! same controller, configmap-hash (examples/configmap-hash; its peers in
//! bench/peers: each stamps a Deployment's pod template with the hash of the
//! ConfigMaps it uses, read from its cache, by a merge patch), in kinformer,
//! controller-runtime and kube-runtime, each as its own docs write it and
//! with its defaults, against one control plane, the systems rotating.
//!
//! Before them, the stale-read rows of [`super::stale_reads`]: a second
//! controller, child-per-parent, behind a watch lagging its writes.
//!
//! Every row is timed from the outside: each program prints a line after a
//! patch of its returns, and the bench stamps each line as it reads it.
//!
//! - Converge: N Deployments, each using a ConfigMap of its own, all of
//!   whose hashes are stale (every ConfigMap was changed while no controller
//!   ran); from the controller's process start to the last of the N patches.
//!   Also the process's peak RSS, and the API server's CPU and requests.
//! - Churn: then, in the same process, ConfigMaps changed at a steady rate,
//!   each a different one: from each write sent to the patch of its
//!   Deployment answered; p50, p99 and the rate handled.
//! - Failover: two replicas with leader election (client-go's 15 s lease
//!   for all three), with the Deployments grown to M (the extra ones use no
//!   ConfigMap and carry their hash already). Once the leader and its
//!   standby are idle, the leader is SIGKILLed and ConfigMaps are changed,
//!   the first just after the kill, then 20 a second: the time from the
//!   kill to the Lease taken over, to the new leader's first patch, and to
//!   the patch for the first write. Also with no standby: a fresh process
//!   started at the kill, as a restarted pod would be.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;

use super::programs::{Programs, Running, Vars, apiserver_requests, cargo, name};
use super::*;

const BEGIN: &str = "<!-- BEGIN cargo xtask bench --controllers -->";
const END: &str = "<!-- END cargo xtask bench --controllers -->";

/// What churn changes and the controllers write.
const CHURNED: &[&str] = &["configmaps", "deployments"];

fn build(root: &Path) -> Result<Programs> {
    println!(
        "==> building configmap-hash (release): kinformer's example, its kube-runtime and controller-runtime peers"
    );
    cargo(root, "example-configmap-hash")?;
    let bench = root.join("bench");
    cargo(&bench, "configmap-hash-kube-runtime")?;
    let controller_runtime = bench.join("target/release/configmap-hash-controller-runtime");
    go_build(
        &bench.join("peers/configmap-hash-controller-runtime"),
        &controller_runtime,
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(Programs {
        kinformer: target.join("release/configmap-hash"),
        controller_runtime,
        kube_runtime: bench.join("target/release/configmap-hash-kube-runtime"),
    })
}

fn config_map(i: usize, version: usize) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("cm-{i:05}")},
        "data": {"version": version.to_string(), "payload": "x".repeat(64)}
    }))
    .unwrap_or_default()
}

fn deployment(i: usize) -> Deployment {
    let name = format!("web-{i:05}");
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                    "volumes": [{"name": "config", "configMap": {"name": format!("cm-{i:05}")}}]
                }
            }
        }
    }))
    .unwrap_or_default()
}

/// Runs `f(i)` for every i in 0..n, 32 at a time.
async fn each<F, Fut>(n: usize, f: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let results: Vec<Result<()>> = stream::iter(0..n)
        .map(f)
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

/// The hash every program stamps on a Deployment that uses no ConfigMap:
/// FNV-1a's offset basis, over nothing.
const EMPTY_HASH: &str = "cbf29ce484222325";

/// A Deployment that uses no ConfigMap, its hash already stamped: one more
/// object each controller caches and reconciles, never patches.
fn quiet_deployment(i: usize) -> Deployment {
    let name = format!("web-{i:05}");
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {"kinformer.dev/config-hash": EMPTY_HASH}},
                "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
            }
        }
    }))
    .unwrap_or_default()
}

/// Field `field` of the status of process `pid`, in MiB.
fn rss_mib(pid: Option<u32>, field: &str) -> Option<f64> {
    crate::status_mib(&pid?.to_string(), field)
}

/// Sets `cm-{i:05}`'s version to `version`.
async fn change(cms: &Api<ConfigMap>, i: usize, version: &str) -> Result<()> {
    let patch = serde_json::json!({"data": {"version": version}});
    cms.patch(
        &format!("cm-{i:05}"),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await
    .with_context(|| format!("changing cm-{i:05}"))?;
    Ok(())
}

/// What a churn phase measured.
struct Churn {
    latencies: Vec<u64>,
    per_second: f64,
}

/// Changes ConfigMaps `first..first + rate * secs` at `rate` a second, each
/// once, and waits for every one's Deployment to be patched.
async fn churn(
    running: &mut Running,
    cms: &Api<ConfigMap>,
    rate: u32,
    secs: u32,
    first: usize,
) -> Result<Churn> {
    let writes = (rate * secs) as usize;
    let mut sent = HashMap::with_capacity(writes);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    for i in first..first + writes {
        tick.tick().await;
        sent.insert(i, Instant::now());
        let cms = cms.clone();
        tasks.spawn(async move { change(&cms, i, &format!("churn-{i}")).await });
    }
    while let Some(written) = tasks.join_next().await {
        written??;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let (mut latencies, mut last) = (Vec::with_capacity(writes), started);
    while latencies.len() < writes {
        let (at, i) = running.next_patch(deadline).await.with_context(|| {
            format!(
                "{} of {writes} changes at {rate}/s reconciled",
                latencies.len()
            )
        })?;
        if let Some(at_sent) = sent.remove(&i) {
            latencies.push(at.duration_since(at_sent).as_nanos() as u64);
            last = at;
        }
    }
    Ok(Churn {
        per_second: writes as f64 / last.duration_since(started).as_secs_f64(),
        latencies,
    })
}

/// The holder of Lease configmap-hash, once it has one.
async fn holder(leases: &Api<Lease>, not: Option<&str>, deadline: Instant) -> Result<String> {
    loop {
        let lease = leases.get_opt("configmap-hash").await?;
        let held = lease
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty() && Some(h.as_str()) != not);
        if let Some(held) = held {
            return Ok(held);
        }
        if Instant::now() > deadline {
            bail!("no new holder of Lease configmap-hash in time");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How the new leader comes in.
#[derive(Clone, Copy, PartialEq)]
enum Successor {
    /// A replica running (and idle) since before the kill.
    Standby,
    /// A process started at the kill.
    Fresh,
}

/// One failover: seconds from the kill to the Lease taken over, to the new
/// leader's first patch, and to the patch for the write made just after
/// the kill (to ConfigMap `first`; then one every 50 ms to `first + 1`, ...,
/// modulo `n`). Also the standby's RSS while it waited, in MiB.
async fn failover(
    program: &Path,
    kubeconfig: &Path,
    env: &[(&str, &str)],
    (cms, leases): (&Api<ConfigMap>, &Api<Lease>),
    successor: Successor,
    (first, n): (usize, usize),
) -> Result<([f64; 3], Option<f64>)> {
    match leases.delete("configmap-hash", &Default::default()).await {
        Ok(_) => {}
        Err(kube_client::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e).context("deleting Lease configmap-hash"),
    }
    let mut leader = Running::start(program, kubeconfig, env)?;
    let held = holder(leases, None, Instant::now() + Duration::from_secs(120))
        .await
        .context("the first replica leading")?;
    leader.settled().await.context("the leader settling")?;
    let mut rss = None;
    let standby = match successor {
        Successor::Standby => {
            let mut standby = Running::start(program, kubeconfig, env)?;
            standby.settled().await.context("the standby settling")?;
            rss = rss_mib(standby.child.id(), "VmRSS:");
            Some(standby)
        }
        Successor::Fresh => None,
    };
    let killed = Instant::now();
    leader.kill().await;
    let mut next = match standby {
        Some(standby) => standby,
        None => Running::start(program, kubeconfig, env)?,
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writes = {
        let (cms, stop) = (cms.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            for k in 0.. {
                tick.tick().await;
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let i = (first + k) % n;
                change(&cms, i, &format!("failover-{first}-{k}")).await?;
            }
            anyhow::Ok(())
        })
    };
    let deadline = killed + Duration::from_secs(300);
    let taken = {
        let leases = leases.clone();
        tokio::spawn(async move {
            holder(&leases, Some(&held), deadline).await?;
            anyhow::Ok(Instant::now())
        })
    };
    let measured = async {
        let (first_patch, mut i) = next.next_patch(deadline).await?;
        let mut at = first_patch;
        while i != first {
            (at, i) = next.next_patch(deadline).await?;
        }
        anyhow::Ok((first_patch, at))
    }
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    next.kill().await;
    writes.await??;
    let taken = taken.await??;
    let (first_patch, write) = measured.context("the new leader's patches")?;
    let secs = |at: Instant| at.duration_since(killed).as_secs_f64();
    Ok(([secs(taken), secs(first_patch), secs(write)], rss))
}

pub async fn run(quick: bool, root: &Path) -> Result<()> {
    let stale_reads = super::stale_reads::run(quick, root).await?;
    let started = Instant::now();
    let programs = build(root)?;
    let (n, rounds, failover_n, failover_rounds) = if quick {
        (2_000, 1, 5_000, 1)
    } else {
        (10_000, 3, 50_000, 3)
    };
    // (changes a second, seconds): a rate every system keeps up with, and
    // one above what the API server can serve on this machine.
    let rates: &[(u32, u32)] = if quick {
        &[(100, 5)]
    } else {
        &[(100, 10), (300, 10)]
    };
    println!("\n==> starting the control plane (kube-apiserver {KUBERNETES_VERSION} + etcd)");
    // The server alone, as every bench has it (see `settled_env`).
    let env = TestEnv::start_with(TestEnvOptions::new().without_controller_manager()).await?;
    let kubeconfig = env.kubeconfig_path().to_owned();
    let client = env.client()?;
    let ns = env.create_namespace("bench-converge").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let t = Instant::now();
    each(n, |i| {
        let cms = cms.clone();
        async move {
            cms.create(&PostParams::default(), &config_map(i, 0))
                .await
                .with_context(|| format!("creating cm-{i:05}"))?;
            Ok(())
        }
    })
    .await?;
    each(n, |i| {
        let deployments = deployments.clone();
        async move {
            deployments
                .create(&PostParams::default(), &deployment(i))
                .await
                .with_context(|| format!("creating web-{i:05}"))?;
            Ok(())
        }
    })
    .await?;
    println!(
        "    {n} ConfigMaps and {n} Deployments in place ({:.0} s)",
        t.elapsed().as_secs_f64()
    );
    let scenario = format!(
        "configmap-hash converging {n} Deployments, each with a stale hash: each system's defaults (kinformer: 2 workers, protobuf; controller-runtime: 1 worker, protobuf; kube-runtime: unbounded concurrency, JSON)"
    );
    let two_workers = format!(
        "configmap-hash converging {n} Deployments: controller-runtime with MaxConcurrentReconciles 2, kinformer's default"
    );
    let workers: &Vars = &[("MAX_CONCURRENT_RECONCILES", "2")];
    let compact_row = format!(
        "configmap-hash converging {n} Deployments: kinformer with the compact cache (both informers)"
    );
    let compact: &Vars = &[("COMPACT_CACHE", "true")];
    let unawaited_row = format!(
        "configmap-hash converging {n} Deployments: kinformer with read-your-writes off (on by default)"
    );
    let unawaited: &Vars = &[("READ_YOUR_WRITES", "false")];
    let awaited_row = format!(
        "configmap-hash converging {n} Deployments: controller-runtime with EnableReadYourWritesConsistency (off by default)"
    );
    let awaited: &Vars = &[("READ_YOUR_WRITES", "true")];
    // Each system with its defaults, then controller-runtime with two
    // workers, kinformer with the compact cache (converge only), and
    // read-your-writes the other way round from each default: off in
    // kinformer (what its default costs), on in controller-runtime
    // (converge and churn).
    let all: [(System, &Vars, &str); 7] = [
        (System::Kinformer, &[], &scenario),
        (System::ClientGo, &[], &scenario),
        (System::KubeRuntime, &[], &scenario),
        (System::ClientGo, workers, &two_workers),
        (System::Kinformer, compact, &compact_row),
        (System::Kinformer, unawaited, &unawaited_row),
        (System::ClientGo, awaited, &awaited_row),
    ];
    let mut results = Results::default();
    let mut version = 0;
    for round in 0..rounds {
        for i in 0..all.len() {
            let (system, env_vars, scenario) = all[(i + round) % all.len()];
            // A new version of every ConfigMap: every hash is stale.
            version += 1;
            let version = version.to_string();
            each(n, |i| {
                let (cms, version) = (cms.clone(), version.clone());
                async move { change(&cms, i, &version).await }
            })
            .await?;
            let (cpu, requests) = (apiserver_cpu_ms(&env), apiserver_requests(&client).await);
            let t = Instant::now();
            let mut running = Running::start(programs.path(system), &kubeconfig, env_vars)?;
            let deadline = t + Duration::from_secs(900);
            let mut done = HashSet::new();
            while done.len() < n {
                let (_, i) = running
                    .next_patch(deadline)
                    .await
                    .with_context(|| format!("{} converging", name(system)))?;
                done.insert(i);
            }
            let took = t.elapsed();
            let server_ms = apiserver_cpu_ms(&env) - cpu;
            results.add(
                scenario,
                "the controller's CPU per Deployment, ms",
                system,
                running.cpu_ms() / n as f64,
            );
            results.add(
                scenario,
                "process start to every Deployment patched, s",
                system,
                took.as_secs_f64(),
            );
            results.add(
                scenario,
                "kube-apiserver CPU per Deployment, ms",
                system,
                server_ms / n as f64,
            );
            if let (Ok(before), Ok(after)) = (requests, apiserver_requests(&client).await) {
                // Less the one /metrics read of the count itself.
                let per = (after - before - 1.0) / n as f64;
                results.add(scenario, "API requests per Deployment", system, per);
            }
            if let Some(peak) = rss_mib(running.child.id(), "VmHWM:") {
                results.add(scenario, "peak RSS, MiB", system, peak);
            }
            print!(
                "    round {} {}: converged in {:.1} s",
                round + 1,
                name(system),
                took.as_secs_f64()
            );
            let mut first = 0;
            let variant = if env_vars == unawaited {
                Some(": kinformer with read-your-writes off")
            } else if env_vars == awaited {
                Some(": controller-runtime with EnableReadYourWritesConsistency")
            } else {
                None
            };
            let rates = if env_vars.is_empty() || variant.is_some() {
                rates
            } else {
                &[]
            };
            for &(rate, secs) in rates {
                let (own, server) = (running.cpu_ms(), apiserver_cpu_ms(&env));
                let served = super::programs::served(&client, CHURNED).await;
                let measured = churn(&mut running, &cms, rate, secs, first)
                    .await
                    .with_context(|| format!("{} under churn at {rate}/s", name(system)))?;
                first += (rate * secs) as usize;
                let row = format!(
                    "churn: {rate} ConfigMap changes a second for {secs} s after converging, each to a different ConfigMap; from the write sent to its Deployment's patch answered{}",
                    variant.unwrap_or_default()
                );
                let (p50, p99) = (
                    quantile_ms(measured.latencies.clone(), 0.5),
                    quantile_ms(measured.latencies, 0.99),
                );
                results.add(&row, "p50, ms", system, p50);
                results.add(&row, "p99, ms", system, p99);
                results.add(&row, "changes reconciled/s", system, measured.per_second);
                let changes = f64::from(rate * secs);
                let own = (running.cpu_ms() - own) / changes;
                results.add(&row, "the controller's CPU per change, ms", system, own);
                let server = (apiserver_cpu_ms(&env) - server) / changes;
                results.add(&row, "kube-apiserver CPU per change, ms", system, server);
                if let (Ok(before), Ok(after)) =
                    (served, super::programs::served(&client, CHURNED).await)
                {
                    // Less the bench's own patch of each ConfigMap.
                    let writes = (after.writes - before.writes - changes) / changes;
                    results.add(&row, "writes per change", system, writes);
                    let conflicts = after.conflicts - before.conflicts;
                    results.add(&row, "409 Conflicts", system, conflicts);
                }
                print!(", {rate}/s: p99 {p99:.1} ms, {:.0}/s", measured.per_second);
            }
            println!();
            running.kill().await;
        }
    }

    // Failover, with the Deployments grown to `failover_n`.
    let t = Instant::now();
    each(failover_n - n, |k| {
        let deployments = deployments.clone();
        async move {
            deployments
                .create(&PostParams::default(), &quiet_deployment(n + k))
                .await
                .with_context(|| format!("creating web-{:05}", n + k))?;
            Ok(())
        }
    })
    .await?;
    println!(
        "    {failover_n} Deployments in place ({:.0} s)",
        t.elapsed().as_secs_f64()
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let election = [("LEADER_ELECTION_NAMESPACE", ns.as_str())];
    let warmup = [
        ("LEADER_ELECTION_NAMESPACE", ns.as_str()),
        ("ENABLE_WARMUP", "true"),
    ];
    let compact_election = [
        ("LEADER_ELECTION_NAMESPACE", ns.as_str()),
        ("COMPACT_CACHE", "true"),
    ];
    let standby = format!(
        "failover to a standby replica, {failover_n} Deployments and {n} ConfigMaps: each system's defaults (kinformer's standby syncs its caches; controller-runtime's starts its sources only once leading; kube-runtime's waits for the Lease before it builds its controller)"
    );
    let warm = format!(
        "failover to a standby replica, {failover_n} Deployments and {n} ConfigMaps: controller-runtime with EnableWarmup"
    );
    let compact_standby = format!(
        "failover to a standby replica, {failover_n} Deployments and {n} ConfigMaps: kinformer with the compact cache"
    );
    let fresh = format!(
        "failover to a fresh process started at the kill (no standby), {failover_n} Deployments and {n} ConfigMaps"
    );
    let runs: [(System, Successor, &Vars, &str); 8] = [
        (System::Kinformer, Successor::Standby, &election, &standby),
        (
            System::Kinformer,
            Successor::Standby,
            &compact_election,
            &compact_standby,
        ),
        (System::ClientGo, Successor::Standby, &election, &standby),
        (System::ClientGo, Successor::Standby, &warmup, &warm),
        (System::KubeRuntime, Successor::Standby, &election, &standby),
        (System::Kinformer, Successor::Fresh, &election, &fresh),
        (System::ClientGo, Successor::Fresh, &election, &fresh),
        (System::KubeRuntime, Successor::Fresh, &election, &fresh),
    ];
    let mut first = 0;
    for round in 0..failover_rounds {
        for k in 0..runs.len() {
            let (system, successor, env_vars, row) = runs[(k + round) % runs.len()];
            let (times, rss) = failover(
                programs.path(system),
                &kubeconfig,
                env_vars,
                (&cms, &leases),
                successor,
                (first, n),
            )
            .await
            .with_context(|| format!("{} failing over", name(system)))?;
            first = (first + 997) % n;
            let [lease, first_patch, write] = times;
            results.add(row, "kill to the Lease taken over, s", system, lease);
            results.add(
                row,
                "kill to the new leader's first patch, s",
                system,
                first_patch,
            );
            results.add(
                row,
                "kill to the patch for a write made just after the kill, s",
                system,
                write,
            );
            if let Some(rss) = rss {
                results.add(row, "the standby's RSS while it waits, MiB", system, rss);
            }
            println!(
                "    failover round {} {} ({}): Lease {lease:.1} s, first patch {first_patch:.1} s, the write {write:.1} s",
                round + 1,
                name(system),
                match (successor, env_vars.get(1).map(|v| v.0)) {
                    (Successor::Fresh, _) => "fresh",
                    (_, Some("ENABLE_WARMUP")) => "warmup",
                    (_, Some("COMPACT_CACHE")) => "compact",
                    _ => "standby",
                },
            );
        }
    }
    env.stop();
    let table = render_with(&results, ["controller-runtime", "kube-runtime"]);
    println!("\n{table}");
    let section = format!(
        "{BEGIN}\n## Whole controllers: configmap-hash in kinformer, controller-runtime v0.25.3, kube-runtime 5.0\n\n\
         Command: `cargo xtask bench --controllers{}` ({:.0} s). Machine: {}. Server: kube-apiserver {KUBERNETES_VERSION} \
         with etcd on loopback. The controller of examples/configmap-hash and its two peers (bench/peers), each with its \
         own defaults, the systems rotating; medians. Every time is read from outside: each program prints a line once \
         a patch of its is answered, and the bench stamps the line as it reads it.\n\n\
         - **Converge** ({rounds} rounds, a fresh process each): before each run every ConfigMap gets a new version, so \
         all {n} hashes are stale; from the process's start (its informers list from nothing) to the last of its {n} \
         patches. kube-apiserver CPU and requests (its `apiserver_request_total`) are the server's over that time, per \
         Deployment.\n\
         - **Churn**: then, in the same process, ConfigMaps are changed at a steady rate, each a different one; \
         writes and 409 Conflicts are the server's (`apiserver_request_total` for ConfigMaps and Deployments, the \
         bench's own patches left out).\n\
         - **Failover** ({failover_rounds} rounds): {failover_n} Deployments (the {} added use no ConfigMap and carry \
         their hash already), two replicas electing a leader on one Lease with client-go's timing (15 s lease; \
         kube-runtime has no election of its own, so its peer uses kube-lease-manager set to 15 s). Once the leader \
         and the standby are idle the leader is SIGKILLed; a ConfigMap is changed just after the kill and another \
         every 50 ms after it. The Lease is read every 50 ms. The standby's RSS is read while it waits.\n\n{table}\n{END}\n",
        if quick { " --quick" } else { "" },
        started.elapsed().as_secs_f64(),
        machine(),
        failover_n - n,
    );
    replace_block(root, BEGIN, END, &section)?;
    super::stale_reads::write(root, &stale_reads)?;
    println!(
        "==> docs/benchmarks.md updated ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
