//! Every reconcile runs in a tracing span naming the controller, the
//! object, its retries and a reconcile id: a log line the reconcile writes
//! says which object it is about without the user's help. Its own test
//! binary: it installs the process's global subscriber.

use std::io::Write;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_controllers::{Action, Controller, Lookup};
use kinformer_informer::{CancellationToken, SharedInformerFactory};
use kube_client::api::{Api, PostParams};
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
async fn a_log_line_inside_a_reconcile_names_the_controller_and_the_object() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let (client, ns) = setup("span").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let factory = SharedInformerFactory::new(client).namespace(ns.clone());
    let seen: Arc<Mutex<bool>> = Arc::default();
    let controller = Controller::<ConfigMap>::builder("spans", &factory)
        .reconcile(Arc::clone(&seen), |cm, seen| async move {
            if let Lookup::Found(_) = cm {
                tracing::info!("reconciling inside");
                *seen.lock() = true;
            }
            Ok(Action::Done)
        })
        .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    eventually("the reconcile", async || *seen.lock()).await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&captured.0.lock()).into_owned();
    let line = text
        .lines()
        .find(|l| l.contains("reconciling inside"))
        .unwrap_or_else(|| panic!("no line from the reconcile in {text}"));
    for field in [
        "reconcile{".to_owned(),
        "controller=spans".to_owned(),
        format!("object={ns}/a"),
        "retries=0".to_owned(),
        "reconcile_id=".to_owned(),
    ] {
        assert!(line.contains(&field), "{field} in {line}");
    }
}
