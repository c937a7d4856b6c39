//! ThreadSafeStore::swap_at: the content swapped out, and keys kept as held.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_store::{Compact, IndexFunc, Indexers, ThreadSafeStore};

fn pod(name: &str, node: &str, rv: &str) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            resource_version: Some(rv.into()),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some(node.into()),
            ..Default::default()
        }),
        ..Pod::default()
    })
}

fn by_node() -> Indexers<Pod> {
    let f: IndexFunc<Pod> = Arc::new(|p: &Pod| {
        Ok(vec![
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
        ])
    });
    Indexers::from([("node".to_owned(), f)])
}

fn stores() -> [ThreadSafeStore<Pod>; 2] {
    [
        ThreadSafeStore::with_indexers(by_node()),
        ThreadSafeStore::compact(by_node(), Compact::json()),
    ]
}

#[test]
fn a_swap_gives_back_what_each_key_held_and_keeps_what_keep_says_indexed() {
    for store in stores() {
        store
            .replace_at(
                [
                    ("ns/a".to_owned(), pod("a", "n1", "1")),
                    ("ns/kept".to_owned(), pod("kept", "n1", "1")),
                    ("ns/gone".to_owned(), pod("gone", "n2", "1")),
                ],
                "1",
            )
            .unwrap();
        let items = vec![(Arc::<str>::from("ns/a"), pod("a", "n2", "5"))];
        let swapped = store.swap_at(items, &|key| key == "ns/kept" || key == "ns/a", "7");
        assert!(swapped.unindexed.is_empty());
        let mut old: Vec<String> = swapped.keys().map(|k| k.to_string()).collect();
        old.sort();
        assert_eq!(old, ["ns/a", "ns/gone"], "the kept key is not swapped out");
        assert_eq!(
            swapped
                .get("ns/a")
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("1"),
            "what a held before"
        );
        assert_eq!(
            swapped.get("ns/gone").unwrap().metadata.name.as_deref(),
            Some("gone")
        );
        drop(swapped);
        let mut keys = store.list_keys();
        keys.sort();
        assert_eq!(keys, ["ns/a", "ns/kept"]);
        assert_eq!(
            store
                .get("ns/a")
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("5"),
            "a listed key is never kept"
        );
        assert_eq!(store.index_keys("node", "n1").unwrap(), ["ns/kept"]);
        assert_eq!(store.index_keys("node", "n2").unwrap(), ["ns/a"]);
        assert_eq!(
            store.last_store_sync_resource_version().as_deref(),
            Some("7")
        );
    }
}

/// client-go's Replace indexes every object again; a kept key must be too,
/// or an index whose values come from outside the object (a table the
/// index function reads) keeps the values of the previous list.
#[test]
fn a_kept_key_is_indexed_again_with_what_its_index_function_gives_now() {
    let zone = Arc::new(parking_lot::Mutex::new("east".to_owned()));
    let by_zone = || {
        let zone = Arc::clone(&zone);
        let f: IndexFunc<Pod> = Arc::new(move |_: &Pod| Ok(vec![zone.lock().clone()]));
        Indexers::from([("zone".to_owned(), f)])
    };
    let stores = [
        ThreadSafeStore::with_indexers(by_zone()),
        ThreadSafeStore::compact(by_zone(), Compact::json()),
    ];
    for store in stores {
        *zone.lock() = "east".to_owned();
        store
            .replace_at([("ns/kept".to_owned(), pod("kept", "n1", "1"))], "1")
            .unwrap();
        assert_eq!(store.index_keys("zone", "east").unwrap(), ["ns/kept"]);
        *zone.lock() = "west".to_owned();
        let swapped = store.swap_at(Vec::new(), &|key| key == "ns/kept", "2");
        assert!(swapped.unindexed.is_empty());
        drop(swapped);
        assert_eq!(store.index_keys("zone", "west").unwrap(), ["ns/kept"]);
        assert!(store.index_keys("zone", "east").unwrap().is_empty());
    }
}
