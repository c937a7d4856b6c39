//! Waiting for caches to sync.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Something that can tell whether it has synced: an informer or a handler
/// registration.
pub trait HasSynced: Send + Sync {
    /// Whether it has synced.
    fn has_synced(&self) -> bool;
}

impl<K: kinformer_store::Object + Clone> HasSynced for crate::SharedIndexInformer<K> {
    fn has_synced(&self) -> bool {
        crate::SharedIndexInformer::has_synced(self)
    }
}

impl HasSynced for crate::ResourceEventHandlerRegistration {
    fn has_synced(&self) -> bool {
        crate::ResourceEventHandlerRegistration::has_synced(self)
    }
}

impl<F: Fn() -> bool + Send + Sync> HasSynced for F {
    fn has_synced(&self) -> bool {
        self()
    }
}

/// Waits until every one of `informers` has synced (true), or `shutdown`
/// fires first (false): client-go's `WaitForCacheSync`, polling every 100 ms.
pub async fn wait_for_cache_sync(
    shutdown: &CancellationToken,
    informers: &[&dyn HasSynced],
) -> bool {
    loop {
        if informers.iter().all(|i| i.has_synced()) {
            return true;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}
