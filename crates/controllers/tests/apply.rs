//! `apply` against a real kube-apiserver: an object built fresh is created,
//! its fields owned by the field manager, a field dropped from it removed,
//! another manager's field taken over (forced); a cluster-scoped kind goes
//! to its cluster path; an object missing its name or namespace, or
//! cluster-scoped with one, is refused naming what is wrong, and nothing
//! is written. The server's refusals (a bad name, data over the limit, a
//! stale resourceVersion, managedFields, RBAC) come back as its own errors, bytes that
//! are not UTF-8 come back exact, a deleted object is created again, and
//! concurrent applies need no retry; a `PartialObjectMeta` applies labels
//! alone. `apply_status` writes the status of the object it is given, and
//! creates nothing.

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
    let stored = apply(&client, "site-controller", &role).await;
    let roles = Api::<ClusterRole>::all(client);
    let found = roles.get_opt(&name).await.unwrap();
    let _ = roles.delete(&name, &DeleteParams::default()).await;
    assert_eq!(stored.unwrap().metadata.name, Some(name));
    assert!(found.is_some());
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

    // An empty namespace is no namespace.
    let cm = config_map(Some(""), Some("orphan"), &[("a", "1")]);
    let message = apply(&client, "site-controller", &cm)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("metadata.namespace is not set"),
        "{message}"
    );

    // A subresource's kind, not applied on its own.
    let scale = k8s_openapi::api::autoscaling::v1::Scale {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    let message = apply(&client, "site-controller", &scale)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("the kind is neither namespaced nor cluster-scoped"),
        "{message}"
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

/// The API server's answer, when `result` is one.
fn status_of<K>(result: Result<K, kube_client::Error>) -> (u16, String) {
    match result {
        Err(kube_client::Error::Api(status)) => (status.code, status.message),
        Err(other) => panic!("not the API server's refusal: {other}"),
        Ok(_) => panic!("written"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_passes_the_servers_refusals_through_and_nothing_is_stored() {
    let (client, ns) = setup("apply-hostile").await;
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);

    // A name the server does not accept: its 422, naming it.
    let cm = config_map(Some(&ns), Some("Not_A_Name"), &[("a", "1")]);
    let (code, message) = status_of(apply(&client, "site-controller", &cm).await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("Not_A_Name"), "{message}");

    // Data over the 1 MiB a ConfigMap may hold: refused, not truncated.
    let huge = "x".repeat(1536 * 1024);
    let cm = config_map(Some(&ns), Some("huge"), &[("a", huge.as_str())]);
    let (code, message) = status_of(apply(&client, "site-controller", &cm).await);
    assert!((400..500).contains(&code), "{code}: {message}");
    assert!(api.get_opt("huge").await.unwrap().is_none());

    // A resourceVersion in the object makes the write conditional: a stale
    // one is a 409, and the stored object is left as it was.
    let cm = config_map(Some(&ns), Some("versioned"), &[("a", "1")]);
    let first = apply(&client, "site-controller", &cm).await.unwrap();
    apply(
        &client,
        "site-controller",
        &config_map(Some(&ns), Some("versioned"), &[("a", "2")]),
    )
    .await
    .unwrap();
    let mut stale = config_map(Some(&ns), Some("versioned"), &[("a", "3")]);
    stale.metadata.resource_version = first.metadata.resource_version;
    let (code, message) = status_of(apply(&client, "site-controller", &stale).await);
    assert_eq!(code, 409, "{message}");
    assert_eq!(data(&api.get("versioned").await.unwrap())["a"], "2");

    // An object read back, its managedFields still in it: a 400 naming them.
    let mut read = api.get("versioned").await.unwrap();
    read.metadata.resource_version = None;
    let (code, message) = status_of(apply(&client, "site-controller", &read).await);
    assert_eq!(code, 400, "{message}");
    assert!(message.contains("managedFields must be nil"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_keeps_bytes_exact_recreates_a_deleted_object_and_takes_concurrent_writes() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    let (client, ns) = setup("apply-bytes").await;

    // Bytes that are not UTF-8 go and come back as they are.
    let bytes = vec![0xff, 0xfe, 0x00, 0xc3, 0x28, b'\n'];
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("raw".into()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        data: Some([("k".to_owned(), ByteString(bytes.clone()))].into()),
        ..Default::default()
    };
    apply(&client, "site-controller", &secret).await.unwrap();
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let stored = secrets.get("raw").await.unwrap();
    assert_eq!(stored.data.unwrap()["k"].0, bytes);

    // Deleted, then applied again: a new object (another uid).
    let uid = stored.metadata.uid.unwrap();
    secrets
        .delete("raw", &DeleteParams::default())
        .await
        .unwrap();
    let again = apply(&client, "site-controller", &secret).await.unwrap();
    assert_ne!(again.metadata.uid.unwrap(), uid);

    // Sixteen concurrent applies of one object by one manager: no conflict
    // to retry, and the object ends as one of them wrote it.
    let writes = (0..16).map(|i| {
        let (client, ns) = (client.clone(), ns.clone());
        tokio::spawn(async move {
            let value = i.to_string();
            let cm = config_map(Some(&ns), Some("contended"), &[("i", value.as_str())]);
            apply(&client, "site-controller", &cm).await
        })
    });
    for write in futures::future::join_all(writes).await {
        write.unwrap().unwrap();
    }
    let cm = Api::<ConfigMap>::namespaced(client, &ns)
        .get("contended")
        .await
        .unwrap();
    let last: usize = data(&cm)["i"].parse().unwrap();
    assert!(last < 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_that_creates_needs_create_as_well_as_patch() {
    let (admin, ns) = setup("apply-rbac").await;
    let user = ("patch-only", "apply-patch-only");
    let client =
        common::client_allowed_only(&admin, &ns, user, ("", "configmaps"), &["patch"]).await;
    let cm = config_map(Some(&ns), Some("site"), &[("a", "1")]);
    let (code, message) = status_of(apply(&client, "site-controller", &cm).await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains(r#"cannot create resource "configmaps""#),
        "{message}"
    );
    // Once the object exists, patch alone is enough.
    apply(
        &admin,
        "someone-else",
        &config_map(Some(&ns), Some("site"), &[("b", "2")]),
    )
    .await
    .unwrap();
    apply(&client, "site-controller", &cm).await.unwrap();
    let stored = Api::<ConfigMap>::namespaced(admin, &ns)
        .get("site")
        .await
        .unwrap();
    assert_eq!(data(&stored).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_of_metadata_alone_sets_labels_and_leaves_the_rest() {
    use kube_client::core::{PartialObjectMeta, PartialObjectMetaExt};
    let (client, ns) = setup("apply-metadata").await;
    let cm = config_map(Some(&ns), Some("site"), &[("a", "1")]);
    apply(&client, "site-controller", &cm).await.unwrap();
    let labels = ObjectMeta {
        name: Some("site".into()),
        namespace: Some(ns.clone()),
        labels: Some([("tier".to_owned(), "web".to_owned())].into()),
        ..Default::default()
    };
    let partial: PartialObjectMeta<ConfigMap> = labels.into_request_partial();
    let stored = apply(&client, "labeller", &partial).await.unwrap();
    assert_eq!(stored.metadata.labels.unwrap()["tier"], "web");
    let cm = Api::<ConfigMap>::namespaced(client, &ns)
        .get("site")
        .await
        .unwrap();
    assert_eq!(data(&cm)["a"], "1");
    assert!(managers(&cm).contains(&("labeller".to_string(), "Apply".to_string())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_status_writes_the_status_of_the_object_it_is_given_and_creates_nothing() {
    use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
    use kinformer_controllers::apply_status;
    let (client, ns) = setup("apply-status").await;
    let labels = Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]));
    let mut deployment = Deployment {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        spec: DeploymentSpec {
            selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: labels.clone(),
                ..Default::default()
            },
            template: k8s_openapi::api::core::v1::PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels,
                    ..Default::default()
                }),
                spec: Some(k8s_openapi::api::core::v1::PodSpec {
                    containers: vec![k8s_openapi::api::core::v1::Container {
                        name: "web".into(),
                        image: Some("nginx:1".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        ..Default::default()
    };

    // Not there yet: a status apply does not create it.
    let status = DeploymentStatus {
        replicas: Some(2),
        ready_replicas: Some(1),
        ..Default::default()
    };
    let (code, message) =
        status_of(apply_status(&client, "site-controller", &deployment, &status).await);
    assert_eq!(code, 404, "{message}");

    apply(&client, "site-controller", &deployment)
        .await
        .unwrap();
    let stored = apply_status(&client, "site-controller", &deployment, &status)
        .await
        .unwrap();
    let written = stored.status.unwrap();
    assert_eq!(
        (written.replicas, written.ready_replicas),
        (Some(2), Some(1))
    );
    let api = Api::<Deployment>::namespaced(client.clone(), &ns);
    let read = api.get_status("web").await.unwrap().status.unwrap();
    assert_eq!(read.ready_replicas, Some(1));

    // Checked as `apply` checks: no namespace, refused before sending.
    deployment.metadata.namespace = None;
    let message = apply_status(&client, "site-controller", &deployment, &status)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains(r#"status apply of Deployment "web": metadata.namespace is not set"#),
        "{message}"
    );
}
