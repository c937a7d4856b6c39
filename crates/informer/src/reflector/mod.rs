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
//!   one without its end bookmark within `watch_list_timeout` fails; one
//!   refused because the resource is not served does not fall back.
//! - A list or watch answered 404 (the server does not serve the
//!   resource: a custom resource whose CRD is not installed yet, was
//!   deleted, or no longer serves this version) is not retried as a
//!   failure, where client-go relists and logs on every backoff for as long
//!   as it lasts. The Reflector waits for the resource: one log line (the
//!   error handler's) when it starts waiting, one when it is served again,
//!   [`ReflectorStats::not_served_now`] meanwhile. It lists again when
//!   [`ListerWatcher::until_served`] says the resource is served (for a
//!   custom resource: its CRD established with this version served, seen
//!   by watching that one CRD) or, should nothing say so, after the
//!   backoff (800 ms doubling to 30 s, with jitter): a bounded number of
//!   requests a minute, whatever the wait. The cache is left as it was
//!   (a deleted CRD's objects were deleted, one event each, before it);
//!   the next list replaces it. No resync is queued while it waits: the
//!   objects cached may no longer be the server's (a version no longer
//!   served), and handlers would act on them.
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
//!
//! # States
//!
//! The Reflector is a state machine, as kube-runtime's `watcher` is: a
//! private `State` says what it does next, and one step function does it
//! and returns the state that follows. Every wait ends at shutdown, in
//! `Stopped`, and shutdown wins over whatever is ready at the same time.
//!
//! | state | outcome | next |
//! |---|---|---|
//! | `List` | complete | `Watch` (a streaming list's own watch goes on) or `OpenWatch` |
//! | `List` | streaming list refused or failed | `List` in pages, at once and from then on |
//! | `List` | the shard changed ([`ListWatchError::Rescoped`]) | `List`, at once |
//! | `List` | failed | `Backoff`, then `List` |
//! | `OpenWatch` | opened | `Watch` |
//! | `OpenWatch` | 429, or the server unreachable | `Backoff`, then `OpenWatch` |
//! | `OpenWatch` | the shard changed | `List`, at once |
//! | `OpenWatch` | refused otherwise | `Backoff`, then `List` |
//! | `Watch` | closed by the server | `OpenWatch`; `Backoff`, then `List` if it closed within 1 s with no event |
//! | `Watch` | idle for `idle_timeout` | `OpenWatch` |
//! | `Watch` | 429, unreachable, or an internal error within its window | `Backoff`, then `OpenWatch` |
//! | `Watch` | the shard changed | `List`, at once |
//! | `Watch` | 410, an undecodable event, or another failure | `Backoff`, then `List` |
//! | `Backoff` | its delay passed | the state it holds |
//! | any | shutdown | `Stopped` |
//!
//! One idea a file: this one, the states and the step function; `list.rs`,
//! listing (paged or streaming) and handing lists to the queue; `watch.rs`,
//! opening and reading a watch; `tests.rs`, each transition under paused
//! time against a scripted lister-watcher.

mod list;
mod watch;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use kinformer_fifo::InformerQueue;
use kinformer_store::Object;
use parking_lot::RwLock;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::backoff::{Backoff, BackoffConfig};
use crate::lister_watcher::{ListerWatcher, WatchStream};
use crate::panics::{AbortOnDrop, panic_message};
use crate::{ListWatchError, Transform, WatchErrorHandler};

pub use list::LIST_BATCH;
use list::ListState;
use watch::WatchEnd;

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

    /// Forgets the errors so far (a list read everything again).
    fn reset(&mut self) {
        self.first = None;
        self.last = None;
    }

    /// Whether the internal errors so far are still within the window.
    fn should_retry(&mut self) -> bool {
        if self.max.is_zero() {
            return false;
        }
        if self.first.is_some_and(|first| first.elapsed() <= self.max) {
            return true;
        }
        self.reset();
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
    /// Lists and watches the server refused for the credentials: 401
    /// Unauthorized or 403 Forbidden (RBAC).
    pub denied: AtomicU64,
    /// The last such refusal, until a list or watch is served again.
    denied_now: parking_lot::Mutex<Option<String>>,
    /// Times the resource was found not served (404 to a list or watch),
    /// each a wait for it.
    pub not_served: AtomicU64,
    /// The 404 that began the current wait for the resource, until a list
    /// is served again.
    not_served_now: parking_lot::Mutex<Option<String>>,
}

impl ReflectorStats {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The server's message of the last 401 or 403 answer to a list or
    /// watch, while no list or watch has been served since: the informer
    /// cannot follow the server, and the message names the verb, resource
    /// and namespace refused.
    pub fn denied_now(&self) -> Option<String> {
        self.denied_now.lock().clone()
    }

    /// The server's answer that began the current wait for the resource
    /// (404 to a list or watch: it is not served), while no list has been
    /// served since.
    pub fn not_served_now(&self) -> Option<String> {
        self.not_served_now.lock().clone()
    }

    /// A list or watch was served: a refusal, or a wait for the resource,
    /// is over.
    fn served(&self) {
        let mut denied = self.denied_now.lock();
        if denied.is_some() {
            *denied = None;
        }
        drop(denied);
        if self.not_served_now.lock().take().is_some() {
            info!("the resource is served again; following it");
        }
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
    /// Whether the lister-watcher can wait for its resource when it is
    /// not served ([`ListerWatcher::until_served`]).
    waits_for_resource: bool,
}

impl<K> std::fmt::Debug for Reflector<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reflector")
            .field("what", &self.description)
            .field("options", &self.options)
            .field("resync", &self.resync.as_ref().map(|(period, _)| period))
            .field("last_sync_resource_version", &*self.last_sync_rv.read())
            .finish_non_exhaustive()
    }
}

/// What the Reflector does next: one variant a state of the table in the
/// module docs, each carried out by one call of `Reflector::step`.
enum State<K> {
    /// List everything (a streaming list while the server serves one, else
    /// pages), then watch from the list's version.
    List {
        /// Why, for the log.
        reason: String,
    },
    /// Open a watch from the last version seen.
    OpenWatch,
    /// Read the open watch until it ends.
    Watch(WatchStream<K>),
    /// Wait until the resource is served (see the module docs), then list.
    NotServed {
        /// Why the list, for the log.
        reason: String,
    },
    /// Wait `delay`, then go to `next`.
    Backoff {
        delay: Duration,
        next: Box<State<K>>,
    },
    /// Shut down.
    Stopped,
}

/// What lasts across the states of one [`Reflector::run`].
struct Run {
    list: ListState,
    backoff: Backoff,
    internal_errors: InternalErrorRetry,
    /// The lister-watcher's wait for the resource to be served.
    until_served: UntilServed,
}

/// Where the wait of [`ListerWatcher::until_served`] is, within one wait
/// for the resource (from a 404 until a watch opens).
enum UntilServed {
    /// Not begun.
    Idle,
    /// Under way (kept across backoff retries of the list).
    Waiting(BoxFuture<'static, ()>),
    /// It said the resource is served, and the resource has been tried
    /// this many times since without a watch opening: a few quick tries
    /// (the server's handler may trail the CRD it watched), then the 404s
    /// are failures again (see [`WAKE_TRIES`]).
    Woken(u32),
}

/// How many times the resource is tried, [`WAKE_RETRY`] apart, once the
/// lister-watcher says it is served, before a 404 counts as a failure
/// again (reported each time, retried after the backoff): what says it is
/// served and the server disagree (a namespaced informer over a
/// cluster-scoped CRD, a proxy), and waiting would hide it.
const WAKE_TRIES: u32 = 3;

/// The pause between those tries.
const WAKE_RETRY: Duration = Duration::from_secs(1);

impl Run {
    fn new(options: &ReflectorOptions) -> Self {
        Self {
            list: ListState {
                last_sync_rv_unavailable: false,
                paginated_result: false,
                watch_list_unsupported: !options.use_watch_list,
            },
            backoff: Backoff::new(options.backoff),
            internal_errors: InternalErrorRetry::new(options.max_internal_error_retry_duration),
            until_served: UntilServed::Idle,
        }
    }
}

impl<K: Object + Clone> Reflector<K> {
    /// A Reflector feeding `fifo` (an `Arc` of a DeltaFifo or a RealFifo,
    /// or an [`InformerQueue`]) from `lw`.
    pub fn new(
        lw: Arc<dyn ListerWatcher<K>>,
        fifo: impl Into<InformerQueue<K>>,
        options: ReflectorOptions,
    ) -> Self {
        let description = lw.describe();
        let waits_for_resource = lw.until_served().is_some();
        Self {
            waits_for_resource,
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
                let stats = Arc::clone(&self.stats);
                AbortOnDrop(tokio::spawn(async move {
                    let mut tick = tokio::time::interval_at(Instant::now() + period, period);
                    loop {
                        tokio::select! {
                            biased;
                            _ = shutdown.cancelled() => return,
                            _ = tick.tick() => {}
                        }
                        // Not while the resource is not served: the cache
                        // may no longer be what the server holds (a version
                        // no longer served), and handlers would act on it.
                        if stats.not_served_now().is_some() {
                            debug!("no resync while the resource is not served");
                        } else if should() {
                            debug!("resync");
                            if let Err(e) = fifo.resync() {
                                warn!(error = %crate::error_chain(&e), "resync failed");
                            }
                        }
                    }
                }))
            });
            let mut run = Run::new(&self.options);
            let mut state = State::List {
                reason: "initial list".to_owned(),
            };
            while !matches!(state, State::Stopped) {
                state = if shutdown.is_cancelled() {
                    State::Stopped
                } else {
                    self.step(state, &mut run, &shutdown).await
                };
            }
            // Dropping the guard aborts the resync task (also when this
            // future is dropped before it gets here).
            drop(resync_task);
            debug!("reflector stopped");
        }
        .instrument(span)
        .await
    }

    /// Does what `state` says and returns the state that follows: the
    /// whole of the Reflector's control flow (see the table in the module
    /// docs). Every wait in it ends at shutdown, with [`State::Stopped`].
    async fn step(&self, state: State<K>, run: &mut Run, shutdown: &CancellationToken) -> State<K> {
        match state {
            State::List { reason } => self.list_step(reason, run, shutdown).await,
            State::OpenWatch => match self.open_watch(shutdown).await {
                Ok(Some(stream)) => {
                    run.until_served = UntilServed::Idle;
                    self.stats.served();
                    State::Watch(stream)
                }
                Ok(None) => State::Stopped,
                Err(e) if e.is_retryable_in_place() => self.rewatch(&e, run, "watch refused"),
                Err(e) if self.is_not_served(&e) => {
                    self.not_served(e, run, "watch refused".to_owned())
                }
                Err(e) => self.relist(e, run),
            },
            State::Watch(stream) => {
                let end = self.watch_handler(stream, shutdown).await;
                self.after_watch(end, run)
            }
            State::Backoff { delay, next } => tokio::select! {
                biased;
                _ = shutdown.cancelled() => State::Stopped,
                _ = tokio::time::sleep(delay) => *next,
            },
            State::NotServed { reason } => self.wait_served(reason, run, shutdown).await,
            State::Stopped => State::Stopped,
        }
    }

    /// Lists, by a streaming list while the server serves one, else in
    /// pages; a complete list goes on to its watch.
    async fn list_step(
        &self,
        reason: String,
        run: &mut Run,
        shutdown: &CancellationToken,
    ) -> State<K> {
        if !run.list.watch_list_unsupported {
            return match self.watch_list(shutdown, &reason).await {
                Ok(Some(stream)) => {
                    run.internal_errors.reset();
                    run.until_served = UntilServed::Idle;
                    self.stats.served();
                    State::Watch(stream)
                }
                Ok(None) => State::Stopped,
                // The shard changed while streaming: stream the new one.
                Err(e) if e.is_rescoped() => self.relist(e, run),
                // Not served: nothing says the server cannot stream.
                Err(e) if self.is_not_served(&e) => self.not_served(e, run, reason),
                Err(e) => {
                    // As client-go, making progress beats waiting on a server
                    // or proxy that cannot stream; unlike it (which tries the
                    // stream again at the next relist), list + watch from now on.
                    warn!(error = %crate::error_chain(&e), "streaming list failed; falling back to list + watch");
                    self.report(&e);
                    run.list.watch_list_unsupported = true;
                    State::List { reason }
                }
            };
        }
        let listed = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return State::Stopped,
            listed = self.list(&mut run.list, &reason) => listed,
        };
        match listed {
            Ok(()) => {
                // The wait for the resource ends when its watch opens: a
                // list served and a watch answered 404 stay one wait.
                run.internal_errors.reset();
                self.stats.served();
                State::OpenWatch
            }
            Err(e) if self.is_not_served(&e) => self.not_served(e, run, reason),
            Err(e) => self.relist(e, run),
        }
    }

    /// Whether `e` says the resource is not served and the lister-watcher
    /// can wait for it ([`ListerWatcher::until_served`]); any other 404
    /// is a failure like the rest.
    fn is_not_served(&self, e: &ListWatchError) -> bool {
        e.is_not_served() && self.waits_for_resource
    }

    /// The server does not serve the resource (`e`, a 404): reported
    /// once per wait, then waited for (see the module docs); a failure
    /// once the lister-watcher said it is served and [`WAKE_TRIES`] tries
    /// found otherwise.
    fn not_served(&self, e: ListWatchError, run: &mut Run, reason: String) -> State<K> {
        if let UntilServed::Woken(tries) = run.until_served
            && tries >= WAKE_TRIES
        {
            if self.stats.not_served_now.lock().take().is_some() {
                warn!(error = %e, tries, "said to be served, the resource is still answered 404: a failure, not a wait");
            }
            return self.relist(e, run);
        }
        let first = self
            .stats
            .not_served_now
            .lock()
            .replace(e.to_string())
            .is_none();
        if first {
            ReflectorStats::bump(&self.stats.not_served);
            self.report(&e);
        }
        State::NotServed { reason }
    }

    /// Waits until the lister-watcher says the resource is served, or the
    /// backoff ends, then lists; once it has said so, lists again after
    /// [`WAKE_RETRY`] (see [`UntilServed`]).
    async fn wait_served(
        &self,
        reason: String,
        run: &mut Run,
        shutdown: &CancellationToken,
    ) -> State<K> {
        if let UntilServed::Woken(tries) = &mut run.until_served {
            *tries += 1;
            return tokio::select! {
                biased;
                _ = shutdown.cancelled() => State::Stopped,
                _ = tokio::time::sleep(WAKE_RETRY) => State::List { reason },
            };
        }
        let delay = run.backoff.next_delay();
        if matches!(run.until_served, UntilServed::Idle) {
            let served = self.lw.until_served();
            run.until_served =
                UntilServed::Waiting(served.unwrap_or_else(|| Box::pin(std::future::pending())));
        }
        let served = async {
            match &mut run.until_served {
                UntilServed::Waiting(served) => served.await,
                _ => std::future::pending().await,
            }
        };
        let woken = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return State::Stopped,
            _ = served => true,
            _ = tokio::time::sleep(delay) => false,
        };
        if woken {
            debug!("the resource is served, says the lister-watcher; listing");
            run.until_served = UntilServed::Woken(1);
        }
        State::List { reason }
    }

    /// What follows a watch's end: reopen it (at once, or after a backoff)
    /// or relist.
    fn after_watch(&self, end: WatchEnd, run: &mut Run) -> State<K> {
        match end {
            WatchEnd::Stopped => State::Stopped,
            WatchEnd::Closed { events, lasted } => {
                debug!(
                    events,
                    lasted_ms = lasted.as_millis() as u64,
                    "watch closed by the server"
                );
                if events == 0 && lasted < Duration::from_secs(1) {
                    let e = ListWatchError::Connect(
                        format!("very short watch: closed after {lasted:?} with no event").into(),
                    );
                    return self.relist(e, run);
                }
                State::OpenWatch
            }
            WatchEnd::Idle => {
                let e = ListWatchError::Idle(self.options.idle_timeout);
                warn!(error = %e, "reopening the watch");
                self.report(&e);
                State::OpenWatch
            }
            WatchEnd::Failed(e) => {
                run.internal_errors.after(&e);
                if e.is_retryable_in_place()
                    || (e.is_internal_error() && run.internal_errors.should_retry())
                {
                    return self.rewatch(&e, run, "watch failed");
                }
                // A 410 does not make the last version unavailable: a list
                // not older than it is still what the cache can serve.
                info!(error = %crate::error_chain(&e), "watch ended; relisting");
                self.relist(e, run)
            }
        }
    }

    /// Reports `e` and reopens the watch after a backoff, without a relist.
    fn rewatch(&self, e: &ListWatchError, run: &mut Run, what: &str) -> State<K> {
        self.report(e);
        let delay = run.backoff.next_delay();
        info!(error = %crate::error_chain(e), delay_ms = delay.as_millis() as u64, "{what}; backing off, then watching again");
        State::Backoff {
            delay,
            next: Box::new(State::OpenWatch),
        }
    }

    /// The relist that `e` calls for: at once for a changed shard (not a
    /// failure), otherwise reported and after a backoff.
    fn relist(&self, e: ListWatchError, run: &mut Run) -> State<K> {
        if e.is_rescoped() {
            info!(reason = %e, "relisting");
            return State::List {
                reason: e.to_string(),
            };
        }
        let reason = if e.is_gone() {
            format!("watch expired: {e}")
        } else {
            format!("after error: {}", crate::error_chain(&e))
        };
        self.report(&e);
        let delay = run.backoff.next_delay();
        info!(
            delay_ms = delay.as_millis() as u64,
            "backing off before relisting"
        );
        State::Backoff {
            delay,
            next: Box::new(State::List { reason }),
        }
    }

    fn report(&self, e: &ListWatchError) {
        ReflectorStats::bump(&self.stats.errors);
        if !e.is_not_served() {
            // Not a wait for the resource any more, but a failure.
            self.stats.not_served_now.lock().take();
        }
        if let ListWatchError::Api {
            code: 401 | 403, ..
        } = e
        {
            ReflectorStats::bump(&self.stats.denied);
            *self.stats.denied_now.lock() = Some(e.to_string());
        }
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| (self.error_handler)(e))) {
            ReflectorStats::bump(&self.stats.error_handler_panics);
            error!(error = %crate::error_chain(e), panic = %panic_message(panic.as_ref()), "the watch error handler panicked on this error; going on");
        }
    }

    /// A random server-side watch timeout in `[min, 2 * min]` whole seconds,
    /// `min` being the option but at least [`MIN_WATCH_TIMEOUT`] (client-go's
    /// `minWatchTimeout` and `maxWatchTimeout`).
    fn watch_timeout(&self) -> Duration {
        let min = self.options.min_watch_timeout.max(MIN_WATCH_TIMEOUT);
        Duration::from_secs(min.mul_f64(1.0 + fastrand::f64()).as_secs())
    }
}

/// Logs list and watch errors, as client-go's `DefaultWatchErrorHandler`.
pub fn default_watch_error_handler(e: &ListWatchError) {
    match e {
        ListWatchError::Gone(_) => info!(error = %e, "watch closed: resource version expired"),
        e if e.is_not_served() => warn!(
            error = %e,
            "the API server does not serve this resource (is its CustomResourceDefinition installed, with this version served?); waiting for it"
        ),
        _ => warn!(error = %crate::error_chain(e), "list/watch failed"),
    }
}

#[cfg(test)]
mod tests;
