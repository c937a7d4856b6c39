//! A finalizer around a reconcile: cleanup runs before an object goes away.
//!
//! [`finalizer`] is the usual three-way step of a controller that owns
//! something outside the object (controller-runtime's finalizer helpers,
//! kube-runtime's `finalizer`):
//! - the object is not being deleted and lacks the finalizer: add it, then
//!   [`FinalizerEvent::Apply`] the object as written, in the same call
//!   (the update the write causes changes no generation, so an event
//!   filter such as [`predicate::generation_changed`](crate::predicate::generation_changed)
//!   drops it: waiting for it would leave the object never applied);
//! - the object is not being deleted and has it: [`FinalizerEvent::Apply`];
//! - the object is being deleted and has it: [`FinalizerEvent::Cleanup`],
//!   and once that succeeds, remove the finalizer so the server can delete
//!   the object; an object being deleted without it is left alone.
//!
//! The closure returns the same [`ReconcileError`] as a reconcile, so `?`
//! works on any error in it without annotations, and a [`TerminalError`]
//! returned from it stays terminal (the controller finds it through
//! [`FinalizerError::Reconcile`]'s `source()`). An error of another type
//! returned as it is, `Err(e)` with `e` a `kube::Error`, does not convert:
//! write `Err(e.into())` or `Err(e)?`. rustc's message for it ("expected
//! `Box<dyn Error + Send + Sync>`, found `Error`", then "consider pinning
//! your async block") points at the closure, and pinning is not the fix. A
//! closure generic over its error type would take this away but break
//! `?`, whose error type the closure's result then no longer names.
//!
//! ```no_run
//! use std::sync::Arc;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kinformer_controllers::{Action, FinalizerEvent, ReconcileError, TerminalError, finalizer};
//! use kube_client::{Api, api::DeleteParams};
//!
//! async fn reconcile(cm: Arc<ConfigMap>, api: Api<ConfigMap>) -> Result<Action, ReconcileError> {
//!     let action = finalizer(&api, "example.com/cleanup", cm, async |event| match event {
//!         FinalizerEvent::Apply(cm) => {
//!             let Some(raw) = cm.data.as_ref().and_then(|d| d.get("settings")) else {
//!                 return Err(TerminalError::boxed("no settings")); // not retried
//!             };
//!             let _settings: serde_json::Value = serde_json::from_str(raw)?; // a serde_json::Error
//!             Ok(Action::Done)
//!         }
//!         FinalizerEvent::Cleanup(cm) => {
//!             api.delete(&format!("{}-copy", cm.metadata.name.as_deref().unwrap_or_default()),
//!                 &DeleteParams::default()).await?; // a kube_client::Error
//!             Ok(Action::Done)
//!         }
//!     })
//!     .await?;
//!     Ok(action)
//! }
//! ```
//!
//! Writes are merge patches of `metadata.finalizers` carrying the object's
//! `resourceVersion`, so a write based on a stale copy fails with 409 Conflict
//! (and is retried by the workqueue) instead of dropping another
//! controller's finalizer.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use kube_client::api::{Api, Patch, PatchParams};
use kube_client::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use thiserror::Error;

#[cfg(doc)]
use crate::TerminalError;
use crate::{Action, ReconcileError};

/// What the reconcile inside [`finalizer`] is asked to do.
#[derive(Debug)]
pub enum FinalizerEvent<K> {
    /// Bring the world in line with the object.
    Apply(Arc<K>),
    /// The object is being deleted: undo what `Apply` did.
    Cleanup(Arc<K>),
}

/// [`finalizer`] failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FinalizerError {
    /// The reconcile returned an error (for `Apply` or `Cleanup`); it is
    /// this error's `source()`, so a [`TerminalError`] in it stays terminal.
    #[error("reconcile failed")]
    Reconcile(#[source] ReconcileError),
    /// Adding the finalizer failed.
    #[error("cannot add finalizer {finalizer:?} to {object}")]
    Add {
        /// The finalizer.
        finalizer: String,
        /// `namespace/name` of the object.
        object: String,
        /// Why.
        source: kube_client::Error,
    },
    /// Removing the finalizer after a successful cleanup failed.
    #[error("cannot remove finalizer {finalizer:?} from {object}")]
    Remove {
        /// The finalizer.
        finalizer: String,
        /// `namespace/name` of the object.
        object: String,
        /// Why.
        source: kube_client::Error,
    },
    /// The object has no name.
    #[error("the object has no name")]
    Unnamed,
}

/// Runs `reconcile` under the finalizer `name` (for example
/// `example.com/cleanup`) for `obj`, written through `api`; see the module
/// docs for what happens when.
pub async fn finalizer<K, F, Fut>(
    api: &Api<K>,
    name: &str,
    obj: Arc<K>,
    reconcile: F,
) -> Result<Action, FinalizerError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    F: FnOnce(FinalizerEvent<K>) -> Fut,
    Fut: Future<Output = Result<Action, ReconcileError>>,
{
    let object = describe(obj.as_ref());
    let object_name = obj.meta().name.clone().ok_or(FinalizerError::Unnamed)?;
    let has = obj.finalizers().iter().any(|f| f == name);
    let deleting = obj.meta().deletion_timestamp.is_some();
    match (deleting, has) {
        (false, false) => {
            let mut finalizers = obj.finalizers().to_vec();
            finalizers.push(name.to_owned());
            let written = write(api, &object_name, obj.as_ref(), finalizers)
                .await
                .map_err(|source| FinalizerError::Add {
                    finalizer: name.to_owned(),
                    object,
                    source,
                })?;
            reconcile(FinalizerEvent::Apply(Arc::new(written)))
                .await
                .map_err(FinalizerError::Reconcile)
        }
        (false, true) => reconcile(FinalizerEvent::Apply(obj))
            .await
            .map_err(FinalizerError::Reconcile),
        (true, true) => {
            let action = reconcile(FinalizerEvent::Cleanup(Arc::clone(&obj)))
                .await
                .map_err(FinalizerError::Reconcile)?;
            let rest: Vec<String> = obj
                .finalizers()
                .iter()
                .filter(|f| *f != name)
                .cloned()
                .collect();
            write(api, &object_name, obj.as_ref(), rest)
                .await
                .map(drop)
                .map_err(|source| FinalizerError::Remove {
                    finalizer: name.to_owned(),
                    object,
                    source,
                })?;
            Ok(action)
        }
        (true, false) => Ok(Action::Done),
    }
}

async fn write<K>(
    api: &Api<K>,
    name: &str,
    obj: &K,
    finalizers: Vec<String>,
) -> Result<K, kube_client::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            // A stale copy must not overwrite someone else's finalizers.
            "resourceVersion": obj.meta().resource_version,
        }
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

fn describe<K: Resource>(obj: &K) -> String {
    match (&obj.meta().namespace, &obj.meta().name) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name.clone(),
        _ => "an object without a name".to_owned(),
    }
}
