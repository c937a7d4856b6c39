//! Objects the real server accepts that are unusual or hostile: strings
//! that are not UTF-8 (written in protobuf, as a Go client can), schemas
//! nested a thousand levels deep, floats JSON reads one ulp off without a
//! correctly rounded parse. Each is cached by informers over both wire
//! formats, and none is ever taken for deleted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kinformer_envtest::TestEnv;
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, ResourceEventHandlerFuncs, SharedIndexInformer, WireFormat,
};
use kinformer_store::Object;
use kube_client::api::{Api, DeleteParams, PostParams};
use kube_client::core::{ApiResource, DynamicObject, GroupVersionKind};

mod common;
use common::wait_synced;

/// Each wire format, with managedFields dropped (the default) and kept.
const FORMATS: [(WireFormat, bool); 4] = [
    (WireFormat::Auto, false),
    (WireFormat::Auto, true),
    (WireFormat::Json, false),
    (WireFormat::Json, true),
];

fn keeping<K>(lw: ApiListerWatcher<K>, keep: bool) -> ApiListerWatcher<K>
where
    K: kube_client::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    if keep { lw.keep_managed_fields() } else { lw }
}

/// An informer on `lw`, running until the token is cancelled.
fn run<K>(lw: ApiListerWatcher<K>) -> (SharedIndexInformer<K>, CancellationToken)
where
    K: kube_client::Resource
        + Object
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Clone + Send + Sync,
{
    let informer = SharedIndexInformer::new(lw, common::options());
    let shutdown = CancellationToken::new();
    let (i, s) = (informer.clone(), shutdown.clone());
    tokio::spawn(async move { i.run(s).await });
    (informer, shutdown)
}

/// Waits up to 30 s for `check` to hold.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..300 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_to_strings_that_are_not_utf8_keeps_the_object_cached_never_deleted() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("not-utf8").await.unwrap();
    let client = env.client().unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "c"}, "data": {"key": "plain"}
    }))
    .unwrap();
    configmaps
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();

    let mut informers = Vec::new();
    let deletes = Arc::new(AtomicUsize::new(0));
    for (format, keep) in FORMATS {
        let lw = ApiListerWatcher::<ConfigMap>::namespaced(client.clone(), &ns).wire_format(format);
        let (informer, shutdown) = run(keeping(lw, keep));
        let d = Arc::clone(&deletes);
        informer
            .add_event_handler(ResourceEventHandlerFuncs::new().on_delete(move |_| {
                d.fetch_add(1, Ordering::SeqCst);
            }))
            .unwrap();
        wait_synced(&informer).await;
        informers.push((informer, shutdown));
    }
    // A Go client writes bytes that are not UTF-8 (a PUT without a
    // resourceVersion: unconditional).
    let body = common::protobuf::config_map(&ns, "c", &[(b"key", b"v\xffw\xf0\x9f\x98")]);
    let path = format!("/api/v1/namespaces/{ns}/configmaps/c");
    common::protobuf::send(&client, http::Method::PUT, &path, body)
        .await
        .unwrap();
    let want = "v\u{FFFD}w\u{FFFD}\u{FFFD}\u{FFFD}";
    assert_eq!(
        configmaps.get("c").await.unwrap().data.unwrap()["key"],
        want
    );
    for (informer, _) in &informers {
        let key = format!("{ns}/c");
        eventually("the update cached", || {
            informer
                .indexer()
                .get_by_key(&key)
                .and_then(|c| c.data.clone())
                .is_some_and(|d| d["key"] == want)
        })
        .await;
        let stats = informer.reflector_stats().unwrap();
        assert_eq!(stats.undecodable_objects.load(Ordering::Relaxed), 0);
    }
    assert_eq!(
        deletes.load(Ordering::SeqCst),
        0,
        "the object was never deleted"
    );
    for (_, shutdown) in informers {
        shutdown.cancel();
    }
}

fn depth_of(mut schema: &JSONSchemaProps) -> usize {
    let mut depth = 0;
    while let Some(next) = schema.properties.as_ref().and_then(|p| p.get("a")) {
        depth += 1;
        schema = next;
    }
    depth
}

/// A CRD whose `spec` schema nests `properties` `depth` levels deep, as
/// JSON text (serde_json would recurse once per level to write it).
fn deep_crd(group: &str, depth: usize) -> String {
    let schema = format!(
        "{}{{\"type\":\"string\"}}{}",
        r#"{"type":"object","properties":{"a":"#.repeat(depth),
        "}}".repeat(depth)
    );
    format!(
        r#"{{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
        "metadata":{{"name":"deeps.{group}"}},
        "spec":{{"group":"{group}","scope":"Namespaced",
          "names":{{"plural":"deeps","singular":"deep","kind":"Deep","listKind":"DeepList"}},
          "versions":[{{"name":"v1","served":true,"storage":true,"schema":{{"openAPIV3Schema":
            {{"type":"object","properties":{{"spec":{schema}}}}}}}}}]}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_nested_a_thousand_levels_deep_is_cached_over_both_wire_formats() {
    // Before the decoders' stacks grew, listing it in protobuf aborted the
    // process (stack overflow) and JSON refused it (serde_json's limit).
    const DEPTH: usize = 1000;
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("deep").await.unwrap();
    let client = env.client().unwrap();
    let group = format!("{ns}.example.com");
    let request = http::Request::post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(deep_crd(&group, DEPTH).into_bytes())
        .unwrap();
    client.request_text(request).await.unwrap();
    let name = format!("deeps.{group}");
    let mut cached = Vec::new();
    for (format, keep) in FORMATS {
        let lw = ApiListerWatcher::<CustomResourceDefinition>::all(client.clone())
            .fields(&format!("metadata.name={name}"))
            .wire_format(format);
        let (informer, shutdown) = run(keeping(lw, keep));
        wait_synced(&informer).await;
        let crd = informer.indexer().get_by_key(&name).expect("cached");
        let spec = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| s.properties.as_ref())
            .and_then(|p| p.get("spec"))
            .expect("the spec schema");
        assert_eq!(
            depth_of(spec),
            DEPTH,
            "{format:?}, managedFields kept: {keep}"
        );
        // Kept, they are as deep as the schema (each field has an entry).
        assert_eq!(crd.metadata.managed_fields.is_some(), keep);
        let stats = informer.reflector_stats().unwrap();
        assert_eq!(stats.undecodable_objects.load(Ordering::Relaxed), 0);
        shutdown.cancel();
        cached.push(crd);
    }
    // The specs are equal in both formats, managedFields kept or not (the
    // status may have moved on between the lists). Comparing (like
    // cloning, printing or dropping the last copy) recurses once per level
    // on the caller's stack, deeper than a debug build's 2 MiB test thread
    // holds: on a stack of its own.
    assert!(stacker::grow(256 << 20, move || {
        let equal = cached.windows(2).all(|w| w[0].spec == w[1].spec);
        drop(cached);
        equal
    }));
    // Deleted by hand: kube-client would decode the answer with
    // serde_json's recursion limit.
    let request = http::Request::delete(format!(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    ))
    .body(Vec::new())
    .unwrap();
    client.request_text(request).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floats_of_a_custom_resource_are_cached_bit_for_bit() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("floats").await.unwrap();
    let client = env.client().unwrap();
    let group = format!("{ns}.example.com");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("gauges.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"plural": "gauges", "singular": "gauge", "kind": "Gauge"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema":
                {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let gvk = GroupVersionKind::gvk(&group, "v1", "Gauge");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "gauges");
    // 1/n for n < 200 includes the floats (1/11 among them) that a parse
    // without correct rounding reads one ulp off.
    let floats: Vec<f64> = (1..200).map(|n| 1.0 / f64::from(n)).collect();
    let gauges: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    let gauge: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": format!("{group}/v1"), "kind": "Gauge",
        "metadata": {"name": "g"}, "spec": {"values": floats}
    }))
    .unwrap();
    let mut created = false;
    for _ in 0..100 {
        // Refused until the CRD is established.
        if gauges.create(&PostParams::default(), &gauge).await.is_ok() {
            created = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(created, "the custom resource could not be created");
    let lw = ApiListerWatcher::<DynamicObject>::namespaced_with(client.clone(), &ns, &resource);
    let (informer, shutdown) = run(lw);
    wait_synced(&informer).await;
    let cached = informer.indexer().get_by_key(&format!("{ns}/g")).unwrap();
    let values: Vec<u64> = cached.data["spec"]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap().to_bits())
        .collect();
    let want: Vec<u64> = floats.iter().map(|f| f.to_bits()).collect();
    assert_eq!(values, want);
    shutdown.cancel();
    crds.delete(&format!("gauges.{group}"), &DeleteParams::default())
        .await
        .unwrap();
}
