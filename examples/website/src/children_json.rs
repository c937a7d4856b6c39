//! A Website's Deployment and Service written with `json!`: the variant of
//! children.rs built with the feature `json`.

use super::*; // variant switch
use kinformer_controllers::kube::api::{Patch, PatchParams};
use serde_json::json;

pub async fn serve(website: &Website, client: &Client) -> Result<Action, ReconcileError> {
    let (name, ns) = (website.name_any(), website.namespace().unwrap_or_default());
    let owner = [website.controller_owner_ref(&())];
    let labels = json!({ "app": name });
    let params = PatchParams::apply(MANAGER).force();
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": name, "ownerReferences": owner },
        "spec": {
            "replicas": website.spec.replicas,
            "selector": { "matchLabels": labels },
            "template": {
                "metadata": { "labels": labels },
                "spec": { "containers": [{
                    "name": "web",
                    "image": website.spec.image,
                    "ports": [{ "containerPort": 80 }],
                    "env": [{ "name": "WEBSITE_HOST", "value": website.spec.host }],
                }] },
            },
        },
    });
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
        .patch(&name, &params, &Patch::Apply(deployment))
        .await?;
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": name, "ownerReferences": owner },
        "spec": { "selector": labels, "ports": [{ "port": 80 }] },
    });
    Api::<Service>::namespaced(client.clone(), &ns)
        .patch(&name, &params, &Patch::Apply(service))
        .await?;
    let ready_replicas = deployment
        .status
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    apply_status(client, MANAGER, website, &WebsiteStatus { ready_replicas }).await?;
    Ok(Action::Done)
}
