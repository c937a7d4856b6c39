//! Opening a watch from the last version seen, and reading it into the
//! queue until it ends.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinformer_store::Object;
use kube_client::core::WatchEvent;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{Reflector, ReflectorStats};
use crate::lister_watcher::{WatchRequest, WatchStream};
use crate::{Detail, ListWatchError};

/// How a watch ended.
pub(super) enum WatchEnd {
    /// The shutdown token fired.
    Stopped,
    /// The server closed the watch.
    Closed { events: u64, lasted: Duration },
    /// Nothing arrived for the idle timeout.
    Idle,
    /// The watch failed.
    Failed(ListWatchError),
}

impl<K: Object + Clone> Reflector<K> {
    /// Opens the next watch from the last version seen (`None` on
    /// shutdown). One that does not open within the idle timeout (a
    /// half-open connection) fails, as one that goes quiet does.
    pub(super) async fn open_watch(
        &self,
        shutdown: &CancellationToken,
    ) -> Result<Option<WatchStream<K>>, ListWatchError> {
        let resource_version = self.last_sync_rv.read().clone();
        let timeout = self.watch_timeout();
        let request = WatchRequest {
            resource_version: resource_version.clone(),
            timeout,
            allow_bookmarks: true,
            send_initial_events: false,
        };
        ReflectorStats::bump(&self.stats.watches);
        let stream = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(None),
            opened = tokio::time::timeout(self.options.idle_timeout, self.lw.watch(request)) => {
                opened.unwrap_or_else(|_| Err(ListWatchError::Connect(format!(
                    "the watch did not open within {:?}", self.options.idle_timeout
                ).into())))?
            }
        };
        debug!(resource_version = %resource_version, timeout_s = timeout.as_secs(), "watch started");
        Ok(Some(stream))
    }

    /// Reads `stream` into the queue until it ends, recording the version
    /// of each event and bookmark.
    pub(super) async fn watch_handler(
        &self,
        mut stream: WatchStream<K>,
        shutdown: &CancellationToken,
    ) -> WatchEnd {
        let started = Instant::now();
        let mut events = 0u64;
        loop {
            let next = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return WatchEnd::Stopped,
                next = tokio::time::timeout(self.options.idle_timeout, stream.next()) => next,
            };
            let event = match next {
                Err(_) => return WatchEnd::Idle,
                Ok(None) => {
                    return WatchEnd::Closed {
                        events,
                        lasted: started.elapsed(),
                    };
                }
                Ok(Some(Ok(event))) => event,
                Ok(Some(Err(e @ (ListWatchError::Decode(_) | ListWatchError::Undecodable(_))))) => {
                    // Skipping it would move the resource version past a
                    // change the cache never got: relist instead (which
                    // keeps what is cached under its key).
                    if matches!(e, ListWatchError::Undecodable(_)) {
                        ReflectorStats::bump(&self.stats.undecodable_objects);
                    }
                    return WatchEnd::Failed(ListWatchError::Decode(Detail::caused(
                        "undecodable watch event",
                        e,
                    )));
                }
                Ok(Some(Err(e))) => return WatchEnd::Failed(e),
            };
            let (rv, result) = match event {
                WatchEvent::Added(obj) => {
                    let rv = obj.resource_version().map(str::to_owned);
                    match self.transform(obj) {
                        Ok(obj) => (rv, self.fifo.add(Arc::new(obj))),
                        Err(e) => return WatchEnd::Failed(ListWatchError::Undecodable(e)),
                    }
                }
                WatchEvent::Modified(obj) => {
                    let rv = obj.resource_version().map(str::to_owned);
                    match self.transform(obj) {
                        Ok(obj) => (rv, self.fifo.update(Arc::new(obj))),
                        Err(e) => return WatchEnd::Failed(ListWatchError::Undecodable(e)),
                    }
                }
                WatchEvent::Deleted(obj) => {
                    let rv = obj.resource_version().map(str::to_owned);
                    match self.transform(obj) {
                        Ok(obj) => (rv, self.fifo.delete(Arc::new(obj))),
                        Err(e) => return WatchEnd::Failed(ListWatchError::Undecodable(e)),
                    }
                }
                WatchEvent::Bookmark(bookmark) => {
                    let rv = bookmark.metadata.resource_version;
                    // Passed on behind the events before it (an atomic
                    // queue's consumer syncs its cache to it).
                    self.fifo.bookmark(&rv);
                    *self.last_sync_rv.write() = rv;
                    continue;
                }
                WatchEvent::Error(status) => {
                    return WatchEnd::Failed(ListWatchError::from_status(&status));
                }
            };
            events += 1;
            ReflectorStats::bump(&self.stats.events);
            if let Err(e) = result {
                self.report(&ListWatchError::Decode(Detail::caused(
                    "skipped a watch event",
                    e,
                )));
            }
            if let Some(rv) = rv {
                *self.last_sync_rv.write() = rv;
            }
        }
    }
}
