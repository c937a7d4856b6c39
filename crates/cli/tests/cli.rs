//! The `kinformer` binary: clear errors for bad configuration, and a
//! controller killed mid-work that converges after a restart.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kinformer_envtest::TestEnv;
use kube_client::api::{Api, Patch, PatchParams, PostParams};

const BIN: &str = env!("CARGO_BIN_EXE_kinformer");

/// Several controllers run side by side in these tests: none binds
/// kubebuilder's default :8080 and :8081.
const NO_ADMIN_SERVER: [&str; 4] = [
    "--metrics-bind-address",
    "0",
    "--health-probe-bind-address",
    "0",
];

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

#[test]
fn a_bind_address_that_is_not_one_is_named_in_the_error() {
    for (flag, value, says) in [
        (
            "--metrics-bind-address",
            "8080",
            "is not HOST:PORT, :PORT or 0",
        ),
        (
            "--health-probe-bind-address",
            ":http",
            "is not a port number",
        ),
        (
            "--metrics-bind-address",
            "example.com:80",
            "is not an IP address or localhost",
        ),
    ] {
        let out = Command::new(BIN)
            .args([flag, value, "pod-stdout"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(flag) && err.contains(says),
            "{flag} {value}: {err}"
        );
    }
}

#[test]
fn a_log_level_that_is_not_one_is_reported() {
    let out = Command::new(BIN)
        .args(["--log-level", "info,=[", "pod-stdout"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--log-level"), "{err}");
}

/// SIGTERM to `child`: a graceful stop.
#[allow(unsafe_code)]
fn sigterm(child: &std::process::Child) {
    // SAFETY: kill(2) takes no pointers, and the pid is our own child's,
    // not yet reaped (its `wait` comes after), so it cannot be reused.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
}

/// GETs `path` on `addr`; the status line and the body.
fn http_get(addr: &str, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr)?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)?;
    Ok(answer)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_probes_are_served_on_their_own_addresses() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("admin").await.unwrap();
    let (metrics, probes) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let mut child = Command::new(BIN)
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(["--namespace", &ns, "--metrics-bind-address", &metrics])
        .args(["--health-probe-bind-address", &probes, "pod-stdout"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Ready once the Pod cache has synced.
    let mut ready = String::new();
    for _ in 0..600 {
        ready = http_get(&probes, "/readyz").unwrap_or_default();
        if ready.starts_with("HTTP/1.1 200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let scraped = http_get(&metrics, "/metrics").unwrap();
    assert!(
        scraped.starts_with("HTTP/1.1 200")
            && scraped.contains("workqueue_adds_total{name=\"pod-stdout\"}"),
        "{scraped}"
    );
    // Each listener serves its own paths only.
    assert!(
        http_get(&metrics, "/readyz")
            .unwrap()
            .starts_with("HTTP/1.1 404")
    );
    assert!(
        http_get(&probes, "/metrics")
            .unwrap()
            .starts_with("HTTP/1.1 404")
    );
    assert!(
        http_get(&probes, "/healthz")
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    sigterm(&child);
    assert!(child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_address_in_use_is_named_in_the_error() {
    let env = TestEnv::shared().await.unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(BIN)
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(["--metrics-bind-address", &addr])
        .args(["--health-probe-bind-address", "0", "pod-stdout"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot serve metrics on {addr}")),
        "{err}"
    );
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
            .args(NO_ADMIN_SERVER)
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
    sigterm(&second);
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
        .args(NO_ADMIN_SERVER)
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
    sigterm(&child);
    wait_for_line(&lines, &mut seen, "signal received");
    sigterm(&child);
    wait_for_line(&lines, &mut seen, "second signal received");
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(130),
        "{status}; saw:\n{}",
        seen.join("\n")
    );
}
