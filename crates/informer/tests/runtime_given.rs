//! An informer depends on no ambient runtime: it is made, configured and
//! given handlers outside any Tokio runtime, and runs on the runtime its
//! `run` is polled on; a factory starts its informers on the runtime
//! `start_on` is given.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_informer::{
    CancellationToken, InformerOptions, ListPage, ListRequest, ListWatchError, ListerWatcher,
    ReflectorOptions, ResourceEventHandlerFuncs, SharedIndexInformer, SharedInformerFactory,
    WatchRequest, WatchStream,
};
use tokio::runtime::Handle;

/// One list of one ConfigMap, then a watch that never ends.
struct OneObject;

impl ListerWatcher<ConfigMap> for OneObject {
    fn list(&self, _: ListRequest) -> BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("a".into()),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        Box::pin(async move {
            Ok(ListPage {
                items: vec![cm],
                resource_version: "1".into(),
                continue_token: None,
                skipped: Vec::new(),
                shard_selector: None,
            })
        })
    }

    fn watch(
        &self,
        _: WatchRequest,
    ) -> BoxFuture<'_, Result<WatchStream<ConfigMap>, ListWatchError>> {
        Box::pin(async { Ok(futures::stream::pending().boxed()) })
    }

    fn describe(&self) -> String {
        "one configmap".into()
    }
}

#[test]
fn an_informer_made_outside_any_runtime_runs_on_the_runtime_that_polls_run() {
    assert!(Handle::try_current().is_err());
    let mut reflector = ReflectorOptions::default();
    reflector.use_watch_list = false;
    let informer = SharedIndexInformer::new(
        OneObject,
        InformerOptions::default()
            .reflector(reflector)
            .default_resync(Duration::from_secs(3600)),
    );
    informer.set_transform(|cm: ConfigMap| cm).unwrap();
    informer.add_index("any", |_| vec![String::new()]).unwrap();
    let added = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&added);
    let registration = informer
        .add_event_handler(ResourceEventHandlerFuncs::new().on_add(move |_, _| {
            seen.fetch_add(1, Ordering::SeqCst);
        }))
        .unwrap();

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let ended = runtime.block_on(async {
        let run = tokio::spawn({
            let (informer, shutdown) = (informer.clone(), shutdown.clone());
            async move { informer.run(shutdown).await }
        });
        // Synced once the handler has handled the initial list too: the
        // handlers' buffers are dropped at the shutdown.
        for _ in 0..3000 {
            if registration.has_synced() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        run.await.unwrap()
    });
    assert!(ended.is_ok(), "{ended:?}");
    assert_eq!(informer.indexer().list_keys(), ["ns/a"]);
    assert_eq!(added.load(Ordering::SeqCst), 1);
}

#[test]
fn a_factory_started_on_a_runtime_it_is_given_runs_its_informers_there() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A client needs a runtime to be made; it is never answered here.
    let client = runtime.block_on(async {
        let config = kube_client::Config::new("http://127.0.0.1:9".parse().unwrap());
        kube_client::Client::try_from(config).unwrap()
    });
    let factory = SharedInformerFactory::new(client).namespace("ns");
    let informer = factory.informer::<ConfigMap>();
    assert!(Handle::try_current().is_err());
    let shutdown = CancellationToken::new();
    factory.start_on(runtime.handle(), &shutdown);
    let started = runtime.block_on(async {
        for _ in 0..3000 {
            if informer.is_started() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    });
    assert!(
        started,
        "the informer's run was not spawned on the runtime given"
    );
    shutdown.cancel();
}
