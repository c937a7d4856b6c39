//! A Manager that serves its own CRD's conversion and lists that CRD in a
//! version other than the stored one, reached by the API server only while
//! its `/readyz` answers 200 (as through a Service, which routes only to
//! ready pods): on a cold start it becomes ready, its cache syncs and it
//! reconciles an object written in the stored version.

mod common;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kinformer_controllers::webhook::dev_certs::DevCerts;
use kinformer_controllers::webhook::{Conversion, Webhooks};
use kinformer_controllers::{Action, Lookup, Manager, ManagerOptions};
use kinformer_envtest::TestEnv;
use kube_client::api::{Api, ApiResource, DynamicObject, ObjectMeta, PostParams};
use kube_client::core::{GroupVersionKind, NamespaceResourceScope, Resource};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use common::{eventually, http_get, setup};

const GROUP: &str = "coldstart.kinformer.dev";

macro_rules! gadget {
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
                "Gadget".into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                GROUP.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                "gadgets".into()
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

/// v1 (stored): the colour as `colour`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SpecV1 {
    colour: String,
}

/// v2 (served): the colour as `color`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SpecV2 {
    color: String,
}

gadget!(GadgetV1, "v1", SpecV1);
gadget!(GadgetV2, "v2", SpecV2);

fn conversion() -> Conversion<GadgetV1> {
    Conversion::<GadgetV1>::hub().spoke::<GadgetV2>(
        |g| {
            Ok(GadgetV1 {
                metadata: g.metadata,
                spec: SpecV1 {
                    colour: g.spec.color,
                },
            })
        },
        |g| {
            Ok(GadgetV2 {
                metadata: g.metadata,
                spec: SpecV2 {
                    color: g.spec.colour,
                },
            })
        },
    )
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Whether `/readyz` on `probes` answers 200 now; an unreachable server is
/// not ready.
async fn ready(probes: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(probes).await else {
        return false;
    };
    let request = "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if s.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    answer.starts_with(b"HTTP/1.1 200")
}

/// A Service in front of the webhook server at `target`: each connection
/// is forwarded (TLS untouched) only if `/readyz` on `probes` answers 200
/// when it is opened, and closed otherwise, as kube-proxy does for a
/// Service whose only pod is not ready. Returns its address.
async fn ready_pods_service(probes: SocketAddr, target: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                if !ready(probes).await {
                    return;
                }
                if let Ok(mut server) = TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_listing_its_crd_through_its_own_conversion_webhook_becomes_ready_on_a_cold_start()
 {
    let (client, ns) = setup("conversion-cold-start").await;
    let env = TestEnv::shared().await.unwrap();
    let certs = DevCerts::new(&["127.0.0.1"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    certs.write(dir.path()).unwrap();
    let (webhook_addr, probe_addr) = (free_addr(), free_addr());
    let service = ready_pods_service(probe_addr, webhook_addr).await;

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
        "metadata": {"name": format!("gadgets.{GROUP}")},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
            "versions": [version("v1", true), version("v2", false)],
            "conversion": {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"service": {"name": "gadgets", "namespace": "system", "path": "/convert"}},
            }},
        },
    });
    env.install_webhooks(&[crd], service, &certs.ca)
        .await
        .unwrap();

    // Written in v1, the stored version: no conversion needed yet.
    let v1 = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, "v1", "Gadget"),
            "gadgets",
        ),
    );
    let gadget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/v1"), "kind": "Gadget",
        "metadata": {"name": "a"}, "spec": {"colour": "red"},
    }))
    .unwrap();
    eventually("the API server serving the CRD", async || {
        v1.create(&PostParams::default(), &gadget).await.is_ok()
    })
    .await;

    // Cold start: the Manager lists gadgets in v2, which needs its own
    // conversion webhook, which the API server reaches only once it is ready.
    let options = ManagerOptions::new()
        .health_probe_bind_address(probe_addr)
        .webhook_server(webhook_addr, dir.path());
    let mut manager = Manager::new(client.clone(), options).unwrap();
    let (reconciled, mut reconciles) = mpsc::unbounded_channel();
    let controller = manager
        .controller::<GadgetV2>("gadgets")
        .reconcile(Arc::new(reconciled), |lookup, reconciled| async move {
            if let Lookup::Found(gadget) = lookup {
                let _ = reconciled.send(gadget.spec.color.clone());
            }
            Ok(Action::Done)
        })
        .unwrap();
    manager.add(controller);
    manager.webhooks(Webhooks::new().convert("/convert", conversion()));
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(manager.run(shutdown.clone()));

    // Reconciled from a synced cache, in v2 (converted by the webhook).
    let color = tokio::time::timeout(Duration::from_secs(120), reconciles.recv())
        .await
        .expect("no reconcile in 120 s: the Manager never became ready to serve its conversion")
        .unwrap();
    assert_eq!(color, "red");
    let readyz = http_get(probe_addr, "/readyz").await;
    assert!(readyz.starts_with("HTTP/1.1 200"), "{readyz}");

    shutdown.cancel();
    run.await.unwrap().unwrap();
    let crds = Api::<DynamicObject>::all_with(
        client,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    let _ = crds
        .delete(&format!("gadgets.{GROUP}"), &Default::default())
        .await;
}
