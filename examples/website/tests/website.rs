//! The Website controller against a real kube-apiserver, through the same
//! `check.sh` that checks its kube-runtime and controller-runtime peers:
//! finalizer, applied Deployment and Service, status, repair, its
//! defaulting, validating and conversion webhooks called by the API server
//! over TLS, a Warning Event, metrics, probes, the Lease, cleanup and a
//! clean SIGTERM; run as a ServiceAccount bound to exactly the rules the
//! example prints, and once without the Events rule.

use std::process::Output;

use kinformer_envtest::{TestEnv, rbac};

const BIN: &str = env!("CARGO_BIN_EXE_website");

/// check.sh over the example in a new namespace, the example acting as
/// the ServiceAccount `website-controller` bound to what its
/// `--print-rbac` prints less `take_away` (verb, resource) (a ClusterRole,
/// as it watches every namespace, named for the namespace).
async fn check(env: &TestEnv, take_away: Option<(&str, &str)>) -> Output {
    let ns = env.create_namespace("website").await.unwrap();
    let mut print = std::process::Command::new(BIN);
    print
        .args(["--print-rbac", &ns])
        .env("LEASE_NAMESPACE", &ns)
        .env("METRICS_ADDR", "127.0.0.1:0")
        .env("PROBE_ADDR", "127.0.0.1:0")
        .env("WEBHOOK_ADDR", "127.0.0.1:0")
        .env("CERT_DIR", env.dir());
    let account = "website-controller";
    let kubeconfig = rbac::bind_as_printed(env, &mut print, account, &ns, take_away)
        .await
        .unwrap();
    let kubectl_dir = env.binaries().kubectl().parent().unwrap().to_owned();
    let path = std::env::join_paths(std::iter::once(kubectl_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/check.sh");
    tokio::process::Command::new("bash")
        .arg(script)
        .arg(BIN)
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("PROGRAM_KUBECONFIG", kubeconfig)
        .env("NAMESPACE", &ns)
        .env("PATH", path)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_website_controller_passes_the_checks_its_peers_pass_under_its_printed_rbac() {
    let env = TestEnv::shared().await.unwrap();
    let output = check(env, None).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.ends_with("PASS\n"),
        "check.sh failed:\n{stdout}\n{stderr}"
    );
    // Nothing it did under its own rules was refused.
    let log = stdout
        .lines()
        .find_map(|l| l.strip_prefix("--- controller log: "))
        .unwrap_or_else(|| panic!("no log named in:\n{stdout}"));
    let log = std::fs::read_to_string(log).unwrap();
    let refused: Vec<&str> = log.lines().filter(|l| rbac::is_refusal(l)).collect();
    assert!(
        refused.is_empty(),
        "refused under its own rules: {refused:?}"
    );

    // Without create on events, the Warning Event step fails, and the
    // log it shows names the refusal.
    let output = check(env, Some(("create", "events"))).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "check.sh passed:\n{stdout}");
    assert!(
        stdout.contains("FAILED: no Warning Event about Website broken"),
        "{stdout}"
    );
    // The whole log, not the tail check.sh shows.
    let log = stdout
        .lines()
        .find_map(|l| l.strip_prefix("--- controller log (")?.strip_suffix("):"))
        .unwrap_or_else(|| panic!("no log named in:\n{stdout}"));
    let log = std::fs::read_to_string(log).unwrap();
    assert!(
        log.lines()
            .any(|l| rbac::names_refusal(l, "create", "events")),
        "{log}"
    );
}
