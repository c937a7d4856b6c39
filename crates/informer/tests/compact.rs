//! A compact informer against the real server: the objects it serves are
//! the ones an informer of whole objects serves, through gets, lists and
//! indexes, while its handlers still receive decoded objects.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kinformer_envtest::TestEnv;
use kinformer_informer::consistency::LastSeen;
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, Compact, InformerOptions, SharedIndexInformer,
    strip_managed_fields,
};
use kinformer_store::{IndexFunc, Indexers};
use kube_client::api::{Api, Patch, PatchParams, PostParams};

mod common;
use common::{create_pods, delete_pods, no_difference, spec_pod, wait_synced};

const APP_INDEX: &str = "app";

fn app_index() -> Indexers<Pod> {
    let f: IndexFunc<Pod> = Arc::new(|p: &Pod| {
        Ok(p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app").cloned())
            .into_iter()
            .collect())
    });
    Indexers::from([(APP_INDEX.to_owned(), f)])
}

fn start(
    client: kube_client::Client,
    ns: &str,
    options: InformerOptions<Pod>,
) -> (SharedIndexInformer<Pod>, LastSeen, CancellationToken) {
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<Pod>::namespaced(client, ns),
        options.fifo(common::fifo()).indexers(app_index()),
    );
    informer.set_transform(strip_managed_fields).unwrap();
    let seen = LastSeen::default();
    informer.add_event_handler(seen.clone()).unwrap();
    let shutdown = CancellationToken::new();
    let (i, s) = (informer.clone(), shutdown.clone());
    tokio::spawn(async move { i.run(s).await });
    (informer, seen, shutdown)
}

fn sorted(mut pods: Vec<Arc<Pod>>) -> Vec<Arc<Pod>> {
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    pods
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compact_informer_serves_the_same_objects_as_one_of_whole_objects() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("compact").await.unwrap();
    let client = env.client().unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for i in 0..5 {
        let pod: Pod = serde_json::from_value(spec_pod(&format!("rich{i}"))).unwrap();
        api.create(&PostParams::default(), &pod).await.unwrap();
    }
    create_pods(&api, (0..40).map(|i| format!("p{i}"))).await;

    // A decoded cache of 4: most reads decode, some are served from it.
    let (compact, compact_seen, stop_compact) = start(
        client.clone(),
        &ns,
        InformerOptions::new().compact(Compact::json().decoded_cache(4)),
    );
    let (whole, whole_seen, stop_whole) = start(client, &ns, InformerOptions::new());
    wait_synced(&compact).await;
    wait_synced(&whole).await;

    // Changes after the sync: updates that move pods between index values,
    // deletes, and new pods.
    for i in 0..20 {
        let patch = serde_json::json!({"metadata": {"labels": {"app": format!("moved{}", i % 3)}}});
        api.patch(
            &format!("p{i}"),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .unwrap();
    }
    delete_pods(&api, (30..40).map(|i| format!("p{i}"))).await;
    create_pods(&api, (40..50).map(|i| format!("p{i}"))).await;
    let within = Duration::from_secs(30);
    no_difference(&api, &compact, [&compact_seen], within).await;
    no_difference(&api, &whole, [&whole_seen], within).await;

    let (c, w) = (compact.lister(), whole.lister());
    let all = sorted(w.list(&Default::default()));
    assert_eq!(all.len(), 5 + 40);
    assert_eq!(sorted(c.list(&Default::default())), all);
    for pod in &all {
        let name = pod.metadata.name.as_deref().unwrap();
        assert_eq!(c.namespaced(&ns).get(name).as_deref(), Some(&**pod));
    }
    let values = whole.indexer().list_index_func_values(APP_INDEX);
    assert!(values.len() >= 4, "{values:?}");
    for value in &values {
        assert_eq!(
            sorted(compact.indexer().by_index(APP_INDEX, value).unwrap()),
            sorted(whole.indexer().by_index(APP_INDEX, value).unwrap()),
            "index value {value}"
        );
    }

    let stats = compact.indexer().compact_stats().expect("a compact cache");
    assert_eq!(stats.encoded_objects, all.len(), "{stats:?}");
    assert_eq!(
        (stats.whole_objects, stats.decode_failures),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(stats.disabled, None);
    assert!(
        stats.decodes > 0 && stats.decoded_cache_hits > 0,
        "{stats:?}"
    );
    // The encodings are the stripped JSON of what is cached.
    let json_bytes: usize = all
        .iter()
        .map(|p| serde_json::to_vec(&**p).unwrap().len())
        .sum();
    assert_eq!(stats.encoded_bytes, json_bytes);
    assert!(whole.indexer().compact_stats().is_none());
    stop_compact.cancel();
    stop_whole.cancel();
}
