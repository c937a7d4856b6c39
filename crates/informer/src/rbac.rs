//! RBAC rules: [`Permissions`], what a program needs granted, by
//! namespace (a Role each) or cluster-wide (a ClusterRole), rendered as
//! manifests with [`Permissions::manifests`].
//! [`SharedInformerFactory::permissions`](crate::SharedInformerFactory::permissions)
//! gives its informers' (list and watch); the controllers crate's Manager
//! adds what its controllers write, its election's Lease and its Events.
//!
//! Least privilege: a namespace-scoped informer gets a Role in its
//! namespace, not a ClusterRole; a rule can be limited to named objects
//! (`resourceNames`). kubebuilder gets its rules from `+kubebuilder:rbac`
//! markers written by hand, which drift from the code; here the code is
//! the source.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::GroupResource;

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

    /// What an informer over `resource` in `namespace` (`None`: every
    /// namespace, or a cluster-scoped resource) needs: list and watch. For
    /// a custom resource read cluster-wide, also list and watch of its
    /// CustomResourceDefinition by name, which the informer reads while
    /// the resource is not served, to start as soon as it is (see
    /// [`ListerWatcher::until_served`](crate::ListerWatcher::until_served)).
    /// Not for one read in a namespace: CRDs are cluster-scoped, and
    /// that rule would need a ClusterRole where the rest fits in a Role
    /// (a namespace's admin can bind those); such an informer finds its
    /// resource on its backoff instead, within a minute.
    pub fn allow_reads(&mut self, namespace: Option<&str>, resource: &GroupResource) -> &mut Self {
        let crd = crate::lister_watcher::served::crd_name(&resource.group, &resource.resource);
        if let (None, Some(crd)) = (namespace, crd) {
            self.allow_named(
                None,
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                &[&crd],
                &["list", "watch"],
            );
        }
        self.allow(
            namespace,
            &resource.group,
            &resource.resource,
            &["list", "watch"],
        )
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

/// A program's `--print-rbac NAMESPACE` (or `--print-rbac=NAMESPACE`): if
/// its arguments hold the flag, prints the manifests of the rules
/// `permissions` gives (a ServiceAccount `name` of NAMESPACE, and its
/// roles, `name` too; see [`Permissions::manifests`]) and returns true:
/// the program should then exit, having run nothing. False without the
/// flag (or with it after `--`, where it is an argument); an error if it
/// has no namespace, an empty one or another flag after it. For a program
/// without an argument parser of its own (one with clap adds a flag and
/// calls `manifests`).
///
/// ```no_run
/// # fn demo(manager: &kinformer_informer::SharedInformerFactory) -> std::io::Result<()> {
/// if kinformer_informer::rbac::print_if_asked("my-controller", || manager.permissions())? {
///     return Ok(());
/// }
/// # Ok(()) }
/// ```
pub fn print_if_asked(
    name: &str,
    permissions: impl FnOnce() -> Permissions,
) -> std::io::Result<bool> {
    let Some(namespace) = print_rbac_namespace(std::env::args())? else {
        return Ok(false);
    };
    println!("{}", permissions().manifests(name, &namespace, name));
    Ok(true)
}

/// The namespace `--print-rbac` names in `args` (the program's name
/// first), in either of the forms clap and Go's flag package read:
/// `--print-rbac NAMESPACE` and `--print-rbac=NAMESPACE`.
fn print_rbac_namespace(args: impl IntoIterator<Item = String>) -> std::io::Result<Option<String>> {
    let invalid =
        |message: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, message.to_owned());
    let mut args = args.into_iter().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        if arg == "--print-rbac" {
            return match args.next() {
                Some(ns) if !ns.is_empty() && !ns.starts_with('-') => Ok(Some(ns)),
                _ => Err(invalid(
                    "--print-rbac needs the ServiceAccount's NAMESPACE after it",
                )),
            };
        }
        if let Some(ns) = arg.strip_prefix("--print-rbac=") {
            return match ns.is_empty() {
                true => Err(invalid(
                    "--print-rbac= needs the ServiceAccount's NAMESPACE after the `=`",
                )),
                false => Ok(Some(ns.to_owned())),
            };
        }
    }
    Ok(None)
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
        p.allow_named(
            Some("ops"),
            "coordination.k8s.io",
            "leases",
            &["my-lease"],
            &["get", "update", "list", "watch"],
        );
        p.allow(Some("ops"), "coordination.k8s.io", "leases", &["create"]);
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

    /// What `--print-rbac` asks of a program run with `args`.
    fn asked(args: &[&str]) -> std::io::Result<Option<String>> {
        print_rbac_namespace(args.iter().map(|a| (*a).to_owned()))
    }

    #[test]
    fn print_rbac_takes_its_namespace_as_the_next_argument_or_after_an_equals_sign() {
        assert_eq!(
            asked(&["ctl", "--print-rbac", "ops"]).unwrap(),
            Some("ops".into())
        );
        assert_eq!(
            asked(&["ctl", "--print-rbac=ops"]).unwrap(),
            Some("ops".into())
        );
        assert_eq!(
            asked(&["ctl", "-v", "--print-rbac=ops", "--other"]).unwrap(),
            Some("ops".into())
        );
        assert_eq!(asked(&["ctl", "--other", "ops"]).unwrap(), None);
        assert_eq!(asked(&["ctl", "--print-rbac-x=ops"]).unwrap(), None);
    }

    #[test]
    fn print_rbac_without_a_namespace_is_an_error_not_a_run() {
        for args in [
            &["ctl", "--print-rbac"][..],
            &["ctl", "--print-rbac", "--other"],
            &["ctl", "--print-rbac", ""],
            &["ctl", "--print-rbac="],
        ] {
            let err = asked(args).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{args:?}");
            assert!(err.to_string().contains("NAMESPACE"), "{args:?}: {err}");
        }
    }

    #[test]
    fn print_rbac_after_a_double_dash_is_an_argument_not_the_flag() {
        assert_eq!(asked(&["ctl", "--", "--print-rbac", "ops"]).unwrap(), None);
        assert_eq!(asked(&["ctl", "--", "--print-rbac=ops"]).unwrap(), None);
    }

    #[tokio::test]
    async fn a_factory_gives_list_and_watch_of_each_informer_in_its_scope() {
        use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
        use k8s_openapi::api::rbac::v1::Role;

        use crate::{InformerScope, SharedInformerFactory};
        let config = kube_client::Config::new("https://kubernetes.invalid".parse().unwrap());
        let client = kube_client::Client::try_from(config).unwrap();
        let factory = SharedInformerFactory::new(client).namespace("web");
        assert_eq!(factory.permissions(), Permissions::new());
        factory.informer::<ConfigMap>();
        factory.informer::<Namespace>();
        factory.informer_for::<Role>(InformerScope::default());
        let p = factory.permissions();
        assert_eq!(
            p.verbs(Some("web"), "", "configmaps"),
            ["list", "watch"].into()
        );
        assert_eq!(p.verbs(None, "", "namespaces"), ["list", "watch"].into());
        assert_eq!(
            p.verbs(None, "rbac.authorization.k8s.io", "roles"),
            ["list", "watch"].into()
        );
        assert_eq!(p.namespaces().collect::<Vec<_>>(), ["web"]);
        assert!(
            p.verbs(None, "apiextensions.k8s.io", "customresourcedefinitions")
                .is_empty()
        );
    }

    #[test]
    fn a_custom_resource_read_cluster_wide_may_read_its_crd_by_name_and_no_other() {
        let widgets = GroupResource::new("example.com", "widgets");
        let mut p = Permissions::new();
        p.allow_reads(Some("web"), &widgets);
        assert_eq!(p.namespaces().collect::<Vec<_>>(), ["web"]);
        assert!(
            !p.is_cluster_wide(),
            "a namespaced read needs no ClusterRole"
        );
        p.allow_reads(None, &widgets);
        p.allow_reads(None, &GroupResource::new("apps", "deployments"));
        let rules = serde_json::to_string(&p.policy_rules(None)).unwrap();
        assert!(
            rules.contains(r#""resourceNames":["widgets.example.com"]"#)
                && rules.contains("customresourcedefinitions"),
            "{rules}"
        );
        assert_eq!(
            rules.matches("customresourcedefinitions").count(),
            1,
            "{rules}"
        );
    }
}
