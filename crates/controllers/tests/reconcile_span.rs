//! Every reconcile runs in a tracing span naming the controller, the
//! object, why it was queued, its retries and a reconcile id: a log line the reconcile writes
//! says which object it is about without the user's help. Its own test
//! binary: it installs the process's global subscriber.

use std::io::Write;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kinformer_controllers::{Action, Controller, Lookup};
use kinformer_informer::{CancellationToken, SharedInformerFactory};
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;

mod common;
use common::{config_map, eventually, setup};

/// Log output, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_line_inside_a_reconcile_names_the_controller_the_object_and_why_it_was_queued() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let (client, ns) = setup("span").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = api
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let factory = SharedInformerFactory::new(client.clone()).namespace(ns.clone());
    let count: Arc<Mutex<u32>> = Arc::default();
    let controller = Controller::<ConfigMap>::builder("spans", &factory)
        .owns::<Secret>()
        .reconcile(Arc::clone(&count), |cm, count| async move {
            let Lookup::Found(_) = cm else {
                return Ok(Action::Done);
            };
            let n = {
                let mut count = count.lock();
                *count += 1;
                *count
            };
            tracing::info!(n, "reconciling inside");
            if n == 2 {
                return Err("failing once".into());
            }
            Ok(Action::Done)
        })
        .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    let reconciled = async |n: u32| eventually("the reconcile", async || *count.lock() >= n).await;
    // 1: listed. 2: updated, and failing. 3: its retry.
    reconciled(1).await;
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"k": "v2"}})),
    )
    .await
    .unwrap();
    reconciled(3).await;
    // 4: a Secret it owns changed.
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("s".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "a".into(),
                uid: cm.metadata.uid.clone().unwrap(),
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client, &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    reconciled(4).await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&captured.0.lock()).into_owned();
    let line = |n: u32| {
        text.lines()
            .find(|l| l.contains("reconciling inside") && l.contains(&format!(" n={n}")))
            .unwrap_or_else(|| panic!("no line {n} from the reconcile in {text}"))
            .to_owned()
    };
    let first = line(1);
    for field in [
        "reconcile{".to_owned(),
        "controller=spans".to_owned(),
        format!("object={ns}/a"),
        "reason=object added".to_owned(),
        "retries=0".to_owned(),
        "reconcile_id=".to_owned(),
    ] {
        assert!(first.contains(&field), "{field} in {first}");
    }
    for (n, fields) in [
        (2, ["reason=object updated", "retries=0"]),
        (3, ["reason=retry after an error", "retries=1"]),
        (
            4,
            [
                &format!("reason=related Secret {ns}/s changed"),
                "retries=0",
            ],
        ),
    ] {
        let line = line(n);
        for field in fields {
            assert!(line.contains(field), "{field} in {line}");
        }
    }
}
