//! A Manager with a controller over a custom resource whose CRD is not
//! installed, run as a ServiceAccount bound to exactly the rules it
//! prints: it stays ready and its other controller works while it waits,
//! starts once the CRD is installed, waits again when the CRD is deleted,
//! follows it again once it is back, and waits (its cache kept) while the
//! CRD does not serve its version.

mod common;

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer_controllers::{Action, Lookup, Manager, ManagerOptions};
use kinformer_envtest::TestEnv;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube_client::core::{NamespaceResourceScope, Resource};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use common::{client_from, config_map, eventually, http_get};

const CRD: &str = "tools.optional.kinformer.dev";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Tool {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
}

impl Resource for Tool {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "Tool".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "optional.kinformer.dev".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "tools".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn tool(name: &str) -> Tool {
    Tool {
        api_version: "optional.kinformer.dev/v1".to_owned(),
        kind: "Tool".to_owned(),
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
    }
}

fn crd() -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": CRD},
        "spec": {
            "group": "optional.kinformer.dev",
            "names": {"kind": "Tool", "plural": "tools", "singular": "tool", "listKind": "ToolList"},
            "scope": "Namespaced",
            "versions": versions(&[("v1", true, true)]),
        }
    }))
    .unwrap()
}

/// The CRD's `spec.versions`, each `(name, served, storage)`.
fn versions(each: &[(&str, bool, bool)]) -> serde_json::Value {
    each.iter()
        .map(|(name, served, storage)| {
            serde_json::json!({
                "name": name, "served": served, "storage": storage,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            })
        })
        .collect()
}

/// Replaces the CRD's versions with `each` (see [`versions`]).
async fn serve(crds: &Api<CustomResourceDefinition>, each: &[(&str, bool, bool)]) {
    let patch = serde_json::json!({"spec": {"versions": versions(each)}});
    crds.patch(CRD, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// A Manager over `client` with two controllers, one over ConfigMaps and
/// one over Tools; each reconcile is written into `seen`.
fn manager(client: &Client, options: ManagerOptions, seen: &Arc<Mutex<Vec<String>>>) -> Manager {
    let mut manager = Manager::new(client.clone(), options).unwrap();
    let s = Arc::clone(seen);
    let tools = manager
        .controller::<Tool>("tools")
        .reconcile(s, |lookup: Lookup<Tool>, seen| async move {
            let seen_as = match &lookup {
                Lookup::Found(t) => format!("tool:{}", t.metadata.name.as_deref().unwrap_or("")),
                Lookup::Gone { key } => format!("tool gone:{}", key.name()),
            };
            seen.lock().push(seen_as);
            Ok(Action::Done)
        })
        .unwrap();
    let s = Arc::clone(seen);
    let configmaps = manager
        .controller::<ConfigMap>("configmaps")
        .reconcile(s, |lookup: Lookup<ConfigMap>, seen| async move {
            if let Lookup::Found(cm) = lookup {
                let name = cm.metadata.name.clone().unwrap_or_default();
                seen.lock().push(format!("cm:{name}"));
            }
            Ok(Action::Done)
        })
        .unwrap();
    manager.add(tools).add(configmaps);
    manager
}

/// Whether RBAC lets `user` `verb` the CRD named [`CRD`], as the API
/// server's authorizer says.
async fn may_read_the_crd(admin: &Client, user: &str, verb: &str) -> bool {
    let attributes = serde_json::json!({
        "verb": verb, "group": "apiextensions.k8s.io",
        "resource": "customresourcedefinitions", "name": CRD});
    common::allowed(admin, user, attributes).await
}

/// Creates the CRD and waits until it is Established.
async fn install(crds: &Api<CustomResourceDefinition>) {
    crds.create(&PostParams::default(), &crd()).await.unwrap();
    eventually("the CRD established", async || {
        crds.get_opt(CRD)
            .await
            .unwrap()
            .and_then(|c| c.status)
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    })
    .await;
}

/// The `kinformer_informer_waiting_for_resource` sample of the Tools
/// informer, as `/metrics` serves it.
async fn waiting_gauge(addr: std::net::SocketAddr) -> String {
    let scraped = http_get(addr, "/metrics").await;
    scraped
        .lines()
        .find(|l| {
            l.starts_with("kinformer_informer_waiting_for_resource{")
                && l.contains("tools in all namespaces")
        })
        .unwrap_or_else(|| panic!("no waiting gauge for tools in\n{scraped}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_waits_for_its_crd_ready_and_follows_it_through_deletion_and_reinstall() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("optional-crds").await.unwrap();
    let admin = env.client().unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let _ = crds.delete(CRD, &DeleteParams::default()).await;
    eventually("no CRD left from an earlier run", async || {
        crds.get_opt(CRD).await.unwrap().is_none()
    })
    .await;

    // The rules it prints, and nothing more: list and watch of its CRD by name.
    let seen = Arc::default();
    let printed = manager(&admin, ManagerOptions::new(), &seen)
        .permissions()
        .manifests("optional", &ns, "optional");
    let kubeconfig = env
        .bind(&printed.to_string(), &ns, "optional")
        .await
        .unwrap();
    let account = format!("system:serviceaccount:{ns}:optional");
    for verb in ["list", "watch"] {
        assert!(
            may_read_the_crd(&admin, &account, verb).await,
            "{verb} of {CRD}"
        );
    }
    assert!(!may_read_the_crd(&admin, &account, "get").await);

    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let options = ManagerOptions::new()
        .metrics_bind_address(addr)
        .health_probe_bind_address(addr);
    let manager = manager(&client_from(&kubeconfig).await, options, &seen);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(manager.run(shutdown.clone()));

    // Its other controller works, and the process is ready, while Tools
    // are not served.
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    configmaps
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    eventually("the ConfigMap reconciled", async || {
        seen.lock().contains(&"cm:a".to_owned())
    })
    .await;
    eventually("ready while waiting for the CRD", async || {
        http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200")
    })
    .await;
    assert!(waiting_gauge(addr).await.ends_with(" 1"));

    install(&crds).await;
    let tools: Api<Tool> = Api::namespaced(admin.clone(), &ns);
    let established = std::time::Instant::now();
    tools
        .create(&PostParams::default(), &tool("one"))
        .await
        .unwrap();
    eventually("the Tool reconciled", async || {
        seen.lock().contains(&"tool:one".to_owned())
    })
    .await;
    // Told, not asserted (a time): within the test's 30 s whatever it is.
    eprintln!(
        "optional CRD: established to the first reconcile in {:?}",
        established.elapsed()
    );
    assert!(waiting_gauge(addr).await.ends_with(" 0"));

    // Deleted: its objects go first (a reconcile each), then it waits again.
    crds.delete(CRD, &DeleteParams::default()).await.unwrap();
    eventually("the Tool's deletion reconciled", async || {
        seen.lock().contains(&"tool gone:one".to_owned())
    })
    .await;
    eventually("waiting for the CRD again", async || {
        waiting_gauge(addr).await.ends_with(" 1")
    })
    .await;
    eventually("the CRD gone", async || {
        crds.get_opt(CRD).await.unwrap().is_none()
    })
    .await;
    assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));

    install(&crds).await;
    tools
        .create(&PostParams::default(), &tool("two"))
        .await
        .unwrap();
    eventually("the Tool made after the reinstall reconciled", async || {
        seen.lock().contains(&"tool:two".to_owned())
    })
    .await;

    // v1 no longer served (the CRD moved to v2): it waits again, ready,
    // and the Tool it holds is not taken for gone (it is there, in v2).
    serve(&crds, &[("v1", false, false), ("v2", true, true)]).await;
    eventually("waiting while v1 is not served", async || {
        waiting_gauge(addr).await.ends_with(" 1")
    })
    .await;
    // And stays so: not woken by the CRD that does not serve v1 (woken, it
    // would list three times and fail /readyz within about 3 s). An
    // absence is watched for a while, so this cannot fail by timing.
    for _ in 0..10 {
        assert!(waiting_gauge(addr).await.ends_with(" 1"));
        assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    serve(&crds, &[("v1", true, true), ("v2", true, false)]).await;
    eventually("v1 followed again once served", async || {
        waiting_gauge(addr).await.ends_with(" 0")
    })
    .await;
    tools
        .create(&PostParams::default(), &tool("three"))
        .await
        .unwrap();
    eventually(
        "the Tool made once v1 is served again reconciled",
        async || seen.lock().contains(&"tool:three".to_owned()),
    )
    .await;
    assert!(
        !seen.lock().contains(&"tool gone:two".to_owned()),
        "a Tool still there reconciled as gone: {:?}",
        seen.lock()
    );
    let scraped = http_get(addr, "/metrics").await;
    let waits = scraped
        .lines()
        .find(|l| {
            l.starts_with("kinformer_informer_not_served_total{")
                && l.contains("tools in all namespaces")
        })
        .unwrap_or_else(|| panic!("no count of waits in\n{scraped}"));
    // Not installed at the start, deleted, v1 not served: three waits.
    assert!(waits.ends_with(" 3"), "{waits}");
    shutdown.cancel();
    running.await.unwrap().unwrap();
    crds.delete(CRD, &DeleteParams::default()).await.unwrap();
}
