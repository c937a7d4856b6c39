//! Black-box tests of the RealFifo's atomic mode, after client-go v0.37.2's
//! the_real_fifo_test.go (`TestRealFIFO_ReplaceAtomic`,
//! `TestRealFIFO_ReplaceAtomicPop`, `TestRealFIFO_ResyncAtomic`) and its
//! `UnlockWhileProcessingFIFO` and bookmark behaviours.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_fifo::{
    DeltaType, FifoKind, InformerQueue, PopError, Popped, RealFifo, RealFifoOptions, Requeue,
};
use kinformer_store::{Indexer, KnownObjects};

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

/// A popped unit, described: `Added ns/a 1`, `ReplacedAll 20 [ns/a 15]`,
/// `SyncAll`, `Bookmark 7`.
fn describe(unit: &Popped<'_, Pod>) -> String {
    let rv = |p: &Pod| p.metadata.resource_version.clone().unwrap_or_default();
    match unit {
        Popped::Deltas { key, deltas } => {
            let d = deltas.newest().expect("a delta");
            format!("{:?} {key} {}", d.kind, rv(d.object.object()))
        }
        Popped::ReplacedAll(all) => {
            let objects: Vec<String> = all
                .objects()
                .map(|(key, obj)| match obj {
                    Some(obj) => format!("{key} {}", rv(obj)),
                    None => format!("{key} held"),
                })
                .collect();
            format!(
                "ReplacedAll {} [{}]",
                all.resource_version(),
                objects.join(", ")
            )
        }
        Popped::SyncAll => "SyncAll".to_owned(),
        Popped::Bookmark(rv) => format!("Bookmark {rv}"),
    }
}

/// Pops one unit, described, and whether it belonged to the initial list.
async fn pop(fifo: &RealFifo<Pod>) -> (String, bool) {
    tokio::time::timeout(
        Duration::from_secs(5),
        fifo.pop_unit(|unit, initial| Ok::<_, Requeue<()>>((describe(&unit), initial))),
    )
    .await
    .expect("nothing to pop")
    .unwrap()
}

/// Pops a `ReplacedAll` and says, per listed object, whether it is the very
/// object `held` holds under its key (shared, not a copy).
async fn shared_with(fifo: &RealFifo<Pod>, held: &Indexer<Pod>) -> Vec<bool> {
    fifo.pop_unit(|unit, _| {
        let Popped::ReplacedAll(all) = unit else {
            panic!("not a ReplacedAll: {}", describe(&unit))
        };
        let shared: Vec<bool> = all
            .objects()
            .map(|(key, obj)| {
                let obj = obj.expect("a whole store's objects are shared, not held");
                held.get_by_key(key).is_some_and(|h| Arc::ptr_eq(&h, obj))
            })
            .collect();
        Ok::<_, Requeue<()>>(shared)
    })
    .await
    .unwrap()
}

async fn pop_all(fifo: &RealFifo<Pod>) -> Vec<String> {
    let mut seen = Vec::new();
    while !fifo.is_empty() {
        seen.push(pop(fifo).await.0);
    }
    seen
}

/// client-go's TestRealFIFO_ReplaceAtomic, case by case.
#[tokio::test]
async fn a_replace_is_one_unit_behind_what_was_queued_before_it() {
    let fifo = RealFifo::<Pod>::atomic();
    fifo.replace(vec![], "123").unwrap();
    assert_eq!(pop_all(&fifo).await, ["ReplacedAll 123 []"], "base replace");

    let fifo = RealFifo::<Pod>::atomic();
    fifo.add(pod("foo", 2)).unwrap();
    fifo.replace(vec![], "123").unwrap();
    assert_eq!(
        pop_all(&fifo).await,
        ["Added ns/foo 2", "ReplacedAll 123 []"],
        "an added object stays ahead of the replace, which infers no deletion itself"
    );

    let fifo = RealFifo::<Pod>::atomic();
    fifo.add(pod("foo", 2)).unwrap();
    fifo.replace(vec![pod("foo", 2)], "10").unwrap();
    fifo.replace(vec![pod("foo", 2)], "20").unwrap();
    fifo.replace(vec![], "56").unwrap();
    assert_eq!(
        pop_all(&fifo).await,
        [
            "Added ns/foo 2",
            "ReplacedAll 10 [ns/foo 2]",
            "ReplacedAll 20 [ns/foo 2]",
            "ReplacedAll 56 []"
        ],
        "replaces run in order"
    );

    let fifo = RealFifo::<Pod>::atomic();
    fifo.bookmark("123");
    fifo.replace(vec![], "1234").unwrap();
    assert_eq!(
        pop_all(&fifo).await,
        ["Bookmark 123", "ReplacedAll 1234 []"],
        "a bookmark is not folded into a replace"
    );
}

/// client-go's TestRealFIFO_ReplaceAtomicPop.
#[tokio::test]
async fn an_add_then_a_replace_pop_as_two_units_and_nothing_more() {
    let fifo = RealFifo::<Pod>::atomic();
    fifo.add(pod("foo", 10)).unwrap();
    fifo.replace(vec![pod("foo", 15)], "20").unwrap();
    assert_eq!(pop(&fifo).await.0, "Added ns/foo 10");
    assert_eq!(pop(&fifo).await.0, "ReplacedAll 20 [ns/foo 15]");
    assert!(fifo.is_empty(), "the replace was one unit");
    fifo.close();
    let closed = fifo
        .pop_unit(|_, _| Ok::<_, Requeue<()>>(()))
        .await
        .unwrap_err();
    assert!(matches!(closed, PopError::Closed));
}

/// client-go's TestRealFIFO_ResyncAtomic.
#[tokio::test]
async fn a_resync_is_one_unit_behind_what_was_queued_before_it() {
    let fifo = RealFifo::<Pod>::atomic();
    fifo.resync().unwrap();
    assert_eq!(pop_all(&fifo).await, ["SyncAll"]);

    let fifo = RealFifo::<Pod>::atomic();
    fifo.add(pod("foo", 2)).unwrap();
    fifo.resync().unwrap();
    assert_eq!(pop_all(&fifo).await, ["Added ns/foo 2", "SyncAll"]);
}

#[tokio::test]
async fn the_atomic_mode_consults_no_known_objects() {
    let known = Arc::new(Indexer::<Pod>::new());
    known.add(pod("cached", 1)).unwrap();
    let known: Arc<dyn KnownObjects<Pod>> = known;
    let fifo = RealFifo::with_options(RealFifoOptions::new().known_objects(known).atomic());
    fifo.replace(vec![pod("new", 2)], "5").unwrap();
    fifo.resync().unwrap();
    assert_eq!(
        pop_all(&fifo).await,
        ["ReplacedAll 5 [ns/new 2]", "SyncAll"],
        "no tombstone for ns/cached and no Sync per object: the consumer finds them"
    );
}

#[tokio::test]
async fn bookmarks_are_units_only_in_the_atomic_mode_and_one_right_behind_another_replaces_it() {
    let plain = RealFifo::<Pod>::new();
    plain.bookmark("3");
    assert!(
        plain.is_empty(),
        "client-go's RealFIFO without bookmark deltas"
    );

    let fifo = RealFifo::<Pod>::atomic();
    fifo.bookmark("3");
    fifo.bookmark("4");
    fifo.add(pod("a", 5)).unwrap();
    fifo.bookmark("6");
    assert_eq!(
        pop_all(&fifo).await,
        ["Bookmark 4", "Added ns/a 5", "Bookmark 6"]
    );
}

#[tokio::test]
async fn a_unit_is_processed_with_the_queue_unlocked() {
    let fifo = Arc::new(RealFifo::<Pod>::atomic());
    fifo.replace(vec![pod("a", 1)], "1").unwrap();
    let (added, was_added) = mpsc::channel();
    let producer = Arc::clone(&fifo);
    let seen = fifo
        .pop_unit(|unit, _| {
            // A Reflector adding while a whole list is applied: with the
            // queue locked during processing it would wait for us, and we
            // for it.
            std::thread::spawn(move || {
                producer.add(pod("b", 2)).unwrap();
                added.send(()).unwrap();
            });
            let unblocked = was_added.recv_timeout(Duration::from_secs(30)).is_ok();
            Ok::<_, Requeue<()>>((describe(&unit), unblocked))
        })
        .await
        .unwrap();
    assert_eq!(seen, ("ReplacedAll 1 [ns/a 1]".to_owned(), true));
    assert_eq!(pop(&fifo).await.0, "Added ns/b 2");
}

#[tokio::test]
async fn has_synced_turns_true_only_once_the_initial_list_unit_has_been_processed() {
    let fifo = Arc::new(RealFifo::<Pod>::atomic());
    fifo.replace(vec![pod("a", 2), pod("b", 3)], "3").unwrap();
    fifo.add(pod("late", 4)).unwrap();
    assert!(!fifo.has_synced());
    let watcher = Arc::clone(&fifo);
    let during = fifo
        .pop_unit(|unit, initial| {
            Ok::<_, Requeue<()>>((describe(&unit), initial, watcher.has_synced()))
        })
        .await
        .unwrap();
    assert_eq!(
        during,
        ("ReplacedAll 3 [ns/a 2, ns/b 3]".to_owned(), true, false),
        "not synced while the list is being applied, with the queue unlocked"
    );
    assert!(fifo.has_synced());
    assert_eq!(pop(&fifo).await, ("Added ns/late 4".to_owned(), false));
}

#[tokio::test]
async fn a_requeued_unit_goes_back_to_the_head_whole() {
    let fifo = RealFifo::<Pod>::atomic();
    fifo.replace(vec![pod("a", 1), pod("b", 2)], "2").unwrap();
    fifo.add(pod("c", 3)).unwrap();
    let requeued = fifo
        .pop_unit(|_, _| Err::<(), _>(Requeue("not now")))
        .await
        .unwrap_err();
    assert!(matches!(requeued, PopError::Requeued("not now")));
    assert!(
        !fifo.has_synced(),
        "a requeued initial unit is not processed"
    );
    assert_eq!(
        pop_all(&fifo).await,
        ["ReplacedAll 2 [ns/a 1, ns/b 2]", "Added ns/c 3"]
    );
    assert!(fifo.has_synced());
}

#[tokio::test]
async fn a_replace_handed_over_object_by_object_is_one_unit_keeping_what_could_not_be_read() {
    let fifo = RealFifo::<Pod>::atomic();
    let mut replace = fifo.begin_replace();
    replace.push(pod("a", 1)).unwrap();
    replace.keep("ns/unreadable");
    replace.push(pod("b", 2)).unwrap();
    assert!(
        fifo.is_empty(),
        "nothing queued before the list is complete"
    );
    replace.finish("9");
    let kept = fifo
        .pop_unit(|unit, _| {
            let Popped::ReplacedAll(all) = unit else {
                panic!("not a ReplacedAll: {}", describe(&unit))
            };
            Ok::<_, Requeue<()>>((
                describe(&unit),
                all.keeps("ns/unreadable"),
                all.keeps("ns/gone"),
                all.keeps_all(),
            ))
        })
        .await
        .unwrap();
    assert_eq!(
        kept,
        (
            "ReplacedAll 9 [ns/a 1, ns/b 2]".to_owned(),
            true,
            false,
            false
        )
    );

    let mut replace = fifo.begin_replace();
    replace.keep_all();
    replace.finish("10");
    let all = fifo
        .pop_unit(|unit, _| {
            let Popped::ReplacedAll(all) = unit else {
                panic!("not a ReplacedAll")
            };
            Ok::<_, Requeue<()>>(all.keeps("ns/anything") && all.keeps_all())
        })
        .await
        .unwrap();
    assert!(
        all,
        "a listed object whose key could not be read keeps every key"
    );
}

#[tokio::test]
async fn pop_hands_out_a_whole_list_as_one_replaced_delta_per_object() {
    let fifo = RealFifo::<Pod>::atomic();
    fifo.replace(vec![pod("a", 1), pod("b", 2)], "2").unwrap();
    fifo.resync().unwrap();
    fifo.bookmark("3");
    fifo.add(pod("c", 3)).unwrap();
    let mut seen = Vec::new();
    while !fifo.is_empty() {
        let popped = fifo
            .pop(|deltas, initial| {
                let d = deltas.newest().unwrap();
                Ok::<_, Requeue<()>>((d.kind, d.object.object().metadata.name.clone(), initial))
            })
            .await
            .unwrap();
        seen.push(popped);
    }
    assert_eq!(
        seen,
        [
            (DeltaType::Replaced, Some("a".to_owned()), true),
            (DeltaType::Replaced, Some("b".to_owned()), true),
            (DeltaType::Added, Some("c".to_owned()), false),
        ]
    );
    assert!(fifo.has_synced());
}

#[tokio::test]
async fn the_informer_queue_of_the_atomic_kind_is_an_atomic_real_fifo() {
    let known: Arc<dyn KnownObjects<Pod>> = Arc::new(Indexer::<Pod>::new());
    let key_func: kinformer_store::KeyFunc<Pod> =
        Arc::new(|p: &Pod| kinformer_store::meta_namespace_key(p));
    let queue = InformerQueue::new(FifoKind::AtomicFifo, key_func, known);
    assert_eq!(queue.kind(), FifoKind::AtomicFifo);
    queue.replace(vec![pod("a", 1)], "1").unwrap();
    queue.bookmark("2");
    queue.resync().unwrap();
    let mut seen = Vec::new();
    while !queue.is_empty() {
        let unit = queue
            .pop_unit(|unit, _| Ok::<_, Requeue<()>>(describe(&unit)))
            .await
            .unwrap();
        seen.push(unit);
    }
    assert_eq!(seen, ["ReplacedAll 1 [ns/a 1]", "Bookmark 2", "SyncAll"]);
}

#[tokio::test]
async fn a_relisted_object_at_the_version_held_whole_is_queued_as_the_held_one() {
    let held = Arc::new(Indexer::<Pod>::new());
    held.add(pod("same", 1)).unwrap();
    held.add(pod("changed", 1)).unwrap();
    let known: Arc<dyn KnownObjects<Pod>> = held.clone();
    let fifo = RealFifo::with_options(RealFifoOptions::new().known_objects(known).atomic());
    let mut replace = fifo.begin_replace();
    replace.push(pod("same", 1)).unwrap();
    replace.push(pod("changed", 2)).unwrap();
    replace.push(pod("new", 3)).unwrap();
    replace.finish("3");
    let shared = shared_with(&fifo, &held).await;
    assert_eq!(shared, [true, false, false]);
}

#[tokio::test]
async fn a_relisted_object_a_compact_store_holds_at_its_version_is_not_kept_at_all() {
    let held = Arc::new(Indexer::<Pod>::compact(
        Default::default(),
        kinformer_store::Compact::json(),
    ));
    held.add(pod("same", 1)).unwrap();
    held.add(pod("changed", 1)).unwrap();
    assert!(
        held.get_shared("ns/same").is_none(),
        "it would decode a copy"
    );
    let known: Arc<dyn KnownObjects<Pod>> = held.clone();
    let fifo = RealFifo::with_options(RealFifoOptions::new().known_objects(known).atomic());
    let mut replace = fifo.begin_replace();
    replace.push(pod("same", 1)).unwrap();
    replace.push(pod("changed", 2)).unwrap();
    replace.push(pod("new", 3)).unwrap();
    replace.finish("3");
    assert_eq!(
        pop(&fifo).await.0,
        "ReplacedAll 3 [ns/same held, ns/changed 2, ns/new 3]"
    );
}

/// Two relists queued behind each other: the first lacks `ns/k` (a shard
/// scope narrowed), the second has it back unchanged. The second must not
/// be judged "held" against the store as it is before the first is
/// applied: the first removes `ns/k`, and the second would keep nothing.
#[tokio::test]
async fn a_relist_queued_behind_another_keeps_its_own_copy_of_what_the_store_holds_now() {
    let held = Arc::new(Indexer::<Pod>::compact(
        Default::default(),
        kinformer_store::Compact::json(),
    ));
    held.add(pod("k", 1)).unwrap();
    let known: Arc<dyn KnownObjects<Pod>> = held.clone();
    let fifo = RealFifo::with_options(RealFifoOptions::new().known_objects(known).atomic());
    fifo.begin_replace().finish("2");
    let mut replace = fifo.begin_replace();
    replace.push(pod("k", 1)).unwrap();
    replace.finish("3");
    assert_eq!(pop(&fifo).await.0, "ReplacedAll 2 []");
    assert_eq!(pop(&fifo).await.0, "ReplacedAll 3 [ns/k 1]");
}

/// The same while the earlier unit is being applied (taken, not yet done).
#[tokio::test]
async fn a_relist_listed_while_a_unit_is_applied_keeps_its_own_copy() {
    let held = Arc::new(Indexer::<Pod>::compact(
        Default::default(),
        kinformer_store::Compact::json(),
    ));
    held.add(pod("k", 1)).unwrap();
    let known: Arc<dyn KnownObjects<Pod>> = held.clone();
    let fifo = Arc::new(RealFifo::with_options(
        RealFifoOptions::new().known_objects(known).atomic(),
    ));
    fifo.begin_replace().finish("2");
    let producer = Arc::clone(&fifo);
    fifo.pop_unit(|_, _| {
        let mut replace = producer.begin_replace();
        replace.push(pod("k", 1)).unwrap();
        replace.finish("3");
        Ok::<_, Requeue<()>>(())
    })
    .await
    .unwrap();
    assert_eq!(pop(&fifo).await.0, "ReplacedAll 3 [ns/k 1]");
}

#[tokio::test]
async fn a_unit_being_processed_still_counts_as_queued() {
    let fifo = Arc::new(RealFifo::<Pod>::atomic());
    fifo.replace(vec![pod("a", 1)], "1").unwrap();
    let watcher = Arc::clone(&fifo);
    let during = fifo
        .pop_unit(|_, _| Ok::<_, Requeue<()>>((watcher.len(), watcher.is_empty())))
        .await
        .unwrap();
    assert_eq!(during, (1, false), "0 would say the list is in the cache");
    assert!(fifo.is_empty());
}

/// A unit taken before the first list arrived must not use up the list's
/// count when it is done (found in review).
#[tokio::test]
async fn a_unit_processed_while_the_first_list_arrives_does_not_count_towards_it() {
    let fifo = Arc::new(RealFifo::<Pod>::atomic());
    fifo.resync().unwrap();
    let producer = Arc::clone(&fifo);
    fifo.pop_unit(|_, _| {
        producer.replace(vec![pod("a", 1)], "1").unwrap();
        Ok::<_, Requeue<()>>(())
    })
    .await
    .unwrap();
    assert!(!fifo.has_synced(), "synced before the list was applied");
    assert_eq!(
        pop(&fifo).await,
        ("ReplacedAll 1 [ns/a 1]".to_owned(), true)
    );
    assert!(fifo.has_synced());
}

#[tokio::test]
async fn only_an_object_at_the_same_non_empty_version_and_uid_is_shared() {
    let with = |name: &str, rv: &str, uid: Option<&str>| {
        let mut p = (*pod(name, 0)).clone();
        p.metadata.resource_version = Some(rv.into());
        p.metadata.uid = uid.map(str::to_owned);
        Arc::new(p)
    };
    let held = Arc::new(Indexer::<Pod>::new());
    held.add(with("same", "4", Some("u1"))).unwrap();
    held.add(with("recreated", "4", Some("u1"))).unwrap();
    held.add(with("unversioned", "", None)).unwrap();
    let known: Arc<dyn KnownObjects<Pod>> = held.clone();
    let fifo = RealFifo::with_options(RealFifoOptions::new().known_objects(known).atomic());
    let mut replace = fifo.begin_replace();
    replace.push(with("same", "4", Some("u1"))).unwrap();
    replace.push(with("recreated", "4", Some("u2"))).unwrap();
    replace.push(with("unversioned", "", None)).unwrap();
    replace.finish("5");
    let shared = shared_with(&fifo, &held).await;
    assert_eq!(shared, [true, false, false]);
}

#[tokio::test]
async fn pop_on_an_atomic_queue_with_known_objects_hands_out_the_deletions_first() {
    let held = Arc::new(Indexer::<Pod>::new());
    held.add(pod("gone", 1)).unwrap();
    held.add(pod("kept", 1)).unwrap();
    held.add(pod("a", 1)).unwrap();
    let known: Arc<dyn KnownObjects<Pod>> = held.clone();
    let fifo = RealFifo::with_options(RealFifoOptions::new().known_objects(known).atomic());
    let mut replace = fifo.begin_replace();
    replace.push(pod("a", 2)).unwrap();
    replace.keep("ns/kept");
    replace.finish("2");
    let mut seen = Vec::new();
    while !fifo.is_empty() {
        let popped = fifo
            .pop(|deltas, initial| {
                let d = deltas.newest().unwrap();
                Ok::<_, Requeue<()>>((
                    d.kind,
                    d.object.object().metadata.name.clone().unwrap(),
                    d.object.is_tombstone(),
                    initial,
                ))
            })
            .await
            .unwrap();
        seen.push(popped);
    }
    assert_eq!(
        seen,
        [
            (DeltaType::Deleted, "gone".to_owned(), true, true),
            (DeltaType::Replaced, "a".to_owned(), false, true),
        ]
    );
    assert!(fifo.has_synced());
}
