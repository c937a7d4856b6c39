//! Listing: a streaming list (a watch with `sendInitialEvents`) or pages,
//! each object handed to the queue's replace as it arrives; what a list
//! cannot decode or transform is left out with its cached version kept.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use futures::StreamExt;
use kinformer_fifo::QueueReplace;
use kinformer_store::{Object, meta_namespace_key, object_description};
use kube_client::core::WatchEvent;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use super::{DEFAULT_PAGE_SIZE, Reflector, ReflectorStats};
use crate::lister_watcher::{ListPage, ListRequest, Undecodable, WatchRequest, WatchStream};
use crate::panics::panic_message;
use crate::{Detail, ListWatchError};

/// A whole list, of one or more pages.
pub(super) struct Listed {
    resource_version: String,
    pages: u32,
    /// Whether the server answered in more than one page.
    paginated: bool,
}

/// What one list leaves for the next.
pub(super) struct ListState {
    /// The last version seen cannot be listed (410, or too large): list
    /// the latest.
    pub(super) last_sync_rv_unavailable: bool,
    /// The list at "0" came in pages: the watch cache is off for the
    /// resource, so every list is paged.
    pub(super) paginated_result: bool,
    /// Streaming lists failed once: list in pages from now on.
    pub(super) watch_list_unsupported: bool,
}

/// The annotation on the bookmark that ends a streaming list.
pub(super) const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How many objects of a streaming list are handed to the queue at once
/// (a paged list is handed over a page at a time): what a relist holds
/// beyond the cache and what the queue has not yet applied (all of the
/// list, if the informer falls that far behind), and few enough wake-ups
/// of the informer that
/// handing the list over costs no more CPU than one replace (measured:
/// handing over each object as it arrived took 1.5-1.8x the client CPU of a
/// sync of 50 000 Pods).
pub const LIST_BATCH: usize = 256;

impl<K: Object + Clone> Reflector<K> {
    /// The initial state through one watch with `sendInitialEvents=true`:
    /// ADDED events up to the bookmark annotated `k8s.io/initial-events-end`,
    /// handed to the queue as one replace, each object as it arrives (see
    /// [`InformerQueue::begin_replace`]). Returns the watch, which goes on
    /// with the events after that (`None` on shutdown).
    pub(super) async fn watch_list(
        &self,
        shutdown: &CancellationToken,
        reason: &str,
    ) -> Result<Option<WatchStream<K>>, ListWatchError> {
        let started = Instant::now();
        let resource_version = self.last_sync_rv.read().clone();
        info!(reason, resource_version = %resource_version, "streaming list");
        let request = WatchRequest {
            resource_version,
            timeout: self.watch_timeout(),
            allow_bookmarks: true,
            send_initial_events: true,
        };
        ReflectorStats::bump(&self.stats.watches);
        let deadline = Instant::now() + self.options.watch_list_timeout;
        let timed_out = || {
            ListWatchError::Connect(
                format!(
                    "no {INITIAL_EVENTS_END} bookmark within {:?}",
                    self.options.watch_list_timeout
                )
                .into(),
            )
        };
        let mut stream = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(None),
            opened = tokio::time::timeout_at(deadline, self.lw.watch(request)) => opened.map_err(|_| timed_out())??,
        };
        let mut replace = self.fifo.begin_replace();
        // Objects are handed over LIST_BATCH at a time: one lock and one
        // wake-up of the informer per batch, not per object.
        let mut batch: Vec<Arc<K>> = Vec::with_capacity(LIST_BATCH);
        loop {
            if batch.len() >= LIST_BATCH {
                self.hand_over(&mut replace, &mut batch);
            }
            let next = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(None),
                next = tokio::time::timeout_at(deadline, stream.next()) => next.map_err(|_| timed_out())?,
            };
            match next {
                None => {
                    return Err(ListWatchError::Connect(
                        "the streaming list ended before its initial-events-end bookmark".into(),
                    ));
                }
                Some(Err(ListWatchError::Undecodable(skipped))) => {
                    // One undecodable object is skipped; the list goes on.
                    self.skip(&mut replace, &skipped, "the streaming list");
                }
                Some(Err(ListWatchError::Decode(e))) => {
                    // A frame that does not decode at all: whose object it
                    // held is unknown, so nothing is inferred deleted.
                    self.skip(
                        &mut replace,
                        &Undecodable::new(None, crate::error_chain(&e)),
                        "the streaming list",
                    );
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(WatchEvent::Added(obj))) => match self.listed(obj) {
                    Ok(obj) => batch.push(obj),
                    Err(skipped) => self.skip(&mut replace, &skipped, "the streaming list"),
                },
                Some(Ok(WatchEvent::Bookmark(b))) => {
                    let ended = b
                        .metadata
                        .annotations
                        .get(INITIAL_EVENTS_END)
                        .is_some_and(|v| v == "true");
                    if !ended {
                        continue;
                    }
                    self.hand_over(&mut replace, &mut batch);
                    let count = replace.len();
                    let rv = b.metadata.resource_version;
                    replace.finish(&rv);
                    *self.last_sync_rv.write() = rv.clone();
                    ReflectorStats::bump(&self.stats.lists_completed);
                    info!(
                        items = count,
                        resource_version = %rv,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "streamed the initial list"
                    );
                    return Ok(Some(stream));
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    return Err(ListWatchError::from_status(&status));
                }
                Some(Ok(WatchEvent::Modified(_) | WatchEvent::Deleted(_))) => {
                    return Err(ListWatchError::Decode(
                        "a MODIFIED or DELETED event before the initial-events-end bookmark".into(),
                    ));
                }
            }
        }
    }

    /// The resource version to list at, as client-go's `relistResourceVersion`.
    pub(super) fn relist_resource_version(&self, state: &ListState) -> String {
        if state.last_sync_rv_unavailable {
            return String::new();
        }
        let last = self.last_sync_rv.read();
        if last.is_empty() {
            "0".to_owned()
        } else {
            last.clone()
        }
    }

    pub(super) async fn list(
        &self,
        state: &mut ListState,
        reason: &str,
    ) -> Result<(), ListWatchError> {
        let started = Instant::now();
        let resource_version = self.relist_resource_version(state);
        info!(reason, resource_version = %resource_version, "listing");
        let mut listed_at = resource_version.as_str();
        let mut replace = self.fifo.begin_replace();
        let listed = match self
            .list_pages(state, &resource_version, &mut replace)
            .await
        {
            Err(e)
                if (e.is_gone() || e.is_too_large_resource_version())
                    && !resource_version.is_empty() =>
            {
                // Too old even for the watch cache, or newer than this server
                // has seen (a lagging apiserver): read the latest.
                info!(error = %e, "resource version unavailable; listing the latest from etcd");
                state.last_sync_rv_unavailable = true;
                listed_at = "";
                // Pages of the failed list may have been handed over.
                replace.restart();
                self.list_pages(state, "", &mut replace).await?
            }
            other => other?,
        };
        let Listed {
            resource_version: list_rv,
            pages,
            paginated,
        } = listed;
        // Only a paginated answer to "0" means the watch cache is off for
        // this resource; a list at "" is paginated by etcd anyway, and must
        // not make every later relist bypass the watch cache.
        if paginated && listed_at == "0" {
            state.paginated_result = true;
        }
        state.last_sync_rv_unavailable = false;
        let count = replace.len();
        replace.finish(&list_rv);
        *self.last_sync_rv.write() = list_rv.clone();
        ReflectorStats::bump(&self.stats.lists_completed);
        info!(
            items = count,
            pages,
            resource_version = %list_rv,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "listed"
        );
        Ok(())
    }

    /// Lists in pages, each page's objects handed to `replace` as it
    /// arrives (a list is one page when no limit applies).
    async fn list_pages(
        &self,
        state: &ListState,
        resource_version: &str,
        replace: &mut QueueReplace<'_, K>,
    ) -> Result<Listed, ListWatchError> {
        let limit = match self.options.page_size {
            Some(n) => Some(n),
            None if state.paginated_result => Some(DEFAULT_PAGE_SIZE),
            None if resource_version.is_empty() || resource_version == "0" => {
                Some(DEFAULT_PAGE_SIZE)
            }
            None => None,
        };
        let rv = (!resource_version.is_empty()).then(|| resource_version.to_owned());
        let mut token: Option<String> = None;
        let mut pages = 0;
        let mut paginated = false;
        loop {
            let request = ListRequest {
                limit,
                continue_token: token.clone(),
                resource_version: if token.is_none() { rv.clone() } else { None },
            };
            ReflectorStats::bump(&self.stats.list_calls);
            let page = tokio::time::timeout(self.options.list_timeout, self.lw.list(request))
                .await
                .unwrap_or_else(|_| {
                    Err(ListWatchError::Connect(
                        format!(
                            "a list page did not arrive within {:?}",
                            self.options.list_timeout
                        )
                        .into(),
                    ))
                });
            match page {
                Ok(page) => {
                    pages += 1;
                    let page = self.take_page(replace, page).await;
                    match page.continue_token {
                        Some(next) => {
                            paginated = true;
                            token = Some(next);
                        }
                        None => {
                            return Ok(Listed {
                                resource_version: page.resource_version,
                                pages,
                                paginated,
                            });
                        }
                    }
                }
                Err(e) if e.is_gone() && token.is_some() => {
                    // client-go's pager: an expired continue token falls back
                    // to one full list at the original version.
                    info!(error = %e, pages, "continue token expired; listing everything at once");
                    ReflectorStats::bump(&self.stats.list_calls);
                    let page = self
                        .lw
                        .list(ListRequest {
                            limit: None,
                            continue_token: None,
                            resource_version: rv.clone(),
                        })
                        .await?;
                    // The pages taken already no longer count as listed:
                    // an object of theirs the full list lacks was deleted.
                    replace.restart();
                    let page = self.take_page(replace, page).await;
                    return Ok(Listed {
                        resource_version: page.resource_version,
                        pages: pages + 1,
                        paginated,
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Hands a page's objects to the replace in progress (reporting those
    /// the lister-watcher skipped); the page keeps its version and token.
    /// [`LIST_BATCH`] at a time, yielding to the runtime in between: a
    /// relist at a version is one page of the whole list, whose transform
    /// and hand-over would otherwise hold a runtime worker throughout.
    async fn take_page(
        &self,
        replace: &mut QueueReplace<'_, K>,
        mut page: ListPage<K>,
    ) -> ListPage<K> {
        for skipped in std::mem::take(&mut page.skipped) {
            self.skip(replace, &skipped, "a listed page");
        }
        let mut batch = Vec::with_capacity(page.items.len().min(LIST_BATCH));
        for obj in std::mem::take(&mut page.items) {
            match self.listed(obj) {
                Ok(obj) => batch.push(obj),
                Err(skipped) => self.skip(replace, &skipped, "a listed page"),
            }
            if batch.len() >= LIST_BATCH {
                self.hand_over(replace, &mut batch);
                tokio::task::yield_now().await;
            }
        }
        self.hand_over(replace, &mut batch);
        page
    }

    /// A listed object through the transform; one the transform panics on
    /// is undecodable.
    fn listed(&self, obj: K) -> Result<Arc<K>, Undecodable> {
        self.transform(obj).map(Arc::new)
    }

    /// An object of the list in progress that could not be decoded: left
    /// out, reported and counted, and its key kept, so that the list is not
    /// taken to say it was deleted (no key: no deletion inferred at all).
    fn skip(&self, replace: &mut QueueReplace<'_, K>, skipped: &Undecodable, list: &str) {
        ReflectorStats::bump(&self.stats.undecodable_objects);
        match &skipped.key {
            Some(key) => replace.keep(key),
            None => replace.keep_all(),
        }
        self.report(&ListWatchError::Decode(
            format!(
                "left one object of {list} out, keeping what is cached under its key: {skipped}"
            )
            .into(),
        ));
    }

    /// Hands `batch` (emptied) to the replace in progress; an object
    /// without a key is reported and left out, as an undecodable one is.
    fn hand_over(&self, replace: &mut QueueReplace<'_, K>, batch: &mut Vec<Arc<K>>) {
        if batch.is_empty() {
            return;
        }
        for e in replace.push_all(std::mem::take(batch)) {
            self.report(&ListWatchError::Decode(Detail::caused(
                "left a listed object out",
                e,
            )));
        }
    }

    /// The object through the transform; a panic of the transform makes
    /// the object [`Undecodable`] (it cannot be cached faithfully).
    pub(super) fn transform(&self, obj: K) -> Result<K, Undecodable> {
        let Some(transform) = &self.transform else {
            return Ok(obj);
        };
        // Taken first: the transform consumes the object.
        let key = meta_namespace_key(&obj).ok();
        let name = key.clone().unwrap_or_else(|| object_description(&obj));
        let transformed = catch_unwind(AssertUnwindSafe(|| transform(obj))).map_err(|panic| {
            ReflectorStats::bump(&self.stats.transform_panics);
            let panic = panic_message(panic.as_ref());
            error!(key = %name, panic = %panic, "the transform panicked; the object is treated as undecodable");
            Undecodable::new(key.clone(), format!("the transform panicked: {panic}"))
        })?;
        // A transform that leaves the object without a key has made it
        // uncacheable: undecodable under the key it came with, so the
        // cached version stays.
        if key.is_some() && transformed.name().is_none_or(str::is_empty) {
            return Err(Undecodable::new(
                key,
                "the transform left it without a name",
            ));
        }
        Ok(transformed)
    }
}
