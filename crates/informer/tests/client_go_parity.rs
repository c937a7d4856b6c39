//! Two behaviours of client-go that kinformer once lacked (issue 23,
//! defect 6), against an in-memory ListerWatcher:
//! - a list refused with a Timeout whose message alone says "Too large
//!   resource version" (servers before 1.17 send no cause) is retried at
//!   once at resource version "" (client-go's `isTooLargeResourceVersionError`);
//! - a handler that panics waits before its next notification (client-go's
//!   `wait.Until(..., 1*time.Second, ...)` around the listener's run loop),
//!   so that a handler panicking on every object cannot spin a core, while
//!   the other handlers go on.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_informer::testing::{self, ScriptedListerWatcher};
use kinformer_informer::{
    CancellationToken, InformerError, ListPage, ListWatchError, ReflectorOptions,
    ResourceEventHandlerFuncs, SharedIndexInformer,
};
use tokio::sync::mpsc;

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

struct Harness {
    informer: SharedIndexInformer<ConfigMap>,
    lw: ScriptedListerWatcher<ConfigMap>,
    shutdown: CancellationToken,
}

/// An informer over `lists`, with list + watch (no streaming list) and the
/// default backoff, so that a retry after a backoff shows in the times.
fn harness(lists: Vec<Result<ListPage<ConfigMap>, ListWatchError>>) -> Harness {
    let lw = ScriptedListerWatcher::new();
    for list in lists {
        lw.script_list(list);
    }
    let mut reflector = ReflectorOptions::default();
    reflector.use_watch_list = false;
    Harness {
        informer: SharedIndexInformer::new(lw.clone(), common::options().reflector(reflector)),
        lw,
        shutdown: CancellationToken::new(),
    }
}

impl Harness {
    fn start(&self) -> tokio::task::JoinHandle<Result<(), InformerError>> {
        let informer = self.informer.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move { informer.run(shutdown).await })
    }
}

#[tokio::test(start_paused = true)]
async fn a_relist_refused_with_a_timeout_whose_message_says_too_large_resource_version_is_retried_at_once_at_an_empty_one()
 {
    // What an apiserver before 1.17 answers to a list at a version its
    // watch cache has not reached (`NewTimeoutError`): no cause, the words
    // only in the message.
    let too_large: kube_client::core::Status = serde_json::from_value(serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "Timeout: Too large resource version: 5, current: 4",
        "reason": "Timeout", "code": 504,
        "details": {"retryAfterSeconds": 1}
    }))
    .unwrap();
    let h = harness(vec![
        page(vec![cm("a", 5)], 5),
        Err(kube_client::Error::Api(Box::new(too_large)).into()),
        page(vec![cm("a", 5)], 9),
    ]);
    h.start();
    let w = h.lw.next_watch().await;
    w.fail(ListWatchError::Gone("too old resource version".into()));
    let _w2 = h.lw.next_watch().await;
    let versions: Vec<_> =
        h.lw.list_requests()
            .into_iter()
            .map(|r| r.resource_version)
            .collect();
    assert_eq!(versions, [Some("0".into()), Some("5".into()), None]);
    // At once: no backoff (800 ms at least) between the refused list and
    // the list at "".
    let at = h.lw.list_times();
    assert_eq!(at[2], at[1]);
    assert_eq!(h.lw.watch_requests()[1].resource_version, "9");
    h.shutdown.cancel();
}

/// Waits (up to 30 s) for the next message of a handler.
async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("the handler got nothing within 30 s")
        .expect("the handler is gone")
}

/// Waits (up to 10 s) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} did not happen within 10 s");
}

/// A handler that logs the name of each object added.
fn healthy() -> (
    ResourceEventHandlerFuncs<ConfigMap>,
    mpsc::UnboundedReceiver<String>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let handler = ResourceEventHandlerFuncs::new().on_add(move |o: &Arc<ConfigMap>, _| {
        let _ = tx.send(o.metadata.name.clone().unwrap_or_default());
    });
    (handler, rx)
}

/// A handler that says when it is called, then panics.
fn panicking() -> (
    ResourceEventHandlerFuncs<ConfigMap>,
    mpsc::UnboundedReceiver<Instant>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let handler = ResourceEventHandlerFuncs::new().on_add(move |_: &Arc<ConfigMap>, _| {
        let _ = tx.send(Instant::now());
        panic!("the handler broke");
    });
    (handler, rx)
}

fn three_objects() -> Vec<Result<ListPage<ConfigMap>, ListWatchError>> {
    vec![page(vec![cm("a", 1), cm("b", 2), cm("c", 3)], 3)]
}

async fn all_three(rx: &mut mpsc::UnboundedReceiver<String>) {
    let mut names = vec![next(rx).await, next(rx).await, next(rx).await];
    names.sort();
    assert_eq!(names, ["a", "b", "c"]);
}

// The listener threads are not tokio's, so their pause is real time: the
// test only asserts lower bounds, which a sleep cannot undercut.
#[tokio::test]
async fn a_handler_that_panics_on_every_object_waits_a_second_after_each_panic() {
    let h = harness(three_objects());
    let (handler, mut calls) = panicking();
    let broken = h.informer.add_event_handler(handler).unwrap();
    let (handler, mut names) = healthy();
    h.informer.add_event_handler(handler).unwrap();
    let run = h.start();
    let _w = h.lw.next_watch().await;
    all_three(&mut names).await;
    let first = next(&mut calls).await;
    let second = next(&mut calls).await;
    let third = next(&mut calls).await;
    assert!(
        second - first >= Duration::from_secs(1),
        "second notification {:?} after the first",
        second - first
    );
    assert!(
        third - second >= Duration::from_secs(1),
        "third notification {:?} after the second",
        third - second
    );
    until("the third panic counted", || broken.panics() == 3).await;
    assert_eq!(broken.handled(), 3);
    h.shutdown.cancel();
    assert!(run.await.unwrap().is_ok());
}

#[tokio::test]
async fn only_the_handler_that_panicked_waits_and_its_notifications_stay_buffered_until_the_informer_stops()
 {
    let h = harness(three_objects());
    let (handler, mut calls) = panicking();
    // Registered first, so that each notification reaches its buffer before
    // the healthy handler's.
    let broken = h
        .informer
        .add_event_handler(handler.panic_pause(Duration::from_secs(3600)))
        .unwrap();
    let (handler, mut names) = healthy();
    h.informer.add_event_handler(handler).unwrap();
    let run = h.start();
    let _w = h.lw.next_watch().await;
    // The healthy handler gets everything while the other one waits its hour.
    all_three(&mut names).await;
    next(&mut calls).await;
    until("the first panic counted", || broken.panics() >= 1).await;
    assert_eq!(broken.panics(), 1);
    assert_eq!(broken.handled(), 1);
    assert_eq!(broken.pending(), 2, "kept for after the pause");
    assert!(h.informer.has_synced());
    // Stopping the informer ends the pause: the handler's thread ends (and
    // drops the handler, closing its channel) without delivering the rest.
    h.shutdown.cancel();
    assert!(run.await.unwrap().is_ok());
    let ended = tokio::time::timeout(Duration::from_secs(10), calls.recv()).await;
    assert_eq!(
        ended,
        Ok(None),
        "the handler thread still waits after the stop"
    );
}

#[tokio::test]
async fn with_a_zero_pause_a_panicking_handler_gets_every_notification() {
    let h = harness(three_objects());
    let (handler, mut calls) = panicking();
    let broken = h
        .informer
        .add_event_handler(handler.panic_pause(Duration::ZERO))
        .unwrap();
    let run = h.start();
    let _w = h.lw.next_watch().await;
    for _ in 0..3 {
        next(&mut calls).await;
    }
    until("three panics counted", || broken.panics() == 3).await;
    h.shutdown.cancel();
    assert!(run.await.unwrap().is_ok());
}

/// client-go v0.37.2's TestSharedInformerWatchDisruption: after a watch is
/// lost, the relist tells a handler without a resync period only what
/// changed (pod2 updated, pod3 added), never the unchanged pod1 (a resync,
/// for handlers due one), on every queue.
#[tokio::test]
async fn a_relist_after_a_watch_disruption_tells_a_handler_without_resync_only_what_changed() {
    let h = harness(vec![
        page(vec![cm("pod1", 1), cm("pod2", 2)], 2),
        page(vec![cm("pod1", 1), cm("pod2", 4), cm("pod3", 3)], 4),
    ]);
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let (a, u, d) = (tx.clone(), tx.clone(), tx);
    let name = |c: &ConfigMap| c.metadata.name.clone().unwrap_or_default();
    let rv = |c: &ConfigMap| c.metadata.resource_version.clone().unwrap_or_default();
    h.informer
        .add_event_handler(
            ResourceEventHandlerFuncs::new()
                .on_add(move |o: &Arc<ConfigMap>, _| {
                    let _ = a.send(format!("add {}", name(o)));
                })
                .on_update(move |old, new| {
                    let _ = u.send(format!("update {} {}->{}", name(new), rv(old), rv(new)));
                })
                .on_delete(move |o| {
                    let _ = d.send(format!("delete {}", name(o.object())));
                }),
        )
        .unwrap();
    h.start();
    let w = h.lw.next_watch().await;
    let mut initial = [next(&mut rx).await, next(&mut rx).await];
    initial.sort();
    assert_eq!(initial, ["add pod1", "add pod2"]);
    w.fail(ListWatchError::Gone("too old resource version".into()));
    let _w2 = h.lw.next_watch().await;
    let mut relisted = [next(&mut rx).await, next(&mut rx).await];
    relisted.sort();
    assert_eq!(relisted, ["add pod3", "update pod2 2->4"]);
    let informer = h.informer.clone();
    until("the relist applied and told", move || {
        informer.queued() == 0 && informer.pending_notifications() == 0
    })
    .await;
    assert_eq!(rx.try_recv().ok(), None, "pod1 did not change");
    h.shutdown.cancel();
}
