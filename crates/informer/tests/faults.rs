//! Faults on the wire and in the server, against the real kube-apiserver:
//! each test ends with the consistency checker finding no difference between
//! the cache (and every handler's last view) and a fresh list.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kinformer_envtest::{AnsweringProxy, Proxy, TestEnv, TestEnvOptions};
use kinformer_informer::consistency::{LastSeen, ObjectVersions, server_versions, versions};
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, ListPage, ListRequest, ListWatchError, ListerWatcher,
    ReflectorOptions, ResourceEventHandler, SharedIndexInformer, WatchRequest, WatchStream,
    WireFormat, strip_managed_fields,
};
use kinformer_store::ObjectOrTombstone;
use kube_client::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

mod common;
use common::{
    assert_no_violations, create_pods, delete_pods, errors_seen, no_difference, pod, wait_synced,
};

fn fast(idle: Duration) -> ReflectorOptions {
    let mut o = ReflectorOptions::default();
    o.idle_timeout = idle;
    o.backoff.initial = Duration::from_millis(100);
    o.backoff.max = Duration::from_secs(1);
    o
}

fn run(informer: &SharedIndexInformer<Pod>) -> (LastSeen, CancellationToken) {
    informer.set_transform(strip_managed_fields).unwrap();
    let seen = LastSeen::default();
    informer.add_event_handler(seen.clone()).unwrap();
    let shutdown = CancellationToken::new();
    let (i, s) = (informer.clone(), shutdown.clone());
    tokio::spawn(async move { i.run(s).await });
    (seen, shutdown)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_watch_is_noticed_within_the_idle_timeout() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("halfopen").await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    create_pods(&api, (0..10).map(|i| format!("p{i}"))).await;
    let proxy = Proxy::start(env.api_port()).await.unwrap();
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<Pod>::namespaced(env.client_via(proxy.port()).unwrap(), &ns),
        common::options().reflector(fast(Duration::from_secs(2))),
    );
    let errors = errors_seen(&informer);
    let (seen, shutdown) = run(&informer);
    wait_synced(&informer).await;
    let before = informer
        .reflector_stats()
        .unwrap()
        .watches
        .load(Ordering::SeqCst);
    // The network goes silent without closing anything, until the
    // Reflector has given the silent watch up.
    proxy.blackhole(true);
    create_pods(&api, (10..20).map(|i| format!("p{i}"))).await;
    let idle_reported = || errors.any("idle");
    for _ in 0..300 {
        if idle_reported() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        idle_reported(),
        "the idle watch was reported: {:?}",
        errors.messages()
    );
    proxy.blackhole(false);
    no_difference(&api, &informer, [&seen], Duration::from_secs(30)).await;
    let stats = informer.reflector_stats().unwrap();
    assert!(
        stats.watches.load(Ordering::SeqCst) > before,
        "the dead watch was replaced"
    );
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_apiserver_killed_and_restarted_while_writes_continue() {
    let mut env = TestEnv::start().await.unwrap();
    let ns = env.create_namespace("kill").await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    create_pods(&api, (0..40).map(|i| format!("p{i}"))).await;
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<Pod>::namespaced(env.client().unwrap(), &ns),
        common::options().reflector(fast(Duration::from_secs(10))),
    );
    let (seen, shutdown) = run(&informer);
    wait_synced(&informer).await;
    env.kill_apiserver();
    env.start_apiserver().await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    create_pods(&api, (40..70).map(|i| format!("p{i}"))).await;
    delete_pods(&api, (0..15).map(|i| format!("p{i}"))).await;
    env.kill_apiserver();
    env.start_apiserver().await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    delete_pods(&api, (15..25).map(|i| format!("p{i}"))).await;
    create_pods(&api, (70..80).map(|i| format!("p{i}"))).await;
    no_difference(&api, &informer, [&seen], Duration::from_secs(60)).await;
    shutdown.cancel();
}

/// Lists through the real API, but compacts etcd right after the first page
/// (after more writes, and the delete of an object of that page), so the
/// next page's continue token has expired.
struct CompactAfterFirstPage {
    inner: ApiListerWatcher<Pod>,
    env: Arc<TestEnv>,
    api: Api<Pod>,
    done: AtomicBool,
}

impl ListerWatcher<Pod> for CompactAfterFirstPage {
    fn list(&self, request: ListRequest) -> BoxFuture<'_, Result<ListPage<Pod>, ListWatchError>> {
        Box::pin(async move {
            let page = self.inner.list(request).await?;
            if page.continue_token.is_some() && !self.done.swap(true, Ordering::SeqCst) {
                create_pods(&self.api, (1000..1005).map(|i| format!("late-{i}"))).await;
                // And one of the first page's objects is deleted: the full
                // list must not count the page it replaces.
                delete_pods(&self.api, ["p000".to_owned()].into_iter()).await;
                self.env.compact_etcd().await.expect("compaction");
            }
            Ok(page)
        })
    }
    fn watch(
        &self,
        request: WatchRequest,
    ) -> BoxFuture<'_, Result<WatchStream<Pod>, ListWatchError>> {
        self.inner.watch(request)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continue_token_expired_mid_list_falls_back_to_a_full_list() {
    let env = Arc::new(
        TestEnv::start_with(TestEnvOptions::new().without_watch_cache())
            .await
            .unwrap(),
    );
    let ns = env.create_namespace("expired").await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    create_pods(&api, (0..300).map(|i| format!("p{i:03}"))).await;
    let lw = CompactAfterFirstPage {
        inner: ApiListerWatcher::<Pod>::namespaced(env.client().unwrap(), &ns),
        env: Arc::clone(&env),
        api: api.clone(),
        done: AtomicBool::new(false),
    };
    let mut options = fast(Duration::from_secs(30));
    options.page_size = Some(50);
    options.use_watch_list = false;
    let informer = SharedIndexInformer::new(lw, common::options().reflector(options));
    let (seen, shutdown) = run(&informer);
    wait_synced(&informer).await;
    // First page, the expired second page, then one full list.
    assert_eq!(
        informer
            .reflector_stats()
            .unwrap()
            .list_calls
            .load(Ordering::SeqCst),
        3
    );
    assert_eq!(
        informer.indexer().len(),
        304,
        "the full list has the pods created mid-list, not the one deleted"
    );
    no_difference(&api, &informer, [&seen], Duration::from_secs(30)).await;
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_answering_429_then_503_is_backed_off_without_a_relist_storm() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("overload").await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    create_pods(&api, (0..20).map(|i| format!("p{i}"))).await;
    let proxy = AnsweringProxy::start(env).await.unwrap();
    proxy.answer(429);
    // client-go's backoff: 800 ms doubling to 30 s.
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<Pod>::namespaced(env.client_via(proxy.port()).unwrap(), &ns),
        common::options(),
    );
    let (seen, shutdown) = run(&informer);
    // Two layers back off, as in client-go: the client retries a 429/503
    // in place after the server's Retry-After (kube-client and client-go's
    // rest client both honour it), and the Reflector backs off between its
    // own list and watch calls. So the requests reaching the server are
    // retries of very few Reflector calls, not a relist per refusal.
    let wait_answered = |n: u64| {
        let proxy = &proxy;
        async move {
            for _ in 0..1200 {
                if proxy.answered() >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!(
                "only {} of {n} requests reached the server",
                proxy.answered()
            );
        }
    };
    wait_answered(4).await;
    proxy.answer(503);
    wait_answered(8).await;
    let stats = informer.reflector_stats().unwrap();
    let calls = stats.list_calls.load(Ordering::SeqCst) + stats.watches.load(Ordering::SeqCst);
    let answered = proxy.answered();
    assert!(
        calls <= 3,
        "{calls} list/watch calls by the Reflector for {answered} refused requests: a relist storm"
    );
    assert!(!informer.has_synced());
    // The server recovers: the informer syncs and equals it.
    proxy.forward();
    no_difference(&api, &informer, [&seen], Duration::from_secs(60)).await;
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_answered_with_500_relists_once_the_server_answers_again() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("internal").await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    create_pods(&api, (0..10).map(|i| format!("p{i}"))).await;
    let proxy = AnsweringProxy::start(env).await.unwrap();
    let mut options = fast(Duration::from_secs(30));
    options.use_watch_list = false;
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<Pod>::namespaced(env.client_via(proxy.port()).unwrap(), &ns),
        common::options().reflector(options),
    );
    let errors = errors_seen(&informer);
    let (seen, shutdown) = run(&informer);
    wait_synced(&informer).await;
    let stats = informer.reflector_stats().unwrap();
    // An event first: a watch cut before any event within a second is a
    // "very short watch", which relists whatever comes next.
    create_pods(&api, std::iter::once("first-event".to_owned())).await;
    for _ in 0..300 {
        if informer
            .indexer()
            .get_by_key(&format!("{ns}/first-event"))
            .is_some()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stats.events.load(Ordering::SeqCst), 1);
    assert_eq!(stats.lists_completed.load(Ordering::SeqCst), 1);
    // The open watch is cut and the next one answered 500 (kube-client
    // does not retry a 500 itself), while the Pods change on the server.
    proxy.answer(500);
    for _ in 0..300 {
        if errors.any("500") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(errors.any("500"), "{:?}", errors.messages());
    delete_pods(&api, (0..5).map(|i| format!("p{i}"))).await;
    create_pods(&api, (10..15).map(|i| format!("p{i}"))).await;
    proxy.forward();
    // The Reflector relists (as client-go) instead of watching on from
    // where it was.
    for _ in 0..300 {
        if stats.lists_completed.load(Ordering::SeqCst) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        stats.lists_completed.load(Ordering::SeqCst) >= 2,
        "no relist after the watch was answered 500: {:?}",
        errors.messages()
    );
    no_difference(&api, &informer, [&seen], Duration::from_secs(30)).await;
    shutdown.cancel();
}

/// What the informer's cache holds, by UID and resourceVersion.
fn cached(informer: &SharedIndexInformer<Pod>) -> ObjectVersions {
    versions(informer.indexer().list().iter().map(|p| p.as_ref()))
}

/// Waits (up to 30 s) until the cache and the handler hold `want`.
async fn wait_for_view(
    informer: &SharedIndexInformer<Pod>,
    seen: &LastSeen,
    want: &ObjectVersions,
) {
    for _ in 0..150 {
        if cached(informer) == *want && seen.snapshot() == *want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(cached(informer), *want, "the cache");
    assert_eq!(seen.snapshot(), *want, "the handler's view");
    assert_no_violations(&[seen]);
}

/// A Pod whose annotation the proxy's rewrite turns into a number, which
/// makes it undecodable (a string is required there).
fn garbled_pod(name: &str) -> Pod {
    let mut p = pod(name);
    p.metadata.annotations = Some([("note".to_string(), GARBLE.to_string())].into());
    p
}

const GARBLE: &str = "garble-me-please";

/// From now on the proxy makes `GARBLE` undecodable: in JSON a number
/// where a string must be; in protobuf its annotation entry's value tag
/// turns into a varint's, so the string's bytes are read as fields of an
/// impossible wire type.
fn garble(proxy: &AnsweringProxy, format: WireFormat) {
    match format {
        WireFormat::Json => proxy.rewrite(&format!("{GARBLE:?}"), "123456789012345678"),
        WireFormat::Auto => proxy.rewrite(
            &format!("\u{12}\u{10}{GARBLE}"),
            &format!("\u{10}\u{10}{GARBLE}"),
        ),
    }
    .unwrap();
}

fn lists(informer: &SharedIndexInformer<Pod>) -> u64 {
    informer
        .reflector_stats()
        .unwrap()
        .lists_completed
        .load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_added_event_relists_and_every_pod_but_that_one_is_cached() {
    undecodable_added(WireFormat::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_added_event_in_protobuf_relists_and_every_pod_but_that_one_is_cached() {
    undecodable_added(WireFormat::Auto).await;
}

async fn undecodable_added(format: WireFormat) {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("garbled").await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    create_pods(&api, (0..5).map(|i| format!("p{i}"))).await;
    let proxy = AnsweringProxy::start(env).await.unwrap();
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<Pod>::namespaced(env.client_via(proxy.port()).unwrap(), &ns)
            .wire_format(format),
        common::options().reflector(fast(Duration::from_secs(30))),
    );
    let errors = errors_seen(&informer);
    let (seen, shutdown) = run(&informer);
    wait_synced(&informer).await;
    // One Pod reaches the informer undecodable.
    garble(&proxy, format);
    api.create(&PostParams::default(), &garbled_pod("bad"))
        .await
        .unwrap();
    create_pods(&api, (5..10).map(|i| format!("p{i}"))).await;
    let mut want = server_versions(&api).await.unwrap();
    want.remove(&format!("{ns}/bad"));
    wait_for_view(&informer, &seen, &want).await;
    assert!(
        lists(&informer) >= 2,
        "the undecodable event made it relist"
    );
    assert!(errors.any("decode"), "{:?}", errors.messages());
    shutdown.cancel();

    // A list, not a watch, holding the undecodable object: the same.
    let listing = SharedIndexInformer::new(
        ApiListerWatcher::<Pod>::namespaced(env.client_via(proxy.port()).unwrap(), &ns)
            .wire_format(format),
        common::options().reflector({
            let mut o = fast(Duration::from_secs(30));
            o.use_watch_list = false;
            o
        }),
    );
    let (listed_seen, shutdown) = run(&listing);
    wait_synced(&listing).await;
    wait_for_view(&listing, &listed_seen, &want).await;
    assert_eq!(lists(&listing), 1);
    shutdown.cancel();
}

/// An informer through an `AnsweringProxy` that has synced five Pods and
/// `victim`, whose later events the test garbles.
struct Garbled {
    ns: kinformer_envtest::TestNamespace,
    api: Api<Pod>,
    proxy: AnsweringProxy,
    informer: SharedIndexInformer<Pod>,
    seen: LastSeen,
    shutdown: CancellationToken,
}

async fn cached_then_garbled(prefix: &str, victim: &str, format: WireFormat) -> Garbled {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace(prefix).await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    create_pods(&api, (0..5).map(|i| format!("p{i}"))).await;
    api.create(&PostParams::default(), &garbled_pod(victim))
        .await
        .unwrap();
    let proxy = AnsweringProxy::start(env).await.unwrap();
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<Pod>::namespaced(env.client_via(proxy.port()).unwrap(), &ns)
            .wire_format(format),
        common::options().reflector(fast(Duration::from_secs(30))),
    );
    let (seen, shutdown) = run(&informer);
    wait_synced(&informer).await;
    assert!(cached(&informer).contains_key(&format!("{ns}/{victim}")));
    Garbled {
        ns,
        api,
        proxy,
        informer,
        seen,
        shutdown,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_modified_event_relists_and_keeps_the_cached_version_never_a_delete() {
    undecodable_modified(WireFormat::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_modified_event_in_protobuf_relists_and_keeps_the_cached_version_never_a_delete()
 {
    undecodable_modified(WireFormat::Auto).await;
}

async fn undecodable_modified(format: WireFormat) {
    let Garbled {
        ns,
        api,
        proxy,
        informer,
        seen,
        shutdown,
    } = cached_then_garbled("garbled-mod", "m", format).await;
    let key = format!("{ns}/m");
    let before = cached(&informer)[&key].clone();
    // From now on m cannot be decoded; it changes on the server.
    garble(&proxy, format);
    let patch = serde_json::json!({"metadata": {"labels": {"gen": "1"}}});
    api.patch("m", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    create_pods(&api, (5..10).map(|i| format!("p{i}"))).await;
    // m is live on the server: what cannot be decoded is never taken for
    // deleted, the cache keeps the version it had (the relist keeps its key).
    let mut want = server_versions(&api).await.unwrap();
    want.insert(key.clone(), before.clone());
    wait_for_view(&informer, &seen, &want).await;
    assert_eq!(seen.tombstones(), 0, "m was never deleted");
    let stats = informer.reflector_stats().unwrap();
    assert!(
        stats.undecodable_objects.load(Ordering::SeqCst) >= 2,
        "the event and the listed item"
    );
    // No relist loop: later events arrive on a watch that stays open.
    let relists = lists(&informer);
    assert!(relists >= 2);
    create_pods(&api, (10..15).map(|i| format!("p{i}"))).await;
    let mut want = server_versions(&api).await.unwrap();
    want.insert(key, before);
    wait_for_view(&informer, &seen, &want).await;
    assert_eq!(lists(&informer), relists, "no further relist");
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_deleted_event_relists_and_leaves_no_ghost_in_the_cache() {
    undecodable_deleted(WireFormat::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_deleted_event_in_protobuf_relists_and_leaves_no_ghost_in_the_cache() {
    undecodable_deleted(WireFormat::Auto).await;
}

async fn undecodable_deleted(format: WireFormat) {
    let Garbled {
        api,
        proxy,
        informer,
        seen,
        shutdown,
        ns: _ns, // the namespace lives as long as the test
    } = cached_then_garbled("garbled-del", "victim", format).await;
    // Its DELETED event cannot be decoded; later events move the version on.
    garble(&proxy, format);
    api.delete("victim", &DeleteParams::default())
        .await
        .unwrap();
    create_pods(&api, (5..10).map(|i| format!("p{i}"))).await;
    no_difference(&api, &informer, [&seen], Duration::from_secs(30)).await;
    assert_eq!(
        seen.tombstones(),
        1,
        "the victim's delete reached the handler"
    );
    assert!(lists(&informer) >= 2, "a relist found the delete");
    shutdown.cancel();
}

/// A gate a handler waits at until the test opens it.
#[derive(Clone, Default)]
struct Gate(Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>);

impl Gate {
    fn wait(&self) {
        let (open, cv) = &*self.0;
        let mut open = open.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
    }
    fn open(&self) {
        let (open, cv) = &*self.0;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }
}

/// A [`LastSeen`] that first waits at a gate.
struct Gated {
    gate: Gate,
    seen: LastSeen,
}

impl ResourceEventHandler<Pod> for Gated {
    fn on_add(&self, obj: &Arc<Pod>, initial: bool) {
        self.gate.wait();
        ResourceEventHandler::<Pod>::on_add(&self.seen, obj, initial);
    }
    fn on_update(&self, old: &Arc<Pod>, new: &Arc<Pod>) {
        self.gate.wait();
        ResourceEventHandler::<Pod>::on_update(&self.seen, old, new);
    }
    fn on_delete(&self, obj: &ObjectOrTombstone<Pod>) {
        self.gate.wait();
        ResourceEventHandler::<Pod>::on_delete(&self.seen, obj);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_beside_a_fast_one_holds_up_neither_the_fast_one_nor_the_watch() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("slow").await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<Pod>::namespaced(env.client().unwrap(), &ns),
        common::options(),
    );
    // The slow handler is stuck on its first notification until the test
    // lets it go, however fast or slow the machine is.
    let gate = Gate::default();
    let slow_seen = LastSeen::default();
    let slow = informer
        .add_event_handler(Gated {
            gate: gate.clone(),
            seen: slow_seen.clone(),
        })
        .unwrap();
    let (fast, shutdown) = run(&informer);
    wait_synced(&informer).await;
    create_pods(&api, (0..100).map(|i| format!("p{i}"))).await;
    // The fast handler and the cache catch up while the slow one is stuck.
    no_difference(&api, &informer, [&fast], Duration::from_secs(30)).await;
    assert_eq!(
        slow.pending(),
        100,
        "the slow handler's buffer holds the backlog"
    );
    assert_eq!(slow.handled(), 0);
    // Let go, it catches up too, in sequence.
    gate.open();
    no_difference(
        &api,
        &informer,
        [&fast, &slow_seen],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(slow.handled(), 100);
    assert_eq!(slow.pending(), 0);
    shutdown.cancel();
}
