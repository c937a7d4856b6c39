//! The `kinformer` binary: clear errors for bad configuration, and a
//! controller killed mid-work that converges after a restart.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kinformer_envtest::TestEnv;
use kube_client::api::{Api, Patch, PatchParams, PostParams};

const BIN: &str = env!("CARGO_BIN_EXE_kinformer");

fn run_expecting_failure(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("the binary runs");
    assert!(!out.status.success(), "{args:?} should fail");
    assert_eq!(out.status.code(), Some(1));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_missing_kubeconfig_is_named_in_the_error() {
    let err = run_expecting_failure(&["--kubeconfig", "/nonexistent/kubeconfig", "pod-stdout"]);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
}

#[test]
fn an_unparsable_kubeconfig_is_reported() {
    let dir = tempfile_dir();
    let path = dir.join("garbage");
    std::fs::write(&path, "this: is: not: a kubeconfig: [").unwrap();
    let err = run_expecting_failure(&["--kubeconfig", path.to_str().unwrap(), "pod-stdout"]);
    assert!(err.contains("cannot use kubeconfig"), "{err}");
}

#[test]
fn an_unreadable_kubeconfig_is_reported() {
    let dir = tempfile_dir();
    let path = dir.join("unreadable");
    // A directory cannot be read as a file, even by root.
    std::fs::create_dir_all(&path).unwrap();
    let err = run_expecting_failure(&["--kubeconfig", path.to_str().unwrap(), "pod-stdout"]);
    assert!(err.contains("cannot use kubeconfig"), "{err}");
}

#[test]
fn a_kubeconfig_pointing_nowhere_says_the_server_cannot_be_reached() {
    let dir = tempfile_dir();
    let path = dir.join("nowhere");
    // Port 1 on loopback: nothing listens there.
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\n\
         users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
    )
    .unwrap();
    let err = run_expecting_failure(&["--kubeconfig", path.to_str().unwrap(), "pod-stdout"]);
    assert!(
        err.contains("cannot reach the API server at https://127.0.0.1:1"),
        "{err}"
    );
}

#[test]
fn a_context_that_does_not_exist_is_reported() {
    let dir = tempfile_dir();
    let path = dir.join("ctx");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\n",
    )
    .unwrap();
    let err = run_expecting_failure(&[
        "--kubeconfig",
        path.to_str().unwrap(),
        "--context",
        "nope",
        "pod-stdout",
    ]);
    assert!(err.contains("kubeconfig is not usable"), "{err}");
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kinformer-cli-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn service(name: &str, strategy: &str) -> Service {
    let annotations: BTreeMap<String, String> =
        [("kinformer.dev/strategy".to_owned(), strategy.to_owned())].into();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"ports": [{"port": 80}]}
    }))
    .unwrap()
}

async fn apps(api: &Api<Service>) -> BTreeMap<String, Option<String>> {
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            let name = s.metadata.name.clone().unwrap();
            (
                name,
                s.spec
                    .and_then(|sp| sp.selector)
                    .and_then(|m| m.get("app").cloned()),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_mid_work_converges_after_a_restart() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("killed").await.unwrap();
    let api: Api<Service> = Api::namespaced(env.client().unwrap(), &ns);
    for i in 0..40 {
        api.create(&PostParams::default(), &service(&format!("s{i}"), "one"))
            .await
            .unwrap();
    }
    let spawn = || {
        Command::new(BIN)
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args(["--namespace", &ns, "service-strategy"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut first = spawn();
    // Kill it as soon as it has written some, but probably not all.
    for _ in 0..200 {
        if apps(&api).await.values().any(|a| a.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill().unwrap();
    first.wait().unwrap();
    // Meanwhile the desired state changes for half of them.
    for i in 0..20 {
        let patch =
            serde_json::json!({"metadata": {"annotations": {"kinformer.dev/strategy": "two"}}});
        api.patch(
            &format!("s{i}"),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .unwrap();
    }
    let mut second = spawn();
    let want = |i: usize| {
        Some(if i < 20 {
            "two".to_owned()
        } else {
            "one".to_owned()
        })
    };
    let mut converged = false;
    for _ in 0..300 {
        let now = apps(&api).await;
        if (0..40).all(|i| now[&format!("s{i}")] == want(i)) {
            converged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // SIGTERM: a graceful stop exits 0.
    // SAFETY: kill(2) on our own child process.
    unsafe {
        libc::kill(second.id() as i32, libc::SIGTERM);
    }
    let status = second.wait().unwrap();
    assert!(
        converged,
        "the restarted controller did not converge: {:?}",
        apps(&api).await
    );
    assert!(status.success(), "graceful stop exited with {status}");
}

/// Waits for a line of `lines` containing `what`; panics with what was seen.
fn wait_for_line(lines: &std::sync::mpsc::Receiver<String>, seen: &mut Vec<String>, what: &str) {
    loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                let found = line.contains(what);
                seen.push(line);
                if found {
                    return;
                }
            }
            Err(e) => panic!("no line with {what:?} ({e}); saw:\n{}", seen.join("\n")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_exits_at_once_while_the_first_still_waits_for_the_server() {
    use std::io::BufRead;
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("twosignals").await.unwrap();
    let proxy = kinformer_envtest::Proxy::start(env.api_port())
        .await
        .unwrap();
    let dir = tempfile_dir();
    let kubeconfig = dir.join("via-proxy");
    let original = std::fs::read_to_string(env.kubeconfig_path()).unwrap();
    let direct = format!("127.0.0.1:{}", env.api_port());
    assert!(original.contains(&direct), "{original}");
    std::fs::write(
        &kubeconfig,
        original.replace(&direct, &format!("127.0.0.1:{}", proxy.port())),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--namespace", &ns, "--leader-elect", "service-strategy"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    wait_for_line(&lines, &mut seen, "started workers");
    // The server goes silent: releasing the lease on shutdown now hangs.
    proxy.blackhole(true);
    // SAFETY: kill(2) on our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    wait_for_line(&lines, &mut seen, "signal received");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    wait_for_line(&lines, &mut seen, "second signal received");
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(130),
        "{status}; saw:\n{}",
        seen.join("\n")
    );
}
