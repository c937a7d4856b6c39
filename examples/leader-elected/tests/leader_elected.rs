//! Two replicas of the example against a real kube-apiserver, as a
//! ServiceAccount bound to the rules the example prints: one leads, the
//! other takes over when the leader is stopped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_controllers::kube::api::{Api, PostParams};
use kinformer_envtest::{TestEnv, rbac};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Child;
use tokio::sync::mpsc::UnboundedReceiver;

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// 1 if the replica at `addr` leads, 0 if it stands by; None if it does not answer.
async fn leader_status(addr: SocketAddr) -> Option<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    let line = body
        .lines()
        .find(|l| l.starts_with("leader_election_master_status{name=\"leader-elected\"}"))?;
    line.rsplit(' ').next()?.parse().ok()
}

struct Replica {
    child: Child,
    addr: SocketAddr,
    lines: UnboundedReceiver<String>,
}

const BIN: &str = env!("CARGO_BIN_EXE_leader-elected");

/// A kubeconfig acting as the ServiceAccount `leader-elected` of `ns`,
/// bound to exactly what the example prints for it.
async fn least_privilege(env: &TestEnv, ns: &str) -> PathBuf {
    let args = [ns, "printer", "127.0.0.1:0", "--print-rbac", ns];
    let printed = rbac::printed(
        std::process::Command::new(BIN)
            .args(args)
            .env("KUBECONFIG", env.kubeconfig_path()),
    )
    .unwrap();
    env.bind(&printed.to_string(), ns, "leader-elected")
        .await
        .unwrap()
}

/// A replica acting with `kubeconfig`.
fn replica(kubeconfig: &Path, ns: &str, identity: &str) -> Replica {
    let addr = free_addr();
    let mut child = tokio::process::Command::new(BIN)
        .args([ns, identity, &addr.to_string()])
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = out.next_line().await {
            let _ = tx.send(line);
        }
    });
    Replica { child, addr, lines }
}

/// Waits (up to 30 s) until exactly one of `replicas` reports leading; its index.
async fn the_leader(replicas: &[&Replica]) -> usize {
    for _ in 0..300 {
        let mut statuses = Vec::new();
        for r in replicas {
            statuses.push(leader_status(r.addr).await);
        }
        if statuses.iter().all(Option::is_some)
            && statuses.iter().filter(|s| **s == Some(1)).count() == 1
        {
            return statuses.iter().position(|s| *s == Some(1)).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no single leader within 30 s");
}

async fn expect_line(replica: &mut Replica, want: &str) {
    let line = tokio::time::timeout(Duration::from_secs(30), replica.lines.recv())
        .await
        .unwrap_or_else(|_| panic!("no line within 30 s; wanted {want:?}"))
        .unwrap_or_else(|| panic!("the replica ended; wanted {want:?}"));
    assert_eq!(line, want);
}

fn configmap(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_and_the_other_takes_over_when_it_stops() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("elected").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().unwrap(), &ns);
    let kubeconfig = least_privilege(env, &ns).await;
    let mut replicas = [
        replica(&kubeconfig, &ns, "one"),
        replica(&kubeconfig, &ns, "two"),
    ];
    let leader = the_leader(&[&replicas[0], &replicas[1]]).await;
    let standby = 1 - leader;
    let names = ["one", "two"];
    api.create(&PostParams::default(), &configmap("first"))
        .await
        .unwrap();
    expect_line(
        &mut replicas[leader],
        &format!("{} reconciled first", names[leader]),
    )
    .await;

    assert!(
        replicas[standby].lines.try_recv().is_err(),
        "the standby reconciled while not leading"
    );
    // SIGTERM: the leader drains, releases the lease and exits 0.
    let pid = replicas[leader].child.id().unwrap() as i32;
    // SAFETY: kill(2) on our own child process.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(replicas[leader].child.wait().await.unwrap().success());
    assert_eq!(the_leader(&[&replicas[standby]]).await, 0);
    // The new leader reconciles everything it has cached, then new objects.
    expect_line(
        &mut replicas[standby],
        &format!("{} reconciled first", names[standby]),
    )
    .await;
    api.create(&PostParams::default(), &configmap("second"))
        .await
        .unwrap();
    expect_line(
        &mut replicas[standby],
        &format!("{} reconciled second", names[standby]),
    )
    .await;
    // Each object once: nothing was reconciled twice or before leading.
    assert!(replicas[standby].lines.try_recv().is_err());
}
