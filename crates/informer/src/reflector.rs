//! The Reflector: keeps an informer's queue (a DeltaFifo or a RealFifo) in
//! step with the server by list + watch.
//!
//! As client-go's `reflector.go`:
//! - The first list asks for resource version `"0"` (served from the watch
//!   cache), a relist for the last version seen (not older than it), and only
//!   after a 410 on list, or a list refused because the version is newer than
//!   the server has seen (`ResourceVersionTooLarge`, say after failing over
//!   to a lagging apiserver), for `""` (a quorum read from etcd), at once.
//! - Lists are paged (`limit`/`continue`); a continue token that expires
//!   mid-list falls back to one full list at the same version. A relist at a
//!   specific version is sent without a limit, so that the watch cache
//!   serves it, unless the list at `"0"` came back in pages (the watch cache
//!   is off for the resource); a list at `""` comes back in pages anyway and
//!   does not count.
//! - The watch starts from the list's version with bookmarks; every event and
//!   bookmark advances the last seen version. A watch the server closes (its
//!   timeout, random in 5-10 minutes) is reopened from there without
//!   relisting, and so is one that fails, to open or later, with 429. A 410
//!   Gone, a 5xx, or any other failure relists; an `InternalError` from the
//!   stream is reopened instead within
//!   [`ReflectorOptions::max_internal_error_retry_duration`] (none by default).
//! - Every relist and retry waits an exponential backoff with jitter
//!   (800 ms doubling to 30 s, reset after 2 minutes of health).
//! - A watch event that cannot be decoded ends the watch and relists:
//!   skipping it would let later events move the resource version past it,
//!   and an undecodable DELETED would leave a ghost in the cache for good.
//!
//! Where it differs from client-go, on purpose:
//! - A watch that fails because the server cannot be reached (not only a
//!   refused connection) is reopened after a backoff without relisting.
//! - An `InternalError` reopened within the retry window waits the backoff
//!   first (client-go reopens at once): the error tends to repeat.
//! - A watch that sees nothing, not even a bookmark, for the idle timeout is
//!   taken for a dead (half-open) connection and reopened.
//! - An object of a list that cannot be decoded is left out of the list
//!   (reported by name and counted in
//!   [`ReflectorStats::undecodable_objects`]), where client-go fails the
//!   whole list; it is never taken for deleted: the version cached under
//!   its key stays (a relist infers no deletion for that key), and an
//!   object never cached stays absent. One whose key cannot be read either
//!   makes the list infer no deletion at all. List and watch agree; the
//!   next watch starts after it, so an object that stays undecodable costs
//!   one relist per change of it, not a relist loop.
//! - A streaming list that fails falls back to list + watch for good, and
//!   one without its end bookmark within `watch_list_timeout` fails.
//! - [`ListWatchError::Rescoped`] (the shard of a
//!   [`ShardScope`](crate::ShardScope) changed) relists at once, without a
//!   backoff and without counting as an error.
//! - A list is handed to the queue as it arrives (each object of a
//!   streaming list, each page of a paged one) rather than held until it is
//!   complete, where client-go collects it first: on a DeltaFifo the
//!   informer replaces each cached object while the rest of the list is
//!   still arriving, so a relist holds the old cache plus the objects in
//!   flight instead of the old cache plus the whole new list (the relist
//!   peak of `cargo xtask bench`). The deletions the list implies are queued
//!   once it is complete, never from part of it; a list that falls back to
//!   another (an expired continue token, a 410) starts its count of listed
//!   keys again. A list that fails half-way leaves the objects already
//!   handed over queued and infers nothing. Those are states the server
//!   had, but the list that follows may be served at an older version (by
//!   a lagging apiserver's watch cache), in which case handlers see some
//!   objects go back to that version, and objects created in between leave
//!   and come back with the watch: the cache converges all the same, where
//!   client-go, which drops a partial list, shows no such step back. An
//!   object without a key is left out and reported, like an undecodable one.
//!
//! User callbacks cannot kill the Reflector; their panics are caught:
//! - A transform that panics for an object means that object cannot be
//!   cached faithfully: it is treated exactly like an undecodable object
//!   (left out of a list; a watch event ends the watch and relists), logged
//!   with the object's key and counted in [`ReflectorStats::transform_panics`].
//! - A watch error handler that panics is logged with the error it was
//!   handed and counted in [`ReflectorStats::error_handler_panics`]; the
//!   Reflector goes on (the handler only reports, the cache is not at stake).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kinformer_fifo::{InformerQueue, QueueReplace};
use kinformer_store::{Object, meta_namespace_key, object_description};
use kube_client::core::WatchEvent;
use parking_lot::RwLock;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::backoff::{Backoff, BackoffConfig};
use crate::lister_watcher::{
    ListPage, ListRequest, ListerWatcher, Undecodable, WatchRequest, WatchStream,
};
use crate::panics::{AbortOnDrop, panic_message};
use crate::{Detail, ListWatchError, Transform, WatchErrorHandler};

/// The page size used when the Reflector pages a list, as client-go's pager.
pub const DEFAULT_PAGE_SIZE: u32 = 500;

/// The shortest minimum watch timeout, as client-go's `defaultMinWatchTimeout`.
pub const MIN_WATCH_TIMEOUT: Duration = Duration::from_secs(300);

/// Whether a watch that ended with an internal error may be reopened
/// without a relist: client-go's `retryWithDeadline` with a reset period of
/// one minute.
struct InternalErrorRetry {
    max: Duration,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl InternalErrorRetry {
    const RESET_AFTER: Duration = Duration::from_secs(60);

    fn new(max: Duration) -> Self {
        Self {
            max,
            first: None,
            last: None,
        }
    }

    /// Records how a watch ended.
    fn after(&mut self, e: &ListWatchError) {
        if !e.is_internal_error() {
            return;
        }
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now - last >= Self::RESET_AFTER)
        {
            self.first = None;
        }
        self.first.get_or_insert(now);
        self.last = Some(now);
    }

    /// Whether the internal errors so far are still within the window.
    fn should_retry(&mut self) -> bool {
        if self.max.is_zero() {
            return false;
        }
        if self.first.is_some_and(|first| first.elapsed() <= self.max) {
            return true;
        }
        self.first = None;
        self.last = None;
        false
    }
}

/// How a Reflector lists and watches. See the field docs for the defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReflectorOptions {
    /// Page size of lists. `None` (the default) does what client-go does:
    /// pages of 500, except for a list at a specific resource version, which
    /// is sent without a limit so that the watch cache can serve it.
    pub page_size: Option<u32>,
    /// The server ends each watch after a random time in
    /// `[min_watch_timeout, 2 * min_watch_timeout]`; default and minimum
    /// 5 minutes: a shorter value is ignored, as client-go ignores it.
    pub min_watch_timeout: Duration,
    /// A watch with no event or bookmark for this long is reopened; default
    /// 150 s (the server sends a bookmark about every minute).
    pub idle_timeout: Duration,
    /// A list page that takes longer fails (and is retried); default 60 s.
    pub list_timeout: Duration,
    /// Start with a streaming list (a watch with `sendInitialEvents=true`)
    /// instead of list pages, as client-go does by default since v0.35; on
    /// any failure, or without the end bookmark within
    /// `watch_list_timeout`, fall back to list + watch for good. Default on.
    pub use_watch_list: bool,
    /// How long the streaming list may take; default 60 s.
    pub watch_list_timeout: Duration,
    /// How long a watch that ends with an internal error (a 500
    /// `InternalError` Status in the stream) is reopened without a relist,
    /// counted from the first such error (reset after a minute without
    /// one): client-go's `MaxInternalErrorRetryDuration`. Default zero: an
    /// internal error relists at once, so an object the server failed to
    /// send is read again.
    pub max_internal_error_retry_duration: Duration,
    /// Backoff between retries.
    pub backoff: BackoffConfig,
}

impl Default for ReflectorOptions {
    fn default() -> Self {
        Self {
            page_size: None,
            min_watch_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(150),
            list_timeout: Duration::from_secs(60),
            use_watch_list: true,
            watch_list_timeout: Duration::from_secs(60),
            max_internal_error_retry_duration: Duration::ZERO,
            backoff: BackoffConfig::default(),
        }
    }
}

/// Counters of what a Reflector did, for tests and metrics.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct ReflectorStats {
    /// List calls (pages count one each).
    pub list_calls: AtomicU64,
    /// Full lists completed and handed to the queue (the first one included).
    pub lists_completed: AtomicU64,
    /// Watches opened.
    pub watches: AtomicU64,
    /// Events received (bookmarks excluded).
    pub events: AtomicU64,
    /// Errors reported to the watch error handler.
    pub errors: AtomicU64,
    /// Objects the transform panicked on (each left out, as undecodable).
    pub transform_panics: AtomicU64,
    /// Watch events, and objects of lists, that could not be decoded, and
    /// listed objects the transform panicked on: each left out, its cached
    /// version kept.
    pub undecodable_objects: AtomicU64,
    /// Panics of the watch error handler, caught.
    pub error_handler_panics: AtomicU64,
}

impl ReflectorStats {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Decides, at each resync tick, whether anyone wants a resync now.
pub(crate) type ShouldResync = Arc<dyn Fn() -> bool + Send + Sync>;

/// Lists and watches through a [`ListerWatcher`] into an [`InformerQueue`].
pub struct Reflector<K> {
    lw: Arc<dyn ListerWatcher<K>>,
    fifo: InformerQueue<K>,
    options: ReflectorOptions,
    transform: Option<Transform<K>>,
    error_handler: WatchErrorHandler,
    resync: Option<(Duration, ShouldResync)>,
    last_sync_rv: Arc<RwLock<String>>,
    stats: Arc<ReflectorStats>,
    description: String,
}

enum WatchEnd {
    /// The shutdown token fired.
    Stopped,
    /// The server closed the watch.
    Closed { events: u64, lasted: Duration },
    /// Nothing arrived for the idle timeout.
    Idle,
    /// The watch failed.
    Failed(ListWatchError),
}

enum Opened<K> {
    Stream(WatchStream<K>),
    Retry,
    Stopped,
    Failed(ListWatchError),
}

/// A whole list, of one or more pages.
struct Listed {
    resource_version: String,
    pages: u32,
    /// Whether the server answered in more than one page.
    paginated: bool,
}

struct ListState {
    last_sync_rv_unavailable: bool,
    paginated_result: bool,
    watch_list_unsupported: bool,
}

/// The annotation on the bookmark that ends a streaming list.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How many objects of a streaming list are handed to the queue at once
/// (a paged list is handed over a page at a time): what a relist holds
/// beyond the cache and what the queue has not yet applied (all of the
/// list, if the informer falls that far behind), and few enough wake-ups
/// of the informer that
/// handing the list over costs no more CPU than one replace (measured:
/// handing over each object as it arrived took 1.5-1.8x the client CPU of a
/// sync of 50 000 Pods).
pub const LIST_BATCH: usize = 256;

impl<K: Object + Clone> Reflector<K> {
    /// A Reflector feeding `fifo` (an `Arc` of a DeltaFifo or a RealFifo,
    /// or an [`InformerQueue`]) from `lw`.
    pub fn new(
        lw: Arc<dyn ListerWatcher<K>>,
        fifo: impl Into<InformerQueue<K>>,
        options: ReflectorOptions,
    ) -> Self {
        let description = lw.describe();
        Self {
            lw,
            fifo: fifo.into(),
            options,
            transform: None,
            error_handler: Arc::new(default_watch_error_handler),
            resync: None,
            last_sync_rv: Arc::new(RwLock::new(String::new())),
            stats: Arc::new(ReflectorStats::default()),
            description,
        }
    }

    /// Applies `transform` to every object before it enters the queue.
    #[must_use]
    pub fn with_transform(mut self, transform: Option<Transform<K>>) -> Self {
        self.transform = transform;
        self
    }

    /// Called with every list and watch error (the default logs it).
    #[must_use]
    pub fn with_error_handler(mut self, handler: WatchErrorHandler) -> Self {
        self.error_handler = handler;
        self
    }

    /// Every `period`, if `should_resync` says so, queues a resync.
    pub(crate) fn with_resync(mut self, period: Duration, should_resync: ShouldResync) -> Self {
        self.resync = Some((period, should_resync));
        self
    }

    /// Records the last resource version seen in `rv` (shared with the caller).
    pub(crate) fn with_last_sync_resource_version(mut self, rv: Arc<RwLock<String>>) -> Self {
        self.last_sync_rv = rv;
        self
    }

    /// The last resource version seen (list, event or bookmark).
    pub fn last_sync_resource_version(&self) -> String {
        self.last_sync_rv.read().clone()
    }

    /// The counters, shared.
    pub fn stats(&self) -> Arc<ReflectorStats> {
        Arc::clone(&self.stats)
    }

    /// Runs until `shutdown` fires: list, watch, and on failure back off and
    /// relist.
    pub async fn run(self, shutdown: CancellationToken) {
        let span = info_span!("reflector", what = %self.description);
        async move {
            let resync_task = self.resync.clone().map(|(period, should)| {
                let fifo = self.fifo.clone();
                let shutdown = shutdown.clone();
                AbortOnDrop(tokio::spawn(async move {
                    let mut tick = tokio::time::interval_at(Instant::now() + period, period);
                    loop {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tick.tick() => {}
                        }
                        if should() {
                            debug!("resync");
                            if let Err(e) = fifo.resync() {
                                warn!(error = %e, "resync failed");
                            }
                        }
                    }
                }))
            });
            let mut backoff = Backoff::new(self.options.backoff);
            let mut state = ListState {
                last_sync_rv_unavailable: false,
                paginated_result: false,
                watch_list_unsupported: !self.options.use_watch_list,
            };
            let mut reason = String::from("initial list");
            while !shutdown.is_cancelled() {
                match self
                    .list_and_watch(&mut state, &mut backoff, &shutdown, &reason)
                    .await
                {
                    Ok(()) => break,
                    Err(e) if e.is_rescoped() => {
                        // Not a failure: the new scope is listed at once.
                        info!(reason = %e, "relisting");
                        reason = e.to_string();
                        continue;
                    }
                    Err(e) => {
                        reason = if e.is_gone() {
                            format!("watch expired: {e}")
                        } else {
                            format!("after error: {e}")
                        };
                        self.report(&e);
                    }
                }
                let delay = backoff.next_delay();
                info!(
                    delay_ms = delay.as_millis() as u64,
                    "backing off before relisting"
                );
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            // Dropping the guard aborts the resync task (also when this
            // future is dropped before it gets here).
            drop(resync_task);
            debug!("reflector stopped");
        }
        .instrument(span)
        .await
    }

    fn report(&self, e: &ListWatchError) {
        ReflectorStats::bump(&self.stats.errors);
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| (self.error_handler)(e))) {
            ReflectorStats::bump(&self.stats.error_handler_panics);
            error!(error = %e, panic = %panic_message(panic.as_ref()), "the watch error handler panicked on this error; going on");
        }
    }

    /// Lists, then watches until the watch must be given up. `Ok` only on
    /// shutdown; `Err` asks for a relist after a backoff.
    async fn list_and_watch(
        &self,
        state: &mut ListState,
        backoff: &mut Backoff,
        shutdown: &CancellationToken,
        reason: &str,
    ) -> Result<(), ListWatchError> {
        let mut streamed = None;
        if !state.watch_list_unsupported {
            match self.watch_list(shutdown, reason).await {
                Ok(Some(stream)) => streamed = Some(stream),
                Ok(None) => return Ok(()),
                // The shard changed while streaming: stream the new one.
                Err(e) if e.is_rescoped() => return Err(e),
                Err(e) => {
                    // As client-go, making progress beats waiting on a server
                    // or proxy that cannot stream; unlike it (which tries the
                    // stream again at the next relist), list + watch from now on.
                    warn!(error = %e, "streaming list failed; falling back to list + watch");
                    self.report(&e);
                    state.watch_list_unsupported = true;
                }
            }
        }
        if streamed.is_none() {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                listed = self.list(state, reason) => listed?,
            }
        }
        let mut internal_errors =
            InternalErrorRetry::new(self.options.max_internal_error_retry_duration);
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            // The streaming list's watch goes on as the regular watch.
            let stream = match streamed.take() {
                Some(stream) => stream,
                None => match self.open_watch(backoff, shutdown).await {
                    Opened::Stream(stream) => stream,
                    Opened::Retry => continue,
                    Opened::Stopped => return Ok(()),
                    Opened::Failed(e) => return Err(e),
                },
            };
            let end = self.watch_handler(stream, shutdown).await;
            if let WatchEnd::Failed(e) = &end {
                internal_errors.after(e);
            }
            match end {
                WatchEnd::Stopped => return Ok(()),
                WatchEnd::Closed { events, lasted } => {
                    debug!(
                        events,
                        lasted_ms = lasted.as_millis() as u64,
                        "watch closed by the server"
                    );
                    if events == 0 && lasted < Duration::from_secs(1) {
                        return Err(ListWatchError::Connect(
                            format!("very short watch: closed after {lasted:?} with no event")
                                .into(),
                        ));
                    }
                }
                WatchEnd::Idle => {
                    let e = ListWatchError::Idle(self.options.idle_timeout);
                    warn!(error = %e, "reopening the watch");
                    self.report(&e);
                }
                WatchEnd::Failed(e)
                    if e.is_retryable_in_place()
                        || (e.is_internal_error() && internal_errors.should_retry()) =>
                {
                    self.report(&e);
                    let delay = backoff.next_delay();
                    info!(error = %e, delay_ms = delay.as_millis() as u64, "watch failed; backing off, then watching again");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                WatchEnd::Failed(e) => {
                    // A 410 does not make the last version unavailable: a
                    // list not older than it is still what the cache can serve.
                    info!(error = %e, "watch ended; relisting");
                    return Err(e);
                }
            }
        }
    }

    /// Opens the next watch from the last seen version; refusals that are
    /// worth retrying in place back off first.
    async fn open_watch(&self, backoff: &mut Backoff, shutdown: &CancellationToken) -> Opened<K> {
        let resource_version = self.last_sync_rv.read().clone();
        let timeout = self.watch_timeout();
        let request = WatchRequest {
            resource_version: resource_version.clone(),
            timeout,
            allow_bookmarks: true,
            send_initial_events: false,
        };
        ReflectorStats::bump(&self.stats.watches);
        // A watch that cannot even open (a half-open connection) is
        // given up after the idle timeout, like one that goes quiet.
        let opened = tokio::select! {
            _ = shutdown.cancelled() => return Opened::Stopped,
            opened = tokio::time::timeout(self.options.idle_timeout, self.lw.watch(request)) => {
                opened.unwrap_or_else(|_| Err(ListWatchError::Connect(format!(
                    "the watch did not open within {:?}", self.options.idle_timeout
                ).into())))
            }
        };
        let stream = match opened {
            Ok(stream) => stream,
            Err(e) if e.is_retryable_in_place() => {
                self.report(&e);
                let delay = backoff.next_delay();
                info!(error = %e, delay_ms = delay.as_millis() as u64, "watch refused; backing off, then watching again");
                return tokio::select! {
                    _ = shutdown.cancelled() => Opened::Stopped,
                    _ = tokio::time::sleep(delay) => Opened::Retry,
                };
            }
            Err(e) => return Opened::Failed(e),
        };
        debug!(resource_version = %resource_version, timeout_s = timeout.as_secs(), "watch started");
        Opened::Stream(stream)
    }

    /// The initial state through one watch with `sendInitialEvents=true`:
    /// ADDED events up to the bookmark annotated `k8s.io/initial-events-end`,
    /// handed to the queue as one replace, each object as it arrives (see
    /// [`InformerQueue::begin_replace`]). Returns the watch, which goes on
    /// with the events after that (`None` on shutdown).
    async fn watch_list(
        &self,
        shutdown: &CancellationToken,
        reason: &str,
    ) -> Result<Option<WatchStream<K>>, ListWatchError> {
        let started = Instant::now();
        let resource_version = self.last_sync_rv.read().clone();
        info!(reason, resource_version = %resource_version, "streaming list");
        let request = WatchRequest {
            resource_version,
            timeout: self.watch_timeout(),
            allow_bookmarks: true,
            send_initial_events: true,
        };
        ReflectorStats::bump(&self.stats.watches);
        let deadline = Instant::now() + self.options.watch_list_timeout;
        let timed_out = || {
            ListWatchError::Connect(
                format!(
                    "no {INITIAL_EVENTS_END} bookmark within {:?}",
                    self.options.watch_list_timeout
                )
                .into(),
            )
        };
        let mut stream = tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            opened = tokio::time::timeout_at(deadline, self.lw.watch(request)) => opened.map_err(|_| timed_out())??,
        };
        let mut replace = self.fifo.begin_replace();
        // Objects are handed over LIST_BATCH at a time: one lock and one
        // wake-up of the informer per batch, not per object.
        let mut batch: Vec<Arc<K>> = Vec::with_capacity(LIST_BATCH);
        loop {
            if batch.len() >= LIST_BATCH {
                self.hand_over(&mut replace, &mut batch);
            }
            let next = tokio::select! {
                _ = shutdown.cancelled() => return Ok(None),
                next = tokio::time::timeout_at(deadline, stream.next()) => next.map_err(|_| timed_out())?,
            };
            match next {
                None => {
                    return Err(ListWatchError::Connect(
                        "the streaming list ended before its initial-events-end bookmark".into(),
                    ));
                }
                Some(Err(ListWatchError::Undecodable(skipped))) => {
                    // One undecodable object is skipped; the list goes on.
                    self.skip(&mut replace, &skipped, "the streaming list");
                }
                Some(Err(ListWatchError::Decode(e))) => {
                    // A frame that does not decode at all: whose object it
                    // held is unknown, so nothing is inferred deleted.
                    self.skip(
                        &mut replace,
                        &Undecodable::new(None, e),
                        "the streaming list",
                    );
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(WatchEvent::Added(obj))) => match self.listed(obj) {
                    Ok(obj) => batch.push(obj),
                    Err(skipped) => self.skip(&mut replace, &skipped, "the streaming list"),
                },
                Some(Ok(WatchEvent::Bookmark(b))) => {
                    let ended = b
                        .metadata
                        .annotations
                        .get(INITIAL_EVENTS_END)
                        .is_some_and(|v| v == "true");
                    if !ended {
                        continue;
                    }
                    self.hand_over(&mut replace, &mut batch);
                    let count = replace.len();
                    let rv = b.metadata.resource_version;
                    replace.finish(&rv);
                    *self.last_sync_rv.write() = rv.clone();
                    ReflectorStats::bump(&self.stats.lists_completed);
                    info!(
                        items = count,
                        resource_version = %rv,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "streamed the initial list"
                    );
                    return Ok(Some(stream));
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    return Err(ListWatchError::from_status(&status));
                }
                Some(Ok(WatchEvent::Modified(_) | WatchEvent::Deleted(_))) => {
                    return Err(ListWatchError::Decode(
                        "a MODIFIED or DELETED event before the initial-events-end bookmark".into(),
                    ));
                }
            }
        }
    }

    /// A random server-side watch timeout in `[min, 2 * min]` whole seconds,
    /// `min` being the option but at least [`MIN_WATCH_TIMEOUT`] (client-go's
    /// `minWatchTimeout` and `maxWatchTimeout`).
    fn watch_timeout(&self) -> Duration {
        let min = self.options.min_watch_timeout.max(MIN_WATCH_TIMEOUT);
        Duration::from_secs(min.mul_f64(1.0 + fastrand::f64()).as_secs())
    }

    /// The resource version to list at, as client-go's `relistResourceVersion`.
    fn relist_resource_version(&self, state: &ListState) -> String {
        if state.last_sync_rv_unavailable {
            return String::new();
        }
        let last = self.last_sync_rv.read();
        if last.is_empty() {
            "0".to_owned()
        } else {
            last.clone()
        }
    }

    async fn list(&self, state: &mut ListState, reason: &str) -> Result<(), ListWatchError> {
        let started = Instant::now();
        let resource_version = self.relist_resource_version(state);
        info!(reason, resource_version = %resource_version, "listing");
        let mut listed_at = resource_version.as_str();
        let mut replace = self.fifo.begin_replace();
        let listed = match self
            .list_pages(state, &resource_version, &mut replace)
            .await
        {
            Err(e)
                if (e.is_gone() || e.is_too_large_resource_version())
                    && !resource_version.is_empty() =>
            {
                // Too old even for the watch cache, or newer than this server
                // has seen (a lagging apiserver): read the latest.
                info!(error = %e, "resource version unavailable; listing the latest from etcd");
                state.last_sync_rv_unavailable = true;
                listed_at = "";
                // Pages of the failed list may have been handed over.
                replace.restart();
                self.list_pages(state, "", &mut replace).await?
            }
            other => other?,
        };
        let Listed {
            resource_version: list_rv,
            pages,
            paginated,
        } = listed;
        // Only a paginated answer to "0" means the watch cache is off for
        // this resource; a list at "" is paginated by etcd anyway, and must
        // not make every later relist bypass the watch cache.
        if paginated && listed_at == "0" {
            state.paginated_result = true;
        }
        state.last_sync_rv_unavailable = false;
        let count = replace.len();
        replace.finish(&list_rv);
        *self.last_sync_rv.write() = list_rv.clone();
        ReflectorStats::bump(&self.stats.lists_completed);
        info!(
            items = count,
            pages,
            resource_version = %list_rv,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "listed"
        );
        Ok(())
    }

    /// Lists in pages, each page's objects handed to `replace` as it
    /// arrives (a list is one page when no limit applies).
    async fn list_pages(
        &self,
        state: &ListState,
        resource_version: &str,
        replace: &mut QueueReplace<'_, K>,
    ) -> Result<Listed, ListWatchError> {
        let limit = match self.options.page_size {
            Some(n) => Some(n),
            None if state.paginated_result => Some(DEFAULT_PAGE_SIZE),
            None if resource_version.is_empty() || resource_version == "0" => {
                Some(DEFAULT_PAGE_SIZE)
            }
            None => None,
        };
        let rv = (!resource_version.is_empty()).then(|| resource_version.to_owned());
        let mut token: Option<String> = None;
        let mut pages = 0;
        let mut paginated = false;
        loop {
            let request = ListRequest {
                limit,
                continue_token: token.clone(),
                resource_version: if token.is_none() { rv.clone() } else { None },
            };
            ReflectorStats::bump(&self.stats.list_calls);
            let page = tokio::time::timeout(self.options.list_timeout, self.lw.list(request))
                .await
                .unwrap_or_else(|_| {
                    Err(ListWatchError::Connect(
                        format!(
                            "a list page did not arrive within {:?}",
                            self.options.list_timeout
                        )
                        .into(),
                    ))
                });
            match page {
                Ok(page) => {
                    pages += 1;
                    let page = self.take_page(replace, page);
                    match page.continue_token {
                        Some(next) => {
                            paginated = true;
                            token = Some(next);
                        }
                        None => {
                            return Ok(Listed {
                                resource_version: page.resource_version,
                                pages,
                                paginated,
                            });
                        }
                    }
                }
                Err(e) if e.is_gone() && token.is_some() => {
                    // client-go's pager: an expired continue token falls back
                    // to one full list at the original version.
                    info!(error = %e, pages, "continue token expired; listing everything at once");
                    ReflectorStats::bump(&self.stats.list_calls);
                    let page = self
                        .lw
                        .list(ListRequest {
                            limit: None,
                            continue_token: None,
                            resource_version: rv.clone(),
                        })
                        .await?;
                    // The pages taken already no longer count as listed:
                    // an object of theirs the full list lacks was deleted.
                    replace.restart();
                    let page = self.take_page(replace, page);
                    return Ok(Listed {
                        resource_version: page.resource_version,
                        pages: pages + 1,
                        paginated,
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Hands a page's objects to the replace in progress (reporting those
    /// the lister-watcher skipped); the page keeps its version and token.
    fn take_page(&self, replace: &mut QueueReplace<'_, K>, mut page: ListPage<K>) -> ListPage<K> {
        for skipped in std::mem::take(&mut page.skipped) {
            self.skip(replace, &skipped, "a listed page");
        }
        let mut batch = Vec::with_capacity(page.items.len());
        for obj in std::mem::take(&mut page.items) {
            match self.listed(obj) {
                Ok(obj) => batch.push(obj),
                Err(skipped) => self.skip(replace, &skipped, "a listed page"),
            }
        }
        self.hand_over(replace, &mut batch);
        page
    }

    /// A listed object through the transform; one the transform panics on
    /// is undecodable.
    fn listed(&self, obj: K) -> Result<Arc<K>, Undecodable> {
        self.transform(obj).map(Arc::new)
    }

    /// An object of the list in progress that could not be decoded: left
    /// out, reported and counted, and its key kept, so that the list is not
    /// taken to say it was deleted (no key: no deletion inferred at all).
    fn skip(&self, replace: &mut QueueReplace<'_, K>, skipped: &Undecodable, list: &str) {
        ReflectorStats::bump(&self.stats.undecodable_objects);
        match &skipped.key {
            Some(key) => replace.keep(key),
            None => replace.keep_all(),
        }
        self.report(&ListWatchError::Decode(
            format!(
                "left one object of {list} out, keeping what is cached under its key: {skipped}"
            )
            .into(),
        ));
    }

    /// Hands `batch` (emptied) to the replace in progress; an object
    /// without a key is reported and left out, as an undecodable one is.
    fn hand_over(&self, replace: &mut QueueReplace<'_, K>, batch: &mut Vec<Arc<K>>) {
        if batch.is_empty() {
            return;
        }
        for e in replace.push_all(std::mem::take(batch)) {
            self.report(&ListWatchError::Decode(Detail::caused(
                "left a listed object out",
                e,
            )));
        }
    }

    /// The object through the transform; a panic of the transform makes
    /// the object [`Undecodable`] (it cannot be cached faithfully).
    fn transform(&self, obj: K) -> Result<K, Undecodable> {
        let Some(transform) = &self.transform else {
            return Ok(obj);
        };
        // Taken first: the transform consumes the object.
        let key = meta_namespace_key(&obj).ok();
        let name = key.clone().unwrap_or_else(|| object_description(&obj));
        let transformed = catch_unwind(AssertUnwindSafe(|| transform(obj))).map_err(|panic| {
            ReflectorStats::bump(&self.stats.transform_panics);
            let panic = panic_message(panic.as_ref());
            error!(key = %name, panic = %panic, "the transform panicked; the object is treated as undecodable");
            Undecodable::new(key.clone(), format!("the transform panicked: {panic}"))
        })?;
        // A transform that leaves the object without a key has made it
        // uncacheable: undecodable under the key it came with, so the
        // cached version stays.
        if key.is_some() && transformed.name().is_none_or(str::is_empty) {
            return Err(Undecodable::new(
                key,
                "the transform left it without a name",
            ));
        }
        Ok(transformed)
    }

    async fn watch_handler(
        &self,
        mut stream: WatchStream<K>,
        shutdown: &CancellationToken,
    ) -> WatchEnd {
        let started = Instant::now();
        let mut events = 0u64;
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return WatchEnd::Stopped,
                next = tokio::time::timeout(self.options.idle_timeout, stream.next()) => next,
            };
            let event = match next {
                Err(_) => return WatchEnd::Idle,
                Ok(None) => {
                    return WatchEnd::Closed {
                        events,
                        lasted: started.elapsed(),
                    };
                }
                Ok(Some(Ok(event))) => event,
                Ok(Some(Err(e @ (ListWatchError::Decode(_) | ListWatchError::Undecodable(_))))) => {
                    // Skipping it would move the resource version past a
                    // change the cache never got: relist instead (which
                    // keeps what is cached under its key).
                    if matches!(e, ListWatchError::Undecodable(_)) {
                        ReflectorStats::bump(&self.stats.undecodable_objects);
                    }
                    return WatchEnd::Failed(ListWatchError::Decode(Detail::caused(
                        "undecodable watch event",
                        e,
                    )));
                }
                Ok(Some(Err(e))) => return WatchEnd::Failed(e),
            };
            let (rv, result) = match event {
                WatchEvent::Added(obj) => {
                    let rv = obj.resource_version().map(str::to_owned);
                    match self.transform(obj) {
                        Ok(obj) => (rv, self.fifo.add(Arc::new(obj))),
                        Err(e) => return WatchEnd::Failed(ListWatchError::Undecodable(e)),
                    }
                }
                WatchEvent::Modified(obj) => {
                    let rv = obj.resource_version().map(str::to_owned);
                    match self.transform(obj) {
                        Ok(obj) => (rv, self.fifo.update(Arc::new(obj))),
                        Err(e) => return WatchEnd::Failed(ListWatchError::Undecodable(e)),
                    }
                }
                WatchEvent::Deleted(obj) => {
                    let rv = obj.resource_version().map(str::to_owned);
                    match self.transform(obj) {
                        Ok(obj) => (rv, self.fifo.delete(Arc::new(obj))),
                        Err(e) => return WatchEnd::Failed(ListWatchError::Undecodable(e)),
                    }
                }
                WatchEvent::Bookmark(bookmark) => {
                    *self.last_sync_rv.write() = bookmark.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(status) => {
                    return WatchEnd::Failed(ListWatchError::from_status(&status));
                }
            };
            events += 1;
            ReflectorStats::bump(&self.stats.events);
            if let Err(e) = result {
                self.report(&ListWatchError::Decode(Detail::caused(
                    "skipped a watch event",
                    e,
                )));
            }
            if let Some(rv) = rv {
                *self.last_sync_rv.write() = rv;
            }
        }
    }
}

/// Logs list and watch errors, as client-go's `DefaultWatchErrorHandler`.
pub fn default_watch_error_handler(e: &ListWatchError) {
    match e {
        ListWatchError::Gone(_) => info!(error = %e, "watch closed: resource version expired"),
        _ => warn!(error = %e, "list/watch failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
