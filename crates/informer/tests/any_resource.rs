//! Informers for any resource, against the real API server: a custom
//! resource seen by a typed and a dynamic informer, metadata-only Pods,
//! cluster-scoped kinds, a CustomResourceDefinition that goes away and comes
//! back, and custom resources that do not fit their Rust type.

mod common;

use std::time::Duration;

use common::{Reported, errors_seen, no_difference, wait_synced};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer_envtest::TestEnv;
use kinformer_informer::consistency::{LastSeen, versions};
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, ReflectorOptions, SharedIndexInformer,
    SharedInformerFactory,
};
use kube::{CustomResource, CustomResourceExt};
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_client::core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A namespaced custom resource with a status subresource, as users write it.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "any.kinformer.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    size: i32,
}

/// The status subresource of a `Widget`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct WidgetStatus {
    ready: bool,
}

/// A custom resource whose CRD schema accepts any spec: `size` may be a
/// string on the server, which this type cannot hold.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "any.kinformer.dev",
    version = "v1",
    kind = "Gizmo",
    namespaced
)]
pub struct GizmoSpec {
    size: i32,
}

async fn setup(prefix: &str) -> (&'static TestEnv, Client, kinformer_envtest::TestNamespace) {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace(prefix).await.unwrap();
    (env, env.client().unwrap(), ns)
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Creates the CRD (or finds it there) and waits until it is Established.
async fn install(client: &Client, crd: &CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap();
    match crds.create(&PostParams::default(), crd).await {
        Ok(_) => {}
        Err(kube_client::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating CRD {name}: {e}"),
    }
    eventually(&format!("CRD {name} Established"), async || {
        let Ok(Some(crd)) = crds.get_opt(&name).await else {
            return false;
        };
        crd.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    })
    .await;
}

fn widget(name: &str, size: i32) -> Widget {
    let mut w = Widget::new(name, WidgetSpec { size });
    w.metadata.labels = Some([("size".to_owned(), size.to_string())].into());
    w
}

/// The informer synced through the streaming list (no fallback to a plain
/// list, which would hide a streaming path that fails for this kind), and
/// no list or watch error was reported.
fn assert_streamed_without_error<K: kinformer_store::Object + Clone>(
    informer: &SharedIndexInformer<K>,
    errors: &Reported,
) {
    let stats = informer.reflector_stats().unwrap();
    let lists = stats.list_calls.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        lists,
        0,
        "{}: fell back to a plain list",
        informer.describe()
    );
    let errors = errors.messages();
    assert!(errors.is_empty(), "{}: {errors:?}", informer.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_and_a_dynamic_informer_of_one_custom_resource_see_the_same_objects() {
    let (_, client, ns) = setup("widgets").await;
    install(&client, &Widget::crd()).await;
    let resource = ApiResource::erase::<Widget>(&());
    let typed = SharedIndexInformer::new(
        ApiListerWatcher::<Widget>::namespaced(client.clone(), &ns),
        common::options(),
    );
    let factory = SharedInformerFactory::new(client.clone())
        .namespace(&ns)
        .fifo(common::fifo());
    let dynamic = factory.dynamic(&resource);
    // Asked for again, by GVK this time: the same informer, one watch.
    let gvk = GroupVersionKind::gvk("any.kinformer.dev", "v1", "Widget");
    let again = factory.dynamic(&ApiResource::from_gvk(&gvk));
    assert!(dynamic.indexer().same_cache(&again.indexer()));
    let (seen_typed, seen_dynamic) = (LastSeen::default(), LastSeen::default());
    typed.add_event_handler(seen_typed.clone()).unwrap();
    dynamic.add_event_handler(seen_dynamic.clone()).unwrap();
    let (typed_errors, dynamic_errors) = (errors_seen(&typed), errors_seen(&dynamic));

    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    for i in 0..3 {
        widgets
            .create(&PostParams::default(), &widget(&format!("w{i}"), i))
            .await
            .unwrap();
    }
    let shutdown = CancellationToken::new();
    let run_typed = {
        let (typed, shutdown) = (typed.clone(), shutdown.clone());
        tokio::spawn(async move { typed.run(shutdown).await })
    };
    factory.start(&shutdown);
    wait_synced(&typed).await;
    wait_synced(&dynamic).await;

    // Creates, a spec update, a status update through the subresource, deletes.
    for i in 3..6 {
        widgets
            .create(&PostParams::default(), &widget(&format!("w{i}"), i))
            .await
            .unwrap();
    }
    let spec = serde_json::json!({"spec": {"size": 42}});
    widgets
        .patch("w1", &PatchParams::default(), &Patch::Merge(spec))
        .await
        .unwrap();
    let status = serde_json::json!({"status": {"ready": true}});
    widgets
        .patch_status("w2", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    for name in ["w0", "w4"] {
        widgets
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    let dynamic_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    no_difference(&widgets, &typed, [&seen_typed], Duration::from_secs(30)).await;
    no_difference(
        &dynamic_api,
        &dynamic,
        [&seen_dynamic],
        Duration::from_secs(30),
    )
    .await;
    let typed_cache = typed.indexer().list();
    let dynamic_cache = dynamic.indexer().list();
    assert_eq!(
        versions(typed_cache.iter().map(|o| o.as_ref())),
        versions(dynamic_cache.iter().map(|o| o.as_ref())),
        "the typed and the dynamic caches hold the same objects at the same versions"
    );
    assert_eq!(typed_cache.len(), 4);
    assert_streamed_without_error(&typed, &typed_errors);
    assert_streamed_without_error(&dynamic, &dynamic_errors);
    let w1 = typed.lister().namespaced(&ns).get("w1").unwrap();
    assert_eq!(w1.spec.size, 42);
    let w2 = dynamic.lister().namespaced(&ns).get("w2").unwrap();
    assert_eq!(w2.data["status"]["ready"], serde_json::json!(true));
    shutdown.cancel();
    run_typed.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_only_pod_informer_caches_the_servers_metadata_and_nothing_else() {
    let (_, client, ns) = setup("metaonly").await;
    let owner = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for i in 0..4 {
        let mut pod = common::pod(&format!("p{i}"));
        pod.metadata.annotations = Some([("note".to_owned(), format!("pod {i}"))].into());
        pod.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "owner".into(),
                uid: owner.metadata.uid.clone().unwrap(),
                ..Default::default()
            },
        ]);
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let factory = SharedInformerFactory::new(client.clone())
        .namespace(&ns)
        .fifo(common::fifo());
    let informer = factory.metadata::<Pod>();
    let seen = LastSeen::default();
    informer.add_event_handler(seen.clone()).unwrap();
    let errors = errors_seen(&informer);
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    wait_synced(&informer).await;
    assert_streamed_without_error(&informer, &errors);
    // A change after the sync reaches the cache through the watch.
    let patch = serde_json::json!({"metadata": {"labels": {"gen": "1"}}});
    pods.patch("p3", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    let metas: Api<PartialObjectMeta<Pod>> = Api::namespaced(client.clone(), &ns);
    no_difference(&metas, &informer, [&seen], Duration::from_secs(30)).await;

    let cached = informer.indexer().list();
    assert_eq!(cached.len(), 4);
    for meta in &cached {
        // The server sent PartialObjectMetadata, not Pods.
        let kind = meta.types.as_ref().map(|t| t.kind.as_str());
        assert_eq!(kind, Some("PartialObjectMetadata"), "{meta:?}");
        let name = meta.metadata.name.clone().unwrap();
        let full = pods.get(&name).await.unwrap().metadata;
        let m = &meta.metadata;
        assert_eq!(m.uid, full.uid, "{name}");
        assert_eq!(m.resource_version, full.resource_version, "{name}");
        assert_eq!(m.labels, full.labels, "{name}");
        assert_eq!(m.annotations, full.annotations, "{name}");
        assert_eq!(m.owner_references, full.owner_references, "{name}");
    }
    let p3 = informer.lister().namespaced(&ns).get("p3").unwrap();
    assert_eq!(p3.metadata.labels.as_ref().unwrap()["gen"], "1");
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_scoped_kinds_are_watched_across_the_cluster_even_from_a_namespaced_factory() {
    let (_, client, ns) = setup("cluster").await;
    install(&client, &Widget::crd()).await;
    let factory = SharedInformerFactory::new(client.clone())
        .namespace(&ns)
        .fifo(common::fifo());
    let namespaces = factory.informer::<Namespace>();
    let crds = factory.informer::<CustomResourceDefinition>();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    assert!(synced.iter().all(|(_, ok)| *ok), "{synced:?}");
    let lister = namespaces.lister();
    for name in [ns.as_str(), "default", "kube-system"] {
        assert!(lister.get(name).is_some(), "namespace {name} is cached");
    }
    assert!(crds.lister().get("widgets.any.kinformer.dev").is_some());
    shutdown.cancel();
}

fn gadget_crd() -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gadgets.any.kinformer.dev"},
        "spec": {
            "group": "any.kinformer.dev",
            "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget", "listKind": "GadgetList"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .unwrap()
}

fn gadget(name: &str) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "any.kinformer.dev/v1", "kind": "Gadget",
        "metadata": {"name": name}, "spec": {"on": true}
    }))
    .unwrap()
}

/// Requests kube-apiserver has counted for `resource` of `group` and
/// `verb` (`apiserver_request_total`, every code), from its own metrics. It
/// counts no request for a resource it does not serve (those go to its
/// not-found handler, which no metric labels with the resource): the
/// informer's own count of its lists and watches gives those.
async fn server_requests(client: &Client, group: &str, resource: &str, verb: &str) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let labels = [
        format!("group=\"{group}\""),
        format!("resource=\"{resource}\""),
        format!("verb=\"{verb}\""),
    ];
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| labels.iter().all(|label| l.contains(label.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Lists and watches (streaming lists included) the informer has sent.
fn requests_sent<K: kinformer_store::Object + Clone>(informer: &SharedIndexInformer<K>) -> u64 {
    use std::sync::atomic::Ordering;
    let stats = informer.reflector_stats().unwrap();
    stats.list_calls.load(Ordering::Relaxed) + stats.watches.load(Ordering::Relaxed)
}

/// Reflector options whose backoff is a minute: within a test, only the
/// informer's watch of the CRD can make it list again.
fn waiting_only_for_the_crd() -> ReflectorOptions {
    let mut reflector = ReflectorOptions::default();
    reflector.backoff.initial = Duration::from_secs(60);
    reflector.backoff.max = Duration::from_secs(60);
    reflector
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_deleted_under_a_watch_is_waited_for_quietly_and_followed_again_as_soon_as_it_is_back()
 {
    let (_, client, ns) = setup("gadgets").await;
    install(&client, &gadget_crd()).await;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("any.kinformer.dev", "v1", "Gadget"),
        "gadgets",
    );
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<DynamicObject>::namespaced_with(client.clone(), &ns, &resource),
        common::options().reflector(waiting_only_for_the_crd()),
    );
    let errors = errors_seen(&informer);
    let gadgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    gadgets
        .create(&PostParams::default(), &gadget("before"))
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = {
        let (informer, shutdown) = (informer.clone(), shutdown.clone());
        tokio::spawn(async move { informer.run(shutdown).await })
    };
    wait_synced(&informer).await;
    assert_eq!(informer.indexer().len(), 1);
    assert!(informer.not_served().is_none());

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_lists_before = server_requests(
        &client,
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "LIST",
    )
    .await;
    crds.delete("gadgets.any.kinformer.dev", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the informer waiting for its resource", async || {
        informer.not_served().is_some()
    })
    .await;
    let sent_before = requests_sent(&informer);
    let message = informer.not_served().unwrap();
    assert!(
        message.contains("gadgets") && message.contains("CustomResourceDefinition"),
        "the error names what is not served: {message}"
    );
    // The CRD's objects went with it, one deletion each.
    assert_eq!(informer.indexer().len(), 0);
    // Reported once, not once per retry.
    let not_found = || {
        errors
            .messages()
            .iter()
            .filter(|e| e.contains("404"))
            .count()
    };
    assert_eq!(not_found(), 1, "{:?}", errors.messages());

    install(&client, &gadget_crd()).await;
    gadgets
        .create(&PostParams::default(), &gadget("after"))
        .await
        .unwrap();
    // Within the test's 30 s, where the backoff is a minute: the CRD's
    // watch said it is back.
    eventually("the informer following the resource again", async || {
        informer
            .indexer()
            .get_by_key(&format!("{ns}/after"))
            .is_some()
    })
    .await;
    assert!(informer.not_served().is_none());
    assert_eq!(not_found(), 1, "{:?}", errors.messages());
    // While it waited: no request for the resource but the list that found
    // it back (the backoff is a minute), and one list of its CRD, whose
    // watch said when (the server's count; the test's own installs GET it).
    let sent = requests_sent(&informer) - sent_before;
    assert_eq!(sent, 1, "lists and watches of gadgets sent while waiting");
    let crd_lists = server_requests(
        &client,
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "LIST",
    )
    .await
        - crd_lists_before;
    // One of them this informer's; the other tests of this file, running
    // beside it, list CRDs too (a CRD informer, the sprockets' wait).
    assert!(crd_lists <= 4, "{crd_lists} lists of CRDs while waiting");
    assert!(informer.failure().is_none());
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

fn sprocket_crd(versions: &[(&str, bool, bool)]) -> CustomResourceDefinition {
    let versions: Vec<serde_json::Value> = versions
        .iter()
        .map(|(name, served, storage)| {
            serde_json::json!({
                "name": name, "served": served, "storage": storage,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            })
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sprockets.any.kinformer.dev"},
        "spec": {
            "group": "any.kinformer.dev",
            "names": {"kind": "Sprocket", "plural": "sprockets", "singular": "sprocket", "listKind": "SprocketList"},
            "scope": "Namespaced",
            "versions": versions,
        }
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_informer_started_before_its_crd_waits_and_syncs_once_the_crd_serves_its_version() {
    let (_, client, ns) = setup("sprockets").await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    // Left by a run that failed half-way: gone before this one starts.
    let _ = crds
        .delete("sprockets.any.kinformer.dev", &DeleteParams::default())
        .await;
    eventually("no sprockets CRD left", async || {
        crds.get_opt("sprockets.any.kinformer.dev")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("any.kinformer.dev", "v1", "Sprocket"),
        "sprockets",
    );
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<DynamicObject>::namespaced_with(client.clone(), &ns, &resource),
        common::options().reflector(waiting_only_for_the_crd()),
    );
    let shutdown = CancellationToken::new();
    let run = {
        let (informer, shutdown) = (informer.clone(), shutdown.clone());
        tokio::spawn(async move { informer.run(shutdown).await })
    };
    eventually("the informer waiting for its resource", async || {
        informer.not_served().is_some()
    })
    .await;
    assert!(!informer.has_synced());
    // Installed serving only v2: v1 is still not served.
    install(
        &client,
        &sprocket_crd(&[("v1", false, false), ("v2", true, true)]),
    )
    .await;
    let v2 = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("any.kinformer.dev", "v2", "Sprocket"),
        "sprockets",
    );
    let sprocket = |name: &str| -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "any.kinformer.dev/v2", "kind": "Sprocket",
            "metadata": {"name": name}
        }))
        .unwrap()
    };
    Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &v2)
        .create(&PostParams::default(), &sprocket("one"))
        .await
        .unwrap();
    assert!(!informer.has_synced() && informer.not_served().is_some());
    // v1 served as well: listed within the test's 30 s (the backoff is a minute).
    let mut crd = crds.get("sprockets.any.kinformer.dev").await.unwrap();
    crd.spec.versions[0].served = true;
    crds.replace("sprockets.any.kinformer.dev", &PostParams::default(), &crd)
        .await
        .unwrap();
    eventually("the informer synced", async || informer.has_synced()).await;
    assert!(
        informer
            .indexer()
            .get_by_key(&format!("{ns}/one"))
            .is_some()
    );
    assert!(informer.not_served().is_none());
    shutdown.cancel();
    run.await.unwrap().unwrap();
    crds.delete("sprockets.any.kinformer.dev", &DeleteParams::default())
        .await
        .unwrap();
}

fn gizmo_crd() -> CustomResourceDefinition {
    let mut crd = Gizmo::crd();
    // The server accepts any spec; the Rust type wants an integer size.
    crd.spec.versions[0].schema = Some(
        serde_json::from_value(serde_json::json!({
            "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }))
        .unwrap(),
    );
    crd
}

fn gizmo(name: &str, size: serde_json::Value) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "any.kinformer.dev/v1", "kind": "Gizmo",
        "metadata": {"name": name}, "spec": {"size": size}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_that_do_not_fit_the_rust_type_are_reported_by_name_and_the_rest_cached() {
    let (_, client, ns) = setup("gizmos").await;
    install(&client, &gizmo_crd()).await;
    let resource = ApiResource::erase::<Gizmo>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    for (name, size) in [
        ("ok-1", serde_json::json!(1)),
        ("bad-listed", serde_json::json!("big")),
        ("ok-2", serde_json::json!(2)),
    ] {
        raw.create(&PostParams::default(), &gizmo(name, size))
            .await
            .unwrap();
    }
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<Gizmo>::namespaced(client.clone(), &ns),
        common::options(),
    );
    let errors = errors_seen(&informer);
    let shutdown = CancellationToken::new();
    let run = {
        let (informer, shutdown) = (informer.clone(), shutdown.clone());
        tokio::spawn(async move { informer.run(shutdown).await })
    };
    wait_synced(&informer).await;
    let reported = |name: &str| errors.any(name);
    assert!(
        reported(&format!("{ns}/bad-listed")),
        "{:?}",
        errors.messages()
    );
    // One that arrives through the watch, then a good one after it.
    raw.create(
        &PostParams::default(),
        &gizmo("bad-watched", serde_json::json!("huge")),
    )
    .await
    .unwrap();
    raw.create(&PostParams::default(), &gizmo("ok-3", serde_json::json!(3)))
        .await
        .unwrap();
    eventually("ok-3 cached", async || {
        informer
            .indexer()
            .get_by_key(&format!("{ns}/ok-3"))
            .is_some()
    })
    .await;
    eventually("bad-watched reported by name", async || {
        reported(&format!("{ns}/bad-watched"))
    })
    .await;
    let mut cached: Vec<String> = informer
        .indexer()
        .list()
        .iter()
        .map(|g| g.metadata.name.clone().unwrap())
        .collect();
    cached.sort();
    assert_eq!(cached, ["ok-1", "ok-2", "ok-3"]);
    assert!(informer.failure().is_none());
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

/// Whether every object `informer` cached has managedFields.
fn all_keep_managed_fields<K>(informer: &SharedIndexInformer<K>) -> Vec<bool>
where
    K: kube_client::Resource + kinformer_store::Object + Clone,
{
    informer
        .indexer()
        .list()
        .iter()
        .map(|o| o.meta().managed_fields.is_some())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_factorys_informers_drop_managed_fields_unless_asked_to_keep_them() {
    let (_, client, ns) = setup("managed-fields").await;
    install(&client, &Widget::crd()).await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    widgets
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &common::pod("p"))
        .await
        .unwrap();
    let resource = ApiResource::erase::<Widget>(&());
    let shutdown = CancellationToken::new();
    // Pods in protobuf, metadata in protobuf, a typed custom resource and a
    // dynamic one in JSON: each path drops them by default.
    for keep in [false, true] {
        let mut factory = SharedInformerFactory::new(client.clone()).namespace(&ns);
        if keep {
            factory = factory.keep_managed_fields();
        }
        let (pods, metadata) = (factory.informer::<Pod>(), factory.metadata::<Pod>());
        let (typed, dynamic) = (factory.informer::<Widget>(), factory.dynamic(&resource));
        factory.start(&shutdown);
        assert!(
            factory
                .wait_for_cache_sync(&shutdown)
                .await
                .iter()
                .all(|(_, synced)| *synced)
        );
        let want = vec![keep];
        assert_eq!(all_keep_managed_fields(&pods), want, "Pod, kept: {keep}");
        assert_eq!(
            all_keep_managed_fields(&metadata),
            want,
            "metadata, kept: {keep}"
        );
        assert_eq!(
            all_keep_managed_fields(&typed),
            want,
            "Widget, kept: {keep}"
        );
        assert_eq!(
            all_keep_managed_fields(&dynamic),
            want,
            "dynamic, kept: {keep}"
        );
    }
    shutdown.cancel();
}
