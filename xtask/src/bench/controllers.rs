//! `cargo xtask bench --controllers`: whole controllers, not informers. The
//! same controller, configmap-hash (examples/configmap-hash; its peers in
//! bench/peers: each stamps a Deployment's pod template with the hash of the
//! ConfigMaps it uses, read from its cache, by a merge patch), in kinformer,
//! controller-runtime and kube-runtime, each as its own docs write it and
//! with its defaults, against one control plane, the systems rotating.
//!
//! Converge: N Deployments, each using a ConfigMap of its own, all of whose
//! hashes are stale (every ConfigMap was changed while no controller ran);
//! from the controller's process start to the last of the N patches
//! answered by the server (each program prints its line after the patch
//! returns). Also the process's peak RSS and the API server's CPU.

use std::collections::HashSet;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;

use super::*;

const BEGIN: &str = "<!-- BEGIN cargo xtask bench --controllers -->";
const END: &str = "<!-- END cargo xtask bench --controllers -->";

/// The three configmap-hash programs.
struct Programs {
    kinformer: PathBuf,
    controller_runtime: PathBuf,
    kube_runtime: PathBuf,
}

/// The framework `s` stands for here.
fn name(s: System) -> &'static str {
    match s {
        System::ClientGo => "controller-runtime",
        other => other.name(),
    }
}

impl Programs {
    /// In the table's columns: controller-runtime where client-go stands.
    fn path(&self, s: System) -> &Path {
        match s {
            System::Kinformer => &self.kinformer,
            System::ClientGo => &self.controller_runtime,
            System::KubeRuntime => &self.kube_runtime,
        }
    }
}

fn cargo(dir: &Path, package: &str) -> Result<()> {
    let status =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(dir)
            .args(["build", "--release", "--quiet", "-p", package])
            .status()
            .with_context(|| format!("running cargo build -p {package}"))?;
    if !status.success() {
        bail!("building {package} failed");
    }
    Ok(())
}

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

/// Reads the program's stdout until it has printed the hash line of every
/// one of the `n` Deployments; the time from `started`.
async fn converged(
    child: &mut tokio::process::Child,
    n: usize,
    started: Instant,
) -> Result<Duration> {
    let stdout = child.stdout.take().context("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut done = HashSet::new();
    while done.len() < n {
        let line = tokio::time::timeout(Duration::from_secs(900), lines.next_line())
            .await
            .context("no progress in 900 s")??
            .context("the controller exited")?;
        if let Some((name, _)) = line.split_once(": config hash ") {
            done.insert(name.to_owned());
        }
    }
    Ok(started.elapsed())
}

fn peak_rss_mib(pid: Option<u32>) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

pub async fn run(quick: bool, root: &Path) -> Result<()> {
    let started = Instant::now();
    let programs = build(root)?;
    let (n, rounds) = if quick { (2_000, 1) } else { (10_000, 3) };
    println!("\n==> starting the control plane (kube-apiserver {KUBERNETES_VERSION} + etcd)");
    let env = TestEnv::start().await?;
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
    let all = [System::Kinformer, System::ClientGo, System::KubeRuntime];
    let mut results = Results::default();
    let mut version = 0;
    for round in 0..rounds {
        for i in 0..all.len() {
            let system = all[(i + round) % all.len()];
            // A new version of every ConfigMap: every hash is stale.
            version += 1;
            each(n, |i| {
                let cms = cms.clone();
                async move {
                    let patch = serde_json::json!({"data": {"version": version.to_string()}});
                    cms.patch(
                        &format!("cm-{i:05}"),
                        &PatchParams::default(),
                        &Patch::Merge(patch),
                    )
                    .await
                    .with_context(|| format!("changing cm-{i:05}"))?;
                    Ok(())
                }
            })
            .await?;
            let cpu = apiserver_cpu_ms(&env);
            let t = Instant::now();
            let mut child = Command::new(programs.path(system))
                .env("KUBECONFIG", &kubeconfig)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {}", programs.path(system).display()))?;
            let took = converged(&mut child, n, t).await;
            let peak = peak_rss_mib(child.id());
            let _ = child.start_kill();
            let _ = child.wait().await;
            let took = took.with_context(|| format!("{} converging", name(system)))?;
            let server_ms = apiserver_cpu_ms(&env) - cpu;
            results.add(
                &scenario,
                "process start to every Deployment patched, s",
                system,
                took.as_secs_f64(),
            );
            results.add(
                &scenario,
                "kube-apiserver CPU per Deployment, ms",
                system,
                server_ms / n as f64,
            );
            if let Some(peak) = peak {
                results.add(&scenario, "peak RSS, MiB", system, peak);
            }
            println!(
                "    round {} {}: {:.1} s",
                round + 1,
                name(system),
                took.as_secs_f64()
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
         own defaults, in a fresh process per run, {rounds} rounds, the systems rotating; medians. Before each run every \
         ConfigMap gets a new version, so all {n} hashes are stale; the time runs from the process's start (its \
         informers list from nothing) to the last of its {n} patches answered by the server. kube-apiserver CPU is \
         the server's over the whole run, per Deployment.\n\n{table}\n{END}\n",
        if quick { " --quick" } else { "" },
        started.elapsed().as_secs_f64(),
        machine(),
    );
    replace_block(root, BEGIN, END, &section)?;
    println!(
        "==> docs/benchmarks.md updated ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
