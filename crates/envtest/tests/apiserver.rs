//! The control plane behaves as a real Kubernetes API server: CRUD, paged
//! lists, optimistic concurrency, watches with bookmarks, and 410 Gone after
//! an etcd compaction. All through kube-client with k8s-openapi v1_37 types.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kinformer_envtest::{EnvtestError, TestEnv, TestEnvOptions};
use kube_client::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube_client::core::ObjectMeta;

fn config_map(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some([("v".to_string(), value.to_string())].into()),
        ..ConfigMap::default()
    }
}

async fn shared_ns(prefix: &str) -> (kube_client::Client, kinformer_envtest::TestNamespace) {
    let env = TestEnv::shared().await.expect("control plane starts");
    let ns = env.create_namespace(prefix).await.unwrap();
    (env.client().unwrap(), ns)
}

#[tokio::test]
async fn create_get_and_delete_round_trip() {
    let (client, ns) = shared_ns("crud").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let created = api
        .create(&PostParams::default(), &config_map("a", "1"))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    let got = api.get("a").await.unwrap();
    assert_eq!(got.data.unwrap()["v"], "1");
    api.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("a").await.unwrap().is_none());
}

#[tokio::test]
async fn a_pod_is_accepted_without_nodes_and_stays_pending() {
    let (client, ns) = shared_ns("pod").await;
    let api: Api<Pod> = Api::namespaced(client, &ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    let got = api.get("p").await.unwrap();
    assert_eq!(got.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
}

#[tokio::test]
async fn list_pages_with_limit_and_continue() {
    let (client, ns) = shared_ns("page").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    for i in 0..25 {
        api.create(
            &PostParams::default(),
            &config_map(&format!("cm-{i:02}"), "x"),
        )
        .await
        .unwrap();
    }
    let mut names = Vec::new();
    let mut pages = 0;
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(10);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 10);
        names.extend(page.items.into_iter().map(|c| c.metadata.name.unwrap()));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names.len(), 25);
}

#[tokio::test]
async fn update_with_a_stale_resource_version_is_a_409_conflict() {
    let (client, ns) = shared_ns("conflict").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let v1 = api
        .create(&PostParams::default(), &config_map("c", "1"))
        .await
        .unwrap();
    let mut v2 = v1.clone();
    v2.data = Some([("v".to_string(), "2".to_string())].into());
    api.replace("c", &PostParams::default(), &v2).await.unwrap();
    let mut stale = v1;
    stale.data = Some([("v".to_string(), "3".to_string())].into());
    match api.replace("c", &PostParams::default(), &stale).await {
        Err(kube_client::Error::Api(status)) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("expected 409 Conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_delivers_added_modified_deleted_and_bookmarks() {
    let (client, ns) = shared_ns("watch").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    // The server sends bookmarks about once a minute; a short timeout makes
    // it send one as the watch ends.
    let wp = WatchParams::default().timeout(8);
    let mut stream = api.watch(&wp, &rv).await.unwrap().boxed();

    let writer = {
        let api = api.clone();
        tokio::spawn(async move {
            let created = api
                .create(&PostParams::default(), &config_map("w", "1"))
                .await
                .unwrap();
            let mut changed = created.clone();
            changed.data = Some([("v".to_string(), "2".to_string())].into());
            api.replace("w", &PostParams::default(), &changed)
                .await
                .unwrap();
            api.delete("w", &DeleteParams::default()).await.unwrap();
        })
    };
    let mut kinds = Vec::new();
    let mut bookmark_rv = None;
    while let Some(event) = tokio::time::timeout(Duration::from_secs(30), stream.try_next())
        .await
        .expect("watch stalled")
        .unwrap()
    {
        match event {
            WatchEvent::Added(_) => kinds.push("ADDED"),
            WatchEvent::Modified(_) => kinds.push("MODIFIED"),
            WatchEvent::Deleted(_) => kinds.push("DELETED"),
            WatchEvent::Bookmark(b) => bookmark_rv = Some(b.metadata.resource_version),
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    }
    writer.await.unwrap();
    assert_eq!(kinds, ["ADDED", "MODIFIED", "DELETED"]);
    let bookmark_rv: u64 = bookmark_rv
        .expect("no BOOKMARK before the watch ended")
        .parse()
        .unwrap();
    assert!(bookmark_rv >= rv.parse::<u64>().unwrap());
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_is_410_gone() {
    // An env of its own (compaction affects every watcher), reading from etcd:
    // the watch cache would otherwise keep serving the compacted versions.
    let env = TestEnv::start_with(TestEnvOptions::new().without_watch_cache())
        .await
        .unwrap();
    let ns = env.create_namespace("gone").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().unwrap(), &ns);
    let old_rv = api
        .create(&PostParams::default(), &config_map("g0", "0"))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    // Move well past it, so the watch cache no longer holds the old version
    // either, then compact etcd.
    for i in 1..=120 {
        api.create(&PostParams::default(), &config_map(&format!("g{i}"), "x"))
            .await
            .unwrap();
    }
    let compacted = env.compact_etcd().await.unwrap();
    assert!(compacted > old_rv.parse::<i64>().unwrap());

    let mut gone = false;
    for _ in 0..20 {
        let mut stream = api
            .watch(&WatchParams::default().timeout(2), &old_rv)
            .await
            .unwrap()
            .boxed();
        match stream.next().await {
            Some(Ok(WatchEvent::Error(e))) if e.code == 410 => {
                gone = true;
                break;
            }
            Some(Err(kube_client::Error::Api(e))) if e.code == 410 => {
                gone = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    assert!(
        gone,
        "no 410 Gone for resourceVersion {old_rv} after compacting at {compacted}"
    );

    // A paged list's continue token from before the compaction expires too.
    let first = api.list(&ListParams::default().limit(5)).await.unwrap();
    let token = first.metadata.continue_.unwrap();
    for i in 0..120 {
        api.create(&PostParams::default(), &config_map(&format!("h{i}"), "x"))
            .await
            .unwrap();
    }
    env.compact_etcd().await.unwrap();
    match api
        .list(&ListParams::default().limit(5).continue_token(&token))
        .await
    {
        Err(kube_client::Error::Api(e)) => assert_eq!(e.code, 410, "{e:?}"),
        other => panic!("expected 410 for an expired continue token, got {other:?}"),
    }
    env.stop();
}

#[tokio::test]
async fn stop_leaves_no_process_and_no_files_behind() {
    let env = TestEnv::start().await.unwrap();
    let (etcd, apiserver) = env.pids();
    let (etcd, apiserver) = (etcd.unwrap(), apiserver.unwrap());
    let controllers = env.controller_manager_pid().unwrap();
    let dir = env.dir().to_owned();
    let (etcd_peak, api_peak) = env.peak_memory_bytes();
    assert!(etcd_peak.unwrap() > 1 << 20 && api_peak.unwrap() > 1 << 20);
    let kubectl = std::process::Command::new(env.binaries().kubectl())
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(["get", "ns", "default", "-o", "name"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&kubectl.stdout).trim(),
        "namespace/default"
    );
    env.stop();
    for pid in [etcd, apiserver, controllers] {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} survived"
        );
    }
    assert!(!dir.exists());
}

#[tokio::test]
async fn a_bad_flag_makes_the_server_exit_early_with_its_log_in_the_error() {
    let err = TestEnv::start_with(TestEnvOptions::new().apiserver_arg("--no-such-flag=1"))
        .await
        .unwrap_err();
    match &err {
        EnvtestError::ExitedEarly {
            component, tail, ..
        } => {
            assert_eq!(*component, "kube-apiserver");
            assert!(tail.contains("no-such-flag"), "{tail}");
        }
        other => panic!("expected ExitedEarly, got {other}"),
    }
}

#[tokio::test]
async fn a_port_in_use_is_reported_as_such() {
    // An occupied --secure-port (the later flag wins over the chosen port).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let err =
        TestEnv::start_with(TestEnvOptions::new().apiserver_arg(format!("--secure-port={port}")))
            .await
            .unwrap_err();
    assert!(
        matches!(
            err,
            EnvtestError::PortInUse {
                component: "kube-apiserver",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_kubeconfig_via_a_proxy_reaches_the_server_through_it() {
    let env = TestEnv::shared().await.expect("control plane starts");
    let proxy = kinformer_envtest::Proxy::start(env.api_port())
        .await
        .unwrap();
    let kubeconfig = env.kubeconfig_via(proxy.port()).unwrap();
    assert!(kubeconfig.starts_with(env.dir()));
    // On a thread of its own: this runtime's one thread serves the proxy.
    let mut kubectl = std::process::Command::new(env.binaries().kubectl());
    kubectl
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "ns", "default", "-o", "name"]);
    let kubectl = tokio::task::spawn_blocking(move || kubectl.output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&kubectl.stdout).trim(),
        "namespace/default",
        "{}",
        String::from_utf8_lossy(&kubectl.stderr)
    );
    assert!(
        proxy.accepted() >= 1,
        "kubectl did not go through the proxy"
    );
}

/// Run alone, in a process of its own, by the test below: keeps a control
/// plane for the process (the shared one, or one of its own) and says
/// where its files and processes are.
#[tokio::test]
#[ignore = "run by a_control_plane_kept_for_the_process_is_torn_down_at_exit"]
async fn keeps_a_control_plane_until_exit() {
    let env = match std::env::var("KINFORMER_ENVTEST_KEEP").as_deref() {
        Ok("shared") => TestEnv::shared().await.unwrap(),
        _ => TestEnv::start().await.unwrap().into_static(),
    };
    let (etcd, apiserver) = env.pids();
    println!(
        "kept: {} {} {} {}",
        env.dir().display(),
        etcd.unwrap(),
        apiserver.unwrap(),
        env.controller_manager_pid().unwrap()
    );
}

#[test]
fn a_control_plane_kept_for_the_process_is_torn_down_at_exit() {
    for keep in ["shared", "own"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "keeps_a_control_plane_until_exit"])
            .arg("--nocapture")
            .env("KINFORMER_ENVTEST_KEEP", keep)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{keep}: {stdout}");
        let kept = stdout
            .lines()
            .find_map(|l| l.strip_prefix("kept: "))
            .unwrap_or_else(|| panic!("{keep}: no kept line in {stdout}"));
        let mut kept = kept.split(' ');
        let dir = std::path::PathBuf::from(kept.next().unwrap());
        assert!(!dir.exists(), "{keep}: {} left behind", dir.display());
        for pid in kept {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"));
            // Gone, or a zombie its new parent has yet to reap.
            assert!(
                status.is_err() || status.unwrap().contains("State:\tZ"),
                "{keep}: pid {pid} survived"
            );
        }
    }
}

#[tokio::test]
async fn the_directory_of_a_control_plane_whose_process_is_gone_is_removed() {
    // A process that ends at once: its pid is free afterwards.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    let abandoned = tempfile::Builder::new()
        .prefix("kinformer-envtest-")
        .tempdir()
        .unwrap()
        .keep();
    std::fs::write(abandoned.join("owner.pid"), pid.to_string()).unwrap();
    std::fs::create_dir_all(abandoned.join("etcd/member")).unwrap();
    // One named by no owner, and one owned by this (live) process.
    let unowned = tempfile::Builder::new()
        .prefix("kinformer-envtest-")
        .tempdir()
        .unwrap();
    let live = tempfile::Builder::new()
        .prefix("kinformer-envtest-")
        .tempdir()
        .unwrap();
    std::fs::write(
        live.path().join("owner.pid"),
        std::process::id().to_string(),
    )
    .unwrap();
    let env = TestEnv::start().await.unwrap();
    assert!(!abandoned.exists(), "{} left behind", abandoned.display());
    assert!(unowned.path().exists() && live.path().exists());
    env.stop();
}
