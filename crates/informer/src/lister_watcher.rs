//! The seam between the Reflector and the API server.
//!
//! [`ListerWatcher`] lists one page or opens one watch; [`ApiListerWatcher`]
//! implements it on kube-client for any [`Resource`]: k8s-openapi types,
//! `#[derive(CustomResource)]` types, `DynamicObject` (with its
//! `ApiResource`) and `PartialObjectMeta<K>` (metadata only: the server is
//! asked for `PartialObjectMetadataList` and `PartialObjectMetadata`, as
//! kube-client does), namespaced or cluster-scoped, with label and field
//! selectors. Tests drive the Reflector with an in-memory implementation
//! instead.

use std::borrow::Cow;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use kube_client::api::{ListParams, VersionMatch};
use kube_client::core::{Request, WatchEvent};
use kube_client::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::protobuf::envelope::MEDIA_TYPE;
use crate::protobuf::schema::Kind as ProtoKind;
use crate::{
    Detail, JsonShape, ListWatchError, ShardSelector, ShardStats, strip_managed_fields_json,
};

/// One list call: a page of at most `limit` items (no limit when `None`),
/// continuing from `continue_token`, as of `resource_version`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListRequest {
    /// Page size; `None` lists everything at once.
    pub limit: Option<u32>,
    /// The token of the previous page.
    pub continue_token: Option<String>,
    /// `"0"`: any version (the watch cache); a version: not older than it
    /// (with `NotOlderThan`); `None`: the latest (a quorum read).
    pub resource_version: Option<String>,
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct ListPage<K> {
    /// The objects.
    pub items: Vec<K>,
    /// The list's resource version.
    pub resource_version: String,
    /// The token for the next page, if there is one.
    pub continue_token: Option<String>,
    /// Objects of the page that could not be decoded: left out and
    /// reported, the rest kept; the Reflector keeps the version cached
    /// under each one's key (it is not taken for deleted).
    pub skipped: Vec<Undecodable>,
    /// The shard selector the server says it applied
    /// (`ListMeta.shardInfo.selector`), if any.
    pub shard_selector: Option<String>,
}

/// An object of a list or a watch that could not be decoded: it is left
/// out, and the version cached under its key, if any, stays (the object is
/// not taken for deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    /// `namespace/name` (or `name`) as read from its bytes; `None` when
    /// even that could not be read.
    pub key: Option<String>,
    /// What was wrong, naming the object.
    pub reason: String,
}

impl Undecodable {
    /// The object under `key` (if known) could not be decoded because of `why`.
    pub fn new(key: Option<String>, why: impl std::fmt::Display) -> Self {
        let name = key
            .as_deref()
            .unwrap_or("an object without a readable name");
        Self {
            reason: format!("{name}: {why}"),
            key,
        }
    }
}

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// One watch call, from `resource_version`, ended by the server after
/// `timeout` (client-go randomises 5-10 minutes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRequest {
    /// Where to start.
    pub resource_version: String,
    /// Server-side timeout.
    pub timeout: Duration,
    /// Ask for BOOKMARK events.
    pub allow_bookmarks: bool,
    /// Streaming initial list: the server first sends the current state as
    /// ADDED events, then a bookmark annotated `k8s.io/initial-events-end`.
    pub send_initial_events: bool,
}

/// The events of one watch.
pub type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>, ListWatchError>>;

/// How objects travel from the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireFormat {
    /// Kubernetes protobuf for the built-in kinds and for metadata-only
    /// informers of any kind (lists, watches and the streaming list; what
    /// client-go's typed and metadata clients ask for), JSON for custom
    /// resources and `DynamicObject`, and whenever the server answers in
    /// JSON instead. The default.
    #[default]
    Auto,
    /// JSON always.
    Json,
}

/// Lists and watches one kind of object: client-go's `ListerWatcher`.
pub trait ListerWatcher<K>: Send + Sync + 'static {
    /// Lists one page.
    fn list(&self, request: ListRequest) -> BoxFuture<'_, Result<ListPage<K>, ListWatchError>>;
    /// Opens a watch.
    fn watch(&self, request: WatchRequest)
    -> BoxFuture<'_, Result<WatchStream<K>, ListWatchError>>;
    /// What is listed, for logs: for example `pods in namespace "web"`.
    fn describe(&self) -> String;
}

/// A [`ListerWatcher`] on kube-client: all objects of type `K` in one
/// namespace or in all, optionally narrowed by label and field selectors.
///
/// ```no_run
/// # fn demo(client: kube_client::Client) {
/// use k8s_openapi::api::core::v1::Pod;
/// use kinformer_informer::ApiListerWatcher;
/// use kube_client::core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};
///
/// let pods = ApiListerWatcher::<Pod>::namespaced(client.clone(), "web").labels("app=frontend");
/// // Metadata only: the server sends no spec or status.
/// let metas = ApiListerWatcher::<PartialObjectMeta<Pod>>::all(client.clone());
/// // Any kind, known at run time.
/// let gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
/// let widgets = ApiListerWatcher::<DynamicObject>::all_with(client, &ApiResource::from_gvk(&gvk));
/// # }
/// ```
pub struct ApiListerWatcher<K> {
    client: Client,
    url_path: String,
    plural: String,
    namespace: Option<String>,
    label_selector: Option<String>,
    field_selector: Option<String>,
    drop_managed_fields: bool,
    /// The built-in kind whose protobuf messages `K`'s are, when `K` takes protobuf.
    protobuf_kind: Option<&'static ProtoKind>,
    wire_format: WireFormat,
    /// The shard asked for, and how it went.
    shard: Option<Sharding>,
    /// Bytes of response bodies received, shared by clones.
    received: Arc<AtomicU64>,
    _kind: PhantomData<fn() -> K>,
}

/// A lister-watcher's shard: the scope that sets it, the shard its last
/// list asked for, and how it went.
struct Sharding {
    scope: ShardScope,
    /// The shard of the last list: the one the cache holds, which continue
    /// pages and watches must ask for. Not shared between clones.
    listed: parking_lot::Mutex<Option<Arc<Shard>>>,
    stats: Arc<ShardStats>,
}

impl Sharding {
    fn new(scope: ShardScope, stats: Arc<ShardStats>) -> Self {
        scope.users.fetch_add(1, Ordering::SeqCst);
        Self {
            scope,
            listed: parking_lot::Mutex::new(None),
            stats,
        }
    }

    /// The shard a list call asks for: the scope's now for a new list
    /// (the streaming list included), the listed one for its next pages.
    fn for_list(&self, continuing: bool) -> Arc<Shard> {
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
    fn for_watch(&self) -> Result<Arc<Shard>, ListWatchError> {
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
struct Shard {
    selector: ShardSelector,
    printed: String,
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

    fn current(&self) -> Arc<Shard> {
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

impl<K> Clone for ApiListerWatcher<K> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            url_path: self.url_path.clone(),
            plural: self.plural.clone(),
            namespace: self.namespace.clone(),
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            drop_managed_fields: self.drop_managed_fields,
            protobuf_kind: self.protobuf_kind,
            wire_format: self.wire_format,
            shard: self
                .shard
                .as_ref()
                .map(|s| Sharding::new(s.scope.clone(), Arc::clone(&s.stats))),
            received: Arc::clone(&self.received),
            _kind: PhantomData,
        }
    }
}

impl<K> ApiListerWatcher<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    /// Objects in every namespace (or cluster-scoped objects).
    pub fn all(client: Client) -> Self {
        Self::new(client, None)
    }

    /// Objects in `namespace`.
    pub fn namespaced(client: Client, namespace: &str) -> Self {
        Self::new(client, Some(namespace))
    }

    /// Objects in `namespace`, or in all namespaces for `None`.
    pub fn new(client: Client, namespace: Option<&str>) -> Self {
        Self::new_with(client, namespace, &K::DynamicType::default())
    }
}

impl<K> ApiListerWatcher<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Objects of the kind `dyntype` names (an `ApiResource` for
    /// `DynamicObject`) in every namespace, or cluster-scoped ones.
    pub fn all_with(client: Client, dyntype: &K::DynamicType) -> Self {
        Self::new_with(client, None, dyntype)
    }

    /// Objects of the kind `dyntype` names in `namespace`.
    pub fn namespaced_with(client: Client, namespace: &str, dyntype: &K::DynamicType) -> Self {
        Self::new_with(client, Some(namespace), dyntype)
    }

    /// Objects of the kind `dyntype` names in `namespace`, or in all
    /// namespaces for `None`.
    pub fn new_with(client: Client, namespace: Option<&str>, dyntype: &K::DynamicType) -> Self {
        Self {
            client,
            url_path: K::url_path(dyntype, namespace),
            plural: K::plural(dyntype).into_owned(),
            namespace: namespace.map(str::to_owned),
            label_selector: None,
            field_selector: None,
            drop_managed_fields: false,
            protobuf_kind: crate::protobuf::kind_of::<K>(dyntype),
            wire_format: WireFormat::default(),
            shard: None,
            received: Arc::default(),
            _kind: PhantomData,
        }
    }

    /// Only the objects of one shard (see [`ShardSelector`]): lists, watches
    /// and the streaming list send it as `shardSelector`, and objects
    /// outside it are dropped here too, for a server that ignores it
    /// ([`shard_stats`](Self::shard_stats) says which).
    #[must_use]
    pub fn shard(self, selector: ShardSelector) -> Self {
        self.shard_scope(ShardScope::new(selector))
    }

    /// Only the objects of `scope`'s shard, as it is when each list
    /// starts: as [`shard`](Self::shard), and when the scope changes the
    /// watch ends with [`ListWatchError::Rescoped`] so that the Reflector
    /// lists the new shard at once.
    #[must_use]
    pub fn shard_scope(mut self, scope: ShardScope) -> Self {
        self.shard = Some(Sharding::new(scope, Arc::default()));
        self
    }

    /// Bytes of list and watch response bodies this lister-watcher and its
    /// clones have received (as the client hands them over: after any
    /// decompression): what a shard saves in traffic, measured.
    pub fn bytes_received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// The shard asked for now, if any.
    pub fn shard_selector(&self) -> Option<ShardSelector> {
        self.shard.as_ref().map(|s| s.scope.selector())
    }

    /// How sharding goes: whether the server applies the selector and how
    /// many objects the client dropped; `None` when not sharded. Clones of
    /// this lister-watcher share them.
    pub fn shard_stats(&self) -> Option<Arc<ShardStats>> {
        self.shard.as_ref().map(|s| Arc::clone(&s.stats))
    }

    /// Keeps the page's objects of the shard, and notes whether the server
    /// applied the selector.
    fn shard_page(&self, mut page: ListPage<K>, shard: Option<&Shard>) -> ListPage<K> {
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
    fn shard_events(&self, events: WatchStream<K>, shard: Option<Arc<Shard>>) -> WatchStream<K> {
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
            .filter(move |event| {
                let keep = match event {
                    Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) => {
                        shard.selector.matches(o)
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
                        true
                    }
                    _ => true,
                };
                if !keep {
                    stats.filtered(1, "watch", &shard.selector);
                }
                futures::future::ready(keep)
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

    /// How objects travel from the server ([`WireFormat::Auto`] by default).
    #[must_use]
    pub fn wire_format(mut self, format: WireFormat) -> Self {
        self.wire_format = format;
        self
    }

    /// Whether lists and watches ask for protobuf: `K` is a built-in kind
    /// or metadata only (`PartialObjectMeta<K>`, as
    /// `PartialObjectMetadata`), not `DynamicObject`, and the format is `Auto`.
    pub fn uses_protobuf(&self) -> bool {
        self.protobuf().is_some()
    }

    fn protobuf(&self) -> Option<&'static ProtoKind> {
        self.protobuf_kind
            .filter(|_| self.wire_format == WireFormat::Auto)
    }

    /// What to accept: protobuf first, JSON as the fallback; for a list or
    /// a watch; metadata only as `PartialObjectMetadata(List)`.
    fn accept(&self, list: bool) -> String {
        if K::metadata_api() {
            let as_ = if list {
                "PartialObjectMetadataList"
            } else {
                "PartialObjectMetadata"
            };
            let media = format!(";as={as_};g=meta.k8s.io;v=v1");
            format!("{MEDIA_TYPE}{media}, application/json{media}")
        } else if list {
            format!("{MEDIA_TYPE}, application/json")
        } else {
            format!("{MEDIA_TYPE};stream=watch, application/json")
        }
    }

    /// Sends `request` accepting `accept`; the response if it succeeded,
    /// its Status as an error if not.
    async fn send_protobuf(
        &self,
        request: http::Request<Vec<u8>>,
        accept: &str,
    ) -> Result<http::Response<kube_client::client::Body>, ListWatchError> {
        let (mut parts, body) = request.into_parts();
        let accept = http::HeaderValue::from_str(accept)
            .map_err(|e| ListWatchError::Connect(Detail::caused("building the request", e)))?;
        parts.headers.insert(http::header::ACCEPT, accept);
        let request = http::Request::from_parts(parts, kube_client::client::Body::from(body));
        let response = self
            .client
            .send(request)
            .await
            .map_err(|e| self.explain(e.into()))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let code = response.status().as_u16();
        let protobuf = is_protobuf(&response);
        let body = collect(response).await?;
        let status = if protobuf {
            crate::protobuf::envelope::unknown(&body)
                .and_then(|e| crate::protobuf::envelope::status(&e))
                .ok()
        } else {
            serde_json::from_slice::<kube_client::core::Status>(&body).ok()
        };
        let status = match status {
            Some(status) if status.code != 0 => status,
            _ => kube_client::core::Status::failure(
                String::from_utf8_lossy(&body).trim(),
                "Failed to parse error data",
            )
            .with_code(code),
        };
        Err(self.explain(ListWatchError::from_status(&status)))
    }

    async fn list_protobuf(
        &self,
        kind: &'static ProtoKind,
        request: http::Request<Vec<u8>>,
    ) -> Result<ListPage<K>, ListWatchError> {
        let response = self.send_protobuf(request, &self.accept(true)).await?;
        let protobuf = is_protobuf(&response);
        let body = collect(response).await?;
        self.received
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        if !protobuf {
            return self.decode_json_list(&body);
        }
        let list = crate::protobuf::envelope::list::<K>(&body, kind, self.drop_managed_fields)
            .map_err(|e| ListWatchError::Decode(Detail::caused("the list", e)))?;
        let mut page = ListPage {
            items: Vec::with_capacity(list.items.len()),
            resource_version: list.resource_version.unwrap_or_default(),
            continue_token: list.continue_token,
            skipped: Vec::new(),
            shard_selector: list.shard_selector,
        };
        for item in list.items {
            match item {
                Ok(obj) => page.items.push(obj),
                Err(why) => page.skipped.push(why),
            }
        }
        Ok(page)
    }

    fn decode_json_list(&self, json: &[u8]) -> Result<ListPage<K>, ListWatchError> {
        if self.drop_managed_fields {
            let stripped = strip_managed_fields_json(json, JsonShape::List);
            decode_stripped(json, stripped, decode_list::<K>)
        } else {
            decode_list::<K>(json)
        }
    }

    async fn watch_protobuf(
        &self,
        kind: &'static ProtoKind,
        request: http::Request<Vec<u8>>,
    ) -> Result<WatchStream<K>, ListWatchError> {
        let response = self.send_protobuf(request, &self.accept(false)).await?;
        let protobuf = is_protobuf(&response);
        let body = futures::TryStreamExt::into_async_read(futures::TryStreamExt::map_err(
            http_body_util::BodyDataStream::new(response.into_body()),
            std::io::Error::other,
        ));
        let received = Arc::clone(&self.received);
        if !protobuf {
            return Ok(json_events::<K>(body, self.drop_managed_fields, received));
        }
        let drop_managed_fields = self.drop_managed_fields;
        // Each event is a frame: a 4-byte big-endian length, then that many
        // bytes, read straight into one reused buffer.
        let frames = futures::stream::unfold((body, Vec::new()), move |(mut body, mut frame)| {
            let received = Arc::clone(&received);
            async move {
                use futures::AsyncReadExt;
                let mut len = [0u8; 4];
                if let Err(e) = body.read_exact(&mut len).await {
                    return resumable_or(e).map(|e| (Err(e), (body, frame)));
                }
                let len = u32::from_be_bytes(len) as usize;
                if len > MAX_FRAME {
                    let e = ListWatchError::Decode(
                        format!("a watch frame of {len} bytes, over the {MAX_FRAME} byte limit")
                            .into(),
                    );
                    return Some((Err(e), (body, frame)));
                }
                frame.resize(len, 0);
                if let Err(e) = body.read_exact(&mut frame).await {
                    return resumable_or(e).map(|e| (Err(e), (body, frame)));
                }
                received.fetch_add(4 + len as u64, Ordering::Relaxed);
                let event = decode_protobuf_event::<K>(&frame, kind, drop_managed_fields);
                Some((event, (body, frame)))
            }
        });
        Ok(frames.boxed())
    }

    /// Only objects whose labels match `selector` (`app=web,tier!=db`).
    #[must_use]
    pub fn labels(mut self, selector: &str) -> Self {
        self.label_selector = Some(selector.to_owned()).filter(|s| !s.is_empty());
        self
    }

    /// Only objects whose fields match `selector` (`status.phase=Running`).
    #[must_use]
    pub fn fields(mut self, selector: &str) -> Self {
        self.field_selector = Some(selector.to_owned()).filter(|s| !s.is_empty());
        self
    }

    /// Drops `metadata.managedFields` from the JSON before decoding it
    /// ([`strip_managed_fields_json`](crate::strip_managed_fields_json)): the
    /// same result as the [`strip_managed_fields`](crate::strip_managed_fields)
    /// transform, without paying to decode what is thrown away.
    #[must_use]
    pub fn drop_managed_fields(mut self) -> Self {
        self.drop_managed_fields = true;
        self
    }

    /// The label selector, if any.
    pub fn label_selector(&self) -> Option<&str> {
        self.label_selector.as_deref()
    }

    /// The field selector, if any.
    pub fn field_selector(&self) -> Option<&str> {
        self.field_selector.as_deref()
    }

    /// A 404 names what is not served: typically a custom resource whose
    /// CustomResourceDefinition is not (or no longer) installed.
    fn explain(&self, e: ListWatchError) -> ListWatchError {
        match e {
            ListWatchError::Api {
                code: 404,
                reason,
                message,
                causes,
            } => ListWatchError::Api {
                code: 404,
                reason,
                causes,
                message: format!(
                    "{message}: the server does not serve {} (for a custom resource: is its CustomResourceDefinition installed and Established, and are the group, version and plural right? For a cluster-scoped kind, list it without a namespace)",
                    self.url_path
                ),
            },
            e => e,
        }
    }

    fn watch_request(
        &self,
        req: &WatchRequest,
        shard: Option<&Shard>,
    ) -> Result<http::Request<Vec<u8>>, ListWatchError> {
        // Built by hand rather than with kube's WatchParams, which caps the
        // server-side timeout below 295 s; client-go uses 5-10 minutes.
        let mut qp = form_urlencoded::Serializer::new(format!("{}?", self.url_path));
        qp.append_pair("watch", "true");
        qp.append_pair("timeoutSeconds", &req.timeout.as_secs().max(1).to_string());
        if req.allow_bookmarks {
            qp.append_pair("allowWatchBookmarks", "true");
        }
        if let Some(l) = &self.label_selector {
            qp.append_pair("labelSelector", l);
        }
        if let Some(f) = &self.field_selector {
            qp.append_pair("fieldSelector", f);
        }
        if let Some(shard) = shard {
            qp.append_pair("shardSelector", &shard.printed);
        }
        if req.send_initial_events {
            qp.append_pair("sendInitialEvents", "true");
            qp.append_pair("resourceVersionMatch", "NotOlderThan");
        }
        qp.append_pair("resourceVersion", &req.resource_version);
        // Servers since 1.37 gzip a watch one member per event, which the
        // client's decompression layer cannot follow past the first: ask for
        // no compression, as kube-client's own watch does.
        let mut request =
            http::Request::get(qp.finish()).header(http::header::ACCEPT_ENCODING, "identity");
        if K::metadata_api() {
            request = request.header(http::header::ACCEPT, METADATA_MIME);
        }
        request
            .body(Vec::new())
            .map_err(|e| ListWatchError::Connect(Detail::caused("building the watch request", e)))
    }
}

/// `namespace/name` (or `name`) of an object that does not decode as `K`,
/// read from its JSON as far as it goes.
pub(crate) fn object_key(json: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        #[serde(default)]
        metadata: Meta,
    }
    #[derive(serde::Deserialize, Default)]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
    }
    match crate::deep::from_json::<Named>(json.as_bytes()).map(|n| n.metadata) {
        Ok(Meta {
            name: Some(name),
            namespace: Some(ns),
        }) if !ns.is_empty() => Some(format!("{ns}/{name}")),
        Ok(Meta {
            name: Some(name), ..
        }) => Some(name),
        _ => None,
    }
}

/// Whether a read error is the end of a watch the server or the network
/// ended (resumable at once), as kube-client's own watch decides: an
/// `UnexpectedEof` anywhere in the chain (TLS stacks nest it; the body
/// stream wraps every error in `io::Error::other`), or the chunk decoder's
/// "unexpected EOF during chunk".
fn is_resumable_end(e: &std::io::Error) -> bool {
    if e.kind() == std::io::ErrorKind::UnexpectedEof
        || e.to_string().contains("unexpected EOF during chunk")
    {
        return true;
    }
    let mut current: Option<&(dyn std::error::Error + 'static)> = e
        .get_ref()
        .map(|inner| inner as &(dyn std::error::Error + 'static));
    // A bounded walk, in case a `source` chain cycles.
    for _ in 0..16 {
        let Some(err) = current else {
            return false;
        };
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof)
            || err.to_string().contains("unexpected EOF during chunk")
        {
            return true;
        }
        current = err.source();
    }
    false
}

/// The key of the object inside a watch event's JSON.
fn event_object_key(json: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Event<'a> {
        #[serde(borrow)]
        object: &'a serde_json::value::RawValue,
    }
    match serde_json::from_slice::<Event<'_>>(json) {
        Ok(event) => object_key(event.object.get()),
        Err(_) => None,
    }
}

/// The largest watch frame accepted: client-go's default is 100 MiB less
/// a little; one object is at most etcd's 1.5 MiB request limit plus the
/// envelope, so anything near this is a corrupt length.
const MAX_FRAME: usize = 64 << 20;

fn is_protobuf<B>(response: &http::Response<B>) -> bool {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(MEDIA_TYPE))
}

async fn collect(
    response: http::Response<kube_client::client::Body>,
) -> Result<bytes::Bytes, ListWatchError> {
    use http_body_util::BodyExt;
    response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| ListWatchError::Connect(Detail::caused("reading the response", e)))
}

/// `None` for the end of a watch the server or the network ended
/// (resumable); the error otherwise.
fn resumable_or(e: std::io::Error) -> Option<ListWatchError> {
    (!is_resumable_end(&e)).then(|| ListWatchError::Connect(Detail::of(e)))
}

/// One protobuf watch frame as an event of `K`, or the Status error the
/// server sent instead.
fn decode_protobuf_event<K: Resource + DeserializeOwned>(
    frame: &[u8],
    kind: &'static ProtoKind,
    drop_managed_fields: bool,
) -> Result<WatchEvent<K>, ListWatchError> {
    use crate::protobuf::envelope;
    let decode = |e: crate::protobuf::decode::ProtobufError| ListWatchError::Decode(Detail::of(e));
    let event = envelope::event(frame).map_err(decode)?;
    let object = |event: &envelope::Event<'_>| {
        envelope::object::<K>(&event.object, kind, drop_managed_fields).map_err(|e| {
            ListWatchError::Undecodable(Undecodable::new(envelope::object_key(event.object.raw), e))
        })
    };
    Ok(match event.type_ {
        "ADDED" => WatchEvent::Added(object(&event)?),
        "MODIFIED" => WatchEvent::Modified(object(&event)?),
        "DELETED" => WatchEvent::Deleted(object(&event)?),
        "BOOKMARK" => {
            let obj: K = object(&event)?;
            let meta = obj.meta();
            WatchEvent::Bookmark(kube_client::core::watch::Bookmark {
                types: kube_client::core::TypeMeta {
                    api_version: kind.api_version.to_owned(),
                    kind: kind.kind.to_owned(),
                },
                metadata: kube_client::core::watch::BookmarkMeta {
                    resource_version: meta.resource_version.clone().unwrap_or_default(),
                    annotations: meta.annotations.clone().unwrap_or_default(),
                },
            })
        }
        "ERROR" => {
            let status = envelope::status(&event.object).map_err(decode)?;
            return Err(ListWatchError::from_status(&status));
        }
        other => {
            return Err(ListWatchError::Decode(
                format!("a watch event of unknown type {other:?}").into(),
            ));
        }
    })
}

/// A JSON watch body: one event a line, each read into one reused buffer
/// and decoded from its bytes (no `String` and no UTF-8 pass per line:
/// serde_json checks the strings it decodes).
fn json_events<K: DeserializeOwned + Send + 'static>(
    body: impl futures::AsyncBufRead + Send + 'static,
    drop_managed_fields: bool,
    received: Arc<AtomicU64>,
) -> WatchStream<K> {
    let body: std::pin::Pin<Box<dyn futures::AsyncBufRead + Send>> = Box::pin(body);
    futures::stream::unfold((body, Vec::new()), move |(mut body, mut line)| {
        let received = Arc::clone(&received);
        async move {
            use futures::AsyncBufReadExt;
            loop {
                line.clear();
                match body.read_until(b'\n', &mut line).await {
                    Ok(0) => return None,
                    Ok(n) => {
                        received.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    // A watch the server or the network ended: resumable.
                    Err(e) if is_resumable_end(&e) => return None,
                    Err(e) => {
                        return Some((Err(ListWatchError::Connect(Detail::of(e))), (body, line)));
                    }
                }
                let json = line.trim_ascii();
                if json.is_empty() {
                    continue;
                }
                let event = if drop_managed_fields {
                    let stripped = strip_managed_fields_json(json, JsonShape::WatchEvent);
                    decode_stripped(json, stripped, decode_event::<K>)
                } else {
                    decode_event::<K>(json)
                };
                return Some((event, (body, line)));
            }
        }
    })
    .boxed()
}

/// What a metadata-only watch asks for (kube-client's value).
const METADATA_MIME: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// A list response, decoded object by object: one object that does not
/// decode is skipped (and named in `skipped`), not the whole page.
fn decode_list<K: DeserializeOwned>(json: &[u8]) -> Result<ListPage<K>, ListWatchError> {
    // ListMeta read by hand: k8s-openapi's has shardInfo only from v1_36.
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        resource_version: Option<String>,
        #[serde(rename = "continue")]
        continue_: Option<String>,
        shard_info: Option<ShardInfo>,
    }
    #[derive(serde::Deserialize)]
    struct ShardInfo {
        selector: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct RawList<'a> {
        #[serde(default)]
        metadata: Meta,
        #[serde(borrow, default)]
        items: Vec<&'a serde_json::value::RawValue>,
    }
    // The items are captured raw (serde_json skips a raw value without
    // recursing), so the list's own depth never counts against an item's.
    let raw: RawList<'_> = serde_json::from_slice(json)
        .map_err(|e| ListWatchError::Decode(Detail::caused("the list", e)))?;
    let mut items = Vec::with_capacity(raw.items.len());
    let mut skipped = Vec::new();
    for item in raw.items {
        match crate::deep::from_json::<K>(item.get().as_bytes()) {
            Ok(obj) => items.push(obj),
            Err(e) => {
                let text = item.get();
                let head: String = text.chars().take(160).collect();
                skipped.push(Undecodable::new(object_key(text), format!("{e} in {head}")));
            }
        }
    }
    Ok(ListPage {
        items,
        resource_version: raw.metadata.resource_version.unwrap_or_default(),
        continue_token: raw.metadata.continue_.filter(|t| !t.is_empty()),
        skipped,
        shard_selector: raw.metadata.shard_info.and_then(|i| i.selector),
    })
}

/// `decode` of the stripped JSON; when that fails, of the original, so that
/// the error is serde's about what the server sent.
fn decode_stripped<T>(
    original: &[u8],
    stripped: Cow<'_, [u8]>,
    decode: impl Fn(&[u8]) -> Result<T, ListWatchError>,
) -> Result<T, ListWatchError> {
    match decode(&stripped) {
        Err(_) if matches!(stripped, Cow::Owned(_)) => decode(original),
        decoded => decoded,
    }
}

/// One watch event line, as kube-client decodes it: an event, or a Status
/// error the server sent instead.
fn decode_event<K: DeserializeOwned>(json: &[u8]) -> Result<WatchEvent<K>, ListWatchError> {
    match crate::deep::from_json::<WatchEvent<K>>(json) {
        Ok(event) => Ok(event),
        Err(e) => match serde_json::from_slice::<kube_client::core::Status>(json) {
            Ok(status) if status.code != 0 => Err(ListWatchError::from_status(&status)),
            _ => Err(ListWatchError::Undecodable(Undecodable::new(
                event_object_key(json),
                e,
            ))),
        },
    }
}

impl<K> ListerWatcher<K> for ApiListerWatcher<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn list(&self, request: ListRequest) -> BoxFuture<'_, Result<ListPage<K>, ListWatchError>> {
        Box::pin(async move {
            let continuing = request.continue_token.is_some();
            let mut lp = ListParams::default();
            if let Some(l) = &self.label_selector {
                lp = lp.labels(l);
            }
            if let Some(f) = &self.field_selector {
                lp = lp.fields(f);
            }
            if let Some(limit) = request.limit {
                lp = lp.limit(limit);
            }
            if let Some(token) = &request.continue_token {
                lp = lp.continue_token(token);
            } else if let Some(rv) = &request.resource_version {
                lp = match rv.as_str() {
                    "0" => lp.match_any(),
                    rv => lp.at(rv).matching(VersionMatch::NotOlderThan),
                };
            }
            let request = Request::new(&self.url_path);
            let req = if K::metadata_api() {
                request.list_metadata(&lp)
            } else {
                request.list(&lp)
            };
            let mut req = req.map_err(|e| {
                ListWatchError::Connect(Detail::caused("building the list request", e))
            })?;
            let shard = self.shard.as_ref().map(|s| s.for_list(continuing));
            if let Some(shard) = &shard {
                // kube's ListParams has no shardSelector: appended to its query.
                let sep = if req.uri().query().is_some() {
                    '&'
                } else {
                    '?'
                };
                let param = form_urlencoded::Serializer::new(String::new())
                    .append_pair("shardSelector", &shard.printed)
                    .finish();
                let uri = format!("{}{sep}{param}", req.uri());
                *req.uri_mut() = uri.parse().map_err(|e| {
                    ListWatchError::Connect(Detail::caused("building the list request", e))
                })?;
            }
            let page = if let Some(kind) = self.protobuf() {
                self.list_protobuf(kind, req).await?
            } else {
                let text = self
                    .client
                    .request_text(req)
                    .await
                    .map_err(|e| self.explain(e.into()))?;
                self.received
                    .fetch_add(text.len() as u64, Ordering::Relaxed);
                self.decode_json_list(text.as_bytes())?
            };
            Ok(self.shard_page(page, shard.as_deref()))
        })
    }

    fn watch(
        &self,
        request: WatchRequest,
    ) -> BoxFuture<'_, Result<WatchStream<K>, ListWatchError>> {
        Box::pin(async move {
            let shard = match &self.shard {
                // The streaming list is a list.
                Some(s) if request.send_initial_events => Some(s.for_list(false)),
                Some(s) => Some(s.for_watch()?),
                None => None,
            };
            let req = self.watch_request(&request, shard.as_deref())?;
            if let Some(kind) = self.protobuf() {
                let events = self.watch_protobuf(kind, req).await?;
                return Ok(self.shard_events(events, shard));
            }
            // One JSON event a line, decoded here rather than by kube-client,
            // so that an event that does not decode is named, and so that
            // managedFields can be dropped before decoding.
            let body = self
                .client
                .request_stream(req)
                .await
                .map_err(|e| self.explain(e.into()))?;
            let received = Arc::clone(&self.received);
            let events = json_events::<K>(body, self.drop_managed_fields, received);
            Ok(self.shard_events(events, shard))
        })
    }

    fn describe(&self) -> String {
        let mut s = self.plural.clone();
        if K::metadata_api() {
            s.push_str(" (metadata only)");
        }
        match &self.namespace {
            Some(ns) => s.push_str(&format!(" in namespace {ns:?}")),
            None => s.push_str(" in all namespaces"),
        }
        if let Some(l) = &self.label_selector {
            s.push_str(&format!(" with labels {l:?}"));
        }
        if let Some(f) = &self.field_selector {
            s.push_str(&format!(" with fields {f:?}"));
        }
        if let Some(shard) = &self.shard {
            s.push_str(&format!(" in shard {}", shard.scope.current().printed));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn a_stripped_list_that_does_not_decode_reports_serdes_error_about_the_original() {
        // managedFields can go, but the list is broken after them.
        let original = br#"{"items":[{"metadata":{"name":"a","managedFields":[{"manager":"m"}]}}],"metadata":{"resourceVersion":01}}"#;
        let stripped = strip_managed_fields_json(original, JsonShape::List);
        assert!(matches!(stripped, Cow::Owned(_)));
        let err = decode_stripped(original, stripped, decode_list::<Pod>).unwrap_err();
        let direct = decode_list::<Pod>(original).unwrap_err();
        assert_eq!(err.to_string(), direct.to_string());
    }

    #[test]
    fn a_stripped_watch_event_decodes_without_the_objects_managed_fields() {
        let line = br#"{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","managedFields":[{"manager":"m"}]},"spec":{"containers":[]}}}"#;
        let stripped = strip_managed_fields_json(line, JsonShape::WatchEvent);
        match decode_stripped(line, stripped, decode_event::<Pod>).unwrap() {
            WatchEvent::Modified(pod) => {
                assert_eq!(pod.metadata.name.as_deref(), Some("a"));
                assert!(pod.metadata.managed_fields.is_none());
            }
            other => panic!("expected MODIFIED, got {other:?}"),
        }
    }
}
