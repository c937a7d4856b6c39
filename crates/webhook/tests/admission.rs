//! Admission webhooks called by a real kube-apiserver over TLS: a
//! validating webhook's denial and warning reach the client, a defaulting
//! webhook's changes are stored (a struct it fills into a custom resource
//! whole, as the CRD's schema requires), the serving certificate rotated
//! while the API server calls (no admission fails; its new connections get
//! the new certificate), failurePolicy Fail and Ignore with the server
//! stopped, and a panicking handler (its denial). What the server
//! answers to bad requests is in bad_input.rs.

use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_envtest::TestEnv;
use kinformer_webhook::{Operation, Verdict, Webhooks};
use kube_client::api::{Api, DeleteParams, PostParams};
use kube_client::{Client, ResourceExt};
use serde_json::json;

mod common;
use common::{Served, serve};

/// The webhooks of these tests: ConfigMaps with a `forbidden` key are
/// refused, those with a `warn` key admitted with a warning; every one is
/// labelled `defaulted=yes`; one with a `panic` key panics the validator.
fn webhooks() -> Webhooks {
    Webhooks::new()
        .validate("/validate", |request| async move {
            let cm: ConfigMap = request.object.unwrap_or_default();
            let data = cm.data.unwrap_or_default();
            if data.contains_key("panic") {
                panic!("asked to panic");
            }
            if data.contains_key("forbidden") {
                return Verdict::deny(format!(
                    "{} carries the key forbidden",
                    cm.metadata.name.unwrap_or_default()
                ));
            }
            let verdict = Verdict::allow();
            if data.contains_key("warn") && request.operation == Operation::Create {
                return verdict.warn("this ConfigMap carries the key warn");
            }
            verdict
        })
        .defaulting("/default", |mut cm: ConfigMap, _request| async move {
            cm.metadata
                .labels
                .get_or_insert_default()
                .insert("defaulted".into(), "yes".into());
            Ok(cm)
        })
}

/// `<webhook>` entry of a configuration for ConfigMaps of namespace `ns`.
fn hook(name: &str, served: &Served, path: &str, ns: &str, policy: &str) -> serde_json::Value {
    json!({
        "name": name,
        "clientConfig": {
            "url": format!("https://127.0.0.1:{}{path}", served.port),
            "caBundle": base64::engine::general_purpose::STANDARD.encode(&served.certs.ca),
        },
        "rules": [{
            "apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"],
        }],
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        "failurePolicy": policy,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 5,
    })
}

fn config_map(name: &str, key: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {key: "x"}})).unwrap()
}

/// Creates a ConfigMap named `name` with `key` in `ns` until `done` says
/// the answer shows the configuration in force (the API server picks new
/// configurations up from its own informer), deleting what got through.
async fn until_in_force(
    client: &Client,
    ns: &str,
    key: &str,
    done: impl Fn(&Result<ConfigMap, kube_client::Error>) -> bool,
) -> Result<ConfigMap, kube_client::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    for attempt in 0.. {
        let name = format!("probe-{key}-{attempt}");
        let result = api
            .create(&PostParams::default(), &config_map(&name, key))
            .await;
        if done(&result) {
            return result;
        }
        if result.is_ok() {
            api.delete(&name, &DeleteParams::default()).await.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "not in force after 60 s: {result:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unreachable!()
}

fn denial(result: &Result<ConfigMap, kube_client::Error>) -> Option<(u16, String)> {
    match result {
        Err(kube_client::Error::Api(status)) => Some((status.code, status.message.clone())),
        _ => None,
    }
}

#[tokio::test]
async fn the_api_server_admits_through_the_webhooks_their_denials_and_defaults() {
    let env = TestEnv::shared().await.unwrap();
    let client = env.client().unwrap();
    let ns = env.create_namespace("webhook").await.unwrap();
    let served = serve(webhooks()).await;
    let validating: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": format!("{ns}-validate")},
        "webhooks": [hook("validate.kinformer.dev", &served, "/validate", &ns, "Fail")],
    }))
    .unwrap();
    let mutating: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": format!("{ns}-default")},
        "webhooks": [hook("default.kinformer.dev", &served, "/default", &ns, "Fail")],
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &validating)
        .await
        .unwrap();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .unwrap();

    // Denied, with the handler's message.
    let denied = until_in_force(&client, &ns, "forbidden", |r| denial(r).is_some()).await;
    let (code, message) = denial(&denied).unwrap();
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("carries the key forbidden"), "{message}");
    // Admitted, with the default stored.
    let stored = until_in_force(&client, &ns, "fine", |r| {
        r.as_ref()
            .is_ok_and(|cm| cm.labels().get("defaulted").is_some())
    })
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let read = api.get(&stored.name_any()).await.unwrap();
    assert_eq!(
        read.labels().get("defaulted").map(String::as_str),
        Some("yes")
    );
    // A warning reaches the client (in a Warning header).
    let request = http::Request::post(format!("/api/v1/namespaces/{ns}/configmaps"))
        .header("content-type", "application/json")
        .body(
            serde_json::to_vec(&config_map("warned", "warn"))
                .unwrap()
                .into(),
        )
        .unwrap();
    let response = client.send(request).await.unwrap();
    let warnings: Vec<&str> = response
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert!(
        warnings.iter().any(|w| w.contains("carries the key warn")),
        "{warnings:?}"
    );
    // An update is validated too.
    let mut update = read.clone();
    update.data = Some([("forbidden".to_owned(), "now".to_owned())].into());
    let refused = api
        .replace(&read.name_any(), &PostParams::default(), &update)
        .await;
    assert!(
        denial(&refused).is_some_and(|(_, m)| m.contains("forbidden")),
        "{refused:?}"
    );
    // A panicking handler: a denial naming the panic; the server goes on.
    let panicked = api
        .create(&PostParams::default(), &config_map("panics", "panic"))
        .await;
    assert!(
        denial(&panicked).is_some_and(|(_, m)| m.contains("asked to panic")),
        "{panicked:?}"
    );
    api.create(&PostParams::default(), &config_map("after-panic", "fine"))
        .await
        .unwrap();

    // The certificate rotated in place, as cert-manager does (same CA):
    // every admission goes through (failurePolicy Fail), and the API
    // server's new connections (16 calls at once need more than the one it
    // has) are served the new pair.
    assert_eq!(served.tls.reloads(), 0);
    let renewed = served.certs.renew(&["127.0.0.1"]).unwrap();
    renewed.write(served.dir.path()).unwrap();
    for round in 0..3 {
        let creates: Vec<_> = (0..16)
            .map(|i| {
                let api = api.clone();
                async move {
                    let name = format!("rotated-{round}-{i}");
                    api.create(&PostParams::default(), &config_map(&name, "fine"))
                        .await
                        .map(|cm| cm.labels().get("defaulted").cloned())
                }
            })
            .collect();
        for created in futures::future::join_all(creates).await {
            assert_eq!(created.unwrap().as_deref(), Some("yes"));
        }
    }
    assert_eq!(
        served.tls.reloads(),
        1,
        "failures: {}",
        served.tls.failures()
    );

    // The server stopped: Fail refuses, Ignore admits.
    let patch =
        json!({"webhooks": [hook("validate.kinformer.dev", &served, "/validate", &ns, "Ignore")]});
    served.stop.cancel();
    served.stopped.await.unwrap();
    let refused = api
        .create(&PostParams::default(), &config_map("server-down", "fine"))
        .await;
    assert!(denial(&refused).is_some(), "{refused:?}");
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(
            &format!("{ns}-validate"),
            &kube_client::api::PatchParams::default(),
            &kube_client::api::Patch::Merge(patch),
        )
        .await
        .unwrap();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .delete(&format!("{ns}-default"), &DeleteParams::default())
        .await
        .unwrap();
    until_in_force(&client, &ns, "fine", |r| r.is_ok())
        .await
        .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(&format!("{ns}-validate"), &DeleteParams::default())
        .await
        .unwrap();
}

const GROUP: &str = "defaulting.kinformer.dev";

/// A custom resource as kube-derive users write one: a probe its schema
/// requires whole (path and port) when present, defaulted when absent.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Probed {
    metadata: kube_client::api::ObjectMeta,
    #[serde(default)]
    spec: ProbedSpec,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct ProbedSpec {
    #[serde(default)]
    probe: Probe,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct Probe {
    path: String,
    port: u16,
}

impl kube_client::core::Resource for Probed {
    type DynamicType = ();
    type Scope = kube_client::core::NamespaceResourceScope;
    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Probed".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "probeds".into()
    }
    fn meta(&self) -> &kube_client::api::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut kube_client::api::ObjectMeta {
        &mut self.metadata
    }
}

#[tokio::test]
async fn a_struct_a_defaulting_webhook_fills_in_is_stored_whole_and_meets_the_crds_schema() {
    use kube_client::api::{ApiResource, DynamicObject};
    use kube_client::core::GroupVersionKind;

    let env = TestEnv::shared().await.unwrap();
    let client = env.client().unwrap();
    let ns = env.create_namespace("defaulting").await.unwrap();
    let served = serve(Webhooks::new().defaulting(
        "/default-probed",
        |mut probed: Probed, _| async move {
            if probed.spec.probe.path.is_empty() {
                probed.spec.probe.path = "/healthz".into();
            }
            Ok(probed)
        },
    ))
    .await;
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("probeds.{GROUP}")},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"plural": "probeds", "singular": "probed", "kind": "Probed", "listKind": "ProbedList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "probe": {"type": "object", "required": ["path", "port"], "properties": {
                            "path": {"type": "string"}, "port": {"type": "integer"},
                        }},
                    }},
                }}},
            }],
        },
    });
    let crd = serde_json::from_value(crd).unwrap();
    Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();
    let mut webhook = hook(
        "probed.kinformer.dev",
        &served,
        "/default-probed",
        &ns,
        "Fail",
    );
    webhook["rules"] = json!([{
        "apiGroups": [GROUP], "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"], "resources": ["probeds"],
    }]);
    let mutating: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": format!("{ns}-probed")},
        "webhooks": [webhook],
    }))
    .unwrap();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .unwrap();

    // Created without a probe, until the resource is served and the
    // webhook in force (until then the probe stays absent).
    let gvk = GroupVersionKind::gvk(GROUP, "v1", "Probed");
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(&gvk, "probeds"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut attempt = 0;
    let created = loop {
        attempt += 1;
        let name = format!("probed-{attempt}");
        let object = serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/v1"), "kind": "Probed",
            "metadata": {"name": name}, "spec": {},
        }))
        .unwrap();
        match api.create(&PostParams::default(), &object).await {
            Ok(created) if created.data["spec"].get("probe").is_some() => break Ok(created),
            // The webhook's patch refused by the schema.
            Err(kube_client::Error::Api(status)) if status.code == 422 => break Err(status),
            other => assert!(
                Instant::now() < deadline,
                "not in force after 60 s: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let created = created.unwrap();
    assert_eq!(
        created.data["spec"],
        json!({"probe": {"path": "/healthz", "port": 0}})
    );
    // It reads back as the webhook's own type.
    let read: Probed = serde_json::from_value(serde_json::to_value(&created).unwrap()).unwrap();
    assert_eq!(read.spec.probe.path, "/healthz");
}
