// The Indexer suite: included by indexer.rs once per way of storing
// objects, each module defining `new_indexer`.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_store::{
    IndexFunc, Indexer, Indexers, KnownObjects, NAMESPACE_INDEX, StoreError, namespace_indexers,
};

fn pod(ns: &str, name: &str, labels: &[(&str, &str)]) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            resource_version: Some("1".into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    })
}

/// Indexes pods by every value of their `tier` and `team` labels.
fn by_label_values() -> Indexers<Pod> {
    let f: IndexFunc<Pod> = Arc::new(|p: &Pod| {
        Ok(p.metadata
            .labels
            .iter()
            .flatten()
            .map(|(_, v)| v.clone())
            .collect())
    });
    let mut m = namespace_indexers();
    m.insert("labels".into(), f);
    m
}

fn names(objs: Vec<Arc<Pod>>) -> BTreeSet<String> {
    objs.into_iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect()
}

#[test]
fn add_get_update_delete_round_trip() {
    let idx = new_indexer(Indexers::new());
    idx.add(pod("a", "p", &[])).unwrap();
    assert_eq!(idx.len(), 1);
    assert!(idx.get_by_key("a/p").is_some());
    let mut newer = (*pod("a", "p", &[])).clone();
    newer.metadata.resource_version = Some("2".into());
    idx.update(Arc::new(newer.clone())).unwrap();
    assert_eq!(
        idx.get(&newer)
            .unwrap()
            .unwrap()
            .metadata
            .resource_version
            .as_deref(),
        Some("2")
    );
    assert!(idx.delete(&newer).unwrap().is_some());
    assert!(idx.is_empty());
    // Deleting what is not there is not an error, as in client-go.
    assert!(idx.delete(&newer).unwrap().is_none());
}

#[test]
fn object_without_name_is_refused_and_nothing_is_stored() {
    let idx = new_indexer(Indexers::new());
    let nameless = Arc::new(Pod {
        metadata: ObjectMeta {
            namespace: Some("web".into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    });
    let err = idx.add(nameless).unwrap_err();
    assert!(matches!(err, StoreError::Key(_)), "{err}");
    assert!(err.to_string().contains("web"));
    assert!(idx.is_empty());
}

#[test]
fn by_index_finds_objects_by_namespace() {
    let idx = new_indexer(namespace_indexers());
    for (ns, name) in [("a", "1"), ("a", "2"), ("b", "3")] {
        idx.add(pod(ns, name, &[])).unwrap();
    }
    assert_eq!(
        names(idx.by_index(NAMESPACE_INDEX, "a").unwrap()),
        ["1", "2"].map(String::from).into()
    );
    assert_eq!(
        idx.index_keys(NAMESPACE_INDEX, "b").unwrap(),
        vec!["b/3".to_string()]
    );
    assert!(idx.by_index(NAMESPACE_INDEX, "c").unwrap().is_empty());
    let mut values = idx.list_index_func_values(NAMESPACE_INDEX);
    values.sort();
    assert_eq!(values, vec!["a", "b"]);
}

#[test]
fn index_returns_objects_sharing_any_value_with_the_query_object() {
    let idx = new_indexer(by_label_values());
    idx.add(pod("n", "front", &[("tier", "web"), ("team", "blue")]))
        .unwrap();
    idx.add(pod("n", "back", &[("tier", "db"), ("team", "blue")]))
        .unwrap();
    idx.add(pod("n", "other", &[("tier", "cache")])).unwrap();
    let query = pod("n", "q", &[("tier", "web"), ("x", "cache")]);
    assert_eq!(
        names(idx.index("labels", &query).unwrap()),
        ["front", "other"].map(String::from).into()
    );
}

#[test]
fn update_moving_an_object_between_index_values_leaves_no_stale_entry() {
    let idx = new_indexer(by_label_values());
    idx.add(pod("n", "p", &[("tier", "web")])).unwrap();
    idx.update(pod("n", "p", &[("tier", "db")])).unwrap();
    assert!(idx.by_index("labels", "web").unwrap().is_empty());
    assert!(idx.index_keys("labels", "web").unwrap().is_empty());
    assert_eq!(
        idx.index_keys("labels", "db").unwrap(),
        vec!["n/p".to_string()]
    );
    assert_eq!(idx.list_index_func_values("labels"), vec!["db".to_string()]);
}

#[test]
fn delete_removes_every_index_entry_of_the_object() {
    let idx = new_indexer(by_label_values());
    idx.add(pod("n", "p", &[("tier", "web"), ("team", "blue")]))
        .unwrap();
    idx.delete(&pod("n", "p", &[])).unwrap();
    assert!(idx.list_index_func_values("labels").is_empty());
    assert!(idx.list_index_func_values(NAMESPACE_INDEX).is_empty());
}

#[test]
fn replace_swaps_content_and_rebuilds_indexes() {
    let idx = new_indexer(namespace_indexers());
    idx.add(pod("old", "gone", &[])).unwrap();
    idx.replace(vec![pod("new", "1", &[]), pod("new", "2", &[])], "10")
        .unwrap();
    assert_eq!(idx.len(), 2);
    assert!(idx.get_by_key("old/gone").is_none());
    assert!(idx.by_index(NAMESPACE_INDEX, "old").unwrap().is_empty());
    assert_eq!(idx.by_index(NAMESPACE_INDEX, "new").unwrap().len(), 2);
}

#[test]
fn replace_with_a_keyless_object_is_refused_and_keeps_the_old_content() {
    let idx = new_indexer(Indexers::new());
    idx.add(pod("a", "kept", &[])).unwrap();
    let err = idx
        .replace(vec![pod("a", "x", &[]), Arc::new(Pod::default())], "2")
        .unwrap_err();
    assert!(matches!(err, StoreError::Key(_)));
    assert_eq!(idx.list_keys(), vec!["a/kept".to_string()]);
}

#[test]
fn add_indexers_with_a_name_already_taken_is_refused_and_changes_nothing() {
    let idx = new_indexer(Indexers::new());
    idx.add_indexers(namespace_indexers()).unwrap();
    idx.add(pod("a", "b", &[("tier", "web")])).unwrap();
    assert!(matches!(
        idx.add_indexers(by_label_values()),
        Err(StoreError::IndexerConflict(name)) if name == NAMESPACE_INDEX
    ));
    assert_eq!(idx.indexer_names(), [NAMESPACE_INDEX]);
}

#[test]
fn add_indexers_on_a_populated_store_indexes_the_items_it_holds() {
    let idx = new_indexer(namespace_indexers());
    idx.add(pod("a", "x", &[("tier", "web")])).unwrap();
    idx.add(pod("b", "y", &[("tier", "db")])).unwrap();
    let mut labels = by_label_values();
    labels.remove(NAMESPACE_INDEX);
    idx.add_indexers(labels).unwrap();
    assert_eq!(idx.index_keys("labels", "web").unwrap(), ["a/x"]);
    assert_eq!(idx.index_keys("labels", "db").unwrap(), ["b/y"]);
    // The old index is untouched, and later writes keep both up to date.
    assert_eq!(idx.index_keys(NAMESPACE_INDEX, "a").unwrap(), ["a/x"]);
    idx.update(pod("a", "x", &[("tier", "db")])).unwrap();
    assert!(idx.index_keys("labels", "web").unwrap().is_empty());
    assert_eq!(idx.index_keys("labels", "db").unwrap(), ["a/x", "b/y"]);
    idx.delete_by_key("b/y");
    assert_eq!(idx.index_keys("labels", "db").unwrap(), ["a/x"]);
}

#[test]
fn index_keys_are_sorted() {
    let idx = new_indexer(namespace_indexers());
    let names: Vec<String> = (0..64).map(|i| format!("p{:02}", (i * 37) % 64)).collect();
    for name in &names {
        idx.add(pod("n", name, &[])).unwrap();
    }
    let mut sorted: Vec<String> = names.iter().map(|n| format!("n/{n}")).collect();
    sorted.sort();
    assert_eq!(idx.index_keys(NAMESPACE_INDEX, "n").unwrap(), sorted);
}

#[test]
fn querying_an_unknown_index_is_an_error_naming_it() {
    let idx = new_indexer(Indexers::new());
    let err = idx.by_index("nope", "x").unwrap_err();
    assert!(err.to_string().contains("\"nope\""));
    assert!(idx.list_index_func_values("nope").is_empty());
}

/// The "strict" index refuses pods labelled `bad` (an error) and panics on
/// pods labelled `boom`; the namespace index always works.
fn strict_indexers() -> Indexers<Pod> {
    let mut indexers = namespace_indexers();
    indexers.insert(
        "strict".into(),
        Arc::new(|p: &Pod| {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            if labels.contains_key("boom") {
                panic!("index function exploded");
            }
            if labels.contains_key("bad") {
                Err("label \"bad\" is not allowed".into())
            } else {
                Ok(vec!["ok".into()])
            }
        }),
    );
    indexers
}

fn unindexed(err: StoreError) -> Vec<(String, String, String)> {
    match err {
        StoreError::Unindexed(errors) => errors
            .into_iter()
            .map(|e| (e.index, e.key, e.source.to_string()))
            .collect(),
        other => panic!("expected Unindexed, got {other}"),
    }
}

#[test]
fn an_index_function_that_fails_stores_the_new_object_and_leaves_it_out_of_that_index_only() {
    let idx = new_indexer(strict_indexers());
    idx.add(pod("n", "p", &[])).unwrap();
    let err = idx.update(pod("n", "p", &[("bad", "1")])).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("strict") && msg.contains("n/p") && msg.contains("not allowed"),
        "{msg}"
    );
    assert_eq!(
        unindexed(err),
        [(
            "strict".to_string(),
            "n/p".to_string(),
            "label \"bad\" is not allowed".to_string()
        )]
    );
    // The cache holds the new object, not the old one.
    let stored = idx.get_by_key("n/p").unwrap();
    assert!(stored.metadata.labels.as_ref().unwrap().contains_key("bad"));
    // Out of the failing index (its old entry gone too), in every other.
    assert!(idx.index_keys("strict", "ok").unwrap().is_empty());
    assert_eq!(idx.index_keys(NAMESPACE_INDEX, "n").unwrap(), ["n/p"]);
    // Once the function succeeds again, the object is indexed again.
    idx.update(pod("n", "p", &[])).unwrap();
    assert_eq!(idx.index_keys("strict", "ok").unwrap(), ["n/p"]);
}

#[test]
fn a_panicking_index_function_is_caught_and_reported_with_the_key_and_the_index() {
    let idx = new_indexer(strict_indexers());
    idx.add(pod("n", "q", &[])).unwrap();
    let upserted = idx.update_by_key("n/q", pod("n", "q", &[("boom", "1")]));
    assert!(upserted.previous.is_some());
    let failures: Vec<_> = upserted
        .unindexed
        .iter()
        .map(|e| (e.index.as_str(), e.key.as_str(), e.source.to_string()))
        .collect();
    assert_eq!(
        failures,
        [(
            "strict",
            "n/q",
            "the index function panicked: index function exploded".to_string()
        )]
    );
    assert!(
        idx.get_by_key("n/q")
            .unwrap()
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key("boom")
    );
    assert!(idx.index_keys("strict", "ok").unwrap().is_empty());
    assert_eq!(idx.index_keys(NAMESPACE_INDEX, "n").unwrap(), ["n/q"]);
    // The store is still usable: the panic did not unwind through its lock.
    idx.delete_by_key("n/q");
    assert!(idx.is_empty());
    // A query whose object makes the function panic is an error, not a panic.
    let err = idx
        .index("strict", &pod("n", "x", &[("boom", "1")]))
        .unwrap_err();
    assert!(matches!(err, StoreError::IndexFunc(_)), "{err}");
}

#[test]
fn add_indexers_whose_function_fails_for_a_held_item_adds_the_index_without_that_item() {
    let idx = new_indexer(Indexers::new());
    idx.add(pod("n", "good", &[])).unwrap();
    idx.add(pod("n", "bad", &[("bad", "1")])).unwrap();
    let mut strict = strict_indexers();
    strict.remove(NAMESPACE_INDEX);
    let err = idx.add_indexers(strict).unwrap_err();
    assert_eq!(
        unindexed(err),
        [(
            "strict".to_string(),
            "n/bad".to_string(),
            "label \"bad\" is not allowed".to_string()
        )]
    );
    assert_eq!(idx.index_keys("strict", "ok").unwrap(), ["n/good"]);
    assert_eq!(idx.len(), 2);
}

#[test]
fn replace_stores_every_object_and_leaves_the_failing_ones_out_of_the_failing_index() {
    let idx = new_indexer(strict_indexers());
    let err = idx
        .replace(
            vec![
                pod("n", "a", &[]),
                pod("n", "b", &[("bad", "1")]),
                pod("n", "c", &[("boom", "1")]),
            ],
            "7",
        )
        .unwrap_err();
    let mut failures: Vec<_> = unindexed(err).into_iter().map(|(i, k, _)| (i, k)).collect();
    failures.sort();
    assert_eq!(
        failures,
        [
            ("strict".to_string(), "n/b".to_string()),
            ("strict".to_string(), "n/c".to_string())
        ]
    );
    assert_eq!(idx.len(), 3);
    assert_eq!(idx.index_keys("strict", "ok").unwrap(), ["n/a"]);
    assert_eq!(idx.index_keys(NAMESPACE_INDEX, "n").unwrap().len(), 3);
}

#[test]
fn known_objects_view_lists_keys_and_gets_objects() {
    let idx = new_indexer(Indexers::new());
    idx.add(pod("a", "b", &[])).unwrap();
    let known: &dyn KnownObjects<Pod> = &idx;
    assert_eq!(known.list_keys(), vec!["a/b".to_string()]);
    assert!(known.get_by_key("a/b").is_some());
}

#[test]
fn concurrent_writers_keep_indexes_consistent_with_items() {
    let idx = Arc::new(new_indexer(by_label_values()));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let idx = Arc::clone(&idx);
            std::thread::spawn(move || {
                for i in 0..2_000 {
                    let name = format!("p{}", i % 50);
                    let tier = ["web", "db", "cache"][(i + t) % 3];
                    if i % 7 == 0 {
                        idx.delete(&pod("n", &name, &[])).unwrap();
                    } else {
                        idx.update(pod("n", &name, &[("tier", tier)])).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Every index entry points at a stored object whose labels carry that value,
    // and every stored object is in the index under each of its values.
    let mut indexed = 0;
    for value in idx.list_index_func_values("labels") {
        for obj in idx.by_index("labels", &value).unwrap() {
            assert_eq!(obj.metadata.labels.as_ref().unwrap()["tier"], value);
            indexed += 1;
        }
    }
    assert_eq!(indexed, idx.len());
}

fn at(name: &str, version: Option<&str>) -> Arc<Pod> {
    let mut p = (*pod("a", name, &[])).clone();
    p.metadata.resource_version = version.map(str::to_owned);
    Arc::new(p)
}

/// client-go's TestThreadSafeStoreRV, through the Indexer: the store keeps
/// the resourceVersion it was last synced to, from writes that carry
/// objects, a delete of an object, a replace's list and a bookmark; a write
/// without a version and a delete by key leave it as it was.
#[test]
fn the_store_keeps_the_resource_version_it_was_last_synced_to() {
    let idx = new_indexer(Indexers::new());
    assert_eq!(idx.last_store_sync_resource_version(), None, "initial state");
    let rv = |idx: &Indexer<Pod>| idx.last_store_sync_resource_version();
    idx.add(at("key1", Some("10"))).unwrap();
    assert_eq!(rv(&idx).as_deref(), Some("10"));
    idx.add(at("key3", Some("10"))).unwrap();
    assert_eq!(rv(&idx).as_deref(), Some("10"), "the same version again");
    idx.add(at("key4", Some("20"))).unwrap();
    assert_eq!(rv(&idx).as_deref(), Some("20"));
    // An earlier object deleted at a newer version.
    idx.delete(&at("key4", Some("30"))).unwrap();
    assert_eq!(rv(&idx).as_deref(), Some("30"), "after the delete");
    // An object without a version (client-go: a non-meta object).
    idx.add(at("key5", None)).unwrap();
    assert_eq!(rv(&idx).as_deref(), Some("30"), "a write without a version");
    idx.add(at("key6", Some("40"))).unwrap();
    assert_eq!(rv(&idx).as_deref(), Some("40"));
    // A delete by key alone (client-go: a nil object).
    idx.delete_by_key("a/key6");
    assert!(idx.remove_by_key("a/key5"));
    assert_eq!(rv(&idx).as_deref(), Some("40"), "a delete by key");
    assert!(idx.remove_by_key_at("a/key3", Some("45")));
    assert_eq!(rv(&idx).as_deref(), Some("45"), "a removal naming its version");
    assert!(idx.update_by_key("a/key9", at("key9", Some("50"))).unindexed.is_empty());
    assert_eq!(rv(&idx).as_deref(), Some("50"));

    idx.replace(vec![at("key3", Some("40")), at("key2", Some("30"))], "60")
        .unwrap();
    assert_eq!(rv(&idx).as_deref(), Some("60"), "the list's version");
    assert_eq!(idx.len(), 2);
    idx.bookmark("70");
    assert_eq!(rv(&idx).as_deref(), Some("70"), "a bookmark");
    idx.replace(vec![], "").unwrap();
    assert_eq!(rv(&idx).as_deref(), Some("70"), "a list without a version");
}

/// The version moves under the same lock as the content: a reader that has
/// seen the store at a version then reads that version's object or a newer
/// one, never an older (the "caught up with my write" check depends on it).
#[test]
fn a_reader_that_saw_a_version_never_reads_older_content_after_it() {
    let idx = Arc::new(new_indexer(Indexers::new()));
    idx.add(at("p", Some("0"))).unwrap();
    let writer = std::thread::spawn({
        let idx = Arc::clone(&idx);
        move || {
            for v in 1..=20_000u32 {
                idx.update(at("p", Some(&v.to_string()))).unwrap();
            }
        }
    });
    let mut checked = 0u32;
    loop {
        let seen: u32 = idx
            .last_store_sync_resource_version()
            .unwrap()
            .parse()
            .unwrap();
        let read: u32 = idx
            .get_by_key("a/p")
            .unwrap()
            .metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse()
            .unwrap();
        assert!(read >= seen, "saw the store at {seen}, then read {read}");
        checked += 1;
        if seen == 20_000 {
            break;
        }
    }
    writer.join().unwrap();
    assert!(checked > 0);
}
