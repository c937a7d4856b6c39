//! Kubernetes Events (events.k8s.io/v1) from a controller, with client-go's
//! series aggregation so that a reconcile failing in a hot loop cannot flood
//! the API server.
//!
//! As client-go's `tools/events`: the first occurrence of an event creates
//! an Event; later occurrences of the *same* event (same object, type,
//! reason, action and note) become an `EventSeries` on that Event, whose
//! `count` and `lastObservedTime` are written at most once per
//! `series_interval` (30 s by default, client-go's heartbeat). Occurrences
//! in between are only counted, and [`EventRecorder::flush`] writes what is
//! still unwritten (call it on shutdown). An Event older than
//! `series_window` (6 min, client-go's) starts afresh.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube_client::Client;
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use tokio::time::Instant;
use tracing::warn;

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
    /// namespace and name of the Event on the server.
    namespace: String,
    name: String,
    first_seen: Instant,
    /// Occurrences so far, the first included.
    count: i32,
    /// Occurrences the server knows of.
    written: i32,
    last_write: Instant,
}

/// Publishes Events for one controller instance; see the module docs.
pub struct EventRecorder {
    client: Client,
    reporting_controller: String,
    reporting_instance: String,
    series_interval: Duration,
    series_window: Duration,
    series: Mutex<HashMap<EventKey, Series>>,
    writes: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("reporting_controller", &self.reporting_controller)
            .field("reporting_instance", &self.reporting_instance)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder reporting as `controller` (e.g. `kinformer.dev/service-strategy`)
    /// from `instance` (e.g. the pod name).
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Self {
            client,
            reporting_controller: controller.to_owned(),
            reporting_instance: instance.to_owned(),
            series_interval: Duration::from_secs(30),
            series_window: Duration::from_secs(6 * 60),
            series: Mutex::new(HashMap::new()),
            writes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How often a repeating event's series is written (30 s by default).
    pub fn series_interval(mut self, interval: Duration) -> Self {
        self.series_interval = interval;
        self
    }

    /// Writes (creates and series updates) sent to the server so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records one occurrence of an event about `regarding`, which must name
    /// the object's namespace (for namespaced objects) and name.
    pub async fn publish(
        &self,
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
        let due = {
            let mut series = self.series.lock();
            // Forget series past the window, so the map cannot grow for ever.
            let window = self.series_window;
            series.retain(|_, s| now.duration_since(s.first_seen) < window);
            match series.get_mut(&key) {
                Some(s) => {
                    s.count += 1;
                    (now.duration_since(s.last_write) >= self.series_interval)
                        .then(|| (s.namespace.clone(), s.name.clone(), s.count))
                }
                None => None,
            }
        };
        if let Some((namespace, name, count)) = due {
            return self.write_series(&key, &namespace, &name, count).await;
        }
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
        {
            // Claimed before the create, so that a concurrent occurrence
            // counts into this series instead of creating a second Event.
            let mut series = self.series.lock();
            if series.contains_key(&key) {
                return Ok(());
            }
            series.insert(
                key.clone(),
                Series {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    first_seen: now,
                    count: 1,
                    written: 0,
                    last_write: now,
                },
            );
        }
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
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
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        self.bump_writes();
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                if let Some(s) = self.series.lock().get_mut(&key) {
                    s.written = s.written.max(1);
                }
                Ok(())
            }
            Err(e) => {
                self.series.lock().remove(&key);
                Err(e)
            }
        }
    }

    /// Writes every series with occurrences the server does not know of yet.
    pub async fn flush(&self) -> Result<(), kube_client::Error> {
        let pending: Vec<(EventKey, String, String, i32)> = self
            .series
            .lock()
            .iter()
            .filter(|(_, s)| s.count > s.written)
            .map(|(k, s)| (k.clone(), s.namespace.clone(), s.name.clone(), s.count))
            .collect();
        for (key, namespace, name, count) in pending {
            self.write_series(&key, &namespace, &name, count).await?;
        }
        Ok(())
    }

    async fn write_series(
        &self,
        key: &EventKey,
        namespace: &str,
        name: &str,
        count: i32,
    ) -> Result<(), kube_client::Error> {
        let series = EventSeries {
            count,
            last_observed_time: MicroTime(Timestamp::now()),
        };
        let patch = serde_json::json!({ "series": series });
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        self.bump_writes();
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                if let Some(s) = self.series.lock().get_mut(key) {
                    s.written = s.written.max(count);
                    s.last_write = Instant::now();
                }
                Ok(())
            }
            Err(e) => {
                warn!(event = %name, error = %e, "cannot update the event series");
                Err(e)
            }
        }
    }

    fn bump_writes(&self) {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}
