//! child-per-parent: the stale-read benchmark's controller (`cargo xtask
//! bench --stale-reads`), with its controller-runtime and kube-runtime
//! peers in bench/peers. Every Secret (the parent) gets one ConfigMap
//! child, created with a generated name when the cache shows none, and an
//! annotation counting its children, written by an update from the cached
//! copy (the write carries the resourceVersion read, as a write that
//! depends on what was read must). After a write it looks again in 100 ms,
//! as a controller waiting on its child's progress does. A stale cache
//! shows as a second child and as 409 Conflicts.
//! `READ_YOUR_WRITES=false` turns read-your-writes off (on by default).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kinformer_controllers::kube::api::{Api, PostParams};
use kinformer_controllers::kube::core::{Expression, Selector};
use kinformer_controllers::kube::{Client, Resource, ResourceExt};
use kinformer_controllers::{Action, Lookup, Manager, ManagerOptions, ReconcileError};
use kinformer_informer::Lister;

const PARENT: &str = "bench.kinformer.dev/parent";
const CHILDREN: &str = "bench.kinformer.dev/children";

type Context = (Client, Lister<ConfigMap>);

async fn reconcile(parent: Lookup<Secret>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let Lookup::Found(parent) = parent else {
        return Ok(Action::Done);
    };
    let (ns, name) = (parent.namespace().unwrap_or_default(), parent.name_any());
    let mine: Selector = Expression::Equal(PARENT.into(), name.clone()).into();
    let mut children = ctx.1.namespaced(&ns).list(&mine).len();
    let mut wrote = false;
    if children == 0 {
        let child: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {
            "generateName": format!("{name}-"),
            "labels": {PARENT: name},
            "ownerReferences": [parent.controller_owner_ref(&())],
        }}))?;
        let api = Api::<ConfigMap>::namespaced(ctx.0.clone(), &ns);
        let child = api.create(&PostParams::default(), &child).await?;
        println!("{ns}/{name}: created child {}", child.name_any());
        (children, wrote) = (1, true);
    }
    let count = children.to_string();
    if parent.annotations().get(CHILDREN) != Some(&count) {
        let mut parent = (*parent).clone();
        parent.annotations_mut().insert(CHILDREN.into(), count);
        let api = Api::<Secret>::namespaced(ctx.0.clone(), &ns);
        api.replace(&name, &PostParams::default(), &parent).await?;
        wrote = true;
    }
    Ok(if wrote {
        Action::RequeueAfter(Duration::from_millis(100))
    } else {
        Action::Done
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let mut manager = Manager::new(client, ManagerOptions::new())?;
    let wait = !std::env::var("READ_YOUR_WRITES").is_ok_and(|v| v == "false"); // bench knob
    let children = manager.factory().informer::<ConfigMap>().lister();
    let context = Arc::new((manager.client(), children));
    let controller = manager
        .controller::<Secret>("child-per-parent")
        .owns::<ConfigMap>()
        .options(manager.controller_options().read_your_writes(wait)) // bench knob
        .reconcile(context, reconcile)?;
    manager.add(controller);
    Ok(manager.run_until_signal().await?)
}
