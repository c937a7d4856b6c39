//! The RBAC rules a Manager needs, derived from what it runs: each
//! controller's informers (list and watch), what its reconciler declares it
//! writes ([`ControllerBuilder::writes`](crate::ControllerBuilder::writes)),
//! what setting ownerReferences on the children it owns takes,
//! the election's Lease, a sharding ring's Leases, and the Events of its
//! recorders. [`Manager::permissions`](crate::Manager::permissions) gives
//! them (a [`Permissions`], the informer crate's, re-exported here);
//! [`Permissions::manifests`] renders them as a ServiceAccount, Roles (one
//! per namespace) and a ClusterRole, with their bindings.
//!
//! Least privilege: a namespace-scoped informer gets a Role in its
//! namespace, not a ClusterRole; the election's Lease is named
//! (`resourceNames`) for every verb RBAC can check by name (all but
//! `create`, which has no name to check before the object exists).
//! kubebuilder gets the same from `+kubebuilder:rbac` markers written by
//! hand, which drift from the code; here the code is the source.

pub use kinformer_informer::Permissions;
pub use kinformer_informer::rbac::print_if_asked;

use kinformer_informer::GroupResource;

/// The rules of a leader election on the Lease `lease` of `namespace`:
/// read, acquire, renew and release it (get and update, by name), watch it
/// (list and watch, by name: the elector's field selector on
/// `metadata.name` lets RBAC check them by name), and create it the first
/// time.
pub(crate) fn lease(permissions: &mut Permissions, namespace: &str, lease: &str) {
    let leases = ("coordination.k8s.io", "leases");
    permissions.allow_named(
        Some(namespace),
        leases.0,
        leases.1,
        &[lease],
        &["get", "update", "list", "watch"],
    );
    permissions.allow(Some(namespace), leases.0, leases.1, &["create"]);
}

/// The rules of a sharding ring's Leases in `namespace`: its members'
/// and slots' Leases, named after the ring, so not listed by name: get,
/// create, update, list, watch, and delete (a member leaving).
pub(crate) fn ring(permissions: &mut Permissions, namespace: &str) {
    permissions.allow(
        Some(namespace),
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update", "list", "watch", "delete"],
    );
}

/// The rules of setting ownerReferences to objects of `owner` on objects
/// of `child` in `namespace` (`None`: every namespace, or cluster-scoped
/// children) where the server enforces them (the admission plugin
/// `OwnerReferencesPermissionEnforcement`, on in OpenShift): `update` of
/// the owner's `finalizers`, to set `blockOwnerDeletion`, and `delete` of
/// the child, to add an ownerReference to one that exists (adopting it).
/// The plugin checks the child's in its namespace, a namespaced owner's
/// in the same one (an owner is in its child's namespace), and a
/// cluster-scoped owner's cluster-wide.
pub(crate) fn owner_references(
    permissions: &mut Permissions,
    namespace: Option<&str>,
    owner: &GroupResource,
    owner_cluster_scoped: bool,
    child: &GroupResource,
) {
    let finalizers = format!("{}/finalizers", owner.resource);
    let owner_namespace = namespace.filter(|_| !owner_cluster_scoped);
    permissions.allow(owner_namespace, &owner.group, &finalizers, &["update"]);
    permissions.allow(namespace, &child.group, &child.resource, &["delete"]);
}

/// The rules of an Events recorder writing about objects of `namespace`
/// (`None`: any namespace): create and patch (a series' count) events.k8s.io
/// Events; about cluster-scoped objects, in `default`.
pub(crate) fn events(permissions: &mut Permissions, namespace: Option<&str>, cluster_scoped: bool) {
    let namespace = if cluster_scoped {
        Some("default")
    } else {
        namespace
    };
    permissions.allow(namespace, "events.k8s.io", "events", &["create", "patch"]);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::*;

    async fn done(
        _: crate::Lookup<k8s_openapi::api::core::v1::ConfigMap>,
        _: std::sync::Arc<()>,
    ) -> Result<crate::Action, crate::ReconcileError> {
        Ok(crate::Action::Done)
    }

    #[tokio::test]
    async fn a_manager_derives_its_reads_declared_writes_lease_and_events() {
        use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
        use kinformer_informer::SharedInformerFactory;

        use crate::{LeaderElectionConfig, Manager, ManagerOptions};
        let config = kube_client::Config::new("https://kubernetes.invalid".parse().unwrap());
        let client = kube_client::Client::try_from(config).unwrap();
        let options = ManagerOptions::new().leader_election(
            LeaderElectionConfig::new("the-lease")
                .namespace("ops")
                .identity("me"),
        );
        let factory = SharedInformerFactory::new(client.clone()).namespace("web");
        let mut manager = Manager::with_factory(factory, client, options).unwrap();
        let without_events = {
            let controller = manager
                .controller::<ConfigMap>("c")
                .owns::<Secret>()
                .writes::<Secret>(&["create", "patch"])
                .writes_status::<ConfigMap>()
                .writes::<Namespace>(&["get"])
                .reconcile(std::sync::Arc::new(()), done)
                .unwrap();
            manager.add(controller);
            manager.permissions()
        };
        assert_eq!(
            without_events.verbs(Some("web"), "events.k8s.io", "events"),
            BTreeSet::new()
        );
        let _recorder = manager.event_recorder("c");
        let p = manager.permissions();
        assert_eq!(
            p.verbs(Some("web"), "", "configmaps"),
            ["list", "watch"].into()
        );
        assert_eq!(
            p.verbs(Some("web"), "", "configmaps/status"),
            ["patch"].into()
        );
        assert_eq!(
            p.verbs(Some("web"), "", "secrets"),
            ["create", "delete", "list", "patch", "watch"].into()
        );
        assert_eq!(
            p.verbs(Some("web"), "events.k8s.io", "events"),
            ["create", "patch"].into()
        );
        // A cluster-scoped kind's rule is cluster-wide, whatever the factory's namespace.
        assert_eq!(p.verbs(None, "", "namespaces"), ["get"].into());
        assert_eq!(
            p.verbs(Some("ops"), "coordination.k8s.io", "leases"),
            ["create", "get", "list", "update", "watch"].into()
        );
        assert!(
            p.policy_rules(Some("ops"))
                .iter()
                .any(|r| r["resourceNames"] == json!(["the-lease"])
                    && !r["verbs"].to_string().contains("create"))
        );
        assert_eq!(p.namespaces().collect::<Vec<_>>(), ["ops", "web"]);
    }

    struct Done;

    impl crate::Reconciler for Done {
        fn reconcile<'a>(
            &'a self,
            _: &'a crate::Request,
        ) -> futures::future::BoxFuture<'a, Result<crate::Action, crate::ReconcileError>> {
            Box::pin(async { Ok(crate::Action::Done) })
        }
    }

    /// What a Manager over `factory_namespace` (`None`: every namespace)
    /// needs to run one controller of `K` owning `C`.
    fn owning<K, C>(factory_namespace: Option<&str>) -> Permissions
    where
        K: kube_client::Resource + kinformer_store::Object + Clone + serde::de::DeserializeOwned,
        K: std::fmt::Debug,
        K::DynamicType: Default,
        K::Scope: 'static,
        C: kube_client::Resource + kinformer_store::Object + Clone + serde::de::DeserializeOwned,
        C: std::fmt::Debug,
        C::DynamicType: Default,
        C::Scope: 'static,
    {
        use kinformer_informer::SharedInformerFactory;

        use crate::{Manager, ManagerOptions};
        let config = kube_client::Config::new("https://kubernetes.invalid".parse().unwrap());
        let client = kube_client::Client::try_from(config).unwrap();
        let mut factory = SharedInformerFactory::new(client.clone());
        if let Some(ns) = factory_namespace {
            factory = factory.namespace(ns);
        }
        let mut manager = Manager::with_factory(factory, client, ManagerOptions::new()).unwrap();
        let controller = manager
            .controller::<K>("c")
            .owns::<C>()
            .reconciler(Done)
            .unwrap();
        manager.add(controller);
        manager.permissions()
    }

    #[tokio::test]
    async fn owning_children_allows_blocking_the_owners_deletion_and_adopting_them() {
        use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
        use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};

        // OwnerReferencesPermissionEnforcement: `blockOwnerDeletion` needs
        // update of the owner's finalizers, adopting needs delete of the child.
        let p = owning::<ConfigMap, Secret>(Some("web"));
        assert_eq!(
            p.verbs(Some("web"), "", "configmaps/finalizers"),
            ["update"].into()
        );
        assert_eq!(
            p.verbs(Some("web"), "", "secrets"),
            ["delete", "list", "watch"].into()
        );
        assert!(!p.is_cluster_wide());
        let role = p.manifests("c", "web", "c")["items"][1].clone();
        assert_eq!(role["kind"], "Role");
        assert!(
            role["rules"].as_array().unwrap().contains(&json!({
                "apiGroups": [""], "resources": ["configmaps/finalizers"], "verbs": ["update"],
            })),
            "{role}"
        );

        let p = owning::<Deployment, ReplicaSet>(None);
        assert_eq!(
            p.verbs(None, "apps", "deployments/finalizers"),
            ["update"].into()
        );
        assert_eq!(
            p.verbs(None, "apps", "replicasets"),
            ["delete", "list", "watch"].into()
        );

        // The plugin checks a cluster-scoped owner's finalizers cluster-wide.
        let p = owning::<Namespace, ConfigMap>(Some("web"));
        assert_eq!(
            p.verbs(None, "", "namespaces/finalizers"),
            ["update"].into()
        );
        assert_eq!(
            p.verbs(Some("web"), "", "configmaps"),
            ["delete", "list", "watch"].into()
        );
        assert_eq!(p.verbs(Some("web"), "", "namespaces/finalizers"), [].into());
    }

    #[test]
    fn events_about_cluster_scoped_objects_go_to_default() {
        let mut p = Permissions::new();
        events(&mut p, None, true);
        events(&mut p, Some("web"), false);
        assert_eq!(
            p.verbs(Some("default"), "events.k8s.io", "events"),
            ["create", "patch"].into()
        );
        assert_eq!(
            p.verbs(Some("web"), "events.k8s.io", "events"),
            ["create", "patch"].into()
        );
        assert!(!p.is_cluster_wide());
    }
}
