//! `cargo xtask bench`: kinformer side by side with client-go and kube-runtime.
//!
//! Each scenario runs in a fresh process per system (so peak memory is each
//! system's own), the systems alternating within each round, several rounds;
//! the table reports medians and kinformer's ratio to each peer. Results go
//! to docs/benchmarks.md (between markers) and docs/benchmarks.svg.

mod controllers;
mod crds;
mod programs;
mod stale_reads;
mod webhooks;

pub use controllers::run as run_controllers;
pub use crds::run as run_crds;
pub use stale_reads::run_alone as run_stale_reads;
pub use webhooks::run_alone as run_webhooks;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kinformer_envtest::{KUBERNETES_VERSION, TestEnv, TestEnvOptions};
use kube_client::Client;
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum System {
    Kinformer,
    ClientGo,
    KubeRuntime,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Kinformer => "kinformer",
            System::ClientGo => "client-go",
            System::KubeRuntime => "kube-runtime",
        }
    }
}

struct Harnesses {
    kinformer: PathBuf,
    client_go: PathBuf,
    kube_runtime: PathBuf,
}

impl Harnesses {
    fn path(&self, s: System) -> &Path {
        match s {
            System::Kinformer => &self.kinformer,
            System::ClientGo => &self.client_go,
            System::KubeRuntime => &self.kube_runtime,
        }
    }
}

/// One measured value: (scenario, metric) -> system -> samples.
#[derive(Default)]
struct Results(BTreeMap<(String, String), BTreeMap<System, Vec<f64>>>);

impl Results {
    fn add(&mut self, scenario: &str, metric: &str, system: System, value: f64) {
        self.0
            .entry((scenario.to_owned(), metric.to_owned()))
            .or_default()
            .entry(system)
            .or_default()
            .push(value);
    }

    fn median(&self, scenario: &str, metric: &str, system: System) -> Option<f64> {
        let mut v = self
            .0
            .get(&(scenario.to_owned(), metric.to_owned()))?
            .get(&system)?
            .clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        Some(v[v.len() / 2])
    }
}

pub async fn run(quick: bool, root: &Path) -> Result<()> {
    let started = Instant::now();
    let harnesses = build(root)?;
    let rounds = if quick { 5 } else { 9 };
    let mut results = Results::default();

    println!("\n==> in-process scenarios ({rounds} rounds, systems alternating)");
    let ratelimited_rounds = if quick { "20" } else { "50" };
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [System::Kinformer, System::ClientGo]
        } else {
            [System::ClientGo, System::Kinformer]
        };
        for system in order {
            let v = harness(&harnesses, system, &["workqueue", "10000", "1000000"]).await?;
            results.add(
                "workqueue: 1M adds, 10k keys, 50% duplicates, 2 workers",
                "adds/s",
                system,
                num(&v, "adds_per_sec")?,
            );
            let v = harness(
                &harnesses,
                system,
                &["ratelimited", "10000", ratelimited_rounds],
            )
            .await?;
            results.add(
                "rate-limited queue: add_rate_limited+forget, 10k keys",
                "ops/s",
                system,
                num(&v, "ops_per_sec")?,
            );
            let v = harness(&harnesses, system, &["fifo", "100000"]).await?;
            results.add(
                "DeltaFifo: 100k add+update+pop",
                "ops/s",
                system,
                num(&v, "ops_per_sec")?,
            );
            results.add(
                "DeltaFifo: replace of 10k objects",
                "ms",
                system,
                num(&v, "replace_seconds")? * 1e3,
            );
            // client-go's RealFIFO here is the non-atomic one, as kinformer's.
            let v = harness(&harnesses, system, &["real-fifo", "100000"]).await?;
            results.add(
                "RealFifo: 100k add+update, 200k pops",
                "ops/s",
                system,
                num(&v, "ops_per_sec")?,
            );
            results.add(
                "RealFifo: replace of 10k objects",
                "ms",
                system,
                num(&v, "replace_seconds")? * 1e3,
            );
        }
        println!(
            "    round {} done ({:.0} s)",
            round + 1,
            started.elapsed().as_secs_f64()
        );
    }

    println!("\n==> starting the control plane (kube-apiserver {KUBERNETES_VERSION} + etcd)");
    let env = TestEnv::start_with(settled_env()).await?;
    let kubeconfig = env.kubeconfig_path().to_string_lossy().into_owned();
    let client = env.client()?;
    let all = [System::Kinformer, System::ClientGo, System::KubeRuntime];
    let sizes: &[usize] = if quick { &[10_000] } else { &[10_000, 50_000] };
    let ns = env.create_namespace("bench-sync").await?;
    let mut created = 0;
    for &size in sizes {
        let t = Instant::now();
        create_pods(&client, &ns, created..size).await?;
        created = size;
        println!(
            "    {size} pods in place ({:.0} s to create)",
            t.elapsed().as_secs_f64()
        );
        let sync_rounds = if quick { 2 } else { 3 };
        // Every row says its wire format; each system runs every variant it
        // has, in a fresh process, the systems rotating between rounds.
        let protobuf = format!(
            "informer sync of {size} pods (managedFields stripped), protobuf (client-go's default)"
        );
        let json =
            format!("informer sync of {size} pods (managedFields stripped), JSON, streaming list");
        let paged = format!(
            "informer sync of {size} pods (managedFields stripped), JSON, kube-runtime's default paged lists of 500"
        );
        for round in 0..sync_rounds {
            for (i, _) in all.iter().enumerate() {
                let system = all[(i + round) % all.len()];
                // Kinformer also on the plain RealFifo and on the DeltaFifo
                // (protobuf); its default queue is client-go's, the atomic
                // RealFIFO, which client-go v0.37 cannot turn off for a
                // DeltaFIFO (InOrderInformers is locked on).
                let on_real_fifo = format!("{protobuf}, kinformer on a plain RealFifo");
                let on_delta_fifo = format!("{protobuf}, kinformer on a DeltaFifo");
                // And with a compact cache (JSON bytes, no decoded cache);
                // then with the memory its decoded list freed kept by glibc
                // (the cause of most of its RSS, isolated).
                let compact = format!("{protobuf}, kinformer with a compact cache");
                let compact_kept = format!(
                    "{protobuf}, kinformer with a compact cache, freed memory not released (diagnostic)"
                );
                let variants: Vec<(&str, &String, EnvVars)> = match system {
                    System::KubeRuntime => vec![("", &json, &[]), ("paged", &paged, &[])],
                    System::Kinformer => vec![
                        ("", &protobuf, &[]),
                        ("json", &json, &[]),
                        ("", &on_real_fifo, REAL_FIFO),
                        ("", &on_delta_fifo, DELTA_FIFO),
                        ("compact", &compact, &[]),
                        ("compact keep-freed", &compact_kept, &[]),
                    ],
                    System::ClientGo => vec![("", &protobuf, &[]), ("json", &json, &[])],
                };
                for (arg, scenario, env_vars) in variants {
                    let mut args = vec!["sync", kubeconfig.as_str(), ns.as_str()];
                    args.extend(arg.split_whitespace());
                    settle(&env, &client).await?;
                    let cpu = apiserver_cpu_ms(&env);
                    let v = harness_env(&harnesses, system, &args, env_vars).await?;
                    let server_ms = apiserver_cpu_ms(&env) - cpu;
                    let mut rows = vec![scenario.clone()];
                    if system == System::ClientGo && scenario == &protobuf {
                        rows.push(compact.clone());
                    }
                    for scenario in &rows {
                        results.add(
                            scenario,
                            "time to has_synced, ms",
                            system,
                            num(&v, "sync_seconds")? * 1e3,
                        );
                        results.add(
                            scenario,
                            "peak RSS, MiB",
                            system,
                            num(&v, "peak_rss_bytes")? / 1048576.0,
                        );
                        results.add(
                            scenario,
                            "RSS per cached pod, bytes",
                            system,
                            num(&v, "bytes_per_pod")?,
                        );
                        results.add(scenario, "kube-apiserver CPU, ms", system, server_ms);
                        // The anonymous part of the RSS growth leaves out
                        // the program's code paged in during the sync (a
                        // fixed cost); the Rust harnesses split it further
                        // with glibc's statistics (diagnostic).
                        if let Some(x) = v["anon_bytes_per_pod"].as_f64() {
                            results.add(scenario, "anonymous RSS per cached pod, bytes", system, x);
                        }
                        for (key, metric) in [
                            ("heap_live_per_pod", "of which live heap per pod, bytes"),
                            (
                                "heap_free_per_pod",
                                "of which freed heap kept per pod, bytes",
                            ),
                        ] {
                            if let Some(x) = v[key].as_f64() {
                                results.add(scenario, metric, system, x);
                            }
                        }
                    }
                    if system == System::Kinformer {
                        results.add(
                            scenario,
                            "Lister get, µs",
                            system,
                            num(&v, "lister_get_us")?,
                        );
                        if let Ok(bytes) = num(&v, "encoded_bytes_per_pod") {
                            results.add(scenario, "encoded bytes per cached pod", system, bytes);
                        }
                    }
                }
            }
        }
        for round in 0..sync_rounds {
            for (i, _) in all.iter().enumerate() {
                let system = all[(i + round) % all.len()];
                // Each peer's default (client-go's metadata client and
                // kinformer ask for protobuf), then all on JSON.
                let default_wire = format!(
                    "metadata-only informer sync of {size} pods, each peer's default wire format"
                );
                let json_wire = format!("metadata-only informer sync of {size} pods, JSON for all");
                let v = harness(&harnesses, system, &["metadata-sync", &kubeconfig, &ns]).await?;
                // kube-runtime has JSON only; client-go and kinformer ask
                // for protobuf by default and run again forced to JSON.
                let mut rows = vec![default_wire];
                if system == System::KubeRuntime {
                    rows.push(json_wire.clone());
                }
                for scenario in &rows {
                    results.add(
                        scenario,
                        "time to has_synced, ms",
                        system,
                        num(&v, "sync_seconds")? * 1e3,
                    );
                    results.add(
                        scenario,
                        "RSS per cached object, bytes",
                        system,
                        num(&v, "bytes_per_pod")?,
                    );
                }
                if system != System::KubeRuntime {
                    let v = harness(
                        &harnesses,
                        system,
                        &["metadata-sync", &kubeconfig, &ns, "json"],
                    )
                    .await?;
                    results.add(
                        &json_wire,
                        "time to has_synced, ms",
                        system,
                        num(&v, "sync_seconds")? * 1e3,
                    );
                    results.add(
                        &json_wire,
                        "RSS per cached object, bytes",
                        system,
                        num(&v, "bytes_per_pod")?,
                    );
                }
            }
        }
        // Diagnostic: what the decoded metadata alone costs, without the
        // informer, store or index.
        let v = harness(
            &harnesses,
            System::Kinformer,
            &["metadata-decode", &kubeconfig, &ns],
        )
        .await?;
        let scenario = format!("metadata of {size} pods decoded offline into a Vec (no informer)");
        results.add(
            &scenario,
            "RSS per object, bytes",
            System::Kinformer,
            num(&v, "bytes_per_pod")?,
        );
        results.add(
            &scenario,
            "inline size of PartialObjectMeta<Pod>, bytes",
            System::Kinformer,
            num(&v, "inline_bytes")?,
        );
        results.add(
            &scenario,
            "stripped JSON per object, bytes",
            System::Kinformer,
            num(&v, "json_bytes_per_object")?,
        );
        // Diagnostic: the client's decode alone, isolated from the server
        // and the network: the same list bytes, fetched once, decoded
        // offline by kinformer and client-go, alternating; once as each
        // does in an informer (kinformer drops managedFields before
        // decoding, client-go clears them after), once with both decoding
        // them (decoder against decoder).
        let decode_rounds = if quick { "3" } else { "7" };
        for (wire, json) in [("protobuf", false), ("JSON", true)] {
            let file = TempFile(root.join("bench/target").join(format!(
                "pods-{size}-{}.{}",
                std::process::id(),
                if json { "json" } else { "pb" }
            )));
            let path = file.0.to_string_lossy().into_owned();
            let mut fetch = vec![
                "fetch-pods",
                kubeconfig.as_str(),
                ns.as_str(),
                path.as_str(),
            ];
            if json {
                fetch.push("json");
            }
            harness(&harnesses, System::Kinformer, &fetch).await?;
            let as_informers = format!(
                "the same list of {size} pods decoded offline, {wire}, as each informer does (managedFields: dropped before decoding by kinformer, cleared after by client-go)"
            );
            let both_decode = format!(
                "the same list of {size} pods decoded offline, {wire}, managedFields decoded by both"
            );
            for round in 0..sync_rounds {
                for system in [System::Kinformer, System::ClientGo]
                    .into_iter()
                    .cycle()
                    .skip(round)
                    .take(2)
                {
                    for (scenario, keep) in [(&as_informers, false), (&both_decode, true)] {
                        let mut args = vec!["decode", path.as_str(), decode_rounds];
                        if keep {
                            args.push("keep-managed-fields");
                        }
                        let v = harness(&harnesses, system, &args).await?;
                        results.add(
                            scenario,
                            "CPU per pod (user+system, GC included), µs",
                            system,
                            num(&v, "cpu_us_per_pod")?,
                        );
                    }
                }
            }
        }
        out_of_the_box(
            &harnesses,
            &env,
            &client,
            &kubeconfig,
            &ns,
            size,
            sync_rounds,
            false,
            &mut results,
        )
        .await?;
        if size == sizes[0] {
            // What the compact cache costs a controller that reads on every
            // reconcile, writing nothing (the cache's part isolated; the
            // worst case for a cache that decodes on read). kinformer alone:
            // a choice between its own caches. The two alternate.
            let plain = format!(
                "controller over {size} pods, each reconcile reading its pod and 10 by a secondary index, no writes (kinformer, 2 workers)"
            );
            let compact = format!("{plain}, compact cache");
            for round in 0..sync_rounds {
                let order = if round % 2 == 0 {
                    [false, true]
                } else {
                    [true, false]
                };
                for use_compact in order {
                    let mut args = vec!["reconcile", kubeconfig.as_str(), ns.as_str()];
                    if use_compact {
                        args.push("compact");
                    }
                    let v = harness(&harnesses, System::Kinformer, &args).await?;
                    let row = if use_compact { &compact } else { &plain };
                    results.add(
                        row,
                        "reconciles/s",
                        System::Kinformer,
                        num(&v, "reconciles_per_second")?,
                    );
                    for (key, metric) in [
                        ("reconcile_p50_us", "reconcile p50, µs"),
                        ("reconcile_p99_us", "reconcile p99, µs"),
                    ] {
                        results.add(row, metric, System::Kinformer, num(&v, key)?);
                    }
                }
            }
        }
        if size == *sizes.last().unwrap_or(&size) {
            // Relist peak memory (kinformer alone: the peers have no way to
            // force a 410 from inside their process), on each queue, with
            // whole objects and with a compact cache.
            let queues: [(&str, EnvVars); 3] = [
                ("the default atomic queue", NO_ENV),
                ("a plain RealFifo", REAL_FIFO),
                ("a DeltaFifo", DELTA_FIFO),
            ];
            for (queue, env_vars) in queues {
                for cache in ["", "compact"] {
                    let scenario = format!(
                        "relist after a forced 410 Gone, {size} pods cached (kinformer on {queue}{}, protobuf, managedFields stripped)",
                        if cache.is_empty() {
                            ""
                        } else {
                            ", compact cache"
                        }
                    );
                    let mut args = vec!["relist", kubeconfig.as_str(), ns.as_str()];
                    if !cache.is_empty() {
                        args.push(cache);
                    }
                    for _ in 0..sync_rounds {
                        let v = harness_env(&harnesses, System::Kinformer, &args, env_vars).await?;
                        for (key, metric, scale) in [
                            ("steady_rss_bytes", "steady RSS, MiB", 1.0 / 1048576.0),
                            (
                                "relist_peak_rss_bytes",
                                "peak RSS during the relist, MiB",
                                1.0 / 1048576.0,
                            ),
                            ("peak_over_steady", "peak ÷ steady", 1.0),
                            ("relist_seconds", "relist, ms", 1e3),
                        ] {
                            results.add(
                                &scenario,
                                metric,
                                System::Kinformer,
                                num(&v, key)? * scale,
                            );
                        }
                    }
                }
            }
        }
        println!(
            "    sync of {size} done ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
    }

    // Rounds alternate the systems, so a slow minute of the shared machine
    // lands on all of them; each row is the median of the rounds' figures.
    let (seconds, rounds): (u64, usize) = if quick { (15, 1) } else { (20, 3) };
    println!(
        "\n==> event latency: 200 Pod updates/s, {rounds} rounds of {seconds} s per system, alternating"
    );
    let lat_ns = env.create_namespace("bench-latency").await?;
    create_pods(&client, &lat_ns, 0..200).await?;
    let scenario = "event latency, API write to handler, 200 updates/s, each peer's default (protobuf; kube-runtime: JSON)";
    // Every system on its default queue (kinformer's is client-go's, the
    // atomic RealFIFO); kinformer also on its other two.
    let on_real_fifo = format!("{scenario}, kinformer on a plain RealFifo");
    let on_delta_fifo = format!("{scenario}, kinformer on a DeltaFifo");
    let mut runs: Vec<(System, EnvVars, Vec<&str>)> = all
        .iter()
        .map(|&system| (system, NO_ENV, vec![scenario]))
        .collect();
    runs.push((System::Kinformer, REAL_FIFO, vec![&on_real_fifo]));
    runs.push((System::Kinformer, DELTA_FIFO, vec![&on_delta_fifo]));
    for round in 1..=rounds {
        for (system, env_vars, rows) in &runs {
            let v = latency(
                &harnesses,
                *system,
                &kubeconfig,
                &client,
                &lat_ns,
                seconds,
                env_vars,
            )
            .await?;
            for row in rows {
                results.add(row, "p50, ms", *system, num(&v, "p50_ms")?);
                results.add(row, "p99, ms", *system, num(&v, "p99_ms")?);
                results.add(row, "events seen", *system, num(&v, "events")?);
                // kinformer splits each update's latency where its Reflector
                // decoded it: before (server, wire, decode) and after (queue,
                // informer, handler dispatch).
                for (key, metric) in [
                    ("to_decoded_p99_ms", "p99 of write to decoded, ms"),
                    ("decoded_to_handler_p99_ms", "p99 of decoded to handler, ms"),
                ] {
                    if let Some(x) = v[key].as_f64() {
                        results.add(row, metric, *system, x);
                    }
                }
            }
        }
        println!("    latency round {round} of {rounds} done");
    }
    let (etcd_peak, api_peak) = env.peak_memory_bytes();
    env.stop();

    let table = render(&results);
    println!("\n{table}");
    let machine = machine();
    let elapsed = started.elapsed().as_secs_f64();
    write_report(root, &table, &machine, quick, elapsed, etcd_peak, api_peak)?;
    plot(root, &results)?;
    println!("wrote docs/benchmarks.md and docs/benchmarks.svg ({elapsed:.0} s in all)");
    Ok(())
}

/// The out-of-the-box rows at `size` Pods, `rounds` rounds, the systems
/// rotating: each system with no options (client-go's and kube-runtime's
/// informers keep managedFields; kinformer's factory, and so
/// `Manager::new`, drops them), all three keeping them (like for like), and
/// the floor under them all: the server's streaming list read and framed
/// without decoding. With `diagnostics`, kinformer's informer also runs
/// without the factory (no namespace index), managedFields dropped.
#[allow(clippy::too_many_arguments)]
async fn out_of_the_box(
    harnesses: &Harnesses,
    env: &TestEnv,
    client: &Client,
    kubeconfig: &str,
    ns: &str,
    size: usize,
    rounds: usize,
    diagnostics: bool,
    results: &mut Results,
) -> Result<()> {
    let all = [System::Kinformer, System::ClientGo, System::KubeRuntime];
    let out_of_the_box = format!(
        "informer sync of {size} pods, each system out of the box (kinformer: the factory's defaults, as Manager::new builds it; client-go: protobuf; kube-runtime: JSON, paged lists of 500; both peers keep managedFields)"
    );
    let kept = format!(
        "informer sync of {size} pods (managedFields kept by all; protobuf, kube-runtime: JSON, streaming list)"
    );
    let floor = format!(
        "the server's streaming list of {size} pods read and framed, no object decoded (protobuf): the floor under any client's sync"
    );
    let bare = format!(
        "informer sync of {size} pods (managedFields dropped), protobuf, kinformer without the factory (no namespace index; diagnostic)"
    );
    for round in 0..rounds {
        for (i, _) in all.iter().enumerate() {
            let system = all[(i + round) % all.len()];
            // Each variant: its arguments and the rows it fills.
            let mut variants = vec![("sync", "keep-managed-fields", vec![&kept])];
            match system {
                System::Kinformer => {
                    variants.push(("sync-default", "", vec![&out_of_the_box]));
                    variants.push(("raw-watch-list", "", vec![&floor]));
                    if diagnostics {
                        variants.push(("sync", "", vec![&bare]));
                    }
                }
                // client-go's default is the protobuf sync above.
                System::ClientGo => variants[0].2.push(&out_of_the_box),
                // kube-runtime's default lists in pages of 500.
                System::KubeRuntime => {
                    variants.push(("sync", "keep-managed-fields paged", vec![&out_of_the_box]))
                }
            }
            for (scenario_arg, extra, rows) in variants {
                let mut args = vec![scenario_arg, kubeconfig, ns];
                args.extend(extra.split_whitespace());
                settle(env, client).await?;
                let cpu = apiserver_cpu_ms(env);
                let v = harness(harnesses, system, &args).await?;
                let server_ms = apiserver_cpu_ms(env) - cpu;
                for scenario in rows {
                    results.add(scenario, "kube-apiserver CPU, ms", system, server_ms);
                    results.add(
                        scenario,
                        "time to has_synced, ms",
                        system,
                        num(&v, "sync_seconds")? * 1e3,
                    );
                    if let Some(x) = v["cpu_ms"].as_f64() {
                        results.add(scenario, "client CPU, ms", system, x);
                    }
                    if scenario == &floor {
                        continue;
                    }
                    results.add(
                        scenario,
                        "RSS per cached pod, bytes",
                        system,
                        num(&v, "bytes_per_pod")?,
                    );
                    if let Some(x) = v["anon_bytes_per_pod"].as_f64() {
                        results.add(scenario, "anonymous RSS per cached pod, bytes", system, x);
                    }
                }
            }
        }
    }
    Ok(())
}

fn build(root: &Path) -> Result<Harnesses> {
    println!(
        "==> building the harnesses (release): kinformer-bench, kube-runtime-peer, client-go-peer"
    );
    let bench = root.join("bench");
    let status =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(&bench)
            .args([
                "build",
                "--release",
                "--quiet",
                "-p",
                "kinformer-bench",
                "-p",
                "kube-runtime-peer",
            ])
            .status()
            .context("running cargo build in bench/")?;
    if !status.success() {
        bail!("building the Rust harnesses failed");
    }
    let out = bench.join("target/release/client-go-peer");
    go_build(&bench.join("peers/client-go"), &out)?;
    Ok(Harnesses {
        kinformer: bench.join("target/release/kinformer-bench"),
        client_go: out,
        kube_runtime: bench.join("target/release/kube-runtime-peer"),
    })
}

/// Builds the Go program in `dir` into `out`, with the machine's own Go.
fn go_build(dir: &Path, out: &Path) -> Result<()> {
    let status = std::process::Command::new("go")
        .current_dir(dir)
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0")
        .args(["build", "-trimpath", "-o"])
        .arg(out)
        .arg(".")
        .status()
        .context("running go build (is Go installed?)")?;
    if !status.success() {
        bail!("building the Go program in {} failed", dir.display());
    }
    Ok(())
}

/// The benchmarks' control plane: envtest's, with Go's profiling endpoints
/// on, which [`settle`] needs.
/// The benches' control plane: the server alone (no kube-controller-manager,
/// whose garbage collector would watch every object the bench makes and
/// take CPU from the two cores), with profiling for [`settle`].
fn settled_env() -> TestEnvOptions {
    TestEnvOptions::new()
        .without_controller_manager()
        .apiserver_arg("--profiling=true")
}

/// Brings kube-apiserver to the same state before every harness run: a
/// full garbage collection (`/debug/pprof/heap?gc=1` runs Go's
/// `runtime.GC()` before it answers), then quiet (under 20 ms of its CPU in
/// 500 ms, twice in a row; at most 60 s).
///
/// Without it, the collection of the garbage one run left (a 50 000-Pod
/// list serialized is hundreds of MB) landed in whichever later run pushed
/// the server's heap past its target: about a second of server CPU taken
/// from the two cores the client shares, at random. Measured by hand, 8
/// alternating 50 000-Pod syncs of kinformer and client-go: without it the
/// server spent 640-2 590 ms per sync and the syncs took 688-1 674 ms
/// (kinformer) and 931-1 772 ms (client-go), either one slow when the
/// collection fell in its run; with it 510-750 ms and 691-762 ms and
/// 1 017-1 110 ms over 10. Each run's own garbage is collected before the
/// next and counted in neither's server CPU.
async fn settle(env: &TestEnv, client: &Client) -> Result<()> {
    let gc = http::Request::get("/debug/pprof/heap?gc=1&debug=1").body(Vec::new())?;
    client
        .request_text(gc)
        .await
        .context("asking kube-apiserver for a garbage collection (/debug/pprof/heap?gc=1)")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut quiet = 0;
    while quiet < 2 && Instant::now() < deadline {
        let before = apiserver_cpu_ms(env);
        tokio::time::sleep(Duration::from_millis(500)).await;
        quiet = if apiserver_cpu_ms(env) - before < 20.0 {
            quiet + 1
        } else {
            0
        };
    }
    if quiet < 2 {
        println!(
            "    warning: kube-apiserver was still busy 60 s after its garbage collection; measuring anyway"
        );
    }
    Ok(())
}

/// CPU time (user + system) kube-apiserver has used so far, in ms: read
/// around one harness run, it is what the server spent serving it.
fn apiserver_cpu_ms(env: &TestEnv) -> f64 {
    env.pids().1.map_or(0.0, process_cpu_ms)
}

/// CPU time (user + system) process `pid` has used so far, in ms (0 once
/// it is gone).
fn process_cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    // SAFETY: sysconf has no preconditions and reads no memory of ours.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) * 1e3 / hz.max(1.0)
}

async fn harness(h: &Harnesses, system: System, args: &[&str]) -> Result<Value> {
    harness_env(h, system, args, &[]).await
}

/// Environment variables for one harness run.
type EnvVars = &'static [(&'static str, &'static str)];

/// No variables: each harness in its default mode.
const NO_ENV: EnvVars = &[];

/// The kinformer harness's informers on a RealFifo (see kinformer-bench).
const REAL_FIFO: EnvVars = &[("KINFORMER_BENCH_FIFO", "real")];

/// The kinformer harness's informers on a DeltaFifo.
const DELTA_FIFO: EnvVars = &[("KINFORMER_BENCH_FIFO", "delta")];

async fn harness_env(
    h: &Harnesses,
    system: System,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<Value> {
    run_json(h.path(system), system.name(), args, env).await
}

/// Runs `program` (called `name` in errors) with `args` and `env`, its
/// standard error shown, and reads the JSON line it printed last.
async fn run_json(
    program: &Path,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<Value> {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running {name} {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("{name} {} failed with {}", args.join(" "), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().context("no output")?;
    serde_json::from_str(line).with_context(|| format!("{name} printed {line:?}"))
}

fn num(v: &Value, key: &str) -> Result<f64> {
    v[key]
        .as_f64()
        .with_context(|| format!("no number {key:?} in {v}"))
}

/// A file removed when dropped, whatever ended its use.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "bench", "tier": "web"}},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    }))
    .unwrap_or_default()
}

async fn create_pods(client: &Client, ns: &str, range: std::ops::Range<usize>) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let results: Vec<Result<()>> = stream::iter(range)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &pod(&format!("pod-{i:05}")))
                    .await
                    .map(|_| ())
                    .with_context(|| format!("creating pod-{i:05}"))
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

async fn latency(
    h: &Harnesses,
    system: System,
    kubeconfig: &str,
    client: &Client,
    ns: &str,
    seconds: u64,
    env: &[(&str, &str)],
) -> Result<Value> {
    let mut runs = latency_together(h, &[(system, env)], kubeconfig, client, ns, seconds).await?;
    Ok(runs.remove(0).0)
}

/// The latency harnesses of `systems` watching the same updates at once:
/// 200 patches a second for `seconds`, each stamped with its send time.
/// Each system's output, and its latency of every update it saw, by send
/// time (ns).
async fn latency_together(
    h: &Harnesses,
    systems: &[(System, &[(&str, &str)])],
    kubeconfig: &str,
    client: &Client,
    ns: &str,
    seconds: u64,
) -> Result<Vec<(Value, BTreeMap<u64, u64>)>> {
    let mut children = Vec::new();
    for (i, &(system, env)) in systems.iter().enumerate() {
        let samples = TempFile(std::env::temp_dir().join(format!(
            "kinformer-bench-latency-{}-{i}",
            std::process::id()
        )));
        let mut child = Command::new(h.path(system))
            .args(["latency", kubeconfig, ns, &(seconds + 3).to_string()])
            .envs(env.iter().copied())
            .env("BENCH_LATENCY_SAMPLES", &samples.0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stderr = child.stderr.take().context("no stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        loop {
            match tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await {
                Ok(Ok(Some(l))) if l.trim() == "ready" => break,
                Ok(Ok(Some(_))) => continue,
                _ => bail!("{} never became ready", system.name()),
            }
        }
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        children.push((system, child, samples));
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let sem = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let total = 200 * seconds;
    for i in 0..total {
        tick.tick().await;
        let permit = Arc::clone(&sem).acquire_owned().await?;
        let api = api.clone();
        tokio::spawn(async move {
            let sent = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let patch = serde_json::json!({"metadata": {"annotations": {"bench/sent-ns": sent.to_string()}}});
            let _ = api
                .patch(
                    &format!("pod-{:05}", i % 200),
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await;
            drop(permit);
        });
    }
    let mut results = Vec::new();
    for (system, child, samples) in children {
        let out = child.wait_with_output().await?;
        if !out.status.success() {
            bail!("{} latency run failed with {}", system.name(), out.status);
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().last().context("no output")?;
        // kube-runtime-peer writes no samples (it is never paired): none.
        let text = match std::fs::read_to_string(&samples.0) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            read => read.with_context(|| format!("reading {}", samples.0.display()))?,
        };
        let by_sent = text
            .lines()
            .filter_map(|l| {
                let (sent, latency) = l.split_once(' ')?;
                Some((sent.parse().ok()?, latency.parse().ok()?))
            })
            .collect();
        results.push((serde_json::from_str(line)?, by_sent));
    }
    Ok(results)
}

/// The p-quantile of `v` (sorted here), in ms.
fn quantile_ms(mut v: Vec<u64>, q: f64) -> f64 {
    v.sort_unstable();
    v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0) as f64
        / 1e6
}

/// kinformer and client-go watching the same updates at once, compared
/// update by update: where both are slow on the same updates, the tail is
/// made before either client has them (the server, etcd, the machine).
async fn paired_latency(
    h: &Harnesses,
    kubeconfig: &str,
    client: &Client,
    ns: &str,
    seconds: u64,
    results: &mut Results,
) -> Result<()> {
    let scenario = "event latency, kinformer and client-go watching the same 200 updates/s at once, compared update by update (each one's default: protobuf)";
    let runs = latency_together(
        h,
        &[(System::Kinformer, NO_ENV), (System::ClientGo, NO_ENV)],
        kubeconfig,
        client,
        ns,
        seconds,
    )
    .await?;
    let (kin, go) = (&runs[0].1, &runs[1].1);
    if kin.is_empty() || go.is_empty() {
        bail!(
            "no per-update latencies to pair (kinformer wrote {}, client-go {})",
            kin.len(),
            go.len()
        );
    }
    let both: Vec<(u64, u64)> = kin
        .iter()
        .filter_map(|(sent, &k)| go.get(sent).map(|&g| (k, g)))
        .collect();
    if both.is_empty() {
        bail!("no update was seen by both clients");
    }
    let ks: Vec<u64> = both.iter().map(|p| p.0).collect();
    let gs: Vec<u64> = both.iter().map(|p| p.1).collect();
    for (system, v) in [(System::Kinformer, &ks), (System::ClientGo, &gs)] {
        results.add(scenario, "p50, ms", system, quantile_ms(v.clone(), 0.50));
        results.add(scenario, "p99, ms", system, quantile_ms(v.clone(), 0.99));
        results.add(scenario, "updates seen by both", system, both.len() as f64);
    }
    // Per update: how much later kinformer's handler ran than client-go's
    // (negative: earlier), its p50 and p99.
    let mut diff: Vec<i64> = both.iter().map(|&(k, g)| k as i64 - g as i64).collect();
    diff.sort_unstable();
    let at = |q: f64| diff[((diff.len() as f64 * q) as usize).min(diff.len() - 1)] as f64 / 1e6;
    results.add(
        scenario,
        "per update, kinformer's latency less client-go's: p50, ms",
        System::Kinformer,
        at(0.50),
    );
    results.add(
        scenario,
        "per update, kinformer's latency less client-go's: p99, ms",
        System::Kinformer,
        at(0.99),
    );
    // Of each client's slowest 1% of updates, the share that were above
    // the other's p90 too: near 1, a tail both clients share.
    let p99 = |v: &[u64]| (quantile_ms(v.to_vec(), 0.99) * 1e6) as u64;
    let p90 = |v: &[u64]| (quantile_ms(v.to_vec(), 0.90) * 1e6) as u64;
    let (k99, g99, k90, g90) = (p99(&ks), p99(&gs), p90(&ks), p90(&gs));
    let shared = |slow: &dyn Fn(&(u64, u64)) -> bool, other_slow: &dyn Fn(&(u64, u64)) -> bool| {
        let tail: Vec<_> = both.iter().filter(|p| slow(p)).collect();
        tail.iter().filter(|p| other_slow(p)).count() as f64 / tail.len().max(1) as f64
    };
    results.add(
        scenario,
        "of its slowest 1% of updates, the share above the other's p90",
        System::Kinformer,
        shared(&|p| p.0 >= k99, &|p| p.1 >= g90),
    );
    results.add(
        scenario,
        "of its slowest 1% of updates, the share above the other's p90",
        System::ClientGo,
        shared(&|p| p.1 >= g99, &|p| p.0 >= k90),
    );
    Ok(())
}

fn higher_is_better(metric: &str) -> bool {
    metric.ends_with("/s")
}

/// A count or share that describes a run rather than ranks the systems.
fn neutral(metric: &str) -> bool {
    metric == "events seen" || metric.starts_with("updates seen") || metric.contains("the share")
}

fn render(results: &Results) -> String {
    render_with(results, ["client-go", "kube-runtime"])
}

/// The table of `results`, naming the two peer columns `peers`.
fn render_with(results: &Results, peers: [&str; 2]) -> String {
    let [a, b] = peers;
    let mut out = format!(
        "| scenario | metric | kinformer | {a} | {b} | kinformer ÷ {a} | kinformer ÷ {b} |\n|---|---|---|---|---|---|---|\n",
    );
    let fmt = |v: Option<f64>| match v {
        Some(v) if v >= 100_000.0 => format!("{:.2} M", v / 1e6),
        Some(v) if v >= 1000.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
        None => "n/a".into(),
    };
    for (scenario, metric) in results.0.keys() {
        let k = results.median(scenario, metric, System::Kinformer);
        let g = results.median(scenario, metric, System::ClientGo);
        let r = results.median(scenario, metric, System::KubeRuntime);
        let ratio = |peer: Option<f64>| match (k, peer) {
            (Some(k), Some(p)) if p > 0.0 && !neutral(metric) => format!("{:.2}x", k / p),
            _ => "n/a".into(),
        };
        let better = if neutral(metric) {
            ""
        } else if higher_is_better(metric) {
            " (higher is better)"
        } else {
            " (lower is better)"
        };
        out.push_str(&format!(
            "| {scenario} | {metric}{better} | {} | {} | {} | {} | {} |\n",
            fmt(k),
            fmt(g),
            fmt(r),
            ratio(g),
            ratio(r)
        ));
    }
    out
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().next().map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<u64>()
                    .unwrap_or(0)
            })
        })
        .unwrap_or(0);
    let version = |cmd: &str, arg: &str| {
        std::process::Command::new(cmd)
            .arg(arg)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    format!(
        "{cores} vCPU ({cpu}), {:.0} GiB; {}; {}",
        mem as f64 / 1048576.0,
        version("rustc", "--version"),
        version("go", "version")
    )
}

const BEGIN: &str = "<!-- BEGIN cargo xtask bench -->";
const END: &str = "<!-- END cargo xtask bench -->";

fn write_report(
    root: &Path,
    table: &str,
    machine: &str,
    quick: bool,
    elapsed: f64,
    etcd_peak: Option<u64>,
    api_peak: Option<u64>,
) -> Result<()> {
    let path = root.join("docs/benchmarks.md");
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    let section = format!(
        "{BEGIN}\n## Side by side: kinformer, client-go v0.37.2, kube-runtime 5.0\n\n\
         Command: `cargo xtask bench{}` ({elapsed:.0} s). Machine: {machine}. Server: kube-apiserver {KUBERNETES_VERSION} \
         with etcd on loopback (peak RSS etcd {} MiB, kube-apiserver {} MiB). Every figure is the median of the rounds \
         of one run, each system in a fresh process, the systems alternating; ratios compare medians of that run. \
         Before every sync the server is settled: a forced garbage collection (`/debug/pprof/heap?gc=1`), then \
         quiet, so no run pays for garbage an earlier one left. Memory per cached Pod is the RSS growth from before the informer started to 2 s after it synced, divided by \
         the number of Pods; its anonymous part leaves out the program's own code read in from its file during the \
         sync (a fixed cost, not the cache's), and the Rust harnesses split that with glibc's statistics (`mallinfo2`) \
         into live heap and freed heap the allocator kept. Event latency is split where kinformer's Reflector decoded \
         each update (its transform sees it then): write to decoded (server, wire, the client's read and decode) and \
         decoded to handler (queue, informer, handler dispatch).\n\n{table}\n![latency and memory](benchmarks.svg)\n{END}\n",
        if quick { " --quick" } else { "" },
        etcd_peak.unwrap_or(0) >> 20,
        api_peak.unwrap_or(0) >> 20,
    );
    let updated = match (current.find(BEGIN), current.find(END)) {
        (Some(b), Some(e)) => format!(
            "{}{}{}",
            &current[..b],
            section,
            &current[e + END.len()..].trim_start_matches('\n')
        ),
        _ => format!("{}\n{}", current.trim_end(), section),
    };
    std::fs::write(&path, updated).with_context(|| format!("writing {}", path.display()))
}

/// Puts `section` (which starts with `begin` and ends with `end`) in place
/// of the block between those markers in docs/benchmarks.md, or at its end.
fn replace_block(root: &Path, begin: &str, end: &str, section: &str) -> Result<()> {
    let path = root.join("docs/benchmarks.md");
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    let updated = match (current.find(begin), current.find(end)) {
        (Some(b), Some(e)) if b < e => format!(
            "{}{}{}",
            &current[..b],
            section,
            &current[e + end.len()..].trim_start_matches('\n')
        ),
        _ => format!("{}\n\n{}", current.trim_end(), section),
    };
    std::fs::write(&path, updated).with_context(|| format!("writing {}", path.display()))
}

const DEFAULTS_BEGIN: &str = "<!-- BEGIN cargo xtask bench --defaults -->";
const DEFAULTS_END: &str = "<!-- END cargo xtask bench --defaults -->";

/// `cargo xtask bench --defaults`: only the out-of-the-box sync rows (see
/// [`out_of_the_box`]) at 10 000 and 50 000 Pods, more rounds than the full
/// run gives them, with the server's floor and kinformer without its
/// factory beside them. Writes its own section of docs/benchmarks.md.
pub async fn run_defaults(quick: bool, root: &Path) -> Result<()> {
    let started = Instant::now();
    let harnesses = build(root)?;
    let rounds = if quick { 3 } else { 7 };
    let sizes: &[usize] = if quick { &[10_000] } else { &[10_000, 50_000] };
    println!("\n==> starting the control plane (kube-apiserver {KUBERNETES_VERSION} + etcd)");
    let env = TestEnv::start_with(settled_env()).await?;
    let kubeconfig = env.kubeconfig_path().to_string_lossy().into_owned();
    let client = env.client()?;
    let ns = env.create_namespace("bench-defaults").await?;
    let mut results = Results::default();
    let mut created = 0;
    for &size in sizes {
        let t = Instant::now();
        create_pods(&client, &ns, created..size).await?;
        created = size;
        println!(
            "    {size} pods in place ({:.0} s to create)",
            t.elapsed().as_secs_f64()
        );
        out_of_the_box(
            &harnesses,
            &env,
            &client,
            &kubeconfig,
            &ns,
            size,
            rounds,
            true,
            &mut results,
        )
        .await?;
        println!(
            "    {size} pods done ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
    }
    let (seconds, latency_rounds) = if quick { (15, 1) } else { (20, 3) };
    println!(
        "\n==> event latency, kinformer and client-go at once: {latency_rounds} rounds of {seconds} s"
    );
    let lat_ns = env.create_namespace("bench-latency").await?;
    create_pods(&client, &lat_ns, 0..200).await?;
    for round in 1..=latency_rounds {
        paired_latency(
            &harnesses,
            &kubeconfig,
            &client,
            &lat_ns,
            seconds,
            &mut results,
        )
        .await?;
        println!("    latency round {round} of {latency_rounds} done");
    }
    env.stop();
    let table = render(&results);
    println!("\n{table}");
    let section = format!(
        "{DEFAULTS_BEGIN}\n## Out of the box, {rounds} rounds, and event latency update by update\n\n\
         Command: `cargo xtask bench --defaults{}` ({:.0} s). Machine: {}. Server: kube-apiserver {KUBERNETES_VERSION} \
         with etcd on loopback. The out-of-the-box and managedFields-kept rows of the full run, with more rounds, \
         the systems rotating; beside them the server's streaming list read by a client that only frames it (the \
         time the server takes to send what every informer here waits for) and kinformer's informer without its \
         factory. CPU is each process's own (user + system) from its informer's start to has_synced, and \
         kube-apiserver's over the whole run of the harness, each run starting on a settled server (a forced \
         garbage collection, then quiet, so that no run pays for garbage an earlier one left). Then kinformer and client-go watch the same updates \
         at once ({latency_rounds} rounds of {seconds} s, 200 updates/s), and each update's latency in one is \
         set against the same update's in the other.\n\n{table}\n{DEFAULTS_END}\n",
        if quick { " --quick" } else { "" },
        started.elapsed().as_secs_f64(),
        machine(),
    );
    replace_block(root, DEFAULTS_BEGIN, DEFAULTS_END, &section)?;
    println!(
        "==> docs/benchmarks.md updated ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn plot(root: &Path, results: &Results) -> Result<()> {
    use plotters::prelude::*;
    let path = root.join("docs/benchmarks.svg");
    let area = SVGBackend::new(&path, (900, 420)).into_drawing_area();
    area.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (left, right) = area.split_horizontally(450);
    let systems = [System::Kinformer, System::ClientGo, System::KubeRuntime];
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
    ];
    type Panel<'r, 'b> = (
        &'r DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
        &'static str,
        Vec<(&'static str, &'static str, &'static str)>,
    );
    let panels: [Panel<'_, '_>; 2] = [
        (
            &left,
            "event latency (ms)",
            vec![
                (
                    "p50",
                    "event latency, API write to handler, 200 updates/s, each peer's default (protobuf; kube-runtime: JSON)",
                    "p50, ms",
                ),
                (
                    "p99",
                    "event latency, API write to handler, 200 updates/s, each peer's default (protobuf; kube-runtime: JSON)",
                    "p99, ms",
                ),
            ],
        ),
        (
            &right,
            "RSS per cached Pod (bytes)",
            vec![
                (
                    "stripped",
                    "informer sync of 10000 pods (managedFields stripped), JSON, streaming list",
                    "RSS per cached pod, bytes",
                ),
                (
                    "kept",
                    "informer sync of 10000 pods (managedFields kept by all; protobuf, kube-runtime: JSON, streaming list)",
                    "RSS per cached pod, bytes",
                ),
            ],
        ),
    ];
    for (panel, title, groups) in panels {
        let max = groups
            .iter()
            .flat_map(|(_, s, m)| systems.iter().filter_map(|sys| results.median(s, m, *sys)))
            .fold(0.0_f64, f64::max)
            .max(1.0);
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 18))
            .margin(15)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..(groups.len() as f64), 0.0..max * 1.15)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(groups.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - x.floor() - 0.5).abs() < 0.01 {
                    groups.get(i).map(|g| g.0.to_owned()).unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for (gi, (_, scenario, metric)) in groups.iter().enumerate() {
            for (si, sys) in systems.iter().enumerate() {
                if let Some(v) = results.median(scenario, metric, *sys) {
                    let x0 = gi as f64 + 0.1 + si as f64 * 0.27;
                    chart
                        .draw_series(std::iter::once(Rectangle::new(
                            [(x0, 0.0), (x0 + 0.25, v)],
                            colors[si].filled(),
                        )))
                        .map_err(|e| anyhow::anyhow!("{e}"))?
                        .label(sys.name())
                        .legend(move |(x, y)| {
                            Rectangle::new([(x, y - 5), (x + 10, y + 5)], colors[si].filled())
                        });
                }
            }
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    area.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

const SHARDING_BEGIN: &str = "<!-- BEGIN cargo xtask bench --sharding -->";
const SHARDING_END: &str = "<!-- END cargo xtask bench --sharding -->";

/// `cargo xtask bench --sharding`: N = 1, 2, 4 replicas of an informer of
/// every Pod of a namespace, split by uid: with server-side sharding (the
/// `ShardedListAndWatch` gate on), with client-side filtering (no selector
/// sent, the shard kept on the client, as against a server without the
/// gate), and unsharded. The N replicas of a case run at once, each a
/// process of its own; per replica: cache memory (RSS growth to 2 s after
/// its sync), bytes of response bodies received, time to has_synced.
/// Writes its own section of docs/benchmarks.md.
pub async fn run_sharding(quick: bool, root: &Path) -> Result<()> {
    let started = Instant::now();
    let harnesses = build(root)?;
    let size = if quick { 10_000 } else { 50_000 };
    let rounds = if quick { 1 } else { 3 };
    println!(
        "\n==> starting the control plane (kube-apiserver {KUBERNETES_VERSION} + etcd, ShardedListAndWatch on)"
    );
    let env = TestEnv::start_with(settled_env().sharded_list_and_watch()).await?;
    let kubeconfig = env.kubeconfig_path().to_string_lossy().into_owned();
    let client = env.client()?;
    let ns = env.create_namespace("bench-shard").await?;
    let t = Instant::now();
    create_pods(&client, &ns, 0..size).await?;
    println!(
        "    {size} pods in place ({:.0} s to create)",
        t.elapsed().as_secs_f64()
    );
    let cases: [(u64, &str); 7] = [
        (1, "none"),
        (2, "server"),
        (2, "client"),
        (2, "none"),
        (4, "server"),
        (4, "client"),
        (4, "none"),
    ];
    // (N, mode) -> per-replica samples of (cache MiB, received MiB, sync ms, pods).
    let mut samples: BTreeMap<(u64, &str), Vec<[f64; 4]>> = BTreeMap::new();
    let mut server_cpu: BTreeMap<(u64, &str), Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        for k in 0..cases.len() {
            let (n, mode) = cases[(k + round) % cases.len()];
            settle(&env, &client).await?;
            let cpu = apiserver_cpu_ms(&env);
            let count = n.to_string();
            let args: Vec<[String; 6]> = (0..n)
                .map(|i| {
                    ["shard-sync", &kubeconfig, &ns, &i.to_string(), &count, mode]
                        .map(str::to_owned)
                })
                .collect();
            let runs = futures::future::try_join_all(args.iter().map(|a| {
                let a: Vec<&str> = a.iter().map(String::as_str).collect();
                let harnesses = &harnesses;
                async move { harness_env(harnesses, System::Kinformer, &a, &[]).await }
            }))
            .await?;
            server_cpu
                .entry((n, mode))
                .or_default()
                .push(apiserver_cpu_ms(&env) - cpu);
            for v in runs {
                samples.entry((n, mode)).or_default().push([
                    num(&v, "cache_bytes")? / 1048576.0,
                    num(&v, "bytes_received")? / 1048576.0,
                    num(&v, "sync_seconds")? * 1e3,
                    num(&v, "pods")?,
                ]);
            }
        }
        println!(
            "    round {} done ({:.0} s)",
            round + 1,
            started.elapsed().as_secs_f64()
        );
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let column = |key: (u64, &str), i: usize| median(samples[&key].iter().map(|s| s[i]).collect());
    let (base_cache, base_bytes) = (column((1, "none"), 0), column((1, "none"), 1));
    let mut table = String::from(
        "| replicas | sharding | Pods per replica | cache memory per replica, MiB | ÷ unsharded single replica | bytes received per replica, MiB | ÷ unsharded single replica | target (server-side) ≤ 1/N + 10% | time to sync, ms | kube-apiserver CPU for the N replicas, ms |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for &(n, mode) in &cases {
        let key = (n, mode);
        let (cache, bytes) = (column(key, 0), column(key, 1));
        let label = match mode {
            "server" => "server-side (selector sent)",
            "client" => "client-side filtering (no selector: a server without the gate)",
            _ => "unsharded (every replica caches everything)",
        };
        let bound = 1.0 / n as f64 + 0.10;
        let target = if mode == "server" {
            let met = cache / base_cache <= bound && bytes / base_bytes <= bound;
            format!("{bound:.2}: {}", if met { "met" } else { "not met" })
        } else {
            String::new()
        };
        table.push_str(&format!(
            "| {n} | {label} | {:.0} | {cache:.1} | {:.2} | {bytes:.1} | {:.2} | {target} | {:.0} | {:.0} |\n",
            column(key, 3),
            cache / base_cache,
            bytes / base_bytes,
            column(key, 2),
            median(server_cpu[&key].clone()),
        ));
    }
    println!("\n{table}");
    let section = format!(
        "{SHARDING_BEGIN}\n## Sharded informers: N replicas\n\n\
         Command: `cargo xtask bench --sharding{}` ({:.0} s). Machine: {}. Server: kube-apiserver {KUBERNETES_VERSION} \
         with the `ShardedListAndWatch` gate on, {size} Pods in one namespace. Each replica is a process of its own \
         (`kinformer-bench shard-sync`): an informer of the namespace's Pods (protobuf, managedFields dropped) holding \
         the hash range `HashRange::split(i, N)` of their uids; the N replicas of a row run at once, on the 2 cores. \
         Per replica, the median over the replicas and {rounds} rounds: cache memory is the RSS growth from before the \
         informer started to 2 s after it synced; bytes received are the response bodies of its lists and watches as \
         the client reads them (`ApiListerWatcher::bytes_received`). Ratios compare with the unsharded single replica \
         of the same run.\n\n{table}\n{SHARDING_END}\n",
        if quick { " --quick" } else { "" },
        started.elapsed().as_secs_f64(),
        machine(),
    );
    replace_block(root, SHARDING_BEGIN, SHARDING_END, &section)?;
    println!(
        "==> docs/benchmarks.md updated ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
