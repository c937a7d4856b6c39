//! The control plane's kube-controller-manager: the garbage collector
//! collects owned objects when their owner goes (background, foreground,
//! orphan; an owner that is a custom resource), and the namespace
//! controller empties and removes a deleted namespace.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kinformer_envtest::{TestEnv, TestEnvOptions, TestNamespace};
use kube_client::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube_client::core::ObjectMeta;

/// Polls `check` every 100 ms until it holds; fails naming `what` after
/// `limit`.
async fn eventually(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let start = std::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const MINUTE: Duration = Duration::from_secs(60);

fn config_map(name: &str, owner: Option<OwnerReference>, finalizer: bool) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: owner.map(|o| vec![o]),
            finalizers: finalizer.then(|| vec!["test.kinformer.dev/hold".to_owned()]),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn owned_by(kind: &str, api_version: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        block_owner_deletion: Some(true),
        controller: Some(true),
    }
}

/// A parent ConfigMap and a child it owns (the child holding a finalizer
/// if `held`), in a namespace of their own.
async fn parent_and_child(held: bool) -> (Api<ConfigMap>, ConfigMap, TestNamespace) {
    let env = TestEnv::shared().await.unwrap();
    assert!(env.has_controller_manager());
    let ns = env.create_namespace("gc").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().unwrap(), &ns);
    let parent = api
        .create(&PostParams::default(), &config_map("parent", None, false))
        .await
        .unwrap();
    let uid = parent.metadata.uid.clone().unwrap();
    let owner = owned_by("ConfigMap", "v1", "parent", &uid);
    api.create(
        &PostParams::default(),
        &config_map("child", Some(owner), held),
    )
    .await
    .unwrap();
    (api, parent, ns)
}

#[tokio::test]
async fn a_child_is_collected_after_its_owner_is_deleted_in_the_background() {
    let (api, _, _ns) = parent_and_child(false).await;
    api.delete("parent", &DeleteParams::background())
        .await
        .unwrap();
    eventually("the child collected", MINUTE, async || {
        api.get_opt("child").await.unwrap().is_none()
    })
    .await;
}

#[tokio::test]
async fn a_foreground_deletion_waits_for_the_child_that_blocks_it() {
    let (api, _, _ns) = parent_and_child(true).await;
    api.delete("parent", &DeleteParams::foreground())
        .await
        .unwrap();
    // The collector deletes the child, which its finalizer holds; the
    // parent waits for it (blockOwnerDeletion).
    eventually("the child being deleted", MINUTE, async || {
        let child = api.get("child").await.unwrap();
        child.metadata.deletion_timestamp.is_some()
    })
    .await;
    let parent = api.get("parent").await.unwrap();
    assert!(
        parent
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"foregroundDeletion".to_owned())
    );
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    api.patch("child", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    eventually("the parent gone once its child is", MINUTE, async || {
        api.get_opt("parent").await.unwrap().is_none()
    })
    .await;
    assert!(api.get_opt("child").await.unwrap().is_none());
}

#[tokio::test]
async fn an_orphaning_deletion_leaves_the_child_without_its_owner_reference() {
    let (api, _, _ns) = parent_and_child(false).await;
    api.delete("parent", &DeleteParams::orphan()).await.unwrap();
    eventually("the parent gone", MINUTE, async || {
        api.get_opt("parent").await.unwrap().is_none()
    })
    .await;
    let child = api.get("child").await.unwrap();
    assert_eq!(child.metadata.owner_references.unwrap_or_default(), []);
}

#[tokio::test]
async fn a_child_of_a_custom_resource_is_collected_after_it() {
    let env = TestEnv::shared().await.unwrap();
    let client = env.client().unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "owners.gc.kinformer.dev"},
        "spec": {
            "group": "gc.kinformer.dev",
            "names": {"kind": "Owner", "plural": "owners", "singular": "owner", "listKind": "OwnerList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap();
    if crds
        .get_opt("owners.gc.kinformer.dev")
        .await
        .unwrap()
        .is_none()
    {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let ns = env.create_namespace("gc-cr").await.unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gc.kinformer.dev", "v1", "Owner"),
        "owners",
    );
    let owners: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    let mut owner = DynamicObject::new("owner", &resource);
    owner.data = serde_json::json!({});
    // Created as soon as the CRD serves it.
    let mut created = None;
    eventually("the Owner created", MINUTE, async || {
        created = owners.create(&PostParams::default(), &owner).await.ok();
        created.is_some()
    })
    .await;
    let uid = created.unwrap().metadata.uid.unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client, &ns);
    let reference = owned_by("Owner", "gc.kinformer.dev/v1", "owner", &uid);
    configmaps
        .create(
            &PostParams::default(),
            &config_map("child", Some(reference), false),
        )
        .await
        .unwrap();
    owners
        .delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    // The collector reads discovery every 30 s: a kind new to it may wait
    // that long.
    eventually("the Owner's child collected", 2 * MINUTE, async || {
        configmaps.get_opt("child").await.unwrap().is_none()
    })
    .await;
}

#[tokio::test]
async fn a_deleted_namespace_is_emptied_and_removed() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("goes").await.unwrap();
    let client = env.client().unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    configmaps
        .create(&PostParams::default(), &config_map("content", None, false))
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(client);
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the namespace removed", MINUTE, async || {
        namespaces.get_opt(&ns).await.unwrap().is_none()
    })
    .await;
}

/// A test's namespace goes when the test drops it, content and all; one
/// kept does not.
#[tokio::test]
async fn a_dropped_test_namespace_is_deleted_and_a_kept_one_is_not() {
    let env = TestEnv::shared().await.unwrap();
    let client = env.client().unwrap();
    let (dropped, kept) = (
        env.create_namespace("dropped").await.unwrap(),
        env.create_namespace("kept").await.unwrap(),
    );
    Api::<ConfigMap>::namespaced(client.clone(), &dropped)
        .create(&PostParams::default(), &config_map("content", None, false))
        .await
        .unwrap();
    let (dropped_name, kept) = (dropped.to_string(), kept.keep());
    drop(dropped);
    let namespaces: Api<Namespace> = Api::all(client);
    eventually("the dropped namespace removed", MINUTE, async || {
        namespaces.get_opt(&dropped_name).await.unwrap().is_none()
    })
    .await;
    let kept = namespaces.get(&kept).await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_none());
}

/// The Lease that says it runs is there on the shared control plane.
#[tokio::test]
async fn the_controller_manager_holds_its_lease() {
    let env = TestEnv::shared().await.unwrap();
    assert!(env.controller_manager_pid().is_some());
    let leases: Api<Lease> = Api::namespaced(env.client().unwrap(), "kube-system");
    let lease = leases.get("kube-controller-manager").await.unwrap();
    assert!(lease.spec.and_then(|s| s.holder_identity).is_some());
}

#[tokio::test]
async fn without_the_controller_manager_a_deleted_namespace_stays_terminating() {
    let env = TestEnv::start_with(TestEnvOptions::new().without_controller_manager())
        .await
        .unwrap();
    assert!(!env.has_controller_manager());
    assert_eq!(env.controller_manager_pid(), None);
    // No kube-controller-manager ever ran on this control plane: it would
    // have taken its Lease.
    let leases: Api<Lease> = Api::namespaced(env.client().unwrap(), "kube-system");
    assert!(
        leases
            .get_opt("kube-controller-manager")
            .await
            .unwrap()
            .is_none()
    );
    let ns = env.create_namespace("stays").await.unwrap();
    let namespaces: Api<Namespace> = Api::all(env.client().unwrap());
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    let phase = namespaces.get(&ns).await.unwrap().status.unwrap().phase;
    assert_eq!(phase.as_deref(), Some("Terminating"));
    env.stop();
}
