//! Black-box tests of the RealFifo, after client-go's the_real_fifo_test.go.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_fifo::{DeltaType, ObjectOrTombstone, PopError, RealFifo, RealFifoOptions, Requeue};
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

/// (kind, name, resource version, is tombstone) of one popped entry.
type Entry = (DeltaType, String, u32, bool);

fn entry(kind: DeltaType, obj: &ObjectOrTombstone<Pod>) -> Entry {
    let o = obj.object();
    (
        kind,
        o.metadata.name.clone().unwrap(),
        o.metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse()
            .unwrap(),
        obj.is_tombstone(),
    )
}

/// Pops one entry, and whether it belonged to the initial list.
async fn pop(fifo: &RealFifo<Pod>) -> (Entry, bool) {
    tokio::time::timeout(
        Duration::from_secs(5),
        fifo.pop(|deltas, initial| {
            assert_eq!(deltas.len(), 1, "one delta per pop");
            let d = &deltas[0];
            Ok::<_, Requeue<()>>((entry(d.kind, &d.object), initial))
        }),
    )
    .await
    .expect("nothing to pop")
    .unwrap()
}

fn e(kind: DeltaType, name: &str, rv: u32, tombstone: bool) -> Entry {
    (kind, name.to_owned(), rv, tombstone)
}

fn with_known(known: &Arc<Indexer<Pod>>) -> RealFifo<Pod> {
    RealFifo::with_options(RealFifoOptions::new().known_objects(known.clone()))
}

#[tokio::test]
async fn every_change_is_popped_on_its_own_in_arrival_order() {
    let fifo = RealFifo::new();
    fifo.add(pod("a", 1)).unwrap();
    fifo.add(pod("b", 2)).unwrap();
    fifo.update(pod("a", 3)).unwrap();
    fifo.delete(pod("a", 4)).unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(pop(&fifo).await.0);
    }
    assert_eq!(
        seen,
        [
            e(DeltaType::Added, "a", 1, false),
            e(DeltaType::Added, "b", 2, false),
            e(DeltaType::Updated, "a", 3, false),
            e(DeltaType::Deleted, "a", 4, false),
        ]
    );
    assert!(fifo.is_empty());
}

#[tokio::test]
async fn a_delete_of_a_key_never_seen_is_queued_all_the_same() {
    let known = Arc::new(Indexer::new());
    let fifo = with_known(&known);
    fifo.delete(pod("ghost", 1)).unwrap();
    assert_eq!(pop(&fifo).await.0, e(DeltaType::Deleted, "ghost", 1, false));
}

#[tokio::test]
async fn replace_queues_the_deletions_it_implies_before_the_listed_objects() {
    // Known: foo, bar, baz. baz changed in the queue; the list has foo only.
    let known = Arc::new(Indexer::new());
    for (name, rv) in [("foo", 5), ("bar", 6), ("baz", 7)] {
        known.add(pod(name, rv)).unwrap();
    }
    let fifo = with_known(&known);
    fifo.add(pod("baz", 10)).unwrap();
    fifo.replace(vec![pod("foo", 5)], "11").unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(pop(&fifo).await.0);
    }
    assert_eq!(
        seen,
        [
            e(DeltaType::Added, "baz", 10, false),
            // The queued key's last state, then the known one's.
            e(DeltaType::Deleted, "baz", 10, true),
            e(DeltaType::Deleted, "bar", 6, true),
            e(DeltaType::Replaced, "foo", 5, false),
        ]
    );
}

#[tokio::test]
async fn replace_adds_no_delete_for_a_key_whose_last_queued_entry_is_a_delete() {
    let known = Arc::new(Indexer::new());
    known.add(pod("foo", 1)).unwrap();
    known.add(pod("bar", 1)).unwrap();
    let fifo = with_known(&known);
    fifo.delete(pod("foo", 2)).unwrap();
    fifo.delete(pod("bar", 2)).unwrap();
    fifo.replace(vec![pod("foo", 3)], "3").unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(pop(&fifo).await.0);
    }
    assert_eq!(
        seen,
        [
            e(DeltaType::Deleted, "foo", 2, false),
            e(DeltaType::Deleted, "bar", 2, false),
            e(DeltaType::Replaced, "foo", 3, false),
        ]
    );
    assert!(fifo.is_empty());
}

#[tokio::test]
async fn has_synced_once_everything_queued_by_the_first_replace_is_popped() {
    let known = Arc::new(Indexer::new());
    for (name, rv) in [("foo", 5), ("bar", 6), ("baz", 7)] {
        known.add(pod(name, rv)).unwrap();
    }
    let fifo = with_known(&known);
    assert!(!fifo.has_synced());
    fifo.replace(vec![pod("foo", 5)], "8").unwrap();
    for _ in 0..3 {
        assert!(!fifo.has_synced());
        let (_, initial) = pop(&fifo).await;
        assert!(initial, "the deletes count toward the initial list");
    }
    assert!(fifo.has_synced());
    fifo.add(pod("new", 9)).unwrap();
    assert!(!pop(&fifo).await.1, "not initial after the sync");
}

#[tokio::test]
async fn has_synced_follows_client_gos_cases() {
    let empty = || RealFifo::<Pod>::with_options(RealFifoOptions::new());
    assert!(!empty().has_synced());
    let f = empty();
    f.add(pod("a", 1)).unwrap();
    assert!(f.has_synced(), "an add before any replace");
    let f = empty();
    f.replace(vec![], "0").unwrap();
    assert!(f.has_synced(), "an empty first list");
    let f = empty();
    f.replace(vec![pod("a", 1), pod("b", 2)], "0").unwrap();
    pop(&f).await;
    assert!(!f.has_synced());
    pop(&f).await;
    assert!(f.has_synced());
    // A key listed twice is two entries, each to be popped.
    let f = empty();
    f.replace(vec![pod("a", 1), pod("a", 2)], "0").unwrap();
    pop(&f).await;
    assert!(!f.has_synced());
    pop(&f).await;
    assert!(f.has_synced());
}

#[tokio::test]
async fn resync_replays_only_known_objects_with_nothing_queued() {
    let known = Arc::new(Indexer::new());
    known.add(pod("a", 1)).unwrap();
    known.add(pod("b", 1)).unwrap();
    let fifo = with_known(&known);
    fifo.update(pod("a", 2)).unwrap();
    fifo.resync().unwrap();
    assert_eq!(pop(&fifo).await.0, e(DeltaType::Updated, "a", 2, false));
    assert_eq!(pop(&fifo).await.0, e(DeltaType::Sync, "b", 1, false));
    assert!(fifo.is_empty());
    // Without known objects there is nothing to replay.
    let bare = RealFifo::<Pod>::new();
    bare.resync().unwrap();
    assert!(bare.is_empty());
}

#[tokio::test]
async fn a_requeued_entry_goes_back_to_the_head_so_the_order_is_kept() {
    let fifo = RealFifo::new();
    fifo.add(pod("a", 1)).unwrap();
    fifo.add(pod("b", 2)).unwrap();
    let requeued = fifo
        .pop(|_, _| Err::<(), _>(Requeue("not now")))
        .await
        .unwrap_err();
    assert_eq!(requeued, PopError::Requeued("not now"));
    assert_eq!(fifo.list_keys(), ["ns/a", "ns/b"]);
    assert_eq!(pop(&fifo).await.0, e(DeltaType::Added, "a", 1, false));
}

#[tokio::test]
async fn pop_waits_for_an_entry_and_close_ends_the_wait() {
    let fifo = Arc::new(RealFifo::<Pod>::new());
    let waiting = {
        let fifo = Arc::clone(&fifo);
        tokio::spawn(async move { pop(&fifo).await.0 })
    };
    tokio::task::yield_now().await;
    fifo.add(pod("late", 1)).unwrap();
    assert_eq!(
        waiting.await.unwrap(),
        e(DeltaType::Added, "late", 1, false)
    );

    let closed = {
        let fifo = Arc::clone(&fifo);
        tokio::spawn(async move { fifo.pop(|_, _| Ok::<_, Requeue<()>>(())).await })
    };
    tokio::task::yield_now().await;
    fifo.close();
    assert_eq!(closed.await.unwrap(), Err(PopError::Closed));
    assert!(fifo.is_closed());
}

#[tokio::test]
async fn replace_with_an_object_without_a_key_queues_nothing_and_names_it() {
    let fifo = RealFifo::new();
    fifo.add(pod("a", 1)).unwrap();
    let err = fifo
        .replace(vec![pod("b", 2), Arc::new(Pod::default())], "3")
        .unwrap_err();
    assert!(err.to_string().contains("item 1"), "{err}");
    assert_eq!(fifo.list_keys(), ["ns/a"]);
}

#[tokio::test]
async fn a_replace_pushed_object_by_object_queues_nothing_until_it_finishes_then_deletions_first() {
    let known = Arc::new(Indexer::new());
    for (name, rv) in [("foo", 5), ("bar", 6)] {
        known.add(pod(name, rv)).unwrap();
    }
    let fifo = with_known(&known);
    let mut replace = fifo.begin_replace();
    replace.push(pod("foo", 7)).unwrap();
    replace.push(pod("new", 8)).unwrap();
    // The deletions must come first, and they are known only at the end.
    assert!(fifo.is_empty());
    assert_eq!(replace.len(), 2);
    replace.finish("9");
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(pop(&fifo).await);
    }
    assert_eq!(
        seen,
        [
            (e(DeltaType::Deleted, "bar", 6, true), true),
            (e(DeltaType::Replaced, "foo", 7, false), true),
            (e(DeltaType::Replaced, "new", 8, false), true),
        ]
    );
    assert!(fifo.has_synced());
}

#[tokio::test]
async fn a_restarted_replace_queues_only_what_the_new_list_holds() {
    let known = Arc::new(Indexer::new());
    known.add(pod("p0", 1)).unwrap();
    let fifo = with_known(&known);
    let mut replace = fifo.begin_replace();
    replace.push(pod("p0", 2)).unwrap();
    replace.restart();
    replace.push(pod("p1", 3)).unwrap();
    replace.finish("4");
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(pop(&fifo).await.0);
    }
    assert_eq!(
        seen,
        [
            e(DeltaType::Deleted, "p0", 1, true),
            e(DeltaType::Replaced, "p1", 3, false),
        ]
    );
    assert!(fifo.is_empty());
}

#[tokio::test]
async fn a_replace_infers_no_deletion_for_a_key_whose_listed_object_could_not_be_read() {
    let known = Arc::new(Indexer::new());
    for (name, rv) in [("unreadable", 5), ("gone", 6)] {
        known.add(pod(name, rv)).unwrap();
    }
    let fifo = with_known(&known);
    let mut replace = fifo.begin_replace();
    replace.push(pod("new", 8)).unwrap();
    replace.keep("ns/unreadable");
    replace.finish("9");
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(pop(&fifo).await.0);
    }
    assert_eq!(
        seen,
        [
            e(DeltaType::Deleted, "gone", 6, true),
            e(DeltaType::Replaced, "new", 8, false),
        ]
    );
    assert!(fifo.is_empty());

    // A list with an object whose key is unknown infers no deletion at all.
    let mut replace = fifo.begin_replace();
    replace.keep_all();
    replace.finish("10");
    assert!(fifo.is_empty());
}
