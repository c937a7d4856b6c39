//! configmap-hash with kube-runtime: the controller of
//! examples/configmap-hash written for kube-rs, for the comparison in
//! docs/controllers.md. Same hash, same patch, same output line. kube-rs
//! has no leader election of its own: with `LEADER_ELECTION_NAMESPACE` set,
//! replicas elect one on Lease `configmap-hash` there with
//! kube-lease-manager (client-go's 15 s lease), and the leader runs the
//! controller until it loses the Lease.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use kube_lease_manager::LeaseManagerBuilder;

/// `namespace/name` of each ConfigMap the Deployment's pods use.
fn configmaps(d: &Deployment) -> Vec<String> {
    let Some(pod) = d.spec.template.spec.as_ref() else {
        return Vec::new();
    };
    let volumes = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| Some(v.config_map.as_ref()?.name.clone()));
    let env = pod
        .containers
        .iter()
        .flat_map(|c| c.env_from.iter().flatten());
    let env = env.filter_map(|e| Some(e.config_map_ref.as_ref()?.name.clone()));
    let mut keys: Vec<String> = volumes
        .chain(env)
        .map(|n| format!("{}/{n}", d.namespace().unwrap_or_default()))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

async fn reconcile(d: Arc<Deployment>, client: Arc<Client>) -> Result<Action, kube::Error> {
    let ns = d.namespace().unwrap_or_default();
    let configmaps_api = Api::<ConfigMap>::namespaced((*client).clone(), &ns);
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a over the keys and the data
    for key in configmaps(&d) {
        let (_, name) = key.split_once('/').unwrap_or_default();
        let data = configmaps_api
            .get_opt(name)
            .await?
            .map(|cm| serde_json::to_string(&cm.data))
            .transpose()
            .map_err(kube::Error::SerdeError)?;
        for byte in key.bytes().chain(data.unwrap_or_default().into_bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    let hash = format!("{hash:016x}");
    let template = d.spec.template.metadata.as_ref();
    if template.and_then(|m| m.annotations.as_ref()?.get("kinformer.dev/config-hash"))
        != Some(&hash)
    {
        let patch = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {"kinformer.dev/config-hash": hash}}}}});
        let api = Api::<Deployment>::namespaced((*client).clone(), &ns);
        api.patch(&d.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        println!("{ns}/{}: config hash {hash}", d.name_any());
    }
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Deployment>, _: &kube::Error, _: Arc<Client>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init(); // INFO and above
    let client = Client::try_default().await?;
    let mut leading = None;
    if let Ok(namespace) = std::env::var("LEADER_ELECTION_NAMESPACE") {
        let lease = LeaseManagerBuilder::new(client.clone(), "configmap-hash")
            .with_namespace(namespace)
            .with_duration(15)
            .with_grace(5)
            .build()
            .await?;
        let (mut channel, _task) = lease.watch().await;
        channel.wait_for(|leader| *leader).await?;
        leading = Some(channel);
    }
    let lost = async move {
        match leading {
            Some(mut channel) => drop(channel.wait_for(|leader| !*leader).await),
            None => std::future::pending().await,
        }
    };
    let controller = Controller::new(Api::<Deployment>::all(client.clone()), Default::default());
    let deployments = controller.store();
    let all_configmaps = Api::<ConfigMap>::all(client.clone());
    controller
        .watches(all_configmaps, Default::default(), move |cm| {
            let key = format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any());
            let users = deployments.state_filter(|d| configmaps(d).contains(&key));
            users
                .iter()
                .map(|d| ObjectRef::from_obj(&**d))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(lost)
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::new(client))
        .for_each(|_| std::future::ready(()))
        .await;
    Ok(())
}
