//! pod-stdout: prints every Pod add, update and delete, as client-go's
//! workqueue example controller does.
//!
//! It prints what the cache holds when a key is reconciled, so one change
//! may print twice: a deleted Pod, even one on no node, changes twice on
//! the API server (first marked with a deletionTimestamp, then removed),
//! each change queues its key, and a key queued while it is reconciled is
//! reconciled once more after. When both reconciles start after the
//! removal, `does not exist anymore` prints twice; client-go's example
//! does the same when its worker is as quick.

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kinformer_informer::Lister;

use crate::{Action, ReconcileError, Reconciler, Request};

/// Where pod-stdout writes its lines (stdout by default).
pub type Output = Arc<dyn Fn(&str) + Send + Sync>;

/// Reconciles a Pod key by printing what the cache holds for it:
/// `Sync/Add/Update for Pod <name>` while it exists,
/// `Pod <namespace>/<name> does not exist anymore` once it is gone.
pub struct PodStdout {
    lister: Lister<Pod>,
    output: Output,
}

impl PodStdout {
    /// Prints to stdout.
    pub fn new(lister: Lister<Pod>) -> Self {
        Self::with_output(lister, Arc::new(|line: &str| println!("{line}")))
    }

    /// Sends each line to `output`.
    pub fn with_output(lister: Lister<Pod>, output: Output) -> Self {
        Self { lister, output }
    }
}

impl std::fmt::Debug for PodStdout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodStdout").finish_non_exhaustive()
    }
}

impl Reconciler for PodStdout {
    fn reconcile<'a>(
        &'a self,
        request: &'a Request,
    ) -> BoxFuture<'a, Result<Action, ReconcileError>> {
        Box::pin(async move {
            let key = &request.key;
            match self.lister.get(key.as_str()) {
                Some(pod) => {
                    let name = pod.metadata.name.as_deref().unwrap_or(key.name());
                    (self.output)(&format!("Sync/Add/Update for Pod {name}"));
                }
                None => {
                    let (ns, name) = (key.namespace().unwrap_or_default(), key.name());
                    (self.output)(&format!("Pod {ns}/{name} does not exist anymore"));
                }
            }
            Ok(Action::Done)
        })
    }
}
