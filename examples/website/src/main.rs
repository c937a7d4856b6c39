//! website: a custom resource, `Website` (example.kinformer.dev/v1), served
//! by a Deployment and a Service that it owns, written by server-side apply;
//! `status.readyReplicas` follows the Deployment's, a failed reconcile is a
//! Warning Event on the Website, and a finalizer logs its cleanup. Leader
//! elected, with metrics and probes. Its webhooks (served on WEBHOOK_ADDR
//! with the certificate in CERT_DIR) default `spec.host` from the name,
//! refuse more than 10 replicas, warn of an image without a tag, and
//! convert the second version, `v2`, to and from `v1`. The same controller is written for
//! kube-runtime and controller-runtime in `bench/peers/website-*`, and
//! `check.sh` runs the same checks on each (docs/controllers.md).
//!
//! ```sh
//! kubectl apply -f examples/website/crd.yaml
//! LEASE_NAMESPACE=default METRICS_ADDR=127.0.0.1:8080 PROBE_ADDR=127.0.0.1:8081 \
//!     WEBHOOK_ADDR=127.0.0.1:9443 CERT_DIR=/tmp/k8s-webhook-server/serving-certs \
//!     cargo run -p example-website
//! ```

use std::sync::Arc;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
use kinformer_controllers::kube::api::Api;
use kinformer_controllers::kube::{Client, Resource, ResourceExt};
use kinformer_controllers::webhook::{AdmissionRequest, Conversion, Verdict, Webhooks};
use kinformer_controllers::{
    Action, EventRecorder, EventType, FinalizerEvent, LeaderElectionConfig, Lookup, Manager,
    ManagerOptions, NewEvent, ReconcileError, apply_status, error_chain, finalizer, rbac,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    #[serde(default)] // defaulted by the webhook
    pub host: String,
}

/// The second version: the Pods' settings grouped.
pub mod v2 {
    use super::*;
    #[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
    #[kube(
        group = "example.kinformer.dev",
        version = "v2",
        kind = "Website",
        namespaced
    )]
    #[kube(status = "WebsiteStatus")]
    pub struct WebsiteSpec {
        pub host: String,
        pub pods: Pods,
    }
    #[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
    pub struct Pods {
        pub image: String,
        pub replicas: i32,
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebsiteStatus {
    #[serde(default)] // absent when 0, as controller-runtime's peer writes it
    pub ready_replicas: i32,
}

const MANAGER: &str = "website-controller";

// The Deployment and Service, written with k8s-openapi's types (children.rs)
// or, with the feature `json`, with `json!` (children_json.rs).
#[cfg_attr(feature = "json", path = "children_json.rs")] // variant switch
mod children; // variant switch

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
        FinalizerEvent::Apply(website) => children::serve(&website, &ctx.client).await,
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
        // The failure with its causes: its own message names only the step.
        let note = error_chain(e);
        let event = NewEvent {
            type_: EventType::Warning,
            reason: "ReconcileFailed",
            action: "Reconcile",
            note: &note,
        };
        let _ = ctx.events.publish(&website.object_ref(&()), event).await;
    }
    Ok(result?)
}

async fn default(mut site: Website, _: AdmissionRequest<Website>) -> Result<Website, Verdict> {
    if site.spec.host.is_empty() {
        site.spec.host = format!("{}.example.com", site.name_any());
    }
    Ok(site)
}

async fn validate(request: AdmissionRequest<Website>) -> Verdict {
    let Some(site) = request.object else {
        return Verdict::allow();
    };
    let (image, replicas) = (&site.spec.image, site.spec.replicas);
    if !(0..=10).contains(&replicas) {
        return Verdict::deny(format!("spec.replicas must be 0 to 10, not {replicas}"));
    }
    match image.rsplit('/').next().unwrap_or(image).contains(':') {
        true => Verdict::allow(),
        false => Verdict::allow().warn(format!("spec.image {image} has no tag: latest is pulled")),
    }
}

fn to_v1(site: v2::Website) -> Result<Website, String> {
    let v2::Pods { image, replicas } = site.spec.pods;
    let spec = WebsiteSpec {
        image,
        replicas,
        host: site.spec.host,
    };
    Ok(Website {
        metadata: site.metadata,
        spec,
        status: site.status,
    })
}

fn from_v1(site: Website) -> Result<v2::Website, String> {
    let pods = v2::Pods {
        image: site.spec.image,
        replicas: site.spec.replicas,
    };
    let spec = v2::WebsiteSpec {
        host: site.spec.host,
        pods,
    };
    Ok(v2::Website {
        metadata: site.metadata,
        spec,
        status: site.status,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kinformer_controllers::logging::init()?; // INFO and above, to stderr
    let env = |name: &str| std::env::var(name).map_err(|_| anyhow::anyhow!("{name} is not set"));
    let options = ManagerOptions::new()
        .metrics_bind_address(env("METRICS_ADDR")?)
        .health_probe_bind_address(env("PROBE_ADDR")?)
        .webhook_server(env("WEBHOOK_ADDR")?, env("CERT_DIR")?)
        .leader_election(LeaderElectionConfig::new(MANAGER).namespace(&env("LEASE_NAMESPACE")?));
    let client = Client::try_default().await?;
    let mut manager = Manager::new(client, options)?;
    let (client, events) = (manager.client(), manager.event_recorder(MANAGER));
    let controller = manager
        .controller::<Website>("website")
        .owns::<Deployment>()
        .owns::<Service>()
        .writes::<Deployment>(&["create", "patch"]) // apply creates
        .writes::<Service>(&["create", "patch"])
        .writes::<Website>(&["patch"]) // the finalizer
        .writes_status::<Website>()
        .reconcile(Arc::new(Context { client, events }), reconcile)?;
    manager.add(controller);
    manager.webhooks(
        Webhooks::new()
            .defaulting("/mutate-example-kinformer-dev-v1-website", default)
            .validate("/validate-example-kinformer-dev-v1-website", validate)
            .convert(
                "/convert",
                Conversion::<Website>::hub().spoke(to_v1, from_v1),
            ),
    );
    // `--print-rbac NAMESPACE`: the RBAC it needs, for a ServiceAccount of NAMESPACE.
    if rbac::print_if_asked(MANAGER, || manager.permissions())? {
        return Ok(());
    }
    Ok(manager.run_until_signal().await?)
}
