//! crd-controller: a custom resource, `Greeting` (kinformer.dev/v1), whose
//! controller keeps a ConfigMap `<name>-greeting` holding its message and
//! owned by it, reports it in the Greeting's status (written by server-side
//! apply), and under a finalizer deletes the ConfigMap before the Greeting
//! goes. Deleting the ConfigMap brings it back. The controller installs its
//! CustomResourceDefinition at start.
//!
//! ```sh
//! cargo run -p example-crd-controller   # against the kubeconfig's cluster
//! ```

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_controllers::{
    Action, FinalizerEvent, Lookup, Manager, ManagerOptions, ReconcileError, apply, apply_status,
    finalizer, rbac,
};
use kube::api::{Api, DeleteParams};
use kube::{Client, Resource, ResourceExt};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a Greeting asks for.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kinformer.dev",
    version = "v1",
    kind = "Greeting",
    namespaced,
    status = "GreetingStatus"
)]
pub struct GreetingSpec {
    /// The message the ConfigMap holds.
    pub message: String,
}

/// What the controller did for a Greeting.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GreetingStatus {
    /// The ConfigMap holding the message.
    pub config_map: String,
    /// The generation of the spec it holds.
    pub observed_generation: i64,
}

const MANAGER: &str = "crd-controller";
const FINALIZER: &str = "kinformer.dev/greeting-cleanup";

async fn reconcile(
    greeting: Lookup<Greeting>,
    client: Arc<Client>,
) -> Result<Action, ReconcileError> {
    let Lookup::Found(greeting) = greeting else {
        return Ok(Action::Done); // gone: the finalizer already cleaned up
    };
    let ns = greeting.namespace().unwrap_or_default();
    let greetings: Api<Greeting> = Api::namespaced((*client).clone(), &ns);
    let configmaps: Api<ConfigMap> = Api::namespaced((*client).clone(), &ns);
    let cm_name = format!("{}-greeting", greeting.name_any());
    let action = finalizer(&greetings, FINALIZER, greeting, async |event| match event {
        FinalizerEvent::Apply(g) => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(cm_name.clone()),
                    namespace: Some(ns.clone()),
                    owner_references: g.controller_owner_ref(&()).map(|r| vec![r]),
                    ..ObjectMeta::default()
                },
                data: Some([("message".to_owned(), g.spec.message.clone())].into()),
                ..ConfigMap::default()
            };
            apply(&client, MANAGER, &cm).await?;
            let status = GreetingStatus {
                config_map: cm_name.clone(),
                observed_generation: g.metadata.generation.unwrap_or_default(),
            };
            apply_status(&client, MANAGER, &*g, &status).await?; // g: Arc<Greeting>
            println!("applied {ns}/{}", g.name_any());
            Ok(Action::Done)
        }
        FinalizerEvent::Cleanup(g) => {
            match configmaps.delete(&cm_name, &DeleteParams::default()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
                Ok(_) => {}
            }
            println!("cleaned up {ns}/{}", g.name_any());
            Ok(Action::Done)
        }
    })
    .await?;
    Ok(action)
}

/// Creates or updates the CRD and waits until the server serves it.
async fn install_crd(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    apply(client, MANAGER, &Greeting::crd()).await?;
    for _ in 0..300 {
        let crd = crds.get(Greeting::crd_name()).await?;
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("CRD {} not Established within 30 s", Greeting::crd_name())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kinformer_controllers::logging::init()?; // INFO and above, to stderr
    let client = Client::try_default().await?;
    let mut manager = Manager::new(client.clone(), ManagerOptions::new())?;
    let controller = manager
        .controller::<Greeting>("greetings")
        .owns::<ConfigMap>()
        .writes::<ConfigMap>(&["create", "patch", "delete"]) // apply creates
        .writes::<Greeting>(&["patch"]) // the finalizer
        .writes_status::<Greeting>()
        .reconcile(Arc::new(manager.client()), reconcile)?;
    manager.add(controller);
    // `--print-rbac NAMESPACE`: the RBAC it needs, for a ServiceAccount of NAMESPACE.
    if rbac::print_if_asked(MANAGER, || {
        let mut rules = manager.permissions();
        // install_crd: create it, then read and patch that one CRD alone.
        let crds = ("apiextensions.k8s.io", "customresourcedefinitions");
        rules.allow(None, crds.0, crds.1, &["create"]);
        rules.allow_named(
            None,
            crds.0,
            crds.1,
            &[Greeting::crd_name()],
            &["get", "patch"],
        );
        rules
    })? {
        return Ok(());
    }
    install_crd(&client).await?;
    Ok(manager.run_until_signal().await?)
}
