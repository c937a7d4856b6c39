//! Black-box tests of the DeltaFifo, after client-go's delta_fifo_test.go.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_fifo::{
    DeltaFifo, DeltaFifoOptions, DeltaType, Deltas, FifoError, ObjectOrTombstone, PopError, Requeue,
};
use kinformer_store::Indexer;

fn pod(name: &str, rv: u32) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            resource_version: Some(rv.to_string()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    })
}

fn rv(obj: &ObjectOrTombstone<Pod>) -> u32 {
    obj.object()
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// (kind, resource version, is tombstone) of each delta.
type Summary = Vec<(DeltaType, u32, bool)>;

fn summary(deltas: &Deltas<Pod>) -> Summary {
    deltas
        .iter()
        .map(|d| (d.kind, rv(&d.object), d.object.is_tombstone()))
        .collect()
}

/// Pops one key, returning its key and deltas summary.
async fn pop(fifo: &DeltaFifo<Pod>) -> (String, Summary) {
    tokio::time::timeout(
        Duration::from_secs(5),
        fifo.pop(|deltas, _| {
            let key = format!(
                "ns/{}",
                deltas
                    .newest()
                    .unwrap()
                    .object
                    .object()
                    .metadata
                    .name
                    .as_deref()
                    .unwrap()
            );
            Ok::<_, Requeue<()>>((key, summary(deltas)))
        }),
    )
    .await
    .expect("pop timed out")
    .unwrap()
}

async fn pop_all(fifo: &DeltaFifo<Pod>) -> Vec<(String, Summary)> {
    let mut out = Vec::new();
    while !fifo.is_empty() {
        out.push(pop(fifo).await);
    }
    out
}

fn with_known(known: &Arc<Indexer<Pod>>) -> DeltaFifo<Pod> {
    DeltaFifo::with_options(DeltaFifoOptions::new().known_objects(known.clone()))
}

#[tokio::test]
async fn keys_pop_in_fifo_order_with_their_deltas_in_order() {
    let fifo = DeltaFifo::new();
    fifo.add(pod("a", 1)).unwrap();
    fifo.add(pod("b", 1)).unwrap();
    fifo.update(pod("a", 2)).unwrap();
    fifo.delete(pod("a", 3)).unwrap();
    assert_eq!(fifo.list_keys(), ["ns/a", "ns/b"]);
    let popped = pop_all(&fifo).await;
    assert_eq!(
        popped,
        vec![
            (
                "ns/a".to_string(),
                vec![
                    (DeltaType::Added, 1, false),
                    (DeltaType::Updated, 2, false),
                    (DeltaType::Deleted, 3, false)
                ]
            ),
            ("ns/b".to_string(), vec![(DeltaType::Added, 1, false)]),
        ]
    );
}

#[tokio::test]
async fn a_key_readded_while_queued_keeps_its_place() {
    let fifo = DeltaFifo::new();
    fifo.add(pod("a", 1)).unwrap();
    fifo.add(pod("b", 1)).unwrap();
    fifo.update(pod("a", 2)).unwrap();
    fifo.update(pod("b", 2)).unwrap();
    fifo.update(pod("a", 3)).unwrap();
    assert_eq!(fifo.list_keys(), ["ns/a", "ns/b"]);
    assert_eq!(fifo.len(), 2);
}

#[tokio::test]
async fn two_consecutive_deletes_collapse_keeping_the_known_final_state() {
    let fifo = DeltaFifo::new();
    fifo.add(pod("a", 1)).unwrap();
    fifo.delete(pod("a", 2)).unwrap();
    fifo.delete(pod("a", 3)).unwrap();
    let (_, s) = pop(&fifo).await;
    assert_eq!(
        s,
        vec![(DeltaType::Added, 1, false), (DeltaType::Deleted, 2, false)]
    );

    // A tombstone followed by a real delete: the real one wins.
    let known = Arc::new(Indexer::new());
    known.add(pod("t", 5)).unwrap();
    let fifo = with_known(&known);
    fifo.replace(vec![], "9").unwrap();
    fifo.delete(pod("t", 6)).unwrap();
    let (_, s) = pop(&fifo).await;
    assert_eq!(s, vec![(DeltaType::Deleted, 6, false)]);
}

#[tokio::test]
async fn delete_of_an_unknown_unqueued_object_is_ignored() {
    let fifo = DeltaFifo::new();
    fifo.delete(pod("x", 1)).unwrap();
    assert!(fifo.is_empty());

    let known = Arc::new(Indexer::new());
    known.add(pod("k", 1)).unwrap();
    let fifo = with_known(&known);
    fifo.delete(pod("x", 1)).unwrap();
    assert!(fifo.is_empty());
    fifo.delete(pod("k", 2)).unwrap();
    assert_eq!(fifo.list_keys(), ["ns/k"]);
}

#[tokio::test]
async fn replace_makes_deletions_for_known_keys_missing_from_the_list() {
    let known = Arc::new(Indexer::new());
    for name in ["keep", "gone"] {
        known.add(pod(name, 1)).unwrap();
    }
    let fifo = with_known(&known);
    // A key only in the queue, absent from the list, is deleted too.
    fifo.add(pod("queued", 3)).unwrap();
    fifo.replace(vec![pod("keep", 2), pod("new", 2)], "10")
        .unwrap();
    let mut popped = pop_all(&fifo).await;
    popped.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        popped,
        vec![
            ("ns/gone".to_string(), vec![(DeltaType::Deleted, 1, true)]),
            ("ns/keep".to_string(), vec![(DeltaType::Replaced, 2, false)]),
            ("ns/new".to_string(), vec![(DeltaType::Replaced, 2, false)]),
            (
                "ns/queued".to_string(),
                vec![(DeltaType::Added, 3, false), (DeltaType::Deleted, 3, true)]
            ),
        ]
    );
}

#[tokio::test]
async fn replace_tombstone_carries_the_key_and_last_known_state() {
    let known = Arc::new(Indexer::new());
    known.add(pod("gone", 7)).unwrap();
    let fifo = with_known(&known);
    fifo.replace(vec![], "10").unwrap();
    let key = fifo
        .pop(|deltas, _| match &deltas.newest().unwrap().object {
            ObjectOrTombstone::Tombstone(t) => {
                assert_eq!(t.obj.metadata.resource_version.as_deref(), Some("7"));
                Ok::<_, Requeue<()>>(t.key.clone())
            }
            other => panic!("expected a tombstone, got {other:?}"),
        })
        .await
        .unwrap();
    assert_eq!(key, "ns/gone");
}

#[tokio::test]
async fn replace_without_known_objects_deletes_queued_keys_missing_from_the_list() {
    let fifo = DeltaFifo::new();
    fifo.add(pod("a", 1)).unwrap();
    fifo.add(pod("b", 1)).unwrap();
    fifo.replace(vec![pod("a", 2)], "5").unwrap();
    let popped = pop_all(&fifo).await;
    assert_eq!(
        popped[0].1,
        vec![
            (DeltaType::Added, 1, false),
            (DeltaType::Replaced, 2, false)
        ]
    );
    assert_eq!(
        popped[1].1,
        vec![(DeltaType::Added, 1, false), (DeltaType::Deleted, 1, true)]
    );
}

#[tokio::test]
async fn legacy_mode_replace_emits_sync_deltas() {
    let fifo = DeltaFifo::with_options(DeltaFifoOptions::new().legacy_sync_on_replace());
    fifo.replace(vec![pod("a", 1)], "1").unwrap();
    assert_eq!(pop(&fifo).await.1, vec![(DeltaType::Sync, 1, false)]);
}

#[tokio::test]
async fn resync_queues_sync_for_known_objects_without_pending_deltas() {
    let known = Arc::new(Indexer::new());
    known.add(pod("idle", 1)).unwrap();
    known.add(pod("busy", 1)).unwrap();
    let fifo = with_known(&known);
    fifo.update(pod("busy", 2)).unwrap();
    fifo.resync().unwrap();
    let mut popped = pop_all(&fifo).await;
    popped.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        popped,
        vec![
            ("ns/busy".to_string(), vec![(DeltaType::Updated, 2, false)]),
            ("ns/idle".to_string(), vec![(DeltaType::Sync, 1, false)]),
        ]
    );
}

#[tokio::test]
async fn resync_without_known_objects_does_nothing() {
    let fifo = DeltaFifo::<Pod>::new();
    fifo.resync().unwrap();
    assert!(fifo.is_empty());
}

#[tokio::test]
async fn requeue_on_pop_puts_the_deltas_back_unless_requeued_meanwhile() {
    let fifo = DeltaFifo::new();
    fifo.add(pod("a", 1)).unwrap();
    let res: Result<(), _> = fifo.pop(|_, _| Err(Requeue("boom"))).await;
    assert_eq!(res, Err(PopError::Requeued("boom")));
    assert_eq!(fifo.list_keys(), ["ns/a"]);
    assert_eq!(pop(&fifo).await.1, vec![(DeltaType::Added, 1, false)]);

    // Taken out by other means, then put back while a newer delta is queued:
    // the newer deltas win.
    fifo.add(pod("b", 1)).unwrap();
    let old = fifo.get_by_key("ns/b").unwrap();
    pop(&fifo).await;
    fifo.update(pod("b", 2)).unwrap();
    fifo.requeue("ns/b", old);
    assert_eq!(pop(&fifo).await.1, vec![(DeltaType::Updated, 2, false)]);
}

#[tokio::test]
async fn has_synced_once_the_first_replace_is_popped() {
    let known = Arc::new(Indexer::new());
    known.add(pod("stale", 1)).unwrap();
    let fifo = with_known(&known);
    assert!(!fifo.has_synced());
    fifo.replace(vec![pod("a", 1), pod("b", 1)], "3").unwrap();
    assert!(!fifo.has_synced());
    // Events after the replace do not extend the initial population.
    fifo.add(pod("c", 4)).unwrap();
    let mut initial = Vec::new();
    for _ in 0..3 {
        let was_initial = fifo
            .pop(|_, initial| Ok::<_, Requeue<()>>(initial))
            .await
            .unwrap();
        initial.push(was_initial);
    }
    // Three keys of the first replace: a, b and the synthetic delete of stale.
    assert_eq!(initial, [true, true, true]);
    assert!(fifo.has_synced());
    assert!(
        !fifo
            .pop(|_, initial| Ok::<_, Requeue<()>>(initial))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn has_synced_after_an_add_that_came_before_any_replace() {
    let fifo = DeltaFifo::new();
    fifo.add(pod("a", 1)).unwrap();
    assert!(fifo.has_synced());
    fifo.replace(vec![pod("a", 2)], "2").unwrap();
    assert!(fifo.has_synced());
}

#[tokio::test]
async fn replace_with_an_empty_list_is_synced_at_once() {
    let fifo = DeltaFifo::<Pod>::new();
    fifo.replace(vec![], "1").unwrap();
    assert!(fifo.has_synced());
}

#[tokio::test]
async fn pop_waits_for_an_add() {
    let fifo = Arc::new(DeltaFifo::new());
    let consumer = {
        let fifo = Arc::clone(&fifo);
        tokio::spawn(async move { pop(&fifo).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!consumer.is_finished());
    fifo.add(pod("late", 1)).unwrap();
    assert_eq!(consumer.await.unwrap().0, "ns/late");
}

#[tokio::test]
async fn close_wakes_a_waiting_pop_with_a_closed_error() {
    let fifo = Arc::new(DeltaFifo::<Pod>::new());
    let consumer = {
        let fifo = Arc::clone(&fifo);
        tokio::spawn(async move { fifo.pop(|_, _| Ok::<_, Requeue<()>>(())).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    fifo.close();
    let res = tokio::time::timeout(Duration::from_secs(5), consumer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res, Err(PopError::Closed));
    assert_eq!(PopError::<()>::Closed.to_string(), "DeltaFifo is closed");
}

#[tokio::test]
async fn close_still_hands_out_what_was_queued() {
    let fifo = DeltaFifo::new();
    fifo.add(pod("a", 1)).unwrap();
    fifo.close();
    assert!(fifo.is_closed());
    assert_eq!(pop(&fifo).await.0, "ns/a");
    assert_eq!(
        fifo.pop(|_, _| Ok::<_, Requeue<()>>(())).await,
        Err(PopError::Closed)
    );
}

#[tokio::test]
async fn object_without_name_is_an_error_naming_it_and_nothing_is_lost() {
    let fifo = DeltaFifo::new();
    fifo.add(pod("a", 1)).unwrap();
    let nameless = Arc::new(Pod {
        metadata: ObjectMeta {
            namespace: Some("web".into()),
            resource_version: Some("3".into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    });
    let err = fifo.add(nameless.clone()).unwrap_err();
    // Named by the cause, the key's error, which is the source.
    assert_eq!(err.to_string(), "cannot queue object");
    assert!(named_by_source(&err, "\"web\""), "{err:?}");
    let err = fifo.replace(vec![pod("b", 1), nameless], "4").unwrap_err();
    assert!(
        matches!(err, FifoError::ReplaceKey { index: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("item 1"), "{err}");
    // The replace was refused whole: only the earlier add is queued.
    assert_eq!(fifo.list_keys(), ["ns/a"]);
    assert_eq!(pop(&fifo).await.1, vec![(DeltaType::Added, 1, false)]);
}

/// Whether `err`'s source, not `err` itself, says `name`.
fn named_by_source(err: &FifoError, name: &str) -> bool {
    let source = std::error::Error::source(err).map(|s| s.to_string());
    !err.to_string().contains(name) && source.is_some_and(|s| s.contains(name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_producers_lose_no_delta() {
    const PRODUCERS: usize = 4;
    const PER: u32 = 2_000;
    let fifo = Arc::new(DeltaFifo::new());
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let fifo = Arc::clone(&fifo);
            tokio::spawn(async move {
                for i in 1..=PER {
                    fifo.update(pod(&format!("p{p}-{}", i % 10), i)).unwrap();
                    if i % 100 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    let consumer = {
        let fifo = Arc::clone(&fifo);
        tokio::spawn(async move {
            let mut seen = 0u32;
            while let Ok(n) = fifo.pop(|d, _| Ok::<_, Requeue<()>>(d.len() as u32)).await {
                seen += n;
            }
            seen
        })
    };
    for p in producers {
        p.await.unwrap();
    }
    fifo.close();
    assert_eq!(consumer.await.unwrap(), PRODUCERS as u32 * PER);
}

/// Known `keep` and `gone` at version 1, and `queued` added at 3.
fn relist_start() -> (Arc<Indexer<Pod>>, DeltaFifo<Pod>) {
    let known = Arc::new(Indexer::new());
    for name in ["keep", "gone"] {
        known.add(pod(name, 1)).unwrap();
    }
    let fifo = with_known(&known);
    fifo.add(pod("queued", 3)).unwrap();
    (known, fifo)
}

#[tokio::test]
async fn a_replace_pushed_object_by_object_queues_what_a_whole_replace_queues() {
    let list = || vec![pod("keep", 2), pod("new", 2), pod("keep", 4)];
    let (_known_whole, whole) = relist_start();
    whole.replace(list(), "10").unwrap();
    let (_known_pushed, pushed) = relist_start();
    let mut replace = pushed.begin_replace();
    for obj in list() {
        replace.push(obj).unwrap();
    }
    assert_eq!(replace.len(), 2, "distinct keys");
    replace.finish("10");
    assert_eq!(pushed.list_keys(), whole.list_keys());
    for key in whole.list_keys() {
        assert_eq!(
            summary(&pushed.get_by_key(&key).unwrap()),
            summary(&whole.get_by_key(&key).unwrap()),
            "{key}"
        );
    }
    assert_eq!(pop_all(&pushed).await, pop_all(&whole).await);
}

#[tokio::test]
async fn objects_pushed_into_a_replace_pop_before_it_finishes_and_deletions_wait_for_its_end() {
    let (known, fifo) = relist_start();
    assert_eq!(pop(&fifo).await.0, "ns/queued");
    known.add(pod("queued", 3)).unwrap();
    let mut replace = fifo.begin_replace();
    replace.push(pod("keep", 2)).unwrap();
    // The consumer applies the listed object while the list goes on ...
    assert_eq!(
        pop(&fifo).await,
        ("ns/keep".to_string(), vec![(DeltaType::Replaced, 2, false)])
    );
    // ... and nothing is inferred deleted from part of a list.
    assert!(fifo.is_empty(), "{:?}", fifo.list_keys());
    replace.push(pod("queued", 5)).unwrap();
    replace.finish("10");
    let mut popped = pop_all(&fifo).await;
    popped.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        popped,
        vec![
            ("ns/gone".to_string(), vec![(DeltaType::Deleted, 1, true)]),
            (
                "ns/queued".to_string(),
                vec![(DeltaType::Replaced, 5, false)]
            ),
        ]
    );
}

#[tokio::test]
async fn has_synced_waits_for_the_first_replace_to_finish_even_with_everything_pushed_popped() {
    let fifo = DeltaFifo::new();
    let mut replace = fifo.begin_replace();
    replace.push(pod("a", 1)).unwrap();
    let initial = fifo
        .pop(|_, initial| Ok::<_, Requeue<()>>(initial))
        .await
        .unwrap();
    assert!(initial, "popped during the first list");
    assert!(!fifo.has_synced(), "the list is not complete");
    replace.push(pod("b", 1)).unwrap();
    replace.finish("2");
    assert!(!fifo.has_synced(), "b is still queued");
    let initial = fifo
        .pop(|_, initial| Ok::<_, Requeue<()>>(initial))
        .await
        .unwrap();
    assert!(initial);
    assert!(fifo.has_synced());
}

#[tokio::test]
async fn a_replace_dropped_half_way_keeps_what_was_pushed_and_infers_no_deletion() {
    let known = Arc::new(Indexer::new());
    known.add(pod("gone", 1)).unwrap();
    let fifo = with_known(&known);
    let mut replace = fifo.begin_replace();
    replace.push(pod("a", 2)).unwrap();
    drop(replace);
    assert!(!fifo.has_synced());
    assert_eq!(
        pop_all(&fifo).await,
        vec![("ns/a".to_string(), vec![(DeltaType::Replaced, 2, false)])]
    );
    assert!(!fifo.has_synced(), "no list has completed");
    known.add(pod("a", 2)).unwrap();
    // The next list completes: now `gone` is found missing.
    fifo.replace(vec![pod("a", 3)], "4").unwrap();
    let mut popped = pop_all(&fifo).await;
    popped.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        popped,
        vec![
            ("ns/a".to_string(), vec![(DeltaType::Replaced, 3, false)]),
            ("ns/gone".to_string(), vec![(DeltaType::Deleted, 1, true)]),
        ]
    );
    assert!(fifo.has_synced());
}

#[tokio::test]
async fn a_replace_refuses_an_object_without_a_key_naming_it_and_goes_on() {
    let fifo = DeltaFifo::new();
    let nameless = Arc::new(Pod {
        metadata: ObjectMeta {
            namespace: Some("web".into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    });
    let mut replace = fifo.begin_replace();
    replace.push(pod("a", 1)).unwrap();
    let err = replace.push(nameless).unwrap_err();
    assert!(
        matches!(err, FifoError::ReplaceKey { index: 1, .. }),
        "{err}"
    );
    assert!(named_by_source(&err, "\"web\""), "{err:?}");
    replace.push(pod("b", 1)).unwrap();
    replace.finish("2");
    assert_eq!(fifo.list_keys(), ["ns/a", "ns/b"]);
}

#[tokio::test]
async fn a_replace_takes_a_batch_under_one_lock_refusing_only_its_objects_without_a_key() {
    let known = Arc::new(Indexer::new());
    known.add(pod("gone", 1)).unwrap();
    let fifo = with_known(&known);
    let nameless = Arc::new(Pod {
        metadata: ObjectMeta {
            namespace: Some("web".into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    });
    let mut replace = fifo.begin_replace();
    replace.push(pod("a", 1)).unwrap();
    let refused = replace.push_all(vec![pod("b", 1), nameless, pod("c", 1)]);
    assert_eq!(refused.len(), 1, "{refused:?}");
    // Its position among all the objects pushed: a, b, then it.
    assert!(
        matches!(refused[0], FifoError::ReplaceKey { index: 2, .. }),
        "{}",
        refused[0]
    );
    assert_eq!(fifo.list_keys(), ["ns/a", "ns/b", "ns/c"]);
    replace.finish("2");
    assert_eq!(fifo.list_keys(), ["ns/a", "ns/b", "ns/c", "ns/gone"]);
}

#[tokio::test]
async fn a_restarted_replace_finds_deleted_what_only_its_first_attempt_listed() {
    let fifo = DeltaFifo::new();
    let mut replace = fifo.begin_replace();
    replace.push(pod("p0", 1)).unwrap();
    replace.push(pod("p1", 1)).unwrap();
    // The list fell back to another one, which no longer has p0.
    replace.restart();
    replace.push(pod("p1", 2)).unwrap();
    replace.finish("3");
    assert_eq!(
        pop_all(&fifo).await,
        vec![
            (
                "ns/p0".to_string(),
                vec![
                    (DeltaType::Replaced, 1, false),
                    (DeltaType::Deleted, 1, true)
                ]
            ),
            (
                "ns/p1".to_string(),
                vec![
                    (DeltaType::Replaced, 1, false),
                    (DeltaType::Replaced, 2, false)
                ]
            ),
        ]
    );
}

#[tokio::test]
async fn a_requeue_during_the_first_replace_does_not_sync_the_queue_before_it_finishes() {
    let fifo = DeltaFifo::new();
    let mut replace = fifo.begin_replace();
    replace.push_all(vec![pod("a", 1), pod("b", 1)]);
    let requeued = fifo.pop(|_, _| Err::<(), _>(Requeue("try again"))).await;
    assert_eq!(requeued, Err(PopError::Requeued("try again")));
    // b, then a again: everything pushed so far is popped.
    for _ in 0..2 {
        let initial = fifo
            .pop(|_, initial| Ok::<_, Requeue<()>>(initial))
            .await
            .unwrap();
        assert!(initial);
    }
    assert!(!fifo.has_synced(), "the first list is not complete");
    replace.push(pod("c", 1)).unwrap();
    replace.finish("2");
    assert!(!fifo.has_synced(), "c is queued");
    let initial = fifo
        .pop(|_, initial| Ok::<_, Requeue<()>>(initial))
        .await
        .unwrap();
    assert!(initial);
    assert!(fifo.has_synced());
}

#[tokio::test]
async fn a_replace_infers_no_deletion_for_a_key_whose_listed_object_could_not_be_read() {
    let known = Arc::new(Indexer::new());
    for name in ["unreadable", "gone"] {
        known.add(pod(name, 1)).unwrap();
    }
    let fifo = with_known(&known);
    let mut replace = fifo.begin_replace();
    replace.push(pod("a", 2)).unwrap();
    replace.keep("ns/unreadable");
    replace.finish("3");
    let mut popped = pop_all(&fifo).await;
    popped.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        popped,
        vec![
            ("ns/a".to_string(), vec![(DeltaType::Replaced, 2, false)]),
            ("ns/gone".to_string(), vec![(DeltaType::Deleted, 1, true)]),
        ]
    );
}

#[tokio::test]
async fn a_replace_with_an_object_whose_key_could_not_be_read_infers_no_deletion_at_all() {
    let known = Arc::new(Indexer::new());
    known.add(pod("maybe-that-one", 1)).unwrap();
    let fifo = with_known(&known);
    let mut replace = fifo.begin_replace();
    replace.push(pod("a", 2)).unwrap();
    replace.keep_all();
    replace.finish("3");
    assert_eq!(
        pop_all(&fifo).await,
        vec![("ns/a".to_string(), vec![(DeltaType::Replaced, 2, false)])]
    );
    assert!(fifo.has_synced());
}
