//! `cargo xtask bench --crds`: a Manager following an optional CRD
//! (kinformer-bench's `crd-lifecycle` scenario): its RSS waiting for the
//! CRD, caching 10 000 custom resources, and after the CRD is deleted
//! (memory returned or not), and the time from the CRD established to the
//! informer synced and to the first reconcile, beside the server's own
//! time for a new resource's first list and first create. kinformer alone: controller-runtime and kube-runtime
//! have no informer that waits for its CRD and starts again by itself
//! (controller-runtime fails its cache sync after 2 minutes, kube-runtime
//! cannot add the watch once it runs), so there is no like-for-like row.

use super::*;

const BEGIN: &str = "<!-- BEGIN cargo xtask bench --crds -->";
const END: &str = "<!-- END cargo xtask bench --crds -->";

/// The scenario's measures, in the table's order: key, row name, unit
/// scale (bytes to MiB, or as is).
const MEASURES: &[(&str, &str, f64)] = &[
    ("rss_waiting_bytes", "RSS waiting for the CRD (MiB)", MIB),
    (
        "rss_cached_bytes",
        "RSS caching the custom resources (MiB)",
        MIB,
    ),
    (
        "rss_after_delete_bytes",
        "RSS after the CRD is deleted (MiB)",
        MIB,
    ),
    ("rss_anon_waiting_bytes", "anonymous RSS waiting (MiB)", MIB),
    ("rss_anon_cached_bytes", "anonymous RSS caching (MiB)", MIB),
    (
        "rss_anon_after_delete_bytes",
        "anonymous RSS after the CRD is deleted (MiB)",
        MIB,
    ),
    (
        "rss_anon_after_delete_trimmed_bytes",
        "the same after one more glibc malloc_trim(0) (MiB)",
        MIB,
    ),
    ("heap_live_waiting_bytes", "live heap waiting (MiB)", MIB),
    (
        "heap_live_after_delete_bytes",
        "live heap after the CRD is deleted (MiB)",
        MIB,
    ),
    (
        "established_to_synced_ms",
        "CRD established to the informer synced (ms)",
        1.0,
    ),
    (
        "server_first_list_ms",
        "the server alone: another CRD established to its first plain list (ms)",
        1.0,
    ),
    (
        "create_sent_to_reconcile_ms",
        "first object's create sent to its reconcile (ms)",
        1.0,
    ),
    (
        "server_first_create_ms",
        "the server's first create of the new resource, its round trip (ms)",
        1.0,
    ),
    (
        "delete_to_waiting_s",
        "CRD deleted to every object reconciled gone and waiting (s)",
        1.0,
    ),
];

const MIB: f64 = 1_048_576.0;

pub async fn run(quick: bool, root: &Path) -> Result<()> {
    let started = Instant::now();
    println!("==> building kinformer-bench (release)");
    super::programs::cargo(&root.join("bench"), "kinformer-bench")?;
    let harness = root.join("bench/target/release/kinformer-bench");
    let (rounds, count) = (if quick { 1 } else { 3 }, 10_000);
    println!("\n==> starting the control plane (kube-apiserver {KUBERNETES_VERSION} + etcd)");
    let env = TestEnv::start_with(settled_env()).await?;
    let kubeconfig = env.kubeconfig_path().to_string_lossy().into_owned();
    let mut runs: Vec<Value> = Vec::new();
    for round in 1..=rounds {
        // A namespace per round: the CRD's deletion empties it.
        let ns = env.create_namespace("bench-crds").await?;
        let objects = count.to_string();
        let args = ["crd-lifecycle", &kubeconfig, &ns, &objects];
        let v = run_json(&harness, "kinformer-bench", &args, &[]).await?;
        println!("    round {round} of {rounds}: {v}");
        runs.push(v);
    }
    env.stop();
    let mut table =
        format!("| {count} custom resources, median of {rounds} | kinformer |\n|---|---|\n");
    for (key, row, scale) in MEASURES {
        let mut values = runs
            .iter()
            .map(|v| num(v, key))
            .collect::<Result<Vec<f64>>>()?;
        values.sort_by(f64::total_cmp);
        let median = values[values.len() / 2] / scale;
        table.push_str(&format!("| {row} | {median:.1} |\n"));
    }
    println!("\n{table}");
    let section = format!(
        "{BEGIN}\n## A controller following its CRD\n\n\
         Command: `cargo xtask bench --crds{}` ({:.0} s). Machine: {}. Server: kube-apiserver {KUBERNETES_VERSION} \
         with etcd on loopback. One process (kinformer-bench `crd-lifecycle`) runs a Manager with one controller over \
         a custom resource whose CRD is not installed; the CRD is installed (timed from the CRD seen Established by a \
         watch of the bench's own to the informer synced, beside the server's own time: another CRD's first plain list by the bench, a new \
         resource's storage starting on its first request), one object created, timed from its create sent to its reconcile, \
         {count} objects created and all reconciled, then the CRD deleted: the server deletes its objects, each \
         reconciled as gone, and the informer waits for the CRD again. RSS is read 2 s after each stage settles; \
         its anonymous part leaves out the program's code pages, and the trimmed figure what glibc would still \
         give back. kinformer alone: neither peer has an informer that waits for its CRD and starts again by itself \
         (controller-runtime fails its cache sync after 2 minutes and the pod restarts; kube-runtime cannot add \
         the watch to a running Controller).\n\n{table}{END}\n",
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
