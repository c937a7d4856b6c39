//! website with kube-runtime: the controller of examples/website written for
//! kube-rs, for the comparison in docs/controllers.md. Leader election comes
//! from kube-lease-manager (kube has none of its own), metrics from
//! prometheus-client as in kube-rs's controller-rs, and the HTTP server is
//! axum, as in kube-rs's version-rs. The webhooks are written as kube-rs's
//! admission_controller example writes them, on kube-core's admission and
//! conversion types, with axum-server for TLS (kube has no webhook server).
//! examples/website/check.sh checks it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use axum::routing::{get, post};
use axum::{Json, Router, extract::State, http::StatusCode, http::header::CONTENT_TYPE};
use axum_server::tls_rustls::RustlsConfig;
use futures::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
use kube::api::{Api, Patch, PatchParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use kube::core::{DynamicObject, response::Status};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{self, Event as Finalizer, finalizer};
use kube::{Client, CustomResource, Resource, ResourceExt};
use kube_lease_manager::LeaseManagerBuilder;
use prometheus_client::{encoding::text::encode, metrics::counter::Counter, registry::Registry};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};

/// A web site: an image served by `replicas` Pods for `host`.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "example.kinformer.dev",
    version = "v1",
    kind = "Website",
    namespaced,
    status = "WebsiteStatus"
)]
pub struct WebsiteSpec {
    pub image: String,
    pub replicas: i32,
    #[serde(default)] // defaulted by the webhook
    pub host: String,
}

/// The second version: the Pods' settings grouped.
pub mod v2 {
    use super::*;
    #[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
    #[kube(
        group = "example.kinformer.dev",
        version = "v2",
        kind = "Website",
        namespaced
    )]
    #[kube(status = "WebsiteStatus")]
    pub struct WebsiteSpec {
        pub host: String,
        pub pods: Pods,
    }
    #[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
    pub struct Pods {
        pub image: String,
        pub replicas: i32,
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebsiteStatus {
    #[serde(default)] // absent when 0, as controller-runtime's peer writes it
    pub ready_replicas: i32,
}

const MANAGER: &str = "website-controller";

// The Deployment and Service, written with k8s-openapi's types (children.rs)
// or, with the feature `json`, with `json!` (children_json.rs).
#[cfg_attr(feature = "json", path = "children_json.rs")] // variant switch
mod children; // variant switch

struct Context {
    client: Client,
    recorder: Recorder,
    reconciles: Counter,
}

type Error = finalizer::Error<kube::Error>;

async fn reconcile(website: Arc<Website>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.reconciles.inc();
    let api = Api::namespaced(ctx.client.clone(), &website.namespace().unwrap_or_default());
    let cleanup = "example.kinformer.dev/cleanup";
    let result = finalizer(&api, cleanup, website.clone(), |event| async {
        match event {
            Finalizer::Apply(website) => children::serve(&website, &ctx.client).await,
            Finalizer::Cleanup(website) => {
                tracing::info!(
                    "cleanup of {}: its Deployment and Service go with it",
                    website.name_any()
                );
                Ok(Action::await_change())
            }
        }
    })
    .await;
    if let Err(e) = &result {
        let event = Event {
            type_: EventType::Warning,
            reason: "ReconcileFailed".into(),
            note: Some(e.to_string()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let _ = ctx.recorder.publish(&event, &website.object_ref(&())).await;
    }
    result
}

type Review = Json<AdmissionReview<DynamicObject>>;

async fn mutate(Json(review): Json<AdmissionReview<Website>>) -> Review {
    let request: AdmissionRequest<Website> = match review.try_into() {
        Ok(request) => request,
        Err(e) => return Json(AdmissionResponse::invalid(e.to_string()).into_review()),
    };
    let response = AdmissionResponse::from(&request);
    let Some(website) = request.object.filter(|w| w.spec.host.is_empty()) else {
        return Json(response.into_review());
    };
    let host = format!("{}.example.com", website.name_any());
    let patch = json!([{ "op": "add", "path": "/spec/host", "value": host }]);
    let patched = serde_json::from_value(patch).map_err(|e| e.to_string());
    Json(
        match patched.and_then(|p| response.clone().with_patch(p).map_err(|e| e.to_string())) {
            Ok(response) => response.into_review(),
            Err(e) => response.deny(e).into_review(),
        },
    )
}

async fn validate(Json(review): Json<AdmissionReview<Website>>) -> Review {
    let request: AdmissionRequest<Website> = match review.try_into() {
        Ok(request) => request,
        Err(e) => return Json(AdmissionResponse::invalid(e.to_string()).into_review()),
    };
    let mut response = AdmissionResponse::from(&request);
    if let Some(website) = request.object {
        let (image, replicas) = (&website.spec.image, website.spec.replicas);
        if !(0..=10).contains(&replicas) {
            response = response.deny(format!("spec.replicas must be 0 to 10, not {replicas}"));
        } else if !image.rsplit('/').next().unwrap_or(image).contains(':') {
            response.warnings = Some(vec![format!(
                "spec.image {image} has no tag: latest is pulled"
            )]);
        }
    }
    Json(response.into_review())
}

/// One object converted to `desired`, through its typed versions.
fn convert_one(object: Value, desired: &str) -> Result<Value, String> {
    let from = object["apiVersion"].as_str().unwrap_or_default().to_owned();
    let converted = match (from.as_str(), desired) {
        (from, desired) if from == desired => Ok(object),
        ("example.kinformer.dev/v1", "example.kinformer.dev/v2") => {
            let site: Website = serde_json::from_value(object).map_err(|e| e.to_string())?;
            let pods = v2::Pods {
                image: site.spec.image,
                replicas: site.spec.replicas,
            };
            let spec = v2::WebsiteSpec {
                host: site.spec.host,
                pods,
            };
            serde_json::to_value(v2::Website {
                metadata: site.metadata,
                spec,
                status: site.status,
            })
        }
        ("example.kinformer.dev/v2", "example.kinformer.dev/v1") => {
            let site: v2::Website = serde_json::from_value(object).map_err(|e| e.to_string())?;
            let v2::Pods { image, replicas } = site.spec.pods;
            let spec = WebsiteSpec {
                image,
                replicas,
                host: site.spec.host,
            };
            serde_json::to_value(Website {
                metadata: site.metadata,
                spec,
                status: site.status,
            })
        }
        _ => return Err(format!("cannot convert a Website from {from} to {desired}")),
    };
    converted.map_err(|e| e.to_string())
}

async fn convert(Json(review): Json<ConversionReview>) -> Json<ConversionReview> {
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(e) => {
            let status = Status::failure(&e.to_string(), "InvalidRequest");
            return Json(ConversionResponse::invalid(status).into_review());
        }
    };
    let desired = request.desired_api_version.clone();
    let objects = request.objects.clone();
    let converted: Result<Vec<_>, _> = objects
        .into_iter()
        .map(|o| convert_one(o, &desired))
        .collect();
    let response = ConversionResponse::for_request(request);
    Json(match converted {
        Ok(objects) => response.success(objects).into_review(),
        Err(e) => response
            .failure(Status::failure(&e, "ConversionFailed"))
            .into_review(),
    })
}

fn error_policy(_: Arc<Website>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!("reconcile failed: {error}");
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt::init();
    let env = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
    let client = Client::try_default().await?;

    let mut registry = Registry::default();
    let reconciles = Counter::default();
    registry.register(
        "website_reconciles",
        "Website reconciles",
        reconciles.clone(),
    );
    let metrics = Router::new()
        .route(
            "/metrics",
            get(|State(registry): State<Arc<Registry>>| async move {
                let mut body = String::new();
                encode(&mut body, &registry).unwrap();
                let openmetrics = "application/openmetrics-text; version=1.0.0; charset=utf-8";
                ([(CONTENT_TYPE, openmetrics)], body)
            }),
        )
        .with_state(Arc::new(registry));
    let ready = Arc::new(AtomicBool::new(false));
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(ready): State<Arc<AtomicBool>>| async move {
                match ready.load(Ordering::Relaxed) {
                    true => StatusCode::OK,
                    false => StatusCode::SERVICE_UNAVAILABLE,
                }
            }),
        )
        .with_state(ready.clone());
    for (addr, router) in [
        (env("METRICS_ADDR")?, metrics),
        (env("PROBE_ADDR")?, probes),
    ] {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tokio::spawn(axum::serve(listener, router).into_future());
    }

    // The webhooks, served by every replica over TLS.
    let certs = env("CERT_DIR")?;
    let tls =
        RustlsConfig::from_pem_file(format!("{certs}/tls.crt"), format!("{certs}/tls.key")).await?;
    let webhooks = Router::new()
        .route("/mutate-example-kinformer-dev-v1-website", post(mutate))
        .route("/validate-example-kinformer-dev-v1-website", post(validate))
        .route("/convert", post(convert));
    let webhook_server =
        axum_server::bind_rustls(env("WEBHOOK_ADDR")?.parse::<std::net::SocketAddr>()?, tls);
    tokio::spawn(webhook_server.serve(webhooks.into_make_service()));

    // Only the holder of the Lease reconciles; a SIGTERM while waiting for it
    // is a clean exit too.
    let (mut leader, lease) = LeaseManagerBuilder::new(client.clone(), MANAGER)
        .with_namespace(env("LEASE_NAMESPACE")?)
        .build()
        .await?
        .watch()
        .await;
    let mut sigterm = signal(SignalKind::terminate())?;
    tokio::select! {
        elected = leader.wait_for(|&leading| leading) => { elected?; }
        _ = sigterm.recv() => return Ok(()),
    }
    tracing::info!("leading on Lease {MANAGER}");
    // Ready from here: waiting for the Website cache through
    // `Controller::store().wait_until_ready()` could stall the controller,
    // which waits on that store too, and only one waiter is woken
    // (kube-runtime 5.0.0).
    ready.store(true, Ordering::Relaxed);
    let mut lost = leader.clone();
    let context = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(client.clone(), MANAGER.into()),
        reconciles,
    });
    Controller::new(Api::<Website>::all(client.clone()), Default::default())
        .owns(Api::<Deployment>::all(client.clone()), Default::default())
        .owns(Api::<Service>::all(client), Default::default())
        .shutdown_on_signal()
        .graceful_shutdown_on(async move {
            let _ = lost.wait_for(|&leading| !leading).await;
        })
        .run(reconcile, error_policy, context)
        .for_each(|_| std::future::ready(()))
        .await;
    let still_leading = *leader.borrow();
    drop(leader); // releases the Lease
    lease.await??;
    anyhow::ensure!(still_leading, "lost the Lease {MANAGER}");
    Ok(())
}
