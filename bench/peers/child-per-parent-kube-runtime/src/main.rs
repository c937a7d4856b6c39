//! child-per-parent with kube-runtime: bench/child-per-parent written for
//! kube-rs, for `cargo xtask bench --stale-reads`. Same children, same
//! annotation written by an update of the cached parent, same look again
//! 100 ms after a write, same output line. kube-runtime's `owns` keeps no
//! store of the children, so they are listed from the API server, as its
//! configmap-hash peer reads its ConfigMaps.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::{Client, Resource, ResourceExt};

const PARENT: &str = "bench.kinformer.dev/parent";
const CHILDREN: &str = "bench.kinformer.dev/children";

async fn reconcile(parent: Arc<Secret>, client: Arc<Client>) -> Result<Action, kube::Error> {
    let (ns, name) = (parent.namespace().unwrap_or_default(), parent.name_any());
    let configmaps = Api::<ConfigMap>::namespaced((*client).clone(), &ns);
    let mine = ListParams::default().labels(&format!("{PARENT}={name}"));
    let mut children = configmaps.list(&mine).await?.items.len();
    let mut wrote = false;
    if children == 0 {
        let child: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {
            "generateName": format!("{name}-"),
            "labels": {PARENT: name},
            "ownerReferences": [parent.controller_owner_ref(&())],
        }}))
        .map_err(kube::Error::SerdeError)?;
        let child = configmaps.create(&PostParams::default(), &child).await?;
        println!("{ns}/{name}: created child {}", child.name_any());
        (children, wrote) = (1, true);
    }
    let count = children.to_string();
    if parent.annotations().get(CHILDREN) != Some(&count) {
        let mut parent = (*parent).clone();
        parent.annotations_mut().insert(CHILDREN.into(), count);
        let secrets = Api::<Secret>::namespaced((*client).clone(), &ns);
        secrets
            .replace(&name, &PostParams::default(), &parent)
            .await?;
        wrote = true;
    }
    Ok(if wrote {
        Action::requeue(Duration::from_millis(100))
    } else {
        Action::await_change()
    })
}

fn error_policy(_: Arc<Secret>, _: &kube::Error, _: Arc<Client>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init(); // INFO and above
    let client = Client::try_default().await?;
    Controller::new(Api::<Secret>::all(client.clone()), Default::default())
        .owns(Api::<ConfigMap>::all(client.clone()), Default::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::new(client))
        .for_each(|_| std::future::ready(()))
        .await;
    Ok(())
}
