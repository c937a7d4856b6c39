//! configmap-hash with kube-runtime: the controller of
//! examples/configmap-hash written for kube-rs, for the comparison in
//! docs/controllers.md. Same hash, same patch, same output line.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::{BoxFuture, FutureExt, Shared};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

/// `namespace/name` of each ConfigMap the Deployment's pods use.
fn configmaps(d: &Deployment) -> Vec<String> {
    let pod = d.spec.template.spec.clone().unwrap_or_default();
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

struct Context {
    client: Client,
    configmaps: Store<ConfigMap>,
    /// The controller waits for its own store only, not for this one; and
    /// `Store::wait_until_ready` wakes only the last of several concurrent
    /// waiters, so the reconciles share one wait.
    ready: Shared<BoxFuture<'static, bool>>,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("the ConfigMap cache stopped before it synced")]
    NotReady,
}

async fn reconcile(d: Arc<Deployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.ready.clone().await {
        return Err(Error::NotReady);
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a over the keys and the data
    for key in configmaps(&d) {
        let (ns, name) = key.split_once('/').unwrap_or_default();
        let data = ctx
            .configmaps
            .get(&ObjectRef::new(name).within(ns))
            .map(|cm| serde_json::to_string(&cm.data))
            .transpose()?;
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
        let api =
            Api::<Deployment>::namespaced(ctx.client.clone(), &d.namespace().unwrap_or_default());
        api.patch(&d.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        println!(
            "{}/{}: config hash {hash}",
            d.namespace().unwrap_or_default(),
            d.name_any()
        );
    }
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Deployment>, _: &Error, _: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> Result<(), kube::Error> {
    let client = Client::try_default().await?;
    // One watch of ConfigMaps, both the reconcile's cache and its trigger:
    // the store is updated before the event reaches the mapper.
    let (store, writer) = reflector::store();
    let configmap_events = watcher(Api::<ConfigMap>::all(client.clone()), Default::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    let controller = Controller::new(Api::<Deployment>::all(client.clone()), Default::default());
    let deployments = controller.store();
    let context = Arc::new(Context {
        client,
        configmaps: store.clone(),
        ready: async move { store.wait_until_ready().await.is_ok() }
            .boxed()
            .shared(),
    });
    controller
        .watches_stream(configmap_events, move |cm| {
            let key = format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any());
            let users = deployments.state_filter(|d| configmaps(d).contains(&key));
            users
                .iter()
                .map(|d| ObjectRef::from_obj(&**d))
                .collect::<Vec<_>>()
        })
        .shutdown_on_signal()
        .run(reconcile, error_policy, context)
        .for_each(|_| std::future::ready(()))
        .await;
    Ok(())
}
