//! [`ShardScope`]: the shard one or more lister-watchers ask for, changed
//! while they run; a change ends their watches with
//! [`ListWatchError::Rescoped`] so that each lists the new shard at once.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use kube_client::Resource;
use kube_client::core::watch::{Bookmark, BookmarkMeta};
use kube_client::core::{TypeMeta, WatchEvent};
use serde::de::DeserializeOwned;

use super::{ApiListerWatcher, ListPage, WatchStream};
use crate::{ListWatchError, ShardSelector, ShardStats};

/// A lister-watcher's shard: the scope that sets it, the shard its last
/// list asked for, and how it went.
pub(super) struct Sharding {
    pub(super) scope: ShardScope,
    /// The shard of the last list: the one the cache holds, which continue
    /// pages and watches must ask for. Not shared between clones.
    listed: parking_lot::Mutex<Option<Arc<Shard>>>,
    pub(super) stats: Arc<ShardStats>,
}

impl Sharding {
    pub(super) fn new(scope: ShardScope, stats: Arc<ShardStats>) -> Self {
        scope.users.fetch_add(1, Ordering::SeqCst);
        Self {
            scope,
            listed: parking_lot::Mutex::new(None),
            stats,
        }
    }

    /// The shard a list call asks for: the scope's now for a new list
    /// (the streaming list included), the listed one for its next pages.
    pub(super) fn for_list(&self, continuing: bool) -> Arc<Shard> {
        let mut listed = self.listed.lock();
        if continuing && let Some(shard) = &*listed {
            return Arc::clone(shard);
        }
        let now = self.scope.current();
        *listed = Some(Arc::clone(&now));
        now
    }

    /// The shard a watch from the last list asks for; `Rescoped` when the
    /// scope has changed since that list.
    pub(super) fn for_watch(&self) -> Result<Arc<Shard>, ListWatchError> {
        let listed = self.listed.lock().clone();
        let now = self.scope.current();
        match listed {
            Some(listed) if Arc::ptr_eq(&listed, &now) => {
                // The Reflector watches once it has handed the list over.
                self.scope.mark_listed(&now);
                Ok(now)
            }
            Some(_) => Err(ListWatchError::Rescoped(format!(
                "the shard is now {}",
                now.printed
            ))),
            // A watch without a list before it: the shard as it is now.
            None => Ok(now),
        }
    }
}

/// A shard selector, printed once, and its generation in its scope.
#[derive(Debug)]
pub(super) struct Shard {
    selector: ShardSelector,
    pub(super) printed: String,
    generation: u64,
}

/// The shard of one or more sharded lister-watchers, changed while they
/// run: the slots a replica of a sharded controller holds, say. Each
/// lister-watcher given it ([`ApiListerWatcher::shard_scope`]) asks for the
/// shard as it is when a list starts; when it changes, a watch from an
/// older shard ends with [`ListWatchError::Rescoped`], and the Reflector
/// lists again at once: the objects of the new shard arrive as adds, those
/// no longer in it leave the cache as deletions. Clones share the scope.
#[derive(Clone)]
pub struct ShardScope {
    current: Arc<tokio::sync::watch::Sender<Arc<Shard>>>,
    /// The generation of the newest shard whose list was complete.
    listed: Arc<AtomicU64>,
    /// Lister-watchers given this scope.
    users: Arc<std::sync::atomic::AtomicUsize>,
}

/// Scopes are equal when they are clones of one another.
impl PartialEq for ShardScope {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.current, &other.current)
    }
}

impl Eq for ShardScope {}

impl std::hash::Hash for ShardScope {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.current).hash(state);
    }
}

impl std::fmt::Debug for ShardScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ShardScope")
            .field(&self.current.borrow().printed)
            .finish()
    }
}

impl ShardScope {
    /// A scope holding `selector`.
    pub fn new(selector: ShardSelector) -> Self {
        let (current, _) = tokio::sync::watch::channel(Arc::new(Shard::new(selector, 1)));
        Self {
            current: Arc::new(current),
            listed: Arc::default(),
            users: Arc::default(),
        }
    }

    /// Changes the shard; a no-op when it is the same. Returns whether it
    /// changed.
    pub fn set(&self, selector: ShardSelector) -> bool {
        self.current.send_if_modified(|shard| {
            if shard.selector == selector {
                return false;
            }
            *shard = Arc::new(Shard::new(selector, shard.generation + 1));
            true
        })
    }

    /// The shard now.
    pub fn selector(&self) -> ShardSelector {
        self.current.borrow().selector.clone()
    }

    /// The generation of the shard now: 1 for the first, one more at each
    /// change.
    pub fn generation(&self) -> u64 {
        self.current.borrow().generation
    }

    /// The generation of the newest shard whose list a Reflector has
    /// handed to its queue in full (seen when it watches after the list, or
    /// reads on after the end of a streaming list); 0 before any. Once it
    /// reaches [`generation`](Self::generation) and the informer's queue
    /// has been empty since
    /// ([`SharedIndexInformer::queued`](crate::SharedIndexInformer::queued)),
    /// the cache holds the objects of the shard as it is now.
    pub fn listed_generation(&self) -> u64 {
        self.listed.load(Ordering::SeqCst)
    }

    /// Whether a lister-watcher has been given this scope (and so lists
    /// it).
    pub fn in_use(&self) -> bool {
        self.users.load(Ordering::SeqCst) > 0
    }

    fn mark_listed(&self, shard: &Shard) {
        self.listed.fetch_max(shard.generation, Ordering::SeqCst);
    }

    pub(super) fn current(&self) -> Arc<Shard> {
        Arc::clone(&self.current.borrow())
    }

    /// Resolves once the shard is no longer `shard`.
    fn changed_from(&self, shard: Arc<Shard>) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.current.subscribe();
        async move {
            // The sender lives as long as `self`, which the lister-watcher holds.
            let _ = rx.wait_for(|now| !Arc::ptr_eq(now, &shard)).await;
        }
    }
}

impl Shard {
    fn new(selector: ShardSelector, generation: u64) -> Self {
        Self {
            printed: selector.to_string(),
            selector,
            generation,
        }
    }
}

impl<K> ApiListerWatcher<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Keeps the page's objects of the shard, and notes whether the server
    /// applied the selector.
    pub(super) fn shard_page(&self, mut page: ListPage<K>, shard: Option<&Shard>) -> ListPage<K> {
        let (Some(sharding), Some(shard)) = (&self.shard, shard) else {
            return page;
        };

        let echoed = page
            .shard_selector
            .as_deref()
            .and_then(|s| s.parse::<ShardSelector>().ok());
        if echoed.as_ref() == Some(&shard.selector) {
            sharding.stats.server_applied();
        } else if let Some(other) = &page.shard_selector {
            tracing::warn!(asked = %shard.printed, applied = %other, "the server applied another shard selector than asked; filtering on the client");
        }
        let before = page.items.len();
        page.items.retain(|o| shard.selector.matches(o));
        sharding
            .stats
            .filtered((before - page.items.len()) as u64, "list", &shard.selector);
        page
    }

    /// Drops the events of objects outside the shard, and ends with
    /// [`ListWatchError::Rescoped`] once the scope's shard is another.
    pub(super) fn shard_events(
        &self,
        events: WatchStream<K>,
        shard: Option<Arc<Shard>>,
    ) -> WatchStream<K> {
        let (Some(sharding), Some(shard)) = (&self.shard, shard) else {
            return events;
        };
        let stats = Arc::clone(&sharding.stats);
        let scope = sharding.scope.clone();
        let listed = Arc::clone(&shard);
        let end_seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let end_polled = Arc::clone(&end_seen);
        let mut changed = Box::pin(sharding.scope.changed_from(Arc::clone(&shard)));
        let mut ended = false;
        let mut events = events
            .filter_map(move |event| {
                let passed = match event {
                    Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o))
                        if !shard.selector.matches(&o) =>
                    {
                        stats.filtered(1, "watch", &shard.selector);
                        // Another shard's change, passed on as a bookmark at
                        // its version: the watch has come this far, and the
                        // cache's resourceVersion moves on as it would
                        // unsharded (what waits for a version this shard
                        // never sees is not held up until the server's next
                        // bookmark). Without a version, dropped.
                        o.meta()
                            .resource_version
                            .as_deref()
                            .filter(|rv| !rv.is_empty())
                            .map(|rv| {
                                Ok(WatchEvent::Bookmark(Bookmark {
                                    types: TypeMeta::default(),
                                    metadata: BookmarkMeta {
                                        resource_version: rv.to_owned(),
                                        annotations: Default::default(),
                                    },
                                }))
                            })
                    }
                    Ok(WatchEvent::Bookmark(b)) => {
                        // The end of a streaming list: marked listed at the
                        // next poll, once the Reflector has handed it over.
                        if b.metadata
                            .annotations
                            .get("k8s.io/initial-events-end")
                            .is_some_and(|v| v == "true")
                        {
                            end_seen.store(true, Ordering::SeqCst);
                        }
                        Some(Ok(WatchEvent::Bookmark(b)))
                    }
                    other => Some(other),
                };
                futures::future::ready(passed)
            })
            .boxed();
        futures::stream::poll_fn(move |cx| {
            use std::task::Poll;
            if ended {
                return Poll::Ready(None);
            }
            // The Reflector polls again only once it has handed the
            // streaming list to its queue.
            if end_polled.swap(false, Ordering::SeqCst) {
                scope.mark_listed(&listed);
            }
            if changed.as_mut().poll(cx).is_ready() {
                ended = true;
                return Poll::Ready(Some(Err(ListWatchError::Rescoped(
                    "the shard changed while watching".into(),
                ))));
            }
            let next = events.poll_next_unpin(cx);
            ended = matches!(next, Poll::Ready(None));
            next
        })
        .boxed()
    }
}
