//! `kinformer service-strategy --print-rbac` against the real API server:
//! the controller runs as a ServiceAccount bound to exactly the rules it
//! prints (a token from the TokenRequest API, no admin credentials), and
//! each rule taken away alone shows in its log as the request the server
//! forbade, naming the verb and resource, and in `/readyz` while it lasts.
//! `--print-manifests` (the same and a Deployment) passes a server-side dry
//! run under the restricted Pod Security Standard.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Service};
use kinformer_envtest::{TestEnv, rbac};
use kube_client::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_kinformer");

/// The controller's flags: watching `ns`, its Lease and ServiceAccount
/// there, its metrics and probes on `probes` (`0`: none).
fn flags(ns: &str, probes: &str) -> Vec<String> {
    [
        "--namespace",
        ns,
        "--leader-elect",
        "--leader-election-namespace",
        ns,
        "--metrics-bind-address",
        probes,
        "--health-probe-bind-address",
        probes,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A free loopback address.
fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// GET `path` of `addr`: the status line and body.
fn http_get(addr: &str, path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// Polls `/readyz` of `addr` (every 100 ms, up to 60 s) until `done` says so.
async fn readyz_until(addr: &str, done: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    for _ in 0..600 {
        if let Ok(answer) = http_get(addr, "/readyz") {
            if done(&answer) {
                return answer;
            }
            last = answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("/readyz never as wanted; last:\n{last}");
}

fn printed_rbac(ns: &str) -> Value {
    printed("service-strategy", ns)
}

/// What `kinformer COMMAND --print-rbac` prints for `ns`.
fn printed(command: &str, ns: &str) -> Value {
    let out = Command::new(BIN)
        .arg(command)
        .args(flags(ns, "0"))
        .arg("--print-rbac")
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Applies `manifests` in a fresh namespace and starts service-strategy
/// as its ServiceAccount; its log lines arrive on the receiver.
async fn start(
    env: &TestEnv,
    ns: &str,
    manifests: &Value,
    probes: &str,
) -> (Child, mpsc::Receiver<String>) {
    start_as(env, "service-strategy", ns, manifests, probes).await
}

/// [`start`] for `command`: its output and log lines, as they come.
async fn start_as(
    env: &TestEnv,
    command: &str,
    ns: &str,
    manifests: &Value,
    probes: &str,
) -> (Child, mpsc::Receiver<String>) {
    let account = format!("kinformer-{command}");
    let manifests = manifests.to_string();
    let kubeconfig = env.bind(&manifests, ns, &account).await.unwrap();
    let mut child = Command::new(BIN)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(flags(ns, probes))
        .arg(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let (tx, lines) = mpsc::channel();
    for pipe in [
        Box::new(stdout) as Box<dyn std::io::Read + Send>,
        Box::new(stderr),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    (child, lines)
}

fn service(name: &str, strategy: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"kinformer.dev/strategy": strategy}},
        "spec": {"ports": [{"port": 80}]},
    }))
    .unwrap()
}

/// A Service to set a selector on, and one whose strategy is not a label
/// value (an Event).
async fn services(env: &TestEnv, ns: &str) {
    let api: Api<Service> = Api::namespaced(env.client().unwrap(), ns);
    api.create(&PostParams::default(), &service("good", "blue"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &service("bad", "not a label!"))
        .await
        .unwrap();
}

#[allow(unsafe_code)]
fn stop(mut child: Child) {
    // SAFETY: kill(2) takes no pointers, and the pid is our own child's,
    // not yet reaped (it is waited for below), so it cannot be reused.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_strategy_works_as_a_service_account_bound_to_exactly_what_it_prints() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("rbac").await.unwrap();
    let manifests = printed_rbac(&ns);
    // Namespaced throughout: a Role, no ClusterRole.
    let kinds: Vec<&str> = manifests["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["ServiceAccount", "Role", "RoleBinding"]);
    let (child, lines) = start(env, &ns, &manifests, "0").await;
    services(env, &ns).await;
    let client = env.client().unwrap();
    let api: Api<Service> = Api::namespaced(client.clone(), &ns);
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let mut done = false;
    for _ in 0..600 {
        let selector = api.get("good").await.unwrap().spec.unwrap().selector;
        let invalid = events
            .list(&ListParams::default().fields("reason=InvalidStrategy"))
            .await
            .unwrap();
        // Held, and renewed at least once (an update after the create).
        let held = leases
            .get_opt("kinformer-service-strategy")
            .await
            .unwrap()
            .and_then(|l| l.spec)
            .filter(|s| s.holder_identity.is_some() && s.renew_time != s.acquire_time);
        if selector.is_some_and(|s| s.get("app").map(String::as_str) == Some("blue"))
            && !invalid.items.is_empty()
            && held.is_some()
        {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(child);
    // Every line, to the end of its output (the release at exit included).
    let log: Vec<String> = lines.iter().collect();
    assert!(
        done,
        "the controller did not do its work; its log:\n{}",
        log.join("\n")
    );
    assert!(
        !log.iter().any(|l| l.contains("forbidden")),
        "a request was forbidden:\n{}",
        log.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_printed_rule_taken_away_alone_is_named_by_the_request_it_forbids() {
    let env = TestEnv::shared().await.unwrap();
    // (verb, resource) taken away. Not `list` on services: the informer
    // lists by a streaming watch (sendInitialEvents), which needs only
    // `watch`, and keeps working without it; `list` is printed for its
    // fallback on a server that refuses streaming lists.
    let cases = [
        ("watch", "services"),
        ("update", "services"),
        ("create", "events"),
        ("create", "leases"),
        ("get", "leases"),
        ("update", "leases"),
        ("list", "leases"),
        ("watch", "leases"),
    ];
    for (verb, resource) in cases {
        let ns = env.create_namespace("rbac-less").await.unwrap();
        let manifests = rbac::without(printed_rbac(&ns), verb, resource).unwrap();
        if resource == "leases" && (verb == "list" || verb == "watch") {
            // The Lease is followed by a replica waiting for it: held by
            // another, for an hour.
            hold_lease(env, &ns).await;
        }
        let probes = free_addr();
        let (child, lines) = start(env, &ns, &manifests, &probes).await;
        services(env, &ns).await;
        let forbidden = format!("cannot {verb} resource \\\"{resource}\\\"");
        let plain = format!("cannot {verb} resource \"{resource}\"");
        let (a, b) = (forbidden.as_str(), plain.as_str());
        let line = wait_for_any(&lines, &[a, b]);
        let escaped = format!("in the namespace \\\"{ns}\\\"");
        let quoted = format!("in the namespace \"{ns}\"");
        assert!(line.contains(&escaped) || line.contains(&quoted), "{line}");
        // Counted where it was refused: the election's Lease, a reconcile.
        let counted = match (verb, resource) {
            (_, "leases") => {
                Some("kinformer_leader_election_denied_total{name=\"kinformer-service-strategy\"} ")
            }
            ("update", "services") => {
                Some("kinformer_reconcile_denied_total{controller=\"service-strategy\"} ")
            }
            _ => None,
        };
        if let Some(counter) = counted {
            let metrics = http_get(&probes, "/metrics").unwrap();
            let count = metrics
                .lines()
                .find_map(|l| l.strip_prefix(counter))
                .unwrap_or_else(|| panic!("no {counter} in:\n{metrics}"));
            assert!(count.trim().parse::<u64>().unwrap() > 0, "{counter}{count}");
        }
        if (verb, resource) == ("watch", "services") {
            // Not ready while refused, saying what; ready once allowed.
            let refused = readyz_until(&probes, |a| a.contains(&plain)).await;
            assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
            let metrics = http_get(&probes, "/metrics").unwrap();
            let denied = format!(
                "kinformer_informer_denied_total{{informer=\"services in namespace {ns}\"}} "
            );
            let count = metrics
                .lines()
                .find_map(|l| l.strip_prefix(&denied))
                .unwrap_or_else(|| panic!("no {denied} in:\n{metrics}"));
            assert!(count.trim().parse::<u64>().unwrap() > 0, "{count}");
            env.kubectl(&["apply", "-f", "-"], &printed_rbac(&ns).to_string())
                .unwrap();
            readyz_until(&probes, |a| a.starts_with("HTTP/1.1 200")).await;
        }
        stop(child);
    }
}

async fn hold_lease(env: &TestEnv, ns: &str) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "kinformer-service-strategy"},
        "spec": {
            "holderIdentity": "another-replica", "leaseDurationSeconds": 3600,
            "acquireTime": now, "renewTime": now,
        },
    }))
    .unwrap();
    Api::<Lease>::namespaced(env.client().unwrap(), ns)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
}

/// Waits for a line containing one of `any`.
fn wait_for_any(lines: &mpsc::Receiver<String>, any: &[&str]) -> String {
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if any.iter().any(|w| line.contains(w)) => return line,
            Ok(line) => seen.push(line),
            Err(e) => panic!(
                "no line with one of {any:?} ({e}); saw:\n{}",
                seen.join("\n")
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printed_manifests_pass_a_server_side_dry_run_under_the_restricted_pod_security_standard() {
    let env = TestEnv::shared().await.unwrap();
    let watched = env.create_namespace("watched").await.unwrap();
    for (command, scope) in [("pod-stdout", None), ("service-strategy", Some(&watched))] {
        let ns = env.create_namespace("manifests").await.unwrap();
        let warn = "pod-security.kubernetes.io/warn=restricted";
        env.kubectl(&["label", "namespace", &ns, warn], "").unwrap();
        let mut args = vec![
            command,
            "--leader-elect",
            "--leader-election-namespace",
            &ns,
        ];
        match scope {
            Some(watched) => args.extend(["--namespace", watched.as_str()]),
            None => args.push("--all-namespaces"),
        }
        args.extend(["--print-manifests", "--image", "example.com/kinformer:test"]);
        let out = Command::new(BIN)
            .args(&args)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let manifests: Value = serde_json::from_slice(&out.stdout).unwrap();
        let deployment = manifests["items"].as_array().unwrap().last().unwrap();
        assert_eq!(deployment["kind"], "Deployment");
        assert_eq!(deployment["spec"]["replicas"], 2);
        let mut child = Command::new(env.binaries().kubectl())
            .env("KUBECONFIG", env.kubeconfig_path())
            .args(["apply", "--dry-run=server", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&out.stdout).unwrap();
        let applied = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&applied.stdout);
        let stderr = String::from_utf8_lossy(&applied.stderr);
        assert!(applied.status.success(), "{command}: {stderr}");
        assert!(
            stdout.contains("deployment.apps/kinformer-") && stdout.contains("(server dry run)"),
            "{stdout}"
        );
        assert!(!stderr.contains("PodSecurity"), "{command}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_stdout_works_as_a_service_account_bound_to_exactly_what_it_prints_and_not_without_watch()
 {
    let env = TestEnv::shared().await.unwrap();
    for take_away in [None, Some(("watch", "pods"))] {
        let ns = env.create_namespace("rbac-pods").await.unwrap();
        let mut manifests = printed("pod-stdout", &ns);
        if let Some((verb, resource)) = take_away {
            manifests = rbac::without(manifests, verb, resource).unwrap();
        }
        let (child, lines) = start_as(env, "pod-stdout", &ns, &manifests, "0").await;
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-0"},
            "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]},
        }))
        .unwrap();
        Api::namespaced(env.client().unwrap(), &ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        let line = match take_away {
            None => wait_for_any(&lines, &["Sync/Add/Update for Pod web-0"]),
            Some(_) => wait_for_any(
                &lines,
                &[
                    "cannot watch resource \\\"pods\\\"",
                    "cannot watch resource \"pods\"",
                ],
            ),
        };
        stop(child);
        let log: Vec<String> = lines.iter().collect();
        if take_away.is_none() {
            assert!(
                !log.iter().any(|l| l.contains("forbidden")),
                "a request was forbidden:\n{}",
                log.join("\n")
            );
        } else {
            assert!(line.contains(ns.as_str()), "{line}");
        }
    }
}
