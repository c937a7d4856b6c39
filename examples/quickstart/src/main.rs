//! The README's controller: each ConfigMap labelled `mirror=yes` gets a
//! Secret of the same name holding its data, owned by it. Change the
//! ConfigMap and the Secret follows; delete the Secret and it comes back;
//! delete the ConfigMap and the garbage collector takes the Secret.

use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_controllers::kube::{Client, Resource, ResourceExt};
use kinformer_controllers::{Action, Lookup, Manager, ManagerOptions, ReconcileError, apply, rbac};

async fn reconcile(cm: Lookup<ConfigMap>, client: Arc<Client>) -> Result<Action, ReconcileError> {
    let Lookup::Found(cm) = cm else {
        return Ok(Action::Done); // deleted: its Secret goes with it
    };
    if cm.labels().get("mirror").map(String::as_str) != Some("yes") {
        return Ok(Action::Done);
    }
    let (name, ns) = (cm.name_any(), cm.namespace().unwrap_or_default());
    // `data`, not `stringData`: applied, a key the ConfigMap drops goes too.
    let data = cm.data.iter().flatten();
    let data = data.map(|(k, v)| (k.clone(), ByteString(v.clone().into())));
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            owner_references: cm.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..Default::default()
        },
        data: Some(data.collect()),
        ..Default::default()
    };
    apply(&client, "quickstart", &secret).await?; // server-side apply, forced
    tracing::info!("mirrored {ns}/{name}");
    Ok(Action::Done)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kinformer_controllers::logging::init()?; // INFO and above, to stderr
    let mut manager = Manager::new(Client::try_default().await?, ManagerOptions::new())?;
    let controller = manager
        .controller::<ConfigMap>("quickstart")
        .owns::<Secret>()
        .writes::<Secret>(&["create", "patch"]) // for --print-rbac NAMESPACE
        .reconcile(Arc::new(manager.client()), reconcile)?;
    manager.add(controller);
    if rbac::print_if_asked("quickstart", || manager.permissions())? {
        return Ok(());
    }
    Ok(manager.run_until_signal().await?)
}
