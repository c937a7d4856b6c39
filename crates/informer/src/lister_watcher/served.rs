//! Waiting for a custom resource the API server does not serve: its
//! CustomResourceDefinition, listed and watched by name (a field selector
//! on `metadata.name`, which RBAC authorizes by `resourceNames`), until it
//! is established and serves the version listed.
//!
//! Built here rather than on the factory's informers: it lives only while
//! one Reflector waits, reads one object, and needs no cache.

use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::Client;
use kube_client::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::time::Instant;
use tracing::{debug, info};

/// API groups kube-apiserver serves itself with a dot in their name (a
/// group without one is built in: a CRD's group must have one). A custom
/// resource may still live under `k8s.io` (Gateway API's
/// `gateway.networking.k8s.io`), so the rest are taken for custom.
const BUILT_IN_GROUPS: &[&str] = &[
    "admission.k8s.io",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "authentication.k8s.io",
    "apidiscovery.k8s.io",
    "authorization.k8s.io",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "imagepolicy.k8s.io",
    "internal.apiserver.k8s.io",
    "lifecycle.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// The name of the CustomResourceDefinition that would serve `resource`
/// of `group` (`plural.group`), when the group can be a custom one.
pub(crate) fn crd_name(group: &str, resource: &str) -> Option<String> {
    (group.contains('.') && !BUILT_IN_GROUPS.contains(&group))
        .then(|| format!("{resource}.{group}"))
}

/// How long a CRD watch may run before the server closes it (and it is
/// reopened after a list): a few requests an hour per waiting informer.
const WATCH_TIMEOUT_SECS: u32 = 290;

/// The shortest time between two lists of the CRD, doubled after each
/// round that ends in an error (up to [`MAX_ROUND`]), so that a watch the
/// server ends at once, or a server that fails, makes no request loop.
const MIN_ROUND: Duration = Duration::from_secs(5);
const MAX_ROUND: Duration = Duration::from_secs(80);

/// Resolves once the CRD `name` is established and serves `version`.
/// Never, should the CRD not be readable or watchable (401, 403): the
/// Reflector's backoff then finds the resource, later. One list, then
/// one watch every few minutes, while it waits.
pub(crate) async fn crd_serves(client: Client, name: String, version: String) {
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let selector = format!("metadata.name={name}");
    let mut pause = MIN_ROUND;
    let refused = |e: &kube_client::Error| matches!(e, kube_client::Error::Api(status) if status.code == 401 || status.code == 403);
    loop {
        let round = Instant::now();
        let failed = match crds.list(&ListParams::default().fields(&selector)).await {
            Err(e) if refused(&e) => {
                info!(crd = %name, error = %e, "cannot read the CustomResourceDefinition; finding the resource by listing it after a backoff");
                return std::future::pending().await;
            }
            Err(e) => {
                debug!(crd = %name, error = %e, "listing the CustomResourceDefinition failed");
                true
            }
            Ok(list) if list.items.iter().any(|crd| serves(crd, &version)) => return,
            Ok(list) => {
                let from = list.metadata.resource_version.unwrap_or_default();
                let params = WatchParams::default()
                    .fields(&selector)
                    .timeout(WATCH_TIMEOUT_SECS);
                match crds.watch(&params, &from).await {
                    Err(e) if refused(&e) => {
                        info!(crd = %name, error = %e, "cannot watch the CustomResourceDefinition; finding the resource by listing it after a backoff");
                        return std::future::pending().await;
                    }
                    Err(e) => {
                        debug!(crd = %name, error = %e, "cannot watch the CustomResourceDefinition");
                        true
                    }
                    Ok(events) => {
                        let mut events = std::pin::pin!(events);
                        loop {
                            match events.try_next().await {
                                Ok(Some(WatchEvent::Added(crd) | WatchEvent::Modified(crd)))
                                    if serves(&crd, &version) =>
                                {
                                    return;
                                }
                                Ok(Some(WatchEvent::Error(e))) => {
                                    debug!(crd = %name, error = %e, "the CustomResourceDefinition's watch ended");
                                    break true;
                                }
                                Ok(Some(_)) => {}
                                Ok(None) => break false,
                                Err(e) => {
                                    debug!(crd = %name, error = %e, "the CustomResourceDefinition's watch failed");
                                    break true;
                                }
                            }
                        }
                    }
                }
            }
        };
        pause = if failed {
            (pause * 2).min(MAX_ROUND)
        } else {
            MIN_ROUND
        };
        tokio::time::sleep_until(round + pause).await;
    }
}

/// Whether `crd` is established and serves `version`, and is not being
/// deleted (a terminating CRD stays established while its objects go,
/// and its resource is not served for long).
fn serves(crd: &CustomResourceDefinition, version: &str) -> bool {
    if crd.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let established = crd.status.as_ref().is_some_and(|status| {
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Established" && c.status == "True")
    });
    established
        && crd
            .spec
            .versions
            .iter()
            .any(|v| v.name == version && v.served)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_groups_a_crd_can_have_are_waited_for_by_their_crd() {
        assert_eq!(crd_name("", "pods"), None);
        assert_eq!(crd_name("apps", "deployments"), None);
        assert_eq!(crd_name("networking.k8s.io", "ingresses"), None);
        assert_eq!(
            crd_name("example.com", "widgets").as_deref(),
            Some("widgets.example.com")
        );
        assert_eq!(
            crd_name("gateway.networking.k8s.io", "gateways").as_deref(),
            Some("gateways.gateway.networking.k8s.io")
        );
    }

    fn crd(established: &str, versions: &[(&str, bool)]) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"plural": "widgets", "kind": "Widget"},
                "scope": "Namespaced",
                "versions": versions.iter().map(|(name, served)| serde_json::json!({
                    "name": name, "served": served, "storage": true,
                })).collect::<Vec<_>>(),
            },
            "status": {"conditions": [{"type": "Established", "status": established}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_crd_serves_a_version_once_established_and_while_that_version_is_served() {
        assert!(serves(&crd("True", &[("v1", true)]), "v1"));
        assert!(!serves(&crd("False", &[("v1", true)]), "v1"));
        assert!(!serves(&crd("True", &[("v1", false), ("v2", true)]), "v1"));
        assert!(serves(&crd("True", &[("v1", false), ("v2", true)]), "v2"));
        assert!(!serves(&crd("True", &[("v2", true)]), "v1"));
        let mut terminating = crd("True", &[("v1", true)]);
        terminating.metadata.deletion_timestamp =
            Some(serde_json::from_value(serde_json::json!("2026-12-07T00:00:00Z")).unwrap());
        assert!(!serves(&terminating, "v1"), "a CRD being deleted");
    }
}
