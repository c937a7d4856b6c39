//! A relist on the in-order atomic queue against a real kube-apiserver: a
//! 410 forced by an etcd compaction relists 10 000 objects while readers
//! read the cache through a Lister without pause. Every read sees either the
//! whole old list or the whole new one, never a mix, and the cache's
//! resourceVersion never runs ahead of its content.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_envtest::{Proxy, TestEnv, TestEnvOptions};
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, FifoKind, InformerOptions, Lister, ReflectorOptions,
    ResourceEventHandlerFuncs, SharedIndexInformer,
};
use kube_client::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const OBJECTS: usize = 10_000;

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "data": {"k": "v"},
    }))
    .unwrap()
}

async fn each(names: impl Iterator<Item = String>, f: impl AsyncFn(String) + Clone) {
    stream::iter(names)
        .for_each_concurrent(32, |name| {
            let f = f.clone();
            async move { f(name).await }
        })
        .await;
}

/// name -> resourceVersion.
type Versions = HashMap<String, String>;

fn versions(objects: impl IntoIterator<Item = Arc<ConfigMap>>) -> Versions {
    objects
        .into_iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap_or_default(),
                c.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// What one read of the cache was: the old list, the new one, or how far
/// from each it was.
fn judge(read: &Versions, old: &Versions, new: &Versions) -> Result<bool, String> {
    if read == old {
        return Ok(false);
    }
    if read == new {
        return Ok(true);
    }
    let like = |list: &Versions| {
        read.iter()
            .filter(|(k, v)| list.get(*k) == Some(*v))
            .count()
    };
    Err(format!(
        "a read of {} objects: {} as in the old list ({}), {} as in the new ({})",
        read.len(),
        like(old),
        old.len(),
        like(new),
        new.len()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_relist_of_10_000_objects_reaches_concurrent_lister_reads_whole() {
    relist_under_reads(FifoKind::AtomicFifo).await;
}

async fn relist_under_reads(fifo: FifoKind) {
    // Without the watch cache, an etcd compaction makes the old version 410 at once.
    let env = TestEnv::start_with(TestEnvOptions::new().without_watch_cache())
        .await
        .unwrap();
    let ns = env.create_namespace("atomic").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().unwrap(), &ns);
    let create = {
        let api = api.clone();
        async move |name: String| {
            api.create(&PostParams::default(), &config_map(&name))
                .await
                .unwrap();
        }
    };
    each((0..OBJECTS).map(|i| format!("c{i:05}")), create.clone()).await;

    let proxy = Proxy::start(env.api_port()).await.unwrap();
    let mut reflector = ReflectorOptions::default();
    reflector.backoff.initial = Duration::from_millis(100);
    reflector.backoff.max = Duration::from_millis(500);
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<ConfigMap>::namespaced(env.client_via(proxy.port()).unwrap(), &ns),
        InformerOptions::new().fifo(fifo).reflector(reflector),
    );
    // A handler, so the relist is also told (and its notifications built).
    informer
        .add_event_handler(ResourceEventHandlerFuncs::new())
        .unwrap();
    let shutdown = CancellationToken::new();
    let (i, s) = (informer.clone(), shutdown.clone());
    tokio::spawn(async move { i.run(s).await });
    let lister = informer.lister();
    for _ in 0..600 {
        if informer.has_synced() && lister.list(&Default::default()).len() == OBJECTS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let old = versions(lister.list(&Default::default()));
    assert_eq!(old.len(), OBJECTS, "the initial list was not cached");

    // Cut off: a fifth of the objects change, a tenth go and a tenth come,
    // and etcd forgets the history a watch would need to catch up.
    let lists = informer.reflector_stats().unwrap();
    let lists_before = lists.lists_completed.load(Ordering::SeqCst);
    proxy.refuse(true);
    proxy.cut_all();
    let update = {
        let api = api.clone();
        async move |name: String| {
            let patch = serde_json::json!({"data": {"k": "changed"}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap();
        }
    };
    each((0..OBJECTS / 5).map(|i| format!("c{:05}", i * 5)), update).await;
    let delete = {
        let api = api.clone();
        async move |name: String| {
            api.delete(&name, &DeleteParams::default()).await.unwrap();
        }
    };
    each(
        (0..OBJECTS / 10).map(|i| format!("c{:05}", i * 10 + 1)),
        delete,
    )
    .await;
    each((0..OBJECTS / 10).map(|i| format!("n{i:05}")), create).await;
    env.compact_etcd().await.unwrap();
    let listed = api.list(&ListParams::default()).await.unwrap();
    let new_rv: u64 = listed
        .metadata
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .expect("a list's resourceVersion");
    let new = versions(listed.items.into_iter().map(Arc::new));
    assert_ne!(old, new);

    // Readers read without pause from before the connection is back until
    // the cache holds the new list.
    let done = Arc::new(AtomicBool::new(false));
    let reader = |lister: Lister<ConfigMap>| {
        let (done, old, new) = (Arc::clone(&done), old.clone(), new.clone());
        std::thread::spawn(move || {
            let (mut reads, mut new_reads, mut mixes) = (0u64, 0u64, Vec::new());
            while !done.load(Ordering::SeqCst) {
                // The version first: the content read after it must be at
                // least that new.
                let rv = lister.last_store_sync_resource_version();
                let read = versions(lister.list(&Default::default()));
                reads += 1;
                let at_new = rv.as_deref().and_then(|rv| rv.parse::<u64>().ok()) >= Some(new_rv);
                match judge(&read, &old, &new) {
                    Ok(true) => new_reads += 1,
                    Ok(false) if at_new => mixes.push(format!(
                        "the old list read after the cache said it was synced to {rv:?}, past the new list's {new_rv}"
                    )),
                    Ok(false) => {}
                    Err(mix) => mixes.push(mix),
                }
            }
            (reads, new_reads, mixes)
        })
    };
    let readers = [reader(lister.clone()), reader(lister.clone())];
    proxy.refuse(false);
    let mut relisted = false;
    for _ in 0..1200 {
        if lists.lists_completed.load(Ordering::SeqCst) > lists_before
            && versions(lister.list(&Default::default())) == new
        {
            relisted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done.store(true, Ordering::SeqCst);
    let mut mixes = Vec::new();
    let (mut reads, mut new_reads) = (0, 0);
    for r in readers {
        let (n, new_n, m) = r.join().unwrap();
        reads += n;
        new_reads += new_n;
        mixes.extend(m);
    }
    assert!(relisted, "the cache never came to hold the new list");
    assert!(
        new_reads > 0 && reads > new_reads,
        "{reads} reads, {new_reads} of the new list"
    );
    assert_eq!(
        mixes.len(),
        0,
        "{} of {reads} reads saw a mix, e.g. {:?}",
        mixes.len(),
        mixes.first()
    );
    // Synced to the relist's version at the latest, by the time nothing moves.
    let synced = lister
        .last_store_sync_resource_version()
        .unwrap_or_default();
    assert!(
        synced.parse::<u64>().is_ok_and(|rv| rv >= new_rv),
        "the cache says {synced}, the server listed at {new_rv}"
    );
    shutdown.cancel();
}
