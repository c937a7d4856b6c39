//! Informer logic against an in-memory ListerWatcher: the delta-to-handler
//! rules of client-go's shared_informer.go, without the wire.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_informer::testing::{
    self, LiveWatch, ScriptedListerWatcher, ScriptedWatch, initial_events_end,
};
use kinformer_informer::{
    CancellationToken, CatchUpError, FifoKind, InformerError, InformerOptions, LIST_BATCH,
    ListPage, ListWatchError, ReflectorOptions, ResourceEventHandlerFuncs, SharedIndexInformer,
    Undecodable,
};
use kinformer_store::Indexers;
use kube_client::core::WatchEvent;
use parking_lot::Mutex;

fn cm(name: &str, rv: u64) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            resource_version: Some(rv.to_string()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn page(items: Vec<ConfigMap>, rv: u64) -> Result<ListPage<ConfigMap>, ListWatchError> {
    Ok(testing::page(items, rv))
}

/// A page with a continue token: more pages follow.
fn paged(
    items: Vec<ConfigMap>,
    rv: u64,
    token: &str,
) -> Result<ListPage<ConfigMap>, ListWatchError> {
    Ok(ListPage {
        continue_token: Some(token.into()),
        ..testing::page(items, rv)
    })
}

/// A 500 InternalError Status, as a watch stream carries it.
fn internal_error() -> ListWatchError {
    ListWatchError::Api {
        code: 500,
        reason: "InternalError".into(),
        message: "unable to transform key: corrupt object".into(),
        causes: Vec::new(),
    }
}

struct Harness {
    informer: SharedIndexInformer<ConfigMap>,
    lw: ScriptedListerWatcher<ConfigMap>,
    shutdown: CancellationToken,
}

fn fast_reflector() -> ReflectorOptions {
    let mut o = ReflectorOptions::default();
    o.use_watch_list = false;
    o.backoff.initial = Duration::from_millis(10);
    o.backoff.max = Duration::from_millis(50);
    o
}

fn harness(
    lists: Vec<Result<ListPage<ConfigMap>, ListWatchError>>,
    options: InformerOptions<ConfigMap>,
) -> Harness {
    harness_with(lists, options, fast_reflector())
}

fn harness_with(
    lists: Vec<Result<ListPage<ConfigMap>, ListWatchError>>,
    options: InformerOptions<ConfigMap>,
    reflector: ReflectorOptions,
) -> Harness {
    let lw = scripted(lists);
    Harness {
        informer: SharedIndexInformer::new(lw.clone(), options.reflector(reflector)),
        lw,
        shutdown: CancellationToken::new(),
    }
}

fn scripted(
    lists: Vec<Result<ListPage<ConfigMap>, ListWatchError>>,
) -> ScriptedListerWatcher<ConfigMap> {
    let lw = ScriptedListerWatcher::new();
    for list in lists {
        lw.script_list(list);
    }
    lw
}

impl Harness {
    fn start(&self) -> tokio::task::JoinHandle<Result<(), InformerError>> {
        let informer = self.informer.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move { informer.run(shutdown).await })
    }

    /// Waits (up to 5 s) until the cache holds exactly `keys`.
    async fn wait_for_keys(&self, keys: &[&str]) -> Vec<String> {
        let mut cached = Vec::new();
        for _ in 0..500 {
            cached = self.informer.indexer().list_keys();
            cached.sort();
            if cached == keys {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cached
    }

    async fn next_watch(&self) -> LiveWatch<ConfigMap> {
        self.lw.next_watch().await
    }

    /// Waits (up to 5 s) until the informer has synced: the list is
    /// applied off the runtime, possibly after the next watch opened.
    async fn synced(&self) -> bool {
        for _ in 0..500 {
            if self.informer.has_synced() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }
}

/// What a handler saw, as lines like "add a 1 initial".
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn handler(&self) -> ResourceEventHandlerFuncs<ConfigMap> {
        let (a, u, d) = (self.clone(), self.clone(), self.clone());
        let rv = |c: &ConfigMap| c.metadata.resource_version.clone().unwrap();
        let name = |c: &ConfigMap| c.metadata.name.clone().unwrap();
        ResourceEventHandlerFuncs::new()
            .on_add(move |o, initial| {
                a.0.lock().push(format!(
                    "add {} {}{}",
                    name(o),
                    rv(o),
                    if initial { " initial" } else { "" }
                ))
            })
            .on_update(move |old, new| {
                let same = if Arc::ptr_eq(old, new) || old == new {
                    " same"
                } else {
                    ""
                };
                u.0.lock().push(format!(
                    "update {} {}->{}{}",
                    name(new),
                    rv(old),
                    rv(new),
                    same
                ))
            })
            .on_delete(move |o| {
                let kind = if o.is_tombstone() { " tombstone" } else { "" };
                d.0.lock().push(format!(
                    "delete {} {}{}",
                    name(o.object()),
                    rv(o.object()),
                    kind
                ))
            })
    }

    async fn wait_for(&self, n: usize) -> Vec<String> {
        for _ in 0..1000 {
            if self.0.lock().len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.0.lock().clone()
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn handlers_see_the_initial_list_as_adds_then_watch_events() {
    let h = harness(
        vec![page(vec![cm("a", 1), cm("b", 2)], 2)],
        common::options(),
    );
    let log = Log::default();
    let reg = h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    assert!(
        h.synced().await,
        "applied off the runtime: a DeltaFifo would merge"
    );
    assert_eq!(h.lw.watch_requests()[0].resource_version, "2");
    assert!(h.lw.watch_requests()[0].allow_bookmarks);
    assert_eq!(
        h.lw.list_requests()[0].resource_version.as_deref(),
        Some("0")
    );
    w.modify(cm("a", 3));
    w.add(cm("c", 4));
    w.delete(cm("b", 5));
    let seen = log.wait_for(5).await;
    assert_eq!(
        sorted(seen[..2].to_vec()),
        ["add a 1 initial", "add b 2 initial"]
    );
    assert_eq!(seen[2..], ["update a 1->3", "add c 4", "delete b 5"]);
    assert!(h.informer.has_synced());
    assert!(reg.has_synced());
    assert_eq!(h.informer.last_sync_resource_version(), "5");
    let mut keys = h.informer.indexer().list_keys();
    keys.sort();
    assert_eq!(keys, ["ns/a", "ns/c"]);
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_handler_added_after_start_first_gets_the_whole_cache() {
    let h = harness(
        vec![page(vec![cm("a", 1), cm("b", 2)], 2)],
        common::options(),
    );
    h.start();
    let w = h.next_watch().await;
    w.add(cm("c", 3));
    for _ in 0..200 {
        if h.informer.indexer().len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = Log::default();
    let reg = h.informer.add_event_handler(log.handler()).unwrap();
    let seen = log.wait_for(3).await;
    assert_eq!(
        sorted(seen),
        ["add a 1 initial", "add b 2 initial", "add c 3 initial"]
    );
    assert!(reg.has_synced());
    w.modify(cm("c", 4));
    assert_eq!(log.wait_for(4).await[3], "update c 3->4");
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_relist_after_410_delivers_missed_deletes_as_tombstones() {
    let h = harness(
        vec![
            page(vec![cm("a", 1), cm("b", 2)], 2),
            // After the watch expired: b is gone, a changed.
            page(vec![cm("a", 7)], 9),
        ],
        common::options(),
    );
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    w.send(Ok(WatchEvent::Bookmark(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"resourceVersion": "6"}
        }))
        .unwrap(),
    )));
    // Same stream: the bookmark is handled before the error.
    w.fail(ListWatchError::Gone(
        "too old resource version: 6 (8)".into(),
    ));
    let _second_watch = h.next_watch().await;
    let seen = log.wait_for(4).await;
    // A DeltaFifo queues the listed keys, then the deletions; a RealFifo
    // the deletions first (client-go's RealFIFO), as an atomic one tells.
    let relisted = match common::fifo() {
        FifoKind::DeltaFifo => ["update a 1->7", "delete b 2 tombstone"],
        _ => ["delete b 2 tombstone", "update a 1->7"],
    };
    assert_eq!(seen[2..], relisted);
    // The relist asked for the last version seen (the bookmark's), not "".
    assert_eq!(
        h.lw.list_requests()[1].resource_version.as_deref(),
        Some("6")
    );
    assert_eq!(h.informer.indexer().list_keys(), ["ns/a"]);
    h.shutdown.cancel();
}

#[tokio::test]
async fn with_a_real_fifo_handlers_get_every_change_in_arrival_order_and_a_relists_deletions_first()
{
    in_arrival_order_and_a_relists_deletions_first(FifoKind::RealFifo).await;
}

#[tokio::test]
async fn with_an_atomic_fifo_handlers_get_every_change_in_arrival_order_and_a_relists_deletions_first()
 {
    in_arrival_order_and_a_relists_deletions_first(FifoKind::AtomicFifo).await;
}

async fn in_arrival_order_and_a_relists_deletions_first(fifo: FifoKind) {
    let h = harness(
        vec![
            page(vec![cm("a", 1), cm("b", 2), cm("c", 3)], 3),
            // c unchanged since its last event: a resync, not an update.
            page(vec![cm("a", 7), cm("c", 6)], 9),
        ],
        InformerOptions::new().fifo(fifo),
    );
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    let initial = log.wait_for(3).await;
    // Arrival order, also for the initial list.
    assert_eq!(
        initial,
        ["add a 1 initial", "add b 2 initial", "add c 3 initial"]
    );
    w.modify(cm("c", 4));
    w.modify(cm("a", 5));
    w.modify(cm("c", 6));
    w.fail(ListWatchError::Gone("expired".into()));
    let _w2 = h.next_watch().await;
    let seen = log.wait_for(8).await;
    assert_eq!(
        seen[3..],
        [
            "update c 3->4",
            "update a 1->5",
            "update c 4->6",
            // The relist: b's deletion first, then the listed objects.
            "delete b 2 tombstone",
            "update a 5->7",
        ]
    );
    h.shutdown.cancel();
}

/// client-go v0.37.2's TestStoreResourceVersion (controller_test.go), on
/// the informer and its Lister, with bookmarks and a relist.
#[tokio::test]
async fn an_atomic_informers_cache_tells_the_version_of_each_list_event_and_bookmark_applied() {
    let h = harness(
        vec![
            page(vec![cm("a", 1), cm("b", 2)], 3),
            page(vec![cm("a", 5)], 12),
        ],
        InformerOptions::new().fifo(FifoKind::AtomicFifo),
    );
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    let lister = h.informer.lister();
    assert_eq!(h.informer.last_store_sync_resource_version(), None);
    h.start();
    let w = h.next_watch().await;
    log.wait_for(2).await;
    assert_eq!(
        h.informer.last_store_sync_resource_version().as_deref(),
        Some("3"),
        "the list's version, not its objects'"
    );
    w.modify(cm("a", 5));
    log.wait_for(3).await;
    assert_eq!(
        lister.last_store_sync_resource_version().as_deref(),
        Some("5")
    );
    w.delete(cm("b", 6));
    log.wait_for(4).await;
    assert_eq!(
        lister.last_store_sync_resource_version().as_deref(),
        Some("6")
    );
    w.send(Ok(WatchEvent::Bookmark(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"resourceVersion": "9"}
        }))
        .unwrap(),
    )));
    assert!(
        wait_for_store_rv(&lister, "9").await,
        "a bookmark on a quiet watch advances the store's version"
    );
    w.fail(ListWatchError::Gone("expired".into()));
    let _w2 = h.next_watch().await;
    assert!(
        wait_for_store_rv(&lister, "12").await,
        "the relist's version"
    );
    assert_eq!(
        log.0.lock().len(),
        4,
        "a relist of an unchanged object tells nothing new but a resync"
    );
    h.shutdown.cancel();
}

async fn wait_for_store_rv(lister: &kinformer_informer::Lister<ConfigMap>, rv: &str) -> bool {
    for _ in 0..500 {
        if lister.last_store_sync_resource_version().as_deref() == Some(rv) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn only_an_atomic_informer_tells_its_caches_version() {
    for fifo in [FifoKind::DeltaFifo, FifoKind::RealFifo] {
        let h = harness(
            vec![page(vec![cm("a", 1)], 3)],
            InformerOptions::new().fifo(fifo),
        );
        h.start();
        let _w = h.next_watch().await;
        assert_eq!(h.wait_for_keys(&["ns/a"]).await, ["ns/a"]);
        assert_eq!(
            h.informer.last_store_sync_resource_version(),
            None,
            "{fifo:?}"
        );
        assert_eq!(
            h.informer.lister().last_store_sync_resource_version(),
            None,
            "{fifo:?}"
        );
        h.shutdown.cancel();
    }
}

/// client-go v0.37's processReplacedAllInfo: the store is replaced before
/// any handler hears of the relist. Every relist notification a handler
/// gets finds the whole new list in the cache, never a mix.
#[tokio::test]
async fn an_atomic_relist_is_in_the_cache_whole_before_any_handler_hears_of_it() {
    let first: Vec<ConfigMap> = (0..300).map(|i| cm(&format!("o{i:03}"), 1)).collect();
    // o000..o099 deleted, o100..o299 updated, n000..n099 new.
    let second: Vec<ConfigMap> = (100..300)
        .map(|i| cm(&format!("o{i:03}"), 2))
        .chain((0..100).map(|i| cm(&format!("n{i:03}"), 2)))
        .collect();
    let h = harness(
        vec![page(first, 1), page(second, 2)],
        InformerOptions::new().fifo(FifoKind::AtomicFifo),
    );
    let lister = h.informer.lister();
    let mixes = Arc::new(Mutex::new(Vec::<String>::new()));
    let check = {
        let (lister, mixes) = (lister.clone(), Arc::clone(&mixes));
        move |what: String| {
            let cached = lister.list(&Default::default());
            let new = cached
                .iter()
                .filter(|c| c.metadata.resource_version.as_deref() == Some("2"))
                .count();
            if new != 300 || cached.len() != 300 {
                mixes
                    .lock()
                    .push(format!("{what}: {new} of {} new", cached.len()));
            }
        }
    };
    let relisted = Log::default();
    let (c1, c2, c3) = (check.clone(), check.clone(), check);
    let (r1, r2, r3) = (relisted.clone(), relisted.clone(), relisted.clone());
    h.informer
        .add_event_handler(
            ResourceEventHandlerFuncs::new()
                .on_add(move |o: &Arc<ConfigMap>, initial| {
                    if !initial {
                        c1(format!("add {:?}", o.metadata.name));
                        r1.0.lock().push("add".into());
                    }
                })
                .on_update(move |_, new| {
                    c2(format!("update {:?}", new.metadata.name));
                    r2.0.lock().push("update".into());
                })
                .on_delete(move |o| {
                    c3(format!("delete {:?}", o.object().metadata.name));
                    r3.0.lock().push("delete".into());
                }),
        )
        .unwrap();
    h.start();
    let w = h.next_watch().await;
    for _ in 0..500 {
        if h.informer.has_synced() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(lister.list(&Default::default()).len(), 300);
    w.fail(ListWatchError::Gone("expired".into()));
    let seen = relisted.wait_for(400).await;
    assert_eq!(seen.len(), 400);
    assert!(seen[..100].iter().all(|s| s == "delete"), "deletions first");
    assert!(seen[100..300].iter().all(|s| s == "update"));
    assert!(seen[300..].iter().all(|s| s == "add"));
    assert_eq!(*mixes.lock(), Vec::<String>::new());
    h.shutdown.cancel();
}

/// What the server serves at one version can change without a write (new
/// CRD defaults): a relist on the atomic queue keeps the cached content
/// when it shares unchanged objects (the default), takes the listed one
/// when told not to (as client-go).
#[tokio::test]
async fn a_relist_shares_an_object_at_the_cached_version_unless_told_not_to() {
    let with_data = |value: &str| {
        let mut c = cm("a", 1);
        c.data = Some([("k".to_owned(), value.to_owned())].into());
        c
    };
    for share in [true, false] {
        let h = harness(
            vec![
                page(vec![with_data("old")], 1),
                page(vec![with_data("defaulted")], 2),
            ],
            InformerOptions::new()
                .fifo(FifoKind::AtomicFifo)
                .relist_shares_unchanged(share),
        );
        let lister = h.informer.lister();
        h.start();
        let w = h.next_watch().await;
        assert!(wait_for_store_rv(&lister, "1").await);
        w.fail(ListWatchError::Gone("expired".into()));
        let _w2 = h.next_watch().await;
        assert!(wait_for_store_rv(&lister, "2").await);
        let cached = lister.get("ns/a").unwrap();
        let value = cached.data.as_ref().unwrap()["k"].as_str();
        assert_eq!(
            value,
            if share { "old" } else { "defaulted" },
            "share: {share}"
        );
        h.shutdown.cancel();
    }
}

#[tokio::test]
async fn a_list_410_retries_at_once_from_etcd_with_an_empty_resource_version() {
    let h = harness(
        vec![
            Err(ListWatchError::Gone("too large resource version".into())),
            page(vec![cm("a", 1)], 3),
        ],
        common::options(),
    );
    h.start();
    let _w = h.next_watch().await;
    let (lists, watches) = (h.lw.list_requests(), h.lw.watch_requests());
    assert_eq!(lists[0].resource_version.as_deref(), Some("0"));
    assert_eq!(lists[1].resource_version, None);
    assert_eq!(watches[0].resource_version, "3");
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_list_at_a_too_large_resource_version_is_retried_at_once_with_an_empty_one() {
    // What a lagging apiserver answers to a list at a version it has not seen.
    let too_large: kube_client::core::Status = serde_json::from_value(serde_json::json!({
        "status": "Failure", "reason": "Timeout", "code": 504,
        "message": "Timeout: Too large resource version: 5, current: 4",
        "details": {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]}
    }))
    .unwrap();
    let h = harness(
        vec![
            page(vec![cm("a", 5)], 5),
            Err(kube_client::Error::Api(Box::new(too_large)).into()),
            page(vec![cm("a", 5)], 9),
        ],
        common::options(),
    );
    h.start();
    let w = h.next_watch().await;
    w.fail(ListWatchError::Gone("too old resource version".into()));
    let _w2 = h.next_watch().await;
    let (lists, watches) = (h.lw.list_requests(), h.lw.watch_requests());
    let versions: Vec<_> = lists
        .iter()
        .map(|r| r.resource_version.as_deref())
        .collect();
    assert_eq!(versions, [Some("0"), Some("5"), None]);
    assert_eq!(watches[1].resource_version, "9");
    h.shutdown.cancel();
}

#[tokio::test]
async fn an_internal_error_in_the_watch_stream_relists() {
    let h = harness(
        vec![page(vec![cm("a", 1)], 1), page(vec![cm("a", 2)], 3)],
        common::options(),
    );
    h.start();
    let w = h.next_watch().await;
    w.fail(internal_error());
    let _w2 = h.next_watch().await;
    let (lists, watches) = (h.lw.list_requests(), h.lw.watch_requests());
    assert_eq!(lists.len(), 2, "relisted");
    assert_eq!(lists[1].resource_version.as_deref(), Some("1"));
    assert_eq!(watches[1].resource_version, "3");
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_5xx_opening_the_watch_relists() {
    let h = harness(
        vec![page(vec![cm("a", 1)], 1), page(vec![cm("a", 2)], 3)],
        common::options(),
    );
    h.lw.script_watch(ScriptedWatch::refused(ListWatchError::Api {
        code: 503,
        reason: "ServiceUnavailable".into(),
        message: "the watch cache is not ready".into(),
        causes: Vec::new(),
    }));
    h.start();
    let _w = h.next_watch().await;
    let (lists, watches) = (h.lw.list_requests(), h.lw.watch_requests());
    assert_eq!(lists.len(), 2, "relisted");
    assert_eq!(watches.len(), 2);
    assert_eq!(watches[1].resource_version, "3");
    h.shutdown.cancel();
}

#[tokio::test]
async fn within_the_retry_window_an_internal_error_in_the_watch_stream_reopens_the_watch() {
    let mut reflector = fast_reflector();
    reflector.max_internal_error_retry_duration = Duration::from_secs(3600);
    let h = harness_with(
        vec![page(vec![cm("a", 1)], 1)],
        common::options(),
        reflector,
    );
    h.start();
    let w = h.next_watch().await;
    w.modify(cm("a", 2));
    w.fail(internal_error());
    let _w2 = h.next_watch().await;
    let (lists, watches) = (h.lw.list_requests(), h.lw.watch_requests());
    assert_eq!(lists.len(), 1, "no relist within the window");
    assert_eq!(watches[1].resource_version, "2");
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_paginated_answer_to_a_list_at_an_empty_resource_version_does_not_make_relists_paginate()
{
    let h = harness(
        vec![
            // At "0": one page (the watch cache serves it).
            page(vec![cm("a", 5)], 5),
            // The relist at "5" has expired: at "", from etcd, in pages.
            Err(ListWatchError::Gone("too old resource version".into())),
            paged(vec![cm("a", 5)], 7, "next"),
            page(vec![cm("b", 6)], 7),
            // The relist after that, at "7".
            page(vec![cm("a", 5), cm("b", 6)], 9),
        ],
        common::options(),
    );
    h.start();
    let w = h.next_watch().await;
    w.fail(ListWatchError::Gone("expired".into()));
    let w2 = h.next_watch().await;
    w2.fail(ListWatchError::Gone("expired".into()));
    let _w3 = h.next_watch().await;
    let lists = h.lw.list_requests();
    let requests: Vec<_> = lists
        .iter()
        .map(|r| (r.resource_version.as_deref(), r.limit))
        .collect();
    assert_eq!(
        requests,
        [
            (Some("0"), Some(500)),
            (Some("5"), None),
            (None, Some(500)),
            (None, Some(500)),
            // Still without a limit, for the watch cache.
            (Some("7"), None),
        ]
    );
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_paginated_answer_to_the_list_at_0_makes_relists_paginate() {
    let h = harness(
        vec![
            paged(vec![cm("a", 5)], 5, "next"),
            page(vec![cm("b", 5)], 5),
            page(vec![cm("a", 5), cm("b", 5)], 9),
        ],
        common::options(),
    );
    h.start();
    let w = h.next_watch().await;
    w.fail(ListWatchError::Gone("expired".into()));
    let _w2 = h.next_watch().await;
    let lists = h.lw.list_requests();
    assert_eq!(lists[2].resource_version.as_deref(), Some("5"));
    assert_eq!(lists[2].limit, Some(500));
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_minimum_watch_timeout_below_5_minutes_is_ignored() {
    for (min, range) in [
        (Duration::from_secs(1), 300..=600),
        (Duration::from_secs(1200), 1200..=2400),
    ] {
        let mut reflector = fast_reflector();
        reflector.min_watch_timeout = min;
        let h = harness_with(
            vec![page(vec![cm("a", 1)], 1)],
            common::options(),
            reflector,
        );
        h.start();
        let _w = h.next_watch().await;
        let timeout = h.lw.watch_requests()[0].timeout;
        assert!(range.contains(&timeout.as_secs()), "{min:?}: {timeout:?}");
        assert_eq!(timeout.subsec_nanos(), 0, "whole seconds");
        h.shutdown.cancel();
    }
}

#[tokio::test]
async fn a_watch_closed_by_the_server_is_reopened_from_the_last_version_without_a_relist() {
    let h = harness(vec![page(vec![cm("a", 1)], 1)], common::options());
    h.start();
    let w = h.next_watch().await;
    w.modify(cm("a", 5));
    // The server ends the watch after that event.
    drop(w);
    let _w2 = h.next_watch().await;
    let (lists, watches) = (h.lw.list_requests(), h.lw.watch_requests());
    assert_eq!(lists.len(), 1, "a normal close must not relist");
    assert_eq!(watches[1].resource_version, "5");
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_watch_refused_with_429_backs_off_and_watches_again_without_a_relist() {
    let h = harness(vec![page(vec![cm("a", 1)], 1)], common::options());
    h.lw.script_watch(ScriptedWatch::refused(ListWatchError::TooManyRequests(
        "slow down".into(),
    )))
    .script_watch(ScriptedWatch::refused(ListWatchError::Connect(
        "connection refused".into(),
    )));
    h.start();
    let _w = h.next_watch().await;
    let (lists, watches) = (h.lw.list_requests(), h.lw.watch_requests());
    assert_eq!(watches.len(), 3);
    assert_eq!(lists.len(), 1);
    h.shutdown.cancel();
}

#[tokio::test]
async fn resync_delivers_updates_whose_old_and_new_are_the_same() {
    let h = harness(vec![page(vec![cm("a", 1)], 1)], common::options());
    let log = Log::default();
    h.informer
        .add_event_handler_with_resync(log.handler(), Duration::from_secs(1))
        .unwrap();
    let quiet = Log::default();
    h.informer.add_event_handler(quiet.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    let seen = log.wait_for(3).await;
    assert_eq!(
        seen[..3],
        [
            "add a 1 initial",
            "update a 1->1 same",
            "update a 1->1 same"
        ]
    );
    // The handler without a resync period gets no resync: a change after
    // the second resync reaches it right after the initial add (each
    // handler gets its notifications in order).
    w.modify(cm("a", 2));
    assert_eq!(
        quiet.wait_for(2).await,
        ["add a 1 initial", "update a 1->2"]
    );
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_handler_added_with_resync_zero_is_never_resynced_even_with_a_default_resync() {
    let h = harness(
        vec![page(vec![cm("a", 1)], 1)],
        common::options().default_resync(Duration::from_secs(1)),
    );
    let resynced = Log::default();
    h.informer.add_event_handler(resynced.handler()).unwrap();
    let never = Log::default();
    h.informer
        .add_event_handler_with_resync(never.handler(), Duration::ZERO)
        .unwrap();
    h.start();
    let w = h.next_watch().await;
    assert_eq!(
        resynced.wait_for(3).await[..3],
        [
            "add a 1 initial",
            "update a 1->1 same",
            "update a 1->1 same"
        ]
    );
    // Each handler gets its notifications in order: a change sent after
    // two resyncs reaches the zero-period handler right after its add.
    w.modify(cm("a", 2));
    assert_eq!(
        never.wait_for(2).await,
        ["add a 1 initial", "update a 1->2"]
    );
    h.shutdown.cancel();
}

#[test]
fn resync_zero_leaves_the_resync_check_period_alone() {
    let h = harness(
        vec![],
        common::options().default_resync(Duration::from_secs(600)),
    );
    h.informer
        .add_event_handler_with_resync(Log::default().handler(), Duration::ZERO)
        .unwrap();
    assert_eq!(
        h.informer.resync_check_period(),
        Some(Duration::from_secs(600))
    );
    // A zero default resync is no resync at all.
    let none = harness(vec![], common::options().default_resync(Duration::ZERO));
    none.informer
        .add_event_handler(Log::default().handler())
        .unwrap();
    assert_eq!(none.informer.resync_check_period(), None);
    // A short period still shortens it, to the 1 s minimum.
    h.informer
        .add_event_handler_with_resync(Log::default().handler(), Duration::from_millis(10))
        .unwrap();
    assert_eq!(
        h.informer.resync_check_period(),
        Some(Duration::from_secs(1))
    );
}

#[tokio::test]
async fn a_removed_handler_gets_nothing_more() {
    let h = harness(vec![page(vec![cm("a", 1)], 1)], common::options());
    let log = Log::default();
    let reg = h.informer.add_event_handler(log.handler()).unwrap();
    let other = Log::default();
    h.informer.add_event_handler(other.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    log.wait_for(1).await;
    h.informer.remove_event_handler(&reg).unwrap();
    w.modify(cm("a", 2));
    assert_eq!(other.wait_for(2).await.len(), 2);
    assert_eq!(log.0.lock().as_slice(), ["add a 1 initial"]);
    h.shutdown.cancel();
}

#[tokio::test]
async fn removing_a_handler_twice_or_after_the_informer_stopped_is_ok_and_changes_nothing() {
    let h = harness(vec![page(vec![cm("a", 1)], 1)], common::options());
    let log = Log::default();
    let reg = h.informer.add_event_handler(log.handler()).unwrap();
    let other = Log::default();
    let other_reg = h.informer.add_event_handler(other.handler()).unwrap();
    let run = h.start();
    let w = h.next_watch().await;
    h.informer.remove_event_handler(&reg).unwrap();
    h.informer.remove_event_handler(&reg).unwrap();
    // The second removal took nothing else away.
    w.modify(cm("a", 2));
    assert_eq!(
        other.wait_for(2).await,
        ["add a 1 initial", "update a 1->2"]
    );
    h.shutdown.cancel();
    run.await.unwrap().unwrap();
    h.informer.remove_event_handler(&other_reg).unwrap();
    h.informer.remove_event_handler(&reg).unwrap();
}

#[tokio::test]
async fn a_registration_of_another_informer_is_refused_and_removes_nothing() {
    let a = harness(vec![page(vec![cm("a", 1)], 1)], common::options());
    let b = harness(vec![page(vec![cm("b", 1)], 1)], common::options());
    let a_log = Log::default();
    let a_reg = a.informer.add_event_handler(a_log.handler()).unwrap();
    let b_log = Log::default();
    let b_reg = b.informer.add_event_handler(b_log.handler()).unwrap();
    assert_eq!(a_reg.informer_id(), a.informer.id());
    assert_ne!(a_reg.informer_id(), b_reg.informer_id());
    a.start();
    b.start();
    let (wa, wb) = (a.next_watch().await, b.next_watch().await);
    let err = b.informer.remove_event_handler(&a_reg).unwrap_err();
    assert!(
        matches!(err, InformerError::ForeignHandler { registration, owner, informer, .. }
            if registration == a_reg.id() && owner == a.informer.id() && informer == b.informer.id()),
        "{err}"
    );
    // Both handlers still get their informer's events.
    wb.modify(cm("b", 2));
    wa.modify(cm("a", 2));
    assert_eq!(
        b_log.wait_for(2).await,
        ["add b 1 initial", "update b 1->2"]
    );
    assert_eq!(
        a_log.wait_for(2).await,
        ["add a 1 initial", "update a 1->2"]
    );
    a.shutdown.cancel();
    b.shutdown.cancel();
}

#[tokio::test]
async fn a_slow_handler_does_not_hold_up_a_fast_one() {
    let h = harness(vec![page(vec![], 1)], common::options());
    let slow_gate = Arc::new(std::sync::Barrier::new(2));
    let gate = Arc::clone(&slow_gate);
    let slow = h
        .informer
        .add_event_handler(ResourceEventHandlerFuncs::new().on_add(move |_, _| {
            gate.wait();
        }))
        .unwrap();
    let fast = Log::default();
    h.informer.add_event_handler(fast.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    for i in 0..100 {
        w.add(cm(&format!("o{i}"), 2 + i));
    }
    // The slow handler is stuck on its first add; the fast one sees all.
    assert_eq!(fast.wait_for(100).await.len(), 100);
    assert_eq!(slow.pending(), 100);
    slow_gate.wait();
    h.shutdown.cancel();
}

#[tokio::test]
async fn the_transform_runs_once_per_object_before_caching() {
    let h = harness(vec![page(vec![cm("a", 1)], 1)], common::options());
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    h.informer
        .set_transform(move |mut obj: ConfigMap| {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            obj.metadata.labels = Some(BTreeMap::from([("seen".into(), "yes".into())]));
            obj
        })
        .unwrap();
    h.start();
    let w = h.next_watch().await;
    w.modify(cm("a", 2));
    for _ in 0..200 {
        if h.informer.last_sync_resource_version() == "2" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cached = h.informer.indexer().get_by_key("ns/a").unwrap();
    assert_eq!(cached.metadata.labels.as_ref().unwrap()["seen"], "yes");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert!(
        h.informer.set_transform(|o| o).is_err(),
        "transform is refused after start"
    );
    h.shutdown.cancel();
}

#[tokio::test]
async fn an_undecodable_watch_event_ends_the_watch_and_the_relist_deletes_the_object_it_was() {
    let h = harness(
        vec![
            page(vec![cm("a", 1), cm("b", 2)], 2),
            // The relist: b (the undecodable DELETED) is gone, c came meanwhile.
            page(vec![cm("a", 1), cm("c", 4)], 5),
        ],
        common::options(),
    );
    let errors = common::errors_seen(&h.informer);
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    // What was b's DELETED, and a later event that would move the version past it.
    w.fail(ListWatchError::Decode(
        "invalid type: integer, expected a string".into(),
    ));
    w.add(cm("c", 4));
    let w2 = h.next_watch().await;
    assert_eq!(h.wait_for_keys(&["ns/a", "ns/c"]).await, ["ns/a", "ns/c"]);
    let seen = log.wait_for(4).await;
    // Per key in order; the relist's add of c may come before b's delete.
    assert_eq!(
        sorted(seen[2..].to_vec()),
        ["add c 4", "delete b 2 tombstone"]
    );
    {
        let (lists, watches) = (h.lw.list_requests(), h.lw.watch_requests());
        assert_eq!(lists.len(), 2, "one relist");
        // From the last version before the undecodable event, not past it.
        assert_eq!(lists[1].resource_version.as_deref(), Some("2"));
        assert_eq!(watches[1].resource_version, "5");
    }
    assert!(errors.any("expected a string"), "{:?}", errors.messages());
    // The next watch goes on normally: no relist loop.
    w2.modify(cm("c", 6));
    assert_eq!(log.wait_for(5).await[4], "update c 4->6");
    assert_eq!(h.lw.list_requests().len(), 2);
    h.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn failing_lists_back_off_exponentially_without_a_relist_storm() {
    let unavailable = || {
        Err(ListWatchError::Api {
            code: 503,
            reason: "ServiceUnavailable".into(),
            message: "etcd is down".into(),
            causes: Vec::new(),
        })
    };
    let lw = scripted(
        (0..6)
            .map(|_| unavailable())
            .chain([page(vec![cm("a", 1)], 1)])
            .collect(),
    );
    // Client-go's defaults: 800 ms doubling to 30 s, jitter up to +100%.
    lw.refuse_streaming_lists();
    let informer = SharedIndexInformer::new(lw.clone(), common::options());
    let shutdown = CancellationToken::new();
    let started = tokio::time::Instant::now();
    let (i, s) = (informer.clone(), shutdown.clone());
    tokio::spawn(async move { i.run(s).await });
    while lw.list_requests().len() < 7 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let waited = started.elapsed();
    assert!(informer.wait_until(|i| i.has_synced()).await);
    assert_eq!(
        lw.list_requests().len(),
        7,
        "one list per backoff, no storm"
    );
    // 0.8 + 1.6 + 3.2 + 6.4 + 12.8 + 25.6 s before jitter; at most twice that.
    assert!(waited >= Duration::from_millis(50_400), "{waited:?}");
    assert!(waited <= Duration::from_millis(101_000), "{waited:?}");
    shutdown.cancel();
}

#[tokio::test]
async fn a_streaming_list_syncs_at_its_end_bookmark_and_the_watch_goes_on() {
    let mut streaming = fast_reflector();
    streaming.use_watch_list = true;
    let h = harness_with(vec![], common::options(), streaming);
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    assert!(h.lw.watch_requests()[0].send_initial_events);
    w.add(cm("a", 1));
    w.add(cm("b", 2));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !h.informer.has_synced(),
        "not synced before the end bookmark"
    );
    w.send(Ok(initial_events_end(5)));
    w.modify(cm("a", 6));
    let seen = log.wait_for(3).await;
    // Per key in order; the update may reach a before b is added.
    assert_eq!(
        sorted(seen),
        ["add a 1 initial", "add b 2 initial", "update a 1->6"]
    );
    assert!(h.informer.has_synced());
    assert!(h.lw.list_requests().is_empty(), "no list call");
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_streaming_list_without_its_end_bookmark_falls_back_to_list_and_watch() {
    let mut options = fast_reflector();
    options.use_watch_list = true;
    options.watch_list_timeout = Duration::from_millis(300);
    let h = harness_with(vec![page(vec![cm("a", 1)], 3)], common::options(), options);
    h.start();
    // The streaming list never ends: events, but no end bookmark.
    let stuck = h.next_watch().await;
    stuck.add(cm("a", 1));
    let _regular = h.next_watch().await;
    let (lists, watches) = (h.lw.list_requests(), h.lw.watch_requests());
    assert_eq!(lists.len(), 1, "fell back to a list");
    assert!(!watches[1].send_initial_events);
    assert_eq!(watches[1].resource_version, "3");
    assert!(h.synced().await);
    h.shutdown.cancel();
}

fn count(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(std::sync::atomic::Ordering::SeqCst)
}

#[tokio::test]
async fn a_panicking_transform_leaves_that_object_out_and_the_informer_keeps_watching() {
    let h = harness(
        vec![
            page(vec![cm("a", 1), cm("boom", 2)], 2),
            page(vec![cm("a", 1), cm("boom", 3)], 3),
        ],
        common::options(),
    );
    h.informer
        .set_transform(|obj: ConfigMap| {
            assert_ne!(
                obj.metadata.name.as_deref(),
                Some("boom"),
                "cannot transform"
            );
            obj
        })
        .unwrap();
    let errors = common::errors_seen(&h.informer);
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    // Left out of the list, as an undecodable object would be.
    assert_eq!(h.wait_for_keys(&["ns/a"]).await, ["ns/a"]);
    assert!(h.synced().await);
    let stats = h.informer.reflector_stats().unwrap();
    assert_eq!(count(&stats.transform_panics), 1);
    let messages = errors.messages();
    assert!(
        messages
            .iter()
            .any(|e| e.contains("ns/boom") && e.contains("cannot transform")),
        "reported with the key: {messages:?}"
    );
    // A watch event it cannot transform ends the watch: a relist.
    w.modify(cm("boom", 3));
    let w2 = h.next_watch().await;
    assert_eq!(h.lw.list_requests().len(), 2);
    w2.add(cm("c", 4));
    assert_eq!(h.wait_for_keys(&["ns/a", "ns/c"]).await, ["ns/a", "ns/c"]);
    assert_eq!(count(&stats.transform_panics), 3);
    assert!(h.informer.has_synced());
    assert_eq!(log.wait_for(2).await, ["add a 1 initial", "add c 4"]);
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_panicking_watch_error_handler_is_contained_and_the_reflector_goes_on() {
    let h = harness(vec![page(vec![cm("a", 1)], 1)], common::options());
    h.lw.script_watch(ScriptedWatch::refused(ListWatchError::Connect(
        "connection refused".into(),
    )));
    h.informer
        .set_watch_error_handler(|err| panic!("the error handler broke on {err}"))
        .unwrap();
    h.start();
    let w = h.next_watch().await;
    w.add(cm("b", 2));
    assert_eq!(h.wait_for_keys(&["ns/a", "ns/b"]).await, ["ns/a", "ns/b"]);
    let stats = h.informer.reflector_stats().unwrap();
    assert_eq!(count(&stats.error_handler_panics), 1);
    assert!(h.informer.has_synced());
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_panicking_index_function_caches_the_object_outside_that_index_and_is_counted() {
    let mut indexers: Indexers<ConfigMap> = kinformer_store::namespace_indexers();
    indexers.insert(
        "by-name".into(),
        Arc::new(|c: &ConfigMap| {
            let name = c.metadata.name.clone().unwrap_or_default();
            assert_ne!(name, "boom", "cannot index");
            Ok(vec![name])
        }),
    );
    let h = harness(
        vec![page(vec![cm("a", 1), cm("boom", 2)], 2)],
        common::options().indexers(indexers),
    );
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    w.modify(cm("boom", 3));
    let seen = log.wait_for(3).await;
    assert_eq!(
        sorted(seen),
        ["add a 1 initial", "add boom 2 initial", "update boom 2->3"]
    );
    let cached = h.informer.indexer().get_by_key("ns/boom").unwrap();
    assert_eq!(cached.metadata.resource_version.as_deref(), Some("3"));
    assert!(
        h.informer
            .indexer()
            .by_index("by-name", "boom")
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        h.informer
            .indexer()
            .index_keys("namespace", "ns")
            .unwrap()
            .len(),
        2
    );
    assert_eq!(h.informer.index_failures(), 2);
    assert!(h.informer.has_synced());
    assert!(h.informer.failure().is_none());
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_reflector_that_dies_makes_run_return_an_error_and_has_synced_false() {
    let h = harness(vec![page(vec![cm("a", 1)], 1)], common::options());
    h.lw.panic_on_unscripted_list();
    let reg = h
        .informer
        .add_event_handler(Log::default().handler())
        .unwrap();
    let run = h.start();
    let w = h.next_watch().await;
    assert!(h.synced().await);
    // A relist, which the lister watcher answers with a panic.
    w.fail(ListWatchError::Gone("too old".into()));
    let ended = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("run() must end when its reflector dies")
        .unwrap();
    let err = ended.unwrap_err();
    assert!(
        matches!(&err, InformerError::Failed { reason, .. } if reason.contains("the script has no more lists")),
        "{err}"
    );
    assert!(!h.informer.has_synced());
    assert!(!reg.has_synced());
    assert!(h.informer.failure().is_some());
    assert!(
        h.informer
            .add_event_handler(Log::default().handler())
            .is_err()
    );
}

#[tokio::test]
async fn dropping_run_aborts_the_reflector_and_the_informer_no_longer_reports_synced() {
    let h = harness(vec![page(vec![cm("a", 1)], 1)], common::options());
    let run = h.start();
    let w = h.next_watch().await;
    assert!(h.synced().await);
    run.abort();
    // The Reflector held the watch; once it is gone, so is the watch.
    for _ in 0..500 {
        if w.is_closed() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(w.is_closed(), "the reflector outlived run()");
    assert!(!h.informer.has_synced());
    assert!(h.informer.failure().is_some());
}

/// The resource version of `key` in the cache, if cached.
fn cached_rv(informer: &SharedIndexInformer<ConfigMap>, key: &str) -> Option<String> {
    informer
        .indexer()
        .get_by_key(key)
        .and_then(|c| c.metadata.resource_version.clone())
}

/// Waits (up to 5 s) for `key` to be cached at `rv`.
async fn wait_for_rv(informer: &SharedIndexInformer<ConfigMap>, key: &str, rv: &str) -> bool {
    for _ in 0..500 {
        if cached_rv(informer, key).as_deref() == Some(rv) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn a_streaming_relist_replaces_cached_objects_as_they_arrive_and_deletes_only_at_its_end() {
    let mut streaming = fast_reflector();
    streaming.use_watch_list = true;
    let h = harness_with(vec![], common::options(), streaming);
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    w.add(cm("a", 1));
    w.add(cm("b", 2));
    w.send(Ok(initial_events_end(5)));
    assert_eq!(h.wait_for_keys(&["ns/a", "ns/b"]).await, ["ns/a", "ns/b"]);
    w.fail(ListWatchError::Gone("too old resource version".into()));
    // The relist: a changed, b was deleted while the watch was down.
    let relist = h.next_watch().await;
    assert!(h.lw.watch_requests()[1].send_initial_events);
    // a first, then enough new objects to fill the first batch.
    relist.add(cm("a", 7));
    let fillers: Vec<String> = (1..LIST_BATCH).map(|i| format!("f{i:03}")).collect();
    for name in &fillers {
        relist.add(cm(name, 8));
    }
    if common::fifo() == FifoKind::DeltaFifo {
        // Applied before the list is complete, which still holds b.
        assert!(
            wait_for_rv(&h.informer, "ns/a", "7").await,
            "a was not replaced before the end bookmark"
        );
        assert_eq!(cached_rv(&h.informer, "ns/b").as_deref(), Some("2"));
    }
    relist.send(Ok(initial_events_end(9)));
    let mut expected: Vec<String> = fillers.iter().map(|n| format!("ns/{n}")).collect();
    expected.insert(0, "ns/a".into());
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    assert_eq!(h.wait_for_keys(&expected).await, expected);
    let seen = log.wait_for(LIST_BATCH + 3).await;
    let seen: Vec<&String> = seen[2..].iter().filter(|l| !l.contains(" f")).collect();
    let relisted = match common::fifo() {
        FifoKind::DeltaFifo => ["update a 1->7", "delete b 2 tombstone"],
        _ => ["delete b 2 tombstone", "update a 1->7"],
    };
    assert_eq!(seen, relisted);
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_paged_relist_replaces_cached_objects_page_by_page_and_deletes_only_at_its_end() {
    let h = harness(
        vec![
            // Pages at "0": relists are paged too.
            paged(vec![cm("a", 1)], 2, "t1"),
            page(vec![cm("b", 2)], 2),
            paged(vec![cm("a", 7)], 9, "t2"),
            page(vec![cm("c", 8)], 9),
        ],
        common::options(),
    );
    let second_page = h.lw.hold_list(3);
    h.start();
    let w = h.next_watch().await;
    assert_eq!(h.wait_for_keys(&["ns/a", "ns/b"]).await, ["ns/a", "ns/b"]);
    w.fail(ListWatchError::Gone("too old resource version".into()));
    if common::fifo() == FifoKind::DeltaFifo {
        // The first page is applied while the second is held back, and b,
        // absent from that page, is not taken for deleted.
        assert!(
            wait_for_rv(&h.informer, "ns/a", "7").await,
            "the first page was not applied before the list completed"
        );
        assert_eq!(cached_rv(&h.informer, "ns/b").as_deref(), Some("2"));
    }
    second_page.notify_one();
    assert_eq!(h.wait_for_keys(&["ns/a", "ns/c"]).await, ["ns/a", "ns/c"]);
    assert_eq!(h.lw.list_requests().len(), 4);
    h.shutdown.cancel();
}

/// A page whose `skipped` holds objects that did not decode.
fn page_skipping(
    items: Vec<ConfigMap>,
    skipped: Vec<Undecodable>,
    rv: u64,
) -> Result<ListPage<ConfigMap>, ListWatchError> {
    let mut page = page(items, rv)?;
    page.skipped = skipped;
    Ok(page)
}

#[tokio::test]
async fn an_undecodable_item_of_a_relist_keeps_the_cached_object_and_is_counted() {
    let h = harness(
        vec![
            page(vec![cm("a", 1), cm("b", 2), cm("gone", 3)], 3),
            // The relist: b is there but does not decode; gone is gone.
            page_skipping(
                vec![cm("a", 1)],
                vec![Undecodable::new(
                    Some("ns/b".into()),
                    "a string that is not UTF-8",
                )],
                5,
            ),
        ],
        common::options(),
    );
    let errors = common::errors_seen(&h.informer);
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    w.fail(ListWatchError::Undecodable(Undecodable::new(
        Some("ns/b".into()),
        "a string that is not UTF-8",
    )));
    let _w2 = h.next_watch().await;
    assert_eq!(h.wait_for_keys(&["ns/a", "ns/b"]).await, ["ns/a", "ns/b"]);
    let seen = log.wait_for(4).await;
    assert_eq!(
        seen[3..],
        ["delete gone 3 tombstone"],
        "b is never deleted: {seen:?}"
    );
    assert_eq!(cached_rv(&h.informer, "ns/b").as_deref(), Some("2"));
    let stats = h.informer.reflector_stats().unwrap();
    assert_eq!(
        count(&stats.undecodable_objects),
        2,
        "the watch event and the list item"
    );
    assert!(
        errors.any("ns/b: a string that is not UTF-8"),
        "{:?}",
        errors.messages()
    );
    h.shutdown.cancel();
}

#[tokio::test]
async fn an_undecodable_item_without_a_readable_key_makes_the_relist_delete_nothing() {
    let h = harness(
        vec![
            page(vec![cm("a", 1), cm("b", 2)], 2),
            page_skipping(
                vec![cm("a", 1)],
                vec![Undecodable::new(None, "truncated")],
                5,
            ),
        ],
        common::options(),
    );
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    w.fail(ListWatchError::Decode("truncated frame".into()));
    let w2 = h.next_watch().await;
    w2.add(cm("c", 6));
    assert_eq!(
        h.wait_for_keys(&["ns/a", "ns/b", "ns/c"]).await,
        ["ns/a", "ns/b", "ns/c"]
    );
    let seen = log.wait_for(3).await;
    assert_eq!(seen[2..], ["add c 6"], "nothing deleted: {seen:?}");
    h.shutdown.cancel();
}

#[tokio::test]
async fn an_undecodable_object_of_a_streaming_relist_keeps_the_cached_object() {
    let h = harness_with(
        vec![page(vec![cm("a", 1), cm("b", 2)], 2)],
        common::options(),
        {
            let mut o = fast_reflector();
            o.use_watch_list = true;
            o
        },
    );
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    // The first streaming list.
    let w = h.next_watch().await;
    for obj in [cm("a", 1), cm("b", 2)] {
        w.add(obj);
    }
    w.send(Ok(initial_events_end(2)));
    assert_eq!(h.wait_for_keys(&["ns/a", "ns/b"]).await, ["ns/a", "ns/b"]);
    // An event that does not decode: a streaming relist, where b does not decode either.
    w.fail(ListWatchError::Undecodable(Undecodable::new(
        Some("ns/b".into()),
        "bad",
    )));
    let w2 = h.next_watch().await;
    w2.add(cm("a", 1));
    w2.fail(ListWatchError::Undecodable(Undecodable::new(
        Some("ns/b".into()),
        "bad",
    )));
    w2.send(Ok(initial_events_end(5)));
    w2.add(cm("c", 6));
    assert_eq!(
        h.wait_for_keys(&["ns/a", "ns/b", "ns/c"]).await,
        ["ns/a", "ns/b", "ns/c"]
    );
    let seen = log.wait_for(3).await;
    assert!(!seen.iter().any(|s| s.starts_with("delete")), "{seen:?}");
    h.shutdown.cancel();
}

#[tokio::test]
async fn a_transform_that_leaves_a_listed_object_without_a_name_keeps_the_cached_version() {
    let h = harness(
        vec![
            page(vec![cm("a", 1), cm("b", 2)], 2),
            page(vec![cm("a", 1), cm("b", 3)], 4),
        ],
        common::options(),
    );
    h.informer
        .set_transform(|mut obj: ConfigMap| {
            if obj.metadata.resource_version.as_deref() == Some("3") {
                obj.metadata.name = None;
            }
            obj
        })
        .unwrap();
    let log = Log::default();
    h.informer.add_event_handler(log.handler()).unwrap();
    h.start();
    let w = h.next_watch().await;
    w.fail(ListWatchError::Decode("a garbled frame".into()));
    let w2 = h.next_watch().await;
    w2.add(cm("c", 5));
    assert_eq!(
        h.wait_for_keys(&["ns/a", "ns/b", "ns/c"]).await,
        ["ns/a", "ns/b", "ns/c"]
    );
    assert_eq!(cached_rv(&h.informer, "ns/b").as_deref(), Some("2"));
    let seen = log.wait_for(3).await;
    assert!(!seen.iter().any(|s| s.starts_with("delete")), "{seen:?}");
    h.shutdown.cancel();
}

/// What a controller that wrote an object asks before reading its cache:
/// has the informer applied the version the write returned, and a wait for
/// it woken by the change that brings it (an event or a bookmark).
#[tokio::test]
async fn an_atomic_informer_says_when_its_cache_has_caught_up_with_a_version_and_waits_for_it() {
    let h = harness(
        vec![page(vec![cm("a", 1)], 3)],
        InformerOptions::new().fifo(FifoKind::AtomicFifo),
    );
    assert_eq!(
        h.informer.has_caught_up_to("1"),
        Ok(false),
        "nothing synced yet"
    );
    h.start();
    let w = h.next_watch().await;
    h.informer.wait_caught_up_to("3").await.unwrap();
    assert_eq!(h.informer.has_caught_up_to("2"), Ok(true));
    assert_eq!(h.informer.has_caught_up_to("3"), Ok(true));
    assert_eq!(
        h.informer.has_caught_up_to("10"),
        Ok(false),
        "10 > 3, not \"10\" < \"3\""
    );
    let (by_event, by_bookmark) = {
        let (i1, i2) = (h.informer.clone(), h.informer.clone());
        (
            tokio::spawn(async move { i1.wait_caught_up_to("5").await }),
            tokio::spawn(async move { i2.wait_caught_up_to("12").await }),
        )
    };
    w.modify(cm("a", 5));
    tokio::time::timeout(Duration::from_secs(5), by_event)
        .await
        .expect("the event's version was not noticed")
        .unwrap()
        .unwrap();
    assert!(!by_bookmark.is_finished());
    w.send(Ok(WatchEvent::Bookmark(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"resourceVersion": "12"}
        }))
        .unwrap(),
    )));
    tokio::time::timeout(Duration::from_secs(5), by_bookmark)
        .await
        .expect("a bookmark on a quiet watch was not noticed")
        .unwrap()
        .unwrap();
    assert!(matches!(
        h.informer.has_caught_up_to("abc"),
        Err(CatchUpError::Incomparable { .. })
    ));
    let never = {
        let i = h.informer.clone();
        tokio::spawn(async move { i.wait_caught_up_to("99").await })
    };
    h.shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(5), never)
        .await
        .expect("a wait outlived the informer")
        .unwrap();
    assert!(
        matches!(stopped, Err(CatchUpError::Stopped { .. })),
        "{stopped:?}"
    );
}

#[tokio::test]
async fn an_informer_on_another_queue_cannot_say_whether_it_caught_up() {
    for fifo in [FifoKind::DeltaFifo, FifoKind::RealFifo] {
        let h = harness(
            vec![page(vec![cm("a", 1)], 3)],
            InformerOptions::new().fifo(fifo),
        );
        assert!(matches!(
            h.informer.has_caught_up_to("1"),
            Err(CatchUpError::NotInOrder { .. })
        ));
    }
}

/// After a 410, a relist whose copy of `ns/b` could not be decoded keeps
/// `ns/b` cached at its older version: the cache is synced to the list's
/// version for everything else, and says that `ns/b` is older than that
/// (a write to `ns/b` answered at 6 is not in the cache) until `ns/b` is
/// applied again. An object never cached that did not decode is stale
/// too: the cache lacks it.
#[tokio::test]
async fn a_relist_that_keeps_an_undecodable_objects_older_copy_says_that_key_is_stale() {
    let h = harness(
        vec![
            page(vec![cm("a", 1), cm("b", 2)], 3),
            page_skipping(
                vec![cm("a", 4)],
                vec![
                    Undecodable::new(Some("ns/b".into()), "not UTF-8"),
                    Undecodable::new(Some("ns/new".into()), "not UTF-8"),
                ],
                7,
            ),
        ],
        InformerOptions::new().fifo(FifoKind::AtomicFifo),
    );
    h.start();
    let w = h.next_watch().await;
    h.informer.wait_caught_up_to("3").await.unwrap();
    assert!(!h.informer.is_stale("ns/b"));
    w.fail(ListWatchError::Gone("too old".into()));
    let w2 = h.next_watch().await;
    h.informer.wait_caught_up_to("7").await.unwrap();
    assert_eq!(cached_rv(&h.informer, "ns/a").as_deref(), Some("4"));
    assert_eq!(cached_rv(&h.informer, "ns/b").as_deref(), Some("2"));
    assert!(
        h.informer.is_stale("ns/b"),
        "ns/b is cached at 2, older than 7"
    );
    assert!(h.informer.is_stale("ns/new"), "ns/new is not cached at all");
    assert!(!h.informer.is_stale("ns/a"));
    w2.modify(cm("b", 8));
    h.informer.wait_caught_up_to("8").await.unwrap();
    assert_eq!(cached_rv(&h.informer, "ns/b").as_deref(), Some("8"));
    assert!(!h.informer.is_stale("ns/b"));
    assert!(h.informer.is_stale("ns/new"), "not applied since");
    h.shutdown.cancel();
}

/// A compact cache, relist sharing on: two relists queued while a first
/// relist is still being applied (held by its index function, which runs
/// before the store is locked). The second lacks `ns/k` (as after a shard
/// scope narrowed), the third has it back unchanged. Once all are applied,
/// `ns/k` must be cached: the third was once judged "already held"
/// against the store as it was before the second removed it, and kept
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_compact_cache_keeps_an_object_a_relist_queued_behind_another_brings_back() {
    let (entered_tx, entered) = std::sync::mpsc::channel::<()>();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let gate = Arc::new(Mutex::new(Some((entered_tx, release_rx))));
    let index: kinformer_store::IndexFunc<ConfigMap> = {
        let gate = Arc::clone(&gate);
        Arc::new(move |cm: &ConfigMap| {
            // Held once, while applying the first relist, which brings x at 2.
            if cm.metadata.resource_version.as_deref() == Some("2")
                && let Some((entered, release)) = gate.lock().take()
            {
                entered.send(()).unwrap();
                release.recv().unwrap();
            }
            Ok(vec![String::new()])
        })
    };
    let options = InformerOptions::new()
        .fifo(FifoKind::AtomicFifo)
        .compact(kinformer_store::Compact::json())
        .indexers(Indexers::from([("any".to_owned(), index)]));
    let h = harness(
        vec![
            page(vec![cm("k", 1), cm("x", 1)], 1),
            page(vec![cm("k", 1), cm("x", 2)], 2),
            page(vec![cm("x", 2)], 5),
            page(vec![cm("k", 1), cm("x", 2)], 6),
        ],
        options,
    );
    h.start();
    let w = h.next_watch().await;
    h.informer.wait_caught_up_to("1").await.unwrap();
    // Released on the way out of a failure too, not to hang the test.
    struct Release(std::sync::mpsc::Sender<()>);
    impl Drop for Release {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    let release = Release(release);
    w.fail(ListWatchError::Gone("too old".into()));
    tokio::task::spawn_blocking(move || entered.recv().unwrap())
        .await
        .unwrap();
    // The first relist is being applied: two more queue up behind it.
    let w2 = h.next_watch().await;
    w2.fail(ListWatchError::Gone("too old".into()));
    let w3 = h.next_watch().await;
    w3.fail(ListWatchError::Gone("too old".into()));
    let _w4 = h.next_watch().await;
    drop(release);
    h.informer.wait_caught_up_to("6").await.unwrap();
    assert_eq!(cached_rv(&h.informer, "ns/k").as_deref(), Some("1"));
    h.shutdown.cancel();
}

#[tokio::test]
async fn no_resync_is_delivered_while_the_resource_is_not_served() {
    let not_found = || ListWatchError::Api {
        code: 404,
        reason: "NotFound".into(),
        message: "the server could not find the requested resource".into(),
        causes: Vec::new(),
    };
    let mut lists = vec![page(vec![cm("a", 1)], 1)];
    lists.extend((0..400).map(|_| Err(not_found())));
    let lw = scripted(lists).comes_and_goes();
    let h = Harness {
        informer: SharedIndexInformer::new(
            lw.clone(),
            common::options().reflector(fast_reflector()),
        ),
        lw,
        shutdown: CancellationToken::new(),
    };
    // Served for a while (resyncs delivered), then a watch refused 404.
    h.lw.script_watch(ScriptedWatch::closed_after(
        Vec::new(),
        Duration::from_millis(2500),
    ))
    .script_watch(ScriptedWatch::refused(not_found()));
    let log = Log::default();
    h.informer
        .add_event_handler_with_resync(log.handler(), Duration::from_secs(1))
        .unwrap();
    h.start();
    assert_eq!(
        log.wait_for(2).await[..2],
        ["add a 1 initial", "update a 1->1 same"],
        "resyncs are delivered while served"
    );
    for _ in 0..500 {
        if h.informer.not_served().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        h.informer.not_served().is_some(),
        "waiting for the resource"
    );
    let before = log.0.lock().len();
    // Three resync periods while not served: none delivered.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(h.informer.not_served().is_some());
    assert_eq!(log.0.lock()[before..], [] as [String; 0]);
    assert!(h.informer.failure().is_none());
    h.shutdown.cancel();
}
