//! `cargo xtask bench --stale-reads` (and the first part of `--controllers`):
//! what a controller does when its cache is behind its own writes. The same
//! controller, child-per-parent (bench/child-per-parent; its peers in
//! bench/peers: every Secret gets one ConfigMap child, created with a
//! generated name when the controller sees none, and an annotation counting
//! its children, written by an update of the cached Secret; after a write it
//! looks again in 100 ms), in kinformer (read-your-writes on, its default,
//! and off), controller-runtime (its default, and with
//! `EnableReadYourWritesConsistency` at its one worker and at kinformer's
//! two) and kube-runtime, each a fresh process per run, rotating; the rows
//! compare like with like (read-your-writes off in all, on in both that
//! have it).
//!
//! Each program reaches the API server through a proxy that holds back
//! every watch answer for a second (writes and lists pass at once): a watch
//! lagging its own writes, as on a busy server. The bench creates the
//! Secrets at a steady rate, directly, and reads the outcome from the
//! server itself: children beyond one per Secret (duplicates), and from
//! kube-apiserver's `apiserver_request_total`, the 409 Conflicts it
//! answered and the write attempts and reads it served for Secrets and
//! ConfigMaps, per Secret, less the bench's own.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kinformer_envtest::AnsweringProxy;
use kube_client::ResourceExt;
use kube_client::api::{DeleteParams, ListParams};

use super::programs::{Programs, Running, Served, Vars, served};
use super::*;

const BEGIN: &str = "<!-- BEGIN cargo xtask bench --stale-reads -->";
const END: &str = "<!-- END cargo xtask bench --stale-reads -->";

const PARENT: &str = "bench.kinformer.dev/parent";
const CHILDREN: &str = "bench.kinformer.dev/children";
const RESOURCES: &[&str] = &["secrets", "configmaps"];

fn build(root: &Path) -> Result<Programs> {
    println!(
        "==> building child-per-parent (release): kinformer's, its kube-runtime and controller-runtime peers"
    );
    let bench = root.join("bench");
    super::programs::cargo(&bench, "child-per-parent")?;
    super::programs::cargo(&bench, "child-per-parent-kube-runtime")?;
    let controller_runtime = bench.join("target/release/child-per-parent-controller-runtime");
    go_build(
        &bench.join("peers/child-per-parent-controller-runtime"),
        &controller_runtime,
    )?;
    Ok(Programs {
        kinformer: bench.join("target/release/child-per-parent"),
        controller_runtime,
        kube_runtime: bench.join("target/release/child-per-parent-kube-runtime"),
    })
}

/// What the server holds: for each Secret, its annotation and how many
/// children name it.
async fn state(
    secrets: &Api<Secret>,
    children: &Api<ConfigMap>,
) -> Result<BTreeMap<String, (Option<String>, usize)>> {
    let mut state: BTreeMap<String, (Option<String>, usize)> = secrets
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|s| (s.name_any(), (s.annotations().get(CHILDREN).cloned(), 0)))
        .collect();
    for child in children
        .list(&ListParams::default().labels(PARENT))
        .await?
        .items
    {
        if let Some(parent) = child.labels().get(PARENT) {
            state.entry(parent.clone()).or_default().1 += 1;
        }
    }
    Ok(state)
}

/// Every Secret has a child and counts its children right.
fn converged(state: &BTreeMap<String, (Option<String>, usize)>, parents: usize) -> bool {
    state.len() == parents
        && state
            .values()
            .all(|(count, n)| *n >= 1 && count.as_deref() == Some(n.to_string().as_str()))
}

/// One run's outcome.
struct Outcome {
    duplicates: usize,
    served: Served,
    /// From the first Secret created to the last change on the server.
    seconds: f64,
}

/// Runs `program` through the lagging proxy while `parents` Secrets are
/// created at `rate` a second, until it is idle and the server converged.
async fn once(
    program: &Path,
    kubeconfig: &Path,
    env_vars: &[(&str, &str)],
    (client, ns): (&Client, &str),
    parents: usize,
    rate: u32,
) -> Result<Outcome> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let children: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    // What an earlier run left (no garbage collector runs here).
    let all = ListParams::default();
    secrets
        .delete_collection(&DeleteParams::default(), &all)
        .await?;
    children
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(PARENT),
        )
        .await?;
    let mut running = Running::start(program, kubeconfig, env_vars)?;
    running.settled().await.context("the controller starting")?;
    let before = served(client, RESOURCES).await?;
    let mut bench_lists = 0.0;
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    // Late ticks are not made up in a burst: the rate stays steady on a
    // loaded machine.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0..parents {
        tick.tick().await;
        let secret: Secret = serde_json::from_value(
            serde_json::json!({"metadata": {"name": format!("parent-{i:04}")}}),
        )?;
        secrets.create(&PostParams::default(), &secret).await?;
    }
    // Generous: a controller that handles one parent a second still ends.
    let deadline = started + Duration::from_secs(60 + 2 * parents as u64);
    let (mut last, mut changed) = (BTreeMap::new(), started);
    loop {
        let now = state(&secrets, &children).await?;
        bench_lists += 2.0;
        if now != last {
            (last, changed) = (now, Instant::now());
        }
        // Converged, and no write for 2 s since: the controller is idle.
        if converged(&last, parents) && changed.elapsed() > Duration::from_secs(2) {
            running.settled().await.context("the controller settling")?;
            let now = state(&secrets, &children).await?;
            bench_lists += 2.0;
            if now == last {
                break;
            }
            (last, changed) = (now, Instant::now());
        }
        if Instant::now() > deadline {
            bail!("not converged by the deadline: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut served = served(client, RESOURCES).await? - before;
    // Less the bench's own: its creates, its lists and one /metrics read
    // (not a Secret or ConfigMap request, so not counted).
    served.writes -= parents as f64;
    served.reads -= bench_lists;
    running.kill().await;
    let children: usize = last.values().map(|(_, n)| n).sum();
    Ok(Outcome {
        duplicates: children - parents,
        served,
        seconds: changed.duration_since(started).as_secs_f64(),
    })
}

pub async fn run(quick: bool, root: &Path) -> Result<String> {
    let started = Instant::now();
    let programs = build(root)?;
    let (parents, rate, rounds) = if quick { (50, 25, 1) } else { (100, 50, 3) };
    let lag = Duration::from_secs(1);
    println!("\n==> starting the control plane (kube-apiserver {KUBERNETES_VERSION} + etcd)");
    // The server alone, as every bench has it (see `settled_env`).
    let env = TestEnv::start_with(TestEnvOptions::new().without_controller_manager()).await?;
    let proxy = AnsweringProxy::start(&env).await?;
    proxy.delay_watches(lag);
    let kubeconfig = env.kubeconfig_via(proxy.port())?;
    let client = env.client()?;
    let ns = env.create_namespace("bench-stale-reads").await?;
    // Two rows, like for like: read-your-writes off in all three, and on
    // in the two that have it; and controller-runtime's with kinformer's
    // two workers (with one, its read-your-writes waits hold the worker).
    let off = format!(
        "child-per-parent, {parents} Secrets created at {rate}/s, watch answers {} s behind: read-your-writes off (kinformer: READ_YOUR_WRITES=false; controller-runtime: its default; kube-runtime: has none)",
        lag.as_secs()
    );
    let on = format!(
        "child-per-parent, {parents} Secrets: read-your-writes on (kinformer: its default; controller-runtime: EnableReadYourWritesConsistency)"
    );
    let on_two = format!(
        "child-per-parent, {parents} Secrets: read-your-writes on, controller-runtime with MaxConcurrentReconciles 2 (kinformer's default)"
    );
    let runs: [(System, &Vars, &str); 6] = [
        (System::Kinformer, &[("READ_YOUR_WRITES", "false")], &off),
        (System::ClientGo, &[], &off),
        (System::KubeRuntime, &[], &off),
        (System::Kinformer, &[], &on),
        (System::ClientGo, &[("READ_YOUR_WRITES", "true")], &on),
        (
            System::ClientGo,
            &[
                ("READ_YOUR_WRITES", "true"),
                ("MAX_CONCURRENT_RECONCILES", "2"),
            ],
            &on_two,
        ),
    ];
    let mut results = Results::default();
    for round in 0..rounds {
        for k in 0..runs.len() {
            let (system, env_vars, row) = runs[(k + round) % runs.len()];
            let outcome = once(
                programs.path(system),
                &kubeconfig,
                env_vars,
                (&client, &ns),
                parents,
                rate,
            )
            .await
            .with_context(|| format!("{} with {env_vars:?}", super::programs::name(system)))?;
            let per = |v: f64| v / parents as f64;
            results.add(row, "duplicate children", system, outcome.duplicates as f64);
            results.add(row, "409 Conflicts", system, outcome.served.conflicts);
            results.add(
                row,
                "write attempts per Secret",
                system,
                per(outcome.served.writes),
            );
            results.add(
                row,
                "API reads per Secret (gets and lists)",
                system,
                per(outcome.served.reads),
            );
            results.add(
                row,
                "first Secret created to the last change, s",
                system,
                outcome.seconds,
            );
            println!(
                "    round {} {} {env_vars:?}: {} duplicates, {} conflicts, {:.2} write attempts and {:.2} reads per Secret, {:.1} s",
                round + 1,
                super::programs::name(system),
                outcome.duplicates,
                outcome.served.conflicts,
                per(outcome.served.writes),
                per(outcome.served.reads),
                outcome.seconds
            );
        }
    }
    drop(proxy);
    env.stop();
    let table = render_with(&results, ["controller-runtime", "kube-runtime"]);
    println!("\n{table}");
    let section = format!(
        "{BEGIN}\n## Stale reads: child-per-parent in kinformer, controller-runtime v0.25.3, kube-runtime 5.0\n\n\
         Command: `cargo xtask bench --stale-reads{}` ({:.0} s). Machine: {}. Server: kube-apiserver {KUBERNETES_VERSION} \
         with etcd on loopback. The controller of bench/child-per-parent and its two peers (bench/peers): every Secret \
         gets one ConfigMap child, created with a generated name when the controller sees none, and an annotation \
         counting its children, written by an update of the cached Secret (it carries the resourceVersion read; a \
         merge patch would not conflict, the duplicates stay); after a write it looks again in 100 ms, as a controller \
         waiting on its child's progress does, which is what meets the stale cache (one that only waits for its \
         children's events reads them after the parent's and rarely duplicates). kinformer's and \
         controller-runtime's read the children from the cache; kube-runtime's `owns` keeps no store of them, so its \
         peer lists them from the API server: it reads no stale children, at a list per reconcile. Each system's \
         defaults otherwise: kinformer 2 workers, protobuf, retries from 5 ms doubling; controller-runtime 1 worker, \
         protobuf, the same retries; kube-runtime unbounded concurrency, JSON, its peer's error policy 5 s (so it \
         meets a stale parent about once, where the others retry into it). Each program reaches the server through \
         a proxy that holds back every watch answer for {} s (writes and lists pass at once), a fresh process per \
         run, {rounds} rounds rotating; medians. Read from the server: children beyond one per Secret, and from \
         `apiserver_request_total` for Secrets and ConfigMaps, less the bench's own creates and lists: the 409 \
         Conflicts, write attempts (refused ones too) and reads (gets and lists; watches are counted only when \
         they end, so not here).\n\n{table}\n{END}\n",
        if quick { " --quick" } else { "" },
        started.elapsed().as_secs_f64(),
        machine(),
        lag.as_secs(),
    );
    Ok(section)
}

/// Puts `section` (from [`run`]) in its place in docs/benchmarks.md.
pub fn write(root: &Path, section: &str) -> Result<()> {
    replace_block(root, BEGIN, END, section)
}

/// `cargo xtask bench --stale-reads`: this part alone, its section of
/// docs/benchmarks.md updated.
pub async fn run_alone(quick: bool, root: &Path) -> Result<()> {
    let section = run(quick, root).await?;
    write(root, &section)?;
    println!("==> docs/benchmarks.md updated");
    Ok(())
}
