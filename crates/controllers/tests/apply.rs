//! `apply` against a real kube-apiserver: an object built fresh is created,
//! its fields owned by the field manager, a field dropped from it removed,
//! another manager's field taken over (forced); a cluster-scoped kind goes
//! to its cluster path; an object missing its name or namespace, or
//! cluster-scoped with one, is refused naming what is wrong, and nothing
//! is written.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_controllers::apply;
use kube_client::api::{Api, DeleteParams};

mod common;
use common::setup;

fn config_map(ns: Option<&str>, name: Option<&str>, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: name.map(Into::into),
            namespace: ns.map(Into::into),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn data(cm: &ConfigMap) -> BTreeMap<String, String> {
    cm.data.clone().unwrap_or_default()
}

/// The managers of `cm`'s fields, each with its operation.
fn managers(cm: &ConfigMap) -> Vec<(String, String)> {
    let fields = cm.metadata.managed_fields.iter().flatten();
    fields
        .map(|f| (f.manager.clone().unwrap(), f.operation.clone().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_creates_owns_what_it_sets_removes_what_it_drops_and_takes_fields_over() {
    let (client, ns) = setup("apply").await;
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);

    let cm = config_map(Some(&ns), Some("site"), &[("a", "1"), ("b", "2")]);
    let stored = apply(&client, "site-controller", &cm).await.unwrap();
    assert_eq!(data(&stored).len(), 2, "{stored:?}");
    assert_eq!(
        managers(&api.get("site").await.unwrap()),
        [("site-controller".to_string(), "Apply".to_string())]
    );

    // `b` dropped from what it applies: removed from the object.
    let cm = config_map(Some(&ns), Some("site"), &[("a", "1")]);
    apply(&client, "site-controller", &cm).await.unwrap();
    let stored = api.get("site").await.unwrap();
    assert_eq!(data(&stored), BTreeMap::from([("a".into(), "1".into())]));

    // Another manager sets `a`; the controller's next apply takes it back
    // (forced: without force the API server answers 409 Conflict).
    let other = config_map(Some(&ns), Some("site"), &[("a", "other")]);
    apply(&client, "someone-else", &other).await.unwrap();
    assert_eq!(data(&api.get("site").await.unwrap())["a"], "other");
    apply(&client, "site-controller", &cm).await.unwrap();
    assert_eq!(data(&api.get("site").await.unwrap())["a"], "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_writes_a_cluster_scoped_kind_to_its_cluster_path() {
    let (client, ns) = setup("apply-cluster").await;
    let name = format!("{ns}-reader");
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    let stored = apply(&client, "site-controller", &role).await.unwrap();
    assert_eq!(stored.metadata.name.as_deref(), Some(name.as_str()));
    let roles = Api::<ClusterRole>::all(client);
    assert!(roles.get_opt(&name).await.unwrap().is_some());
    roles.delete(&name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_a_missing_name_or_namespace_and_sends_nothing() {
    let (client, ns) = setup("apply-refused").await;

    // Namespaced, with no namespace: kube's own default namespace is not
    // guessed, and nothing is created there or anywhere.
    let cm = config_map(None, Some("orphan"), &[("a", "1")]);
    let error = apply(&client, "site-controller", &cm).await.unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains(r#"apply of ConfigMap "orphan": metadata.namespace is not set"#),
        "{message}"
    );
    let everywhere = Api::<ConfigMap>::all(client.clone());
    let found = everywhere.list(&Default::default()).await.unwrap();
    assert!(
        !found
            .items
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("orphan")),
        "written despite the error"
    );

    // No name.
    let cm = config_map(Some(&ns), None, &[("a", "1")]);
    let message = apply(&client, "site-controller", &cm)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains(r#"apply of ConfigMap "": metadata.name is not set"#),
        "{message}"
    );

    // Cluster-scoped, with a namespace.
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(format!("{ns}-misplaced")),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    let message = apply(&client, "site-controller", &role)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains(&format!(
            "metadata.namespace is {ns:?}, and the kind is cluster-scoped"
        )),
        "{message}"
    );
    let roles = Api::<ClusterRole>::all(client);
    assert!(
        roles
            .get_opt(&format!("{ns}-misplaced"))
            .await
            .unwrap()
            .is_none()
    );
}
