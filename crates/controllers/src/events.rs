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
//! on shutdown). An Event older than `series_window` (6 min, client-go's)
//! starts afresh.
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
//!   fixed) from staying silent for long; with the 6 min window, a series
//!   whose updates are all refused costs its create and about three updates
//!   before it starts afresh. A failed write is not retried within itself
//!   (client-go retries transport errors 12 times, 10 s apart, in the
//!   background): the next due write is the retry.
//! - **A failed create keeps its series.** The occurrences are counted and
//!   the next due write creates the Event (with the count so far), instead
//!   of the very next occurrence creating again.
//! - **A deleted Event is created anew.** A series update answered 404 (the
//!   Event was deleted: by hand, or by the API server's event TTL) creates
//!   the Event again, same name, with the series in it, within the same
//!   write, as client-go's `recordEvent` does on a NotFound patch. A create
//!   answered 409 AlreadyExists (an earlier create whose answer was lost)
//!   counts as the Event existing; the count goes out with the next update.
//! - **`flush` writes each unwritten series at most once per call**, due or
//!   not (it is the last chance on shutdown), and waits for a write in
//!   flight to end instead of sending a second one beside it.
//!
//! [`EventRecorder::writes`] counts every request sent, refused or not.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube_client::Client;
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::warn;

/// The back-off after failed writes stops growing at this many series
/// intervals; see the module docs.
const MAX_BACKOFF_INTERVALS: u32 = 10;

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
    /// The Event as first created (no series), to create it again if it is
    /// gone. Its metadata names it on the server; the name is unique per
    /// series (it carries the first occurrence's time in nanoseconds).
    event: Event,
    first_seen: Instant,
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
    /// The earliest time of the next write from `publish`.
    next_write: Instant,
    /// A timer will write the occurrences counted since the last write
    /// once `next_write` comes.
    timer: bool,
}

impl Series {
    fn name(&self) -> &str {
        self.event.metadata.name.as_deref().unwrap_or_default()
    }

    /// Marks a write in flight and returns what it is to send.
    fn claim(&mut self) -> Claim {
        self.in_flight = true;
        Claim {
            event: self.event.clone(),
            count: self.count,
            created: self.created,
        }
    }
}

/// What one write sends: taken under the lock, sent without it.
struct Claim {
    event: Event,
    count: i32,
    created: bool,
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
    series_interval: std::sync::atomic::AtomicU64,
    series_window: Duration,
    series: Mutex<HashMap<EventKey, Series>>,
    writes: std::sync::atomic::AtomicU64,
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
    name: &'a str,
    count: i32,
    settled: bool,
}

impl InFlight<'_> {
    fn settle(&mut self, outcome: Outcome) -> Duration {
        self.settled = true;
        self.recorder
            .settle(self.key, self.name, self.count, outcome)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.recorder.settle(
                self.key,
                self.name,
                self.count,
                Outcome::Failed { gone: false },
            );
        }
    }
}

impl EventRecorder {
    /// A recorder reporting as `controller` (e.g. `kinformer.dev/service-strategy`)
    /// from `instance` (e.g. the pod name).
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Self {
            inner: Arc::new(Recorder {
                client,
                reporting_controller: controller.to_owned(),
                reporting_instance: instance.to_owned(),
                series_interval: std::sync::atomic::AtomicU64::new(30_000_000_000),
                series_window: Duration::from_secs(6 * 60),
                series: Mutex::new(HashMap::new()),
                writes: std::sync::atomic::AtomicU64::new(0),
                settled: watch::Sender::new(0),
            }),
        }
    }

    /// How often a repeating event's series is written (30 s by default);
    /// also the unit of the back-off after failed writes (module docs).
    #[must_use]
    pub fn series_interval(self, interval: Duration) -> Self {
        let nanos = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
        self.inner
            .series_interval
            .store(nanos, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// Requests sent to the server so far (creates and series updates),
    /// whether they succeeded or not.
    pub fn writes(&self) -> u64 {
        self.inner.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records one occurrence of an event about `regarding`, which must name
    /// the object's namespace (for namespaced objects) and name.
    ///
    /// Returns the error of the write this occurrence made, if it made one
    /// and it failed; an occurrence that is only counted returns `Ok` (its
    /// count is written when its series' interval ends).
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), kube_client::Error> {
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

impl Recorder {
    async fn publish(
        self: &Arc<Self>,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), kube_client::Error> {
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
            note: note.to_owned(),
        };
        let now = Instant::now();
        let claim = {
            let mut series = self.series.lock();
            // Forget series past the window, so the map cannot grow for ever;
            // not one with a write in flight, whose end must find it (and a
            // new series beside it would be a second write in flight).
            let window = self.series_window;
            series.retain(|_, s| s.in_flight || now.duration_since(s.first_seen) < window);
            match series.get_mut(&key) {
                Some(s) => {
                    s.count = s.count.saturating_add(1);
                    if s.in_flight {
                        // Its end sets the timer if this goes unwritten.
                        return Ok(());
                    }
                    if now < s.next_write {
                        self.set_timer(&key, s);
                        return Ok(());
                    }
                    s.claim()
                }
                None => {
                    // Claimed (in flight) before the create is sent, so that
                    // a concurrent occurrence counts into this series instead
                    // of creating a second Event.
                    let mut s = Series {
                        event: self.new_event(regarding, type_, reason, action, note),
                        first_seen: now,
                        count: 1,
                        written: 0,
                        created: false,
                        in_flight: false,
                        failures: 0,
                        next_write: now,
                        timer: false,
                    };
                    let claim = s.claim();
                    series.insert(key.clone(), s);
                    claim
                }
            }
        };
        self.write(&key, claim).await
    }

    async fn flush(self: &Arc<Self>) -> Result<(), kube_client::Error> {
        let pending: Vec<EventKey> = self
            .series
            .lock()
            .iter()
            .filter(|(_, s)| s.count > s.written)
            .map(|(k, _)| k.clone())
            .collect();
        let mut first_error = None;
        for key in pending {
            let claim = loop {
                // Taken before looking, so that a write ending after the
                // look still wakes us.
                let mut ended = self.settled.subscribe();
                {
                    let mut series = self.series.lock();
                    match series.get_mut(&key) {
                        Some(s) if s.count > s.written && !s.in_flight => break Some(s.claim()),
                        Some(s) if s.in_flight => {}
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
        if s.timer || s.count <= s.written {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        s.timer = true;
        let (recorder, key, due) = (Arc::clone(self), key.clone(), s.next_write);
        runtime.spawn(async move { recorder.on_timer(key, due).await });
    }

    /// A series' timer: writes what is unwritten once due, unless a write
    /// is in flight (its end sets the timer again if needed).
    async fn on_timer(self: Arc<Self>, key: EventKey, mut due: Instant) {
        loop {
            tokio::time::sleep_until(due).await;
            let claim = {
                let mut series = self.series.lock();
                let Some(s) = series.get_mut(&key) else {
                    return;
                };
                if s.in_flight || s.count <= s.written {
                    s.timer = false;
                    return;
                }
                if Instant::now() < s.next_write {
                    // A failed write pushed it back.
                    due = s.next_write;
                    continue;
                }
                s.timer = false;
                s.claim()
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
            name: claim.name(),
            count: claim.count,
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
        let next_in = flight.settle(outcome);
        if let Err(e) = &result {
            warn!(
                event = %claim.name(),
                count = claim.count,
                error = %e,
                next_attempt_in = ?next_in,
                "cannot write the event"
            );
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

    /// Ends the write in flight for the series `key` named `name` (not a
    /// later series of the same key) and schedules its next write; returns
    /// how long until then.
    fn settle(
        self: &Arc<Self>,
        key: &EventKey,
        name: &str,
        count: i32,
        outcome: Outcome,
    ) -> Duration {
        let delay = {
            let mut series = self.series.lock();
            match series.get_mut(key) {
                Some(s) if s.name() == name => {
                    s.in_flight = false;
                    match outcome {
                        Outcome::Written => {
                            s.created = true;
                            s.written = s.written.max(count);
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
                    let interval = Duration::from_nanos(
                        self.series_interval
                            .load(std::sync::atomic::Ordering::Relaxed),
                    );
                    let delay = delay_after(interval, s.failures);
                    s.next_write = Instant::now() + delay;
                    // Occurrences counted while it was in flight.
                    self.set_timer(key, s);
                    delay
                }
                _ => Duration::ZERO,
            }
        };
        self.settled.send_modify(|n| *n = n.wrapping_add(1));
        delay
    }

    fn bump_writes(&self) {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
    use super::*;

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
