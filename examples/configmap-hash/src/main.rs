//! configmap-hash: stamps each Deployment's pod template with a hash of the
//! ConfigMaps it mounts or takes env from, so changing one rolls it out.
//! Run it against `cargo xtask envtest up` or any cluster (kubeconfig).
//! With `LEADER_ELECTION_NAMESPACE` set, replicas elect a leader on Lease
//! `configmap-hash` there; standbys keep their caches synced meanwhile.
//! With `COMPACT_CACHE=true` (a benchmark setting) both caches are compact.

use std::sync::Arc;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kinformer_controllers::kube::api::{Api, Patch, PatchParams};
use kinformer_controllers::kube::{Client, ResourceExt};
use kinformer_controllers::{
    Action, LeaderElectionConfig, Lookup, Manager, ManagerOptions, ReconcileError, rbac,
};
use kinformer_informer::Lister;
use kinformer_informer::{Compact, SharedInformerFactory}; // bench knob

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

const MANAGER: &str = "configmap-hash";

type Context = (Client, Lister<ConfigMap>);

async fn reconcile(d: Lookup<Deployment>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let Lookup::Found(d) = d else {
        return Ok(Action::Done);
    };
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a over the keys and the data
    for key in configmaps(&d) {
        let data = ctx
            .1
            .get(&key)
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
        let api = Api::<Deployment>::namespaced(ctx.0.clone(), &d.namespace().unwrap_or_default());
        api.patch(&d.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        println!(
            "{}/{}: config hash {hash}",
            d.namespace().unwrap_or_default(),
            d.name_any()
        );
    }
    Ok(Action::Done)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kinformer_controllers::logging::init()?; // INFO and above, to stderr
    let client = Client::try_default().await?;
    let mut options = ManagerOptions::new();
    if let Ok(namespace) = std::env::var("LEADER_ELECTION_NAMESPACE") {
        let election = LeaderElectionConfig::new(MANAGER).namespace(&namespace);
        options = options.leader_election(election);
    }
    // COMPACT_CACHE=true (for the benchmark: lines marked "bench knob",
    // which bench/peers/count-lines.sh leaves out) keeps both caches compact.
    let compact = std::env::var("COMPACT_CACHE").is_ok_and(|v| v == "true"); // bench knob
    // READ_YOUR_WRITES=false turns read-your-writes off (the default is on).
    let wait = !std::env::var("READ_YOUR_WRITES").is_ok_and(|v| v == "false"); // bench knob
    let mut manager = if compact {
        let factory = SharedInformerFactory::new(client.clone()); // bench knob
        let factory = factory.compact::<Deployment>(Compact::json()); // bench knob
        let factory = factory.compact::<ConfigMap>(Compact::json()); // bench knob
        Manager::with_factory(factory, client.clone(), options)? // bench knob
    } else {
        Manager::new(client.clone(), options)?
    }; // bench knob
    let deployments = manager.factory().informer::<Deployment>();
    deployments.add_index("configmap", configmaps)?;
    let configmaps = manager.factory().informer::<ConfigMap>();
    let (context, by_configmap) = (
        Arc::new((manager.client(), configmaps.lister())),
        deployments.indexer(),
    );
    let controller = manager
        .controller::<Deployment>(MANAGER)
        .watches(configmaps, move |cm| {
            let value = format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any());
            let keys = by_configmap
                .index_keys("configmap", &value)
                .unwrap_or_default();
            keys.iter().filter_map(|key| key.parse().ok()).collect()
        })
        .writes::<Deployment>(&["patch"])
        .options(manager.controller_options().read_your_writes(wait)) // bench knob
        .reconcile(context, reconcile)?;
    manager.add(controller);
    // `--print-rbac NAMESPACE`: the RBAC it needs, for a ServiceAccount of NAMESPACE.
    if rbac::print_if_asked(MANAGER, || manager.permissions())? {
        return Ok(());
    }
    Ok(manager.run_until_signal().await?)
}
