//! Helpers shared by the tests that run against the real API server.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kinformer_informer::consistency::{Difference, LastSeen, diff, diff_cache, server_versions};
use kinformer_informer::{FifoKind, InformerOptions, SharedIndexInformer, error_chain};
use kinformer_store::Object;
use kube_client::Resource;
use kube_client::api::{Api, DeleteParams, PostParams};
use serde::de::DeserializeOwned;

/// The queue the informers of these tests use: `KINFORMER_TEST_FIFO=delta`,
/// `real` or `atomic` (`cargo xtask test` runs the informer tests once per
/// queue), otherwise the default.
pub fn fifo() -> FifoKind {
    match std::env::var("KINFORMER_TEST_FIFO").as_deref() {
        Ok("delta") => FifoKind::DeltaFifo,
        Ok("real") => FifoKind::RealFifo,
        Ok("atomic") => FifoKind::AtomicFifo,
        Ok(other) => panic!("KINFORMER_TEST_FIFO={other}: expected delta, real or atomic"),
        Err(_) => FifoKind::default(),
    }
}

/// Whether the informers of these tests keep a compact cache: when
/// `KINFORMER_TEST_CACHE=compact` (`cargo xtask test` runs the informer
/// tests again on a RealFifo with a compact cache), otherwise whole objects.
pub fn compact_cache() -> bool {
    std::env::var("KINFORMER_TEST_CACHE").as_deref() == Ok("compact")
}

/// Informer options on the queue of [`fifo`], with the cache of
/// [`compact_cache`] (a small decoded-object cache, so that reads both hit
/// it and decode).
pub fn options<K: serde::Serialize + DeserializeOwned + 'static>() -> InformerOptions<K> {
    let options = InformerOptions::new().fifo(fifo());
    if compact_cache() {
        options.compact(kinformer_informer::Compact::json().decoded_cache(8))
    } else {
        options
    }
}

/// Every list and watch error an informer reported, with when.
#[derive(Clone, Default)]
pub struct Reported(Arc<parking_lot::Mutex<Vec<(Instant, String)>>>);

impl Reported {
    /// Whether any reported error contains `needle`.
    pub fn any(&self, needle: &str) -> bool {
        self.0.lock().iter().any(|(_, e)| e.contains(needle))
    }

    /// The messages so far.
    pub fn messages(&self) -> Vec<String> {
        self.0.lock().iter().map(|(_, e)| e.clone()).collect()
    }

    /// The errors so far, with when they were reported.
    pub fn all(&self) -> Vec<(Instant, String)> {
        self.0.lock().clone()
    }
}

/// Collects the errors `informer` reports (set before it starts).
pub fn errors_seen<K: Object + Clone>(informer: &SharedIndexInformer<K>) -> Reported {
    let reported = Reported::default();
    let sink = Arc::clone(&reported.0);
    informer
        .set_watch_error_handler(move |e| sink.lock().push((Instant::now(), error_chain(e))))
        .unwrap();
    reported
}

/// A Pod that the API server accepts without nodes.
pub fn pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"gen": "0"}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]}
    }))
    .unwrap()
}

/// Creates the Pods, 16 at a time.
pub async fn create_pods(api: &Api<Pod>, names: impl Iterator<Item = String>) {
    stream::iter(names)
        .for_each_concurrent(16, |name| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &pod(&name))
                    .await
                    .unwrap();
            }
        })
        .await;
}

/// Deletes the Pods, 16 at a time.
pub async fn delete_pods(api: &Api<Pod>, names: impl Iterator<Item = String>) {
    stream::iter(names)
        .for_each_concurrent(16, |name| {
            let api = api.clone();
            async move {
                api.delete(&name, &DeleteParams::default()).await.unwrap();
            }
        })
        .await;
}

/// Waits up to 30 s for the informer to sync.
pub async fn wait_synced<K: Object + Clone>(informer: &SharedIndexInformer<K>) {
    for _ in 0..300 {
        if informer.has_synced() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("informer did not sync in 30 s");
}

/// Waits until the cache and every handler agree with the server; panics
/// with the differences otherwise, and if any handler got a notification
/// that did not follow from the one before it (a sequence violation).
pub async fn no_difference<'a, K>(
    api: &Api<K>,
    informer: &SharedIndexInformer<K>,
    seen: impl IntoIterator<Item = &'a LastSeen>,
    within: Duration,
) where
    K: Resource + Object + Clone + DeserializeOwned + std::fmt::Debug,
{
    let seen: Vec<&LastSeen> = seen.into_iter().collect();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let cache = diff_cache(informer, api).await.unwrap();
        let server = server_versions(api).await.unwrap();
        let handler: Vec<Difference> = seen
            .iter()
            .flat_map(|s| diff(&server, &s.snapshot()))
            .collect();
        if cache.is_empty() && handler.is_empty() {
            assert_no_violations(&seen);
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let show = |d: &[Difference]| {
                d.iter()
                    .take(10)
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            panic!(
                "after {within:?}: cache differs in {} ({}); handlers differ in {} ({})",
                cache.len(),
                show(&cache),
                handler.len(),
                show(&handler)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Panics with the sequence violations any of the handlers recorded.
pub fn assert_no_violations(seen: &[&LastSeen]) {
    let violations: Vec<String> = seen
        .iter()
        .flat_map(|s| s.violations())
        .map(|v| v.to_string())
        .collect();
    assert!(
        violations.is_empty(),
        "{} sequence violations: {}",
        violations.len(),
        violations
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ")
    );
}

/// A Pod with every kind of field the server lets a test set: maps,
/// quantities, int-or-strings, probes, empty strings and zero values.
pub fn spec_pod(name: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "name": name,
            "labels": {"app": "web", "empty": ""},
            "annotations": {"note": "ünïcödé \"quoted\" \n line"},
            "finalizers": ["example.com/keep"],
        },
        "spec": {
            "activeDeadlineSeconds": 1,
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "nodeSelector": {"disk": "ssd"},
            "hostNetwork": false,
            "enableServiceLinks": false,
            "tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute", "tolerationSeconds": 0}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]
            }}},
            "securityContext": {"runAsUser": 0, "runAsNonRoot": false, "fsGroup": 2000, "sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"}]},
            "containers": [{
                "name": "c",
                "image": "registry.example/app:1.2.3",
                "command": ["/bin/app", "--flag=1"],
                "args": [""],
                "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}, {"containerPort": 53, "protocol": "UDP", "hostPort": 0}],
                "env": [
                    {"name": "PLAIN", "value": "x"},
                    {"name": "EMPTY", "value": ""},
                    {"name": "FROM_FIELD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "FROM_RESOURCE", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}}
                ],
                "envFrom": [{"configMapRef": {"name": "settings", "optional": true}, "prefix": "CFG_"}],
                "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "1.5Gi", "ephemeral-storage": "2G"}},
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "httpHeaders": [{"name": "X", "value": "y"}]}, "initialDelaySeconds": 0, "periodSeconds": 5},
                "readinessProbe": {"tcpSocket": {"port": "http"}, "failureThreshold": 1},
                "startupProbe": {"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 1},
                "lifecycle": {"preStop": {"sleep": {"seconds": 1}}},
                "securityContext": {"privileged": false, "readOnlyRootFilesystem": true, "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}},
                "volumeMounts": [{"name": "cfg", "mountPath": "/cfg", "readOnly": true}, {"name": "scratch", "mountPath": "/tmp", "subPath": "x"}],
                "imagePullPolicy": "IfNotPresent",
                "stdin": false,
                "tty": false
            }],
            "volumes": [
                {"name": "cfg", "configMap": {"name": "settings", "items": [{"key": "a", "path": "a.txt", "mode": 420}], "defaultMode": 0}},
                {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "128Mi"}},
                {"name": "secret", "secret": {"secretName": "s", "optional": false}},
                {"name": "proj", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3600, "audience": "api"}}]}}
            ]
        }
    })
}

/// Hand-written Kubernetes protobuf bodies, for writing what a Go client
/// can write and a Rust one built on k8s-openapi cannot (strings that are
/// not UTF-8).
pub mod protobuf {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// Field `number` holding `bytes` (length-delimited).
    pub fn ld(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        varint(&mut out, number << 3 | 2);
        varint(&mut out, bytes.len() as u64);
        out.extend_from_slice(bytes);
        out
    }

    /// `k8s\0` and the `runtime.Unknown` envelope around `raw`.
    pub fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let type_meta = [ld(1, api_version.as_bytes()), ld(2, kind.as_bytes())].concat();
        [b"k8s\0".to_vec(), ld(1, &type_meta), ld(2, raw)].concat()
    }

    /// A ConfigMap `namespace/name` whose `data` holds `data`'s byte pairs.
    pub fn config_map(namespace: &str, name: &str, data: &[(&[u8], &[u8])]) -> Vec<u8> {
        // ObjectMeta{1: name, 3: namespace}; ConfigMap{1: metadata, 2: data entries}.
        let meta = [ld(1, name.as_bytes()), ld(3, namespace.as_bytes())].concat();
        let mut raw = ld(1, &meta);
        for (k, v) in data {
            raw.extend(ld(2, &[ld(1, k), ld(2, v)].concat()));
        }
        envelope("v1", "ConfigMap", &raw)
    }

    /// Sends `body` (protobuf) to `path` with `method`; the server's answer
    /// (as JSON) or its error.
    pub async fn send(
        client: &kube_client::Client,
        method: http::Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<String, kube_client::Error> {
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(
                http::header::CONTENT_TYPE,
                "application/vnd.kubernetes.protobuf",
            )
            .header(http::header::ACCEPT, "application/json")
            .body(body)
            .expect("a valid request");
        client.request_text(request).await
    }
}
