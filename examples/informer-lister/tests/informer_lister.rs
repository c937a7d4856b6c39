//! Runs the example against a real kube-apiserver, as a ServiceAccount
//! bound to the rules it prints, and reads what it prints.

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_controllers::kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kinformer_envtest::{TestEnv, rbac};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

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

const BIN: &str = env!("CARGO_BIN_EXE_informer-lister");

/// The example over `ns`, as the ServiceAccount its `--print-rbac ns`
/// prints, bound to what it prints less `take_away` (verb, resource).
async fn as_printed(
    env: &TestEnv,
    ns: &str,
    take_away: Option<(&str, &str)>,
) -> (Child, rbac::Log) {
    let mut program = tokio::process::Command::new(BIN);
    program.arg(ns).stdout(Stdio::piped());
    let print = [ns, "--print-rbac", ns];
    let account = "informer-lister";
    rbac::start_as_printed(env, program, &print, account, ns, take_away)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_lists_then_follows_and_answers_from_its_cache() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("lister").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().unwrap(), &ns);
    api.create(&PostParams::default(), &configmap("a", "web"))
        .await
        .unwrap();
    let (mut child, log) = as_printed(env, &ns, None).await;
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
    let refused: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| l.contains("forbidden"))
        .collect();
    assert!(
        refused.is_empty(),
        "refused under its own rules: {refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_watch_on_configmaps_it_logs_the_refusal_naming_it() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("lister-denied").await.unwrap();
    let (_child, log) = as_printed(env, &ns, Some(("watch", "configmaps"))).await;
    let refusal = log.wait_for_refusal("watch", "configmaps").await.unwrap();
    assert!(refusal.contains(ns.as_str()), "{refusal}");
}
