//! A Manager serving webhooks beside its controllers, called by the real
//! kube-apiserver over TLS: served from the start of `run`, ready, counted
//! in its metrics, stopped with the Manager; a missing certificate fails
//! `run` naming it.

mod common;

use std::sync::Arc;

use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_controllers::webhook::dev_certs::DevCerts;
use kinformer_controllers::webhook::{Verdict, Webhooks};
use kinformer_controllers::{Action, ControllerError, Lookup, Manager, ManagerOptions};
use kube_client::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use common::{eventually, http_get, setup};

fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A Manager with a do-nothing ConfigMap controller and a webhook that
/// refuses ConfigMaps with a `forbidden` key.
fn manager(client: &kube_client::Client, options: ManagerOptions) -> Manager {
    let mut manager = Manager::new(client.clone(), options).unwrap();
    let controller = manager
        .controller::<ConfigMap>("noop")
        .reconcile(Arc::new(()), |_: Lookup<ConfigMap>, _| async {
            Ok(Action::Done)
        })
        .unwrap();
    manager.add(controller);
    manager.webhooks(Webhooks::new().validate("/validate", |request| async move {
        let cm: ConfigMap = request.object.unwrap_or_default();
        if cm.data.unwrap_or_default().contains_key("forbidden") {
            Verdict::deny("the key forbidden is refused")
        } else {
            Verdict::allow()
        }
    }));
    manager
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_serves_its_webhooks_to_the_api_server_and_reports_them_ready() {
    let (client, ns) = setup("manager-webhooks").await;
    let certs = DevCerts::new(&["127.0.0.1"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    certs.write(dir.path()).unwrap();
    let (webhook_addr, probe_addr) = (free_addr(), free_addr());
    let options = ManagerOptions::new()
        .health_probe_bind_address(probe_addr)
        .metrics_bind_address(probe_addr)
        .webhook_server(webhook_addr, dir.path());
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(manager(&client, options).run(shutdown.clone()));

    let name = format!("{ns}-validate");
    let configuration: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "validate.kinformer.dev",
            "clientConfig": {
                "url": format!("https://{webhook_addr}/validate"),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(&certs.ca),
            },
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                       "operations": ["CREATE"], "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Fail", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
        }],
    }))
    .unwrap();
    let configurations = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    configurations
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut attempt = 0;
    eventually("the API server calling the Manager's webhook", async || {
        attempt += 1;
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("probe-{attempt}")}, "data": {"forbidden": "x"},
        }))
        .unwrap();
        match cms.create(&PostParams::default(), &cm).await {
            Err(kube_client::Error::Api(s)) => s.message.contains("the key forbidden is refused"),
            Ok(_) => false,
            Err(e) => panic!("{e}"),
        }
    })
    .await;
    // Ready once the caches have synced, the webhook check passing.
    eventually("/readyz", async || {
        http_get(probe_addr, "/readyz")
            .await
            .starts_with("HTTP/1.1 200")
    })
    .await;
    // Counted in the Manager's registry, none left in flight.
    let scraped = http_get(probe_addr, "/metrics").await;
    let denied = scraped
        .lines()
        .find(|l| {
            l.starts_with("kinformer_webhook_requests_total{")
                && l.contains(r#"webhook="/validate""#)
                && l.contains(r#"code="200""#)
        })
        .and_then(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok());
    assert!(denied.is_some_and(|n| n >= 1.0), "{scraped}");
    assert!(
        scraped.contains(r#"kinformer_webhook_requests_in_flight{webhook="/validate"} 0"#),
        "{scraped}"
    );
    assert!(
        scraped.contains("kinformer_webhook_latency_seconds_count"),
        "{scraped}"
    );

    shutdown.cancel();
    run.await.unwrap().unwrap();
    // Stopped with the Manager: its port refuses.
    assert!(tokio::net::TcpStream::connect(webhook_addr).await.is_err());
    configurations
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_missing_certificate_fails_the_run_naming_its_file() {
    let (client, _) = setup("manager-webhooks-nocert").await;
    let dir = tempfile::tempdir().unwrap();
    let options = ManagerOptions::new().webhook_server(free_addr(), dir.path());
    let error = manager(&client, options)
        .run(CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(error, ControllerError::Webhook(_)), "{error:?}");
    // The file is named by the cause, the webhook server's error.
    let message = kinformer_controllers::error_chain(&error);
    assert!(
        message.contains(&dir.path().join("tls.crt").display().to_string()),
        "{message}"
    );
}
