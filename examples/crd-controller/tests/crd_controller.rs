//! The CRD controller end to end against a real kube-apiserver, as a
//! ServiceAccount bound to the rules it prints: create, repair, update and
//! delete a Greeting; then without each write it declares.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer_envtest::{TestEnv, rbac};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use tokio::process::Child;

/// Waits (up to 30 s) until `check` returns something.
async fn until<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..300 {
        if let Some(found) = check().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

fn greeting(name: &str, message: &str) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "kinformer.dev/v1", "kind": "Greeting",
        "metadata": {"name": name}, "spec": {"message": message}
    }))
    .unwrap()
}

const BIN: &str = env!("CARGO_BIN_EXE_crd-controller");

/// The example, as the ServiceAccount `crd-controller` of `ns` bound to
/// what its `--print-rbac ns` prints less `take_away` (verb, resource).
async fn as_printed(
    env: &TestEnv,
    ns: &str,
    take_away: Option<(&str, &str)>,
) -> (Child, rbac::Log) {
    let program = tokio::process::Command::new(BIN);
    let print = ["--print-rbac", ns];
    rbac::start_as_printed(env, program, &print, "crd-controller", ns, take_away)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greeting_gets_its_configmap_and_status_keeps_it_and_cleans_it_up() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("crd").await.unwrap();
    let client = env.client().unwrap();
    let (mut controller, log) = as_printed(env, &ns, None).await;
    // The controller installs its CRD.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    until("the CRD to be Established", async || {
        let crd = crds.get_opt("greetings.kinformer.dev").await.ok()??;
        let conditions = crd.status?.conditions?;
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("kinformer.dev", "v1", "Greeting"));
    let greetings: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let configmaps: Api<ConfigMap> = Api::namespaced(client, &ns);
    let created = until("the Greeting to be accepted", async || {
        greetings
            .create(&PostParams::default(), &greeting("hello", "hi"))
            .await
            .ok()
    })
    .await;

    let message = async |configmaps: &Api<ConfigMap>| {
        let cm = configmaps.get_opt("hello-greeting").await.ok()??;
        cm.data?.get("message").cloned()
    };
    let cm = until("the ConfigMap", async || {
        configmaps.get_opt("hello-greeting").await.ok()?
    })
    .await;
    assert_eq!(message(&configmaps).await.as_deref(), Some("hi"));
    let owner = &cm.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Greeting", Some(true))
    );
    assert_eq!(Some(&owner.uid), created.metadata.uid.as_ref());
    let status = until("the status", async || {
        greetings
            .get("hello")
            .await
            .ok()?
            .data
            .get("status")
            .cloned()
    })
    .await;
    assert_eq!(
        status,
        serde_json::json!({"configMap": "hello-greeting", "observedGeneration": 1})
    );
    let finalizers = greetings.get("hello").await.unwrap().metadata.finalizers;
    assert_eq!(
        finalizers,
        Some(vec!["kinformer.dev/greeting-cleanup".to_owned()])
    );

    // Deleting the owned ConfigMap brings it back.
    let uid = cm.metadata.uid.clone();
    configmaps
        .delete("hello-greeting", &DeleteParams::default())
        .await
        .unwrap();
    until("the ConfigMap to come back", async || {
        let cm = configmaps.get_opt("hello-greeting").await.ok()??;
        (cm.metadata.uid != uid).then_some(())
    })
    .await;

    // A new message reaches the ConfigMap and the status.
    let patch = serde_json::json!({"spec": {"message": "hello again"}});
    greetings
        .patch("hello", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    until("the new message", async || {
        (message(&configmaps).await? == "hello again").then_some(())
    })
    .await;
    until("observedGeneration 2", async || {
        let status = greetings
            .get("hello")
            .await
            .ok()?
            .data
            .get("status")
            .cloned()?;
        (status["observedGeneration"] == 2).then_some(())
    })
    .await;

    // Deleting the Greeting runs the cleanup, then the server removes it.
    // The test holds it too: while it is there, the control plane's
    // garbage collector leaves its ConfigMap alone, so a ConfigMap gone
    // before is the cleanup's doing.
    const HOLD: &str = "test.kinformer.dev/hold";
    let hold =
        serde_json::json!({"metadata": {"finalizers": ["kinformer.dev/greeting-cleanup", HOLD]}});
    greetings
        .patch("hello", &PatchParams::default(), &Patch::Merge(hold))
        .await
        .unwrap();
    greetings
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    until("the cleanup to delete the ConfigMap", async || {
        configmaps
            .get_opt("hello-greeting")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    until("the controller to remove its finalizer", async || {
        let finalizers = greetings.get("hello").await.ok()?.metadata.finalizers?;
        (finalizers == [HOLD]).then_some(())
    })
    .await;
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    greetings
        .patch("hello", &PatchParams::default(), &Patch::Merge(release))
        .await
        .unwrap();
    until("the Greeting to be gone", async || {
        greetings
            .get_opt("hello")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    controller.kill().await.unwrap();
    let refused: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| l.contains("forbidden"))
        .collect();
    assert!(
        refused.is_empty(),
        "refused under its own rules: {refused:?}"
    );

    // Each write it declares, taken away alone, is named in its log.
    for (verb, resource) in [
        ("patch", "customresourcedefinitions"),
        ("patch", "greetings"),
        ("patch", "greetings/status"),
    ] {
        let ns = env.create_namespace("crd-denied").await.unwrap();
        let (mut controller, log) = as_printed(env, &ns, Some((verb, resource))).await;
        let greetings: Api<DynamicObject> = Api::namespaced_with(env.client().unwrap(), &ns, &ar);
        greetings
            .create(&PostParams::default(), &greeting("hello", "hi"))
            .await
            .unwrap();
        log.wait_for_refusal(verb, resource).await.unwrap();
        controller.kill().await.unwrap();
    }
}
