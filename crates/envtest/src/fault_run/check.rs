//! What a fault run checks at the end: a [`Snapshot`] of the recorded kinds
//! in the run's namespace, and [`Check`]s over it.

use std::collections::{BTreeMap, BTreeSet};

use kube_client::Resource;
use kube_client::core::{ApiResource, DynamicObject};
use serde::de::DeserializeOwned;

/// What the API server held in the run's namespace, of the recorded kinds,
/// when the end state was checked.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub(crate) namespace: String,
    pub(crate) objects: Vec<(ApiResource, Vec<DynamicObject>)>,
    pub(crate) output: Vec<String>,
}

impl Snapshot {
    /// The run's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The objects of kind `K`, or why they cannot be given (`K` not
    /// recorded, or an object that does not decode as `K`).
    pub fn list<K>(&self) -> Result<Vec<K>, String>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let kind = ApiResource::erase::<K>(&());
        self.dynamic(&kind)?
            .iter()
            .map(|o| {
                o.clone().try_parse::<K>().map_err(|e| {
                    format!(
                        "{} {} does not decode as {}: {e}",
                        kind.kind,
                        o.metadata.name.as_deref().unwrap_or_default(),
                        kind.kind
                    )
                })
            })
            .collect()
    }

    /// The objects of a recorded kind, as they came.
    pub fn dynamic(&self, kind: &ApiResource) -> Result<&[DynamicObject], String> {
        self.objects
            .iter()
            .find(|(k, _)| same_kind(k, kind))
            .map(|(_, objects)| objects.as_slice())
            .ok_or_else(|| {
                format!(
                    "{} ({}) is not recorded by this fault run: add it with record",
                    kind.kind, kind.api_version
                )
            })
    }

    /// The controller's output so far (a process's stdout and stderr, the
    /// last 10 000 lines, across restarts, with the run's notes); empty for
    /// a task, whose output goes to the test's own: the end state of a
    /// controller that writes nothing but what it prints.
    pub fn output(&self) -> &[String] {
        &self.output
    }

    /// Every object of every recorded kind, with its kind.
    pub fn all(&self) -> impl Iterator<Item = (&ApiResource, &DynamicObject)> {
        self.objects
            .iter()
            .flat_map(|(kind, objects)| objects.iter().map(move |o| (kind, o)))
    }
}

pub(crate) fn same_kind(a: &ApiResource, b: &ApiResource) -> bool {
    a.group == b.group && a.plural == b.plural
}

type CheckFn = dyn Fn(&Snapshot) -> Result<(), String> + Send + Sync;

/// One condition the end state must meet: a name for the report, and a
/// test that says what is wrong when it is not met.
pub struct Check {
    pub(crate) name: String,
    pub(crate) test: Box<CheckFn>,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check").field("name", &self.name).finish()
    }
}

impl Check {
    /// A condition of your own: `test` returns `Err(what is wrong)`.
    pub fn new(
        name: impl Into<String>,
        test: impl Fn(&Snapshot) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            test: Box::new(test),
        }
    }

    /// No owner (by uid) has two objects of kind `K` whose controller
    /// ownerReference names it: a child made twice (say, under a generated
    /// name by a controller that read a cache that did not have the first
    /// one yet).
    pub fn no_duplicate_children<K: Resource<DynamicType = ()>>() -> Self {
        let kind = ApiResource::erase::<K>(&());
        Self::no_duplicate_children_of(kind)
    }

    /// [`no_duplicate_children`](Self::no_duplicate_children) for a kind
    /// known only at run time (a custom resource).
    pub fn no_duplicate_children_of(kind: ApiResource) -> Self {
        let name = format!(
            "no duplicate children: no owner controls two {}",
            kind.plural
        );
        Self::new(name, move |snapshot| {
            let mut by_owner: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
            for child in snapshot.dynamic(&kind)? {
                // By uid: an owner deleted and made again under its name
                // is another owner, its old children the collector's.
                if let Some(owner) = controller_of(child) {
                    let owner = (owner.uid.clone(), format!("{} {}", owner.kind, owner.name));
                    by_owner
                        .entry(owner)
                        .or_default()
                        .push(child.metadata.name.clone().unwrap_or_default());
                }
            }
            let twice: Vec<String> = by_owner
                .into_iter()
                .filter(|(_, children)| children.len() > 1)
                .map(|((_, owner), children)| format!("{owner} controls {}", children.join(", ")))
                .collect();
            if twice.is_empty() {
                Ok(())
            } else {
                Err(twice.join("; "))
            }
        })
    }

    /// Every object of kind `K` has a controller ownerReference to an
    /// object that exists (of a recorded kind): nothing left behind that
    /// the garbage collector will never take. The owners' kinds must be
    /// recorded too, and every object of `K` counts: when parents and
    /// children are of one kind, write your own check.
    pub fn no_orphans<K: Resource<DynamicType = ()>>() -> Self {
        Self::no_orphans_of(ApiResource::erase::<K>(&()))
    }

    /// [`no_orphans`](Self::no_orphans) for a kind known only at run time.
    pub fn no_orphans_of(kind: ApiResource) -> Self {
        let name = format!(
            "no orphans: every one of the {} has its controller",
            kind.plural
        );
        Self::new(name, move |snapshot| {
            let uids: BTreeSet<&str> = snapshot
                .all()
                .filter_map(|(_, o)| o.metadata.uid.as_deref())
                .collect();
            let orphans: Vec<String> = snapshot
                .dynamic(&kind)?
                .iter()
                .filter_map(|child| {
                    let name = child.metadata.name.clone().unwrap_or_default();
                    match controller_of(child) {
                        None => Some(format!("{name} (no controller ownerReference)")),
                        Some(o) if !uids.contains(o.uid.as_str()) => Some(format!(
                            "{name} (its controller {} {} is gone)",
                            o.kind, o.name
                        )),
                        Some(_) => None,
                    }
                })
                .collect();
            if orphans.is_empty() {
                Ok(())
            } else {
                Err(orphans.join(", "))
            }
        })
    }

    /// No object of a recorded kind is left being deleted: a deletion a
    /// finalizer holds that its controller never finished.
    pub fn no_finalizer_left() -> Self {
        Self::new(
            "no finalizer left: nothing stays being deleted",
            |snapshot| {
                let stuck: Vec<String> = snapshot
                    .all()
                    .filter(|(_, o)| o.metadata.deletion_timestamp.is_some())
                    .map(|(kind, o)| {
                        format!(
                            "{} {} (finalizers {:?})",
                            kind.kind,
                            o.metadata.name.as_deref().unwrap_or_default(),
                            o.metadata.finalizers.as_deref().unwrap_or_default()
                        )
                    })
                    .collect();
                if stuck.is_empty() {
                    Ok(())
                } else {
                    Err(stuck.join(", "))
                }
            },
        )
    }
}

fn controller_of(
    o: &DynamicObject,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    o.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, uid: &str, owner: Option<&str>, deleting: bool) -> DynamicObject {
        let mut value = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "uid": uid},
        });
        if let Some(owner) = owner {
            value["metadata"]["ownerReferences"] = serde_json::json!([{
                "apiVersion": "v1", "kind": "ConfigMap", "name": owner,
                "uid": format!("uid-{owner}"), "controller": true,
            }]);
        }
        if deleting {
            value["metadata"]["deletionTimestamp"] = "2026-12-08T00:00:00Z".into();
            value["metadata"]["finalizers"] = serde_json::json!(["example.dev/hold"]);
        }
        serde_json::from_value(value).unwrap()
    }

    fn snapshot(objects: Vec<DynamicObject>) -> Snapshot {
        Snapshot {
            namespace: "ns".into(),
            objects: vec![(
                ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                objects,
            )],
            output: Vec::new(),
        }
    }

    fn check(c: &Check, s: &Snapshot) -> Result<(), String> {
        (c.test)(s)
    }

    #[test]
    fn the_ready_made_checks_name_what_is_wrong() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let good = snapshot(vec![
            object("p", "uid-p", None, false),
            object("c", "uid-c", Some("p"), false),
        ]);
        let twice = snapshot(vec![
            object("p", "uid-p", None, false),
            object("c1", "uid-c1", Some("p"), false),
            object("c2", "uid-c2", Some("p"), false),
        ]);
        let dup = Check::no_duplicate_children::<ConfigMap>();
        assert_eq!(check(&dup, &good), Ok(()));
        assert_eq!(
            check(&dup, &twice),
            Err("ConfigMap p controls c1, c2".into())
        );

        let orphans = Check::no_orphans_of(ApiResource::erase::<ConfigMap>(&()));
        let gone = snapshot(vec![object("c", "uid-c", Some("p"), false)]);
        let err = check(&orphans, &gone).unwrap_err();
        assert!(
            err.contains("c (its controller ConfigMap p is gone)"),
            "{err}"
        );
        // The parent itself has no controller: an orphan by this check's rule.
        assert!(
            check(&orphans, &good)
                .unwrap_err()
                .contains("p (no controller ownerReference)")
        );

        let finalizers = Check::no_finalizer_left();
        assert_eq!(check(&finalizers, &good), Ok(()));
        let stuck = snapshot(vec![object("p", "uid-p", None, true)]);
        assert!(
            check(&finalizers, &stuck)
                .unwrap_err()
                .contains("example.dev/hold")
        );
    }

    #[test]
    fn a_kind_not_recorded_is_an_error_that_says_so() {
        let s = snapshot(Vec::new());
        let err = s.list::<k8s_openapi::api::core::v1::Secret>().unwrap_err();
        assert!(err.contains("Secret (v1) is not recorded"), "{err}");
        assert!(
            s.list::<k8s_openapi::api::core::v1::ConfigMap>()
                .unwrap()
                .is_empty()
        );
    }
}
