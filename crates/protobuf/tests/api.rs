//! `ProtobufApi` against a real kube-apiserver: what it gets, lists and
//! watches in protobuf equals what kube-client's `Api` reads in JSON, and a
//! refusal is the server's `Status` as kube-client reports it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_envtest::{TestEnv, TestEnvOptions};
use kinformer_protobuf::{Error, ProtobufApi};
use kube_client::api::{Api, DeleteParams, ListParams, PatchParams, PostParams, WatchParams};
use kube_client::core::{
    ApiResource, DynamicObject, GroupVersionKind, ListMeta, PartialObjectMeta, WatchEvent,
};

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some(
        data.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    );
    cm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_and_list_in_protobuf_equal_kube_clients_json() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("pb-api").await.unwrap();
    let client = env.client().unwrap();
    let json: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for (name, value) in [("a", "1"), ("b", "héllo"), ("c", "")] {
        json.create(&PostParams::default(), &config_map(name, &[("k", value)]))
            .await
            .unwrap();
    }
    let pb = ProtobufApi::<ConfigMap>::namespaced(client.clone(), &ns).unwrap();

    assert_eq!(pb.get("b").await.unwrap(), json.get("b").await.unwrap());
    let listed = pb.list(&ListParams::default()).await.unwrap();
    let expected = json.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items, expected.items);
    assert_eq!(listed.types.kind, "ConfigMapList");
    assert!(listed.metadata.resource_version.is_some());

    // One page at a time, with the token the server gives.
    let first = pb.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().expect("a continue token");
    let rest = pb
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.items, expected.items[2..]);

    // Without managedFields, and otherwise the same.
    let stripped = pb.clone().drop_managed_fields(true).get("a").await.unwrap();
    let mut whole = json.get("a").await.unwrap();
    assert!(whole.metadata.managed_fields.is_some());
    whole.metadata.managed_fields = None;
    assert_eq!(stripped, whole);

    // Metadata only.
    let metas = ProtobufApi::<PartialObjectMeta<ConfigMap>>::namespaced(client, &ns).unwrap();
    let names: Vec<_> = metas
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|m| m.metadata.name.unwrap())
        .collect();
    assert_eq!(names, ["a", "b", "c"]);
    let meta = metas.get("a").await.unwrap();
    assert_eq!(meta.metadata.uid, whole.metadata.uid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_in_protobuf_says_how_many_items_remain_as_kube_clients_json_does() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("pb-remaining").await.unwrap();
    let client = env.client().unwrap();
    let json: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for name in ["a", "b", "c", "d", "e"] {
        json.create(&PostParams::default(), &config_map(name, &[]))
            .await
            .unwrap();
    }
    let pb = ProtobufApi::<ConfigMap>::namespaced(client.clone(), &ns).unwrap();
    let metas = ProtobufApi::<PartialObjectMeta<ConfigMap>>::namespaced(client, &ns).unwrap();

    let lp = ListParams::default().limit(2);
    let expected = json.list(&lp).await.unwrap().metadata;
    assert_eq!(expected.remaining_item_count, Some(3));
    for listed in [
        pb.list(&lp).await.unwrap().metadata,
        metas.list(&lp).await.unwrap().metadata,
    ] {
        assert_eq!(
            listed.remaining_item_count, expected.remaining_item_count,
            "{listed:?}"
        );
        // The same otherwise, but for where each list was read.
        let strip = |m: &ListMeta| ListMeta {
            continue_: m.continue_.as_ref().map(|_| "a token".into()),
            resource_version: m.resource_version.as_ref().map(|_| "a version".into()),
            ..m.clone()
        };
        assert_eq!(strip(&listed), strip(&expected));
    }

    // The last page has none left, as in JSON (no count, not zero).
    let token = pb.list(&lp).await.unwrap().metadata.continue_.unwrap();
    let last = pb
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(last.items.len(), 3);
    assert_eq!(last.metadata.remaining_item_count, None);
    assert_eq!(last.metadata.continue_, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_object_is_the_servers_404_and_get_opt_none() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("pb-missing").await.unwrap();
    let pb = ProtobufApi::<ConfigMap>::namespaced(env.client().unwrap(), &ns).unwrap();
    assert_eq!(pb.get_opt("nothing").await.unwrap(), None);
    match pb.get("nothing").await {
        Err(Error::Kube(kube_client::Error::Api(status))) => {
            assert_eq!(status.code, 404);
            assert_eq!(status.reason, "NotFound");
            assert!(status.message.contains("nothing"), "{}", status.message);
        }
        other => panic!("expected the server's 404, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_in_protobuf_sees_each_change_as_json_reads_it() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("pb-watch").await.unwrap();
    let client = env.client().unwrap();
    let json: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pb = ProtobufApi::<ConfigMap>::namespaced(client, &ns).unwrap();
    let version = pb
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = pb
        .watch(&WatchParams::default().timeout(60), &version)
        .await
        .unwrap();

    let created = json
        .create(&PostParams::default(), &config_map("w", &[("k", "1")]))
        .await
        .unwrap();
    let patch = serde_json::json!({"data": {"k": "2"}});
    let patched = json
        .patch(
            "w",
            &PatchParams::default(),
            &kube_client::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    json.delete("w", &DeleteParams::default()).await.unwrap();

    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), events.try_next())
            .await
            .expect("an event within 30 s")
            .unwrap()
            .expect("the watch still open")
    };
    match next().await {
        WatchEvent::Added(cm) => assert_eq!(cm, created),
        other => panic!("expected ADDED, got {other:?}"),
    }
    match next().await {
        WatchEvent::Modified(cm) => assert_eq!(cm, patched),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    match next().await {
        WatchEvent::Deleted(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("w")),
        other => panic!("expected DELETED, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_compacted_version_ends_with_the_servers_410() {
    // Without the watch cache, an etcd compaction makes the old version 410 at once.
    let env = TestEnv::start_with(TestEnvOptions::new().without_watch_cache())
        .await
        .unwrap();
    let ns = env.create_namespace("pb-gone").await.unwrap();
    let client = env.client().unwrap();
    let json: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let old = json
        .create(&PostParams::default(), &config_map("a", &[("k", "1")]))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    // Two writes after it, so that compacting at the latest revision
    // removes the one a watch from `old` starts at.
    for name in ["b", "c"] {
        json.create(&PostParams::default(), &config_map(name, &[("k", "1")]))
            .await
            .unwrap();
    }
    env.compact_etcd().await.unwrap();

    let pb = ProtobufApi::<ConfigMap>::namespaced(client, &ns).unwrap();
    let mut events = pb
        .watch(&WatchParams::default().timeout(60), &old)
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), events.try_next())
        .await
        .expect("an answer within 30 s");
    match first {
        Err(Error::Kube(kube_client::Error::Api(status))) => {
            assert_eq!(
                (status.code, status.reason.as_str()),
                (410, "Expired"),
                "{status:?}"
            );
        }
        other => panic!("expected an ERROR event of 410 Gone, got {other:?}"),
    }
}

#[test]
fn kinds_without_protobuf_are_refused_when_made_naming_the_kind() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A client needs no server until it sends.
    let client = runtime.block_on(async {
        let config = kube_client::Config::new("https://127.0.0.1:1".parse().unwrap());
        kube_client::Client::try_from(config).unwrap()
    });
    let widgets = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    let e = ProtobufApi::<DynamicObject>::all_with(client, &widgets).unwrap_err();
    assert!(e.to_string().contains("example.com/v1 Widget"), "{e}");
    assert!(e.to_string().contains("JSON only"), "{e}");
}
