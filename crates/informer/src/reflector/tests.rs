//! The Reflector's transitions, one step at a time, under paused time
//! against a scripted lister-watcher; the real-server suites (envtest.rs,
//! faults.rs) cover the same behaviour across the wire.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_fifo::DeltaFifo;
use kube_client::core::WatchEvent;

use super::*;
use crate::lister_watcher::ListPage;
use crate::testing::{ScriptedListerWatcher, ScriptedWatch, bookmark, initial_events_end};
use crate::{Detail, Undecodable};

type Scripted = ScriptedListerWatcher<ConfigMap>;

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

fn page(rv: u64, items: Vec<ConfigMap>) -> ListPage<ConfigMap> {
    crate::testing::page(items, rv)
}

fn unreachable() -> ListWatchError {
    ListWatchError::Connect(Detail::from("connection reset"))
}

/// A Reflector over `lw` into a fresh DeltaFifo, with the backoff's
/// jitter off so that delays are exact.
fn reflector(
    lw: &Scripted,
    options: ReflectorOptions,
) -> (Reflector<ConfigMap>, Arc<DeltaFifo<ConfigMap>>) {
    let fifo = Arc::new(DeltaFifo::new());
    let lw: Arc<dyn ListerWatcher<ConfigMap>> = Arc::new(lw.clone());
    (Reflector::new(lw, Arc::clone(&fifo), exact(options)), fifo)
}

fn paged() -> ReflectorOptions {
    ReflectorOptions {
        use_watch_list: false,
        ..ReflectorOptions::default()
    }
}

/// A state, written out for assertions.
fn shown(state: &State<ConfigMap>) -> String {
    match state {
        State::List { .. } => "List".to_owned(),
        State::OpenWatch => "OpenWatch".to_owned(),
        State::Watch(_) => "Watch".to_owned(),
        State::Backoff { delay, next } => {
            format!("Backoff({}ms) -> {}", delay.as_millis(), shown(next))
        }
        State::NotServed { .. } => "NotServed".to_owned(),
        State::Stopped => "Stopped".to_owned(),
    }
}

fn list_state() -> State<ConfigMap> {
    State::List {
        reason: "test".to_owned(),
    }
}

/// Steps from `state` and shows where it went.
async fn step(
    r: &Reflector<ConfigMap>,
    state: State<ConfigMap>,
    run: &mut Run,
    shutdown: &CancellationToken,
) -> (State<ConfigMap>, String) {
    let next = r.step(state, run, shutdown).await;
    let name = shown(&next);
    (next, name)
}

fn errors(r: &Reflector<ConfigMap>) -> u64 {
    r.stats.errors.load(Ordering::Relaxed)
}

#[tokio::test(start_paused = true)]
async fn a_complete_list_hands_its_objects_to_the_queue_and_goes_on_to_a_watch() {
    let lw = Scripted::new();
    lw.script_list(Ok(page(10, vec![cm("a", 5), cm("b", 7)])));
    let (r, fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (_, shown) = step(&r, list_state(), &mut run, &shutdown).await;
    assert_eq!(shown, "OpenWatch");
    assert_eq!(fifo.list_keys().len(), 2);
    assert_eq!(r.last_sync_resource_version(), "10");
    assert_eq!(lw.list_requests()[0].resource_version.as_deref(), Some("0"));
    assert_eq!(r.stats.lists_completed.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_list_backs_off_before_relisting_and_each_failure_doubles_the_delay() {
    let lw = Scripted::new();
    lw.script_list(Err(unreachable()))
        .script_list(Err(unreachable()));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, shown) = step(&r, list_state(), &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(800ms) -> List");
    let (state, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "List", "the backoff passed");
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(1600ms) -> List");
    assert_eq!(errors(&r), 2);
}

#[tokio::test(start_paused = true)]
async fn a_watch_the_server_closes_is_reopened_from_the_last_version_without_relisting() {
    let lw = Scripted::new();
    lw.script_list(Ok(page(10, vec![cm("a", 5)])))
        .script_watch(ScriptedWatch::closed(vec![
            Ok(WatchEvent::Modified(cm("a", 11))),
            Ok(bookmark(12)),
        ]))
        .script_watch(ScriptedWatch::open(Vec::new()));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, _) = step(&r, list_state(), &mut run, &shutdown).await;
    let (state, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Watch");
    let (state, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "OpenWatch");
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Watch");
    let watches = lw.watch_requests();
    assert_eq!(watches[0].resource_version, "10");
    assert_eq!(watches[1].resource_version, "12", "from the bookmark");
    assert!(
        watches
            .iter()
            .all(|w| w.allow_bookmarks && !w.send_initial_events)
    );
    assert_eq!(lw.list_requests().len(), 1, "no relist");
    assert_eq!(errors(&r), 0);
}

#[tokio::test(start_paused = true)]
async fn a_watch_closed_at_once_with_no_event_relists_after_a_backoff() {
    let lw = Scripted::new();
    lw.script_watch(ScriptedWatch::closed(Vec::new()));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, _) = step(&r, State::OpenWatch, &mut run, &shutdown).await;
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(800ms) -> List");
    assert_eq!(errors(&r), 1);
}

#[tokio::test(start_paused = true)]
async fn a_quiet_watch_the_server_closes_after_a_second_or_more_is_reopened_without_relisting() {
    let lw = Scripted::new();
    lw.script_watch(ScriptedWatch::closed_after(
        Vec::new(),
        Duration::from_secs(1),
    ));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, _) = step(&r, State::OpenWatch, &mut run, &shutdown).await;
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "OpenWatch");
    assert_eq!(errors(&r), 0);
}

#[tokio::test(start_paused = true)]
async fn a_shard_changed_while_listing_is_listed_again_at_once() {
    let lw = Scripted::new();
    lw.script_list(Err(ListWatchError::Rescoped("shard 2 of 3".into())));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (_, shown) = step(&r, list_state(), &mut run, &shutdown).await;
    assert_eq!(shown, "List");
    assert_eq!(errors(&r), 0);
}

#[tokio::test(start_paused = true)]
async fn a_watch_refused_with_429_or_cut_off_is_reopened_after_a_backoff_without_relisting() {
    let lw = Scripted::new();
    lw.script_watch(ScriptedWatch::refused(ListWatchError::TooManyRequests(
        "slow down".into(),
    )))
    .script_watch(ScriptedWatch::open(vec![Err(unreachable())]));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, shown) = step(&r, State::OpenWatch, &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(800ms) -> OpenWatch");
    let (state, _) = step(&r, state, &mut run, &shutdown).await;
    let (state, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Watch");
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(1600ms) -> OpenWatch");
    assert!(lw.list_requests().is_empty());
    assert_eq!(errors(&r), 2);
}

#[tokio::test(start_paused = true)]
async fn a_410_on_the_watch_relists_at_the_last_version_seen_after_a_backoff() {
    let lw = Scripted::new();
    lw.script_list(Ok(page(10, Vec::new())))
        .script_watch(ScriptedWatch::open(vec![
            Ok(WatchEvent::Added(cm("a", 11))),
            Err(ListWatchError::Gone("too old".into())),
        ]))
        .script_list(Ok(page(20, Vec::new())));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let mut state = list_state();
    for _ in 0..2 {
        state = step(&r, state, &mut run, &shutdown).await.0;
    }
    let (state, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(800ms) -> List");
    let State::Backoff { next, .. } = &state else {
        unreachable!()
    };
    let State::List { reason } = &**next else {
        unreachable!()
    };
    assert!(reason.starts_with("watch expired"), "{reason}");
    let (state, _) = step(&r, state, &mut run, &shutdown).await;
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "OpenWatch");
    // Not older than the last version seen: the watch cache can serve it.
    assert_eq!(
        lw.list_requests()[1].resource_version.as_deref(),
        Some("11")
    );
}

#[tokio::test(start_paused = true)]
async fn an_undecodable_watch_event_relists_and_is_counted() {
    let lw = Scripted::new();
    lw.script_watch(ScriptedWatch::open(vec![Err(ListWatchError::Undecodable(
        Undecodable::new(Some("ns/a".into()), "garbled"),
    ))]));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, _) = step(&r, State::OpenWatch, &mut run, &shutdown).await;
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(800ms) -> List");
    assert_eq!(r.stats.undecodable_objects.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_watch_idle_for_the_idle_timeout_is_reopened_at_once() {
    let lw = Scripted::new();
    lw.script_watch(ScriptedWatch::open(vec![Ok(WatchEvent::Added(cm(
        "a", 11,
    )))]));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, _) = step(&r, State::OpenWatch, &mut run, &shutdown).await;
    let started = Instant::now();
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "OpenWatch");
    assert_eq!(
        started.elapsed(),
        r.options.idle_timeout,
        "after the idle timeout"
    );
    assert_eq!(errors(&r), 1, "reported");
}

#[tokio::test(start_paused = true)]
async fn a_changed_shard_relists_at_once_and_is_not_an_error() {
    let lw = Scripted::new();
    lw.script_watch(ScriptedWatch::open(vec![Err(ListWatchError::Rescoped(
        "shard 1 of 3".into(),
    ))]))
    .script_watch(ScriptedWatch::refused(ListWatchError::Rescoped(
        "shard 2 of 3".into(),
    )));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, _) = step(&r, State::OpenWatch, &mut run, &shutdown).await;
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "List");
    let (_, shown) = step(&r, State::OpenWatch, &mut run, &shutdown).await;
    assert_eq!(shown, "List");
    assert_eq!(errors(&r), 0);
}

#[tokio::test(start_paused = true)]
async fn internal_errors_reopen_the_watch_within_their_window_then_relist() {
    let internal_error = || ScriptedWatch::open(vec![Err(internal())]);
    let lw = Scripted::new();
    lw.script_watch(internal_error())
        .script_watch(internal_error());
    let options = ReflectorOptions {
        max_internal_error_retry_duration: Duration::from_secs(1),
        ..paged()
    };
    let (r, _fifo) = reflector(&lw, options);
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, _) = step(&r, State::OpenWatch, &mut run, &shutdown).await;
    let (state, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(800ms) -> OpenWatch", "within the window");
    // The backoff and 300 ms more outlast the 1 s window.
    let (state, _) = step(&r, state, &mut run, &shutdown).await;
    tokio::time::advance(Duration::from_millis(300)).await;
    let (state, _) = step(&r, state, &mut run, &shutdown).await;
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(1600ms) -> List", "past the window");
}

#[tokio::test(start_paused = true)]
async fn a_list_starts_the_internal_error_window_again() {
    let lw = Scripted::new();
    lw.script_watch(ScriptedWatch::open(vec![Err(internal())]))
        .script_watch(ScriptedWatch::open(vec![Err(ListWatchError::Gone(
            "too old".into(),
        ))]))
        .script_list(Ok(page(10, Vec::new())))
        .script_watch(ScriptedWatch::open(vec![Err(internal())]));
    let options = ReflectorOptions {
        max_internal_error_retry_duration: Duration::from_secs(1),
        ..paged()
    };
    let (r, _fifo) = reflector(&lw, options);
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let mut state = State::OpenWatch;
    let mut seen = Vec::new();
    for _ in 0..9 {
        let (next, shown) = step(&r, state, &mut run, &shutdown).await;
        seen.push(shown);
        state = next;
    }
    assert_eq!(
        seen,
        [
            "Watch",
            "Backoff(800ms) -> OpenWatch",
            "OpenWatch",
            "Watch",
            "Backoff(1600ms) -> List",
            "List",
            "OpenWatch",
            "Watch",
            // 2.4 s after the first internal error, but the first since the list.
            "Backoff(3200ms) -> OpenWatch",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_streaming_list_hands_over_its_objects_and_its_watch_goes_on() {
    let lw = Scripted::new();
    lw.script_watch(ScriptedWatch::open(vec![
        Ok(WatchEvent::Added(cm("a", 5))),
        Ok(WatchEvent::Added(cm("b", 6))),
        Ok(initial_events_end(9)),
    ]));
    let (r, fifo) = reflector(&lw, ReflectorOptions::default());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (_, shown) = step(&r, list_state(), &mut run, &shutdown).await;
    assert_eq!(shown, "Watch");
    assert_eq!(fifo.list_keys().len(), 2);
    assert_eq!(r.last_sync_resource_version(), "9");
    assert!(lw.watch_requests()[0].send_initial_events);
    assert!(lw.list_requests().is_empty());
    assert_eq!(r.stats.lists_completed.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_refused_streaming_list_falls_back_to_pages_at_once_and_for_good() {
    let lw = Scripted::new();
    lw.script_watch(ScriptedWatch::refused(ListWatchError::Api {
        code: 400,
        reason: "BadRequest".into(),
        message: "sendInitialEvents is not supported".into(),
        causes: Vec::new(),
    }))
    .script_list(Ok(page(10, Vec::new())))
    .script_list(Ok(page(11, Vec::new())));
    let (r, _fifo) = reflector(&lw, ReflectorOptions::default());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, shown) = step(&r, list_state(), &mut run, &shutdown).await;
    assert_eq!(shown, "List", "no backoff");
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "OpenWatch");
    let (_, shown) = step(&r, list_state(), &mut run, &shutdown).await;
    assert_eq!(shown, "OpenWatch", "the relist is paged too");
    assert_eq!(lw.watch_requests().len(), 1, "streamed once only");
    assert_eq!(lw.list_requests().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_every_state() {
    let started = Instant::now();
    let lw = Scripted::new();
    lw.script_watch(ScriptedWatch::open(Vec::new()));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();
    let (watch, _) = step(&r, State::OpenWatch, &mut run, &shutdown).await;
    shutdown.cancel();

    let states = [
        list_state(),
        State::OpenWatch,
        watch,
        State::Backoff {
            delay: Duration::from_secs(3600),
            next: Box::new(State::OpenWatch),
        },
    ];
    for state in states {
        let before = shown(&state);
        let (_, after) = step(&r, state, &mut run, &shutdown).await;
        assert_eq!(after, "Stopped", "from {before}");
    }
    // A streaming list too (its watch would answer at once).
    let streaming = Scripted::new();
    streaming.script_watch(ScriptedWatch::open(vec![Ok(initial_events_end(1))]));
    let (r, _fifo) = reflector(&streaming, ReflectorOptions::default());
    let mut run = Run::new(&r.options);
    let (_, after) = step(&r, list_state(), &mut run, &shutdown).await;
    assert_eq!(after, "Stopped", "from a streaming List");
    // No wait ran to its end: the Backoff's hour did not pass.
    assert_eq!(started.elapsed(), Duration::ZERO);
}

fn internal() -> ListWatchError {
    ListWatchError::Api {
        code: 500,
        reason: "InternalError".into(),
        message: "etcd: corrupt value".into(),
        causes: Vec::new(),
    }
}

#[tokio::test(start_paused = true)]
async fn internal_errors_are_retried_within_the_window_from_the_first_then_no_more() {
    let mut retry = InternalErrorRetry::new(Duration::from_secs(30));
    retry.after(&internal());
    assert!(retry.should_retry());
    tokio::time::sleep(Duration::from_secs(20)).await;
    retry.after(&internal());
    assert!(retry.should_retry(), "20 s after the first");
    tokio::time::sleep(Duration::from_secs(20)).await;
    retry.after(&internal());
    assert!(!retry.should_retry(), "40 s after the first");
    // The window starts again with the next error.
    retry.after(&internal());
    assert!(retry.should_retry());
}

#[tokio::test(start_paused = true)]
async fn the_internal_error_window_restarts_after_a_quiet_minute() {
    let mut retry = InternalErrorRetry::new(Duration::from_secs(30));
    retry.after(&internal());
    tokio::time::sleep(Duration::from_secs(61)).await;
    retry.after(&internal());
    assert!(retry.should_retry(), "a new run of errors");
    // Other errors neither start nor extend it.
    let mut other = InternalErrorRetry::new(Duration::from_secs(30));
    other.after(&ListWatchError::Gone("expired".into()));
    assert!(other.first.is_none());
}

#[tokio::test(start_paused = true)]
async fn without_an_internal_error_recorded_there_is_nothing_to_retry() {
    let mut retry = InternalErrorRetry::new(Duration::from_secs(30));
    assert!(!retry.should_retry());
    retry.after(&ListWatchError::Gone("expired".into()));
    assert!(!retry.should_retry());
}

#[test]
fn without_a_window_an_internal_error_is_never_retried() {
    let mut retry = InternalErrorRetry::new(Duration::ZERO);
    retry.after(&internal());
    assert!(!retry.should_retry());
}

fn not_found() -> ListWatchError {
    ListWatchError::Api {
        code: 404,
        reason: "NotFound".into(),
        message: "the server could not find the requested resource".into(),
        causes: Vec::new(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_resource_not_served_is_reported_once_and_waited_for_until_a_list_is_served() {
    let lw = Scripted::new().comes_and_goes();
    // Streaming lists: a 404 says nothing about streaming.
    lw.script_watch(ScriptedWatch::refused(not_found()))
        .script_watch(ScriptedWatch::refused(not_found()))
        .script_watch(ScriptedWatch::open(vec![
            Ok(WatchEvent::Added(cm("a", 5))),
            Ok(initial_events_end(10)),
        ]));
    let (r, _fifo) = reflector(&lw, ReflectorOptions::default());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, shown) = step(&r, list_state(), &mut run, &shutdown).await;
    assert_eq!(shown, "NotServed");
    assert!(!run.list.watch_list_unsupported, "still streams");
    assert!(r.stats.not_served_now().is_some());
    // The scripted lister-watcher never says the resource is served: the
    // backoff ends the wait.
    let before = tokio::time::Instant::now();
    let (state, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "List");
    assert_eq!(before.elapsed(), Duration::from_millis(800));
    let (state, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "NotServed");
    assert_eq!(errors(&r), 1, "reported once a wait");
    assert_eq!(r.stats.not_served.load(Ordering::Relaxed), 1);
    let (state, _) = step(&r, state, &mut run, &shutdown).await;
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Watch");
    assert!(r.stats.not_served_now().is_none(), "served again");
    assert!(
        lw.list_requests().is_empty(),
        "never fell back to paged lists"
    );
}

/// `options` with the backoff's jitter off, so that delays are exact.
fn exact(options: ReflectorOptions) -> ReflectorOptions {
    ReflectorOptions {
        backoff: BackoffConfig {
            jitter: 0.0,
            ..options.backoff
        },
        ..options
    }
}

/// A lister-watcher that always says at once that the resource is served.
struct SaysServed(Scripted);

impl ListerWatcher<ConfigMap> for SaysServed {
    fn list(
        &self,
        request: crate::lister_watcher::ListRequest,
    ) -> BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
        self.0.list(request)
    }
    fn watch(
        &self,
        request: crate::lister_watcher::WatchRequest,
    ) -> BoxFuture<'_, Result<WatchStream<ConfigMap>, ListWatchError>> {
        self.0.watch(request)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn until_served(&self) -> Option<BoxFuture<'static, ()>> {
        Some(Box::pin(std::future::ready(())))
    }
}

#[tokio::test(start_paused = true)]
async fn a_resource_said_served_is_tried_a_few_times_then_its_404s_are_failures_again() {
    let lw = Scripted::new();
    for _ in 0..6 {
        lw.script_list(Err(not_found()));
    }
    let says_served: Arc<dyn ListerWatcher<ConfigMap>> = Arc::new(SaysServed(lw.clone()));
    let r = Reflector::new(says_served, Arc::new(DeltaFifo::new()), exact(paged()));
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (mut state, shown) = step(&r, list_state(), &mut run, &shutdown).await;
    assert_eq!(shown, "NotServed");
    let before = tokio::time::Instant::now();
    let (next, _) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(before.elapsed(), Duration::ZERO, "woken at once");
    state = next;
    // Tried WAKE_TRIES times in all, WAKE_RETRY apart.
    for _ in 1..WAKE_TRIES {
        let (next, shown) = step(&r, state, &mut run, &shutdown).await;
        assert_eq!(shown, "NotServed");
        let before = tokio::time::Instant::now();
        let (next, shown) = step(&r, next, &mut run, &shutdown).await;
        assert_eq!((shown.as_str(), before.elapsed()), ("List", WAKE_RETRY));
        state = next;
    }
    assert_eq!(errors(&r), 1, "one report for the wait");
    // Still 404: a failure, reported, and retried after the backoff (the
    // first wait took its first delay).
    let (state, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(1600ms) -> List");
    assert_eq!(errors(&r), 2);
    assert!(r.stats.not_served_now().is_none(), "not a wait any more");
    let (state, _) = step(&r, state, &mut run, &shutdown).await;
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(3200ms) -> List");
    assert_eq!(errors(&r), 3);
    assert_eq!(lw.list_requests().len(), WAKE_TRIES as usize + 2);
}

#[tokio::test(start_paused = true)]
async fn a_404_is_a_failure_for_a_resource_that_cannot_come_and_go() {
    let lw = Scripted::new();
    lw.script_list(Err(not_found()))
        .script_list(Err(not_found()));
    let (r, _fifo) = reflector(&lw, paged());
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let (state, shown) = step(&r, list_state(), &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(800ms) -> List");
    let (state, _) = step(&r, state, &mut run, &shutdown).await;
    let (_, shown) = step(&r, state, &mut run, &shutdown).await;
    assert_eq!(shown, "Backoff(1600ms) -> List");
    assert_eq!(errors(&r), 2, "each reported");
    assert!(r.stats.not_served_now().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_list_served_then_a_watch_answered_404_is_one_wait_not_a_loop() {
    let lw = Scripted::new();
    for _ in 0..WAKE_TRIES + 1 {
        lw.script_list(Ok(page(10, vec![cm("a", 5)])));
        lw.script_watch(ScriptedWatch::refused(not_found()));
    }
    let says_served: Arc<dyn ListerWatcher<ConfigMap>> = Arc::new(SaysServed(lw.clone()));
    let r = Reflector::new(says_served, Arc::new(DeltaFifo::new()), exact(paged()));
    let mut run = Run::new(&r.options);
    let shutdown = CancellationToken::new();

    let mut state = list_state();
    let mut shown_all: Vec<String> = Vec::new();
    let start = tokio::time::Instant::now();
    while lw.watch_requests().len() < (WAKE_TRIES + 1) as usize {
        let (next, shown) = step(&r, state, &mut run, &shutdown).await;
        shown_all.push(shown);
        state = next;
    }
    // Each wake costs a pause, and the last 404 is a failure with a backoff.
    assert!(
        start.elapsed() >= WAKE_RETRY * (WAKE_TRIES - 1),
        "{:?}: {shown_all:?}",
        start.elapsed()
    );
    assert_eq!(
        shown_all.last().map(String::as_str),
        Some("Backoff(1600ms) -> List"),
        "{shown_all:?}"
    );
}
