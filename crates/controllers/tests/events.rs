//! The EventRecorder against a real kube-apiserver when the server refuses,
//! loses or is slow with a series' writes: the writes for one series stay
//! bounded (issue 23, defect 4); a series that ends with its window writes
//! its last count, or is given up and counted as dropped (issue 36).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use kinformer_controllers::{EventRecorder, EventType, NewEvent};
use kinformer_envtest::TestEnv;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, ListParams, PostParams};
use tokio::sync::watch;

mod common;
use common::{client_allowed_only, config_map, eventually, may, setup};

/// A ConfigMap `name` in `ns`, created for real, and a reference to it.
async fn regarding(client: &Client, ns: &str, name: &str) -> ObjectReference {
    let cm: ConfigMap = Api::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &config_map(name))
        .await
        .unwrap();
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        namespace: Some(ns.to_owned()),
        name: Some(name.to_owned()),
        uid: cm.metadata.uid,
        ..Default::default()
    }
}

async fn publish(recorder: &EventRecorder, regarding: &ObjectReference) -> kube_client::Result<()> {
    recorder
        .publish(
            regarding,
            NewEvent {
                type_: EventType::Warning,
                reason: "SyncFailed",
                action: "Sync",
                note: "boom",
            },
        )
        .await
}

async fn events(client: &Client, ns: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

fn is_status(result: &kube_client::Result<()>, code: u16) -> bool {
    matches!(result, Err(kube_client::Error::Api(s)) if s.code == code)
}

/// A client acting as `user` (the admin, impersonating), whom RBAC lets
/// create Events in `ns` but not patch them: every series update is
/// answered 403.
async fn create_only_client(admin: &Client, ns: &str, user: &str) -> Client {
    let events = ("events.k8s.io", "events");
    let client =
        client_allowed_only(admin, ns, ("events-create-only", user), events, &["create"]).await;
    assert!(!may(admin, ns, user, events, "patch").await);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_series_whose_updates_are_forbidden_gets_a_bounded_number_of_attempts_not_one_per_occurrence()
 {
    let (admin, ns) = setup("events-forbidden").await;
    let client = create_only_client(&admin, &ns, "kinformer-events-create-only").await;
    let target = regarding(&admin, &ns, "forbidden").await;
    let interval = Duration::from_secs(1);
    let recorder =
        EventRecorder::new(client, "kinformer.dev/test", "test-0").series_interval(interval);
    publish(&recorder, &target).await.unwrap();
    assert_eq!(recorder.writes(), 1, "the create");
    // Let the series become due, so that the next occurrence writes it.
    tokio::time::sleep(interval).await;

    let start = tokio::time::Instant::now();
    let mut refused = 0;
    for _ in 0..200 {
        let result = publish(&recorder, &target).await;
        if result.is_err() {
            assert!(is_status(&result, 403), "{result:?}");
            refused += 1;
        }
    }
    let elapsed = start.elapsed();
    let attempts = recorder.writes() - 1;
    eprintln!("200 occurrences, updates forbidden: {attempts} update attempts in {elapsed:?}");
    assert_eq!(attempts, refused, "each attempt was refused and said so");
    // Never more than one write per interval, whatever the answers (with
    // the back-off, fewer): one when the loop is faster than the interval.
    let bound = 1 + (elapsed.as_millis() / interval.as_millis()) as u64;
    assert!(
        (1..=bound).contains(&attempts),
        "{attempts} attempts in {elapsed:?} (at most {bound})"
    );

    // flush tries a failing series once per call, not in a loop.
    for _ in 0..2 {
        let before = recorder.writes();
        let result = recorder.flush().await;
        assert!(is_status(&result, 403), "{result:?}");
        assert_eq!(recorder.writes(), before + 1, "one attempt per flush");
    }

    // The Event is there, as created: the count could not be written.
    let events = events(&admin, &ns).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert!(events[0].series.is_none());
}

/// A plain-HTTP proxy in front of the API server (reached through an admin
/// client) that holds every PATCH until its gate opens and counts how many
/// PATCHes are in flight at once: a slow series update, without timing.
struct HoldingProxy {
    port: u16,
    upstream: Client,
    gate: watch::Sender<bool>,
    /// PATCH requests received so far.
    arrived: watch::Sender<usize>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

impl HoldingProxy {
    async fn start(upstream: Client) -> Arc<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Arc::new(Self {
            port: listener.local_addr().unwrap().port(),
            upstream,
            gate: watch::Sender::new(false),
            arrived: watch::Sender::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        });
        let this = Arc::clone(&proxy);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let this = Arc::clone(&this);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let this = Arc::clone(&this);
                        async move { Ok::<_, Infallible>(this.forward(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        proxy
    }

    /// A client through this proxy, with no credentials of its own (the
    /// proxy's upstream client is the admin).
    async fn client(&self) -> Client {
        let mut config = TestEnv::shared().await.unwrap().config();
        config.cluster_url = format!("http://127.0.0.1:{}", self.port).parse().unwrap();
        config.auth_info = Default::default();
        Client::try_from(config).unwrap()
    }

    fn open(&self) {
        self.gate.send_replace(true);
    }

    async fn forward(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let patch = parts.method == Method::PATCH;
        if patch {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            self.arrived.send_modify(|n| *n += 1);
            let _ = self.gate.subscribe().wait_for(|open| *open).await;
        }
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut out = Request::builder().method(parts.method.clone()).uri(path);
        for (name, value) in &parts.headers {
            if name != header::HOST && name != header::CONTENT_LENGTH && name != header::CONNECTION
            {
                out = out.header(name, value);
            }
        }
        let answer = self
            .upstream
            .send(out.body(kube_client::client::Body::from(body)).unwrap())
            .await
            .unwrap();
        let (mut parts, body) = answer.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        if patch {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        // Re-framed by hyper from the collected body.
        parts.headers.remove(header::TRANSFER_ENCODING);
        parts.headers.remove(header::CONTENT_LENGTH);
        Response::from_parts(parts, Full::new(body))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occurrences_that_find_a_series_write_in_flight_only_count_and_flush_waits_for_it() {
    let (admin, ns) = setup("events-inflight").await;
    let proxy = HoldingProxy::start(admin.clone()).await;
    let target = regarding(&admin, &ns, "slow").await;
    let interval = Duration::from_millis(300);
    let recorder = Arc::new(
        EventRecorder::new(proxy.client().await, "kinformer.dev/test", "test-0")
            .series_interval(interval),
    );
    // The create is a POST: it goes straight through.
    publish(&recorder, &target).await.unwrap();
    assert_eq!(recorder.writes(), 1);
    // Let the series become due, so that the next occurrence writes it.
    tokio::time::sleep(interval).await;

    // 50 concurrent occurrences; the series update(s) they send are held.
    let finished = watch::Sender::new(0usize);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (recorder, target, finished) =
            (Arc::clone(&recorder), target.clone(), finished.clone());
        tasks.spawn(async move {
            let result = publish(&recorder, &target).await;
            finished.send_modify(|n| *n += 1);
            result
        });
    }
    // Until each occurrence has either returned or has its PATCH held.
    let (mut done, mut held) = (finished.subscribe(), proxy.arrived.subscribe());
    tokio::time::timeout(Duration::from_secs(30), async {
        while *done.borrow_and_update() + *held.borrow_and_update() < 50 {
            tokio::select! {
                _ = done.changed() => {}
                _ = held.changed() => {}
            }
        }
    })
    .await
    .expect("every occurrence returned or has its write held");
    let held_patches = *proxy.arrived.borrow();

    // A flush now must not send a second update beside the held one. (A
    // wait that can only miss a second PATCH, never invent one.)
    let flush = tokio::spawn({
        let recorder = Arc::clone(&recorder);
        async move { recorder.flush().await }
    });
    let second = tokio::time::timeout(
        Duration::from_millis(500),
        proxy.arrived.subscribe().wait_for(|n| *n > held_patches),
    )
    .await
    .is_ok();

    proxy.open();
    while let Some(result) = tasks.join_next().await {
        result.unwrap().unwrap();
    }
    flush.await.unwrap().unwrap();
    let max = proxy.max_in_flight.load(Ordering::SeqCst);
    let patches = *proxy.arrived.borrow();
    eprintln!(
        "50 concurrent occurrences: {held_patches} updates held at once, \
         {max} in flight at most, {patches} in all with the flush"
    );
    assert_eq!(held_patches, 1, "one update for the 50 occurrences");
    assert!(!second, "the flush sent an update beside the one in flight");
    assert_eq!(max, 1, "updates in flight at once");
    assert_eq!(patches, 2, "the held update, then the flush's");
    assert_eq!(recorder.writes(), 3);
    // The flush wrote what the held update could not know of.
    let events = events(&admin, &ns).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].series.as_ref().map(|s| s.count), Some(51));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_event_is_created_again_by_the_next_due_series_write() {
    let (client, ns) = setup("events-deleted").await;
    let target = regarding(&client, &ns, "deleted").await;
    let interval = Duration::from_secs(1);
    let recorder = EventRecorder::new(client.clone(), "kinformer.dev/test", "test-0")
        .series_interval(interval);
    publish(&recorder, &target).await.unwrap();
    let created = events(&client, &ns).await;
    assert_eq!(created.len(), 1, "{created:#?}");
    let name = created[0].metadata.name.clone().unwrap();
    Api::<Event>::namespaced(client.clone(), &ns)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    // Let the series become due, so that the next occurrence writes it.
    tokio::time::sleep(interval).await;

    // The update is answered 404 and the same write creates the Event anew.
    publish(&recorder, &target).await.unwrap();
    assert_eq!(recorder.writes(), 3, "create, the update (404), create");
    let again = events(&client, &ns).await;
    assert_eq!(again.len(), 1, "{again:#?}");
    assert_eq!(again[0].metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(again[0].series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(again[0].event_time, created[0].event_time);

    // And the series goes on as usual on it: counted, then one update.
    for _ in 0..5 {
        publish(&recorder, &target).await.unwrap();
    }
    assert_eq!(recorder.writes(), 3, "not due: only counted");
    recorder.flush().await.unwrap();
    assert_eq!(recorder.writes(), 4);
    let later = events(&client, &ns).await;
    assert_eq!(later.len(), 1, "{later:#?}");
    assert_eq!(later[0].series.as_ref().map(|s| s.count), Some(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_warning_shows_its_count_within_the_interval_without_a_flush() {
    let (client, ns) = setup("events-timer").await;
    let target = regarding(&client, &ns, "repeated").await;
    let interval = Duration::from_secs(1);
    let recorder = EventRecorder::new(client.clone(), "kinformer.dev/test", "test-0")
        .series_interval(interval);
    // The create, then two occurrences only counted, and no more.
    for _ in 0..3 {
        publish(&recorder, &target).await.unwrap();
    }
    assert_eq!(recorder.writes(), 1, "not due: only counted");
    // No flush: the series' timer writes the count once the interval ends.
    eventually("the count on the server", async || {
        let events = events(&client, &ns).await;
        events.len() == 1 && events[0].series.as_ref().map(|s| s.count) == Some(3)
    })
    .await;
    assert_eq!(recorder.writes(), 2, "one update for both occurrences");
    // Nothing more to write: a flush sends nothing.
    recorder.flush().await.unwrap();
    assert_eq!(recorder.writes(), 2);
}

/// Each Event's count (1 without a series), oldest first.
fn counts(events: &[Event]) -> Vec<i32> {
    let mut events: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e.event_time.clone().map(|t| t.0),
                e.series.as_ref().map_or(1, |s| s.count),
            )
        })
        .collect();
    events.sort();
    events.into_iter().map(|(_, count)| count).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_series_split_at_its_window_writes_its_final_count_so_its_events_add_up_to_every_occurrence()
 {
    let (client, ns) = setup("events-window").await;
    let target = regarding(&client, &ns, "split").await;
    let window = Duration::from_secs(1);
    let recorder = EventRecorder::new(client.clone(), "kinformer.dev/test", "test-0")
        .series_interval(2 * window)
        .series_window(window);
    // The create, then three occurrences only counted: the series is next
    // due after its window.
    for _ in 0..4 {
        publish(&recorder, &target).await.unwrap();
    }
    assert_eq!(recorder.writes(), 1, "not due: only counted");
    tokio::time::sleep(window).await;
    // Past the window: this occurrence starts a new Event.
    publish(&recorder, &target).await.unwrap();
    // No flush: the old series' timer writes its final count.
    eventually("every occurrence counted on the server", async || {
        counts(&events(&client, &ns).await).iter().sum::<i32>() == 5
    })
    .await;
    assert_eq!(counts(&events(&client, &ns).await), [4, 1]);
    assert_eq!(recorder.writes(), 3, "two creates and the final update");
    assert_eq!(recorder.dropped_occurrences(), 0);
    // The old series is forgotten; the new one has nothing unwritten.
    recorder.flush().await.unwrap();
    assert_eq!(recorder.writes(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_series_whose_final_write_is_refused_is_given_up_and_its_occurrences_counted_as_dropped()
{
    let (admin, ns) = setup("events-given-up").await;
    let client = create_only_client(&admin, &ns, "kinformer-events-given-up").await;
    let target = regarding(&admin, &ns, "given-up").await;
    let window = Duration::from_secs(1);
    let recorder = EventRecorder::new(client, "kinformer.dev/test", "test-0")
        .series_interval(window)
        .series_window(window);
    // The create, then two occurrences only counted; the series' next
    // write is due when its window ends: its final one, refused.
    for _ in 0..3 {
        publish(&recorder, &target).await.unwrap();
    }
    eventually("the last write sent", async || recorder.writes() == 2).await;
    // Given up once that ends: a flush (which waits for it) has nothing to
    // write.
    recorder.flush().await.unwrap();
    assert_eq!(recorder.writes(), 2, "the create and the last update");
    assert_eq!(recorder.dropped_occurrences(), 2);
    // Every occurrence is on the server or counted as dropped.
    assert_eq!(counts(&events(&admin, &ns).await), [1]);
    // The next occurrence starts a new series.
    publish(&recorder, &target).await.unwrap();
    assert_eq!(recorder.writes(), 3);
    assert_eq!(counts(&events(&admin, &ns).await), [1, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_note_longer_than_the_server_takes_is_cut_and_its_event_written() {
    let (admin, ns) = setup("events-long-note").await;
    let target = regarding(&admin, &ns, "long-note").await;
    let recorder = EventRecorder::new(admin.clone(), "kinformer.dev/test", "test-0");
    // 2 000 bytes, with a two-byte character across the cut at 1 021.
    let note = format!("{}é{}", "x".repeat(1020), "y".repeat(978));
    recorder
        .publish(
            &target,
            NewEvent {
                type_: EventType::Warning,
                reason: "SyncFailed",
                action: "Sync",
                note: &note,
            },
        )
        .await
        .unwrap();
    let events = events(&admin, &ns).await;
    let written = events[0].note.as_deref().unwrap();
    assert_eq!(written, format!("{}...", "x".repeat(1020)));
    // A note within the limit is written as it is.
    let short = "é".repeat(512);
    recorder
        .publish(
            &target,
            NewEvent {
                type_: EventType::Warning,
                reason: "Other",
                action: "Sync",
                note: &short,
            },
        )
        .await
        .unwrap();
    let events = self::events(&admin, &ns).await;
    assert!(
        events
            .iter()
            .any(|e| e.note.as_deref() == Some(short.as_str()))
    );
}
