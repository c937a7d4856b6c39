//! A controller that owns children, run as a ServiceAccount bound to
//! exactly what its Manager's `permissions()` give, on a server that
//! enforces ownerReferences (`OwnerReferencesPermissionEnforcement`, on in
//! OpenShift and in the envtest control plane): it creates children that
//! block their owner's deletion, and adopts one that exists.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kinformer_controllers::kube::{Resource, ResourceExt};
use kinformer_controllers::{Action, Lookup, Manager, ManagerOptions, ReconcileError, apply};
use kinformer_envtest::TestEnv;
use kinformer_informer::{CancellationToken, SharedInformerFactory};
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use parking_lot::Mutex;

mod common;
use common::{client_from, config_map};

/// The last error a reconcile returned, for the failure message.
type LastError = Arc<Mutex<Option<String>>>;

/// Applies the Secret of each ConfigMap, owned by it as controller-runtime's
/// `SetControllerReference` owns: a controller ownerReference that blocks
/// the owner's deletion.
async fn reconcile(
    cm: Lookup<ConfigMap>,
    ctx: Arc<(Client, LastError)>,
) -> Result<Action, ReconcileError> {
    let Lookup::Found(cm) = cm else {
        return Ok(Action::Done);
    };
    let mut owner = cm.controller_owner_ref(&()).ok_or_else(|| {
        ReconcileError::from(format!("ConfigMap {} has no uid", cm.name_any()).as_str())
    })?;
    owner.block_owner_deletion = Some(true);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": cm.name_any(),
            "namespace": cm.namespace(),
            "ownerReferences": [owner],
        },
    }))?;
    if let Err(e) = apply(&ctx.0, "owner-references-test", &secret).await {
        *ctx.1.lock() = Some(e.to_string());
        return Err(e.into());
    }
    Ok(Action::Done)
}

/// A Manager over `ns` whose ConfigMap controller owns Secrets.
fn manager(client: &Client, ns: &str, last_error: &LastError) -> Manager {
    let factory = SharedInformerFactory::new(client.clone()).namespace(ns);
    let mut manager =
        Manager::with_factory(factory, client.clone(), ManagerOptions::new()).unwrap();
    let controller = manager
        .controller::<ConfigMap>("owner")
        .owns::<Secret>()
        .writes::<Secret>(&["create", "patch"])
        .reconcile(
            Arc::new((manager.client(), Arc::clone(last_error))),
            reconcile,
        )
        .unwrap();
    manager.add(controller);
    manager
}

/// Whether the Secret `name` is owned by the ConfigMap of uid `owner`,
/// blocking its deletion.
async fn owned(secrets: &Api<Secret>, name: &str, owner: &str) -> bool {
    let Some(secret) = secrets.get_opt(name).await.unwrap() else {
        return false;
    };
    secret.owner_references().iter().any(|r| {
        r.uid == owner && r.controller == Some(true) && r.block_owner_deletion == Some(true)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_bound_to_its_permissions_creates_children_blocking_deletion_and_adopts_one() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("owner-references").await.unwrap();
    let admin = env.client().unwrap();
    let last_error = LastError::default();
    let printed = manager(&admin, &ns, &last_error)
        .permissions()
        .manifests("owner", &ns, "owner");
    let kubeconfig = env.bind(&printed.to_string(), &ns, "owner").await.unwrap();
    let manager = manager(&client_from(&kubeconfig).await, &ns, &last_error);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(manager.run(shutdown.clone()));

    let pp = PostParams::default();
    let (configmaps, secrets) = (
        Api::<ConfigMap>::namespaced(admin.clone(), &ns),
        Api::<Secret>::namespaced(admin, &ns),
    );
    // An orphan, there before its owner: adopting it is an update that
    // adds an ownerReference.
    let orphan: Secret =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "adopted"}})).unwrap();
    let orphan = secrets.create(&pp, &orphan).await.unwrap();
    for name in ["created", "adopted"] {
        let cm = configmaps.create(&pp, &config_map(name)).await.unwrap();
        let uid = cm.uid().unwrap();
        let mut done = false;
        for _ in 0..300 {
            done = owned(&secrets, name, &uid).await;
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            done,
            "Secret {name} never owned by its ConfigMap; the last reconcile error: {:?}",
            last_error.lock()
        );
    }
    let adopted = secrets.get("adopted").await.unwrap();
    assert_eq!(adopted.uid(), orphan.uid(), "adopted, not replaced");
    shutdown.cancel();
    running.await.unwrap().unwrap();
}
