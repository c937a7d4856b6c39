//! Runs the example against a real kube-apiserver, as a ServiceAccount
//! bound to the rules it prints, and once without one of them.

use std::time::Duration;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kinformer_controllers::kube::api::{Api, Patch, PatchParams, PostParams};
use kinformer_envtest::{TestEnv, rbac};
use tokio::process::Child;

mod common;
use common::{configmap, deployment};

async fn hash_of(api: &Api<Deployment>, name: &str) -> Option<String> {
    let d = api.get(name).await.unwrap();
    d.spec
        .template
        .metadata?
        .annotations?
        .get("kinformer.dev/config-hash")
        .cloned()
}

/// Waits (up to 30 s) for the hash of `name` to be set and differ from `not`.
async fn new_hash(api: &Api<Deployment>, name: &str, not: Option<&str>) -> String {
    for _ in 0..300 {
        if let Some(h) = hash_of(api, name).await
            && Some(h.as_str()) != not
        {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the hash of {name} never moved from {not:?}");
}

const BIN: &str = env!("CARGO_BIN_EXE_configmap-hash");

/// The example, as the ServiceAccount `configmap-hash` of `ns` bound to
/// what its `--print-rbac ns` prints less `take_away` (verb, resource).
async fn as_printed(
    env: &TestEnv,
    ns: &str,
    take_away: Option<(&str, &str)>,
) -> (Child, rbac::Log) {
    let program = tokio::process::Command::new(BIN);
    let print = ["--print-rbac", ns];
    rbac::start_as_printed(env, program, &print, "configmap-hash", ns, take_away)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_change_or_arrival_changes_the_hash_of_the_deployments_using_it_not_without_patch()
 {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("cmhash").await.unwrap();
    let client = env.client().unwrap();
    let (cms, deploys): (Api<ConfigMap>, Api<Deployment>) = (
        Api::namespaced(client.clone(), &ns),
        Api::namespaced(client, &ns),
    );
    cms.create(&PostParams::default(), &configmap("settings", "1"))
        .await
        .unwrap();
    deploys
        .create(&PostParams::default(), &deployment("web", "settings"))
        .await
        .unwrap();
    deploys
        .create(&PostParams::default(), &deployment("late", "not-yet"))
        .await
        .unwrap();
    let (mut example, log) = as_printed(env, &ns, None).await;

    let first = new_hash(&deploys, "web", None).await;
    let patch = serde_json::json!({"data": {"k": "2"}});
    cms.patch("settings", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    let second = new_hash(&deploys, "web", Some(&first)).await;
    assert_ne!(first, second);

    // A ConfigMap that appears after its Deployment reaches it through the index.
    let before = new_hash(&deploys, "late", None).await;
    cms.create(&PostParams::default(), &configmap("not-yet", "1"))
        .await
        .unwrap();
    new_hash(&deploys, "late", Some(&before)).await;
    // An unrelated ConfigMap changes nothing.
    cms.create(&PostParams::default(), &configmap("unrelated", "1"))
        .await
        .unwrap();
    assert_eq!(
        hash_of(&deploys, "web").await.as_deref(),
        Some(second.as_str())
    );
    example.kill().await.unwrap();
    let refused: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| l.contains("forbidden"))
        .collect();
    assert!(
        refused.is_empty(),
        "refused under its own rules: {refused:?}"
    );

    // Without patch on deployments, the refusal is logged, naming it.
    let ns = env.create_namespace("cmhash-denied").await.unwrap();
    let deploys: Api<Deployment> = Api::namespaced(env.client().unwrap(), &ns);
    deploys
        .create(&PostParams::default(), &deployment("web", "settings"))
        .await
        .unwrap();
    let (_example, log) = as_printed(env, &ns, Some(("patch", "deployments"))).await;
    let refusal = log.wait_for_refusal("patch", "deployments").await.unwrap();
    assert!(refusal.contains(ns.as_str()), "{refusal}");
}
