//! website: a custom resource, `Website` (example.kinformer.dev/v1), served
//! by a Deployment and a Service that it owns, written by server-side apply;
//! `status.readyReplicas` follows the Deployment's, a failed reconcile is a
//! Warning Event on the Website, and a finalizer logs its cleanup. Leader
//! elected, with metrics and probes. The same controller is written for
//! kube-runtime and controller-runtime in `bench/peers/website-*`, and
//! `check.sh` runs the same checks on each (docs/controllers.md).
//!
//! ```sh
//! kubectl apply -f examples/website/crd.yaml
//! LEASE_NAMESPACE=default METRICS_ADDR=127.0.0.1:8080 PROBE_ADDR=127.0.0.1:8081 \
//!     cargo run -p example-website
//! ```

use std::sync::Arc;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
use kinformer_controllers::kube::api::{Api, Patch, PatchParams};
use kinformer_controllers::kube::{Client, Resource, ResourceExt};
use kinformer_controllers::{
    Action, EventRecorder, EventType, FinalizerEvent, LeaderElectionConfig, Lookup, Manager,
    ManagerOptions, ReconcileError, apply_status, finalizer,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A web site: an image served by `replicas` Pods for `host`.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "example.kinformer.dev",
    version = "v1",
    kind = "Website",
    namespaced,
    status = "WebsiteStatus"
)]
pub struct WebsiteSpec {
    pub image: String,
    pub replicas: i32,
    pub host: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebsiteStatus {
    pub ready_replicas: i32,
}

const MANAGER: &str = "website-controller";

struct Context {
    client: Client,
    events: Arc<EventRecorder>,
}

async fn reconcile(website: Lookup<Website>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let Lookup::Found(website) = website else {
        return Ok(Action::Done);
    };
    let api = Api::namespaced(ctx.client.clone(), &website.namespace().unwrap_or_default());
    let cleanup = "example.kinformer.dev/cleanup";
    let result = finalizer(&api, cleanup, website.clone(), async |event| match event {
        FinalizerEvent::Apply(website) => apply(&website, &ctx.client).await,
        FinalizerEvent::Cleanup(website) => {
            tracing::info!(
                "cleanup of {}: its Deployment and Service go with it",
                website.name_any()
            );
            Ok(Action::Done)
        }
    })
    .await;
    if let Err(e) = &result {
        let reference = website.object_ref(&());
        let note = e.to_string();
        let _ = ctx
            .events
            .publish(
                &reference,
                EventType::Warning,
                "ReconcileFailed",
                "Reconcile",
                &note,
            )
            .await;
    }
    Ok(result?)
}

async fn apply(website: &Website, client: &Client) -> Result<Action, ReconcileError> {
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
    let websites = Api::<Website>::namespaced(client.clone(), &ns);
    apply_status(&websites, &name, MANAGER, &WebsiteStatus { ready_replicas }).await?;
    Ok(Action::Done)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().init(); // INFO and above
    let env = |name: &str| std::env::var(name).map_err(|_| anyhow::anyhow!("{name} is not set"));
    let identity = LeaderElectionConfig::default_identity();
    let options = ManagerOptions::new()
        .metrics_bind_address(env("METRICS_ADDR")?.parse()?)
        .health_probe_bind_address(env("PROBE_ADDR")?.parse()?)
        .leader_election(LeaderElectionConfig::new(
            &env("LEASE_NAMESPACE")?,
            MANAGER,
            &identity,
        ));
    let client = Client::try_default().await?;
    let mut manager = Manager::new(client, options)?;
    let (client, events) = (manager.client(), manager.event_recorder(MANAGER));
    let controller = manager
        .controller::<Website>("website")
        .owns::<Deployment>()
        .owns::<Service>()
        .reconcile(Arc::new(Context { client, events }), reconcile)?;
    manager.add(controller);
    Ok(manager.run_until_signal().await?)
}
