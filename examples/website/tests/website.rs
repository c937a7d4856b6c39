//! The Website controller against a real kube-apiserver, through the same
//! `check.sh` that checks its kube-runtime and controller-runtime peers:
//! finalizer, applied Deployment and Service, status, repair, its
//! defaulting, validating and conversion webhooks called by the API server
//! over TLS, a Warning Event, metrics, probes, the Lease, cleanup and a
//! clean SIGTERM.

use kinformer_envtest::TestEnv;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_website_controller_passes_the_checks_its_peers_pass() {
    let env = TestEnv::shared().await.unwrap();
    let kubectl_dir = env.binaries().kubectl().parent().unwrap().to_owned();
    let path = std::env::join_paths(std::iter::once(kubectl_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/check.sh");
    let output = tokio::process::Command::new("bash")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_website"))
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("PATH", path)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.ends_with("PASS\n"),
        "check.sh failed:\n{stdout}\n{stderr}"
    );
}
