//! Runs the example against a real kube-apiserver and reads what it prints.

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_controllers::kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kinformer_envtest::TestEnv;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

fn configmap(name: &str, app: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": {"app": app}}}))
        .unwrap()
}

async fn expect_line(lines: &mut Lines<BufReader<ChildStdout>>, want: &str) {
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("no line within 30 s; wanted {want:?}"))
        .unwrap()
        .unwrap_or_else(|| panic!("the example ended; wanted {want:?}"));
    assert_eq!(line, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_lists_then_follows_and_answers_from_its_cache() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("lister").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().unwrap(), &ns);
    api.create(&PostParams::default(), &configmap("a", "web"))
        .await
        .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_informer-lister"))
        .arg(&ns)
        .env("KUBECONFIG", env.kubeconfig_path())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    expect_line(
        &mut lines,
        &format!("listed {ns}/a (1 cached, 1 with app=web)"),
    )
    .await;
    expect_line(&mut lines, "synced: 1 cached, 1 with app=web").await;
    api.create(&PostParams::default(), &configmap("b", "db"))
        .await
        .unwrap();
    expect_line(
        &mut lines,
        &format!("added {ns}/b (2 cached, 1 with app=web)"),
    )
    .await;
    let relabel = serde_json::json!({"metadata": {"labels": {"app": "web"}}});
    api.patch("b", &PatchParams::default(), &Patch::Merge(relabel))
        .await
        .unwrap();
    expect_line(
        &mut lines,
        &format!("updated {ns}/b (2 cached, 2 with app=web)"),
    )
    .await;
    api.delete("a", &DeleteParams::default()).await.unwrap();
    expect_line(
        &mut lines,
        &format!("deleted {ns}/a (1 cached, 1 with app=web)"),
    )
    .await;
}
