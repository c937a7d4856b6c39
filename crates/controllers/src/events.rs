//! Kubernetes Events (events.k8s.io/v1) from a controller, with client-go's
//! series aggregation so that a reconcile failing in a hot loop cannot flood
//! the API server.
//!
//! As client-go's `tools/events`: the first occurrence of an event creates
//! an Event; later occurrences of the *same* event (same object, type,
//! reason, action and note) become an `EventSeries` on that Event, whose
//! `count` and `lastObservedTime` are written at most once per
//! `series_interval` (30 s by default, client-go's heartbeat). Occurrences
//! in between are only counted, and written when the interval ends: an
//! occurrence that finds its series not due sets a timer for when it is,
//! so a Warning repeated a few times and then no more shows its count on
//! the object within one interval, not only when the process stops (client-go
//! writes such counts every 30 minutes). [`EventRecorder::flush`] writes
//! what is still unwritten at once (a [`Manager`](crate::Manager) calls it
//! on shutdown).
//!
//! # A series ends with its window, and its count adds up
//!
//! A series takes occurrences for `series_window` (6 min, client-go's)
//! from its first; the first occurrence after that creates a new Event.
//! The ended series keeps its place until its last write: the occurrences
//! it counted and has not written go out when its next write is due (one
//! interval after the previous, or the back-off below), and that write is
//! its last. So the counts of the Events of one event add up to the
//! occurrences published (a Warning every 10 s for 13 min: Events counting
//! 36, 36 and 6), unless a last write fails: then the series is given up,
//! its unwritten occurrences are counted in
//! [`EventRecorder::dropped_occurrences`] and logged with the error, and
//! nothing is retried. (client-go ends a series 6 min after its *last*
//! occurrence, so that a steady repeat stays on one Event for ever, and
//! forgets a final write that fails; here a series is split every window,
//! which is what bounds its writes.)
//!
//! # Writes per series are bounded whatever the server answers
//!
//! A recorder must not turn a refusing server into a storm (a Role that
//! allows `create` but not `patch` on events, an Event deleted under it):
//!
//! - **One write in flight per series.** A write (the create, or a series
//!   update) claims its series; an occurrence that finds a write in flight
//!   is only counted, and its count goes out with the next due write or
//!   with `flush`.
//! - **Back-off on failure.** After a write succeeds the next one is due
//!   `series_interval` later. After `n` consecutive failed writes it is due
//!   `series_interval × 2ⁿ` later, capped at 10 × `series_interval`
//!   (2×, 4×, 8×, 10×, 10×, ...; with the default 30 s: 1, 2, 4, 5, 5 min).
//!   The cap keeps a series whose writes start to succeed again (RBAC
//!   fixed) from staying silent for long. A failed write is not retried
//!   within itself (client-go retries transport errors 12 times, 10 s
//!   apart, in the background): the next due write is the retry.
//! - **At most ⌈window / interval⌉ + 1 writes per series**, 13 with the
//!   defaults: its writes start at least one interval apart and all but the
//!   last start within its window (the create and 11 updates in 6 min),
//!   then the last one. Each write is one request, or two when an update
//!   finds the Event deleted and creates it again; each
//!   [`flush`](EventRecorder::flush) call adds at most one. A series whose
//!   updates are all refused makes 5 with the defaults: the create, updates
//!   at 30 s, 90 s and 210 s, the last at 450 s, then it is given up.
//! - **A failed create keeps its series.** The occurrences are counted and
//!   the next due write creates the Event (with the count so far), instead
//!   of the very next occurrence creating again.
//! - **A deleted Event is created anew.** A series update answered 404 (the
//!   Event was deleted: by hand, or by the API server's event TTL) creates
//!   the Event again, same name, with the series in it, within the same
//!   write, as client-go's `recordEvent` does on a NotFound patch. A create
//!   answered 409 AlreadyExists (an earlier create whose answer was lost)
//!   counts as the Event existing; the count goes out with the next update
//!   (for a last write: is counted as dropped, its count being unknown).
//! - **`flush` writes each unwritten series at most once per call**, due or
//!   not (it is the last chance on shutdown), and waits for a write in
//!   flight to end instead of sending a second one beside it. For a series
//!   past its window, that write is its last.
//!
//! # Memory per recorder is bounded
//!
//! A recorder holds at most 4096 series (client-go's `EventCorrelator`
//! keeps as many), each with at most one timer task. A series is forgotten
//! once its last write has ended: with the defaults, at most 6 min + 5 min
//! of back-off after its first occurrence, plus the time its writes take
//! (the recorder sets them no deadline: the client's timeouts apply). One
//! with nothing left to write is forgotten when its event occurs again, or
//! by a sweep that a new event makes at most once a window. A new event
//! that finds the recorder full makes it forget the least recently seen
//! series without a write in flight, one with nothing unwritten first; the
//! occurrences that series had not written are counted as dropped. If all
//! 4096 have a write in flight, the new occurrence itself is dropped and
//! counted.
//!
//! [`EventRecorder::writes`] counts every request sent, refused or not;
//! [`EventRecorder::dropped_occurrences`] every occurrence counted and never
//! written, also exported as `kinformer_event_dropped_occurrences_total`
//! by [`EventRecorder::export_metrics`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube_client::Client;
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::Metrics;
use crate::reconcile::is_denied;

/// The back-off after failed writes stops growing at this many series
/// intervals; see the module docs.
const MAX_BACKOFF_INTERVALS: u32 = 10;

/// The series a recorder holds at most; see the module docs.
const MAX_SERIES: usize = 4096;

/// What happened, for [`EventRecorder::publish`]: named fields, so that
/// its three strings cannot be swapped unseen (kube-runtime's `Event` is
/// the same).
///
/// ```no_run
/// # async fn demo(events: kinformer_controllers::EventRecorder, regarding: k8s_openapi::api::core::v1::ObjectReference) -> Result<(), kube_client::Error> {
/// use kinformer_controllers::{EventType, NewEvent};
/// let event = NewEvent {
///     type_: EventType::Warning,
///     reason: "ReconcileFailed",
///     action: "Reconcile",
///     note: "cannot apply the Deployment",
/// };
/// events.publish(&regarding, event).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct NewEvent<'a> {
    /// `Normal` or `Warning`.
    pub type_: EventType,
    /// Why, in UpperCamelCase (`ReconcileFailed`); occurrences with the
    /// same reason, action and note about one object make one series.
    pub reason: &'a str,
    /// What was done, or failed (`Reconcile`).
    pub action: &'a str,
    /// For a human: what happened (cut to the API's 1024 bytes).
    pub note: &'a str,
}

/// `Normal` or `Warning`, the two types the API accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something went wrong and may need attention.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// What makes two occurrences the same event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EventKey {
    regarding: (String, String, String, String),
    type_: EventType,
    reason: String,
    action: String,
    note: String,
}

#[derive(Debug)]
struct Series {
    /// Tells this series from a later one of the same event.
    id: u64,
    /// The Event as first created (no series), to create it again if it is
    /// gone. Its metadata names it on the server.
    event: Event,
    first_seen: Instant,
    /// The latest occurrence: the least recently seen series is the first
    /// forgotten when the recorder is full.
    last_seen: Instant,
    /// Occurrences so far, the first included.
    count: i32,
    /// Occurrences the server knows of.
    written: i32,
    /// Whether the Event is on the server as far as we know: the next
    /// write is then a series update, otherwise a create.
    created: bool,
    /// A write for this series has been sent and has not ended.
    in_flight: bool,
    /// Consecutive failed writes.
    failures: u32,
    /// The earliest time of the next write, but for `flush`.
    next_write: Instant,
    /// The task that writes the unwritten occurrences once `next_write`
    /// comes; ended with the series.
    timer: Option<AbortHandle>,
}

impl Series {
    /// Occurrences counted and not written yet.
    fn unwritten(&self) -> i32 {
        self.count.saturating_sub(self.written).max(0)
    }

    /// Whether its window is over: it takes no more occurrences, and its
    /// next write is its last.
    fn ended(&self, window: Duration, now: Instant) -> bool {
        now.duration_since(self.first_seen) >= window
    }

    /// Marks a write in flight and returns what it is to send.
    fn claim(&mut self, last: bool) -> Claim {
        self.in_flight = true;
        Claim {
            id: self.id,
            event: self.event.clone(),
            count: self.count,
            created: self.created,
            last,
        }
    }
}

impl Drop for Series {
    fn drop(&mut self) {
        if let Some(timer) = self.timer.take() {
            timer.abort();
        }
    }
}

/// The series a recorder holds.
#[derive(Debug)]
struct Book {
    /// The series taking occurrences, one per event (some of them past
    /// their window, until their event occurs again).
    open: HashMap<EventKey, Series>,
    /// Series past their window that a later series of their event has
    /// replaced, kept for their last write, by id.
    ended: HashMap<u64, (EventKey, Series)>,
    next_id: u64,
    /// When series past their window were last forgotten.
    swept: Instant,
}

impl Book {
    fn len(&self) -> usize {
        self.open.len() + self.ended.len()
    }

    /// The series `id` of the event `key`.
    fn get_mut(&mut self, key: &EventKey, id: u64) -> Option<&mut Series> {
        if self.open.get(key).is_some_and(|s| s.id == id) {
            return self.open.get_mut(key);
        }
        self.ended.get_mut(&id).map(|(_, s)| s)
    }

    fn remove(&mut self, key: &EventKey, id: u64) -> Option<Series> {
        if self.open.get(key).is_some_and(|s| s.id == id) {
            return self.open.remove(key);
        }
        self.ended.remove(&id).map(|(_, s)| s)
    }
}

/// What one write sends: taken under the lock, sent without it.
struct Claim {
    id: u64,
    event: Event,
    count: i32,
    created: bool,
    /// The series' last write: it is forgotten once this ends.
    last: bool,
}

impl Claim {
    fn name(&self) -> &str {
        self.event.metadata.name.as_deref().unwrap_or_default()
    }

    fn namespace(&self) -> &str {
        self.event.metadata.namespace.as_deref().unwrap_or_default()
    }
}

/// How a write ended, for the series' bookkeeping.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// The Event is on the server with the claimed count.
    Written,
    /// The Event is on the server (a create answered AlreadyExists), with a
    /// count we do not know.
    Exists,
    /// Nothing known was written; `gone` if the server said the Event is
    /// not there (the update's 404, then a create that failed too).
    Failed { gone: bool },
}

/// What follows a write, for its log line.
#[derive(Debug, Clone, Copy)]
enum Next {
    /// The next write is due in this long.
    WriteIn(Duration),
    /// The series is over: forgotten with this many occurrences unwritten
    /// (counted as dropped).
    Forgotten { dropped: i32 },
}

/// Publishes Events for one controller instance; see the module docs.
pub struct EventRecorder {
    /// Shared with the timers of series waiting for their interval.
    inner: Arc<Recorder>,
}

struct Recorder {
    client: Client,
    reporting_controller: String,
    reporting_instance: String,
    /// In nanoseconds (settable through a shared recorder).
    series_interval: AtomicU64,
    /// In nanoseconds.
    series_window: AtomicU64,
    book: Mutex<Book>,
    writes: AtomicU64,
    /// Changed with the book locked, so that `export_metrics` counts each
    /// drop once.
    dropped: AtomicU64,
    dropped_metric: OnceLock<Counter>,
    /// Writes the server refused for the credentials; changed with the
    /// metric's lock, as `dropped`.
    denied: AtomicU64,
    denied_metric: OnceLock<Counter>,
    /// Bumped whenever a write ends, so that `flush` can wait for a write
    /// in flight without polling (a watch: a receiver taken before looking
    /// at the series sees an end that happens after the look).
    settled: watch::Sender<u64>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("reporting_controller", &self.inner.reporting_controller)
            .field("reporting_instance", &self.inner.reporting_instance)
            .finish_non_exhaustive()
    }
}

/// Clears a series' in-flight mark when its write ends, also when the
/// writing future is dropped halfway (a `publish` cancelled by a timeout or
/// a shutdown), so that the series is not left claimed for ever. A dropped
/// write counts as failed: whether it reached the server is unknown.
struct InFlight<'a> {
    recorder: &'a Arc<Recorder>,
    key: &'a EventKey,
    claim: &'a Claim,
    settled: bool,
}

impl InFlight<'_> {
    fn settle(&mut self, outcome: Outcome) -> Next {
        self.settled = true;
        self.recorder.settle(self.key, self.claim, outcome)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.settled {
            let next = self
                .recorder
                .settle(self.key, self.claim, Outcome::Failed { gone: false });
            if let Next::Forgotten { dropped } = next
                && dropped > 0
            {
                warn!(
                    event = %self.claim.name(),
                    dropped,
                    "the last write of an event series was cancelled; giving up its count"
                );
            }
        }
    }
}

/// Nanoseconds as an atomic holds them.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl EventRecorder {
    /// A recorder reporting as `controller` (e.g. `kinformer.dev/service-strategy`)
    /// from `instance` (e.g. the pod name), for a program without a
    /// Manager: with one, take
    /// [`Manager::event_recorder`](crate::Manager::event_recorder), which
    /// the Manager flushes when it stops and whose metrics it exports. One
    /// made here is yours to [`flush`](Self::flush) before the program
    /// exits, and to [`export_metrics`](Self::export_metrics).
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Self {
            inner: Arc::new(Recorder {
                client,
                reporting_controller: controller.to_owned(),
                reporting_instance: instance.to_owned(),
                series_interval: AtomicU64::new(nanos(Duration::from_secs(30))),
                series_window: AtomicU64::new(nanos(Duration::from_secs(6 * 60))),
                book: Mutex::new(Book {
                    open: HashMap::new(),
                    ended: HashMap::new(),
                    next_id: 0,
                    swept: Instant::now(),
                }),
                writes: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                dropped_metric: OnceLock::new(),
                denied: AtomicU64::new(0),
                denied_metric: OnceLock::new(),
                settled: watch::Sender::new(0),
            }),
        }
    }

    /// How often a repeating event's series is written (30 s by default);
    /// also the unit of the back-off after failed writes (module docs).
    #[must_use]
    pub fn series_interval(self, interval: Duration) -> Self {
        self.inner
            .series_interval
            .store(nanos(interval), Ordering::Relaxed);
        self
    }

    /// How long a series takes occurrences after its first (6 min by
    /// default, client-go's); the next occurrence creates a new Event
    /// (module docs).
    #[must_use]
    pub fn series_window(self, window: Duration) -> Self {
        self.inner
            .series_window
            .store(nanos(window), Ordering::Relaxed);
        self
    }

    /// Requests sent to the server so far (creates and series updates),
    /// whether they succeeded or not.
    pub fn writes(&self) -> u64 {
        self.inner.writes.load(Ordering::Relaxed)
    }

    /// Occurrences counted and never written so far: those of a series
    /// whose last write failed, or that was forgotten to make room (module
    /// docs).
    pub fn dropped_occurrences(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Event writes (create or patch) the server refused for the
    /// credentials (401, 403: RBAC without `create` or `patch` on
    /// events.k8s.io Events where they go). Each is logged with the
    /// server's message, which names the verb, resource and namespace, and
    /// tried again later as any failed write.
    pub fn denied_writes(&self) -> u64 {
        self.inner.denied.load(Ordering::Relaxed)
    }

    /// Exports [`dropped_occurrences`](Self::dropped_occurrences) and
    /// [`denied_writes`](Self::denied_writes) in `metrics` as
    /// `kinformer_event_dropped_occurrences_total` and
    /// `kinformer_event_denied_total`, labelled with the reporting
    /// controller (recorders of one controller add up).
    /// Once per recorder: later calls do nothing. A
    /// [`Manager::event_recorder`](crate::Manager::event_recorder) is
    /// exported already; this is for a recorder made with
    /// [`new`](Self::new).
    ///
    /// ```no_run
    /// # fn demo(client: kube_client::Client) {
    /// use kinformer_controllers::{EventRecorder, Metrics};
    /// let metrics = Metrics::new();
    /// let events = EventRecorder::new(client, "example.com/website", "replica-0");
    /// events.export_metrics(&metrics);
    /// # }
    /// ```
    pub fn export_metrics(&self, metrics: &Metrics) {
        let controller = &self.inner.reporting_controller;
        let counter = metrics.event_dropped_occurrences(controller);
        let denied = metrics.event_denied_writes(controller);
        // Locked, so that nothing is counted between the two lines.
        let _book = self.inner.book.lock();
        if self.inner.dropped_metric.set(counter.clone()).is_ok() {
            counter.inc_by(self.dropped_occurrences());
        }
        if self.inner.denied_metric.set(denied.clone()).is_ok() {
            denied.inc_by(self.denied_writes());
        }
    }

    /// Records one occurrence of an event about `regarding`, which must name
    /// the object's namespace (for namespaced objects) and name.
    ///
    /// A note longer than the API server takes (1024 bytes) is cut to its
    /// first 1021 bytes (at a character boundary) followed by `...`, so that
    /// a long error message still makes its Event; client-go sends it whole,
    /// and the server refuses the Event.
    ///
    /// Returns the error of the write this occurrence made, if it made one
    /// and it failed; an occurrence that is only counted returns `Ok` (its
    /// count is written when its series' interval ends).
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        event: NewEvent<'_>,
    ) -> Result<(), kube_client::Error> {
        let NewEvent {
            type_,
            reason,
            action,
            note,
        } = event;
        self.inner
            .publish(regarding, type_, reason, action, note)
            .await
    }

    /// Writes every series with occurrences the server does not know of yet,
    /// at most once each, due or not; waits for a write in flight to end
    /// first (then writes only if that one left something unwritten). Goes
    /// on past a failed write and returns the first error.
    pub async fn flush(&self) -> Result<(), kube_client::Error> {
        self.inner.flush().await
    }
}

/// The most an Event's note may hold, in bytes (the API server's
/// `NoteLengthLimit`).
const NOTE_LIMIT: usize = 1024;

/// `note`, cut to [`NOTE_LIMIT`] bytes with `...` at the end if it is
/// longer.
fn bounded_note(note: &str) -> std::borrow::Cow<'_, str> {
    if note.len() <= NOTE_LIMIT {
        return note.into();
    }
    let mut end = NOTE_LIMIT - 3;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &note[..end]).into()
}

/// How room was made for a new series, for the log.
enum Room {
    Free,
    /// A series was forgotten with this many unwritten occurrences.
    Forgot {
        name: String,
        dropped: i32,
    },
    /// Every series has a write in flight: the new occurrence is dropped.
    Full,
}

impl Recorder {
    fn interval(&self) -> Duration {
        Duration::from_nanos(self.series_interval.load(Ordering::Relaxed))
    }

    fn window(&self) -> Duration {
        Duration::from_nanos(self.series_window.load(Ordering::Relaxed))
    }

    async fn publish(
        self: &Arc<Self>,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), kube_client::Error> {
        let note = bounded_note(note);
        let key = EventKey {
            regarding: (
                regarding.namespace.clone().unwrap_or_default(),
                regarding.name.clone().unwrap_or_default(),
                regarding.kind.clone().unwrap_or_default(),
                regarding.uid.clone().unwrap_or_default(),
            ),
            type_,
            reason: reason.to_owned(),
            action: action.to_owned(),
            note: note.clone().into_owned(),
        };
        let window = self.window();
        let (claim, room) = {
            let mut book = self.book.lock();
            // Read under the lock: a timer or flush that claimed a series'
            // last write at its window's end did so at an earlier instant.
            let now = Instant::now();
            // A series past its window takes no more occurrences; kept
            // aside if it still has its last write to make.
            if book.open.get(&key).is_some_and(|s| s.ended(window, now))
                && let Some(mut ended) = book.open.remove(&key)
                && (ended.in_flight || ended.unwritten() > 0)
            {
                self.set_timer(&key, &mut ended);
                book.ended.insert(ended.id, (key.clone(), ended));
            }
            match book.open.get_mut(&key) {
                Some(s) => {
                    s.count = s.count.saturating_add(1);
                    s.last_seen = now;
                    if s.in_flight {
                        // Its end sets the timer if this goes unwritten.
                        return Ok(());
                    }
                    if now < s.next_write {
                        self.set_timer(&key, s);
                        return Ok(());
                    }
                    (s.claim(false), Room::Free)
                }
                None => {
                    let room = self.make_room(&mut book, window, now);
                    if let Room::Full = room {
                        self.count_dropped(1);
                        drop(book);
                        warn!(
                            reason,
                            series = MAX_SERIES,
                            "dropping an event occurrence: every event series held has a write in flight"
                        );
                        return Ok(());
                    }
                    // Claimed (in flight) before the create is sent, so that
                    // a concurrent occurrence counts into this series instead
                    // of creating a second Event.
                    let id = book.next_id;
                    book.next_id += 1;
                    let mut s = Series {
                        id,
                        event: self.new_event(regarding, type_, reason, action, &note),
                        first_seen: now,
                        last_seen: now,
                        count: 1,
                        written: 0,
                        created: false,
                        in_flight: false,
                        failures: 0,
                        next_write: now,
                        timer: None,
                    };
                    let claim = s.claim(s.ended(window, now));
                    book.open.insert(key.clone(), s);
                    (claim, room)
                }
            }
        };
        if let Room::Forgot { name, dropped } = room
            && dropped > 0
        {
            warn!(
                event = %name,
                dropped,
                series = MAX_SERIES,
                "forgetting an event series with unwritten occurrences: the recorder is full"
            );
        }
        self.write(&key, claim).await
    }

    /// Before a new series is added: forgets the series past their window
    /// with nothing left to write (once a window, or when full) and, if the
    /// book is still full, the least recently seen series without a write
    /// in flight, one with nothing unwritten first. Linear in the series
    /// held when it sweeps; a new series goes with a create request anyway.
    fn make_room(&self, book: &mut Book, window: Duration, now: Instant) -> Room {
        if book.len() >= MAX_SERIES || now.duration_since(book.swept) >= window {
            book.open
                .retain(|_, s| s.in_flight || s.unwritten() > 0 || !s.ended(window, now));
            book.swept = now;
        }
        if book.len() < MAX_SERIES {
            return Room::Free;
        }
        let open = book
            .open
            .iter()
            .map(|(key, s)| (s, Some(key)))
            .chain(book.ended.values().map(|(_, s)| (s, None)));
        let victim = open
            .filter(|(s, _)| !s.in_flight)
            .min_by_key(|(s, _)| (s.unwritten() > 0, s.last_seen))
            .map(|(s, key)| (s.id, key.cloned()));
        let forgotten = match victim {
            Some((_, Some(key))) => book.open.remove(&key),
            Some((id, None)) => book.ended.remove(&id).map(|(_, s)| s),
            None => return Room::Full,
        };
        let Some(s) = forgotten else {
            return Room::Full;
        };
        let dropped = s.unwritten();
        self.count_dropped(dropped);
        Room::Forgot {
            name: s.event.metadata.name.clone().unwrap_or_default(),
            dropped,
        }
    }

    /// Counts occurrences never written; called with the book locked.
    fn count_dropped(&self, n: i32) {
        let n = u64::try_from(n).unwrap_or_default();
        self.dropped.fetch_add(n, Ordering::Relaxed);
        if let Some(counter) = self.dropped_metric.get() {
            counter.inc_by(n);
        }
    }

    async fn flush(self: &Arc<Self>) -> Result<(), kube_client::Error> {
        let pending: Vec<(EventKey, u64)> = {
            let book = self.book.lock();
            let open = book.open.iter();
            open.chain(book.ended.values().map(|(k, s)| (k, s)))
                .filter(|(_, s)| s.unwritten() > 0)
                .map(|(k, s)| (k.clone(), s.id))
                .collect()
        };
        let window = self.window();
        let mut first_error = None;
        for (key, id) in pending {
            let claim = loop {
                // Taken before looking, so that a write ending after the
                // look still wakes us.
                let mut ended = self.settled.subscribe();
                {
                    let mut book = self.book.lock();
                    match book.get_mut(&key, id) {
                        Some(s) if s.in_flight => {}
                        Some(s) if s.unwritten() > 0 => {
                            let last = s.ended(window, Instant::now());
                            break Some(s.claim(last));
                        }
                        _ => break None,
                    }
                }
                // The sender lives as long as `self`: this cannot fail.
                let _ = ended.changed().await;
            };
            if let Some(claim) = claim
                && let Err(e) = self.write(&key, claim).await
            {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn new_event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Event {
        let namespace = regarding
            .namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let stamp = Timestamp::now();
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or("object"),
            stamp.as_nanosecond()
        );
        Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(stamp)),
            type_: Some(type_.as_str().to_owned()),
            reason: Some(reason.to_owned()),
            action: Some(action.to_owned()),
            note: Some(note.to_owned()),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.reporting_controller.clone()),
            reporting_instance: Some(self.reporting_instance.clone()),
            ..Event::default()
        }
    }

    /// Unless one is set already, sets a timer that writes `s`'s unwritten
    /// occurrences when its next write is due (outside a Tokio runtime,
    /// they wait for the next occurrence or `flush`).
    fn set_timer(self: &Arc<Self>, key: &EventKey, s: &mut Series) {
        if s.timer.is_some() || s.in_flight || s.unwritten() == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (recorder, key, id, due) = (Arc::clone(self), key.clone(), s.id, s.next_write);
        let task = runtime.spawn(async move { recorder.on_timer(key, id, due).await });
        s.timer = Some(task.abort_handle());
    }

    /// A series' timer: writes what is unwritten once due, unless a write
    /// is in flight (its end sets the timer again if needed). Aborted when
    /// its series is forgotten.
    async fn on_timer(self: Arc<Self>, key: EventKey, id: u64, mut due: Instant) {
        loop {
            tokio::time::sleep_until(due).await;
            let claim = {
                let mut book = self.book.lock();
                let Some(s) = book.get_mut(&key, id) else {
                    return;
                };
                if s.in_flight || s.unwritten() == 0 {
                    s.timer = None;
                    return;
                }
                let now = Instant::now();
                if now < s.next_write {
                    // A write since the timer was set pushed it back.
                    due = s.next_write;
                    continue;
                }
                s.timer = None;
                let last = s.ended(self.window(), now);
                s.claim(last)
            };
            // A failure is logged by `write`; the next write is the retry.
            let _ = self.write(&key, claim).await;
            return;
        }
    }

    /// Sends one claimed write and settles the series with its outcome.
    async fn write(
        self: &Arc<Self>,
        key: &EventKey,
        claim: Claim,
    ) -> Result<(), kube_client::Error> {
        let mut flight = InFlight {
            recorder: self,
            key,
            claim: &claim,
            settled: false,
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), claim.namespace());
        let (outcome, result) = if claim.created {
            match self.update_series(&api, &claim).await {
                Ok(()) => (Outcome::Written, Ok(())),
                // Deleted under us: create it again, as client-go does.
                Err(kube_client::Error::Api(status)) if status.is_not_found() => {
                    match self.create(&api, &claim).await {
                        Ok(outcome) => (outcome, Ok(())),
                        Err(e) => (Outcome::Failed { gone: true }, Err(e)),
                    }
                }
                Err(e) => (Outcome::Failed { gone: false }, Err(e)),
            }
        } else {
            match self.create(&api, &claim).await {
                Ok(outcome) => (outcome, Ok(())),
                Err(e) => (Outcome::Failed { gone: false }, Err(e)),
            }
        };
        if let Err(e) = &result
            && is_denied(e)
        {
            let _book = self.book.lock();
            self.denied.fetch_add(1, Ordering::Relaxed);
            if let Some(counter) = self.denied_metric.get() {
                counter.inc();
            }
        }
        match (flight.settle(outcome), &result) {
            (Next::WriteIn(next_in), Err(e)) => warn!(
                event = %claim.name(),
                count = claim.count,
                error = %e,
                next_attempt_in = ?next_in,
                "cannot write the event"
            ),
            (Next::Forgotten { dropped }, Err(e)) if dropped > 0 => warn!(
                event = %claim.name(),
                count = claim.count,
                dropped,
                error = %e,
                "cannot write the last count of an event series; giving it up"
            ),
            (Next::Forgotten { dropped }, Ok(())) if dropped > 0 => warn!(
                event = %claim.name(),
                count = claim.count,
                dropped,
                "the last count of an event series is unknown: its create found the Event \
                 there already; giving it up"
            ),
            _ => {}
        }
        result
    }

    async fn update_series(
        &self,
        api: &Api<Event>,
        claim: &Claim,
    ) -> Result<(), kube_client::Error> {
        let series = EventSeries {
            count: claim.count,
            last_observed_time: MicroTime(Timestamp::now()),
        };
        let patch = serde_json::json!({ "series": series });
        self.bump_writes();
        api.patch(claim.name(), &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
    }

    async fn create(&self, api: &Api<Event>, claim: &Claim) -> Result<Outcome, kube_client::Error> {
        let mut event = claim.event.clone();
        // A first create has no series; a later one (the first failed, or
        // the Event was deleted) carries the count so far.
        if claim.count > 1 {
            event.series = Some(EventSeries {
                count: claim.count,
                last_observed_time: MicroTime(Timestamp::now()),
            });
        }
        self.bump_writes();
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => Ok(Outcome::Written),
            Err(kube_client::Error::Api(status)) if status.is_already_exists() => {
                Ok(Outcome::Exists)
            }
            Err(e) => Err(e),
        }
    }

    /// Ends the write in flight `claim` of the series of `key` and schedules
    /// its next write, or forgets the series: after its last write, or once
    /// it is past its window with nothing left to write.
    fn settle(self: &Arc<Self>, key: &EventKey, claim: &Claim, outcome: Outcome) -> Next {
        let (now, window) = (Instant::now(), self.window());
        let next = {
            let mut book = self.book.lock();
            match book.get_mut(key, claim.id) {
                Some(s) => {
                    s.in_flight = false;
                    match outcome {
                        Outcome::Written => {
                            s.created = true;
                            s.written = s.written.max(claim.count);
                            s.failures = 0;
                        }
                        Outcome::Exists => {
                            s.created = true;
                            s.failures = 0;
                        }
                        Outcome::Failed { gone } => {
                            if gone {
                                s.created = false;
                            }
                            s.failures = s.failures.saturating_add(1);
                        }
                    }
                    let delay = delay_after(self.interval(), s.failures);
                    s.next_write = now + delay;
                    if claim.last || (s.ended(window, now) && s.unwritten() == 0) {
                        let dropped = s.unwritten();
                        self.count_dropped(dropped);
                        book.remove(key, claim.id);
                        Next::Forgotten { dropped }
                    } else {
                        // Occurrences counted while it was in flight, or
                        // the retry of a failed write.
                        self.set_timer(key, s);
                        Next::WriteIn(delay)
                    }
                }
                None => Next::Forgotten { dropped: 0 },
            }
        };
        self.settled.send_modify(|n| *n = n.wrapping_add(1));
        next
    }

    fn bump_writes(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }
}

/// The wait before the next write after `failures` consecutive failed ones:
/// the interval, doubled per failure, capped (module docs).
fn delay_after(interval: Duration, failures: u32) -> Duration {
    let factor = 1u32
        .checked_shl(failures)
        .unwrap_or(u32::MAX)
        .min(MAX_BACKOFF_INTERVALS);
    interval.saturating_mul(factor)
}

#[cfg(test)]
mod tests {
    use kinformer_informer::testing::FakeApiServer;

    use super::*;

    /// Where the recorder writes: events.k8s.io's Events.
    const EVENTS: &str = "events.events.k8s.io";

    fn recorder(api: &FakeApiServer) -> EventRecorder {
        EventRecorder::new(api.client(), "kinformer.dev/test", "test-0")
    }

    /// Each stored Event's count (1 without a series), oldest first.
    fn counts(api: &FakeApiServer) -> Vec<i32> {
        let mut events: Vec<(String, i32)> = api
            .list(EVENTS)
            .iter()
            .map(|e| {
                let count = e["series"]["count"].as_i64().unwrap_or(1);
                (e["eventTime"].as_str().unwrap().to_owned(), count as i32)
            })
            .collect();
        events.sort();
        events.into_iter().map(|(_, count)| count).collect()
    }

    fn regarding() -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            namespace: Some("ns".into()),
            name: Some("cm".into()),
            uid: Some("uid-1".into()),
            ..ObjectReference::default()
        }
    }

    async fn publish(recorder: &EventRecorder, note: &str) -> Result<(), kube_client::Error> {
        recorder
            .publish(
                &regarding(),
                NewEvent {
                    type_: EventType::Warning,
                    reason: "SyncFailed",
                    action: "Sync",
                    note,
                },
            )
            .await
    }

    /// Series the recorder holds.
    fn held(recorder: &EventRecorder) -> usize {
        recorder.inner.book.lock().len()
    }

    #[tokio::test(start_paused = true)]
    async fn a_warning_repeated_past_its_series_window_is_counted_in_full_across_its_events() {
        // The report: a Warning every 10 s for 13 minutes, default interval
        // (30 s) and window (6 min): 78 occurrences.
        let fake = FakeApiServer::new();
        let recorder = recorder(&fake);
        for _ in 0..78 {
            publish(&recorder, "boom").await.unwrap();
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        // The first two series ended at 6 and 12 min; their timers wrote
        // their final counts, without a flush.
        assert_eq!(counts(&fake)[..2], [36, 36], "{:?}", counts(&fake));
        recorder.flush().await.unwrap();
        assert_eq!(counts(&fake), [36, 36, 6]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_series_whose_updates_are_refused_is_given_up_after_its_window_with_its_occurrences_counted_as_dropped()
     {
        let fake = FakeApiServer::new();
        fake.refuse("patch", EVENTS, 403);
        let recorder = recorder(&fake);
        publish(&recorder, "boom").await.unwrap();
        publish(&recorder, "boom").await.unwrap();
        // Nothing else is published for two hours.
        tokio::time::sleep(Duration::from_secs(2 * 60 * 60)).await;
        // The create, updates at 30 s, 90 s and 210 s (back-off 1, 2 and 4
        // min), and the final one at 450 s, past the 6 min window.
        assert_eq!(recorder.writes(), 5);
        assert_eq!(recorder.dropped_occurrences(), 1, "the unwritten second");
        assert_eq!(held(&recorder), 0, "the series is forgotten");
        assert_eq!(Arc::strong_count(&recorder.inner), 1, "its timer ended");
        assert_eq!(counts(&fake), [1]);
        // Nothing left to write.
        recorder.flush().await.unwrap();
        assert_eq!(recorder.writes(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorder_holds_at_most_4096_series_and_counts_the_occurrences_of_those_it_forgets() {
        let fake = FakeApiServer::new();
        let recorder = recorder(&fake);
        // 5 000 distinct events within one window, each twice: a create and
        // an occurrence that waits for the interval.
        for i in 0..5000 {
            let note = format!("boom {i}");
            publish(&recorder, &note).await.unwrap();
            publish(&recorder, &note).await.unwrap();
        }
        assert_eq!(held(&recorder), 4096);
        // Aborted timers end at the runtime's next turn.
        tokio::task::yield_now().await;
        assert!(
            Arc::strong_count(&recorder.inner) <= 1 + 4096,
            "one timer at most per series held: {}",
            Arc::strong_count(&recorder.inner)
        );
        recorder.flush().await.unwrap();
        let written: i32 = counts(&fake).iter().sum();
        assert_eq!(counts(&fake).len(), 5000);
        assert_eq!(
            u64::try_from(written).unwrap() + recorder.dropped_occurrences(),
            10_000,
            "every occurrence written or counted as dropped"
        );
        assert_eq!(recorder.dropped_occurrences(), 5000 - 4096);
    }

    #[tokio::test(start_paused = true)]
    async fn a_series_whose_write_is_held_past_its_window_still_writes_every_occurrence() {
        let fake = FakeApiServer::new();
        let recorder = Arc::new(recorder(&fake));
        fake.hold_writes();
        // The create is held; occurrences meanwhile are only counted.
        let create = tokio::spawn({
            let recorder = Arc::clone(&recorder);
            async move { publish(&recorder, "boom").await }
        });
        fake.wait_for_requests(1).await;
        for _ in 0..3 {
            publish(&recorder, "boom").await.unwrap();
        }
        // Past the window, with the create still held: a new series, whose
        // own create is held beside the first.
        tokio::time::sleep(Duration::from_secs(6 * 60)).await;
        let second = tokio::spawn({
            let recorder = Arc::clone(&recorder);
            async move { publish(&recorder, "boom").await }
        });
        fake.wait_for_requests(2).await;
        fake.release_writes();
        create.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        // The first series' last write (its timer's) carries the three.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(counts(&fake), [4, 1]);
        assert_eq!(recorder.writes(), 3);
        assert_eq!(fake.max_writes_in_flight(), 2, "one per series");
        assert_eq!(held(&recorder), 1, "the first series is forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_racing_a_series_timer_waits_for_its_write_and_sends_none_beside_it() {
        let fake = FakeApiServer::new();
        let recorder = Arc::new(recorder(&fake));
        for _ in 0..3 {
            publish(&recorder, "boom").await.unwrap();
        }
        // The timer's update, due at 30 s, is held.
        fake.hold_writes();
        tokio::time::sleep(Duration::from_secs(30)).await;
        fake.wait_for_requests(2).await;
        publish(&recorder, "boom").await.unwrap();
        let flush = tokio::spawn({
            let recorder = Arc::clone(&recorder);
            async move { recorder.flush().await }
        });
        tokio::task::yield_now().await;
        assert_eq!(
            fake.requests().len(),
            2,
            "the flush waits for the held update"
        );
        fake.release_writes();
        flush.await.unwrap().unwrap();
        // The held update wrote 3, the flush the fourth.
        assert_eq!(counts(&fake), [4]);
        assert_eq!(recorder.writes(), 3);
        assert_eq!(fake.max_writes_in_flight(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_series_whose_event_is_deleted_before_its_last_write_creates_it_again_with_the_full_count()
     {
        let fake = FakeApiServer::new();
        let recorder = recorder(&fake);
        for _ in 0..3 {
            publish(&recorder, "boom").await.unwrap();
        }
        fake.clear(EVENTS);
        // The window ends; the next occurrence starts a new Event, and the
        // old series' last write finds its Event gone.
        tokio::time::sleep(Duration::from_secs(6 * 60)).await;
        publish(&recorder, "boom").await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(counts(&fake), [3, 1]);
        assert_eq!(recorder.dropped_occurrences(), 0);
        assert_eq!(recorder.writes(), 4, "create, update (404), create, create");
    }

    #[tokio::test(start_paused = true)]
    async fn a_series_whose_creates_are_all_refused_is_given_up_with_every_occurrence_counted_as_dropped()
     {
        let fake = FakeApiServer::new();
        fake.refuse("create", EVENTS, 403);
        let recorder = recorder(&fake);
        for _ in 0..100 {
            let _ = publish(&recorder, "boom").await;
        }
        tokio::time::sleep(Duration::from_secs(2 * 60 * 60)).await;
        // The first create, then at 60 s, 180 s, 420 s (past the window:
        // the last).
        assert_eq!(recorder.writes(), 4);
        assert_eq!(recorder.dropped_occurrences(), 100);
        assert_eq!(held(&recorder), 0);
        assert_eq!(Arc::strong_count(&recorder.inner), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_event_finding_every_series_with_a_write_in_flight_is_dropped_and_counted() {
        let fake = FakeApiServer::new();
        let recorder = Arc::new(recorder(&fake));
        fake.hold_writes();
        let mut creates = tokio::task::JoinSet::new();
        for i in 0..MAX_SERIES {
            let recorder = Arc::clone(&recorder);
            creates.spawn(async move { publish(&recorder, &format!("boom {i}")).await });
        }
        fake.wait_for_requests(MAX_SERIES).await;
        publish(&recorder, "one too many").await.unwrap();
        assert_eq!(recorder.dropped_occurrences(), 1);
        assert_eq!(held(&recorder), MAX_SERIES);
        fake.release_writes();
        while let Some(result) = creates.join_next().await {
            result.unwrap().unwrap();
        }
        assert_eq!(counts(&fake).len(), MAX_SERIES);
    }

    #[tokio::test(start_paused = true)]
    async fn exported_metrics_count_the_drops_before_and_after_the_export() {
        let fake = FakeApiServer::new();
        fake.refuse("create", EVENTS, 403);
        let recorder = recorder(&fake).series_window(Duration::ZERO);
        // Each occurrence is a series of its own, whose only write is its
        // last.
        let _ = publish(&recorder, "boom").await;
        let metrics = Metrics::new();
        recorder.export_metrics(&metrics);
        let _ = publish(&recorder, "boom").await;
        assert_eq!(recorder.dropped_occurrences(), 2);
        let counter = metrics.event_dropped_occurrences("kinformer.dev/test");
        assert_eq!(counter.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn refused_writes_are_counted_as_denied_before_and_after_the_export() {
        let fake = FakeApiServer::new();
        fake.refuse("create", EVENTS, 403);
        let recorder = recorder(&fake).series_window(Duration::ZERO);
        assert!(publish(&recorder, "boom").await.is_err());
        let metrics = Metrics::new();
        recorder.export_metrics(&metrics);
        assert!(publish(&recorder, "boom").await.is_err());
        assert_eq!(recorder.denied_writes(), 2);
        assert_eq!(metrics.event_denied_writes("kinformer.dev/test").get(), 2);
        // A write that goes through is not a refusal.
        fake.clear_refusals();
        publish(&recorder, "fine").await.unwrap();
        assert_eq!(recorder.denied_writes(), 2);
    }

    #[test]
    fn the_wait_after_failures_doubles_per_failure_up_to_ten_intervals() {
        let s = Duration::from_secs;
        let waits: Vec<Duration> = (0..7).map(|n| delay_after(s(30), n)).collect();
        assert_eq!(
            waits,
            [s(30), s(60), s(120), s(240), s(300), s(300), s(300)]
        );
        // No overflow however many failures.
        assert_eq!(delay_after(s(30), u32::MAX), s(300));
        assert_eq!(delay_after(Duration::MAX, 3), Duration::MAX);
    }
}
