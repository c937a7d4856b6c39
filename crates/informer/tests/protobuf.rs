//! The same objects from the real server in both wire formats decode to
//! equal values: for each kind, a list and a watch in protobuf against a
//! list and a watch in JSON.

use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Node, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer_envtest::TestEnv;
use kinformer_informer::{ApiListerWatcher, ListRequest, ListerWatcher, WatchRequest, WireFormat};
use kube_client::api::{Api, PostParams};
use kube_client::core::WatchEvent;
use kube_client::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

mod common;
use common::spec_pod;

async fn create<K>(api: &Api<K>, json: serde_json::Value)
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let obj: K = serde_json::from_value(json.clone()).unwrap_or_else(|e| panic!("{e}: {json}"));
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {json}: {e}"));
}

/// The first `n` ADDED objects of a watch of `lw` from "0" (the server's
/// current state, from its watch cache).
async fn initial_events<K>(lw: &ApiListerWatcher<K>, n: usize) -> Vec<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let request = WatchRequest {
        resource_version: "0".into(),
        timeout: Duration::from_secs(30),
        allow_bookmarks: false,
        send_initial_events: false,
    };
    let mut stream = lw.watch(request).await.unwrap();
    let mut objects = Vec::new();
    while objects.len() < n {
        match tokio::time::timeout(Duration::from_secs(20), stream.next()).await {
            Ok(Some(Ok(WatchEvent::Added(o)))) => objects.push(o),
            Ok(Some(Ok(_))) => {}
            other => panic!("watching {}: {other:?}", lw.describe()),
        }
    }
    objects
}

/// Lists `K` in both formats, then watches from "0" in both, and asserts
/// that every object decodes equal, with managedFields kept and with them
/// dropped (the default); returns how many there were.
async fn same_in_both<K>(client: &Client, namespace: Option<&str>) -> usize
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + PartialEq
        + Send
        + Sync
        + 'static,
{
    let kept = same_in_both_keeping::<K>(client, namespace, true).await;
    let dropped = same_in_both_keeping::<K>(client, namespace, false).await;
    assert_eq!(kept, dropped);
    kept
}

async fn same_in_both_keeping<K>(client: &Client, namespace: Option<&str>, keep: bool) -> usize
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + PartialEq
        + Send
        + Sync
        + 'static,
{
    let lw = |format| {
        let lw = ApiListerWatcher::<K>::new(client.clone(), namespace).wire_format(format);
        if keep { lw.keep_managed_fields() } else { lw }
    };
    let (json, proto) = (lw(WireFormat::Json), lw(WireFormat::Auto));
    assert!(proto.uses_protobuf(), "{} has no protobuf", K::kind(&()));
    assert!(!json.uses_protobuf());
    // A quorum read each: the same state.
    let from_json = json.list(ListRequest::default()).await.unwrap();
    let from_proto = proto.list(ListRequest::default()).await.unwrap();
    assert!(from_proto.skipped.is_empty(), "{:?}", from_proto.skipped);
    assert!(
        !from_json.items.is_empty(),
        "no {} to compare",
        K::kind(&())
    );
    let key = |o: &K| (o.meta().namespace.clone(), o.meta().name.clone());
    let (mut a, mut b) = (from_json.items, from_proto.items);
    // Kept, most objects have them (not every object the server writes
    // itself does); dropped, none has.
    let with = a
        .iter()
        .chain(&b)
        .filter(|o| o.meta().managed_fields.is_some())
        .count();
    assert_eq!(
        with > 0,
        keep,
        "{}: {with} with managedFields, kept: {keep}",
        K::kind(&())
    );
    a.sort_by_key(key);
    b.sort_by_key(key);
    if a != b {
        for (j, p) in a.iter().zip(&b) {
            assert_eq!(j, p, "{} differs between JSON and protobuf", K::kind(&()));
        }
        assert_eq!(a.len(), b.len());
    }
    // The watch's initial events, in both formats.
    let mut watched = Vec::new();
    for lw in [&json, &proto] {
        let mut objects = initial_events(lw, a.len()).await;
        objects.sort_by_key(key);
        watched.push(objects);
    }
    assert_eq!(
        watched[0],
        watched[1],
        "{} watch events differ",
        K::kind(&())
    );
    a.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_objects_decode_equal_from_protobuf_and_from_json() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("proto").await.unwrap();
    let client = env.client().unwrap();
    let n = Some(ns.as_str());

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(&pods, spec_pod("rich")).await;
    create(&pods, serde_json::json!({"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})).await;
    // Empty repeated fields and maps: absent in protobuf, `[]` or `{}` in
    // the JSON the client sent.
    create(&pods, serde_json::json!({"metadata": {"name": "empties", "labels": {}, "finalizers": []},
        "spec": {"containers": [{"name": "c", "image": "x", "args": [], "command": [], "env": [], "ports": [],
            "volumeMounts": [], "resources": {"limits": {}, "requests": {}}}],
            "volumes": [], "tolerations": [], "imagePullSecrets": [], "nodeSelector": {}}})).await;
    assert_eq!(same_in_both::<Pod>(&client, n).await, 3);

    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    create(&services, serde_json::json!({"metadata": {"name": "svc"}, "spec": {
        "selector": {"app": "web"},
        "ports": [{"name": "a", "port": 80, "targetPort": 8080}, {"name": "b", "port": 443, "targetPort": "https", "protocol": "TCP"}],
        "sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}
    }})).await;
    create(&services, serde_json::json!({"metadata": {"name": "headless"}, "spec": {"clusterIP": "None", "ports": [{"port": 1}]}})).await;
    assert_eq!(same_in_both::<Service>(&client, n).await, 2);

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    // A ReplicaSet's pods may have no deadline.
    let mut template_spec = spec_pod("t")["spec"].clone();
    template_spec
        .as_object_mut()
        .unwrap()
        .remove("activeDeadlineSeconds");
    create(&deployments, serde_json::json!({"metadata": {"name": "d"}, "spec": {
        "replicas": 0,
        "selector": {"matchLabels": {"app": "d"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
        "revisionHistoryLimit": 3,
        "template": {"metadata": {"labels": {"app": "d", "tier": "x"}}, "spec": template_spec}
    }})).await;
    assert_eq!(same_in_both::<Deployment>(&client, n).await, 1);

    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    create(
        &configmaps,
        serde_json::json!({"metadata": {"name": "settings"},
        "data": {"a": "1", "empty": "", "json": "{\"x\": [1, 2]}"},
        "binaryData": {"bin": "AAEC/w=="}, "immutable": false}),
    )
    .await;
    create(
        &configmaps,
        serde_json::json!({"metadata": {"name": "nothing"}}),
    )
    .await;
    create(
        &configmaps,
        serde_json::json!({"metadata": {"name": "empty-maps", "annotations": {}}, "data": {}, "binaryData": {}}),
    )
    .await;
    // Strings that are not UTF-8, as a Go client can write them in
    // protobuf: the server's JSON shows U+FFFD for each bad byte.
    let body = common::protobuf::config_map(
        &ns,
        "not-utf8",
        &[(b"key", b"v\xff\xfew"), (b"truncated", b"\xf0\x9f\x98")],
    );
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    common::protobuf::send(&client, http::Method::POST, &path, body)
        .await
        .unwrap();
    assert_eq!(same_in_both::<ConfigMap>(&client, n).await, 4);
    let read = configmaps.get("not-utf8").await.unwrap();
    assert_eq!(read.data.unwrap()["key"], "v\u{FFFD}\u{FFFD}w");

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    create(
        &secrets,
        serde_json::json!({"metadata": {"name": "s"}, "type": "Opaque",
        "data": {"k": "c2VjcmV0", "zero": ""}, "stringData": {"plain": "text"}}),
    )
    .await;
    assert_eq!(same_in_both::<Secret>(&client, n).await, 1);

    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    create(
        &leases,
        serde_json::json!({"metadata": {"name": "l"}, "spec": {
            "holderIdentity": "me", "leaseDurationSeconds": 15, "leaseTransitions": 0,
            "acquireTime": "2026-01-02T03:04:05.123456Z", "renewTime": "2026-01-02T03:04:06.000001Z"
        }}),
    )
    .await;
    assert_eq!(same_in_both::<Lease>(&client, n).await, 1);

    let core_events: Api<CoreEvent> = Api::namespaced(client.clone(), &ns);
    create(&core_events, serde_json::json!({"metadata": {"name": "e1"},
        "involvedObject": {"kind": "Pod", "name": "rich", "namespace": ns},
        "reason": "Started", "message": "started", "type": "Normal", "count": 3,
        "firstTimestamp": "2026-01-02T03:04:05Z", "lastTimestamp": "2026-01-02T03:05:05Z",
        "eventTime": "2026-01-02T03:04:05.654321Z", "reportingComponent": "test", "reportingInstance": "t1", "action": "Start",
        "series": {"count": 2, "lastObservedTime": "2026-01-02T03:06:05.000100Z"}, "source": {"component": "test"}})).await;
    // Both Event APIs read one store: each lists the other's too.
    assert!(same_in_both::<CoreEvent>(&client, n).await >= 1);

    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    create(&events, serde_json::json!({"metadata": {"name": "e2"},
        "eventTime": "2026-01-02T03:04:05.000007Z", "reportingController": "example.com/c", "reportingInstance": "i",
        "action": "Sync", "reason": "Synced", "type": "Warning", "note": "n",
        "regarding": {"kind": "Pod", "name": "rich", "namespace": ns},
        "deprecatedCount": 0})).await;
    assert!(same_in_both::<Event>(&client, n).await >= 2);

    let nodes: Api<Node> = Api::all(client.clone());
    create(&nodes, serde_json::json!({"metadata": {"name": format!("{ns}-node"), "labels": {"kubernetes.io/hostname": "h"}},
        "spec": {"podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24"], "unschedulable": true,
                 "taints": [{"key": "k", "effect": "NoSchedule", "timeAdded": "2026-01-02T03:04:05Z"}]}})).await;
    assert!(same_in_both::<Node>(&client, None).await >= 1);

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let group = format!("{ns}.example.com");
    create(&crds, serde_json::json!({"metadata": {"name": format!("widgets.{group}")}, "spec": {
        "group": group, "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"], "categories": ["all"]},
        "versions": [{"name": "v1", "served": true, "storage": true,
            "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
            "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size", "priority": 0}],
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "required": ["size"], "properties": {
                    "size": {"type": "integer", "minimum": 0, "maximum": 10, "default": 3},
                    "replicas": {"type": "integer", "format": "int32"},
                    "mode": {"type": "string", "enum": ["a", "b"], "default": "a", "pattern": "^[ab]$"},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4, "x-kubernetes-list-type": "set"},
                    "either": {"x-kubernetes-int-or-string": true},
                    // Floats JSON reads one ulp off without a correctly rounded parse.
                    "ratio": {"type": "number", "maximum": 1.0 / 11.0, "minimum": 0.1 + 0.2, "multipleOf": 1e-7}
                }, "x-kubernetes-validations": [{"rule": "self.size >= 0", "message": "size"}]},
                "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}}
            }}}
        }]
    }})).await;
    // Compared once its status has settled (the server writes it twice).
    let name = format!("widgets.{ns}.example.com");
    for _ in 0..300 {
        let crd = crds.get(&name).await.unwrap();
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(same_in_both::<CustomResourceDefinition>(&client, None).await >= 1);
}

/// Metadata-only informers ask for `PartialObjectMetadata` in protobuf as
/// client-go's metadata client does; what they cache equals the JSON's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_only_objects_decode_equal_from_protobuf_and_from_json() {
    use kube_client::core::PartialObjectMeta;
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("proto-meta").await.unwrap();
    let client = env.client().unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(&pods, spec_pod("rich")).await;
    // The Pod's own uid: the control plane's garbage collector deletes a
    // child whose owner is not there.
    let uid = pods.get("rich").await.unwrap().metadata.uid.unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    create(&configmaps, serde_json::json!({"metadata": {"name": "c", "labels": {"a": "b"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "rich", "uid": uid, "controller": true}]}})).await;
    async fn both<K>(client: &Client, ns: &str) -> usize
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let lw = |format| {
            ApiListerWatcher::<PartialObjectMeta<K>>::namespaced(client.clone(), ns)
                .wire_format(format)
                .keep_managed_fields()
        };
        let (json, proto) = (lw(WireFormat::Json), lw(WireFormat::Auto));
        assert!(proto.uses_protobuf() && !json.uses_protobuf());
        let view = |items: Vec<PartialObjectMeta<K>>| {
            let mut v: Vec<_> = items.into_iter().map(|o| (o.types, o.metadata)).collect();
            v.sort_by_key(|(_, m)| m.name.clone());
            v
        };
        let a = view(json.list(ListRequest::default()).await.unwrap().items);
        let b = view(proto.list(ListRequest::default()).await.unwrap().items);
        assert!(!a.is_empty());
        assert_eq!(
            a,
            b,
            "{} metadata differs between JSON and protobuf",
            K::kind(&())
        );
        // The watch's initial events too.
        let mut watched = Vec::new();
        for lw in [&json, &proto] {
            watched.push(view(initial_events(lw, a.len()).await));
        }
        assert_eq!(watched[0], watched[1]);
        a.len()
    }
    assert_eq!(both::<Pod>(&client, &ns).await, 1);
    assert_eq!(both::<ConfigMap>(&client, &ns).await, 1);
}

mod generated {
    //! Generated objects, created on the real server and read back in both
    //! formats: the decoded values are equal.

    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Strings the server accepts as data values and annotations: any
    /// Unicode scalar but NUL-free, with escapes JSON must write.
    fn text() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                Just('"'),
                Just('\\'),
                Just('\n'),
                Just('\u{2028}'),
                Just('é'),
                Just('😀'),
                proptest::char::range(' ', '~'),
                proptest::char::range('\u{a0}', '\u{d7ff}'),
            ],
            0..24,
        )
        .prop_map(|c| c.into_iter().collect())
    }

    fn key() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9.-]{0,10}[a-z0-9]"
    }

    fn configmap() -> impl Strategy<Value = serde_json::Value> {
        (
            proptest::collection::btree_map(key(), text(), 0..5),
            proptest::collection::btree_map(key(), proptest::collection::vec(any::<u8>(), 0..16), 0..3),
            proptest::collection::btree_map(key(), "[a-z0-9]{0,8}", 0..3),
            proptest::collection::btree_map(key(), text(), 0..3),
            proptest::option::of(any::<bool>()),
        )
            .prop_filter("data and binaryData keys are disjoint", |(d, b, ..)| {
                d.keys().all(|k| !b.contains_key(k))
            })
            .prop_map(|(data, binary, labels, annotations, immutable)| {
                use base64::Engine;
                let binary: BTreeMap<_, _> = binary
                    .into_iter()
                    .map(|(k, v)| (k, base64::engine::general_purpose::STANDARD.encode(v)))
                    .collect();
                let mut cm = serde_json::json!({
                    "metadata": {"generateName": "gen-", "labels": labels, "annotations": annotations},
                    "data": data, "binaryData": binary,
                });
                if let Some(i) = immutable {
                    cm["immutable"] = i.into();
                }
                cm
            })
    }

    fn pod() -> impl Strategy<Value = serde_json::Value> {
        (
            proptest::collection::vec((1..65535i32, proptest::option::of(0..65535i32)), 0..3),
            proptest::collection::vec((key(), text()), 0..3),
            proptest::sample::select(vec!["0", "1", "100m", "1.5", "2Gi", "1e3", "500M"]),
            proptest::option::of(any::<bool>()),
            proptest::option::of(0..3600i64),
            proptest::option::of(prop_oneof![
                (1..65535i32).prop_map(serde_json::Value::from),
                "[a-z]{1,8}".prop_map(serde_json::Value::from)
            ]),
        )
            .prop_map(|(ports, env, quantity, flag, grace, probe_port)| {
                let ports: Vec<_> = ports
                    .iter()
                    .enumerate()
                    .map(|(i, (p, host))| {
                        let mut port =
                            serde_json::json!({"containerPort": p, "name": format!("p{i}")});
                        if let Some(h) = host {
                            port["hostPort"] = (*h).into();
                        }
                        port
                    })
                    .collect();
                let env: Vec<_> = env
                    .iter()
                    .enumerate()
                    .map(|(i, (_, v))| serde_json::json!({"name": format!("E{i}"), "value": v}))
                    .collect();
                let mut container = serde_json::json!({
                    "name": "c", "image": "x", "ports": ports, "env": env,
                    "resources": {"requests": {"cpu": quantity, "memory": quantity}},
                });
                if let Some(f) = flag {
                    container["tty"] = f.into();
                    container["stdin"] = f.into();
                }
                if let Some(p) = probe_port {
                    container["readinessProbe"] = serde_json::json!({"httpGet": {"port": p}});
                }
                let mut pod = serde_json::json!({
                    "metadata": {"generateName": "gen-"},
                    "spec": {"containers": [container]},
                });
                if let Some(g) = grace {
                    pod["spec"]["terminationGracePeriodSeconds"] = g.into();
                }
                pod
            })
    }

    /// Creates `objects` in a fresh namespace and compares the two formats.
    fn round_trip<K>(objects: Vec<serde_json::Value>)
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Serialize
            + Debug
            + PartialEq
            + Send
            + Sync
            + 'static,
    {
        // One runtime for every case: the shared control plane lives as long.
        static RUNTIME: std::sync::LazyLock<tokio::runtime::Runtime> =
            std::sync::LazyLock::new(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap()
            });
        RUNTIME.block_on(async {
            let env = TestEnv::shared().await.unwrap();
            let ns = env.create_namespace("proto-gen").await.unwrap();
            let client = env.client().unwrap();
            let api: Api<K> = Api::namespaced(client.clone(), &ns);
            for o in objects {
                create(&api, o).await;
            }
            same_in_both::<K>(&client, Some(&ns)).await;
        });
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]

        #[test]
        fn generated_configmaps_decode_equal_from_protobuf_and_from_json(
            objects in proptest::collection::vec(configmap(), 1..6)
        ) {
            round_trip::<ConfigMap>(objects);
        }

        #[test]
        fn generated_pods_decode_equal_from_protobuf_and_from_json(
            objects in proptest::collection::vec(pod(), 1..6)
        ) {
            round_trip::<Pod>(objects);
        }
    }
}
