//! A CRD with versions v1 (stored, the hub) and v2, converted by the
//! webhook, called by a real kube-apiserver over TLS: an object written in
//! one version reads back in the other and round-trips without loss, a list
//! of 1 000 converts, and one of 9.6 MB (the API server converts object
//! by object), an object that does not convert and a version the
//! webhook does not know fail with messages that say so.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kinformer_envtest::TestEnv;
use kinformer_webhook::dev_certs::DevCerts;
use kinformer_webhook::{CertFiles, Conversion, Webhooks};
use kube_client::api::{Api, ApiResource, DynamicObject, ListParams, ObjectMeta, PostParams};
use kube_client::core::{GroupVersionKind, NamespaceResourceScope, Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const GROUP: &str = "conversion.kinformer.dev";

macro_rules! widget {
    ($name:ident, $version:literal, $spec:ty) => {
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        struct $name {
            metadata: ObjectMeta,
            spec: $spec,
        }

        impl Resource for $name {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;
            fn kind(_: &()) -> Cow<'_, str> {
                "Widget".into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                GROUP.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                "widgets".into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// v1: the size as one string, `10cm`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SpecV1 {
    size: String,
}

/// v2: the size as a number and a unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SpecV2 {
    size: Size,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Size {
    value: i64,
    unit: String,
}

widget!(WidgetV1, "v1", SpecV1);
widget!(WidgetV2, "v2", SpecV2);

fn to_hub(w: WidgetV2) -> Result<WidgetV1, String> {
    Ok(WidgetV1 {
        metadata: w.metadata,
        spec: SpecV1 {
            size: format!("{}{}", w.spec.size.value, w.spec.size.unit),
        },
    })
}

fn from_hub(w: WidgetV1) -> Result<WidgetV2, String> {
    let size = &w.spec.size;
    let digits = size
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(size.len());
    let value = size[..digits]
        .parse()
        .map_err(|_| format!("size {size:?} has no number"))?;
    Ok(WidgetV2 {
        metadata: w.metadata,
        spec: SpecV2 {
            size: Size {
                value,
                unit: size[digits..].to_owned(),
            },
        },
    })
}

fn api(client: &kube_client::Client, ns: &str, version: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(GROUP, version, "Widget");
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "widgets"),
    )
}

fn widget(name: &str, version: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/{version}"), "kind": "Widget",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

fn message(error: kube_client::Error) -> String {
    match error {
        kube_client::Error::Api(status) => status.message,
        other => other.to_string(),
    }
}

#[tokio::test]
async fn a_crd_converts_through_the_webhook_both_ways_lists_and_failures() {
    let env = TestEnv::shared().await.unwrap();
    let client = env.client().unwrap();
    let ns = env.create_namespace("conversion").await.unwrap();

    let certs = DevCerts::new(&["127.0.0.1"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certs.write(dir.path()).unwrap();
    let tls = Arc::new(CertFiles::new(cert, key).unwrap());
    let conversion = Conversion::<WidgetV1>::hub().spoke::<WidgetV2>(to_hub, from_hub);
    let server = Webhooks::new()
        .convert("/convert", conversion)
        .bind("127.0.0.1:0".parse().unwrap(), tls)
        .await
        .unwrap();
    let port = server.local_addr().port();
    let stop = CancellationToken::new();
    tokio::spawn(server.run(stop.clone()));

    let version = |name: &str, storage: bool| {
        json!({
            "name": name, "served": true, "storage": storage,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            }}},
        })
    };
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{GROUP}")},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            // v3 is served but not known to the webhook.
            "versions": [version("v1", true), version("v2", false), version("v3", false)],
            // As the project deploys it: calling its Service; envtest points
            // it at the local server.
            "conversion": {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"service": {"name": "widgets", "namespace": "system", "path": "/convert"}},
            }},
        },
    });
    env.install_webhooks(&[crd], ([127, 0, 0, 1], port).into(), &certs.ca)
        .await
        .unwrap();

    // Written in v2 (converted to v1 to be stored), once the API server
    // serves the new resource.
    let v1 = api(&client, &ns, "v1");
    let v2 = api(&client, &ns, "v2");
    let written = widget("a", "v2", json!({"size": {"value": 10, "unit": "cm"}}));
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = v2.create(&PostParams::default(), &written).await {
        assert!(Instant::now() < deadline, "v2 not served in 60 s: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let as_v1 = v1.get("a").await.unwrap();
    assert_eq!(as_v1.data["spec"], json!({"size": "10cm"}));
    let as_v2 = v2.get("a").await.unwrap();
    assert_eq!(as_v2.data["spec"], written.data["spec"]);
    assert_eq!(as_v2.types.unwrap().api_version, format!("{GROUP}/v2"));
    assert_eq!(as_v2.metadata.uid, as_v1.metadata.uid);

    // A list of 1 000, written in v1, read in v2.
    let writes: Vec<_> = (0..1000)
        .map(|i| {
            let v1 = v1.clone();
            async move {
                let w = widget(
                    &format!("w-{i:04}"),
                    "v1",
                    json!({"size": format!("{i}mm")}),
                );
                v1.create(&PostParams::default(), &w).await.unwrap();
            }
        })
        .collect();
    futures::future::join_all(writes).await;
    let listed = v2.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1001);
    for item in listed
        .items
        .iter()
        .filter(|w| w.metadata.name.as_deref() != Some("a"))
    {
        let i: i64 = item.metadata.name.as_deref().unwrap()[2..].parse().unwrap();
        assert_eq!(
            item.data["spec"],
            json!({"size": {"value": i, "unit": "mm"}})
        );
    }

    // A list larger than the server reads in one review (8 MiB) converts:
    // the API server converts what it reads from etcd object by object,
    // not as one review. 48 Widgets with 200 kB annotations (an object's
    // annotations take at most 256 KiB), in a namespace of their own.
    let big_ns = env.create_namespace("conversion-big").await.unwrap();
    let (v1_big, v2_big) = (api(&client, &big_ns, "v1"), api(&client, &big_ns, "v2"));
    let filler = "x".repeat(200_000);
    let writes: Vec<_> = (0..48)
        .map(|i| {
            let (v1, filler) = (v1_big.clone(), filler.clone());
            async move {
                let mut w = widget(&format!("w-{i:02}"), "v1", json!({"size": "1m"}));
                w.metadata.annotations = Some([("kinformer.dev/filler".to_owned(), filler)].into());
                v1.create(&PostParams::default(), &w).await.unwrap();
            }
        })
        .collect();
    futures::future::join_all(writes).await;
    let listed = v2_big
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("a list of 9.6 MB in v2: {}", message(e)));
    assert_eq!(listed.items.len(), 48);
    assert!(
        listed
            .items
            .iter()
            .all(|w| w.annotations()["kinformer.dev/filler"] == filler)
    );

    // What does not convert says why.
    v1.create(
        &PostParams::default(),
        &widget("big", "v1", json!({"size": "big"})),
    )
    .await
    .unwrap();
    let failed = message(v2.get("big").await.unwrap_err());
    assert!(
        failed.contains(r#"size \"big\" has no number"#)
            || failed.contains("size \"big\" has no number"),
        "{failed}"
    );
    let unknown = message(api(&client, &ns, "v3").get("a").await.unwrap_err());
    assert!(unknown.contains("v3 is not one of them"), "{unknown}");
    stop.cancel();
}
