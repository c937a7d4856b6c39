//! The RBAC rules a Manager needs, derived from what it runs: each
//! controller's informers (list and watch), what its reconciler declares it
//! writes ([`ControllerBuilder::writes`](crate::ControllerBuilder::writes)),
//! the election's Lease, a sharding ring's Leases, and the Events of its
//! recorders. [`Manager::permissions`](crate::Manager::permissions) gives
//! them; [`Permissions::manifests`] renders them as a ServiceAccount, Roles
//! (one per namespace) and a ClusterRole, with their bindings.
//!
//! Least privilege: a namespace-scoped informer gets a Role in its
//! namespace, not a ClusterRole; the election's Lease is named
//! (`resourceNames`) for every verb RBAC can check by name (all but
//! `create`, which has no name to check before the object exists).
//! kubebuilder gets the same from `+kubebuilder:rbac` markers written by
//! hand, which drift from the code; here the code is the source.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

/// Where a rule applies: a namespace, or the whole cluster (`None`).
type Scope = Option<String>;

/// A rule's subject: API group, resource (with `/subresource`), and the
/// object names it is limited to (none: every object).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Subject {
    group: String,
    resource: String,
    names: Vec<String>,
}

/// RBAC rules by scope. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Permissions {
    rules: BTreeMap<Scope, BTreeMap<Subject, BTreeSet<String>>>,
}

impl Permissions {
    /// No rules yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allows `verbs` on `resource` (plural, with `/subresource` for one)
    /// of API group `group` ("" for the core group), in `namespace`, or
    /// cluster-wide for `None` (every namespace of a namespaced resource).
    pub fn allow(
        &mut self,
        namespace: Option<&str>,
        group: &str,
        resource: &str,
        verbs: &[&str],
    ) -> &mut Self {
        self.allow_named(namespace, group, resource, &[], verbs)
    }

    /// [`allow`](Self::allow), limited to the objects named `names`.
    pub fn allow_named(
        &mut self,
        namespace: Option<&str>,
        group: &str,
        resource: &str,
        names: &[&str],
        verbs: &[&str],
    ) -> &mut Self {
        let mut names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        names.sort();
        names.dedup();
        let subject = Subject {
            group: group.to_owned(),
            resource: resource.to_owned(),
            names,
        };
        self.rules
            .entry(namespace.map(str::to_owned))
            .or_default()
            .entry(subject)
            .or_default()
            .extend(verbs.iter().map(|v| (*v).to_owned()));
        self
    }

    /// Adds every rule of `other`.
    pub fn merge(&mut self, other: &Permissions) -> &mut Self {
        for (scope, subjects) in &other.rules {
            for (subject, verbs) in subjects {
                self.rules
                    .entry(scope.clone())
                    .or_default()
                    .entry(subject.clone())
                    .or_default()
                    .extend(verbs.iter().cloned());
            }
        }
        self
    }

    /// The namespaces with rules of their own (a Role each).
    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.rules.keys().filter_map(|scope| scope.as_deref())
    }

    /// Whether any rule is cluster-wide (a ClusterRole).
    pub fn is_cluster_wide(&self) -> bool {
        self.rules.contains_key(&None)
    }

    /// The verbs allowed on `resource` of `group` in `namespace` (`None`:
    /// cluster-wide rules only), whatever the names.
    pub fn verbs(&self, namespace: Option<&str>, group: &str, resource: &str) -> BTreeSet<&str> {
        self.rules
            .get(&namespace.map(str::to_owned))
            .into_iter()
            .flatten()
            .filter(|(s, _)| s.group == group && s.resource == resource)
            .flat_map(|(_, verbs)| verbs.iter().map(String::as_str))
            .collect()
    }

    /// The rules of one scope as RBAC `PolicyRule`s (JSON): one per API
    /// group and set of names and verbs, listing its resources, sorted.
    pub fn policy_rules(&self, namespace: Option<&str>) -> Vec<Value> {
        // (group, names, verbs): the resources they apply to.
        type Rule<'a> = (&'a str, &'a [String], Vec<&'a str>);
        let mut merged: BTreeMap<Rule<'_>, Vec<&str>> = BTreeMap::new();
        for (subject, verbs) in self
            .rules
            .get(&namespace.map(str::to_owned))
            .into_iter()
            .flatten()
        {
            let verbs: Vec<&str> = verbs.iter().map(String::as_str).collect();
            merged
                .entry((&subject.group, &subject.names, verbs))
                .or_default()
                .push(&subject.resource);
        }
        merged
            .into_iter()
            .map(|((group, names, verbs), resources)| {
                let mut rule = json!({
                    "apiGroups": [group],
                    "resources": resources,
                    "verbs": verbs,
                });
                if !names.is_empty() {
                    rule["resourceNames"] = json!(names);
                }
                rule
            })
            .collect()
    }

    /// The manifests that grant these rules to the ServiceAccount
    /// `account` of namespace `account_namespace`: the ServiceAccount, a
    /// ClusterRole `name` and its ClusterRoleBinding if any rule is
    /// cluster-wide, and a Role `name` with its RoleBinding in each
    /// namespace with rules of its own. Apply them with `kubectl apply -f`
    /// (the `List` they are in is JSON, which kubectl reads).
    pub fn manifests(&self, name: &str, account_namespace: &str, account: &str) -> Value {
        let subject = json!([{
            "kind": "ServiceAccount", "name": account, "namespace": account_namespace,
        }]);
        let mut items = vec![json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": account_namespace},
        })];
        let rbac = "rbac.authorization.k8s.io/v1";
        if self.is_cluster_wide() {
            items.push(json!({
                "apiVersion": rbac, "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": self.policy_rules(None),
            }));
            items.push(json!({
                "apiVersion": rbac, "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": subject,
            }));
        }
        for namespace in self.namespaces() {
            items.push(json!({
                "apiVersion": rbac, "kind": "Role",
                "metadata": {"name": name, "namespace": namespace},
                "rules": self.policy_rules(Some(namespace)),
            }));
            items.push(json!({
                "apiVersion": rbac, "kind": "RoleBinding",
                "metadata": {"name": name, "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": subject,
            }));
        }
        json!({"apiVersion": "v1", "kind": "List", "items": items})
    }
}

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
    use super::*;

    #[test]
    fn rules_are_merged_per_scope_group_and_names_and_rendered_sorted() {
        let mut p = Permissions::new();
        p.allow(None, "", "pods", &["watch", "list"]);
        p.allow(None, "", "services", &["list", "watch"]);
        p.allow(None, "apps", "deployments", &["list", "watch"]);
        p.allow(None, "", "pods", &["list"]);
        lease(&mut p, "ops", "my-lease");
        assert_eq!(
            p.policy_rules(None),
            [
                json!({"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["list", "watch"]}),
                json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list", "watch"]}),
            ]
        );
        assert_eq!(
            p.policy_rules(Some("ops")),
            [
                json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}),
                json!({
                    "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "verbs": ["get", "list", "update", "watch"], "resourceNames": ["my-lease"],
                }),
            ]
        );
        assert_eq!(p.namespaces().collect::<Vec<_>>(), ["ops"]);
    }

    #[test]
    fn manifests_bind_a_cluster_role_and_one_role_per_namespace_to_the_account() {
        let mut p = Permissions::new();
        p.allow(Some("a"), "", "pods", &["list", "watch"]);
        let list = p.manifests("ctl", "ops", "ctl-sa");
        let kinds: Vec<&str> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["ServiceAccount", "Role", "RoleBinding"]);
        assert_eq!(list["items"][1]["metadata"]["namespace"], "a");
        assert_eq!(
            list["items"][2]["subjects"][0],
            json!({"kind": "ServiceAccount", "name": "ctl-sa", "namespace": "ops"})
        );
        p.allow(None, "", "nodes", &["get"]);
        let list = p.manifests("ctl", "ops", "ctl-sa");
        assert_eq!(list["items"].as_array().unwrap().len(), 5);
        assert_eq!(list["items"][1]["kind"], "ClusterRole");
    }

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
        let options = ManagerOptions::new().leader_election(LeaderElectionConfig::new(
            "ops",
            "the-lease",
            "me",
        ));
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
            ["create", "list", "patch", "watch"].into()
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
