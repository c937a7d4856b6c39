//! [`ScriptedListerWatcher`]: each call answered from a script, each
//! request recorded.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use kube_client::core::WatchEvent;
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::{
    GroupResource, ListPage, ListRequest, ListWatchError, ListerWatcher, WatchRequest, WatchStream,
};

/// How long [`ScriptedListerWatcher::next_watch`] waits for a watch.
const NEXT_WATCH_WAIT: Duration = Duration::from_secs(60);

/// A [`ListerWatcher`] that answers each list call with the next scripted
/// list answer and each watch call with the next [`ScriptedWatch`], and
/// records every request with the (Tokio) instant it came.
///
/// Once its lists are used up, a list is refused as if the server could not
/// be reached ([`ListWatchError::Connect`]), or panics after
/// [`panic_on_unscripted_list`](Self::panic_on_unscripted_list); once its
/// watches are used up, each watch opens as a [`ScriptedWatch::live`] one,
/// for the test to feed through [`next_watch`](Self::next_watch). Streaming
/// lists (`sendInitialEvents`) are watches like any other, unless
/// [`refuse_streaming_lists`](Self::refuse_streaming_lists). Clones share
/// the script and the record.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kinformer_informer::testing::{ScriptedListerWatcher, ScriptedWatch, page};
/// use kinformer_informer::{InformerOptions, ListWatchError, ReflectorOptions, SharedIndexInformer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let lw = ScriptedListerWatcher::<ConfigMap>::new();
/// lw.script_list(Ok(page(Vec::new(), 10)))
///     .script_watch(ScriptedWatch::open(vec![Err(ListWatchError::Gone("too old".into()))]))
///     .script_list(Ok(page(Vec::new(), 20)));
/// let mut paged = ReflectorOptions::default();
/// paged.use_watch_list = false;
/// let informer = SharedIndexInformer::new(lw.clone(), InformerOptions::new().reflector(paged));
/// let shutdown = kinformer_informer::CancellationToken::new();
/// tokio::spawn({
///     let (informer, shutdown) = (informer.clone(), shutdown.clone());
///     async move { informer.run(shutdown).await }
/// });
/// // The 410 made the Reflector list again; its next watch is live.
/// let watch = lw.next_watch().await;
/// assert_eq!(lw.list_requests().len(), 2);
/// assert_eq!(lw.watch_requests()[1].resource_version, "20");
/// watch.add(ConfigMap::default());
/// shutdown.cancel();
/// # }
/// ```
pub struct ScriptedListerWatcher<K> {
    shared: Arc<Shared<K>>,
    resource: Option<GroupResource>,
    namespace: Option<String>,
    /// Whether its resource may come and go ([`Self::comes_and_goes`]).
    comes_and_goes: bool,
}

impl<K> std::fmt::Debug for ScriptedListerWatcher<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let script = self.shared.script.lock();
        f.debug_struct("ScriptedListerWatcher")
            .field("resource", &self.resource)
            .field("namespace", &self.namespace)
            .field("lists_left", &script.lists.len())
            .field("watches_left", &script.watches.len())
            .field("list_requests", &script.list_requests.len())
            .field("watch_requests", &script.watch_requests.len())
            .finish_non_exhaustive()
    }
}

struct Shared<K> {
    script: Mutex<Script<K>>,
    /// Told when a live watch is opened.
    opened: Notify,
}

struct Script<K> {
    lists: VecDeque<Result<ListPage<K>, ListWatchError>>,
    watches: VecDeque<ScriptedWatch<K>>,
    list_requests: Vec<(ListRequest, Instant)>,
    watch_requests: Vec<(WatchRequest, Instant)>,
    /// List calls (by their index) that answer only once notified.
    held_lists: BTreeMap<usize, Arc<Notify>>,
    /// Live watches opened and not yet taken by the test.
    live: VecDeque<LiveWatch<K>>,
    refuse_streaming_lists: bool,
    panic_on_unscripted_list: bool,
}

impl<K> Clone for ScriptedListerWatcher<K> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            resource: self.resource.clone(),
            namespace: self.namespace.clone(),
            comes_and_goes: self.comes_and_goes,
        }
    }
}

impl<K: Send + 'static> Default for ScriptedListerWatcher<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Send + 'static> ScriptedListerWatcher<K> {
    /// An empty script: lists refused, watches live.
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                script: Mutex::new(Script {
                    lists: VecDeque::new(),
                    watches: VecDeque::new(),
                    list_requests: Vec::new(),
                    watch_requests: Vec::new(),
                    held_lists: BTreeMap::new(),
                    live: VecDeque::new(),
                    refuse_streaming_lists: false,
                    panic_on_unscripted_list: false,
                }),
                opened: Notify::new(),
            }),
            resource: None,
            namespace: None,
            comes_and_goes: false,
        }
    }

    /// Says its resource may come and go, as a custom resource does
    /// ([`ListerWatcher::until_served`]), as do its clones made after: a
    /// 404 is then waited for, each wait ended by the Reflector's backoff
    /// (nothing here says when the resource is back).
    #[must_use]
    pub fn comes_and_goes(mut self) -> Self {
        self.comes_and_goes = true;
        self
    }

    /// Says it lists `resource` ([`ListerWatcher::resource`]; none by
    /// default), as do its clones made after.
    #[must_use]
    pub fn for_resource(mut self, resource: GroupResource) -> Self {
        self.resource = Some(resource);
        self
    }

    /// Says it lists only `namespace` ([`ListerWatcher::namespace`]; every
    /// namespace by default), as do its clones made after.
    #[must_use]
    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Answers the next list call not yet scripted with `answer`.
    pub fn script_list(&self, answer: Result<ListPage<K>, ListWatchError>) -> &Self {
        self.shared.script.lock().lists.push_back(answer);
        self
    }

    /// Answers the next watch call not yet scripted with `watch`.
    pub fn script_watch(&self, watch: ScriptedWatch<K>) -> &Self {
        self.shared.script.lock().watches.push_back(watch);
        self
    }

    /// Refuses every streaming list (a watch with `sendInitialEvents`) with
    /// 400 BadRequest, as an API server older than 1.27 does, without
    /// using the script; the Reflector then lists in pages.
    pub fn refuse_streaming_lists(&self) -> &Self {
        self.shared.script.lock().refuse_streaming_lists = true;
        self
    }

    /// A list call once the scripted lists are used up panics (a broken
    /// lister-watcher), instead of failing to connect.
    pub fn panic_on_unscripted_list(&self) -> &Self {
        self.shared.script.lock().panic_on_unscripted_list = true;
        self
    }

    /// Holds the answer to list call number `call` (from 0) until the
    /// returned `Notify` is notified (`notify_one`, before or after the
    /// call comes).
    pub fn hold_list(&self, call: usize) -> Arc<Notify> {
        let release = Arc::new(Notify::new());
        self.shared
            .script
            .lock()
            .held_lists
            .insert(call, Arc::clone(&release));
        release
    }

    /// The list requests so far, oldest first.
    pub fn list_requests(&self) -> Vec<ListRequest> {
        let script = self.shared.script.lock();
        script
            .list_requests
            .iter()
            .map(|(r, _)| r.clone())
            .collect()
    }

    /// When each list request came (Tokio's clock, paused or not).
    pub fn list_times(&self) -> Vec<Instant> {
        let script = self.shared.script.lock();
        script.list_requests.iter().map(|(_, at)| *at).collect()
    }

    /// The watch requests so far (refused ones too), oldest first.
    pub fn watch_requests(&self) -> Vec<WatchRequest> {
        let script = self.shared.script.lock();
        script
            .watch_requests
            .iter()
            .map(|(r, _)| r.clone())
            .collect()
    }

    /// When each watch request came.
    pub fn watch_times(&self) -> Vec<Instant> {
        let script = self.shared.script.lock();
        script.watch_requests.iter().map(|(_, at)| *at).collect()
    }

    /// The oldest live watch opened and not yet taken, waiting for one to
    /// open.
    ///
    /// # Panics
    ///
    /// If none opens within 60 s (of Tokio's clock: under paused time, as
    /// soon as nothing else is left to run), so that a test waiting for a
    /// watch that never comes fails instead of hanging.
    pub async fn next_watch(&self) -> LiveWatch<K> {
        let wait = async {
            loop {
                // Created before looking: a watch opened in between wakes it.
                let opened = self.shared.opened.notified();
                if let Some(watch) = self.shared.script.lock().live.pop_front() {
                    return watch;
                }
                opened.await;
            }
        };
        match tokio::time::timeout(NEXT_WATCH_WAIT, wait).await {
            Ok(watch) => watch,
            Err(_) => panic!("no watch opened within {NEXT_WATCH_WAIT:?}"),
        }
    }
}

impl<K: Send + 'static> ListerWatcher<K> for ScriptedListerWatcher<K> {
    fn list(&self, request: ListRequest) -> BoxFuture<'_, Result<ListPage<K>, ListWatchError>> {
        let mut script = self.shared.script.lock();
        let call = script.list_requests.len();
        script.list_requests.push((request, Instant::now()));
        let held = script.held_lists.remove(&call);
        let answer = script.lists.pop_front();
        let panics = script.panic_on_unscripted_list;
        drop(script);
        let answer = match answer {
            Some(answer) => answer,
            None if panics => panic!("list call {call}: the script has no more lists"),
            None => Err(ListWatchError::Connect(
                format!("list call {call}: the script has no more lists").into(),
            )),
        };
        Box::pin(async move {
            if let Some(held) = held {
                held.notified().await;
            }
            answer
        })
    }

    fn watch(
        &self,
        request: WatchRequest,
    ) -> BoxFuture<'_, Result<WatchStream<K>, ListWatchError>> {
        let mut script = self.shared.script.lock();
        let streaming = request.send_initial_events;
        script.watch_requests.push((request, Instant::now()));
        if streaming && script.refuse_streaming_lists {
            return Box::pin(async {
                Err(ListWatchError::Api {
                    code: 400,
                    reason: "BadRequest".into(),
                    message: "sendInitialEvents is not supported".into(),
                    causes: Vec::new(),
                })
            });
        }
        let watch = script
            .watches
            .pop_front()
            .unwrap_or_else(ScriptedWatch::live);
        let opened = watch.start(&mut script.live);
        drop(script);
        if opened.is_ok() {
            self.shared.opened.notify_waiters();
        }
        Box::pin(async move { opened })
    }

    fn describe(&self) -> String {
        let kind = std::any::type_name::<K>()
            .rsplit("::")
            .next()
            .unwrap_or("objects");
        format!("{kind} (scripted)")
    }

    fn resource(&self) -> Option<GroupResource> {
        self.resource.clone()
    }

    fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    fn until_served(&self) -> Option<BoxFuture<'static, ()>> {
        self.comes_and_goes
            .then(|| Box::pin(std::future::pending()) as BoxFuture<'static, ()>)
    }
}

/// The answer to one watch call of a [`ScriptedListerWatcher`]: refused, or
/// opened with some events and then closed, kept open, or fed by the test.
pub struct ScriptedWatch<K> {
    answer: Result<Vec<Result<WatchEvent<K>, ListWatchError>>, ListWatchError>,
    end: End,
}

impl<K> std::fmt::Debug for ScriptedWatch<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.answer {
            Ok(events) => f
                .debug_struct("ScriptedWatch")
                .field("events", &events.len())
                .field("end", &self.end)
                .finish(),
            Err(refused) => f
                .debug_struct("ScriptedWatch")
                .field("refused", refused)
                .finish(),
        }
    }
}

#[derive(Debug)]
enum End {
    /// The server closes the watch this long after its events.
    Close(Duration),
    /// It stays open with nothing more.
    Open,
    /// The test sends the rest through a [`LiveWatch`].
    Live,
}

impl<K: Send + 'static> ScriptedWatch<K> {
    /// The watch is refused when opened (410 Gone, 429, a 5xx...).
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kinformer_informer::ListWatchError;
    /// use kinformer_informer::testing::ScriptedWatch;
    ///
    /// let gone = ScriptedWatch::<ConfigMap>::refused(ListWatchError::Gone("too old".into()));
    /// ```
    pub fn refused(error: ListWatchError) -> Self {
        Self {
            answer: Err(error),
            end: End::Open,
        }
    }

    /// The watch sends `events`, then the server closes it at once.
    pub fn closed(events: Vec<Result<WatchEvent<K>, ListWatchError>>) -> Self {
        Self::closed_after(events, Duration::ZERO)
    }

    /// The watch sends `events`, then the server closes it `after` later.
    pub fn closed_after(
        events: Vec<Result<WatchEvent<K>, ListWatchError>>,
        after: Duration,
    ) -> Self {
        Self {
            answer: Ok(events),
            end: End::Close(after),
        }
    }

    /// The watch sends `events`, then stays open with nothing more.
    pub fn open(events: Vec<Result<WatchEvent<K>, ListWatchError>>) -> Self {
        Self {
            answer: Ok(events),
            end: End::Open,
        }
    }

    /// The watch is handed to the test
    /// ([`ScriptedListerWatcher::next_watch`]), which sends its events; what
    /// an unscripted watch is.
    pub fn live() -> Self {
        Self {
            answer: Ok(Vec::new()),
            end: End::Live,
        }
    }

    /// Opens the watch, or refuses it; a live one is queued for the test.
    fn start(self, live: &mut VecDeque<LiveWatch<K>>) -> Result<WatchStream<K>, ListWatchError> {
        let events = futures::stream::iter(self.answer?);
        Ok(match self.end {
            End::Close(after) => {
                let close = futures::stream::once(tokio::time::sleep(after))
                    .filter_map(|()| async { None });
                events.chain(close).boxed()
            }
            End::Open => events.chain(futures::stream::pending()).boxed(),
            End::Live => {
                let (sender, mut receiver) = mpsc::unbounded_channel();
                live.push_back(LiveWatch { sender });
                let rest = futures::stream::poll_fn(move |cx| receiver.poll_recv(cx));
                events.chain(rest).boxed()
            }
        })
    }
}

/// A watch the test feeds: each event sent is the next the watcher reads;
/// dropping it closes the watch, as the server would.
///
/// # Panics
///
/// Each send panics if the watcher has dropped the watch (it stopped, or
/// gave the watch up): the test believed it open.
pub struct LiveWatch<K> {
    sender: mpsc::UnboundedSender<Result<WatchEvent<K>, ListWatchError>>,
}

impl<K> std::fmt::Debug for LiveWatch<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveWatch")
            .field("closed", &self.sender.is_closed())
            .finish()
    }
}

impl<K> LiveWatch<K> {
    /// Sends an event, or the error that ends the watch.
    pub fn send(&self, item: Result<WatchEvent<K>, ListWatchError>) {
        assert!(
            self.sender.send(item).is_ok(),
            "the watcher has dropped this watch"
        );
    }

    /// Sends an ADDED event.
    pub fn add(&self, object: K) {
        self.send(Ok(WatchEvent::Added(object)));
    }

    /// Sends a MODIFIED event.
    pub fn modify(&self, object: K) {
        self.send(Ok(WatchEvent::Modified(object)));
    }

    /// Sends a DELETED event.
    pub fn delete(&self, object: K) {
        self.send(Ok(WatchEvent::Deleted(object)));
    }

    /// Sends `error` (410 Gone, a decode error...), which ends the watch
    /// for the Reflector.
    pub fn fail(&self, error: ListWatchError) {
        self.send(Err(error));
    }

    /// Whether the watcher has dropped the watch.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

#[cfg(test)]
mod tests {
    //! The fake itself: what each scripted answer does to a Reflector, and
    //! what is recorded.

    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::testing::{initial_events_end, page};
    use crate::{CancellationToken, InformerOptions, ReflectorOptions, SharedIndexInformer};

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

    fn paged() -> ReflectorOptions {
        ReflectorOptions {
            use_watch_list: false,
            ..ReflectorOptions::default()
        }
    }

    fn run(
        lw: &ScriptedListerWatcher<ConfigMap>,
        reflector: ReflectorOptions,
    ) -> (SharedIndexInformer<ConfigMap>, CancellationToken) {
        let informer =
            SharedIndexInformer::new(lw.clone(), InformerOptions::new().reflector(reflector));
        let shutdown = CancellationToken::new();
        tokio::spawn({
            let (informer, shutdown) = (informer.clone(), shutdown.clone());
            async move { informer.run(shutdown).await }
        });
        (informer, shutdown)
    }

    #[tokio::test(start_paused = true)]
    async fn a_scripted_410_on_the_watch_makes_the_reflector_relist() {
        let lw = ScriptedListerWatcher::new();
        lw.script_list(Ok(page(vec![cm("a", 5)], 10)))
            .script_watch(ScriptedWatch::open(vec![
                Ok(WatchEvent::Added(cm("b", 11))),
                Err(ListWatchError::Gone("too old".into())),
            ]))
            .script_list(Ok(page(vec![cm("b", 11)], 20)));
        let (_informer, shutdown) = run(&lw, paged());

        let _live = lw.next_watch().await;
        let versions: Vec<_> = lw
            .list_requests()
            .into_iter()
            .map(|r| r.resource_version)
            .collect();
        assert_eq!(versions, [Some("0".to_owned()), Some("11".to_owned())]);
        let watches = lw.watch_requests();
        assert_eq!(
            (
                watches[0].resource_version.as_str(),
                watches[1].resource_version.as_str()
            ),
            ("10", "20")
        );
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_the_server_closes_is_opened_again_and_its_time_is_recorded() {
        let lw = ScriptedListerWatcher::new();
        lw.script_list(Ok(page(Vec::new(), 10)))
            .script_watch(ScriptedWatch::closed_after(
                vec![Ok(WatchEvent::Added(cm("a", 11)))],
                Duration::from_secs(3),
            ));
        let (_informer, shutdown) = run(&lw, paged());

        let _live = lw.next_watch().await;
        let times = lw.watch_times();
        assert_eq!(
            times[1] - times[0],
            Duration::from_secs(3),
            "closed after 3 s"
        );
        assert_eq!(lw.watch_requests()[1].resource_version, "11");
        assert_eq!(lw.list_requests().len(), 1, "no relist");
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_unscripted_list_fails_to_connect_and_is_retried_after_a_backoff() {
        let lw = ScriptedListerWatcher::<ConfigMap>::new();
        let (_informer, shutdown) = run(&lw, paged());
        while lw.list_requests().len() < 2 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let times = lw.list_times();
        assert!(
            times[1] - times[0] >= Duration::from_millis(800),
            "backed off"
        );
        assert!(lw.watch_requests().is_empty());
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_streaming_list_is_recorded_and_the_reflector_lists_in_pages() {
        let lw = ScriptedListerWatcher::new();
        lw.refuse_streaming_lists()
            .script_list(Ok(page(vec![cm("a", 5)], 10)));
        let (_informer, shutdown) = run(&lw, ReflectorOptions::default());

        let _live = lw.next_watch().await;
        let watches = lw.watch_requests();
        assert!(watches[0].send_initial_events, "refused");
        assert!(!watches[1].send_initial_events);
        assert_eq!(lw.list_requests().len(), 1, "listed in pages");
        shutdown.cancel();
    }

    /// Waits (up to 10 s of real time: the informer applies changes off
    /// the runtime's threads) until `done` holds.
    async fn eventually(what: &str, done: impl Fn() -> bool) {
        for _ in 0..1000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what} did not happen within 10 s");
    }

    #[tokio::test]
    async fn a_streaming_list_is_a_live_watch_the_test_feeds_and_drops_once_stopped() {
        let lw = ScriptedListerWatcher::new();
        let (informer, shutdown) = run(&lw, ReflectorOptions::default());

        let live = lw.next_watch().await;
        assert!(lw.watch_requests()[0].send_initial_events);
        live.add(cm("a", 5));
        live.send(Ok(initial_events_end(9)));
        eventually("the streaming list's object cached", || {
            informer.indexer().list_keys() == ["ns/a"]
        })
        .await;
        assert_eq!(informer.last_sync_resource_version(), "9");
        assert!(lw.list_requests().is_empty());
        assert!(!live.is_closed());
        shutdown.cancel();
        eventually("the watch dropped", || live.is_closed()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_list_answers_only_once_released() {
        let lw = ScriptedListerWatcher::new();
        lw.script_list(Ok(page(vec![cm("a", 5)], 10)));
        let release = lw.hold_list(0);
        let (_informer, shutdown) = run(&lw, paged());
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(lw.list_requests().len(), 1);
        assert!(lw.watch_requests().is_empty(), "still listing");
        release.notify_one();
        let _live = lw.next_watch().await;
        assert_eq!(
            lw.watch_requests()[0].resource_version,
            "10",
            "the held list's"
        );
        shutdown.cancel();
    }

    #[tokio::test]
    #[should_panic(expected = "the script has no more lists")]
    async fn an_unscripted_list_panics_when_told_to() {
        let lw = ScriptedListerWatcher::<ConfigMap>::new();
        lw.panic_on_unscripted_list();
        let _ = lw.list(ListRequest::default()).await;
    }

    #[tokio::test]
    async fn a_refused_watch_is_an_error_and_the_lister_watcher_says_what_it_lists() {
        let lw = ScriptedListerWatcher::<ConfigMap>::new()
            .for_resource(GroupResource::new("", "configmaps"))
            .in_namespace("ns");
        lw.script_watch(ScriptedWatch::refused(ListWatchError::TooManyRequests(
            "slow down".into(),
        )));
        let request = WatchRequest {
            resource_version: "1".into(),
            timeout: Duration::from_secs(300),
            allow_bookmarks: true,
            send_initial_events: false,
        };
        assert!(matches!(
            lw.watch(request).await,
            Err(ListWatchError::TooManyRequests(_))
        ));
        assert_eq!(lw.resource(), Some(GroupResource::new("", "configmaps")));
        assert_eq!(lw.namespace(), Some("ns"));
        assert_eq!(lw.describe(), "ConfigMap (scripted)");
    }
}
