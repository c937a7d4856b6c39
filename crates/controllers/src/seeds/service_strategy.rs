//! service-strategy: keeps a Service's `spec.selector["app"]` equal to the
//! strategy named by its [`STRATEGY_ANNOTATION`].
//!
//! - Services without the annotation are left alone; so is a deleted Service.
//! - The value `panic` makes the reconcile panic: the demonstration that the
//!   runtime recovers, counts the panic and retries the key with backoff.
//! - A value that is not a valid label value is reported (a Warning Event on
//!   the Service and a log line) and never written.
//! - A Service already in the wanted state gets no write. The write carries
//!   the cached resourceVersion, so a stale cache yields 409 Conflict, which
//!   is retried with backoff like any other failed write.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kinformer_informer::Lister;
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use tracing::{info, warn};

use crate::{Action, Event, ReconcileError, Reconciler, Request};

/// The annotation naming a Service's strategy.
pub const STRATEGY_ANNOTATION: &str = "kinformer.dev/strategy";

/// The field manager of the controller's writes.
pub const FIELD_MANAGER: &str = "kinformer-service-strategy";

/// The strategy a Service asks for, if any.
pub fn strategy_of(svc: &Service) -> Option<&str> {
    svc.metadata
        .annotations
        .as_ref()?
        .get(STRATEGY_ANNOTATION)
        .map(String::as_str)
}

/// Which events matter: adds and real updates (a new resourceVersion) of
/// annotated Services; never deletes, and never a resync.
pub fn event_filter(event: Event<'_, Service>) -> bool {
    match event {
        Event::Add(svc) => strategy_of(svc).is_some(),
        Event::Update { old, new } => {
            old.metadata.resource_version != new.metadata.resource_version
                && strategy_of(new).is_some()
        }
        Event::Delete(_) => false,
    }
}

/// Why a strategy value cannot be used as a label value, if it cannot
/// (Kubernetes' rule: at most 63 characters, alphanumerics, `-`, `_` and
/// `.`, starting and ending with an alphanumeric).
pub fn invalid_label_value(value: &str) -> Option<String> {
    if value.len() > 63 {
        return Some(format!("{} characters, more than 63", value.len()));
    }
    if value.is_empty() {
        return None;
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if let Some(c) = value.chars().find(|c| !ok_char(*c)) {
        return Some(format!("character {c:?} is not allowed"));
    }
    let first = value
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    let last = value
        .chars()
        .last()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    if !(first && last) {
        return Some("must start and end with a letter or digit".to_owned());
    }
    None
}

/// The service-strategy reconciler.
pub struct ServiceStrategy {
    lister: Lister<Service>,
    client: Client,
}

impl ServiceStrategy {
    /// Reads Services from `lister`, writes them through `client`.
    pub fn new(lister: Lister<Service>, client: Client) -> Self {
        Self { lister, client }
    }

    async fn report_invalid(&self, svc: &Service, value: &str, why: &str) {
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let message = format!(
            "annotation {STRATEGY_ANNOTATION}={value:?} is not a valid label value ({why}); selector left unchanged"
        );
        warn!(service = %format!("{ns}/{name}"), %message, "invalid strategy");
        let now = Time(Timestamp::now());
        let event = CoreEvent {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}.")),
                namespace: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Service".into()),
                name: Some(name),
                namespace: Some(ns.clone()),
                uid: svc.metadata.uid.clone(),
                resource_version: svc.metadata.resource_version.clone(),
                ..ObjectReference::default()
            },
            reason: Some("InvalidStrategy".into()),
            message: Some(message),
            type_: Some("Warning".into()),
            source: Some(EventSource {
                component: Some("service-strategy".into()),
                ..EventSource::default()
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..CoreEvent::default()
        };
        let events: Api<CoreEvent> = Api::namespaced(self.client.clone(), &ns);
        if let Err(e) = events.create(&PostParams::default(), &event).await {
            warn!(error = %e, "could not record the InvalidStrategy event");
        }
    }
}

impl std::fmt::Debug for ServiceStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceStrategy").finish_non_exhaustive()
    }
}

impl Reconciler for ServiceStrategy {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        Box::pin(async move {
            let key = &request.key;
            let (namespace, name) = (key.namespace(), key.name());
            let Some(svc) = self.lister.get(key.as_str()) else {
                return Ok(Action::Done);
            };
            let Some(strategy) = strategy_of(&svc) else {
                return Ok(Action::Done);
            };
            if strategy == "panic" {
                panic!("Service {key} asks for strategy \"panic\"");
            }
            if let Some(why) = invalid_label_value(strategy) {
                self.report_invalid(&svc, strategy, &why).await;
                return Ok(Action::Done);
            }
            let current = svc
                .spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .and_then(|s| s.get("app"));
            if current.map(String::as_str) == Some(strategy) {
                return Ok(Action::Done);
            }
            let mut wanted = (*svc).clone();
            wanted
                .spec
                .get_or_insert_with(Default::default)
                .selector
                .get_or_insert_with(BTreeMap::new)
                .insert("app".into(), strategy.to_owned());
            let api: Api<Service> =
                Api::namespaced(self.client.clone(), namespace.unwrap_or("default"));
            let pp = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            api.replace(name, &pp, &wanted)
                .await
                .map_err(|source| WriteError {
                    key: key.clone(),
                    source,
                })?;
            info!(service = key.as_str(), app = strategy, from = ?current, "set selector app");
            Ok(Action::Done)
        })
    }
}

/// A Service write that failed; the server's answer is its source (kept,
/// so that a refusal is counted as one: `kinformer_reconcile_denied`).
#[derive(Debug, thiserror::Error)]
#[error("writing Service {key}")]
struct WriteError {
    key: kinformer_store::ObjectKey,
    source: kube_client::Error,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_validated_as_kubernetes_does() {
        for ok in ["", "blue", "blue-green", "v1.2_3", &"a".repeat(63)] {
            assert_eq!(invalid_label_value(ok), None, "{ok}");
        }
        for (bad, why) in [
            ("blue green", "' '"),
            ("-blue", "start and end"),
            ("blue.", "start and end"),
            ("a/b", "'/'"),
            (&"a".repeat(64), "more than 63"),
        ] {
            let got = invalid_label_value(bad).unwrap();
            assert!(got.contains(why), "{bad}: {got}");
        }
    }
}
