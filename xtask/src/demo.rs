//! `cargo xtask demo`: both controllers against a real control plane (or the
//! user's cluster), driven step by step, with the outcome read back from the
//! server and the controllers' metrics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Service};
use kinformer_envtest::{TestEnv, TestEnvOptions};
use kube_client::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kube_client::{Client, Config};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

const ANNOTATION: &str = "kinformer.dev/strategy";

struct Running {
    name: &'static str,
    child: Child,
    metrics_port: u16,
}

/// Counts of what the controllers printed, for the summary.
#[derive(Default)]
struct Seen {
    pod_lines: AtomicUsize,
    conflicts: AtomicUsize,
    panics: AtomicUsize,
    dropped: AtomicUsize,
}

/// Builds the CLI, starts a control plane (or takes `kubeconfig`'s
/// cluster), runs `scenario` in a namespace of its own, and cleans up.
pub async fn run(
    kubeconfig: Option<PathBuf>,
    root: &Path,
    scenario: impl AsyncFnOnce(&Path, &Path, &Client, &str) -> Result<()>,
) -> Result<()> {
    step("building the kinformer binary");
    let status =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(root)
            .args(["build", "-p", "kinformer-cli"])
            .status()
            .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build -p kinformer-cli failed");
    }
    let binary = root.join("target/debug/kinformer");

    let (env, kubeconfig_path) = match kubeconfig {
        Some(path) => {
            step(&format!("using the cluster of {}", path.display()));
            (None, path)
        }
        None => {
            step(
                "starting a local control plane (etcd, kube-apiserver v1.37.2 and kube-controller-manager's garbage collector and namespace controller; no cluster needed)",
            );
            // With the ShardedListAndWatch gate, for the sharding part:
            // the server filters each replica's objects.
            let env = TestEnv::start_with(TestEnvOptions::new().sharded_list_and_watch())
                .await
                .context("starting the control plane")?;
            let path = env.kubeconfig_path().to_owned();
            println!(
                "    kube-apiserver at {}{}",
                env.server_url(),
                if env.has_controller_manager() {
                    ""
                } else {
                    " (kube-controller-manager not found beside it: nothing collects garbage)"
                }
            );
            (Some(env), path)
        }
    };
    let client = client_for(&kubeconfig_path).await?;
    let namespace = format!("kinformer-demo-{:x}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?,
        )
        .await
        .with_context(|| format!("creating namespace {namespace}"))?;
    println!("    working in namespace {namespace}");

    let outcome = scenario(&binary, &kubeconfig_path, &client, &namespace).await;

    if env.is_none() {
        step(&format!("deleting namespace {namespace}"));
        if let Err(e) = namespaces
            .delete(&namespace, &DeleteParams::default())
            .await
        {
            eprintln!("    could not delete namespace {namespace}: {e}");
        }
    }
    if let Some(env) = env {
        step("stopping the control plane");
        env.stop();
    }
    outcome
}

/// The two controllers, step by step.
pub async fn scenario(binary: &Path, kubeconfig: &Path, client: &Client, ns: &str) -> Result<()> {
    let seen = Arc::new(Seen::default());
    step("starting both controllers (2 workers each, metrics on loopback)");
    let mut controllers = Vec::new();
    for (name, extra) in [
        ("pod-stdout", vec![]),
        ("service-strategy", vec!["--max-retries", "3"]),
    ] {
        controllers
            .push(spawn_controller(binary, kubeconfig, ns, name, &extra, Arc::clone(&seen)).await?);
    }
    for c in &controllers {
        wait_ready(c).await?;
    }
    println!("    both report /readyz ok: caches synced");

    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);

    step(
        "1. pods: create web-1, web-2 and db-1, relabel web-1, delete db-1 (pod-stdout prints each)",
    );
    for name in ["web-1", "web-2", "db-1"] {
        pods.create(&PostParams::default(), &pod(name)).await?;
    }
    settle().await;
    merge(
        &pods,
        "web-1",
        serde_json::json!({"metadata": {"labels": {"tier": "frontend"}}}),
    )
    .await?;
    pods.delete("db-1", &DeleteParams::default()).await?;
    wait_until("pod-stdout saw db-1 go", || async {
        Ok(seen.pod_lines.load(Ordering::SeqCst) >= 5)
    })
    .await?;

    step("2. services: frontend (strategy blue), backend (strategy green), plain (no annotation)");
    services
        .create(&PostParams::default(), &service("frontend", Some("blue")))
        .await?;
    services
        .create(&PostParams::default(), &service("backend", Some("green")))
        .await?;
    services
        .create(&PostParams::default(), &service("plain", None))
        .await?;
    expect_app(&services, "frontend", Some("blue")).await?;
    expect_app(&services, "backend", Some("green")).await?;

    step("3. change frontend to canary; remove backend's annotation (its selector stays green)");
    annotate(&services, "frontend", Some("canary")).await?;
    annotate(&services, "backend", None).await?;
    expect_app(&services, "frontend", Some("canary")).await?;
    settle().await;
    expect_app(&services, "backend", Some("green")).await?;
    expect_app(&services, "plain", None).await?;

    step(
        "4. crashy: strategy panic (the reconcile panics; the runtime recovers, retries 3 times, drops the key)",
    );
    services
        .create(&PostParams::default(), &service("crashy", Some("panic")))
        .await?;
    wait_until("the panicking key was dropped", || async {
        Ok(seen.dropped.load(Ordering::SeqCst) >= 1)
    })
    .await?;
    println!("    other keys keep working: frontend back to blue");
    annotate(&services, "frontend", Some("blue")).await?;
    expect_app(&services, "frontend", Some("blue")).await?;
    println!("    crashy fixed to stable");
    annotate(&services, "crashy", Some("stable")).await?;
    expect_app(&services, "crashy", Some("stable")).await?;

    step("5. typo: strategy \"not valid!\" (reported in an Event, never written)");
    services
        .create(&PostParams::default(), &service("typo", Some("not valid!")))
        .await?;
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    wait_until("an InvalidStrategy event", || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .any(|e| e.reason.as_deref() == Some("InvalidStrategy")))
        }
    })
    .await?;
    let list = events.list(&ListParams::default()).await?;
    if let Some(e) = list
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("InvalidStrategy"))
    {
        println!(
            "    Event {} {}: {}",
            e.type_.as_deref().unwrap_or(""),
            e.reason.as_deref().unwrap_or(""),
            e.message.as_deref().unwrap_or("")
        );
    }
    expect_app(&services, "typo", None).await?;

    step(
        "6. contended-1..5: annotate and rewrite labels in a burst, so the controller's writes race ours (409 Conflict, retried)",
    );
    for i in 1..=5 {
        services
            .create(
                &PostParams::default(),
                &service(&format!("contended-{i}"), None),
            )
            .await?;
    }
    let mut writers = Vec::new();
    for i in 1..=5 {
        let services = services.clone();
        writers.push(tokio::spawn(async move {
            let name = format!("contended-{i}");
            annotate(&services, &name, Some("purple")).await?;
            for n in 0..25 {
                merge(
                    &services,
                    &name,
                    serde_json::json!({"metadata": {"labels": {"burst": n.to_string()}}}),
                )
                .await?;
            }
            anyhow::Ok(())
        }));
    }
    for w in writers {
        w.await??;
    }
    for i in 1..=5 {
        expect_app(&services, &format!("contended-{i}"), Some("purple")).await?;
    }

    settle().await;
    step("final state, read back from the API server");
    let list = services.list(&ListParams::default()).await?;
    println!("    {:<14} {:<24} SELECTOR app", "SERVICE", "ANNOTATION");
    for s in &list.items {
        let name = s.metadata.name.as_deref().unwrap_or("");
        let annotation = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION))
            .map(|v| format!("{v:?}"))
            .unwrap_or_else(|| "-".into());
        let app = s
            .spec
            .as_ref()
            .and_then(|sp| sp.selector.as_ref())
            .and_then(|m| m.get("app"))
            .cloned()
            .unwrap_or_else(|| "-".into());
        println!("    {name:<14} {annotation:<24} {app}");
    }
    let remaining: Vec<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    println!("    pods: {}", remaining.join(", "));

    step("metrics (from each controller's /metrics)");
    for c in &controllers {
        let text = http_get(c.metrics_port, "/metrics").await?;
        for line in text.lines().filter(|l| {
            !l.starts_with('#')
                && (l.starts_with("controller_runtime_reconcile_total")
                    || l.starts_with("controller_runtime_reconcile_errors_total")
                    || l.starts_with("controller_runtime_reconcile_panics_total")
                    || l.starts_with("workqueue_retries_total")
                    || l.starts_with("workqueue_adds_total"))
        }) {
            println!("    {line}");
        }
    }
    println!(
        "    seen in the logs: {} panics recovered, {} keys dropped after the retry limit, {} writes refused with 409 Conflict and retried",
        seen.panics.load(Ordering::SeqCst),
        seen.dropped.load(Ordering::SeqCst),
        seen.conflicts.load(Ordering::SeqCst)
    );
    if seen.conflicts.load(Ordering::SeqCst) == 0 {
        println!(
            "    (no write lost the race this time: the conflict window is a few milliseconds)"
        );
    }

    step("stopping the controllers (SIGTERM: drain, then exit 0)");
    for mut c in controllers {
        if let Some(pid) = c.child.id() {
            // kill(1) rather than unsafe libc here.
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let status = tokio::time::timeout(Duration::from_secs(40), c.child.wait())
            .await
            .context("controller did not exit")??;
        println!("    {} exited with {status}", c.name);
        if !status.success() {
            bail!("{} exited with {status}", c.name);
        }
    }
    Ok(())
}

/// A step of the demo, with the time since the demo started.
pub(crate) fn step(text: &str) {
    static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let elapsed = STARTED.get_or_init(std::time::Instant::now).elapsed();
    println!("\n==> {text} ({:.0} s)", elapsed.as_secs_f64());
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(700)).await;
}

async fn client_for(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("using {}", kubeconfig.display()))?;
    Ok(Client::try_from(config)?)
}

pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn spawn_controller(
    binary: &Path,
    kubeconfig: &Path,
    ns: &str,
    name: &'static str,
    extra: &[&str],
    seen: Arc<Seen>,
) -> Result<Running> {
    let metrics_port = free_port()?;
    let mut child = Command::new(binary)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--namespace", ns, "--workers", "2"])
        // Metrics and probes on one listener of a free port: the two
        // controllers run side by side.
        .args([
            "--metrics-bind-address",
            &format!("127.0.0.1:{metrics_port}"),
        ])
        .args([
            "--health-probe-bind-address",
            &format!("127.0.0.1:{metrics_port}"),
        ])
        .args(extra)
        .arg(name)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let s = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            s.pod_lines.fetch_add(1, Ordering::SeqCst);
            println!("    [{name}] {line}");
        }
    });
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("reconcile panicked") {
                seen.panics.fetch_add(1, Ordering::SeqCst);
            }
            if line.contains("dropping the key") {
                seen.dropped.fetch_add(1, Ordering::SeqCst);
            }
            if line.contains("retrying") && line.contains("409") {
                seen.conflicts.fetch_add(1, Ordering::SeqCst);
            }
            // Show what the controllers decided, not their routine logs.
            let interesting = [
                "set selector",
                "panicked",
                "retrying",
                "dropping",
                "invalid strategy",
                "ERROR",
                "WARN",
            ];
            if interesting.iter().any(|w| line.contains(w)) {
                println!("    [{name}] {}", compact_log(&line));
            }
        }
    });
    Ok(Running {
        name,
        child,
        metrics_port,
    })
}

/// Drops the timestamp and span prefix of a log line.
fn compact_log(line: &str) -> &str {
    let line = line.split_once("Z ").map(|(_, rest)| rest).unwrap_or(line);
    match line.find(": kinformer_controllers::") {
        Some(i) => match line[i..].split_once(": ") {
            Some((_, rest)) => match rest.split_once(": ") {
                Some((_, msg)) => msg,
                None => rest,
            },
            None => line,
        },
        None => line,
    }
}

async fn wait_ready(c: &Running) -> Result<()> {
    wait_ready_on(c.metrics_port, c.name).await
}

/// Waits (up to 30 s) until the process `name` serving probes on `port`
/// answers `/readyz` with ok.
pub(crate) async fn wait_ready_on(port: u16, name: &str) -> Result<()> {
    for _ in 0..300 {
        if let Ok(body) = http_get(port, "/readyz").await
            && body.trim() == "ok"
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{name} did not become ready in 30 s")
}

pub(crate) async fn http_get(port: u16, path: &str) -> Result<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    let (head, body) = buf
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{path}: {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_owned())
}

async fn wait_until<F, Fut>(what: &str, check: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    for _ in 0..300 {
        if check().await? {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("timed out after 30 s waiting for {what}")
}

async fn expect_app(services: &Api<Service>, name: &str, want: Option<&str>) -> Result<()> {
    let desc = format!("Service {name} selector app={}", want.unwrap_or("<unset>"));
    wait_until(&desc, || async {
        let svc = services.get(name).await?;
        let app = svc
            .spec
            .and_then(|s| s.selector)
            .and_then(|m| m.get("app").cloned());
        Ok(app.as_deref() == want)
    })
    .await?;
    println!("    ok: {desc}");
    Ok(())
}

async fn merge<K>(api: &Api<K>, name: &str, patch: serde_json::Value) -> Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

async fn annotate(services: &Api<Service>, name: &str, value: Option<&str>) -> Result<()> {
    merge(
        services,
        name,
        serde_json::json!({"metadata": {"annotations": {ANNOTATION: value}}}),
    )
    .await
}

pub(crate) fn pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": name.split('-').next().unwrap_or(name)}},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap_or_default()
}

fn service(name: &str, strategy: Option<&str>) -> Service {
    let annotations: BTreeMap<String, String> = strategy
        .map(|s| (ANNOTATION.to_owned(), s.to_owned()))
        .into_iter()
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"ports": [{"port": 80, "targetPort": 8080}]}
    }))
    .unwrap_or_default()
}
