//! What the webhook server answers to bad requests, a slow handler and a
//! rotating certificate, called over TLS by a plain HTTP/1.1 client (the
//! API server never sends most of these; a scanner or a misconfigured
//! caller does); objects nested as deep as the API server stores them and
//! deeper; idle keep-alive connections and slow request heads.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_webhook::{OnPanic, Verdict, Webhooks};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

mod common;
use common::{Served, serve};

/// One request on a connection of its own: the status, the body, and the
/// certificate the server presented.
/// Where `call` connects: a port, and the CA (PEM) to trust.
type At<'a> = (u16, &'a str);

fn at(served: &Served) -> At<'_> {
    (served.port, &served.certs.ca)
}

/// A TLS connection to the server, trusting its CA.
async fn connect((port, ca): At<'_>) -> TlsStream<TcpStream> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap()
}

async fn call(at: At<'_>, head: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let mut tls = connect(at).await;
    let peer = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    // A head saying `Transfer-Encoding: chunked` gets the body in one
    // chunk, its length unsaid; any other a Content-Length.
    let chunked = head.contains("Transfer-Encoding: chunked");
    let length = if chunked {
        String::new()
    } else {
        format!("Content-Length: {}\r\n", body.len())
    };
    let request = format!("{head}\r\nHost: 127.0.0.1\r\nConnection: close\r\n{length}\r\n");
    // The server may answer (413) and close before the body is all sent.
    let _ = tls.write_all(request.as_bytes()).await;
    if chunked {
        let _ = tls
            .write_all(format!("{:x}\r\n", body.len()).as_bytes())
            .await;
        let _ = tls.write_all(body).await;
        let _ = tls.write_all(b"\r\n0\r\n\r\n").await;
    } else {
        let _ = tls.write_all(body).await;
    }
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body, peer)
}

fn review(object: serde_json::Value) -> Vec<u8> {
    review_of("CREATE", object)
}

fn review_of(operation: &str, object: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d9d5b2c-5f3c-4f37-9a65-3f2d1b3c4d5e",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "operation": operation,
            "name": "x",
            "namespace": "ns",
            "userInfo": {"username": "someone"},
            "object": object,
        },
    }))
    .unwrap()
}

fn validating() -> Webhooks {
    Webhooks::new().validate("/validate", |request| async move {
        let cm: ConfigMap = request.object.unwrap_or_default();
        match cm.data {
            Some(_) => Verdict::allow(),
            None => Verdict::deny("no data"),
        }
    })
}

const JSON: &str = "Content-Type: application/json";

#[tokio::test]
async fn bad_requests_get_a_clear_status_and_the_server_goes_on() {
    let served = serve(validating().max_body_bytes(256 << 10)).await;
    let good = review(json!({"metadata": {"name": "x"}, "data": {"a": "b"}}));
    let (status, body, _) = call(at(&served), "GET /validate HTTP/1.1", b"").await;
    assert_eq!((status, body.as_str()), (405, "webhooks take POST"));
    let (status, body, _) = call(
        at(&served),
        &format!("POST /nope HTTP/1.1\r\n{JSON}"),
        &good,
    )
    .await;
    assert_eq!(status, 404);
    assert!(
        body.contains("no webhook at /nope; served: /validate"),
        "{body}"
    );
    let (status, _, _) = call(
        at(&served),
        "POST /validate HTTP/1.1\r\nContent-Type: text/plain",
        &good,
    )
    .await;
    assert_eq!(status, 415);
    let (status, body, _) = call(
        at(&served),
        &format!("POST /validate HTTP/1.1\r\n{JSON}"),
        &vec![b' '; 257 << 10],
    )
    .await;
    assert_eq!(status, 413, "{body}");
    // The same without a Content-Length: cut at the limit while read.
    let (status, body, _) = call(
        at(&served),
        &format!("POST /validate HTTP/1.1\r\n{JSON}\r\nTransfer-Encoding: chunked"),
        &vec![b' '; 257 << 10],
    )
    .await;
    assert_eq!(status, 413, "{body}");
    let deep = format!(
        "{{\"request\":{{\"object\":{}{}}}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    for bad in [&b"not json"[..], b"\xff\xfe{}", b"{}", deep.as_bytes()] {
        let (status, body, _) = call(
            at(&served),
            &format!("POST /validate HTTP/1.1\r\n{JSON}"),
            bad,
        )
        .await;
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("AdmissionReview"), "{body}");
    }
    // Still serving: a good review is answered.
    let (status, body, _) = call(
        at(&served),
        &format!("POST /validate HTTP/1.1\r\n{JSON}"),
        &good,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{body}");
    assert_eq!(
        answer["response"]["uid"],
        "0d9d5b2c-5f3c-4f37-9a65-3f2d1b3c4d5e"
    );
}

#[tokio::test]
async fn an_object_that_is_not_the_handlers_kind_is_denied_saying_so() {
    let served = serve(validating()).await;
    let wrong = review(json!({"metadata": {"name": "x"}, "data": 5}));
    let (status, body, _) = call(
        at(&served),
        &format!("POST /validate HTTP/1.1\r\n{JSON}"),
        &wrong,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false, "{body}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("cannot read this ConfigMap as a"),
        "{message}"
    );
}

#[tokio::test]
async fn a_handler_slower_than_the_calls_timeout_is_answered_504_before_it() {
    let served = serve(Webhooks::new().validate(
        "/slow",
        |_: kinformer_webhook::AdmissionRequest<ConfigMap>| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Verdict::allow()
        },
    ))
    .await;
    let good = review(json!({"metadata": {"name": "x"}}));
    let (status, body, _) = call(
        at(&served),
        &format!("POST /slow?timeout=1s HTTP/1.1\r\n{JSON}"),
        &good,
    )
    .await;
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("the call's timeout is 1s"), "{body}");
}

/// A ConfigMap slow to write once its handler has seen it: the patch to it
/// takes seconds to find.
#[derive(Clone, serde::Deserialize)]
struct SlowToWrite {
    metadata: kube_client::api::ObjectMeta,
    #[serde(skip)]
    seen: bool,
}

impl serde::Serialize for SlowToWrite {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        if self.seen {
            std::thread::sleep(Duration::from_secs(3));
        }
        let mut object = serializer.serialize_struct("SlowToWrite", 1)?;
        object.serialize_field("metadata", &self.metadata)?;
        object.end()
    }
}

impl kube_client::core::Resource for SlowToWrite {
    type DynamicType = ();
    type Scope = kube_client::core::NamespaceResourceScope;
    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "ConfigMap".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "configmaps".into()
    }
    fn meta(&self) -> &kube_client::api::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut kube_client::api::ObjectMeta {
        &mut self.metadata
    }
}

#[tokio::test]
async fn a_patch_slower_than_the_calls_timeout_is_answered_504_before_it() {
    // Found while the timeout runs, not in the poll that answers (which
    // answered 200 once done, after the API server had given up).
    let served = serve(
        Webhooks::new().defaulting("/slow", |mut cm: SlowToWrite, _| async move {
            cm.seen = true;
            Ok(cm)
        }),
    )
    .await;
    let good = review(json!({"metadata": {"name": "x"}}));
    let (status, body, _) = call(
        at(&served),
        &format!("POST /slow?timeout=1s HTTP/1.1\r\n{JSON}"),
        &good,
    )
    .await;
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("the call's timeout is 1s"), "{body}");
}

#[tokio::test]
async fn a_rotated_certificate_serves_the_next_connection_and_a_broken_one_is_not_used() {
    let served = serve(validating()).await;
    let good = review(json!({"metadata": {"name": "x"}, "data": {}}));
    let head = format!("POST /validate HTTP/1.1\r\n{JSON}");
    let (_, _, first) = call(at(&served), &head, &good).await;
    // Rotated in place, as cert-manager does.
    served
        .certs
        .renew(&["127.0.0.1"])
        .unwrap()
        .write(served.dir.path())
        .unwrap();
    let (status, _, second) = call(at(&served), &head, &good).await;
    assert_eq!(status, 200);
    assert_ne!(first, second, "the old certificate still served");
    assert_eq!((served.tls.reloads(), served.tls.failures()), (1, 0));
    // A half-written certificate: the last good one goes on serving.
    std::fs::write(
        served.dir.path().join("tls.crt"),
        "-----BEGIN CERTIFICATE-----\nMIIB",
    )
    .unwrap();
    let (status, _, third) = call(at(&served), &head, &good).await;
    assert_eq!(status, 200);
    assert_eq!(second, third);
    assert_eq!((served.tls.reloads(), served.tls.failures()), (1, 1));
}

#[tokio::test]
async fn on_panic_error_answers_500_and_the_server_goes_on() {
    let served = serve(
        Webhooks::new()
            .validate("/validate", |request| async move {
                let cm: ConfigMap = request.object.unwrap_or_default();
                if cm.data.is_some() {
                    panic!("asked to panic");
                }
                Verdict::allow()
            })
            .on_panic(OnPanic::Error),
    )
    .await;
    let head = format!("POST /validate HTTP/1.1\r\n{JSON}");
    let panics = review(json!({"metadata": {"name": "x"}, "data": {"a": "b"}}));
    let (status, body, _) = call(at(&served), &head, &panics).await;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("asked to panic"), "{body}");
    let fine = review(json!({"metadata": {"name": "x"}}));
    let (status, body, _) = call(at(&served), &head, &fine).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_connect_is_admitted_without_calling_the_handler() {
    let served = serve(Webhooks::new().validate(
        "/validate",
        |_: kinformer_webhook::AdmissionRequest<ConfigMap>| async {
            Verdict::deny("the handler was called")
        },
    ))
    .await;
    // `kubectl exec`: the object is the exec options, not the kind.
    let exec = review_of(
        "CONNECT",
        json!({"kind": "PodExecOptions", "apiVersion": "v1", "command": ["sh"], "data": 5}),
    );
    let (status, body, _) = call(
        at(&served),
        &format!("POST /validate HTTP/1.1\r\n{JSON}"),
        &exec,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{body}");
}

/// Writes `certs` as the kubelet writes a Secret volume: the files in a
/// directory of their own, `..data` a symlink to it (swapped by a rename),
/// `tls.crt` and `tls.key` symlinks through `..data`.
fn secret_volume(dir: &std::path::Path, certs: &kinformer_webhook::dev_certs::DevCerts, n: u32) {
    use std::os::unix::fs::symlink;
    let version = format!("..2026_12_06_{n}");
    std::fs::create_dir(dir.join(&version)).unwrap();
    certs.write(&dir.join(&version)).unwrap();
    symlink(&version, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key"] {
        if !dir.join(name).exists() {
            symlink(format!("..data/{name}"), dir.join(name)).unwrap();
        }
    }
}

#[tokio::test]
async fn a_secret_volume_rotation_swapping_its_data_link_is_served_on_the_next_connection() {
    let volume = tempfile::tempdir().unwrap();
    let certs = kinformer_webhook::dev_certs::DevCerts::new(&["127.0.0.1"]).unwrap();
    secret_volume(volume.path(), &certs, 1);
    let tls = Arc::new(
        kinformer_webhook::CertFiles::new(
            volume.path().join("tls.crt"),
            volume.path().join("tls.key"),
        )
        .unwrap(),
    );
    let server = validating()
        .bind("127.0.0.1:0".parse().unwrap(), Arc::clone(&tls))
        .await
        .unwrap();
    let port = server.local_addr().port();
    let stop = tokio_util::sync::CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(server.run(stop));
    let good = review(json!({"metadata": {"name": "x"}, "data": {}}));
    let head = format!("POST /validate HTTP/1.1\r\n{JSON}");
    let (_, _, first) = call((port, &certs.ca), &head, &good).await;
    secret_volume(volume.path(), &certs.renew(&["127.0.0.1"]).unwrap(), 2);
    let (status, _, second) = call((port, &certs.ca), &head, &good).await;
    assert_eq!(status, 200);
    assert_ne!(first, second, "the old certificate still served");
    assert_eq!((tls.reloads(), tls.failures()), (1, 0));
}

#[tokio::test]
async fn a_defaulting_route_reads_bad_bodies_as_a_validating_one_does() {
    // It parses the body once into a JSON value (it needs the object as
    // it came): the same answers, and the same recursion limit.
    let served =
        serve(Webhooks::new().defaulting("/default", |cm: ConfigMap, _| async move { Ok(cm) }))
            .await;
    let head = format!("POST /default HTTP/1.1\r\n{JSON}");
    let deep = format!(
        "{{\"request\":{{\"object\":{}{}}}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    for bad in [&b"not json"[..], b"\xff\xfe{}", b"{}", deep.as_bytes()] {
        let (status, body, _) = call(at(&served), &head, bad).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("AdmissionReview"), "{body}");
    }
    let wrong = review(json!({"metadata": {"name": "x"}, "data": 5}));
    let (status, body, _) = call(at(&served), &head, &wrong).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false, "{body}");
    let good = review(json!({"metadata": {"name": "x"}, "data": {"a": "b"}}));
    let (status, body, _) = call(at(&served), &head, &good).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{body}");
    assert!(answer["response"].get("patch").is_none(), "{body}");
}

/// A custom resource nesting `depth` levels of JSON objects, itself the
/// first (the API server's decoder counts so and accepts 10 000), as
/// text: a value that deep is not built, written or dropped on the test's
/// stack.
fn nested_custom_resource(depth: usize) -> String {
    nested_custom_resource_with_leaf(depth, 1)
}

/// [`nested_custom_resource`] with `leaf` at its deepest level.
fn nested_custom_resource_with_leaf(depth: usize, leaf: i64) -> String {
    let levels = depth - 1;
    format!(
        r#"{{"apiVersion":"example.com/v1","kind":"Deep","metadata":{{"name":"d","namespace":"ns"}},"spec":{}{leaf}{}}}"#,
        r#"{"a":"#.repeat(levels),
        "}".repeat(levels)
    )
}

/// How many levels of `{"a": ...}` `value` nests, counted without recursion.
fn levels(mut value: &serde_json::Value) -> usize {
    let mut n = 0;
    while let Some(inner) = value.get("a") {
        (n, value) = (n + 1, inner);
    }
    n
}

fn custom_review(object: &str) -> Vec<u8> {
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"0d9d5b2c-5f3c-4f37-9a65-3f2d1b3c4d5e","kind":{{"group":"example.com","version":"v1","kind":"Deep"}},"resource":{{"group":"example.com","version":"v1","resource":"deeps"}},"operation":"CREATE","name":"d","namespace":"ns","userInfo":{{"username":"someone"}},"object":{object}}}}}"#
    )
    .into_bytes()
}

/// Webhooks for any kind: the validator admits, warning how deep the
/// object nests; the defaulter labels.
fn for_any_kind() -> Webhooks {
    use kube_client::core::DynamicObject;
    Webhooks::new()
        .validate("/validate", |request| async move {
            let object: DynamicObject = request.object.unwrap();
            let spec = &object.data["spec"];
            Verdict::allow().warn(format!("the object nests {} levels", levels(spec) + 1))
        })
        .defaulting("/default", |mut object: DynamicObject, _| async move {
            object
                .metadata
                .labels
                .get_or_insert_default()
                .insert("defaulted".into(), "yes".into());
            Ok(object)
        })
}

#[tokio::test]
async fn an_object_nested_as_deep_as_the_api_server_stores_is_reviewed() {
    // serde_json reads 128 levels; the API server stores up to 10 000.
    let served = serve(for_any_kind()).await;
    for depth in [150, 10_000] {
        let body = custom_review(&nested_custom_resource(depth));
        let (status, body_text, _) = call(
            at(&served),
            &format!("POST /validate HTTP/1.1\r\n{JSON}"),
            &body,
        )
        .await;
        assert_eq!(status, 200, "{depth}: {body_text}");
        let answer: serde_json::Value = serde_json::from_str(&body_text).unwrap();
        assert_eq!(answer["response"]["allowed"], true, "{depth}: {body_text}");
        assert_eq!(
            answer["response"]["warnings"],
            json!([format!("the object nests {depth} levels")]),
        );

        let (status, body_text, _) = call(
            at(&served),
            &format!("POST /default HTTP/1.1\r\n{JSON}"),
            &body,
        )
        .await;
        assert_eq!(status, 200, "{depth}: {body_text}");
        let answer: serde_json::Value = serde_json::from_str(&body_text).unwrap();
        assert_eq!(answer["response"]["allowed"], true, "{depth}: {body_text}");
        // kube-core writes the patch's bytes as a JSON array of numbers.
        let patch: Vec<u8> = serde_json::from_value(answer["response"]["patch"].clone()).unwrap();
        let patch: serde_json::Value = serde_json::from_slice(&patch).unwrap();
        assert_eq!(
            patch,
            json!([{"op": "add", "path": "/metadata/labels", "value": {"defaulted": "yes"}}]),
        );
    }
}

#[tokio::test]
async fn a_default_at_the_deepest_leaf_of_an_object_as_deep_as_the_api_server_stores_is_patched_there()
 {
    use kube_client::core::DynamicObject;
    // The handler changes one leaf, 10 000 levels down: the patch is found
    // in time and memory proportional to the object (it took time and
    // memory growing with the square of the depth: tens of GB here), not
    // answered 504.
    let served = serve(Webhooks::new().defaulting(
        "/default",
        |mut object: DynamicObject, _| async move {
            let mut leaf = &mut object.data["spec"];
            while leaf.get("a").is_some() {
                leaf = &mut leaf["a"];
            }
            *leaf = json!(2);
            Ok(object)
        },
    ))
    .await;
    let depth = 10_000;
    let object = nested_custom_resource(depth);
    let (status, body, _) = call(
        at(&served),
        &format!("POST /default?timeout=30s HTTP/1.1\r\n{JSON}"),
        &custom_review(&object),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{body}");
    let patch: Vec<u8> = serde_json::from_value(answer["response"]["patch"].clone()).unwrap();
    let patch: serde_json::Value = serde_json::from_slice(&patch).unwrap();
    let leaf = format!("/spec{}", "/a".repeat(depth - 1));
    assert_eq!(patch, json!([{"op": "replace", "path": leaf, "value": 2}]));

    // Applied as the API server applies it, the object is the handler's:
    // read, patched, compared and dropped on a stack deep enough for it.
    let expected = nested_custom_resource_with_leaf(depth, 2);
    let patched = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let read = |json: &str| {
                let mut de = serde_json::Deserializer::from_str(json);
                de.disable_recursion_limit();
                serde::Deserialize::deserialize(&mut de).unwrap()
            };
            let mut object: serde_json::Value = read(&object);
            let patch: json_patch::Patch = serde_json::from_value(patch).unwrap();
            json_patch::patch(&mut object, &patch).unwrap();
            object == read(&expected)
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(patched, "the patched object is not the handler's");
}

#[tokio::test]
async fn a_body_nested_deeper_than_the_api_server_sends_is_refused_and_the_server_goes_on() {
    let served = serve(for_any_kind()).await;
    let deep = custom_review(&nested_custom_resource(100_000));
    for path in ["/validate", "/default"] {
        let head = format!("POST {path} HTTP/1.1\r\n{JSON}");
        let (status, body, _) = call(at(&served), &head, &deep).await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body.contains("not an AdmissionReview") && body.contains("levels deep"),
            "{body}"
        );
        let shallow = custom_review(&nested_custom_resource(3));
        let (status, body, _) = call(at(&served), &head, &shallow).await;
        assert_eq!(status, 200, "{body}");
    }
}

/// A custom resource of any content, in version `v{V}` of
/// `example.com`'s `Deep`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Deep<const V: u8> {
    metadata: kube_client::api::ObjectMeta,
    spec: serde_json::Value,
}

impl<const V: u8> kube_client::core::Resource for Deep<V> {
    type DynamicType = ();
    type Scope = kube_client::core::NamespaceResourceScope;
    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Deep".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "example.com".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        format!("v{V}").into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "deeps".into()
    }
    fn meta(&self) -> &kube_client::api::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut kube_client::api::ObjectMeta {
        &mut self.metadata
    }
}

#[tokio::test]
async fn a_conversion_of_an_object_nested_as_deep_as_the_api_server_stores_converts() {
    let conversion = kinformer_webhook::Conversion::<Deep<2>>::hub().spoke::<Deep<1>>(
        |v1| {
            Ok(Deep {
                metadata: v1.metadata,
                spec: v1.spec,
            })
        },
        |v2| {
            Ok(Deep {
                metadata: v2.metadata,
                spec: v2.spec,
            })
        },
    );
    let served = serve(Webhooks::new().convert("/convert", conversion)).await;
    for depth in [150, 10_000] {
        let review = format!(
            r#"{{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{{"uid":"0d9d5b2c-5f3c-4f37-9a65-3f2d1b3c4d5e","desiredAPIVersion":"example.com/v2","objects":[{}]}}}}"#,
            nested_custom_resource(depth)
        );
        let (status, body, _) = call(
            at(&served),
            &format!("POST /convert HTTP/1.1\r\n{JSON}"),
            review.as_bytes(),
        )
        .await;
        assert_eq!(status, 200, "{depth}: {body}");
        // Too deep for serde_json's reader here: looked at as text.
        assert!(body.contains(r#""status":"Success""#), "{depth}");
        assert!(body.contains(r#""apiVersion":"example.com/v2""#), "{depth}");
        assert_eq!(body.matches(r#"{"a":"#).count(), depth - 1);
    }
}

/// Sends `body` to `path` on `tls`, which stays open (HTTP/1.1 keep-alive),
/// and reads the answer: its status.
async fn exchange(tls: &mut TlsStream<TcpStream>, path: &str, body: &[u8]) -> u16 {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{JSON}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    // In one write: a second small one would wait for the first's
    // acknowledgement (Nagle), and paused time jumps while it waits.
    tls.write_all(&[head.as_bytes(), body].concat())
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        let read = tls.read(&mut byte).await.unwrap();
        assert_eq!(read, 1, "closed: {:?}", String::from_utf8_lossy(&answer));
        answer.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map(|n| n.trim().parse().unwrap())
        .unwrap();
    tls.read_exact(&mut vec![0; length]).await.unwrap();
    head[9..12].parse().unwrap()
}

/// Waits until the server closes `tls` (an end or an error), the clock
/// (paused) jumping to its next timer each time nothing else is ready.
async fn closed(mut tls: TlsStream<TcpStream>) {
    let mut rest = Vec::new();
    let waited = tokio::time::timeout(Duration::from_secs(3600), tls.read_to_end(&mut rest)).await;
    assert!(waited.is_ok(), "not closed in an hour (virtual)");
}

#[tokio::test(start_paused = true)]
async fn a_fresh_or_idle_keep_alive_connection_is_kept_past_10_s_and_a_half_sent_head_is_cut() {
    let served = serve(validating()).await;
    let good = review(json!({"metadata": {"name": "x"}, "data": {"a": "b"}}));
    let mut kept = connect(at(&served)).await;
    assert_eq!(exchange(&mut kept, "/validate", &good).await, 200);

    // Slowloris: a connection that sends half a head is cut (the clock
    // jumps to the server's timers), before the first connection, idle
    // since before it opened, is closed.
    let mut fresh = connect(at(&served)).await;
    let mut half = connect(at(&served)).await;
    half.write_all(b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    closed(half).await;

    // Meanwhile the first connection idled, and idles on past the 10 s a
    // head may take: the API server's next call on it is answered. So is
    // its first call on a connection it dialled and left unused in its
    // pool (Go's Transport does when another came free first).
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(exchange(&mut kept, "/validate", &good).await, 200);
    assert_eq!(exchange(&mut fresh, "/validate", &good).await, 200);
    assert_eq!(exchange(&mut kept, "/validate", &good).await, 200);
    // Left idle for good, they are closed in the end, as is a connection
    // that never sends a byte.
    closed(kept).await;
    closed(fresh).await;
    closed(connect(at(&served)).await).await;
}
